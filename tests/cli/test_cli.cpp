// cli/: the tpcli binary as a user meets it, run as a subprocess (TPCLI_BINARY): exit codes,
// one-line errors, help, config validation before any work, inspect.
#include <catch2/catch.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/shared_data.h"
#include "support/run_tpcli.h"
#include "support/temp_dir.h"

using tpcli::testing::TempDir;

namespace {

using Result = tpcli::testing::RunResult;

// Runs tpcli with `args` (stdin closed), capturing stdout, stderr and the exit code.
Result run(const std::vector<std::string>& args) { return tpcli::testing::run_tpcli(args); }

int line_count(const std::string& text) { return static_cast<int>(std::count(text.begin(), text.end(), '\n')); }

// "FILE:LINE:COL" of `marker` in `text`, counted from 1.
std::string where(const std::string& file, const std::string& text, const std::string& marker) {
  const size_t at = text.find(marker);
  REQUIRE(at != std::string::npos);
  const size_t line = 1 + static_cast<size_t>(std::count(text.begin(), text.begin() + static_cast<long>(at), '\n'));
  const size_t line_start = text.rfind('\n', at);
  const size_t column = line_start == std::string::npos || line == 1 ? at + 1 : at - line_start;
  return file + ":" + std::to_string(line) + ":" + std::to_string(column);
}

// 1234567 -> "1,234,567", as inspect prints counts.
std::string with_commas(long n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

const char* MODEL = "dim = 64\nhidden_dim = 172\nn_layers = 2\nn_heads = 4\nn_kv_heads = 2\nvocab_size = 65\nseq_len = 64\n";

}  // namespace

TEST_CASE("tpcli --version prints the version and exits 0") {
  const Result r = run({"--version"});
  CHECK(r.code == 0);
  CHECK(r.out == std::string("tpcli ") + TPCLI_VERSION + "\n");
  CHECK(r.err.empty());
}

TEST_CASE("tpcli --help lists every required subcommand, each with its own --help") {
  const Result r = run({"--help"});
  CHECK(r.code == 0);
  for (const char* name : {"train", "infer", "init", "export", "inspect", "launch", "bench"}) {
    INFO(name);
    CHECK(r.out.find(std::string("\n  ") + name + " ") != std::string::npos);
    const Result sub = run({name, "--help"});
    CHECK(sub.code == 0);
    CHECK(sub.out.find("Usage:") != std::string::npos);
    CHECK(sub.out.find(name) != std::string::npos);
  }
}

TEST_CASE("every subcommand of the issue is implemented and has its own help") {
  for (const char* name : {"train", "infer", "init", "export", "inspect", "launch", "bench"}) {
    INFO(name);
    const Result r = run({name, "--help"});
    CHECK(r.code == 0);
    CHECK(r.out.find(std::string("tpcli ") + name) != std::string::npos);  // "Usage: tpcli NAME ..."
    CHECK(r.out.find("not implemented") == std::string::npos);
  }
}

TEST_CASE("command-line mistakes exit 2 with CLI11's message") {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {}, {"no-such-command"}, {"inspect"}, {"inspect", "--no-such-flag", "x.toml"}, {"train"}}) {
    const Result r = run(args);
    INFO(args.size());
    CHECK(r.code == 2);
    CHECK_FALSE(r.err.empty());
    CHECK(r.out.empty());
  }
  const Result both = run({"inspect", "--devices", "2", "--mesh", "data=2", "x.toml"});
  CHECK(both.code == 2);
  CHECK(both.err.find("excludes") != std::string::npos);
}

TEST_CASE("bench collectives: bad sizes and ops are one-line errors, on either backend") {
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  for (const Case& c : std::vector<Case>{
           {{"bench", "collectives", "--sizes", "3Q"}, "size '3Q': unknown unit 'Q'"},
           {{"bench", "collectives", "--backend", "zmq", "--sizes", "x"}, "size 'x': not a number"},
           {{"bench", "collectives", "--backend", "zmq", "--ops", "all_sum,foo"}, "unknown op 'foo'"},
           {{"bench", "collectives", "--backend", "zmq", "--reps", "0"}, "--reps must be >= 1"},
           {{"bench", "collectives", "--backend", "zmq", "--devices", "1"}, "1 processes is not in [2, 16]"}}) {
    const Result r = run(c.args);
    INFO(r.err);
    CHECK(r.code == 2);
    CHECK(r.err.find(c.expect) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.out.empty());  // nothing measured
  }
}

TEST_CASE("bench busy: idle and loaded side by side for each device count, bad flags are one-line errors") {
  tpcli::testing::require_shared("data/stories260K.bin");
  const std::string model = tpcli::testing::shared_path("data/stories260K.bin");
  const Result r = run({"bench", "busy", "--model", model, "--parts", "decode", "--devices", "1,2", "--tokens", "8",
                        "--runs", "1", "--hogs", "1"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("idle s   loaded s   slowdown") != std::string::npos);
  CHECK(r.out.find("decode  1 device(s)") != std::string::npos);
  CHECK(r.out.find("decode  2 device(s)") != std::string::npos);
  CHECK(r.out.find("load average after") != std::string::npos);
  for (const auto& [args, expect] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--devices", "16"}, "--devices 16: "},
           {{"--tokens", "100000"}, "--tokens 100000 exceeds the model's seq_len 512"},
           {{"--hogs", "0"}, "must be >= 1"}}) {
    std::vector<std::string> bad{"bench", "busy", "--model", model};
    bad.insert(bad.end(), args.begin(), args.end());
    const Result e = run(bad);
    INFO(e.err);
    CHECK(e.code == 2);
    CHECK(e.err.find(expect) != std::string::npos);
    CHECK(line_count(e.err) == 1);
    CHECK(e.out.empty());  // nothing measured
  }
}

TEST_CASE("a bad config makes train and inspect exit 2 with one FILE:LINE:COL line") {
  TempDir dir;
  const std::string text = "[mesh]\naxes = { data = 2, model = 0 }\n";
  const std::string path = dir.write("bad.toml", text);
  const std::string expected = where(path, text, "0 }") + ": mesh.axes.model = 0 must be >= 1\n";
  for (const char* command : {"train", "inspect"}) {
    INFO(command);
    const Result r = run({command, path});
    CHECK(r.code == 2);
    CHECK(r.err == expected);
    CHECK(line_count(r.err) == 1);
    CHECK(r.out.empty());
  }
  const Result missing = run({"train", (dir.path() / "none.toml").string()});
  CHECK(missing.code == 2);
  CHECK(missing.err == (dir.path() / "none.toml").string() + ": no such file\n");
}

TEST_CASE("train rejects a bad config before doing anything") {
  TempDir dir;
  dir.write("corpus.txt", "to be or not to be, that is the question\n");
  dir.write("model.toml", MODEL);
  const std::string out_dir = (dir.path() / "out").string();
  const std::string good = "[model]\nconfig = \"model.toml\"\n[data]\npath = \"corpus.txt\"\n[train]\nsteps = 2\nbatch_size = 4\n"
                           "out_dir = \"" + out_dir + "\"\n";
  struct Case {
    std::string extra;  // appended to the [train] section, or flags
    std::vector<std::string> flags;
    std::string needle;  // in the one-line error
  };
  const std::vector<Case> cases = {
      {"stepz = 3\n", {}, "unknown key 'train.stepz'"},
      {"lr = \"fast\"\n", {}, "train.lr must be a number"},
      {"", {"--set", "train.batch_size=0"}, "--set train.batch_size=0: train.batch_size = 0 must be >= 1"},
      {"", {"--mesh", "data=3"}, "train.batch_size = 4 is not divisible by the data axis 'data' = 3 (mesh data=3)"},
      {"", {"--mesh", "data=2,data=2"}, "--mesh data=2,data=2: axis 'data' appears twice"},
      {"", {"--mesh", "data=0"}, "--mesh data=0: axis data = 0 must be >= 1"},
      {"", {"--set", "data.path=nowhere.txt"}, "data.path = \"nowhere.txt\": no such file"},
      {"", {"--set", "model.n_heads=3"}, "n_heads = 3 does not divide dim = 64"},
      {"", {"--set", "model.n_experts=4", "--set", "model.dense_layers=[5]"},
       "--set model.dense_layers=[5]: dense_layers: 5 is not a block in [0, n_layers), ascending"},
  };
  int n = 0;
  for (const auto& c : cases) {
    const std::string path = dir.write("run" + std::to_string(n++) + ".toml", good + c.extra);
    std::vector<std::string> args = {"train", path};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    const Result r = run(args);
    INFO(c.needle);
    CHECK(r.code == 2);
    CHECK(line_count(r.err) == 1);
    CHECK(r.err.find(c.needle) != std::string::npos);
    CHECK(r.out.empty());
    CHECK_FALSE(std::filesystem::exists(out_dir));
  }
}

TEST_CASE("inspect describes a run config: mesh in order, roles, parameter count") {
  TempDir dir;
  dir.write("model.toml", MODEL);
  const std::string path = dir.write("run.toml", "[mesh]\naxes = { model = 2, data = 2 }\n[model]\nconfig = \"model.toml\"\n");
  const Result r = run({"inspect", path});
  CHECK(r.code == 0);
  CHECK(r.err.empty());
  CHECK(r.out.find("run config") != std::string::npos);
  CHECK(r.out.find("model=2,data=2, 4 device(s)") != std::string::npos);
  CHECK(r.out.find("data axis 'data' = 2, tensor axis 'model' = 2") != std::string::npos);
  // Llama parameter count by hand: embedding V*C, per layer 2 norms + wq, wo (C*C) + wk, wv
  // (KV*C) + w1, w2, w3 (F*C), final norm C; the classifier is shared.
  const long C = 64, F = 172, L = 2, V = 65, KV = 64 / 4 * 2;
  const long expected = V * C + L * (2 * C + 2 * C * C + 2 * KV * C + 3 * F * C) + C;
  CHECK(r.out.find("parameters " + with_commas(expected) + "\n") != std::string::npos);

  const Result flagged = run({"inspect", path, "--mesh", "data=2,model=4", "--set", "train.steps=7"});
  CHECK(flagged.code == 0);
  CHECK(flagged.out.find("data=2,model=4, 8 device(s)") != std::string::npos);
  CHECK(flagged.out.find("7 steps") != std::string::npos);

  const Result devices = run({"inspect", path, "--devices", "4"});
  CHECK(devices.code == 0);
  CHECK(devices.out.find("model=4, 4 device(s)") != std::string::npos);
  // 4 heads over 4 devices: one each; 2 kv heads, each held by the 2 devices whose heads use it;
  // 172 ffn rows dealt 43 each; 65 vocabulary rows 17,16,16,16.
  CHECK(devices.out.find("per tensor device: heads 1,1,1,1; kv heads 1,1,1,1; ffn rows 43,43,43,43; vocab rows 17,16,16,16") !=
        std::string::npos);

  const Result too_many = run({"inspect", path, "--devices", "8"});
  CHECK(too_many.code == 2);
  CHECK(line_count(too_many.err) == 1);
  CHECK(too_many.err.rfind("--devices 8: mesh.axes.model = 8: cannot split 4 heads over 8 devices", 0) == 0);
}

TEST_CASE("inspect prints the sharding plan: JAX notation, collectives per step or token, modelled and predicted times") {
  TempDir dir;
  dir.write("model.toml", MODEL);
  const std::string path = dir.write("run.toml", "[mesh]\naxes = { data = 2, model = 2 }\n[model]\nconfig = \"model.toml\"\n");
  const Result r = run({"inspect", path, "--link", "model=10,5", "--matmul-gflops", "20"});
  INFO(r.out << r.err);
  CHECK(r.code == 0);
  CHECK(r.out.find("tok_embeddings          f32[65@model, 64]") != std::string::npos);
  CHECK(r.out.find("layers.1.wo             f32[64, 64@model]") != std::string::npos);
  CHECK(r.out.find("layers.0.attention_norm f32[64]\n") != std::string::npos);
  CHECK(r.out.find("collectives per training step, device 0") != std::string::npos);
  CHECK(r.out.find("model  all_sum         wo outputs") != std::string::npos);
  CHECK(r.out.find("data   all_sum         gradient bucket") != std::string::npos);
  CHECK(r.out.find("unmodelled") != std::string::npos);  // the data axis has no link
  // the issue's ring all-sum 2(S-1)/S B/bw + 2(S-1) latency and all-gather half that: S = 2 on the
  // model axis, B = 6 x 64 rows (batch 12 over data = 2, seq_len 64) x dim 64 x 4 bytes, 10 GB/s, 5 us
  const double B = 6 * 64 * 64 * 4.0;
  char all_sum[64], all_gather[64];
  std::snprintf(all_sum, sizeof all_sum, "98.3 KB x 2     %.1f us each", (2.0 * 1 / 2 * B / 10e9 + 2 * 5e-6) * 1e6);
  std::snprintf(all_gather, sizeof all_gather, "98.3 KB x 1     %.1f us each", (1.0 / 2 * B / 10e9 + 5e-6) * 1e6);
  CHECK(r.out.find(std::string("wo outputs                              ") + all_sum) != std::string::npos);
  CHECK(r.out.find(std::string("embedding rows                          ") + all_gather) != std::string::npos);
  // the step's work item by item, matmuls at the given rate, and the parts of the predicted time
  CHECK(r.out.find("work (rates measured now with 4 device(s) at once, matmuls at --matmul-gflops)") != std::string::npos);
  CHECK(r.out.find("    w1|w3 weight gradient") != std::string::npos);
  CHECK(r.out.find("GFLOP at   20.0 GFLOP/s") != std::string::npos);
  CHECK(r.out.find("    attention forward") != std::string::npos);  // timed at its shape
  CHECK(r.out.find("    attention backward") != std::string::npos);
  CHECK(r.out.find("    AdamW") != std::string::npos);
  CHECK(r.out.find("  step time: matmul ") != std::string::npos);
}

TEST_CASE("inspect CHECKPOINT --devices N plans decoding on N devices (no longer ignored)") {
  tpcli::testing::require_shared("data/stories260K.bin");
  const std::string model = tpcli::testing::shared_path("data/stories260K.bin");
  const Result plain = run({"inspect", model});
  CHECK(plain.code == 0);
  CHECK(plain.out.find("plan on") == std::string::npos);
  const Result r = run({"inspect", model, "--devices", "4", "--matmul-gflops", "5"});
  INFO(r.out << r.err);
  CHECK(r.code == 0);
  CHECK(r.out.find("    w1|w3 ") != std::string::npos);  // the matrices through the matvec kernels, by shape
  CHECK(r.out.find("    classifier ") != std::string::npos);
  CHECK(r.out.find("time per token at position 256") != std::string::npos);
  CHECK(r.out.find("plan on model=4") != std::string::npos);
  CHECK(r.out.find("tok_embeddings          f32[512@model, 64]") != std::string::npos);
  CHECK(r.out.find("layers.4.wk             f32[32@model, 64]") != std::string::npos);
  CHECK(r.out.find("model  all_sum         wo outputs                                256 B x 5     unmodelled") !=
        std::string::npos);
  CHECK(r.out.find("KV cache 0.16 MB") != std::string::npos);  // 2 x 5 layers x 512 positions x 8 rows x 4 bytes
  const Result bad = run({"inspect", model, "--devices", "16"});
  CHECK(bad.code == 2);
  CHECK(line_count(bad.err) == 1);
}

TEST_CASE("inspect takes vocab_size from a chars corpus when the model leaves it out") {
  TempDir dir;
  dir.write("corpus.txt", "to be or not to be");  // 7 distinct characters: t o ' ' b e r n
  const std::string path = dir.write(
      "run.toml", "[model]\ndim = 16\nhidden_dim = 32\nn_layers = 1\nn_heads = 2\nseq_len = 8\n[data]\npath = \"corpus.txt\"\n");
  const Result r = run({"inspect", path});
  CHECK(r.code == 0);
  CHECK(r.out.find("vocab 7, seq_len 8") != std::string::npos);
  const long C = 16, F = 32, V = 7;
  CHECK(r.out.find("parameters " + with_commas(V * C + (2 * C + 4 * C * C + 3 * F * C) + C) + "\n") != std::string::npos);
}

TEST_CASE("inspect describes a model file and points at the dim that does not fit") {
  TempDir dir;
  const std::string good = dir.write("tiny.toml", MODEL);
  const Result r = run({"inspect", good});
  CHECK(r.code == 0);
  CHECK(r.out.find("model config") != std::string::npos);
  CHECK(r.out.find("4 heads (2 kv, head size 16)") != std::string::npos);

  const std::string bad_text = "dim = 64\nhidden_dim = 172\nn_layers = 2\nn_heads = 3\nvocab_size = 65\nseq_len = 64\n";
  const std::string bad = dir.write("bad.toml", bad_text);
  const Result e = run({"inspect", bad});
  CHECK(e.code == 2);
  CHECK(e.err == where(bad, bad_text, "3\n") + ": n_heads = 3 does not divide dim = 64\n");

  const std::string missing = dir.write("missing.toml", "dim = 64\nn_heads = 4\n");
  const Result m = run({"inspect", missing});
  CHECK(m.code == 2);
  CHECK(m.err == missing + ": model.hidden_dim is missing (set it in [model] or in the file named by model.config)\n");

  const Result unknown = run({"inspect", dir.write("notes.txt", "hello")});
  CHECK(unknown.code == 2);
  CHECK(line_count(unknown.err) == 1);
  CHECK(unknown.err.find("unknown file kind") != std::string::npos);
}

TEST_CASE("bench collective-matmul prints the three rows and agreeing results, and --link errors are one line") {
  const Result ok = run({"bench", "collective-matmul", "--batch", "32", "--dim", "32", "--ffn", "64", "--reps", "1",
                         "--link", "model=5,1"});
  INFO(ok.err);
  REQUIRE(ok.code == 0);
  for (const char* row : {"JAX's case: A[32, 32@model]", "sequence-parallel case (the model's): A[32@model, 32]",
                          "unsharded", "all-gather then matmul", "overlapped", "link: 5 GB/s, 1 us, ring"})
    CHECK(ok.out.find(row) != std::string::npos);
  // The row-chunked form adds the same products as the plain one; the contraction-chunked form sums
  // each output over the chunks in another order, so only rounding may differ.
  CHECK(ok.out.find("max |overlapped - all-gather then matmul| on device 0: 0 (one-way), 0 (two-way)") != std::string::npos);
  const std::string diff_label = "max |overlapped - all-gather then matmul| on device 0: ";
  const size_t at = ok.out.find(diff_label);
  REQUIRE(at != std::string::npos);
  CHECK(std::stod(ok.out.substr(at + diff_label.size())) < 1e-4);
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  for (const Case& c : std::vector<Case>{
           {{"bench", "collective-matmul", "--link", "model=fast,1"}, "--link model=fast,1: 'fast' is not a number"},
           {{"bench", "collective-matmul", "--link", "data=1,1"}, "--link data: the mesh has only the axis 'model'"},
           {{"infer", "--model", "x.bin", "--link", "model=1,1,torus"}, "--link model=1,1,torus: topology 'torus'"}}) {
    const Result r = run(c.args);
    INFO(r.err);
    CHECK(r.code == 2);
    CHECK(r.err.find(c.expect) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
}

TEST_CASE("bench matmul: the packed backward beside sgemm for each shape and format, and --backward-n 0 is a one-line error") {
  const std::vector<std::string> small = {"bench", "matmul", "--sizes", "16", "--threads", "1", "--decode-n", "64",
                                          "--decode-k", "64", "--batches", "1", "--reps", "1"};
  std::vector<std::string> args = small;
  args.insert(args.end(), {"--backward-n", "8"});
  const Result ok = run(args);
  INFO(ok.err);
  REQUIRE(ok.code == 0);
  for (const char* row : {"backward dinp[8,IN] = dout @ W", "packed/sgemm", "OUT=288 IN=288 bf16", "OUT=768 IN=288 affine 8-bit g32",
                          "OUT=288 IN=768 affine 4-bit g32", "OUT=288 IN=768 mxfp8"})
    CHECK(ok.out.find(row) != std::string::npos);
  args = small;
  args.insert(args.end(), {"--backward-n", "0"});
  const Result bad = run(args);
  CHECK(bad.code == 2);
  CHECK(bad.err.find("--backward-n 0 < 1") != std::string::npos);
  CHECK(line_count(bad.err) == 1);
}

TEST_CASE("a model file's keys beyond the Llama block are one-line errors naming file and key") {
  TempDir dir;
  const std::string base = std::string(MODEL);
  const std::string arch_text = base + "hf_architecture = \"GPT2LMHeadModel\"\n";
  const std::string arch = dir.write("arch.toml", arch_text);
  const Result a = run({"inspect", arch});
  CHECK(a.code == 2);
  CHECK(a.err == where(arch, arch_text, "\"GPT2") + ": hf_architecture = \"GPT2LMHeadModel\" must be one of " +
                     "\"LlamaForCausalLM\", \"MistralForCausalLM\", \"Qwen2ForCausalLM\", \"Qwen3ForCausalLM\", " +
                     "\"Phi3ForCausalLM\", \"MixtralForCausalLM\", \"Qwen3MoeForCausalLM\"\n");

  for (const std::string key : {"norm_topk_prob = false\n", "dense_layers = [0]\n"}) {
    const std::string text = base + key;
    const std::string path = dir.write("dense.toml", text);
    const Result r = run({"inspect", path});
    INFO(key);
    CHECK(r.code == 2);
    CHECK(r.err == where(path, text, key.substr(key.find('=') + 2)) + ": " + key.substr(0, key.find(' ')) +
                       " applies to mixture-of-experts models only: set n_experts >= 1 too\n");
  }

  const std::string layers_text = base + "n_experts = 4\ntop_k = 2\ndense_layers = [0, 2]\n";
  const std::string layers = dir.write("layers.toml", layers_text);
  const Result l = run({"inspect", layers});
  CHECK(l.code == 2);
  CHECK(l.err == where(layers, layers_text, "[0, 2]") + ": dense_layers: 2 is not a block in [0, n_layers), ascending\n");

  const std::string qwen_text = base + "head_dim = 32\nqkv_bias = true\nqk_norm = true\nhf_architecture = \"Qwen2ForCausalLM\"\n";
  const Result q = run({"inspect", dir.write("qwen.toml", qwen_text)});
  INFO(q.err);
  CHECK(q.code == 0);
  CHECK(q.out.find("4 heads (2 kv, head size 32)") != std::string::npos);
}

TEST_CASE("bench moe: the inference section prints decode and prefill tok/s for TP, EP and both") {
  const std::vector<std::string> small = {"bench", "moe", "--devices", "2", "--tokens", "16", "--dim", "32", "--hidden", "32",
                                          "--experts", "4", "--layers", "2", "--heads", "4", "--vocab", "128",
                                          "--prefill-tokens", "8", "--decode-tokens", "4", "--reps", "1"};
  const Result r = run(small);
  INFO(r.err);
  REQUIRE(r.code == 0);
  INFO(r.out);
  CHECK(r.out.find("MoE fwd+bwd") != std::string::npos);  // the layer sections still run first
  CHECK(r.out.find("decode tok/s") != std::string::npos);
  CHECK(r.out.find("prefill tok/s") != std::string::npos);
  CHECK(r.out.find("\nmodel=2 ") != std::string::npos);
  CHECK(r.out.find("\nexpert=2 ") != std::string::npos);
  CHECK(r.out.find("\nexpert=D/2,model=2   skipped: needs an even --devices >= 4\n") != std::string::npos);

  std::vector<std::string> four = small;
  four[3] = "4";
  four.push_back("--inference");
  const Result f = run(four);
  INFO(f.err);
  REQUIRE(f.code == 0);
  INFO(f.out);
  CHECK(f.out.find("MoE fwd+bwd") == std::string::npos);
  for (const char* mesh : {"\nmodel=4 ", "\nexpert=4 ", "\nexpert=2,model=2 "}) CHECK(f.out.find(mesh) != std::string::npos);
  CHECK(f.out.find("skipped") == std::string::npos);

  std::vector<std::string> odd_heads = four;
  odd_heads[15] = "3";  // --heads 3 does not divide dim 32
  const Result h = run(odd_heads);
  CHECK(h.code == 2);
  CHECK(h.err == "tpcli bench moe: the inference model: n_heads = 3 does not divide dim = 32 (set --dim, --heads)\n");
}

TEST_CASE("bench batch: llama-batched-bench's table, one row per batch size and format, and one-line errors") {
  tpcli::testing::require_shared("data/stories260K.bin");
  const std::string model = tpcli::testing::shared_path("data/stories260K.bin");
  const Result r = run({"bench", "batch", "--model", model, "--devices", "2", "--formats", "f32,8", "--group-size", "32",
                        "--npp", "6", "--ntg", "3", "--npl", "1,3"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  INFO(r.out);
  CHECK(r.out.find("|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |") !=
        std::string::npos);
  CHECK(r.out.find("|     6 |      3 |    1 |      9 |") != std::string::npos);
  CHECK(r.out.find("|     6 |      3 |    3 |     27 |") != std::string::npos);
  CHECK(r.out.find("affine 8-bit g32") != std::string::npos);
  const Result bad = run({"bench", "batch", "--model", model, "--npl", "0"});
  CHECK(bad.code == 2);
  CHECK(bad.err == "tpcli bench batch: --npl 0: batch sizes must be in [1, 1024]\n");
}

TEST_CASE("bench train: each multi-device mesh is set against its concurrent half-batch 1-device runs, and a batch they cannot split is a one-line error") {
  TempDir dir;
  dir.write("corpus.txt", "to be or not to be, that is the question; whether 'tis nobler in the mind to suffer\n");
  const std::string path = dir.write("run.toml",
                                     "[model]\ndim = 48\nhidden_dim = 64\nn_layers = 1\nn_heads = 3\nseq_len = 16\n"
                                     "vocab_size = 256\n[data]\npath = \"corpus.txt\"\ntokenizer = \"bytes\"\n"
                                     "[train]\nbatch_size = 6\nseq_len = 16\neval_batches = 0\nsample_tokens = 0\n");
  const Result r = run({"bench", "train", "--config", path, "--meshes", "1x1,2x1,1x3", "--steps", "1", "--warmup", "1"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  INFO(r.out);
  const size_t two = r.out.find("\n2x1 "), three = r.out.find("\n1x3 ");
  const size_t two_ceiling = r.out.find("  vs 2 concurrent 1-device runs of batch 6/2: ");
  const size_t three_ceiling = r.out.find("  vs 3 concurrent 1-device runs of batch 6/3: ");
  REQUIRE(two_ceiling != std::string::npos);
  REQUIRE(three_ceiling != std::string::npos);
  CHECK(two < two_ceiling);
  CHECK(two_ceiling < three);
  CHECK(three < three_ceiling);
  CHECK(r.out.find(" concurrent 1-device runs") == r.out.rfind(" concurrent 1-device runs", three));  // none after 1x1

  const Result bad = run({"bench", "train", "--config", path, "--meshes", "1x1,1x3", "--set", "train.batch_size=4"});
  CHECK(bad.code == 2);
  CHECK(bad.out.empty());  // before anything runs
  CHECK(bad.err == "tpcli bench train: --meshes 1x3: train.batch_size = 4 does not split into 3 concurrent 1-device "
                   "runs (the ceiling); use a batch divisible by 3\n");
}

TEST_CASE("infer and infer --batch print the same sampled text for the same seeded request, on 1 and 2 devices") {
  // A prompt long enough to be prefilled in several row blocks: infer prefills it in one call, the
  // engine in chunks of --step-tokens beside nothing else; both keep every row's own arithmetic.
  tpcli::testing::require_shared("data/stories260K.bin");
  const std::string model = tpcli::testing::shared_path("data/stories260K.bin"), tok = tpcli::testing::shared_path("data/tok512.bin");
  const std::string prompt =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun with her dog, and "
      "one day she saw a big red ball in the park";
  tpcli::testing::TempDir dir;
  const nlohmann::json line = {{"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0.8}, {"top_p", 0.9}, {"seed", 11}};
  const std::string prompts = dir.write("p.jsonl", line.dump() + "\n");
  for (const char* devices : {"1", "2"}) {
    INFO(devices << " devices");
    const Result batch = run({"infer", "--model", model, "-z", tok, "--batch", prompts, "--devices", devices, "--step-tokens", "16"});
    const Result alone = run({"infer", "--model", model, "-z", tok, "-i", prompt, "-t", "0.8", "-p", "0.9", "-s", "11", "-n", "256",
                              "--devices", devices});
    REQUIRE(batch.code == 0);
    REQUIRE(alone.code == 0);
    const std::string text = nlohmann::json::parse(batch.out)["text"].get<std::string>();
    REQUIRE(text.size() > 20);
    CHECK(alone.out.find(prompt + text) == 0);
  }
}

TEST_CASE("infer --batch: JSONL prompts with continuous batching, results in input order whatever --parallel, bad lines named") {
  tpcli::testing::require_shared("data/stories260K.bin");
  const std::string model = tpcli::testing::shared_path("data/stories260K.bin"), tok = tpcli::testing::shared_path("data/tok512.bin");
  tpcli::testing::TempDir dir;
  const std::string prompts = dir.write("p.jsonl",
                                        "{\"prompt\": \"Once upon a time\", \"max_tokens\": 20, \"temperature\": 0}\n"
                                        "{\"prompt\": \"The dog\", \"max_tokens\": 12, \"seed\": 7}\n"
                                        "\n"
                                        "{\"prompt\": \"Lily saw a big\", \"max_tokens\": 30, \"temperature\": 0.8, \"top_p\": 0.9, \"seed\": 3}\n");
  const Result one = run({"infer", "--model", model, "-z", tok, "--batch", prompts, "--parallel", "1"});
  const Result three = run({"infer", "--model", model, "-z", tok, "--batch", prompts, "--parallel", "3", "--devices", "2"});
  INFO(one.err << three.err);
  REQUIRE(one.code == 0);
  REQUIRE(three.code == 0);
  CHECK(one.out == three.out);  // each prompt's tokens do not depend on what runs beside it
  std::vector<nlohmann::json> lines;
  std::stringstream in(one.out);
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  REQUIRE(lines.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(lines[i]["index"] == i);
  CHECK(lines[0]["tokens"] == 20);
  CHECK(lines[0]["finish_reason"] == "length");
  // greedy: the text infer -t 0 prints after the same prompt
  const Result greedy = run({"infer", "--model", model, "-z", tok, "-i", "Once upon a time", "-t", "0", "-n", "64"});
  REQUIRE(greedy.code == 0);
  const std::string text = lines[0]["text"].get<std::string>();
  CHECK(greedy.out.find("Once upon a time" + text) == 0);
  // a stop string from the middle of that text ends it there, across token boundaries, unprinted
  REQUIRE(text.size() > 12);
  const std::string stop = text.substr(text.size() / 2, 5);
  const nlohmann::json stop_line = {{"prompt", "Once upon a time"}, {"max_tokens", 20}, {"temperature", 0}, {"stop", {"zzzz", stop}}};
  const std::string stopping = dir.write("stop.jsonl", stop_line.dump() + "\n");
  const Result stopped = run({"infer", "--model", model, "-z", tok, "--batch", stopping});
  REQUIRE(stopped.code == 0);
  const nlohmann::json s = nlohmann::json::parse(stopped.out);
  CHECK(s["text"] == text.substr(0, text.find(stop)));
  CHECK(s["finish_reason"] == "stop");
  // a pool of 6 blocks (96 positions) for three sequences: preemption, the same lines
  const Result small = run({"infer", "--model", model, "-z", tok, "--batch", prompts, "--parallel", "3", "--kv-blocks", "6"});
  CHECK(small.out == one.out);
  const Result tiny = run({"infer", "--model", model, "-z", tok, "--batch", prompts, "--kv-memory", "1K"});
  CHECK(tiny.code == 2);
  CHECK(tiny.err.find("--kv-memory 1024 holds no KV block") != std::string::npos);
  // a bf16 KV pool answers every line; a KV type that is none is one line, before the model loads
  const Result bf16_kv = run({"infer", "--model", model, "-z", tok, "--batch", prompts, "--kv-dtype", "bf16"});
  CHECK(bf16_kv.code == 0);
  CHECK(line_count(bf16_kv.out) == line_count(one.out));
  const std::vector<std::vector<std::string>> bad_kv_runs = {{"infer", "--batch", prompts}, {"infer", "-i", "hi"}, {"chat"},
                                                             {"perplexity", "--data", prompts}};
  for (std::vector<std::string> args : bad_kv_runs) {
    const std::string command = args[0];
    args.insert(args.end(), {"--model", model, "-z", tok, "--kv-dtype", "f8"});
    const Result bad_kv = run(args);
    CHECK(bad_kv.code == 2);
    CHECK(bad_kv.err == "tpcli " + command + ": --kv-dtype f8: not a KV cache type (f32, bf16 or f16)\n");
  }
  const std::string bad = dir.write("bad.jsonl", "{\"prompt\": \"hi\"}\n{\"prompt\": \"there\", \"max_tokens\": \"x\"}\n");
  const Result b = run({"infer", "--model", model, "-z", tok, "--batch", bad});
  CHECK(b.code == 2);
  CHECK(b.err == "tpcli infer: " + bad + ":2: \"max_tokens\" = \"x\" is not an integer in [1, 2147483647]\n");
  CHECK(b.out.empty());
}

TEST_CASE("infer --batch: a line's response_format or grammar constrains its answer, and a bad one is named") {
  tpcli::testing::require_shared("data/stories260K.bin");
  const std::string model = tpcli::testing::shared_path("data/stories260K.bin"), tok = tpcli::testing::shared_path("data/tok512.bin");
  tpcli::testing::TempDir dir;
  std::string lines;
  for (int seed = 1; seed <= 6; ++seed)
    lines += "{\"prompt\": \"Once\", \"max_tokens\": 120, \"seed\": " + std::to_string(seed) +
             R"(, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"z": {"type": "integer"}, "a": {"type": "boolean"}}, "required": ["z", "a"]}}}})" "\n";
  lines += R"({"prompt": "Once", "max_tokens": 8, "grammar": "root ::= [0-9]+"})" "\n";
  const Result r = run({"infer", "--model", model, "-z", tok, "--batch", dir.write("c.jsonl", lines), "--devices", "2"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  std::stringstream in(r.out);
  int finished = 0;
  for (std::string l; std::getline(in, l);) {
    const nlohmann::json out = nlohmann::json::parse(l);
    const std::string text = out["text"];
    INFO(text);
    if (out["index"] == 6) {
      CHECK(text.find_first_not_of("0123456789") == std::string::npos);
      continue;
    }
    if (out["finish_reason"] != "stop") continue;
    const nlohmann::json value = nlohmann::json::parse(text);
    CHECK(value["z"].is_number_integer());
    CHECK(value["a"].is_boolean());
    CHECK(value.size() == 2);
    CHECK(text.find("\"z\"") < text.find("\"a\""));  // the schema's order
    ++finished;
  }
  CHECK(finished >= 4);
  const Result bad = run({"infer", "--model", model, "-z", tok, "--batch",
                          dir.write("bad.jsonl", R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string", "format": "ipv6"}}}})" "\n")});
  CHECK(bad.code == 2);
  CHECK(bad.err.find("bad.jsonl:1") != std::string::npos);
  CHECK(bad.err.find("'format'") != std::string::npos);
}
