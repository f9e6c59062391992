// safetensors: a hand-made file (bytes written out from the format's spec) parses; what we write
// has the spec's layout and reads back; corrupt headers are one-line errors.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "formats/dtype.h"
#include "formats/safetensors.h"
#include "model/random_init.h"

using namespace tpcli::model;
using namespace tpcli::formats;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("tpcli_test_st_" + std::to_string(::getpid()) + "_" + name)).string();
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &n, 8);
  return s;
}

std::string floats(std::initializer_list<float> values) {
  std::string s;
  for (float v : values) s.append(reinterpret_cast<const char*>(&v), 4);
  return s;
}

// A file as the Python safetensors library lays it out: header, then data in offset order.
std::string hand_made_file() {
  const std::string header =
      R"({"b":{"dtype":"F32","shape":[3],"data_offsets":[16,28]},)"
      R"( "__metadata__" : {"note":"tab\there \"q\" \u00e9"},)"
      R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  return le64(header.size()) + header + floats({1, 2, 3, 4}) + floats({-1.5f, 0.25f, 1e30f});
}

LlamaConfig small_config() {
  LlamaConfig c{.dim = 16, .hidden_dim = 24, .n_layers = 2, .n_heads = 4, .n_kv_heads = 1, .vocab_size = 11,
      .seq_len = 8, .shared_classifier = false, .norm_eps = 1e-6f, .rope_theta = 500000.0f};
  return c;
}

}  // namespace

TEST_CASE("safetensors: a hand-made file parses (order, offsets, escapes)", "[safetensors]") {
  const std::string path = temp_path("hand.safetensors");
  write_bytes(path, hand_made_file());
  SafetensorsFile f(path);
  CHECK(f.names() == std::vector<std::string>{"a", "b"});
  CHECK(f.tensor("a").shape == tpcli::tensor::Shape{2, 2});
  CHECK(std::vector<float>(f.tensor("a").data.begin(), f.tensor("a").data.end()) == std::vector<float>{1, 2, 3, 4});
  CHECK(std::vector<float>(f.tensor("b").data.begin(), f.tensor("b").data.end()) ==
        std::vector<float>{-1.5f, 0.25f, 1e30f});
  CHECK(f.metadata().at("note") == "tab\there \"q\" \xC3\xA9");
  CHECK_FALSE(f.has_model_config());
  CHECK_THROWS_WITH(f.config(), Catch::Contains("no model config"));
  CHECK_THROWS_AS(f.tensor("c"), std::out_of_range);
  std::filesystem::remove(path);
}

TEST_CASE("safetensors: written files follow the spec's layout and read back", "[safetensors]") {
  const std::string path = temp_path("written.safetensors");
  const std::vector<float> a{1, 2, 3, 4, 5, 6};
  const std::vector<float> b{7};
  write_safetensors(path, {{"x.y", {2, 3}, a}, {"scalar", {}, b}}, {{"k", "v\"\n"}});
  const std::string bytes = read_bytes(path);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  CHECK((8 + n) % 8 == 0);  // data aligned
  CHECK(bytes.size() == 8 + n + 7 * 4);
  const std::string header = bytes.substr(8, n);
  CHECK(header.find(R"("x.y":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})") != std::string::npos);
  CHECK(header.find(R"("scalar":{"dtype":"F32","shape":[],"data_offsets":[24,28]})") != std::string::npos);
  CHECK(header.find(R"("__metadata__":{"k":"v\"\n"})") != std::string::npos);
  float first;
  std::memcpy(&first, bytes.data() + 8 + n, 4);
  CHECK(first == 1.0f);

  SafetensorsFile f(path);
  CHECK(f.metadata().at("k") == "v\"\n");
  CHECK(f.tensor("scalar").data[0] == 7.0f);
  CHECK(f.tensor("x.y").data[5] == 6.0f);
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
  CHECK_THROWS_AS(write_safetensors(path, {{"a", {3}, a}}, {}), std::invalid_argument);  // 6 values for [3]
  CHECK_THROWS_AS(write_safetensors(path, {{"a", {1}, b}, {"a", {1}, b}}, {}), std::invalid_argument);
  std::filesystem::remove(path);
}

// mxfp8 scales are U8: 3 rows of one group, 3 bytes, before F32 and U32 tensors in the order given.
// The file keeps every tensor aligned to its element size (wider dtypes first, no gaps), so it
// reads back, each tensor as written.
TEST_CASE("safetensors: tensors of mixed widths are written aligned, whatever order they come in", "[safetensors]") {
  const std::string path = temp_path("mixed.safetensors");
  const std::vector<uint8_t> scales{125, 126, 127};
  const std::vector<uint16_t> halves{0x3f80, 0x4000, 0x4040};
  const std::vector<float> norm{1.5f, -2.0f};
  const std::vector<uint32_t> words{0x87654321u, 0xdeadbeefu, 7u};
  write_stored_safetensors(path,
                           {{"w.scales", {DType::U8, {3, 1}, scales.data()}},
                            {"h", {DType::BF16, {3}, halves.data()}},
                            {"norm", {DType::F32, {2}, norm.data()}},
                            {"w", {DType::U32, {3, 1}, words.data()}}},
                           {});
  const SafetensorsFile f(path);
  auto bytes_of = [&](const std::string& name, size_t n) {
    const StoredTensor t = *f.stored(name);
    CHECK(reinterpret_cast<uintptr_t>(t.data) % dtype_bytes(t.dtype) == 0);
    return std::string(static_cast<const char*>(t.data), n);
  };
  CHECK(bytes_of("w.scales", 3) == std::string(reinterpret_cast<const char*>(scales.data()), 3));
  CHECK(bytes_of("h", 6) == std::string(reinterpret_cast<const char*>(halves.data()), 6));
  CHECK(bytes_of("w", 12) == std::string(reinterpret_cast<const char*>(words.data()), 12));
  CHECK(f.get("norm")[1] == -2.0f);
  const std::string file = read_bytes(path);
  uint64_t n;
  std::memcpy(&n, file.data(), 8);
  CHECK(file.size() == 8 + n + 12 + 8 + 6 + 3);  // no padding between tensors
  std::filesystem::remove(path);
}

TEST_CASE("safetensors: a model with its config in the metadata round-trips", "[safetensors]") {
  const LlamaConfig c = small_config();
  const TensorWeights w = random_weights(c, 3);
  const std::string path = temp_path("model.safetensors");
  write_safetensors(path, w, {{"tokenizer", "tok512.bin"}, {"train.step", "12"}});
  SafetensorsFile f(path);
  REQUIRE(f.has_model_config());
  const LlamaConfig& r = f.config();
  CHECK(r.dim == c.dim);
  CHECK(r.hidden_dim == c.hidden_dim);
  CHECK(r.n_layers == c.n_layers);
  CHECK(r.n_heads == c.n_heads);
  CHECK(r.n_kv_heads == c.n_kv_heads);
  CHECK(r.vocab_size == c.vocab_size);
  CHECK(r.seq_len == c.seq_len);
  CHECK(r.shared_classifier == c.shared_classifier);
  CHECK(r.norm_eps == c.norm_eps);
  CHECK(r.rope_theta == c.rope_theta);
  CHECK_FALSE(r.capacity_factor.has_value());
  CHECK(f.metadata().at("tokenizer") == "tok512.bin");
  CHECK(f.metadata().at("train.step") == "12");
  for (const auto& p : llama_parameters(c)) {
    INFO(p.name);
    auto x = w.get(p.name), y = f.get(p.name);
    REQUIRE(x.size() == y.size());
    CHECK(std::memcmp(x.data(), y.data(), x.size_bytes()) == 0);
  }
  std::filesystem::remove(path);
}

TEST_CASE("safetensors: MoE config fields survive the metadata", "[safetensors]") {
  LlamaConfig c = small_config();
  c.n_experts = 4;
  c.top_k = 2;
  c.expert_hidden_dim = 12;
  c.moe_aux_loss = 0.01f;
  c.capacity_factor = 1.25f;
  Metadata m;
  config_to_metadata(c, m);
  const LlamaConfig r = config_from_metadata(m, "test");
  CHECK(r.n_experts == 4);
  CHECK(r.top_k == 2);
  CHECK(r.expert_hidden_dim == 12);
  CHECK(r.moe_aux_loss == 0.01f);
  REQUIRE(r.capacity_factor.has_value());
  CHECK(*r.capacity_factor == 1.25f);
  m["model.n_heads"] = "five";
  CHECK_THROWS_WITH(config_from_metadata(m, "ckpt.safetensors"), Catch::Contains("ckpt.safetensors: metadata model.n_heads"));
  m["model.n_heads"] = "3";
  CHECK_THROWS_WITH(config_from_metadata(m, "ckpt.safetensors"), Catch::Contains("does not divide"));
  m.erase("model.dim");
  CHECK_THROWS_WITH(config_from_metadata(m, "ckpt.safetensors"), Catch::Contains("'model.dim' is missing"));
}

TEST_CASE("safetensors: corrupt files are one-line errors naming the file", "[safetensors]") {
  const std::string path = temp_path("corrupt.safetensors");
  const std::string good = hand_made_file();
  uint64_t n;
  std::memcpy(&n, good.data(), 8);
  const std::string header = good.substr(8, n), data = good.substr(8 + n);
  auto error_of = [&](const std::string& bytes) -> std::string {
    write_bytes(path, bytes);
    try {
      SafetensorsFile f(path);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "(no error)";
  };
  auto with_header = [&](const std::string& h) { return le64(h.size()) + h + data; };
  const std::vector<std::pair<std::string, std::string>> cases{
      {"empty file", ""},
      {"short length", "abc"},
      {"length beyond the file", le64(1u << 20) + header + data},
      {"huge length", le64(~0ull) + header},
      {"not JSON", with_header("hello world")},
      {"unterminated object", with_header(R"({"a":{"dtype":"F32")")},
      {"trailing garbage", with_header(header + "x")},
      {"bad dtype", with_header(R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})")},
      {"offsets past the data", with_header(R"({"a":{"dtype":"F32","shape":[100],"data_offsets":[0,400]}})")},
      {"offsets vs shape", with_header(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})")},
      {"negative dim", with_header(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})")},
      {"reversed offsets", with_header(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})")},
      {"metadata not strings", with_header(R"({"__metadata__":{"k":1}})")},
      // A newline in a name from the header stays escaped: the error keeps to one line.
      {"newline in a tensor name", with_header(R"({"a\nb":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})")},
      {"newline in a metadata key", with_header(R"({"__metadata__":{"k\nx":1}})")},
      {"deep nesting", with_header(R"({"a":)" + std::string(100, '[') + std::string(100, ']') + "}")},
      {"truncated data", good.substr(0, good.size() - 4)},
      // Regression (fuzz_safetensors): nlohmann throws out_of_range, not parse_error, for this.
      {"number too large", with_header(R"({"a":{"dtype":"F32","shape":[22e2464],"data_offsets":[0,4]}})")},
  };
  for (const auto& [what, bytes] : cases) {
    INFO(what);
    const std::string msg = error_of(bytes);
    INFO(msg);
    CHECK(msg.rfind(path, 0) == 0);
    CHECK(msg.find('\n') == std::string::npos);
  }
  // A model config whose tensors do not match it.
  Metadata m;
  config_to_metadata(small_config(), m);
  write_safetensors(path, {{"tok_embeddings", {2}, std::vector<float>{1, 2}}}, m);
  CHECK_THROWS_WITH(SafetensorsFile(path), Catch::Contains("tok_embeddings"));
  std::filesystem::remove(path);
}

TEST_CASE("safetensors: tensors whose data_offsets overlap are refused, naming both", "[safetensors]") {
  const std::string path = temp_path("overlap.safetensors");
  // "b" starts inside "a": each would alias the other's bytes. Listed out of order on purpose.
  std::string header =
      R"({"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  header.resize((header.size() + 7) / 8 * 8, ' ');  // the data 8-byte aligned, as the spec pads it
  write_bytes(path, le64(header.size()) + header + floats({1, 2, 3, 4, 5, 6}));
  std::string msg = "(no error)";
  try {
    SafetensorsFile f(path);
  } catch (const std::runtime_error& e) {
    msg = e.what();
  }
  INFO(msg);
  CHECK(msg.rfind(path + ": ", 0) == 0);
  CHECK(msg.find(R"("a" (data_offsets [0, 16]))") != std::string::npos);
  CHECK(msg.find(R"("b" ([8, 24]))") != std::string::npos);
  CHECK(msg.find("overlap") != std::string::npos);
  std::filesystem::remove(path);
}

TEST_CASE("safetensors: F16 and BF16 by their bit patterns, round to nearest even, read back as stored and as f32", "[safetensors]") {
  const std::vector<uint16_t> f16_bits{0x3C00, 0xC000, 0x0001, 0x7C00, 0x3555};
  const std::vector<float> f16_values{1.0f, -2.0f, 0x1p-24f, INFINITY, 0.333251953125f};
  std::vector<float> out(f16_bits.size());
  to_f32(out.data(), f16_bits.data(), DType::F16, 5);
  CHECK(out == f16_values);
  // bf16: the top half of the f32; halfway cases go to the even neighbour.
  const std::vector<float> f32s{1.0f, 1.00390625f /* 0x3F808000 */, 1.01171875f /* 0x3F818000 */, -3.5f};
  std::vector<uint16_t> bf(4), h(4);
  from_f32(bf.data(), f32s.data(), DType::BF16, 4);
  CHECK(bf == std::vector<uint16_t>{0x3F80, 0x3F80, 0x3F82, 0xC060});
  from_f32(h.data(), f32s.data(), DType::F16, 4);
  CHECK(h[0] == 0x3C00);
  CHECK(h[3] == 0xC300);

  const std::string path = temp_path("half.safetensors");
  write_stored_safetensors(path, {{"h", {DType::F16, {5}, f16_bits.data()}}, {"b", {DType::BF16, {2, 2}, bf.data()}}},
                           {{"format", "pt"}});
  SafetensorsFile f(path);
  REQUIRE(f.stored("h").has_value());
  CHECK(f.stored("h")->dtype == DType::F16);
  CHECK(std::memcmp(f.stored("b")->data, bf.data(), 8) == 0);
  CHECK(std::vector<float>(f.get("h").begin(), f.get("h").end()) == f16_values);
  CHECK(std::vector<float>(f.get("b").begin(), f.get("b").end()) == std::vector<float>{1.0f, 1.0f, 1.015625f, -3.5f});
  CHECK(f.get("b").data() == f.get("b").data());  // converted once, kept
  CHECK_THROWS_WITH(f.tensor("b"), Catch::Contains(path) && Catch::Contains("BF16"));
  std::filesystem::remove(path);
}
