// MLX weight formats against ../shared/reference/quant/mlx_quant_vectors.json (written by an
// independent implementation of ../shared/QUANT.md): packed words, scales and biases exactly;
// then PackedMatrix's kernels (plain C++, AVX2, AVX-512 on this machine) against double-precision
// products with the dequantized weights, and its row/column slicing.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "tensor/blas.h"
#include "tensor/packed_matrix.h"
#include "tensor/quant_formats.h"

using namespace tpcli::tensor;
using nlohmann::json;

namespace {

const std::string VECTORS = std::string(TPCLI_SHARED_DIR) + "/reference/quant/mlx_quant_vectors.json";

std::vector<json> reference_cases() {
  std::ifstream in(VECTORS);
  if (!in) return {};
  json doc = json::parse(in);
  return doc.at("cases").get<std::vector<json>>();
}

template <typename T>
std::vector<T> values(const json& j) {
  return j.get<std::vector<T>>();
}

std::vector<float> random_floats(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// out[n] = W[n, :] . x in double, W dequantized row by row.
std::vector<double> reference_matvec(const PackedMatrix& m, const std::vector<float>& x) {
  std::vector<float> row(static_cast<size_t>(m.cols()));
  std::vector<double> out(static_cast<size_t>(m.rows()));
  for (int64_t r = 0; r < m.rows(); ++r) {
    m.dequantize_row(row.data(), r);
    double s = 0;
    for (int64_t c = 0; c < m.cols(); ++c) s += double(row[size_t(c)]) * x[size_t(c)];
    out[size_t(r)] = s;
  }
  return out;
}

std::vector<WeightFormat> all_formats() {
  std::vector<WeightFormat> f = {WeightFormat::f32(), WeightFormat::bf16(), WeightFormat::f16(), WeightFormat::mxfp8(),
                                 WeightFormat::affine(3, 32), WeightFormat::affine(6, 64)};
  for (int bits : {4, 8})
    for (int gs : {32, 64, 128}) f.push_back(WeightFormat::affine(bits, gs));
  return f;
}

}  // namespace

TEST_CASE("affine and mxfp8 quantization equal MLX's reference vectors exactly", "[tensor][quant]") {
  auto cases = reference_cases();
  if (cases.empty()) {
    WARN("skipped: " << VECTORS << " not found");
    return;
  }
  int checked = 0;
  for (const json& c : cases) {
    const std::string mode = c.at("mode"), name = c.at("name");
    // Not implemented: mxfp4/nvfp4, and the Metal (GPU) quantization rules.
    if ((mode != "affine" && mode != "mxfp8") || c.at("backend_rules") != "cpu" ||
        !c.at("matmul").at("transpose").get<bool>())
      continue;
    INFO(name);
    const auto shape = values<int64_t>(c.at("shape"));
    const int64_t R = shape[0], K = shape[1];
    const int bits = c.at("bits"), GS = c.at("group_size");
    const std::string dtype = c.at("dtype");
    const auto w = values<float>(c.at("w"));  // the float32 value of each element
    const auto packed = values<uint32_t>(c.at("packed"));
    const int64_t G = K / GS;
    std::vector<uint32_t> words(packed.size());
    if (mode == "affine") {
      std::vector<float> scales(size_t(R * G)), biases(size_t(R * G));
      affine_quantize(words.data(), scales.data(), biases.data(), w.data(), R, K, bits, GS);
      CHECK(words == packed);
      if (dtype == "float32") {
        CHECK(scales == values<float>(c.at("scales")));
        CHECK(biases == values<float>(c.at("biases")));
        std::vector<float> deq(size_t(R * K));
        for (int64_t r = 0; r < R; ++r)
          affine_dequantize_row(deq.data() + r * K, words.data() + r * (K * bits / 32), scales.data() + r * G,
                                biases.data() + r * G, K, bits, GS);
        CHECK(deq == values<float>(c.at("dequantized")));
      } else {  // scales and biases are rounded to the weight dtype after packing
        auto round = [&](float v) { return dtype == "bfloat16" ? f32_to_bf16(v) : f32_to_f16(v); };
        const auto sb = values<uint16_t>(c.at("scales_bits")), bb = values<uint16_t>(c.at("biases_bits"));
        for (size_t i = 0; i < scales.size(); ++i) {
          CHECK(round(scales[i]) == sb[i]);
          CHECK(round(biases[i]) == bb[i]);
        }
      }
    } else {
      std::vector<uint8_t> scale_bytes(size_t(R * G));
      mxfp8_quantize(words.data(), scale_bytes.data(), w.data(), R, K);
      CHECK(words == packed);
      CHECK(scale_bytes == values<uint8_t>(c.at("scales")));
      if (dtype == "float32") {
        std::vector<float> deq(size_t(R * K));
        for (int64_t r = 0; r < R; ++r)
          mxfp8_dequantize_row(deq.data() + r * K, words.data() + r * (K / 4), scale_bytes.data() + r * G, K);
        CHECK(deq == values<float>(c.at("dequantized")));
      }
    }
    // The product through PackedMatrix, against MLX's x @ dequantized^T (float64 reference).
    if (dtype == "float32") {
      const WeightFormat f = mode == "affine" ? WeightFormat::affine(bits, GS) : WeightFormat::mxfp8();
      const PackedMatrix m = PackedMatrix::from_f32(w.data(), R, K, f);
      const auto x = values<float>(c.at("matmul").at("x")), y = values<float>(c.at("matmul").at("y"));
      const int64_t N = static_cast<int64_t>(x.size()) / K;
      std::vector<float> out(size_t(N * R));
      m.matmul(out.data(), x.data(), N);
      for (size_t i = 0; i < out.size(); ++i) CHECK(out[i] == Approx(y[i]).margin(1e-3).epsilon(1e-4));
    }
    ++checked;
  }
  CHECK(checked >= 16);
}

TEST_CASE("scalar conversions: bf16, f16 and E4M3 round trips", "[tensor][quant]") {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) {
      CHECK(std::fabs(e4m3_to_f32(uint8_t(code))) == 480.0f);  // MLX's CPU decoder
      continue;
    }
    CHECK(f32_to_e4m3(e4m3_to_f32(uint8_t(code))) == code);
  }
  CHECK(f32_to_e4m3(1e9f) == 0x7E);
  CHECK(f32_to_e4m3(-INFINITY) == 0xFE);
  for (float v : {0.0f, 1.0f, -2.5f, 3.140625f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f}) {
    CHECK(f16_to_f32(f32_to_f16(v)) == v);
    CHECK(bf16_to_f32(f32_to_bf16(v)) == Approx(v).epsilon(1.0 / 128));
  }
  CHECK(f32_to_bf16(1.0f + 1.0f / 256) == f32_to_bf16(1.0f));  // tie to even
  CHECK(f32_to_f16(1.0f + 1.0f / 4096) == f32_to_f16(1.0f));
  CHECK(std::isinf(f16_to_f32(f32_to_f16(70000.0f))));
}

TEST_CASE("packed matvec and matmul: every kernel set against double products", "[tensor][quant][kernels]") {
  std::mt19937 rng(7);
  const int64_t R = 37, K = 384;  // odd row count: the kernels' row blocks have tails
  const auto w = random_floats(rng, size_t(R * K), 0.05f);
  const auto x = random_floats(rng, size_t(3 * K));
  std::vector<Isa> isas = {Isa::Scalar};
  if (detected_isa() != Isa::Scalar) isas.push_back(Isa::Avx2);
  if (detected_isa() == Isa::Avx512) isas.push_back(Isa::Avx512);
  for (const WeightFormat& f : all_formats()) {
    INFO(f.name());
    const PackedMatrix m = PackedMatrix::from_f32(w.data(), R, K, f);
    const auto ref = reference_matvec(m, x);
    for (Isa isa : isas) {
      INFO(isa_name(isa));
      std::vector<float> out(size_t(R), NAN);
      m.matvec(out.data(), x.data(), 0, R, isa);
      for (int64_t r = 0; r < R; ++r) CHECK(out[size_t(r)] == Approx(ref[size_t(r)]).margin(1e-4));
      // a row range (the tied classifier reads a device's vocabulary rows this way)
      std::vector<float> part(5, NAN);
      m.matvec(part.data(), x.data(), 30, 5, isa);
      for (int64_t r = 0; r < 5; ++r) CHECK(part[size_t(r)] == Approx(ref[size_t(30 + r)]).margin(1e-4));
    }
    // batched: three input rows, written with a row stride wider than R
    std::vector<float> out(size_t(3 * (R + 2)), NAN);
    m.matmul(out.data(), x.data(), 3, R + 2);
    for (int64_t n = 0; n < 3; ++n) {
      const auto refn = reference_matvec(m, std::vector<float>(x.begin() + n * K, x.begin() + (n + 1) * K));
      for (int64_t r = 0; r < R; ++r) CHECK(out[size_t(n * (R + 2) + r)] == Approx(refn[size_t(r)]).margin(1e-4));
    }
    // quantization error against the largest |w| (~0.2 here): affine at most one step of the
    // group's range (MLX's |w - w'| <= |scale|); mxfp8's rounded (not floored) scale saturates a
    // block's largest element by up to 29%; 16-bit floats keep 8 (bf16) or 11 (f16) bits.
    const Tensor d = m.dequantize();
    double worst = 0, largest = 0;
    for (int64_t i = 0; i < R * K; ++i) {
      worst = std::max(worst, double(std::fabs(d[i] - w[size_t(i)])));
      largest = std::max(largest, double(std::fabs(w[size_t(i)])));
    }
    const double relative = f.kind == WeightKind::F32    ? 0
                            : f.kind == WeightKind::Affine ? 2.0 / ((1 << f.bits) - 1)
                            : f.kind == WeightKind::Mxfp8  ? 0.3
                            : f.kind == WeightKind::BF16   ? 1.0 / 256
                                                           : 1.0 / 2048;
    CHECK(worst <= relative * largest);
  }
}

TEST_CASE("f32 and 4-bit matvec: a row's value does not depend on the rows around it", "[tensor][kernels]") {
  // Sharding hands a device a row range: its rows must sum exactly as in the whole matrix, or the
  // greedy tokens could differ with the device count. K % 16 == 0, as in the models. f32 takes
  // row blocks of 4 and 1; 4-bit g64/g128 with AVX512_BF16 pairs of rows and 1.
  std::mt19937 rng(11);
  const int64_t R = 45, K = 640;  // 45 = 11 blocks of 4 (22 pairs) and one single row
  const auto w = random_floats(rng, size_t(R * K), 0.05f);
  const auto x = random_floats(rng, size_t(K));
  std::vector<Isa> isas = {Isa::Scalar};
  if (detected_isa() != Isa::Scalar) isas.push_back(Isa::Avx2);
  if (detected_isa() == Isa::Avx512) isas.push_back(Isa::Avx512);
  for (const WeightFormat& f : {WeightFormat::f32(), WeightFormat::affine(4, 64), WeightFormat::affine(4, 128)}) {
    const PackedMatrix m = PackedMatrix::from_f32(w.data(), R, K, f);
    for (Isa isa : isas) {
      INFO(f.name() << ", " << isa_name(isa));
      std::vector<float> whole(size_t(R), NAN);
      m.matvec(whole.data(), x.data(), 0, R, isa);
      for (int64_t first : {1, 3, 4, 7, 9, 37, 44}) {
        INFO("rows from " << first);
        std::vector<float> part(size_t(R - first), NAN);
        m.matvec(part.data(), x.data(), first, R - first, isa);
        for (int64_t r = first; r < R; ++r) CHECK(part[size_t(r - first)] == whole[size_t(r)]);
      }
    }
  }
}

TEST_CASE("4-bit matvec: every kernel set within its error bound of the exact sum", "[tensor][quant][kernels]") {
  // Exact: sum_g s_g * sum_i q_i x_i + b_g * sum_i x_i, in double from the codes. The AVX-512 bf16
  // kernel reads x as hi + lo (two bf16), |x - (hi + lo)| <= 2^-16 |x| and exact products, so its
  // error is at most 2^-16 A, A = sum_g |s_g| sum_i q_i |x_i|, plus f32 rounding: at most n * 2^-24
  // (A + B), B = sum_g |b_g| sum_i |x_i|, with n the roundings one term meets (GS in the float
  // group sum of x, GS/8 in a lane of the dot products, 2G across groups, a few in the reduction).
  // x spans 2^-10..2^10 in magnitude, so a kernel that lost the low half would fail: bf16 alone
  // errs by up to 2^-9 |x|.
  std::mt19937 rng(5);
  const int64_t R = 23, K = 768;
  const auto w = random_floats(rng, size_t(R * K), 0.05f);
  std::vector<float> x = random_floats(rng, size_t(K));
  std::uniform_int_distribution<int> exponent(-10, 10);
  for (float& v : x) v = std::ldexp(v, exponent(rng));
  std::vector<Isa> isas = {Isa::Scalar};
  if (detected_isa() != Isa::Scalar) isas.push_back(Isa::Avx2);
  if (detected_isa() == Isa::Avx512) isas.push_back(Isa::Avx512);
  for (int gs : {32, 64, 128}) {
    const WeightFormat f = WeightFormat::affine(4, gs);
    const PackedMatrix m = PackedMatrix::from_f32(w.data(), R, K, f);
    const PackedMatrix::Parts p = m.parts();
    const int64_t G = K / gs;
    std::vector<double> exact(static_cast<size_t>(R)), bound(exact), bf16_only(exact);
    for (int64_t r = 0; r < R; ++r) {
      const auto* words = static_cast<const uint32_t*>(p.data) + r * K / 8;
      double e = 0, A = 0, B = 0, hi_err = 0;
      for (int64_t g = 0; g < G; ++g) {
        double dot = 0, xs = 0, qa = 0, xa = 0, he = 0;
        for (int64_t i = g * gs; i < (g + 1) * gs; ++i) {
          const double q = unpack_code(words, i, 4), xi = x[size_t(i)];
          dot += q * xi;
          xs += xi;
          qa += q * std::fabs(xi);
          xa += std::fabs(xi);
          he += q * (double(bf16_to_f32(f32_to_bf16(x[size_t(i)]))) - xi);
        }
        const double s = p.scales[r * G + g], b = p.biases[r * G + g];
        e += s * dot + b * xs;
        A += std::fabs(s) * qa;
        B += std::fabs(b) * xa;
        hi_err += s * he;
      }
      exact[size_t(r)] = e;
      const double n = gs + gs / 8.0 + 2.0 * G + 8;
      bound[size_t(r)] = std::ldexp(A, -16) + n * std::ldexp(A + B, -24);
      bf16_only[size_t(r)] = std::fabs(hi_err);
    }
    double worst_bf16_only = 0;
    for (int64_t r = 0; r < R; ++r) worst_bf16_only = std::max(worst_bf16_only, bf16_only[size_t(r)] / bound[size_t(r)]);
    INFO(f.name());
    CHECK(worst_bf16_only > 4);  // the bound is tight enough to tell hi + lo from hi alone
    for (Isa isa : isas) {
      INFO(isa_name(isa));
      std::vector<float> out(size_t(R), NAN);
      m.matvec(out.data(), x.data(), 0, R, isa);
      for (int64_t r = 0; r < R; ++r) {
        INFO("row " << r << ": " << out[size_t(r)] << " vs " << exact[size_t(r)] << ", bound " << bound[size_t(r)]);
        CHECK(std::fabs(out[size_t(r)] - exact[size_t(r)]) <= bound[size_t(r)]);
      }
    }
  }
}

TEST_CASE("packed slicing: rows, whole-group columns, and misaligned columns refused", "[tensor][quant]") {
  std::mt19937 rng(3);
  const int64_t R = 6, K = 256;
  const auto w = random_floats(rng, size_t(R * K));
  for (const WeightFormat& f : all_formats()) {
    INFO(f.name());
    const PackedMatrix m = PackedMatrix::from_f32(w.data(), R, K, f);
    const Tensor full = m.dequantize();
    const PackedMatrix rows = m.slice_rows(2, 3);
    const Tensor rd = rows.dequantize();
    for (int64_t i = 0; i < 3 * K; ++i) CHECK(rd[i] == full[2 * K + i]);
    const int64_t unit = f.quantized() ? f.group_size : 1;
    const std::vector<Columns> cols = {{unit, unit}, {K - unit, unit}};
    const Tensor cd = m.slice_columns(cols).dequantize();
    REQUIRE(cd.dim(1) == 2 * unit);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < 2 * unit; ++c) {
        const int64_t src = c < unit ? unit + c : K - unit + (c - unit);
        CHECK(cd[r * 2 * unit + c] == full[r * K + src]);
      }
    if (f.quantized()) CHECK_THROWS_WITH(m.slice_columns({{16, 32}}), Catch::Contains("whole groups"));
  }
  CHECK_THROWS_WITH(PackedMatrix::from_f32(w.data(), 2, 96, WeightFormat::affine(4, 64)),
                    Catch::Contains("not a multiple of the affine 4-bit g64 group size 64"));
}
