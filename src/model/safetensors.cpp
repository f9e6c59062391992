#include "model/safetensors.h"
#include "model/atomic_file.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>

namespace tpcli::model {

namespace {

constexpr uint64_t MAX_HEADER_BYTES = 100u << 20;  // the safetensors spec's own limit

// ---- a small JSON reader: just what a safetensors header holds ----

struct Json {
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  std::string text;  // String: the value; Number: its literal
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;
};

class JsonParser {
 public:
  JsonParser(std::string_view src, const std::string& origin) : src_(src), origin_(origin) {}

  Json document() {
    Json v = value(0);
    skip_space();
    if (pos_ != src_.size()) fail("trailing characters after the header object");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(origin_ + ": header JSON at byte " + std::to_string(pos_) + ": " + what);
  }
  void skip_space() {
    while (pos_ < src_.size() && (src_[pos_] == ' ' || src_[pos_] == '\n' || src_[pos_] == '\r' || src_[pos_] == '\t'))
      ++pos_;
  }
  char peek() {
    skip_space();
    if (pos_ >= src_.size()) fail("unexpected end");
    return src_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  bool literal(std::string_view word) {
    if (src_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  Json value(int depth) {
    if (depth > 64) fail("nested too deeply");
    Json v;
    const char c = peek();
    if (c == '{') {
      v.kind = Json::Kind::Object;
      ++pos_;
      if (peek() == '}') {
        ++pos_;
        return v;
      }
      for (;;) {
        if (peek() != '"') fail("expected a member name");
        std::string key = string();
        expect(':');
        v.members.emplace_back(std::move(key), value(depth + 1));
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.kind = Json::Kind::Array;
      ++pos_;
      if (peek() == ']') {
        ++pos_;
        return v;
      }
      for (;;) {
        v.items.push_back(value(depth + 1));
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.kind = Json::Kind::String;
      v.text = string();
      return v;
    }
    if (literal("true")) {
      v.kind = Json::Kind::Bool;
      v.boolean = true;
      return v;
    }
    if (literal("false")) {
      v.kind = Json::Kind::Bool;
      return v;
    }
    if (literal("null")) return v;
    if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = Json::Kind::Number;
      const size_t start = pos_;
      while (pos_ < src_.size() && std::strchr("+-0123456789.eE", src_[pos_]) != nullptr) ++pos_;
      v.text = std::string(src_.substr(start, pos_ - start));
      return v;
    }
    fail(std::string("unexpected character '") + c + "'");
  }

  std::string string() {
    ++pos_;  // opening quote
    std::string out;
    while (pos_ < src_.size() && src_[pos_] != '"') {
      char c = src_[pos_++];
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= src_.size()) fail("unterminated escape");
      c = src_[pos_++];
      switch (c) {
        case '"': case '\\': case '/': out += c; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': out += utf8(hex4()); break;
        default: fail(std::string("bad escape '\\") + c + "'");
      }
    }
    if (pos_ >= src_.size()) fail("unterminated string");
    ++pos_;  // closing quote
    return out;
  }
  uint32_t hex4() {
    if (pos_ + 4 > src_.size()) fail("short \\u escape");
    uint32_t cp = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = src_[pos_++];
      cp <<= 4;
      if (h >= '0' && h <= '9') cp |= static_cast<uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f') cp |= static_cast<uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') cp |= static_cast<uint32_t>(h - 'A' + 10);
      else fail("bad \\u escape");
    }
    if (cp >= 0xD800 && cp < 0xDC00 && src_.substr(pos_, 2) == "\\u") {  // surrogate pair
      pos_ += 2;
      const uint32_t low = hex4();
      if (low < 0xDC00 || low >= 0xE000) fail("bad surrogate pair");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    return cp;
  }
  static std::string utf8(uint32_t cp) {
    std::string s;
    if (cp < 0x80) s += static_cast<char>(cp);
    else if (cp < 0x800) { s += static_cast<char>(0xC0 | (cp >> 6)); s += static_cast<char>(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (cp >> 18));
      s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  }

  std::string_view src_;
  const std::string& origin_;
  size_t pos_ = 0;
};

std::string json_escape(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

bool parse_u64(const std::string& text, uint64_t& out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

std::string format_float(float v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(v));
  return buf;
}

}  // namespace

// ---- config <-> metadata ----

void config_to_metadata(const LlamaConfig& c, Metadata& m) {
  m["format"] = "tpcli";
  m["model.dim"] = std::to_string(c.dim);
  m["model.hidden_dim"] = std::to_string(c.hidden_dim);
  m["model.n_layers"] = std::to_string(c.n_layers);
  m["model.n_heads"] = std::to_string(c.n_heads);
  m["model.n_kv_heads"] = std::to_string(c.n_kv_heads);
  m["model.vocab_size"] = std::to_string(c.vocab_size);
  m["model.seq_len"] = std::to_string(c.seq_len);
  m["model.shared_classifier"] = c.shared_classifier ? "true" : "false";
  m["model.norm_eps"] = format_float(c.norm_eps);
  m["model.rope_theta"] = format_float(c.rope_theta);
  m["model.n_experts"] = std::to_string(c.n_experts);
  m["model.top_k"] = std::to_string(c.top_k);
  m["model.expert_hidden_dim"] = std::to_string(c.expert_hidden_dim);
  m["model.moe_aux_loss"] = format_float(c.moe_aux_loss);
  if (c.capacity_factor) m["model.capacity_factor"] = format_float(*c.capacity_factor);
  else m.erase("model.capacity_factor");
}

LlamaConfig config_from_metadata(const Metadata& m, const std::string& origin) {
  auto text = [&](const std::string& key) -> const std::string& {
    auto it = m.find(key);
    if (it == m.end()) throw std::runtime_error(origin + ": metadata key '" + key + "' is missing");
    return it->second;
  };
  auto integer = [&](const std::string& key, int& out, bool required) {
    if (!required && !m.count(key)) return;
    const std::string& s = text(key);
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (ec != std::errc() || end != s.data() + s.size())
      throw std::runtime_error(origin + ": metadata " + key + " = '" + s + "' is not an integer");
  };
  auto real = [&](const std::string& key, float& out) {
    if (!m.count(key)) return;
    const std::string& s = text(key);
    char* end = nullptr;
    out = std::strtof(s.c_str(), &end);
    if (s.empty() || *end != '\0') throw std::runtime_error(origin + ": metadata " + key + " = '" + s + "' is not a number");
  };
  LlamaConfig c;
  integer("model.dim", c.dim, true);
  integer("model.hidden_dim", c.hidden_dim, true);
  integer("model.n_layers", c.n_layers, true);
  integer("model.n_heads", c.n_heads, true);
  integer("model.n_kv_heads", c.n_kv_heads, true);
  integer("model.vocab_size", c.vocab_size, true);
  integer("model.seq_len", c.seq_len, true);
  const std::string& shared = text("model.shared_classifier");
  if (shared != "true" && shared != "false")
    throw std::runtime_error(origin + ": metadata model.shared_classifier = '" + shared + "' is not true/false");
  c.shared_classifier = shared == "true";
  real("model.norm_eps", c.norm_eps);
  real("model.rope_theta", c.rope_theta);
  integer("model.n_experts", c.n_experts, false);
  integer("model.top_k", c.top_k, false);
  integer("model.expert_hidden_dim", c.expert_hidden_dim, false);
  real("model.moe_aux_loss", c.moe_aux_loss);
  if (m.count("model.capacity_factor")) {
    float f = 0;
    real("model.capacity_factor", f);
    c.capacity_factor = f;
  }
  try {
    c.validate();
  } catch (const std::exception& e) {
    throw std::runtime_error(origin + ": metadata: " + e.what());
  }
  return c;
}

// ---- writing ----

void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors, const Metadata& metadata) {
  std::set<std::string> seen;
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      header += (first ? "" : ",") + json_escape(k) + ":" + json_escape(v);
      first = false;
    }
    header += "}";
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__" || !seen.insert(t.name).second)
      throw std::invalid_argument(path + ": duplicate or reserved tensor name '" + t.name + "'");
    if (static_cast<int64_t>(t.data.size()) != tensor::numel(t.shape))
      throw std::invalid_argument(path + ": tensor " + t.name + " has " + std::to_string(t.data.size()) +
                                  " values for shape " + tensor::to_string(t.shape));
    std::string shape;
    for (size_t i = 0; i < t.shape.size(); ++i) shape += (i ? "," : "") + std::to_string(t.shape[i]);
    const uint64_t end = offset + t.data.size_bytes();
    header += (header.size() > 1 ? "," : "") + json_escape(t.name) + ":{\"dtype\":\"F32\",\"shape\":[" + shape +
              "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) + "]}";
    offset = end;
  }
  header += "}";
  while ((8 + header.size()) % 8 != 0) header += ' ';

  write_atomically(path, [&](std::ostream& out) {
    const uint64_t n = header.size();  // little-endian host (x86-64)
    out.write(reinterpret_cast<const char*>(&n), sizeof(n));
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const auto& t : tensors)
      out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size_bytes()));
  });
}

void write_safetensors(const std::string& path, const WeightSource& weights, Metadata metadata) {
  config_to_metadata(weights.config(), metadata);
  std::vector<TensorView> tensors;
  for (const auto& p : llama_parameters(weights.config())) tensors.push_back({p.name, p.shape, weights.get(p.name)});
  write_safetensors(path, tensors, metadata);
}

// ---- reading ----

SafetensorsFile::SafetensorsFile(const std::string& path) : map_(path) {
  if (map_.size() < 8) throw std::runtime_error(path + ": file is " + std::to_string(map_.size()) + " bytes, too short for a safetensors header");
  uint64_t n = 0;
  std::memcpy(&n, map_.data(), 8);
  if (n > MAX_HEADER_BYTES || n > map_.size() - 8)
    throw std::runtime_error(path + ": header length " + std::to_string(n) + " exceeds the file (" +
                             std::to_string(map_.size()) + " bytes): not a safetensors file?");
  const std::string_view header_text(reinterpret_cast<const char*>(map_.data()) + 8, n);
  if (header_text.empty() || header_text[0] != '{') throw std::runtime_error(path + ": header does not start with '{': not a safetensors file?");
  const Json header = JsonParser(header_text, path).document();
  if (header.kind != Json::Kind::Object) throw std::runtime_error(path + ": header is not a JSON object");

  const std::byte* data = map_.data() + 8 + n;
  const uint64_t data_size = map_.size() - 8 - n;
  for (const auto& [name, entry] : header.members) {
    if (name == "__metadata__") {
      if (entry.kind != Json::Kind::Object) throw std::runtime_error(path + ": __metadata__ is not an object");
      for (const auto& [k, v] : entry.members) {
        if (v.kind != Json::Kind::String) throw std::runtime_error(path + ": __metadata__." + k + " is not a string");
        metadata_[k] = v.text;
      }
      continue;
    }
    auto bad = [&](const std::string& what) { return std::runtime_error(path + ": tensor '" + name + "': " + what); };
    if (entry.kind != Json::Kind::Object) throw bad("entry is not an object");
    const Json *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
    for (const auto& [k, v] : entry.members) {
      if (k == "dtype") dtype = &v;
      else if (k == "shape") shape = &v;
      else if (k == "data_offsets") offsets = &v;
    }
    if (!dtype || dtype->kind != Json::Kind::String) throw bad("dtype missing");
    if (dtype->text != "F32") throw bad("dtype " + dtype->text + " is not supported (only F32)");
    if (!shape || shape->kind != Json::Kind::Array) throw bad("shape missing");
    if (!offsets || offsets->kind != Json::Kind::Array || offsets->items.size() != 2) throw bad("data_offsets must be [begin, end]");
    TensorView view;
    view.name = name;
    uint64_t count = 1;
    for (const auto& d : shape->items) {
      uint64_t dim = 0;
      if (d.kind != Json::Kind::Number || !parse_u64(d.text, dim) || dim > (uint64_t{1} << 40)) throw bad("bad shape entry");
      view.shape.push_back(static_cast<int64_t>(dim));
      count *= dim;
      if (count > (uint64_t{1} << 40)) throw bad("shape too large");
    }
    uint64_t begin = 0, end = 0;
    if (offsets->items[0].kind != Json::Kind::Number || offsets->items[1].kind != Json::Kind::Number ||
        !parse_u64(offsets->items[0].text, begin) || !parse_u64(offsets->items[1].text, end))
      throw bad("data_offsets are not integers");
    if (begin > end || end > data_size)
      throw bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] outside the " +
                std::to_string(data_size) + " data bytes (truncated file?)");
    if (end - begin != count * sizeof(float))
      throw bad("data_offsets span " + std::to_string(end - begin) + " bytes but shape " + tensor::to_string(view.shape) +
                " needs " + std::to_string(count * sizeof(float)));
    if ((8 + n + begin) % alignof(float) != 0) throw bad("data is not 4-byte aligned");
    view.data = std::span<const float>(reinterpret_cast<const float*>(data + begin), static_cast<size_t>(count));
    tensors_.emplace(name, std::move(view));
  }

  if (metadata_.count("model.dim")) {
    config_ = config_from_metadata(metadata_, path);
    for (const auto& p : llama_parameters(*config_)) {
      auto it = tensors_.find(p.name);
      if (it == tensors_.end()) throw std::runtime_error(path + ": parameter tensor '" + p.name + "' is missing");
      if (it->second.shape != p.shape)
        throw std::runtime_error(path + ": parameter " + p.name + " has shape " + tensor::to_string(it->second.shape) +
                                 ", the config implies " + tensor::to_string(p.shape));
    }
  }
}

const TensorView& SafetensorsFile::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw std::out_of_range(path() + ": no tensor named '" + name + "'");
  return it->second;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : tensors_) out.push_back(k);
  return out;
}

const LlamaConfig& SafetensorsFile::config() const {
  if (!config_) throw std::runtime_error(path() + ": no model config in the metadata (model.* keys)");
  return *config_;
}

std::span<const float> SafetensorsFile::get(const std::string& name) const {
  if (name == "output" && config_ && config_->shared_classifier && !tensors_.count("output"))
    return tensor("tok_embeddings").data;
  return tensor(name).data;
}

}  // namespace tpcli::model
