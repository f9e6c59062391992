// tpcli::tensor — internal (x86-64 kernel files only): the batch kernels' tiling of vectors and
// rows (packed_kernels_x86.cpp and packed_kernels_ggml_x86.cpp), with the helpers their tiles share.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "tensor/packed_kernels.h"

#define TPCLI_TILES_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TPCLI_TILES_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

namespace tpcli::tensor::kernels {

// ---- rows_batch: several vectors per weight load ----
//
// A batch tile runs V vectors (1 <= V <= Tile::MAX_V, a compile-time count so their running sums
// stay in registers) over rows, keeping for every (row, vector) the chains, tail and reduction of
// the single-vector kernel, so each output is that kernel's bit for bit, while each weight chunk is
// loaded and unpacked once per tile rather than once per vector.
// V vectors read whole for every row would stream x from L2 (8 vectors of 4096 columns are 128 KB;
// L1 is 32-48 KB) and run at L2's rate, so a tile walks up to STATE_ROWS rows one column block at a
// time, the block's x for the V vectors about X_BLOCK_BYTES (in L1 while the rows pass over it),
// keeping each (row, vector)'s running sums (Tile::State) between blocks: the chains see the same
// operations in the same order, only paused.
//
// A Tile has: State, one row's running sums for one vector (zero-initialised); unit(w), the columns
// a block is a multiple of (group size or vector step); body(w), the columns its vector steps cover
// (a multiple of unit; `finish` does the rest, the tail); columns<V>(s, w, r, c0, c1, x), the steps
// over [c0, c1) of row r; finish<V>(out, ld_out, s, w, r, x), the tail and reduction into out[v * ld_out].
constexpr int64_t X_BLOCK_BYTES = 32 * 1024;
constexpr int64_t STATE_ROWS = 16;  // run_rows_batch's row block

// A Tile may also take several rows a step (Tile::ROWS, with rows_columns<RT, V>(s, w, r, c0, c1, x)
// over rows r..r+RT-1, s[RT][V]): a register tile of RT rows x V vectors, every weight vector loaded
// once for V vectors and every x vector once for RT rows, as in a gemm micro-kernel; each (row,
// vector) is still its own chain, so the bits stay the single-vector kernel's.
template <class Tile>
constexpr int rows_per_step() {
  if constexpr (requires { Tile::ROWS; }) return Tile::ROWS;
  else return 1;
}

template <class Tile, int V>
void block_columns(typename Tile::State (*s)[V], const View& w, int64_t r, int64_t rn, int64_t c0, int64_t c1, const Vectors& x) {
  constexpr int RT = rows_per_step<Tile>();
  if constexpr (RT > 1) {
    int64_t i = 0;
    for (; i + RT <= rn; i += RT) Tile::template rows_columns<RT, V>(s + i, w, r + i, c0, c1, x);
    for (; i < rn; ++i) Tile::template rows_columns<1, V>(s + i, w, r + i, c0, c1, x);
  } else {
    for (int64_t i = 0; i < rn; ++i) Tile::template columns<V>(s[i], w, r + i, c0, c1, x);
  }
}

// RT rows' whole bodies in one block, then their finish: the running sums a local the compiler
// keeps in registers, rather than STATE_ROWS rows' zeroed in memory, stored and loaded again.
template <class Tile, int V, int RT>
void whole_rows_step(float* out, int64_t ld_out, const View& w, const Vectors& x, int64_t r) {
  typename Tile::State s[RT][V] = {};
  block_columns<Tile, V>(s, w, r, RT, 0, Tile::body(w), x);
  for (int i = 0; i < RT; ++i) Tile::template finish<V>(out + i, ld_out, s[i], w, r + i, x);
}

template <class Tile, int V>
void whole_row_tiles(float* out, int64_t ld_out, const View& w, const Vectors& x, int64_t r0, int64_t r1) {
  constexpr int RT = rows_per_step<Tile>();
  int64_t r = r0;
  for (; r + RT <= r1; r += RT) whole_rows_step<Tile, V, RT>(out + r - r0, ld_out, w, x, r);
  for (; r < r1; ++r) whole_rows_step<Tile, V, 1>(out + r - r0, ld_out, w, x, r);
}

template <class Tile, int V>
void tile_rows(float* out, int64_t ld_out, const View& w, const Vectors& x, int64_t r0, int64_t r1) {
  const int64_t unit = Tile::unit(w), body = Tile::body(w);
  const int64_t block = std::max(unit, X_BLOCK_BYTES / (4 * V) / unit * unit);  // x: 4 bytes a column
  if constexpr (!requires { Tile::FINISHES_ROWS; }) {
    if (body <= block) return whole_row_tiles<Tile, V>(out, ld_out, w, x, r0, r1);  // the same steps, one block
  }
  for (int64_t rb = r0; rb < r1; rb += STATE_ROWS) {
    const int64_t rn = std::min(STATE_ROWS, r1 - rb);
    typename Tile::State s[STATE_ROWS][V] = {};
    for (int64_t c0 = 0; c0 < body; c0 += block) block_columns<Tile, V>(s, w, rb, rn, c0, std::min(body, c0 + block), x);
    if constexpr (requires { Tile::FINISHES_ROWS; }) Tile::template finish_rows<V>(out + rb - r0, ld_out, s, rn, w, rb, x);
    else for (int64_t i = 0; i < rn; ++i) Tile::template finish<V>(out + rb + i - r0, ld_out, s[i], w, rb + i, x);
  }
}

// The last tile, of fewer than MAX_V vectors.
template <class Tile, int V>
void rest_tile(float* out, int64_t ld_out, const View& w, const Vectors& x, int64_t r0, int64_t r1) {
  if constexpr (V > 0) {
    if (x.count == V) tile_rows<Tile, V>(out, ld_out, w, x, r0, r1);
    else rest_tile<Tile, V - 1>(out, ld_out, w, x, r0, r1);
  }
}

// rows_batch: tiles of MAX_V vectors, then one of the rest.
template <class Tile>
void in_vector_tiles(float* out, int64_t ld_out, const View& w, const Vectors& x, int64_t r0, int64_t r1) {
  constexpr int M = Tile::MAX_V;
  int64_t v = 0;
  for (; v + M <= x.count; v += M) tile_rows<Tile, M>(out + v * ld_out, ld_out, w, x.slice(v, M), r0, r1);
  if (v < x.count) rest_tile<Tile, M - 1>(out + v * ld_out, ld_out, w, x.slice(v, x.count - v), r0, r1);
}


// Each vector's x (and group sums) for a tile.
template <int V>
struct TileInputs {
  const float* x[V];
  const float* sum[V];
  explicit TileInputs(const Vectors& v) {
    for (int i = 0; i < V; ++i) x[i] = v.x(i), sum[i] = v.sum(i);
  }
};

// x loaded into a register once for a register tile's rows: left alone, gcc folds the load into
// every row's FMA as a memory operand (the same vector loaded RT times), and a tile of two or three
// rows stays as load-bound as one row at a time.
TPCLI_TILES_AVX2 inline __m256 in_register(__m256 v) {
  asm("" : "+x"(v));
  return v;
}

TPCLI_TILES_AVX512 inline __m512 in_register(__m512 v) {
  asm("" : "+v"(v));
  return v;
}

TPCLI_TILES_AVX512 inline __m512i in_register(__m512i v) {
  asm("" : "+v"(v));
  return v;
}

}  // namespace tpcli::tensor::kernels

#endif
