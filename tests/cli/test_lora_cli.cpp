// cli/: LoRA adapters in PEFT's format on the command line (issue 30). `logits --adapter` on 1 and
// 3 devices against the model merged by `export --adapter --fuse --to hf` (read back as a model),
// whose every matrix is checked against W + scale * B @ A computed from the base's and the
// adapter's files as stored (both in rotate-half order: no tpcli code in between),
// `infer --adapter` greedy ids alike on 1, 2 and 3 devices, and one-line errors for a bad
// --adapter. The adapter is random (seeded), written with formats::save_peft_adapter for the
// Hugging Face Llama of ../shared/reference/hf-archs.
//
// Dimension legend: P prompt positions, V vocab_size.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "formats/hf_model.h"
#include "formats/llama2c.h"
#include "formats/peft_adapter.h"
#include "model/lora_adapter.h"
#include "support/cli_checks.h"
#include "support/raw_safetensors.h"
#include "support/run_tpcli.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"

namespace {

using tpcli::testing::RawSafetensors;
using tpcli::testing::read_raw;

using Result = tpcli::testing::RunResult;
using tpcli::testing::check_one_line_error;
using tpcli::testing::parse_rows;
using tpcli::model::LoraAdapterSet;

Result run(const std::vector<std::string>& args) {
  return tpcli::testing::run_tpcli(args, {.environment = "OMP_WAIT_POLICY=passive", .timeout_seconds = 120});
}

const char* LLAMA = "reference/hf-archs/llama";
const char* TOKENS = "153,270,108,17,399,5,64,211,90,3,77,480";

LoraAdapterSet random_adapter(const tpcli::model::LlamaConfig& c, uint32_t seed) {
  LoraAdapterSet set;
  set.rank = 4;
  set.alpha = 8;
  set.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.15f);
  for (const auto& p : tpcli::model::llama_parameters(c)) {
    const auto dot = p.name.rfind('.');
    if (!p.name.starts_with("layers.") || !tpcli::model::lora_hf_module_of(p.name.substr(dot + 1))) continue;
    std::vector<float> a(static_cast<size_t>(4 * p.shape[1])), b(static_cast<size_t>(p.shape[0] * 4));
    for (auto& x : a) x = d(rng);
    for (auto& x : b) x = d(rng);
    set.tensors.emplace(p.name + ".lora_a", tpcli::tensor::Tensor({4, p.shape[1]}, a));
    set.tensors.emplace(p.name + ".lora_b", tpcli::tensor::Tensor({p.shape[0], 4}, b));
  }
  return set;
}


double max_diff(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t p = 0; p < a.size(); ++p) {
    REQUIRE(a[p].size() == b[p].size());
    for (size_t v = 0; v < a[p].size(); ++v) worst = std::max(worst, std::abs(a[p][v] - b[p][v]));
  }
  return worst;
}

std::vector<std::vector<double>> logits(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"logits", "--tokens", TOKENS};
  args.insert(args.end(), extra.begin(), extra.end());
  const Result r = run(args);
  INFO(r.err);
  REQUIRE(r.code == 0);
  return parse_rows(r.out);
}

// A safetensors file read here from its layout (u64 header size, JSON header, data): F32 tensors.


}  // namespace

TEST_CASE("lora cli: logits --adapter on 1 and 3 devices equal the fused export's, whose matrices are the files' W + scale B @ A, and infer --adapter picks the same ids on 1, 2 and 3 devices") {
  tpcli::testing::require_shared(LLAMA);
  const std::string model = tpcli::testing::shared_path(LLAMA);
  const tpcli::formats::HfModelDir dir(model);
  const tpcli::testing::TempDir tmp;
  const std::string adapter = (tmp.path() / "adapter").string(), fused = (tmp.path() / "fused").string();
  tpcli::formats::save_peft_adapter(adapter, random_adapter(dir.config(), 7), dir.config());

  const auto plain = logits({"--model", model});
  const auto one = logits({"--model", model, "--adapter", adapter});
  const auto three = logits({"--model", model, "--adapter", adapter, "--devices", "3"});
  CHECK(max_diff(one, plain) > 0.05);  // the adapter acts
  CHECK(max_diff(three, one) < 1e-4);

  const Result e = run({"export", "--model", model, "--adapter", adapter, "--fuse", "--to", "hf", "--out", fused, "--dtype", "f32"});
  INFO(e.err);
  REQUIRE(e.code == 0);
  CHECK(max_diff(logits({"--model", fused}), one) < 1e-4);  // measured 3.1e-5 (the adapter moves logits by 23)
  // Every fused matrix, in the Hugging Face files' own row order, is W + alpha/r * B @ A of the
  // base's and the adapter's files as stored (no RoPE reordering in between: both are rotate-half).
  const RawSafetensors base_file = read_raw(std::filesystem::path(model) / "model.safetensors");
  const RawSafetensors lora_file = read_raw(std::filesystem::path(adapter) / "adapter_model.safetensors");
  const RawSafetensors fused_file = read_raw(std::filesystem::path(fused) / "model.safetensors");
  int checked = 0;
  for (const auto& [name, h] : lora_file.header.items()) {
    if (!name.ends_with(".lora_A.weight")) continue;
    const std::string prefix = "base_model.model.", suffix = ".lora_A.weight";
    const std::string module = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    INFO(module);
    const std::vector<float> w = base_file.f32(module + ".weight"), merged = fused_file.f32(module + ".weight");
    const std::vector<float> a = lora_file.f32(name), b = lora_file.f32("base_model.model." + module + ".lora_B.weight");
    const int64_t r = 4, IN = static_cast<int64_t>(a.size()) / r, OUT = static_cast<int64_t>(b.size()) / r;
    REQUIRE(static_cast<int64_t>(w.size()) == OUT * IN);
    double worst = 0;
    for (int64_t o = 0; o < OUT; ++o)
      for (int64_t i = 0; i < IN; ++i) {
        double s = 0;
        for (int64_t k = 0; k < r; ++k) s += double(b[static_cast<size_t>(o * r + k)]) * a[static_cast<size_t>(k * IN + i)];
        worst = std::max(worst, std::abs(w[static_cast<size_t>(o * IN + i)] + 2.0 * s - merged[static_cast<size_t>(o * IN + i)]));
      }
    CHECK(worst < 1e-5);
    ++checked;
  }
  CHECK(checked == 14);  // 7 modules x 2 layers

  std::vector<int> first;
  for (const char* devices : {"1", "2", "3"}) {
    INFO("devices " << devices);
    const Result r = run({"infer", "--model", model, "--adapter", adapter, "--tokens", TOKENS, "-t", "0", "-n", "40", "--ids",
                          "--devices", devices});
    INFO(r.err);
    REQUIRE(r.code == 0);
    const std::vector<int> got = nlohmann::json::parse(r.out).get<std::vector<int>>();
    if (first.empty()) first = got;
    CHECK(got == first);
  }
  const Result fused_infer = run({"infer", "--model", fused, "--tokens", TOKENS, "-t", "0", "-n", "40", "--ids"});
  REQUIRE(fused_infer.code == 0);
  CHECK(nlohmann::json::parse(fused_infer.out).get<std::vector<int>>() == first);
}

TEST_CASE("lora cli: a bad --adapter, or --fuse without one, is a one-line error naming the path") {
  tpcli::testing::require_shared(LLAMA);
  const std::string model = tpcli::testing::shared_path(LLAMA);
  const tpcli::testing::TempDir tmp;
  const std::string missing = (tmp.path() / "no-such-adapter").string();
  check_one_line_error(run({"infer", "--model", model, "--adapter", missing, "--tokens", "5,6", "--ids"}), missing + ": not a folder");
  check_one_line_error(run({"logits", "--model", model, "--adapter", missing, "--tokens", "5,6"}), missing + ": not a folder");
  // An adapter for another shape (hidden 64 instead of 128).
  tpcli::model::LlamaConfig other = tpcli::formats::HfModelDir(model).config();
  other.dim = 64;
  other.head_dim = 8;
  const std::string wrong = (tmp.path() / "wrong").string();
  tpcli::formats::save_peft_adapter(wrong, random_adapter(other, 8), other);
  check_one_line_error(run({"infer", "--model", model, "--adapter", wrong, "--tokens", "5,6", "--ids"}),
                       wrong + "/adapter_model.safetensors: tensor base_model.model.model.layers.0.mlp.down_proj.lora_B.weight: shape [64, 4], expected [128, 4]");
  const std::string out = (tmp.path() / "out").string();
  check_one_line_error(run({"export", "--model", model, "--fuse", "--to", "hf", "--out", out}), "--fuse needs --adapter");
  check_one_line_error(run({"export", "--model", model, "--adapter", wrong, "--to", "hf", "--out", out}),
                       "export merges an adapter only with --fuse");
  check_one_line_error(run({"export", "--model", model, "--adapter", wrong, "--fuse", "--to", "hf", "--out", out}), wrong);
  CHECK_FALSE(std::filesystem::exists(out));
}

TEST_CASE("lora cli: stories260K with an adapter, as text through infer and chat on 1 and 2 devices, scored by perplexity, and fused from a quantized file") {
  tpcli::testing::require_shared("data/stories260K.bin");
  const std::string model = tpcli::testing::shared_path("data/stories260K.bin");
  const std::string tok = tpcli::testing::shared_path("data/tok512.bin");
  const tpcli::testing::TempDir tmp;
  const std::string adapter = (tmp.path() / "adapter").string();
  {
    const tpcli::formats::Llama2cFile file(model);
    tpcli::formats::save_peft_adapter(adapter, random_adapter(file.config(), 9), file.config());
  }
  auto infer = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"infer", "--model", model, "-z", tok, "-t", "0", "-n", "40", "-i", "Once upon a time"};
    args.insert(args.end(), extra.begin(), extra.end());
    const Result r = run(args);
    INFO(r.err);
    REQUIRE(r.code == 0);
    return r.out;
  };
  const std::string base = infer({}), one = infer({"--adapter", adapter}), two = infer({"--adapter", adapter, "--devices", "2"});
  CHECK(one.find("Once upon a time") != std::string::npos);
  CHECK(one != base);
  CHECK(two == one);

  auto chat = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"chat", "--model", model, "-z", tok, "--template", "zephyr", "-t", "0", "-n", "12"};
    args.insert(args.end(), extra.begin(), extra.end());
    const Result r = tpcli::testing::run_tpcli(args, {.environment = "OMP_WAIT_POLICY=passive", .input = "Tell me about a cat.\n",
                                                       .timeout_seconds = 120});
    INFO(r.err);
    REQUIRE(r.code == 0);
    return r.out;
  };
  const std::string chat_one = chat({"--adapter", adapter});
  CHECK(chat_one != chat({}));
  CHECK(chat({"--adapter", adapter, "--devices", "2"}) == chat_one);

  // perplexity --adapter: the batched forward and the decode path score the text alike, not as the base.
  const std::string text = tmp.write("text.txt", tpcli::testing::slurp(tpcli::testing::shared_path("data/tinyshakespeare.txt")).substr(0, 3000));
  auto nll = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"perplexity", "--model", model, "-z", tok, "--data", text, "--windows", "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    const Result r = run(args);
    INFO(r.err);
    REQUIRE(r.code == 0);
    const size_t at = r.out.find("mean NLL ");
    REQUIRE(at != std::string::npos);
    return std::stod(r.out.substr(at + 9));
  };
  const double adapted_nll = nll({"--adapter", adapter});
  CHECK(std::abs(adapted_nll - nll({})) > 1e-3);
  CHECK(std::abs(nll({"--adapter", adapter, "--decode", "--devices", "2"}) - adapted_nll) < 1e-4);

  // A quantized base: fused in f32 from its dequantized weights, said in one note; the same logits
  // as the adapter unmerged over the base read as f32 (--dtype f32).
  const std::string q8 = (tmp.path() / "q8.safetensors").string(), fused = (tmp.path() / "fused").string();
  REQUIRE(run({"quantize", "--model", model, "--out", q8, "--bits", "8", "--group-size", "32"}).code == 0);
  const Result e = run({"export", "--model", q8, "--adapter", adapter, "--fuse", "--to", "hf", "--out", fused, "--dtype", "f32"});
  INFO(e.err);
  REQUIRE(e.code == 0);
  CHECK(e.err.find("note: " + q8 + " is quantized: dequantized, merged in f32 and written unquantized (f32)") != std::string::npos);
  CHECK(max_diff(logits({"--model", fused}), logits({"--model", q8, "--dtype", "f32", "--adapter", adapter})) < 1e-4);
}

TEST_CASE("lora cli: export --to peft writes a LoRA training run's adapters as PEFT's folder, which logits --adapter runs") {
  tpcli::testing::require_shared("data/stories260K.bin");
  const tpcli::testing::TempDir tmp;
  const std::string config = tmp.write("lora.toml", "[mesh]\naxes = { data = 1, model = 2 }\n[model]\ninit_from = \"" +
                                                        tpcli::testing::shared_path("data/stories260K.bin") + "\"\n[data]\npath = \"" +
                                                        tpcli::testing::shared_path("data/tinyshakespeare.txt") + "\"\ntokenizer = \"" +
                                                        tpcli::testing::shared_path("data/tok512.bin") +
                                                        "\"\n[train]\nsteps = 4\nbatch_size = 2\nseq_len = 32\nlr = 1e-2\n"
                                                        "warmup_steps = 1\neval_every = 0\nout_dir = \"" +
                                                        (tmp.path() / "run").string() +
                                                        "\"\n[train.lora]\nrank = 4\nalpha = 8\ntargets = [\"q_proj\", \"v_proj\", \"down_proj\"]\nlayers = 2\n");
  const Result trained = run({"train", config});
  INFO(trained.err);
  REQUIRE(trained.code == 0);
  const std::string checkpoint = (tmp.path() / "run" / "latest.safetensors").string(), peft = (tmp.path() / "peft").string();
  const Result e = run({"export", "--to", "peft", "--model", checkpoint, "--out", peft});
  INFO(e.err);
  REQUIRE(e.code == 0);
  const nlohmann::json j = nlohmann::json::parse(tpcli::testing::slurp(std::filesystem::path(peft) / "adapter_config.json"));
  CHECK(j["r"] == 4);
  CHECK(j["lora_alpha"] == 8);
  CHECK(j["target_modules"] == nlohmann::json({"q_proj", "v_proj", "down_proj"}));
  CHECK(j["layers_to_transform"] == nlohmann::json({3, 4}));  // the last 2 of stories260K's 5 blocks
  // v_proj's and down_proj's A and B as the checkpoint holds them (no RoPE rows to reorder there).
  const RawSafetensors ckpt = read_raw(checkpoint), file = read_raw(std::filesystem::path(peft) / "adapter_model.safetensors");
  CHECK(file.header.size() == 1 + 12);
  for (const auto& [ours, theirs] : std::vector<std::pair<std::string, std::string>>{
           {"layers.4.wv.lora_a", "self_attn.v_proj.lora_A"}, {"layers.4.wv.lora_b", "self_attn.v_proj.lora_B"},
           {"layers.3.w2.lora_a", "mlp.down_proj.lora_A"}, {"layers.3.w2.lora_b", "mlp.down_proj.lora_B"}}) {
    INFO(ours);
    const std::string layer = ours.substr(7, 1);
    CHECK(file.f32("base_model.model.model.layers." + layer + "." + theirs + ".weight") == ckpt.f32(ours));
  }
  const std::string model = tpcli::testing::shared_path("data/stories260K.bin");
  const auto adapted = logits({"--model", model, "--adapter", peft});
  CHECK(max_diff(adapted, logits({"--model", model})) > 1e-3);  // trained: B is no longer zero
  CHECK(max_diff(logits({"--model", model, "--adapter", peft, "--devices", "2"}), adapted) < 1e-4);
  check_one_line_error(run({"export", "--to", "peft", "--model", model, "--out", (tmp.path() / "x").string()}),
                       "not a LoRA training checkpoint");
}

TEST_CASE("lora cli: train with [train.lora] on an 8-bit checkpoint made by quantize (QLoRA), and without it refused") {
  tpcli::testing::require_shared("data/stories260K.bin");
  const tpcli::testing::TempDir tmp;
  const std::string q8 = (tmp.path() / "q8.safetensors").string();
  REQUIRE(run({"quantize", "--model", tpcli::testing::shared_path("data/stories260K.bin"), "--out", q8, "--bits", "8",
               "--group-size", "32"})
              .code == 0);
  const std::string run_config = "[mesh]\naxes = { data = 1, model = 2 }\n[model]\ninit_from = \"" + q8 +
                                 "\"\n[data]\npath = \"" + tpcli::testing::shared_path("data/tinyshakespeare.txt") +
                                 "\"\ntokenizer = \"" + tpcli::testing::shared_path("data/tok512.bin") +
                                 "\"\n[train]\nsteps = 4\nbatch_size = 2\nseq_len = 32\nlr = 1e-2\n"
                                 "warmup_steps = 1\neval_every = 0\nout_dir = \"" +
                                 (tmp.path() / "run").string() + "\"\n";
  const Result trained = run({"train", tmp.write("qlora.toml", run_config + "[train.lora]\nrank = 4\nalpha = 8\n")});
  INFO(trained.err);
  REQUIRE(trained.code == 0);
  CHECK(trained.err.find("step 4/4") != std::string::npos);
  const Result adapters = run({"export", "--to", "peft", "--model", (tmp.path() / "run" / "latest.safetensors").string(),
                               "--out", (tmp.path() / "peft").string()});
  INFO(adapters.err);
  CHECK(adapters.code == 0);
  const Result full = run({"train", tmp.write("full.toml", run_config)});
  CHECK(full.code != 0);
  CHECK(full.err.find("full fine-tuning needs the f32 checkpoint") != std::string::npos);
}
