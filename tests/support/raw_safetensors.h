// Test support: a safetensors file read with nothing of tpcli's (its JSON header and raw bytes), to
// check what tpcli wrote independently of its own reader.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tpcli::testing {

struct RawSafetensors {
  nlohmann::json header;
  std::vector<char> data;
  // The F32 tensor `name`'s values.
  std::vector<float> f32(const std::string& name) const {
    const auto& h = header.at(name);
    const size_t begin = h["data_offsets"][0], end = h["data_offsets"][1];
    std::vector<float> v((end - begin) / 4);
    std::memcpy(v.data(), data.data() + begin, end - begin);
    return v;
  }
};

inline RawSafetensors read_raw(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string text(n, ' ');
  in.read(text.data(), static_cast<std::streamsize>(n));
  RawSafetensors raw{nlohmann::json::parse(text), {}};
  raw.data.assign(std::istreambuf_iterator<char>(in), {});
  return raw;
}

}  // namespace tpcli::testing
