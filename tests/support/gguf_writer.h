// Test support: a GGUF file's bytes (version 3, metadata only, no tensors), for synthetic files.
//
//   GgufWriter w;
//   w.string("tokenizer.ggml.model", "gpt2").strings("tokenizer.ggml.tokens", {"a", "b"});
//   tmp.write("tiny.gguf", w.bytes());
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace tpcli::testing {

class GgufWriter {
 public:
  GgufWriter& string(const std::string& key, const std::string& value) { return entry(key, 8).text(value); }
  GgufWriter& u32(const std::string& key, uint32_t value) { return entry(key, 4).pod(value); }
  GgufWriter& boolean(const std::string& key, bool value) { return entry(key, 7).pod(static_cast<uint8_t>(value)); }
  GgufWriter& strings(const std::string& key, const std::vector<std::string>& values) {
    entry(key, 9).pod(uint32_t{8}).pod(static_cast<uint64_t>(values.size()));
    for (const std::string& v : values) text(v);
    return *this;
  }
  GgufWriter& f32s(const std::string& key, const std::vector<float>& values) { return array(key, 6, values); }
  GgufWriter& i32s(const std::string& key, const std::vector<int32_t>& values) { return array(key, 5, values); }

  // "GGUF", version 3, no tensors, the entries in the order written.
  std::string bytes() const {
    std::string out = "GGUF";
    append(out, uint32_t{3});
    append(out, uint64_t{0});
    append(out, count_);
    return out + body_;
  }

 private:
  template <typename T>
  static void append(std::string& out, T value) {
    out.append(reinterpret_cast<const char*>(&value), sizeof value);
  }
  template <typename T>
  GgufWriter& pod(T value) {
    append(body_, value);
    return *this;
  }
  GgufWriter& text(const std::string& s) {
    pod(static_cast<uint64_t>(s.size()));
    body_ += s;
    return *this;
  }
  GgufWriter& entry(const std::string& key, uint32_t type) {
    ++count_;
    return text(key).pod(type);
  }
  template <typename T>
  GgufWriter& array(const std::string& key, uint32_t element_type, const std::vector<T>& values) {
    entry(key, 9).pod(element_type).pod(static_cast<uint64_t>(values.size()));
    for (T v : values) pod(v);
    return *this;
  }

  std::string body_;
  uint64_t count_ = 0;
};

}  // namespace tpcli::testing
