// Test support: an mlx-community-style quantized Hugging Face directory, written from a float one
// by MLX's affine rule (../shared/QUANT.md section 2, the CPU rule) coded here independently of
// tpcli's quantizer and loader: what `mlx_lm.convert -q` leaves, for the readers to be checked against.
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

#include "model/dtype.h"
#include "model/safetensors.h"

namespace tpcli::testing {

// One row quantized: codes packed LSB-first into words, scales and biases in f32.
struct QuantizedRow {
  std::vector<uint32_t> words;        // [cols * bits / 32]
  std::vector<float> scales, biases;  // [cols / group]
  std::vector<uint32_t> codes;        // [cols]
};

inline QuantizedRow quantize_row(const float* w, int cols, int bits, int group) {
  QuantizedRow r;
  r.words.assign(size_t(cols * bits / 32), 0u);
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
  for (int i = 0; i < cols; ++i)
    for (int b = 0; b < bits; ++b)
      if ((r.codes[size_t(i)] >> b) & 1u) r.words[size_t((i * bits + b) / 32)] |= 1u << ((i * bits + b) % 32);
  return r;
}

inline std::vector<uint16_t> bf16_of(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  model::from_f32(out.data(), v.data(), model::DType::BF16, int64_t(v.size()));
  return out;
}

// `values` stored as `dtype` (F32, F16 or BF16).
inline std::vector<std::byte> stored_as(const std::vector<float>& values, model::DType dtype) {
  std::vector<std::byte> out(values.size() * model::dtype_bytes(dtype));
  model::from_f32(out.data(), values.data(), dtype, int64_t(values.size()));
  return out;
}

// The directory `to` made from the float Hugging Face directory `from` (one model.safetensors):
// every Linear and the embedding whose input dimension the group divides as U32 words + scales and
// biases, the rest unquantized; scales, biases and the rest in `dtype`, the dtype MLX quantized
// the model in (BF16 for an mlx-community model, F32 for an f32 one); config.json with
// "quantization" (no "mode": older files, affine); an index beside the one shard, metadata
// {"format": "mlx"}. Returns the quantized rows by Hugging Face tensor name.
inline std::map<std::string, std::vector<QuantizedRow>> write_mlx_dir(const std::filesystem::path& from,
                                                                       const std::filesystem::path& to, int bits, int group,
                                                                       model::DType dtype = model::DType::BF16) {
  using model::DType;
  using nlohmann::json;
  std::filesystem::create_directories(to);
  const model::SafetensorsFile in((from / "model.safetensors").string());
  std::map<std::string, std::vector<QuantizedRow>> rows_of;
  std::vector<std::vector<uint32_t>> word_store;
  std::vector<std::vector<std::byte>> float_store;
  std::vector<model::NamedTensor> out;
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
    for (int r = 0; r < rows; ++r) {
      rows_of[name].push_back(quantize_row(t.data.data() + size_t(r) * cols, cols, bits, group));
      const QuantizedRow& q = rows_of[name].back();
      words.insert(words.end(), q.words.begin(), q.words.end());
      scales.insert(scales.end(), q.scales.begin(), q.scales.end());
      biases.insert(biases.end(), q.biases.begin(), q.biases.end());
    }
    word_store.push_back(std::move(words));
    out.push_back({name, {DType::U32, {rows, cols * bits / 32}, word_store.back().data()}});
    float_store.push_back(stored_as(scales, dtype));
    out.push_back({module + ".scales", {dtype, {rows, cols / group}, float_store.back().data()}});
    float_store.push_back(stored_as(biases, dtype));
    out.push_back({module + ".biases", {dtype, {rows, cols / group}, float_store.back().data()}});
    for (const char* part : {".weight", ".scales", ".biases"}) weight_map[module + part] = "model.safetensors";
  }
  model::write_stored_safetensors((to / "model.safetensors").string(), out, {{"format", "mlx"}});
  const json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
  std::ofstream(to / "model.safetensors.index.json") << index.dump(2);
  json config = json::parse(std::ifstream(from / "config.json"));
  config["quantization"] = {{"group_size", group}, {"bits", bits}};
  config["quantization_config"] = config["quantization"];
  config["torch_dtype"] = dtype == DType::BF16 ? "bfloat16" : dtype == DType::F16 ? "float16" : "float32";
  std::ofstream(to / "config.json") << config.dump(2);
  return rows_of;
}

}  // namespace tpcli::testing
