// Seed corpora for the fuzz targets, made at run time (make fuzz) from the real files in
// ../shared/data (linked, never copied into the repo) and from small models written by tpcli's own
// writers, so each target starts from inputs that parse:
//   OUT/llama2c_checkpoint   stories260K.bin (linked); a tiny model written by write_llama2c
//   OUT/llama2c_tokenizer    tok512.bin, tokenizer.bin (linked)
//   OUT/safetensors          stories260K as a tpcli checkpoint; a tiny one with training metadata
//   OUT/run_config           the repo's configs, their relative paths made absolute
//   OUT/zmq_wire             a HELLO; a DATA chunk header with its payload
//   OUT/token_shard          a version 1 (uint16) and a version 7 (uint32) shard by write_token_shard
// usage: fuzz_seeds OUT SHARED_DIR SOURCE_DIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "dist/zmq/zmq_wire.h"
#include "model/llama2c.h"
#include "model/random_init.h"
#include "model/safetensors.h"
#include "train/checkpoint.h"
#include "train/token_shards.h"

namespace fs = std::filesystem;
using namespace tpcli;

namespace {

void link_if_present(const fs::path& target, const fs::path& dir) {
  if (!fs::exists(target)) {
    std::fprintf(stderr, "fuzz_seeds: %s is absent: no seed from it\n", target.c_str());
    return;
  }
  std::error_code ignored;
  fs::remove(dir / target.filename(), ignored);
  fs::create_symlink(fs::absolute(target), dir / target.filename());
}

model::LlamaConfig tiny_config() {
  model::LlamaConfig c;
  c.dim = 8, c.hidden_dim = 16, c.n_layers = 1, c.n_heads = 2, c.n_kv_heads = 1, c.vocab_size = 12, c.seq_len = 8;
  return c;
}

void run_config_seeds(const fs::path& source_dir, const fs::path& shared, const fs::path& out) {
  for (const auto& entry : fs::directory_iterator(source_dir / "configs")) {
    if (entry.path().extension() != ".toml") continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    // A seed is read from /proc/self/fd/N: relative paths would resolve nowhere.
    std::string s = std::regex_replace(text.str(), std::regex("\"(\\.\\./)+shared/"), "\"" + shared.string() + "/");
    s = std::regex_replace(s, std::regex("\"data/"), "\"" + (source_dir / "configs/data").string() + "/");
    s = std::regex_replace(s, std::regex("\"models/"), "\"" + (source_dir / "models").string() + "/");
    std::ofstream(out / entry.path().filename()) << s;
  }
}

void zmq_seeds(const fs::path& out) {
  dist::Hello h{1, 2, 1, 2, "0.1.0", "abc123", "def456", "ipc://@tpcli-1-2"};
  h.job = "0123456789abcdef";
  std::ofstream(out / "hello.txt") << h.encode();
  dist::WireHeader header{dist::WIRE_MAGIC, static_cast<uint32_t>(dist::WireKind::DATA), 3, 7, 1, 0, 8, 4};
  const float payload[4] = {1, 2, 3, 4};
  std::ofstream chunk(out / "data_chunk.bin", std::ios::binary);
  chunk.write(reinterpret_cast<const char*>(&header), sizeof header);
  chunk.write(reinterpret_cast<const char*>(payload), sizeof payload);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: fuzz_seeds OUT SHARED_DIR SOURCE_DIR\n");
    return 2;
  }
  const fs::path out = argv[1], shared = argv[2], source_dir = argv[3];
  for (const char* target : {"llama2c_checkpoint", "llama2c_tokenizer", "safetensors", "run_config", "zmq_wire",
                             "token_shard"})
    fs::create_directories(out / target);

  const model::TensorWeights tiny = model::random_weights(tiny_config(), 1);
  link_if_present(shared / "data/stories260K.bin", out / "llama2c_checkpoint");
  model::write_llama2c((out / "llama2c_checkpoint/tiny.bin").string(), tiny);

  link_if_present(shared / "data/tok512.bin", out / "llama2c_tokenizer");
  link_if_present(shared / "data/tokenizer.bin", out / "llama2c_tokenizer");

  if (fs::exists(shared / "data/stories260K.bin")) {
    model::Metadata meta;
    meta["tokenizer"] = (shared / "data/tok512.bin").string();
    model::write_safetensors((out / "safetensors/stories260K.safetensors").string(),
                             model::Llama2cFile((shared / "data/stories260K.bin").string()), meta);
  }
  model::Metadata meta;
  train::tokenizer_to_metadata(train::TextTokenizer::chars_from_vocab("\nabcdefghijk"), meta);
  meta["train.step"] = "5";
  meta["train.seed"] = "1337";
  model::write_safetensors((out / "safetensors/tiny_trained.safetensors").string(), tiny, meta);

  run_config_seeds(source_dir, shared, out / "run_config");
  zmq_seeds(out / "zmq_wire");
  const std::vector<int> tokens = {1, 2, 3, 500, 0, 65535};
  train::write_token_shard((out / "token_shard/u16.bin").string(), tokens, 65536);
  train::write_token_shard((out / "token_shard/u32.bin").string(), tokens, 128256);
  return 0;
}
