// tpcli::tensor — the one door to BLIS. Nothing else includes blis.h.
//
// Row-major everywhere. Transposes are expressed as flags (BLIS takes strides, so no copy).
// Threads: each calling thread sets its own BLIS thread count (thread-local), so D device threads
// on C cores never ask for D x C threads. Default: 1.
#pragma once

#include <cstdint>

namespace tpcli::tensor {

enum class Trans { No, Yes };

// C[m,n] = alpha * op(A)[m,k] @ op(B)[k,n] + beta * C.  lda/ldb/ldc are row strides of the stored
// (untransposed) matrices: A is stored [m,k] (Trans::No) or [k,m] (Trans::Yes).
void gemm(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Common case, contiguous: out[m,n] (+)= inp[m,k] @ weight[n,k]^T  — the Linear layer layout
// (weight rows are output features, as in PyTorch, llama2.c and MLX). One row, or any rows inside a
// DecodeRows scope: the matvec kernel per row.
void matmul_wt(float* out, const float* inp, const float* weight, int64_t m, int64_t n, int64_t k,
               bool accumulate = false);

// Decode-shaped product: out[n] = weight[n,k] @ x[k]. Memory-bound; a dedicated kernel, not gemm.
void matvec(float* out, const float* weight, const float* x, int64_t n, int64_t k);
// B decode rows at once: out[B, n] (row stride ld_out, 0 = n) = x[B, k] @ weight[n, k]^T, each row
// of out bit for bit what matvec gives that vector alone, each weight row read from memory once.
void matvec_batch(float* out, int64_t ld_out, const float* weight, const float* x, int64_t B, int64_t n, int64_t k);

// While one is alive on this thread, every product of several rows through a weight matrix
// (nn's linears: tensor::matmul of Linear and PackedMatrix) runs the decode kernels row by row
// (matvec_batch) instead of gemm: a row's result is then what it would be alone, whatever else is
// in the batch (a batched decode step's rows are different sequences). Nests.
class DecodeRows {
 public:
  DecodeRows();
  ~DecodeRows();
  DecodeRows(const DecodeRows&) = delete;
  DecodeRows& operator=(const DecodeRows&) = delete;
};
bool decode_rows();  // whether a DecodeRows is alive on this thread

// Threads BLIS may use for calls made from the current thread (>= 1).
void set_blas_threads(int n);
int blas_threads();
// Cores this process may use (its CPU affinity mask, at least 1).
int available_cores();
// Bytes of physical memory this machine has (0 when the system does not say), for refusing an
// allocation that cannot fit before it is made.
double physical_memory_bytes();
// The BLIS kernel set in use ("skx", "haswell", "zen3", ...), for benchmark reports.
const char* blas_kernels();

}  // namespace tpcli::tensor
