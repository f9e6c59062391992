// Test support: an mlx-community-style quantized Hugging Face directory, written from a float one
// by MLX's affine or mxfp8 rule (../shared/QUANT.md sections 2 and 3, the CPU rules) coded here
// independently of tpcli's quantizer and loader: what `mlx_lm.convert -q` leaves, for the readers
// to be checked against.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "formats/dtype.h"
#include "formats/safetensors.h"

namespace tpcli::testing {

// One row quantized: codes packed LSB-first into words; affine: scales and biases in f32;
// mxfp8: E8M0 scale bytes.
struct QuantizedRow {
  std::vector<uint32_t> words;        // [cols * bits / 32]
  std::vector<float> scales, biases;  // [cols / group] (affine)
  std::vector<uint8_t> scale_bytes;   // [cols / 32] (mxfp8)
  std::vector<uint32_t> codes;        // [cols]
};

// The row's codes into words, each element's bits LSB-first in one bitstream (section 1).
inline void pack_codes(QuantizedRow& r, int cols, int bits) {
  r.words.assign(size_t(cols * bits / 32), 0u);
  for (int i = 0; i < cols; ++i)
    for (int b = 0; b < bits; ++b)
      if ((r.codes[size_t(i)] >> b) & 1u) r.words[size_t((i * bits + b) / 32)] |= 1u << ((i * bits + b) % 32);
}

// Affine (section 2): per group, the largest-magnitude end as the bias, 0 on the grid.
inline QuantizedRow quantize_row(const float* w, int cols, int bits, int group) {
  QuantizedRow r;
  const float n = float((1 << bits) - 1);
  for (int g = 0; g < cols / group; ++g) {
    const float* x = w + g * group;
    const float lo = *std::min_element(x, x + group), hi = *std::max_element(x, x + group);
    const bool low_edge = std::abs(lo) > std::abs(hi);
    const float edge = low_edge ? lo : hi;
    const float s = (low_edge ? 1.0f : -1.0f) * std::max((hi - lo) / n, 1e-7f);
    const float q0 = std::rint(edge / s);
    const float scale = q0 != 0 ? edge / q0 : s, bias = q0 != 0 ? edge : 0.0f;
    r.scales.push_back(scale);
    r.biases.push_back(bias);
    for (int i = 0; i < group; ++i) r.codes.push_back(uint32_t(std::clamp(std::rint((x[i] - bias) / scale), 0.0f, n)));
  }
  pack_codes(r, cols, bits);
  return r;
}

// E4M3 (section 3): the nearest of the 127 finite magnitudes by search, ties to the even code
// (the even mantissa); 448 and beyond saturate to 0x7E; the sign in bit 7.
inline uint8_t e4m3_code(float x) {
  auto value = [](int code) {
    const int e = code >> 3, m = code & 7;
    return e > 0 ? std::ldexp(1.0f + float(m) / 8, e - 7) : std::ldexp(float(m) / 8, -6);
  };
  const float a = std::abs(x);
  int best = 0x7E;
  if (a < 448.0f) {
    best = 0;
    for (int code = 1; code < 0x7F; ++code) {
      const float d = std::abs(a - value(code)), best_d = std::abs(a - value(best));
      if (d < best_d || (d == best_d && code % 2 == 0)) best = code;
    }
  }
  return uint8_t((std::signbit(x) ? 0x80 : 0) | best);
}

// mxfp8 by MLX's CPU rule (section 3): per group of 32, e = round-half-even(log2(amax / 448))
// (an all-zero group e = 0), scale byte e + 127, elements E4M3(w / 2^e).
inline QuantizedRow quantize_row_mxfp8(const float* w, int cols) {
  QuantizedRow r;
  for (int g = 0; g < cols / 32; ++g) {
    const float* x = w + g * 32;
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::abs(x[i]));
    const int e = amax > 0 ? int(std::nearbyint(std::log2(amax / 448.0f))) : 0;
    r.scale_bytes.push_back(uint8_t(e + 127));
    for (int i = 0; i < 32; ++i) r.codes.push_back(e4m3_code(std::ldexp(x[i], -e)));
  }
  pack_codes(r, cols, 8);
  return r;
}

inline std::vector<uint16_t> bf16_of(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  formats::from_f32(out.data(), v.data(), model::DType::BF16, int64_t(v.size()));
  return out;
}

// `values` stored as `dtype` (F32, F16 or BF16).
inline std::vector<std::byte> stored_as(const std::vector<float>& values, model::DType dtype) {
  std::vector<std::byte> out(values.size() * formats::dtype_bytes(dtype));
  formats::from_f32(out.data(), values.data(), dtype, int64_t(values.size()));
  return out;
}

// The directory `to` made from the float Hugging Face directory `from` (one model.safetensors):
// every Linear and the embedding whose input dimension the group divides as U32 words + scales and
// biases (mxfp8: U8 scales, no biases), the rest unquantized; scales, biases and the rest in
// `dtype`, the dtype MLX quantized the model in (BF16 for an mlx-community model, F32 for an f32
// one); config.json with "quantization" (affine: no "mode", as older files; mxfp8: "mode"); an
// index beside the one shard, metadata {"format": "mlx"}. Returns the quantized rows by Hugging
// Face tensor name.
inline std::map<std::string, std::vector<QuantizedRow>> write_mlx_dir(const std::filesystem::path& from,
                                                                       const std::filesystem::path& to, int bits, int group,
                                                                       model::DType dtype = model::DType::BF16,
                                                                       const std::string& mode = "affine") {
  using model::DType;
  using nlohmann::json;
  std::filesystem::create_directories(to);
  const formats::SafetensorsFile in((from / "model.safetensors").string());
  std::map<std::string, std::vector<QuantizedRow>> rows_of;
  const bool mx = mode == "mxfp8";
  std::vector<std::vector<uint32_t>> word_store;
  std::vector<std::vector<std::byte>> float_store;
  std::vector<std::vector<uint8_t>> byte_store;
  std::vector<formats::NamedTensor> out;
  json weight_map;
  for (const auto& name : in.names()) {
    const auto t = in.tensor(name);
    const bool quantize = t.shape.size() == 2 && name.ends_with(".weight") && t.shape[1] % group == 0;
    const std::string module = name.substr(0, name.size() - 7);
    if (!quantize) {
      float_store.push_back(stored_as({t.data.begin(), t.data.end()}, dtype));
      out.push_back({name, {dtype, t.shape, float_store.back().data()}});
      weight_map[name] = "model.safetensors";
      continue;
    }
    const int rows = int(t.shape[0]), cols = int(t.shape[1]);
    std::vector<uint32_t> words;
    std::vector<float> scales, biases;
    std::vector<uint8_t> scale_bytes;
    for (int r = 0; r < rows; ++r) {
      const float* row = t.data.data() + size_t(r) * cols;
      rows_of[name].push_back(mx ? quantize_row_mxfp8(row, cols) : quantize_row(row, cols, bits, group));
      const QuantizedRow& q = rows_of[name].back();
      words.insert(words.end(), q.words.begin(), q.words.end());
      scales.insert(scales.end(), q.scales.begin(), q.scales.end());
      biases.insert(biases.end(), q.biases.begin(), q.biases.end());
      scale_bytes.insert(scale_bytes.end(), q.scale_bytes.begin(), q.scale_bytes.end());
    }
    word_store.push_back(std::move(words));
    out.push_back({name, {DType::U32, {rows, cols * bits / 32}, word_store.back().data()}});
    weight_map[name] = weight_map[module + ".scales"] = "model.safetensors";
    if (mx) {
      byte_store.push_back(std::move(scale_bytes));
      out.push_back({module + ".scales", {DType::U8, {rows, cols / group}, byte_store.back().data()}});
      continue;
    }
    float_store.push_back(stored_as(scales, dtype));
    out.push_back({module + ".scales", {dtype, {rows, cols / group}, float_store.back().data()}});
    float_store.push_back(stored_as(biases, dtype));
    out.push_back({module + ".biases", {dtype, {rows, cols / group}, float_store.back().data()}});
    weight_map[module + ".biases"] = "model.safetensors";
  }
  formats::write_stored_safetensors((to / "model.safetensors").string(), out, {{"format", "mlx"}});
  const json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
  std::ofstream(to / "model.safetensors.index.json") << index.dump(2);
  json config = json::parse(std::ifstream(from / "config.json"));
  config["quantization"] = {{"group_size", group}, {"bits", bits}};
  if (mx) config["quantization"]["mode"] = mode;
  config["quantization_config"] = config["quantization"];
  config["torch_dtype"] = dtype == DType::BF16 ? "bfloat16" : dtype == DType::F16 ? "float16" : "float32";
  std::ofstream(to / "config.json") << config.dump(2);
  return rows_of;
}

}  // namespace tpcli::testing
