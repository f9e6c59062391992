// Seed corpora for the fuzz targets, made at run time (make fuzz) from the real files in
// ../shared/data (linked, never copied into the repo) and from small models written by tpcli's own
// writers, so each target starts from inputs that parse:
//   OUT/llama2c_checkpoint   stories260K.bin (linked); a tiny model written by write_llama2c
//   OUT/llama2c_tokenizer    tok512.bin, tokenizer.bin (linked)
//   OUT/safetensors          stories260K as a tpcli checkpoint; a tiny one with training metadata
//   OUT/run_config           the repo's configs, their relative paths made absolute
//   OUT/zmq_wire             a HELLO; a DATA chunk header with its payload
//   OUT/token_shard          a version 1 (uint16) and a version 7 (uint32) shard by write_token_shard
//   OUT/hf_tokenizer         the tokenizer.json files of hf-tokenizers/, cut to their first ids
//                            (a 9 MB file is past the fuzzer's max_len): every stage kept
//   OUT/hf_config            config.json NUL generation_config.json NUL tokenizer_config.json:
//                            a tiny model's as `tpcli export --to hf` writes them with each
//                            hf-tokenizers/ chat template, and a Llama 3.2-style config
//   OUT/api_request          OpenAI chat and completion bodies, valid (every field serve reads)
//                            and not (unknown fields, wrong types, deep nesting, huge numbers)
//   OUT/chat_template        the published chat templates of reference/chat-templates (linked),
//                            and a few Jinja sources that stress the sandbox
//   OUT/grammar              GBNF grammars (first byte even) and JSON schemas (first byte odd)
//   OUT/gguf                 llama.cpp's GGUF files of reference/gguf (linked; the fuzzer keeps their headers)
// usage: fuzz_seeds OUT SHARED_DIR SOURCE_DIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "distributed/zmq/zmq_wire.h"
#include <nlohmann/json.hpp>

#include "formats/hf_model.h"
#include "formats/llama2c.h"
#include "formats/safetensors.h"
#include "model/random_init.h"
#include "text/hf_tokenizer.h"
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

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A tokenizer.json cut to ids < max_id: the vocabulary, the merges between kept tokens, and the
// first added tokens; normalizer, pre-tokenizer and decoder as they are.
nlohmann::json cut_tokenizer(nlohmann::json j, int max_id) {
  nlohmann::json& model = j["model"];
  nlohmann::json vocab = nlohmann::json::object();
  for (const auto& [token, id] : model["vocab"].items())
    if (id.get<int>() < max_id) vocab[token] = id;
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& m : model["merges"]) {
    std::string a, b;
    if (m.is_array()) {
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    } else {
      const std::string pair = m.get<std::string>();
      const size_t space = pair.find(' ', 1);
      a = pair.substr(0, space), b = pair.substr(space + 1);
    }
    if (vocab.contains(a) && vocab.contains(b) && vocab.contains(a + b)) merges.push_back(m);
  }
  model["vocab"] = vocab;
  model["merges"] = merges;
  nlohmann::json added = nlohmann::json::array();
  for (size_t i = 0; i < j["added_tokens"].size() && i < 6; ++i) added.push_back(j["added_tokens"][i]);
  j["added_tokens"] = added;
  return j;
}

void hf_tokenizer_seeds(const fs::path& shared, const fs::path& out) {
  for (const char* name : {"mistral", "llama3", "qwen3"}) {
    const fs::path path = shared / "data/hf-tokenizers" / name / "tokenizer.json";
    if (!fs::exists(path)) {
      std::fprintf(stderr, "fuzz_seeds: %s is absent: no seed from it\n", path.c_str());
      continue;
    }
    const fs::path seed = out / (std::string(name) + ".json");
    std::ofstream(seed) << cut_tokenizer(nlohmann::json::parse(read_file(path)), 400).dump();
    text::HfTokenizer check(seed.string(), {});  // a seed that does not load is a bug here
  }
  // Nested Sequences: 3 deep (loads) and 70 deep (past the builders' bound of 64).
  for (int depth : {3, 70}) {
    nlohmann::json decoder = {{"type", "Fuse"}}, normalizer = {{"type", "Lowercase"}}, pre = {{"type", "Digits"}};
    for (int i = 0; i < depth; ++i) {
      decoder = {{"type", "Sequence"}, {"decoders", nlohmann::json::array({decoder})}};
      normalizer = {{"type", "Sequence"}, {"normalizers", nlohmann::json::array({normalizer})}};
      pre = {{"type", "Sequence"}, {"pretokenizers", nlohmann::json::array({pre})}};
    }
    const nlohmann::json model = {
        {"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", nlohmann::json::array({"a b"})}};
    const nlohmann::json file = {
        {"model", model}, {"normalizer", normalizer}, {"pre_tokenizer", pre}, {"decoder", decoder}};
    std::ofstream(out / ("nested-" + std::to_string(depth) + ".json")) << file.dump();
  }
}

void hf_config_seeds(const fs::path& shared, const fs::path& out, const model::TensorWeights& tiny) {
  const fs::path dir = out / "tiny-model";
  formats::write_hf_model(dir.string(), tiny, formats::HfExportOptions{.dtype = model::DType::F32, .shards = 2});
  const std::string config = read_file(dir / "config.json"), generation = read_file(dir / "generation_config.json");
  const std::string index = read_file(dir / "model.safetensors.index.json");
  fs::remove_all(dir);
  std::ofstream(out / "tiny.bin") << config << '\0' << generation;
  std::ofstream(out / "tiny-index.bin") << config << '\0' << generation << '\0' << "{}" << '\0' << index;
  for (const char* name : {"mistral", "llama3", "qwen3"}) {
    const fs::path path = shared / "data/hf-tokenizers" / name / "tokenizer_config.json";
    if (!fs::exists(path)) continue;
    nlohmann::json full = nlohmann::json::parse(read_file(path)), kept = nlohmann::json::object();
    for (const char* key : {"bos_token", "eos_token", "clean_up_tokenization_spaces", "chat_template"})
      if (full.contains(key)) kept[key] = full[key];
    std::ofstream(out / (std::string("tiny-") + name + ".bin")) << config << '\0' << generation << '\0' << kept.dump();
  }
  std::ofstream(out / "llama32.json") << R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "vocab_size": 300, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192, "rope_type": "llama3"}, "tie_word_embeddings": true,
    "bos_token_id": 128, "eos_token_id": [129, 130], "torch_dtype": "bfloat16",
    "quantization": {"group_size": 64, "bits": 4}})";
}

void api_request_seeds(const fs::path& out) {
  const std::pair<const char*, std::string> bodies[] = {
      {"chat.json", R"({"model": "tiny", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        "max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "seed": 7, "stop": ["x", "yz"]})"},
      {"chat-stream.json", R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "stream": true,
        "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 3, "max_completion_tokens": 4,
        "n": 1, "user": "u", "frequency_penalty": 0, "tools": [], "tool_choice": "auto", "response_format": {"type": "text"}})"},
      {"completion.json", R"({"model": "tiny", "prompt": "Once upon", "max_tokens": 8, "logprobs": 2, "echo": false, "suffix": "",
        "best_of": 1, "ignore_eos": true, "stop": "."})"},
      {"completion-ids.json", R"({"prompt": [1, 2, 3, 256], "max_tokens": 3, "seed": -5})"},
      {"completion-batch.json", R"({"prompt": ["one"], "stream": true, "stream_options": null})"},
      {"unknown.json", R"({"prompt": "x", "frobnicate": 1})"},
      {"types.json", R"({"messages": "hi", "max_tokens": "5", "temperature": "hot", "stop": [1, 2]})"},
      {"huge-numbers.json", R"({"prompt": "x", "max_tokens": 123456789012345678901234567890, "temperature": 1e999, "seed": 18446744073709551616})"},
      {"deep.json", std::string(40, '[') + std::string(40, ']')},
      {"utf8.json", "{\"prompt\": \"caf\xc3\xa9 \xff\xfe\", \"stop\": \"\\ud800\"}"},
      {"truncated.json", R"({"messages": [{"role": "user", "content": "hi)"},
  };
  for (const auto& [name, body] : bodies) std::ofstream(out / name, std::ios::binary) << body;
}

void chat_template_seeds(const fs::path& shared, const fs::path& out) {
  const fs::path templates = shared / "reference/chat-templates/templates";
  if (fs::exists(templates))
    for (const auto& entry : fs::directory_iterator(templates))
      if (entry.path().extension() == ".jinja") link_if_present(entry.path(), out);
  const std::pair<const char*, std::string> sources[] = {
      {"recursion.jinja", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"},
      {"doubling.jinja", "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"},
      {"loops.jinja", "{% for i in range(1000) %}{% for j in range(1000) %}{{ loop.cycle('a', 'b') }}{% endfor %}{% endfor %}"},
      {"everything.jinja",
       "{%- set ns = namespace(n=0) -%}{% for m in messages if m.role != 'tool' %}{{ loop.index }}{{ m.content|string|trim }}"
       "{% set ns.n = ns.n + 1 %}{% if loop.last %}{{ ns.n }}{% endif %}{% endfor %}{{ tools|tojson(indent=2) }}"
       "{{ '%s-%05.1f' % ('x', 2.5) }}{{ '{}:{:>4}'.format('a', 'b') }}{{ [3, 1]|sort|join(',') }}"
       "{% macro m(a, b=2) %}{{ caller(a) if caller else a }}{% endmacro %}{% call(x) m(1) %}<{{ x }}>{% endcall %}"
       "{% filter upper %}{{ messages[-1].content[0].text[::-1] }}{% endfilter %}{% raw %}{{ }}{% endraw %}"},
      {"with-variables.jinja", std::string("{{ extra }}{{ messages|length }}") + '\0' + R"({"extra": [1, {"a": null}]})"},
  };
  for (const auto& [name, source] : sources) std::ofstream(out / name, std::ios::binary) << source;
}

// First byte '0' (even): GBNF; '1' or '3' (odd; '3' with a rule prefix): a JSON schema.
void grammar_seeds(const fs::path& out) {
  const std::pair<const char*, std::string> inputs[] = {
      {"json.gbnf", "0root ::= object\nvalue ::= object | array | string | [0-9]+ | \"true\"\n"
                    "object ::= \"{\" ws (string \":\" ws value (\",\" ws string \":\" ws value)*)? \"}\" ws\n"
                    "array ::= \"[\" ws (value (\",\" ws value)*)? \"]\" ws\n"
                    "string ::= \"\\\"\" ([^\"\\\\] | \"\\\\\" [\"nt])* \"\\\"\" ws\nws ::= [ \\t\\n]{0,4}\n"},
      {"repeat.gbnf", "0root ::= (\"a\"{2,5} | [\\u00e0-\\u00ff]+ | x?)* \"!\" # comment\nx ::= \"\\x41\" .\n"},
      {"bad.gbnf", "0root ::= foo\nfoo ::= foo \"+\" | \"1\"\n"},
      {"schema.json", R"(1{"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}, "n": {"type": "integer", "minimum": -3, "maximum": 70}, "tags": {"type": "array", "items": {"enum": ["a", 1, null]}, "maxItems": 3}, "d": {"type": "string", "format": "date"}}, "required": ["name"]})"},
      {"refs.json", R"(3{"$defs": {"node": {"type": "object", "properties": {"v": {"type": "number", "minimum": 0, "exclusiveMaximum": 10}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}, "$ref": "#/$defs/node"})"},
      {"pattern.json", R"(1{"anyOf": [{"type": "string", "pattern": "^[a-z]{2,4}(-\d+)?$"}, {"type": ["null", "boolean"]}]})"},
  };
  for (const auto& [name, text] : inputs) std::ofstream(out / name, std::ios::binary) << text;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: fuzz_seeds OUT SHARED_DIR SOURCE_DIR\n");
    return 2;
  }
  const fs::path out = argv[1], shared = argv[2], source_dir = argv[3];
  for (const char* target : {"llama2c_checkpoint", "llama2c_tokenizer", "safetensors", "run_config", "zmq_wire",
                             "token_shard", "hf_tokenizer", "hf_config", "api_request", "chat_template", "grammar", "gguf"})
    fs::create_directories(out / target);

  const model::TensorWeights tiny = model::random_weights(tiny_config(), 1);
  link_if_present(shared / "data/stories260K.bin", out / "llama2c_checkpoint");
  formats::write_llama2c((out / "llama2c_checkpoint/tiny.bin").string(), tiny);

  // GGUF files past -max_len are cut by the fuzzer: their headers (metadata, tensor table) remain.
  for (const char* name : {"stories260K-q4_k_m.gguf", "rand256-q4_k_m.gguf", "hf-qwen2-q8_0.gguf", "hf-phi3-q4_k_m.gguf"})
    link_if_present(shared / "reference/gguf" / name, out / "gguf");
  link_if_present(shared / "data/tok512.bin", out / "llama2c_tokenizer");
  link_if_present(shared / "data/tokenizer.bin", out / "llama2c_tokenizer");

  if (fs::exists(shared / "data/stories260K.bin")) {
    formats::Metadata meta;
    meta["tokenizer"] = (shared / "data/tok512.bin").string();
    formats::write_safetensors((out / "safetensors/stories260K.safetensors").string(),
                             formats::Llama2cFile((shared / "data/stories260K.bin").string()), meta);
  }
  formats::Metadata meta;
  train::tokenizer_to_metadata(train::TextTokenizer::chars_from_vocab("\nabcdefghijk"), meta);
  meta["train.step"] = "5";
  meta["train.seed"] = "1337";
  formats::write_safetensors((out / "safetensors/tiny_trained.safetensors").string(), tiny, meta);

  run_config_seeds(source_dir, shared, out / "run_config");
  zmq_seeds(out / "zmq_wire");
  const std::vector<int> tokens = {1, 2, 3, 500, 0, 65535};
  train::write_token_shard((out / "token_shard/u16.bin").string(), tokens, 65536);
  train::write_token_shard((out / "token_shard/u32.bin").string(), tokens, 128256);
  hf_tokenizer_seeds(shared, out / "hf_tokenizer");
  hf_config_seeds(shared, out / "hf_config", tiny);
  api_request_seeds(out / "api_request");
  chat_template_seeds(shared, out / "chat_template");
  grammar_seeds(out / "grammar");
  return 0;
}
