// tpcli::formats — GGUF files (llama.cpp's model format), versions 2 and 3: the container, read
// through mmap. What the metadata means for a model, and the tensor types' blocks, are read by the
// layers above; this file only promises that what it hands out lies inside the file.
//
// Layout (little-endian):
//   "GGUF", u32 version, u64 tensor_count, u64 kv_count
//   kv_count x   string key, u32 value type, value        (a string is u64 length + bytes, no NUL)
//                an array value is u32 element type, u64 count, count elements (not arrays)
//   tensor_count x  string name, u32 n_dims (1..4), n_dims x u64 ne (ne[0]: the row length,
//                   the fastest-varying), u32 tensor type, u64 offset (from the data section)
//   padding to general.alignment (u32, default 32), then the data section.
// A tensor's bytes are ne[1]*ne[2]*ne[3] rows of ne[0] / block_elements blocks of block_bytes each.
//
// Every error is one std::runtime_error line naming the file and what is wrong: a bad magic or
// version, a count, length or dimension the file cannot hold, an unknown value or tensor type, a
// duplicate key or tensor, a tensor outside the file, misaligned or overlapping another.
//
// A split set (llama.cpp's gguf-split: "NAME-00001-of-00003.gguf" ... "NAME-00003-of-00003.gguf")
// is opened by its first file, whose metadata says split.count (UINT16) > 1: every part is mapped,
// each holding split.no (its index from 0) and some of the tensors, and tensors() and tensor() span
// them all (split.tensors.count in all). The model's metadata is the first part's. A missing part,
// a part whose split.count or split.no disagrees, or a tensor in two parts is a one-line error
// naming the part.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "tensor/ggml_blocks.h"

namespace tpcli::formats {

class MappedFile;

namespace gguf {

enum class ValueType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};
std::string value_type_name(ValueType type);  // gguf-py's spelling: "UINT32", "STRING", ...

using TensorType = tensor::GgmlType;  // tensor/ggml_blocks.h: the types and their blocks

// One metadata value: a scalar, or an array of scalars of one type.
using Scalar = std::variant<uint64_t, int64_t, double, bool, std::string>;
struct Value {
  ValueType type = ValueType::u32;
  ValueType element_type = ValueType::u32;  // arrays only
  std::vector<Scalar> items;                // a scalar's one item, or the array's elements
};

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // ggml's order: ne[0] is the row length
  TensorType type = TensorType::F32;
  uint64_t offset = 0;       // from the data section
  uint64_t bytes = 0;
  std::span<const std::byte> data;  // inside the map
  int part = 0;                      // the split part that holds it (0: the first file)
  uint64_t elements() const;
  uint64_t rows() const { return elements() / ne[0]; }
};

class GgufFile {
 public:
  explicit GgufFile(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const;
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // where the data section starts in the file

  // Metadata in file order, and by key.
  const std::vector<std::pair<std::string, Value>>& metadata() const { return metadata_; }
  const Value* find(const std::string& key) const;
  // Typed reads; nullopt when the key is absent; a one-line error naming the file and key when it
  // holds another type (any integer type reads as an integer when its value fits).
  std::optional<std::string> string(const std::string& key) const;
  std::optional<int64_t> integer(const std::string& key) const;
  std::optional<double> number(const std::string& key) const;  // floats and integers
  std::optional<bool> boolean(const std::string& key) const;
  std::optional<std::vector<std::string>> strings(const std::string& key) const;
  std::optional<std::vector<double>> numbers(const std::string& key) const;
  std::optional<std::vector<int64_t>> integers(const std::string& key) const;

  // Tensors in file order, and by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* tensor(const std::string& name) const;

  const MappedFile& mapped() const { return *file_; }  // the first part's map
  // The parts of a split set after the first (empty for a single file).
  const std::vector<std::unique_ptr<GgufFile>>& other_parts() const { return parts_; }
  // Lets the kernel drop the pages holding tensor t (in whichever part), or every part's pages.
  void release_pages(const TensorInfo& t) const;
  void release_all_pages() const;

 private:
  struct AsPart {};
  GgufFile(const std::string& path, AsPart);  // one part of a split set: its own tensors only
  // The other parts of a split set whose first file this is (split.count > 1), their tensors added.
  void open_other_parts();
  [[noreturn]] void fail(const std::string& what) const;
  const Value& typed(const std::string& key, const Value& value, bool array) const;

  std::unique_ptr<MappedFile> file_;
  uint32_t version_ = 0, alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> metadata_;
  std::map<std::string, size_t, std::less<>> metadata_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
  std::vector<std::unique_ptr<GgufFile>> parts_;

  friend class HeaderReader;
};

// A name or value from a file, fit for a one-line message: control bytes as \xHH, cut at 120 bytes.
std::string printable(std::string_view text);

// Whether `path` names the first of llama.cpp's split files ("NAME-00001-of-00003.gguf"), and then
// every part's path in order.
std::optional<std::vector<std::string>> split_parts(const std::string& path);

}  // namespace gguf

}  // namespace tpcli::formats
