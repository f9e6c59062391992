#include "tensor/ggml_blocks.h"

#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>

#include "tensor/quant_formats.h"

namespace tpcli::tensor {

namespace {

constexpr int QK = 32, QK_K = 256;
constexpr int8_t IQ4_NL_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

float half(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return f16_to_f32(bits);
}

uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void q4_0(const uint8_t* b, float* y) {
  const float d = half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < QK / 2; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
    y[j + QK / 2] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

void q4_1(const uint8_t* b, float* y) {
  const float d = half(b), m = half(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < QK / 2; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
    y[j + QK / 2] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// Q5_0 / Q5_1: value j's fifth bit is bit j of qh (the high nibbles' bits 16..31).
void q5(const uint8_t* b, float* y, bool with_min) {
  const float d = half(b), m = with_min ? half(b + 2) : 0.0f;
  const uint8_t* p = b + (with_min ? 4 : 2);
  const uint32_t qh = u32_at(p);
  const uint8_t* qs = p + 4;
  const int offset = with_min ? 0 : 16;
  for (int j = 0; j < QK / 2; ++j) {
    const int low = static_cast<int>((qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10)) - offset;
    const int high = static_cast<int>((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - offset;
    y[j] = with_min ? static_cast<float>(low) * d + m : static_cast<float>(low) * d;
    y[j + QK / 2] = with_min ? static_cast<float>(high) * d + m : static_cast<float>(high) * d;
  }
}

void q8_0(const uint8_t* b, float* y) {
  const float d = half(b);
  for (int j = 0; j < QK; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

void q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  const float d = half(b + 80), min = half(b + 82);
  int is = 0;
  for (int n = 0; n < QK_K; n += 128) {
    for (int shift = 0; shift < 8; shift += 2)
      for (int half_group = 0; half_group < 2; ++half_group) {
        const uint8_t sc = scales[is++];
        const float dl = d * static_cast<float>(sc & 0xF), ml = min * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l + 16 * half_group] >> shift) & 3) - ml;
      }
    q += 32;
  }
}

// Q3_K's 16 six-bit scales: the low 4 bits in bytes 0..7, the high 2 bits in bytes 8..11.
void q3_k_scales(const uint8_t* packed, int8_t* scales) {
  for (int i = 0; i < 16; ++i) {
    const int low = i < 8 ? packed[i] & 0xF : packed[i - 8] >> 4;
    const int high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
    scales[i] = static_cast<int8_t>((low | (high << 4)) - 32);
  }
}

void q3_k(const uint8_t* b, float* y) {
  const uint8_t* hm = b;
  const uint8_t* q = b + 32;
  int8_t scales[16];
  q3_k_scales(b + 96, scales);
  const float d_all = half(b + 108);
  int is = 0;
  uint8_t m = 1;
  for (int n = 0; n < QK_K; n += 128) {
    for (int shift = 0; shift < 8; shift += 2, m = static_cast<uint8_t>(m << 1))
      for (int half_group = 0; half_group < 2; ++half_group) {
        const float dl = d_all * static_cast<float>(scales[is++]);
        for (int l = 16 * half_group; l < 16 * half_group + 16; ++l)
          *y++ = dl * static_cast<float>(((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
      }
    q += 32;
  }
}

// Q4_K / Q5_K: group j's 6-bit scale and min (ggml's get_scale_min_k4).
void scale_min_k4(int j, const uint8_t* q, uint8_t& scale, uint8_t& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    min = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void q4_k_or_q5_k(const uint8_t* b, float* y, bool five_bits) {
  const float d = half(b), min = half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + (five_bits ? 48 : 16);
  uint8_t u1 = 1, u2 = 2;
  for (int group = 0; group < 8; group += 2) {
    uint8_t sc, m;
    scale_min_k4(group, scales, sc, m);
    const float d1 = d * static_cast<float>(sc), m1 = min * static_cast<float>(m);
    scale_min_k4(group + 1, scales, sc, m);
    const float d2 = d * static_cast<float>(sc), m2 = min * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0xF) + (five_bits && (qh[l] & u1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + (five_bits && (qh[l] & u2) ? 16 : 0)) - m2;
    ql += 32;
    u1 = static_cast<uint8_t>(u1 << 2);
    u2 = static_cast<uint8_t>(u2 << 2);
  }
}

void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half(b + 208);
  for (int n = 0; n < QK_K; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

void iq4_nl(const uint8_t* b, float* y) {
  const float d = half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < QK / 2; ++j) {
    y[j] = d * static_cast<float>(IQ4_NL_VALUES[qs[j] & 0xF]);
    y[j + QK / 2] = d * static_cast<float>(IQ4_NL_VALUES[qs[j] >> 4]);
  }
}

void iq4_xs(const uint8_t* b, float* y) {
  const float d = half(b);
  uint16_t scales_h;
  std::memcpy(&scales_h, b + 2, 2);
  const uint8_t* scales_l = b + 4;
  const uint8_t* qs = b + 8;
  for (int group = 0; group < QK_K / 32; ++group) {
    const int ls = ((scales_l[group / 2] >> (4 * (group % 2))) & 0xF) | (((scales_h >> (2 * group)) & 3) << 4);
    const float dl = d * static_cast<float>(ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * static_cast<float>(IQ4_NL_VALUES[qs[j] & 0xF]);
      y[j + 16] = dl * static_cast<float>(IQ4_NL_VALUES[qs[j] >> 4]);
    }
    y += 32;
    qs += 16;
  }
}

}  // namespace

GgmlBlockDecoder ggml_block_decoder(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0: return q4_0;
    case GgmlType::Q4_1: return q4_1;
    case GgmlType::Q5_0: return [](const uint8_t* b, float* y) { q5(b, y, false); };
    case GgmlType::Q5_1: return [](const uint8_t* b, float* y) { q5(b, y, true); };
    case GgmlType::Q8_0: return q8_0;
    case GgmlType::Q2_K: return q2_k;
    case GgmlType::Q3_K: return q3_k;
    case GgmlType::Q4_K: return [](const uint8_t* b, float* y) { q4_k_or_q5_k(b, y, false); };
    case GgmlType::Q5_K: return [](const uint8_t* b, float* y) { q4_k_or_q5_k(b, y, true); };
    case GgmlType::Q6_K: return q6_k;
    case GgmlType::IQ4_NL: return iq4_nl;
    case GgmlType::IQ4_XS: return iq4_xs;
    default: return nullptr;
  }
}

namespace {

const std::map<GgmlType, GgmlTypeTraits>& traits_table() {
  static const std::map<GgmlType, GgmlTypeTraits> table = {
      {GgmlType::F32, {"F32", 1, 4, true}},          {GgmlType::F16, {"F16", 1, 2, true}},
      {GgmlType::Q4_0, {"Q4_0", 32, 18, true}},      {GgmlType::Q4_1, {"Q4_1", 32, 20, true}},
      {GgmlType::Q5_0, {"Q5_0", 32, 22, true}},      {GgmlType::Q5_1, {"Q5_1", 32, 24, true}},
      {GgmlType::Q8_0, {"Q8_0", 32, 34, true}},      {GgmlType::Q8_1, {"Q8_1", 32, 36, false}},
      {GgmlType::Q2_K, {"Q2_K", 256, 84, true}},     {GgmlType::Q3_K, {"Q3_K", 256, 110, true}},
      {GgmlType::Q4_K, {"Q4_K", 256, 144, true}},    {GgmlType::Q5_K, {"Q5_K", 256, 176, true}},
      {GgmlType::Q6_K, {"Q6_K", 256, 210, true}},    {GgmlType::Q8_K, {"Q8_K", 256, 292, false}},
      {GgmlType::IQ2_XXS, {"IQ2_XXS", 256, 66, false}}, {GgmlType::IQ2_XS, {"IQ2_XS", 256, 74, false}},
      {GgmlType::IQ3_XXS, {"IQ3_XXS", 256, 98, false}}, {GgmlType::IQ1_S, {"IQ1_S", 256, 50, false}},
      {GgmlType::IQ4_NL, {"IQ4_NL", 32, 18, true}},  {GgmlType::IQ3_S, {"IQ3_S", 256, 110, false}},
      {GgmlType::IQ2_S, {"IQ2_S", 256, 82, false}},  {GgmlType::IQ4_XS, {"IQ4_XS", 256, 136, true}},
      {GgmlType::I8, {"I8", 1, 1, false}},           {GgmlType::I16, {"I16", 1, 2, false}},
      {GgmlType::I32, {"I32", 1, 4, false}},         {GgmlType::I64, {"I64", 1, 8, false}},
      {GgmlType::F64, {"F64", 1, 8, false}},         {GgmlType::IQ1_M, {"IQ1_M", 256, 56, false}},
      {GgmlType::BF16, {"BF16", 1, 2, true}},        {GgmlType::TQ1_0, {"TQ1_0", 256, 54, false}},
      {GgmlType::TQ2_0, {"TQ2_0", 256, 66, false}},
  };
  return table;
}

// The table by type number: row_bytes asks for every row a kernel or a lookup reads, so no map search.
constexpr uint32_t TYPE_NUMBERS = 64;
const std::array<const GgmlTypeTraits*, TYPE_NUMBERS>& traits_by_number() {
  static const std::array<const GgmlTypeTraits*, TYPE_NUMBERS> index = [] {
    std::array<const GgmlTypeTraits*, TYPE_NUMBERS> out{};
    for (const auto& [type, traits] : traits_table()) out[static_cast<uint32_t>(type)] = &traits;
    return out;
  }();
  return index;
}

}  // namespace

std::optional<GgmlType> ggml_type_of(uint32_t number) {
  const auto type = static_cast<GgmlType>(number);
  return traits_table().count(type) ? std::optional<GgmlType>(type) : std::nullopt;
}

const GgmlTypeTraits& ggml_traits(GgmlType type) { return *traits_by_number()[static_cast<uint32_t>(type)]; }

void dequantize_row(GgmlType type, const std::byte* blocks, float* out, int64_t n) {
  const auto* b = reinterpret_cast<const uint8_t*>(blocks);
  switch (type) {
    case GgmlType::F32: std::memcpy(out, b, static_cast<size_t>(n) * 4); return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) out[i] = half(b + 2 * i);
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, b + 2 * i, 2);
        out[i] = bf16_to_f32(bits);
      }
      return;
    default: break;
  }
  const GgmlBlockDecoder decode = ggml_block_decoder(type);
  const GgmlTypeTraits& t = ggml_traits(type);
  if (!decode) throw std::invalid_argument(std::string("dequantize_row: tensor type ") + t.name + " is not supported");
  for (int64_t i = 0; i < n / t.block_elements; ++i) decode(b + i * t.block_bytes, out + i * t.block_elements);
}

namespace {

void put_u16(uint8_t* p, uint16_t bits) { std::memcpy(p, &bits, 2); }

// One Q8_0 block: half d, then 32 int8 (ggml-quants.c, quantize_row_q8_0_ref).
void quantize_q8_0_block(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < QK; ++j) amax = amax > std::fabs(x[j]) ? amax : std::fabs(x[j]);  // ggml's MAX: a NaN wins
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_u16(b, f32_to_f16(d));
  for (int j = 0; j < QK; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[j] * id)));
}

}  // namespace

bool quantizable(GgmlType type) {
  return type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16 || type == GgmlType::Q8_0;
}

void quantize_row(GgmlType type, const float* in, std::byte* blocks, int64_t n) {
  auto* b = reinterpret_cast<uint8_t*>(blocks);
  const GgmlTypeTraits& t = ggml_traits(type);
  if (!quantizable(type)) throw std::invalid_argument(std::string("quantize_row: tensor type ") + t.name + " is not written");
  if (n % t.block_elements != 0)
    throw std::invalid_argument(std::string("quantize_row: a row of ") + std::to_string(n) + " values is no whole number of " + t.name +
                                " blocks of " + std::to_string(t.block_elements));
  switch (type) {
    case GgmlType::F32: std::memcpy(b, in, static_cast<size_t>(n) * 4); return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) put_u16(b + 2 * i, f32_to_f16(in[i]));
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) put_u16(b + 2 * i, f32_to_bf16(in[i]));
      return;
    default:
      for (int64_t i = 0; i < n / QK; ++i) quantize_q8_0_block(in + i * QK, b + i * t.block_bytes);
  }
}

}  // namespace tpcli::tensor
