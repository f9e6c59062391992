#include "formats/gguf_file.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>
#include <stdexcept>

#include "formats/llama2c.h"  // MappedFile

namespace tpcli::formats::gguf {

namespace {

constexpr uint32_t MAGIC = 0x46554747;  // "GGUF" read as a little-endian u32
// llama.cpp's split keys (llama-arch.cpp LLM_KV_SPLIT_*; gguf-split writes them in every part).
constexpr const char* SPLIT_NO = "split.no";
constexpr const char* SPLIT_COUNT = "split.count";
constexpr const char* SPLIT_TENSORS_COUNT = "split.tensors.count";
constexpr size_t MAX_KEY_BYTES = 65535;
constexpr int MAX_DIMS = 4;
// The least bytes a tensor's description can take: name length, n_dims, one ne, type, offset.
constexpr uint64_t MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8;
constexpr uint64_t MIN_KV_BYTES = 8 + 4 + 1;
// Metadata elements in all (each held as a Scalar of ~40 bytes): the largest vocabularies' tokens,
// scores, types and merges are under a million; the cap bounds what a hostile file makes us hold.
constexpr uint64_t MAX_METADATA_ELEMENTS = uint64_t{1} << 22;

// Bytes one scalar of `type` takes in the file (strings: at least their length field).
uint64_t scalar_bytes(ValueType type) {
  switch (type) {
    case ValueType::u8: case ValueType::i8: case ValueType::boolean: return 1;
    case ValueType::u16: case ValueType::i16: return 2;
    case ValueType::u32: case ValueType::i32: case ValueType::f32: return 4;
    case ValueType::u64: case ValueType::i64: case ValueType::f64: case ValueType::string: return 8;
    case ValueType::array: break;
  }
  return 0;
}

bool is_integer_type(ValueType t) {
  return t == ValueType::u8 || t == ValueType::i8 || t == ValueType::u16 || t == ValueType::i16 || t == ValueType::u32 ||
         t == ValueType::i32 || t == ValueType::u64 || t == ValueType::i64;
}

std::optional<int64_t> as_integer(const Scalar& s) {
  if (const auto* u = std::get_if<uint64_t>(&s)) return *u <= static_cast<uint64_t>(INT64_MAX) ? std::optional<int64_t>(static_cast<int64_t>(*u)) : std::nullopt;
  if (const auto* i = std::get_if<int64_t>(&s)) return *i;
  return std::nullopt;
}

std::optional<double> as_number(const Scalar& s) {
  if (const auto* d = std::get_if<double>(&s)) return *d;
  if (const auto* u = std::get_if<uint64_t>(&s)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&s)) return static_cast<double>(*i);
  return std::nullopt;
}

}  // namespace

std::string printable(std::string_view text) {
  constexpr size_t MAX_BYTES = 120;
  std::string out;
  for (size_t i = 0; i < text.size() && i < MAX_BYTES; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c != 0x7F) {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", c);
      out += hex;
    }
  }
  return text.size() > MAX_BYTES ? out + "..." : out;
}

std::string value_type_name(ValueType type) {
  static const char* const names[] = {"UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
                                      "BOOL",  "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64"};
  const auto i = static_cast<uint32_t>(type);
  return i < std::size(names) ? names[i] : "type " + std::to_string(i);
}

uint64_t TensorInfo::elements() const {
  uint64_t n = 1;
  for (uint64_t d : ne) n *= d;  // checked against overflow when the file was read
  return n;
}

// A cursor over the header: every read checks the bytes are there.
class HeaderReader {
 public:
  explicit HeaderReader(GgufFile& file) : file_(file), data_(file.file_->data()), size_(file.file_->size()) {}

  void read() {
    if (u32("the magic") != MAGIC) file_.fail("not a GGUF file (the first 4 bytes are not \"GGUF\")");
    file_.version_ = u32("the version");
    if (file_.version_ != 2 && file_.version_ != 3)
      file_.fail("GGUF version " + std::to_string(file_.version_) + " is not supported (2 and 3 are)");
    const uint64_t tensor_count = u64("the tensor count"), kv_count = u64("the metadata count");
    if (kv_count > remaining() / MIN_KV_BYTES) file_.fail("metadata count " + std::to_string(kv_count) + " exceeds what the file can hold");
    if (tensor_count > remaining() / MIN_TENSOR_INFO_BYTES)
      file_.fail("tensor count " + std::to_string(tensor_count) + " exceeds what the file can hold");
    for (uint64_t i = 0; i < kv_count; ++i) read_key_value();
    read_alignment();
    for (uint64_t i = 0; i < tensor_count; ++i) read_tensor_info();
    const uint64_t a = file_.alignment_;
    file_.data_offset_ = (at_ + a - 1) / a * a;
    for (TensorInfo& t : file_.tensors_) place(t);
    check_overlaps();
  }

 private:
  uint64_t remaining() const { return size_ - at_; }

  const std::byte* take(uint64_t bytes, const std::string& what) {
    if (bytes > remaining()) file_.fail("truncated: " + what + " needs " + std::to_string(bytes) + " bytes at offset " + std::to_string(at_) +
                                        ", the file has " + std::to_string(remaining()) + " left");
    const std::byte* p = data_ + at_;
    at_ += bytes;
    return p;
  }
  template <typename T>
  T scalar(const std::string& what) {
    T v;
    std::memcpy(&v, take(sizeof v, what), sizeof v);
    return v;
  }
  uint32_t u32(const std::string& what) { return scalar<uint32_t>(what); }
  uint64_t u64(const std::string& what) { return scalar<uint64_t>(what); }

  std::string string(const std::string& what, uint64_t max_bytes = UINT64_MAX) {
    const uint64_t length = u64(what + "'s length");
    if (length > max_bytes) file_.fail(what + " is " + std::to_string(length) + " bytes long (at most " + std::to_string(max_bytes) + ")");
    const std::byte* p = take(length, what);
    return std::string(reinterpret_cast<const char*>(p), length);
  }

  ValueType value_type(const std::string& what) {
    const uint32_t t = u32(what + "'s type");
    if (t > static_cast<uint32_t>(ValueType::f64)) file_.fail(what + " has an unknown value type " + std::to_string(t));
    return static_cast<ValueType>(t);
  }

  Scalar read_scalar(ValueType type, const std::string& what) {
    switch (type) {
      case ValueType::u8: return uint64_t{scalar<uint8_t>(what)};
      case ValueType::i8: return int64_t{scalar<int8_t>(what)};
      case ValueType::u16: return uint64_t{scalar<uint16_t>(what)};
      case ValueType::i16: return int64_t{scalar<int16_t>(what)};
      case ValueType::u32: return uint64_t{scalar<uint32_t>(what)};
      case ValueType::i32: return int64_t{scalar<int32_t>(what)};
      case ValueType::u64: return scalar<uint64_t>(what);
      case ValueType::i64: return scalar<int64_t>(what);
      case ValueType::f32: return double{scalar<float>(what)};
      case ValueType::f64: return scalar<double>(what);
      case ValueType::boolean: {
        const uint8_t b = scalar<uint8_t>(what);
        if (b > 1) file_.fail(what + " is a bool of value " + std::to_string(b));
        return b == 1;
      }
      case ValueType::string: return string(what);
      case ValueType::array: break;
    }
    file_.fail(what + ": an array inside an array is not supported");
  }

  void read_key_value() {
    const std::string key = string("a metadata key", MAX_KEY_BYTES);
    const std::string what = "metadata '" + printable(key) + "'";
    Value value;
    value.type = value_type(what);
    if (value.type == ValueType::array) {
      value.element_type = value_type(what + "'s elements");
      if (value.element_type == ValueType::array) file_.fail(what + ": an array of arrays is not supported");
      const uint64_t count = u64(what + "'s length");
      if (count > remaining() / scalar_bytes(value.element_type))
        file_.fail(what + " has " + std::to_string(count) + " elements, more than the file can hold");
      metadata_elements_ += count;
      if (metadata_elements_ > MAX_METADATA_ELEMENTS)
        file_.fail(what + ": the metadata holds more than " + std::to_string(MAX_METADATA_ELEMENTS) + " array elements");
      value.items.reserve(count);
      for (uint64_t i = 0; i < count; ++i) value.items.push_back(read_scalar(value.element_type, what));
    } else {
      value.items.push_back(read_scalar(value.type, what));
    }
    if (!file_.metadata_index_.emplace(key, file_.metadata_.size()).second) file_.fail(what + " is given twice");
    file_.metadata_.emplace_back(key, std::move(value));
  }

  void read_alignment() {
    const Value* a = file_.find("general.alignment");
    if (!a) return;
    const auto* v = std::get_if<uint64_t>(&a->items.front());
    if (a->type != ValueType::u32 || !v || *v == 0 || (*v & (*v - 1)) != 0)
      file_.fail("metadata 'general.alignment' must be a UINT32 power of two");
    file_.alignment_ = static_cast<uint32_t>(*v);
  }

  void read_tensor_info() {
    TensorInfo t;
    t.name = string("a tensor name", MAX_KEY_BYTES);
    const std::string what = "tensor '" + printable(t.name) + "'";
    const uint32_t dims = u32(what + "'s dimension count");
    if (dims < 1 || dims > MAX_DIMS) file_.fail(what + " has " + std::to_string(dims) + " dimensions (1 to 4 are allowed)");
    uint64_t elements = 1;
    for (uint32_t d = 0; d < dims; ++d) {
      const uint64_t n = u64(what + "'s shape");
      if (n == 0 || __builtin_mul_overflow(elements, n, &elements) || elements > (uint64_t{1} << 60))
        file_.fail(what + " has an impossible shape (a dimension of " + std::to_string(n) + ")");
      t.ne.push_back(n);
    }
    const uint32_t type_number = u32(what + "'s type");
    const auto type = tensor::ggml_type_of(type_number);
    if (!type) file_.fail(what + " has an unknown tensor type " + std::to_string(type_number));
    t.type = *type;
    const tensor::GgmlTypeTraits& tr = tensor::ggml_traits(t.type);
    if (t.ne[0] % static_cast<uint64_t>(tr.block_elements) != 0)
      file_.fail(what + " (" + tr.name + ") has rows of " + std::to_string(t.ne[0]) + " values, not whole blocks of " +
                 std::to_string(tr.block_elements));
    t.bytes = elements / static_cast<uint64_t>(tr.block_elements) * static_cast<uint64_t>(tr.block_bytes);
    t.offset = u64(what + "'s offset");
    if (!file_.tensor_index_.emplace(t.name, file_.tensors_.size()).second) file_.fail(what + " is given twice");
    file_.tensors_.push_back(std::move(t));
  }

  void place(TensorInfo& t) {
    const std::string what = "tensor '" + printable(t.name) + "'";
    if (t.offset % file_.alignment_ != 0)
      file_.fail(what + "'s offset " + std::to_string(t.offset) + " is not a multiple of the alignment " + std::to_string(file_.alignment_));
    const uint64_t data_size = size_ >= file_.data_offset_ ? size_ - file_.data_offset_ : 0;
    if (t.offset > data_size || t.bytes > data_size - t.offset)
      file_.fail(what + " (" + std::to_string(t.bytes) + " bytes at data offset " + std::to_string(t.offset) + ") lies beyond the end of the file");
    t.data = {data_ + file_.data_offset_ + t.offset, t.bytes};
  }

  void check_overlaps() const {
    std::vector<const TensorInfo*> by_offset;
    for (const TensorInfo& t : file_.tensors_) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i)
      if (by_offset[i - 1]->offset + by_offset[i - 1]->bytes > by_offset[i]->offset)
        file_.fail("tensors '" + printable(by_offset[i - 1]->name) + "' and '" + printable(by_offset[i]->name) + "' overlap");
  }

  GgufFile& file_;
  const std::byte* data_;
  uint64_t size_;
  uint64_t at_ = 0;
  uint64_t metadata_elements_ = 0;
};

GgufFile::GgufFile(const std::string& path, AsPart) : file_(std::make_unique<MappedFile>(path)) { HeaderReader(*this).read(); }

GgufFile::GgufFile(const std::string& path) : GgufFile(path, AsPart{}) { open_other_parts(); }

void GgufFile::open_other_parts() {
  const std::optional<int64_t> count = integer(SPLIT_COUNT);
  if (!count || *count <= 1) return;
  const int64_t number = integer(SPLIT_NO).value_or(0);
  if (number != 0)
    fail("metadata '" + std::string(SPLIT_NO) + "' is " + std::to_string(number) + ": open a split set by its first part (-00001-of-)");
  const std::optional<std::vector<std::string>> names = split_parts(path());
  if (!names) fail("metadata '" + std::string(SPLIT_COUNT) + "' is " + std::to_string(*count) + ", but the name is not a split set's first part, NAME-00001-of-" +
                   "NNNNN.gguf, which names the others");
  if (static_cast<int64_t>(names->size()) != *count)
    fail("metadata '" + std::string(SPLIT_COUNT) + "' is " + std::to_string(*count) + ", the file name says " + std::to_string(names->size()) + " parts");
  for (size_t i = 1; i < names->size(); ++i) {
    const std::string& name = (*names)[i];
    std::error_code ignored;
    if (!std::filesystem::exists(name, ignored))
      fail("split part " + std::to_string(i + 1) + " of " + std::to_string(*count) + ", " + name + ", is missing");
    auto part = std::unique_ptr<GgufFile>(new GgufFile(name, AsPart{}));
    const std::optional<int64_t> its_count = part->integer(SPLIT_COUNT), its_number = part->integer(SPLIT_NO);
    if (its_count != count)
      part->fail("metadata '" + std::string(SPLIT_COUNT) + "' is " + (its_count ? std::to_string(*its_count) : "missing") + ", the first part's is " +
                 std::to_string(*count));
    if (its_number != static_cast<int64_t>(i))
      part->fail("metadata '" + std::string(SPLIT_NO) + "' is " + (its_number ? std::to_string(*its_number) : "missing") + ", its name says " +
                 std::to_string(i));
    for (TensorInfo t : part->tensors_) {
      if (const TensorInfo* before = tensor(t.name))
        part->fail("tensor '" + printable(t.name) + "' is also in " + (before->part == 0 ? path() : parts_[before->part - 1]->path()));
      t.part = static_cast<int>(i);
      tensor_index_.emplace(t.name, tensors_.size());
      tensors_.push_back(std::move(t));
    }
    parts_.push_back(std::move(part));
  }
  if (const std::optional<int64_t> total = integer(SPLIT_TENSORS_COUNT); total && *total != static_cast<int64_t>(tensors_.size()))
    fail("metadata '" + std::string(SPLIT_TENSORS_COUNT) + "' is " + std::to_string(*total) + ", the " + std::to_string(*count) + " parts hold " +
         std::to_string(tensors_.size()) + " tensors");
}

void GgufFile::release_pages(const TensorInfo& t) const {
  (t.part == 0 ? *file_ : parts_.at(static_cast<size_t>(t.part - 1))->mapped()).release_pages(t.data.data(), t.data.size());
}

void GgufFile::release_all_pages() const {
  file_->release_all_pages();
  for (const auto& part : parts_) part->release_all_pages();
}

GgufFile::~GgufFile() = default;

const std::string& GgufFile::path() const { return file_->path(); }

void GgufFile::fail(const std::string& what) const { throw std::runtime_error(path() + ": " + what); }

const Value* GgufFile::find(const std::string& key) const {
  const auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const TensorInfo* GgufFile::tensor(const std::string& name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const Value& GgufFile::typed(const std::string& key, const Value& value, bool array) const {
  if ((value.type == ValueType::array) != array)
    fail("metadata '" + key + "' is " + (array ? "not an array" : "an array") + " (" + value_type_name(value.type) + ")");
  return value;
}

std::optional<std::string> GgufFile::string(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (typed(key, *v, false).type != ValueType::string) fail("metadata '" + key + "' is " + value_type_name(v->type) + ", not STRING");
  return std::get<std::string>(v->items.front());
}

std::optional<int64_t> GgufFile::integer(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  const auto i = is_integer_type(typed(key, *v, false).type) ? as_integer(v->items.front()) : std::nullopt;
  if (!i) fail("metadata '" + key + "' is " + value_type_name(v->type) + ", not an integer that fits in 63 bits");
  return i;
}

std::optional<double> GgufFile::number(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  const auto d = typed(key, *v, false).type == ValueType::boolean ? std::nullopt : as_number(v->items.front());
  if (!d) fail("metadata '" + key + "' is " + value_type_name(v->type) + ", not a number");
  return d;
}

std::optional<bool> GgufFile::boolean(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (typed(key, *v, false).type != ValueType::boolean) fail("metadata '" + key + "' is " + value_type_name(v->type) + ", not BOOL");
  return std::get<bool>(v->items.front());
}

std::optional<std::vector<std::string>> GgufFile::strings(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (typed(key, *v, true).element_type != ValueType::string)
    fail("metadata '" + key + "' is an array of " + value_type_name(v->element_type) + ", not of STRING");
  std::vector<std::string> out;
  out.reserve(v->items.size());
  for (const Scalar& s : v->items) out.push_back(std::get<std::string>(s));
  return out;
}

std::optional<std::vector<double>> GgufFile::numbers(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  const ValueType t = typed(key, *v, true).element_type;
  if (t == ValueType::string || t == ValueType::boolean)
    fail("metadata '" + key + "' is an array of " + value_type_name(t) + ", not of numbers");
  std::vector<double> out;
  out.reserve(v->items.size());
  for (const Scalar& s : v->items) out.push_back(*as_number(s));
  return out;
}

std::optional<std::vector<int64_t>> GgufFile::integers(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (!is_integer_type(typed(key, *v, true).element_type))
    fail("metadata '" + key + "' is an array of " + value_type_name(v->element_type) + ", not of integers");
  std::vector<int64_t> out;
  out.reserve(v->items.size());
  for (const Scalar& s : v->items) {
    const auto i = as_integer(s);
    if (!i) fail("metadata '" + key + "' holds an integer beyond 63 bits");
    out.push_back(*i);
  }
  return out;
}

std::optional<std::vector<std::string>> split_parts(const std::string& path) {
  static const std::regex pattern(R"((.*)-(\d{5})-of-(\d{5})\.gguf)");
  std::smatch m;
  if (!std::regex_match(path, m, pattern) || std::stoi(m[2]) != 1) return std::nullopt;
  const int count = std::stoi(m[3]);
  if (count < 1) return std::nullopt;
  std::vector<std::string> parts;
  char suffix[32];
  for (int i = 1; i <= count; ++i) {
    std::snprintf(suffix, sizeof suffix, "-%05d-of-%05d.gguf", i, count);
    parts.push_back(m[1].str() + suffix);
  }
  return parts;
}

}  // namespace tpcli::formats::gguf
