// formats/gguf_file.h against files llama.cpp wrote (../shared/reference/gguf/): every metadata key,
// type and value, and every tensor's type, shape, file offset and size, as gguf-py read them into
// metadata.tsv and tensors.tsv. Then hostile files made from a real one: each truncation, and each
// field bent to an absurd value, is a one-line error naming the file, never a crash.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "formats/gguf_file.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"

using namespace tpcli::formats::gguf;
using tpcli::testing::shared_path;
using nlohmann::json;

namespace {

std::vector<std::vector<std::string>> read_tsv(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::vector<std::string>> rows;
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::vector<std::string> fields;
    std::stringstream s(line);
    for (std::string field; std::getline(s, field, '\t');) fields.push_back(field);
    rows.push_back(fields);
  }
  return rows;
}

// One stored scalar against gguf-py's printed value.
void check_scalar(const Scalar& stored, ValueType type, const json& expected) {
  INFO("expected " << expected.dump());
  switch (type) {
    case ValueType::string: CHECK(std::get<std::string>(stored) == expected.get<std::string>()); break;
    case ValueType::f32: CHECK(static_cast<float>(std::get<double>(stored)) == expected.get<float>()); break;
    case ValueType::f64: CHECK(std::get<double>(stored) == expected.get<double>()); break;
    case ValueType::boolean: CHECK(std::get<bool>(stored) == expected.get<bool>()); break;
    case ValueType::i8: case ValueType::i16: case ValueType::i32: case ValueType::i64:
      CHECK(std::get<int64_t>(stored) == expected.get<int64_t>());
      break;
    default: CHECK(std::get<uint64_t>(stored) == expected.get<uint64_t>());
  }
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The file's error for `bytes`: "" when it reads, else its message (which must be one line naming it).
std::string error_of(const tpcli::testing::TempDir& tmp, const std::string& bytes) {
  const std::string path = tmp.write("hostile.gguf", bytes);
  try {
    GgufFile f(path);
    return "";
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK(message.rfind(path + ": ", 0) == 0);
    CHECK(message.find('\n') == std::string::npos);
    return message;
  }
}

template <typename T>
void put(std::string& bytes, size_t at, T value) {
  std::memcpy(bytes.data() + at, &value, sizeof value);
}

}  // namespace

TEST_CASE("gguf: every metadata value and tensor of llama.cpp's files reads as gguf-py read it") {
  TPCLI_REQUIRE_SHARED("reference/gguf/metadata.tsv");
  std::map<std::string, std::vector<std::vector<std::string>>> metadata, tensors;
  for (auto& row : read_tsv(shared_path("reference/gguf/metadata.tsv"))) metadata[row[0]].push_back(row);
  for (auto& row : read_tsv(shared_path("reference/gguf/tensors.tsv"))) tensors[row[0]].push_back(row);
  REQUIRE(metadata.size() == 32);
  std::map<std::string, int> types_seen;
  for (const auto& [name, rows] : metadata) {
    INFO(name);
    const GgufFile f(shared_path("reference/gguf/" + name));
    size_t keys = 0;
    for (const auto& row : rows) {
      INFO(row[1] << " " << row[2] << " " << row[3]);
      const json expected = json::parse(row[3]);
      if (row[1] == "GGUF.version") CHECK(f.version() == expected.get<uint32_t>());
      else if (row[1] == "GGUF.tensor_count") CHECK(f.tensors().size() == expected.get<size_t>());
      else if (row[1] == "GGUF.kv_count") CHECK(f.metadata().size() == expected.get<size_t>());
      else {
        ++keys;
        const Value* v = f.find(row[1]);
        REQUIRE(v != nullptr);
        CHECK(value_type_name(v->type) == row[2]);
        if (v->type != ValueType::array) {
          check_scalar(v->items.front(), v->type, expected);
          continue;
        }
        CHECK(value_type_name(v->element_type) == expected["type"].get<std::string>());
        REQUIRE(v->items.size() == expected["count"].get<size_t>());
        for (size_t i = 0; i < expected["first"].size(); ++i) check_scalar(v->items[i], v->element_type, expected["first"][i]);
      }
    }
    CHECK(keys == f.metadata().size());
    const auto& tensor_rows = tensors.at(name);
    CHECK(tensor_rows.size() == f.tensors().size());
    for (const auto& row : tensor_rows) {
      INFO(row[1]);
      const TensorInfo* t = f.tensor(row[1]);
      REQUIRE(t != nullptr);
      CHECK(tpcli::tensor::ggml_traits(t->type).name == row[2]);
      std::string shape;
      for (uint64_t d : t->ne) {
        if (!shape.empty()) shape += ',';
        shape += std::to_string(d);
      }
      CHECK(shape == row[3]);
      CHECK(f.data_offset() + t->offset == std::stoull(row[4]));
      CHECK(t->bytes == std::stoull(row[5]));
      CHECK(t->data.size() == t->bytes);
      ++types_seen[row[2]];
    }
  }
  // Block sizes of every type the reference holds came out right (n_bytes above).
  for (const char* type : {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"})
    CHECK(types_seen[type] > 0);
  // Typed reads.
  const GgufFile f(shared_path("reference/gguf/stories260K-q4_k_m.gguf"));
  CHECK(f.string("general.architecture") == "llama");
  CHECK(f.integer("llama.block_count") == 5);
  CHECK(std::abs(*f.number("llama.attention.layer_norm_rms_epsilon") - 1e-5) < 1e-10);
  CHECK(f.strings("tokenizer.ggml.tokens")->at(2) == "</s>");
  CHECK(f.integers("tokenizer.ggml.token_type")->size() == 512);
  CHECK_FALSE(f.string("no.such.key").has_value());
  CHECK_THROWS_WITH(f.string("llama.block_count"), Catch::Contains("'llama.block_count' is UINT32, not STRING"));
  CHECK_THROWS_WITH(f.integers("tokenizer.ggml.tokens"), Catch::Contains("an array of STRING, not of integers"));
}

TEST_CASE("gguf: truncated and bent files are one-line errors naming the file and what is wrong") {
  TPCLI_REQUIRE_SHARED("reference/gguf/stories260K-q4_k_m.gguf");
  const std::string good = read_bytes(shared_path("reference/gguf/stories260K-q4_k_m.gguf"));
  const GgufFile reference(shared_path("reference/gguf/stories260K-q4_k_m.gguf"));
  const tpcli::testing::TempDir tmp;
  REQUIRE(error_of(tmp, good).empty());

  // Every cut inside the header, and some inside the data.
  const size_t header = reference.data_offset();
  for (size_t cut = 0; cut < header; cut += cut < 64 ? 1 : 97) CHECK_FALSE(error_of(tmp, good.substr(0, cut)).empty());
  uint64_t data_end = 0;
  for (const TensorInfo& t : reference.tensors()) data_end = std::max(data_end, reference.data_offset() + t.offset + t.bytes);
  CHECK(error_of(tmp, good.substr(0, data_end - 1)).find("beyond the end of the file") != std::string::npos);

  std::string bent = good;
  put<uint32_t>(bent, 0, 0x46554748);
  CHECK(error_of(tmp, bent).find("not a GGUF file") != std::string::npos);
  bent = good;
  put<uint32_t>(bent, 4, 1);
  CHECK(error_of(tmp, bent).find("GGUF version 1 is not supported") != std::string::npos);
  bent = good;
  put<uint64_t>(bent, 8, uint64_t{1} << 62);
  CHECK(error_of(tmp, bent).find("tensor count 4611686018427387904 exceeds") != std::string::npos);
  bent = good;
  put<uint64_t>(bent, 16, ~uint64_t{0});
  CHECK(error_of(tmp, bent).find("metadata count") != std::string::npos);
  // The first key's length (right after the counts) of 2^63.
  bent = good;
  put<uint64_t>(bent, 24, uint64_t{1} << 63);
  CHECK(error_of(tmp, bent).find("a metadata key is 9223372036854775808 bytes long") != std::string::npos);
  // The first key's value type: unknown; an array's length beyond the file.
  const uint64_t key_length = [&] { uint64_t n; std::memcpy(&n, good.data() + 24, 8); return n; }();
  const size_t type_at = 32 + key_length;
  bent = good;
  put<uint32_t>(bent, type_at, 99);
  CHECK(error_of(tmp, bent).find("has an unknown value type 99") != std::string::npos);
  bent[32] = '\n';  // a key with a control byte is named escaped: the message stays one line
  CHECK(error_of(tmp, bent).find("metadata '\\x0A") != std::string::npos);
  REQUIRE(reference.metadata().front().second.type == ValueType::array);  // tokenizer.ggml.tokens
  bent = good;
  put<uint64_t>(bent, type_at + 8, uint64_t{1} << 40);
  CHECK(error_of(tmp, bent).find("elements, more than the file can hold") != std::string::npos);
  bent = good;
  put<uint32_t>(bent, type_at + 4, static_cast<uint32_t>(ValueType::array));
  CHECK(error_of(tmp, bent).find("an array of arrays is not supported") != std::string::npos);

  // The first tensor's description: its name, dims, shape, type and offset follow the metadata.
  const std::string& first = reference.tensors().front().name;
  const size_t info = good.find(first, 24) - 8;
  REQUIRE(reference.tensors().front().ne.size() == 2);
  const size_t dims_at = info + 8 + first.size(), type_field = dims_at + 4 + 16, offset_at = type_field + 4;
  bent = good;
  put<uint32_t>(bent, dims_at, 5);
  CHECK(error_of(tmp, bent).find("has 5 dimensions") != std::string::npos);
  bent = good;
  put<uint64_t>(bent, dims_at + 4, uint64_t{1} << 62);
  CHECK(error_of(tmp, bent).find("impossible shape") != std::string::npos);
  bent = good;
  put<uint64_t>(bent, dims_at + 4, 0);
  CHECK(error_of(tmp, bent).find("impossible shape") != std::string::npos);
  bent = good;
  put<uint32_t>(bent, type_field, 77);
  CHECK(error_of(tmp, bent).find("has an unknown tensor type 77") != std::string::npos);
  bent = good;
  put<uint64_t>(bent, dims_at + 4, 40);  // Q8_0 rows of 40: not whole blocks of 32
  CHECK(error_of(tmp, bent).find("not whole blocks of 32") != std::string::npos);
  bent = good;
  put<uint64_t>(bent, offset_at, 33);
  CHECK(error_of(tmp, bent).find("is not a multiple of the alignment 32") != std::string::npos);
  bent = good;
  put<uint64_t>(bent, offset_at, ~uint64_t{0} & ~uint64_t{31});
  CHECK(error_of(tmp, bent).find("lies beyond the end of the file") != std::string::npos);
  bent = good;
  put<uint64_t>(bent, offset_at, reference.tensors()[1].offset);
  CHECK(error_of(tmp, bent).find("overlap") != std::string::npos);
}

TEST_CASE("gguf: split file names give every part in order") {
  CHECK(split_parts("/m/qwen-00001-of-00003.gguf") ==
        std::vector<std::string>{"/m/qwen-00001-of-00003.gguf", "/m/qwen-00002-of-00003.gguf", "/m/qwen-00003-of-00003.gguf"});
  CHECK_FALSE(split_parts("/m/qwen-00002-of-00003.gguf").has_value());
  CHECK_FALSE(split_parts("/m/qwen.gguf").has_value());
}
