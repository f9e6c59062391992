// tpcli train / export through the binary: bad configs fail with one line before training,
// a short run leaves a checkpoint that infer reads with no other flag, and an exported llama2.c
// file gives the same greedy tokens in infer as the checkpoint it came from.
#include <catch2/catch.hpp>

#include "formats/dtype.h"
#include "support/mlx_quantized_dir.h"
#include "support/raw_safetensors.h"
#include "support/run_tpcli.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

using tpcli::testing::scratch;

namespace {

using Run = tpcli::testing::RunResult;

using tpcli::testing::slurp;

Run run_tpcli(const std::string& args) {
  return tpcli::testing::run_tpcli_line(args, {.cwd = TPCLI_SOURCE_DIR, .environment = "OMP_WAIT_POLICY=passive"});
}

std::string write_config(const std::string& name, const std::string& text) {
  fs::path p = scratch() / name;
  std::ofstream(p) << text;
  return p.string();
}

const std::string MODEL_DIMS = "dim = 32\nhidden_dim = 64\nn_layers = 1\nn_heads = 4\nn_kv_heads = 2\nseq_len = 32\n";

// A small valid config on the in-repo corpus; `extra` is appended (TOML allows no repeated keys,
// so tests change things with --set instead where possible). `dims`: the [model] section's body.
std::string config_text(const std::string& mesh, const std::string& extra = "", const std::string& dims = MODEL_DIMS) {
  return "[mesh]\naxes = { " + mesh + " }\n"
         "[model]\n" + dims +
         "[data]\npath = \"" + std::string(TPCLI_SOURCE_DIR) + "/configs/data/verona.txt\"\ntokenizer = \"chars\"\n"
         "[train]\nsteps = 3\nbatch_size = 4\nseq_len = 16\neval_every = 0\neval_batches = 1\nsample_tokens = 20\n"
         "out_dir = \"" + (scratch() / "run").string() + "\"\n" + extra;
}

int lines_of(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace

TEST_CASE("tpcli train: bad configs fail with one line before training starts") {
  struct Bad {
    std::string name, config, flags, expect;
  };
  const std::vector<Bad> cases = {
      {"unknown key", config_text("data = 1, model = 1", "bogus = 3\n"), "", "bogus"},
      {"more tensor devices than heads", config_text("data = 1, model = 8"), "", "heads"},
      {"mesh does not divide batch", config_text("data = 3, model = 1"), "", "batch_size"},
      {"missing corpus", config_text("data = 1, model = 1"), "--set data.path=/nonexistent/corpus.txt", "corpus"},
      {"zmq backend outside tpcli launch", config_text("data = 1, model = 1"), "--backend zmq", "tpcli launch"},
      {"grad_accum 0", config_text("data = 1, model = 1"), "--set train.grad_accum=0", "train.grad_accum"},
      {"a step of more than 2^30 tokens", config_text("data = 1, model = 1"), "--set train.grad_accum=100000000",
       "train.grad_accum"},
      {"shard_optimizer not a boolean", config_text("data = 1, model = 1"), "--set train.shard_optimizer=2",
       "train.shard_optimizer"},
      {"bucket_kb 0", config_text("data = 1, model = 1"), "--set train.bucket_kb=0", "train.bucket_kb"},
      {"sequence_parallel with seq_len 15 on model=2", config_text("data = 1, model = 2"),
       "--set mesh.sequence_parallel=true --set train.seq_len=15", "mesh.sequence_parallel = true needs train.seq_len = 15"},
      {"sequence_parallel with a MoE model", config_text("data = 1, model = 2"),
       "--set mesh.sequence_parallel=true --set model.n_experts=4 --set model.top_k=2",
       "mesh.sequence_parallel = true is not supported with a MoE model (model.n_experts = 4)"},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    const std::string path = write_config("bad.toml", c.config);
    Run r = run_tpcli("train " + path + " " + c.flags);
    INFO("stderr: " << r.err);
    CHECK(r.code == 2);
    CHECK(lines_of(r.err) == 1);
    CHECK(r.err.find(c.expect) != std::string::npos);
    CHECK(r.err.find("step ") == std::string::npos);  // nothing trained
  }
}

TEST_CASE("tpcli train: a short run on a 2x2 mesh leaves a checkpoint infer reads with no other flag") {
  fs::remove_all(scratch() / "run");
  const std::string path = write_config("ok.toml", config_text("data = 2, model = 2"));
  Run r = run_tpcli("train " + path);
  INFO("stderr: " << r.err << "\nstdout: " << r.out);
  REQUIRE(r.code == 0);
  const fs::path ckpt = scratch() / "run" / "latest.safetensors";
  CHECK(fs::exists(ckpt));
  CHECK(lines_of(slurp(scratch() / "run" / "metrics.jsonl")) == 3);
  CHECK(r.out.find("tpcli infer --model " + ckpt.string()) != std::string::npos);
  Run g = run_tpcli("infer --model " + ckpt.string() + " -i \"ROMEO:\" -n 30 -t 0");
  INFO("infer stderr: " << g.err);
  CHECK(g.code == 0);
  CHECK(g.out.rfind("ROMEO:", 0) == 0);
  CHECK(g.out.size() > 20);
}

TEST_CASE("tpcli train --trace and infer --trace: every device's spans and collectives, as Chrome-trace JSON") {
  fs::remove_all(scratch() / "run");
  const std::string path = write_config("trace.toml", config_text("data = 2, model = 2"));
  const fs::path trace = scratch() / "trace.json";
  Run r = run_tpcli("train " + path + " --trace " + trace.string());
  INFO("stderr: " << r.err);
  REQUIRE(r.code == 0);
  const std::string json = slurp(trace);
  CHECK(json.find("\"traceEvents\":[") != std::string::npos);
  for (int device = 0; device < 4; ++device) {
    INFO("device " << device);
    // One event per line. 3 steps: a gradients and an optimizer span each, and collectives; and
    // a gradients span more, that judges the final weights before they are saved.
    const std::string tid = "\"tid\":" + std::to_string(device) + ",";
    int gradients = 0, optimizer = 0, all_sums = 0;
    std::istringstream lines(json);
    for (std::string event; std::getline(lines, event);) {
      if (event.find(tid) == std::string::npos) continue;
      gradients += event.find("\"name\":\"gradients\"") != std::string::npos;
      optimizer += event.find("\"name\":\"optimizer\"") != std::string::npos;
      all_sums += event.find("\"name\":\"all_sum\"") != std::string::npos;
    }
    CHECK(gradients == 4);
    CHECK(optimizer == 3);
    CHECK(all_sums > 3);
  }

  // infer --trace: a prefill span for the prompt and a forward span per token after it on each
  // device (ROMEO: is 6 prompt tokens; -n 16 positions: the prompt's step, then 10 decode steps).
  const fs::path infer_trace = scratch() / "infer_trace.json";
  Run g = run_tpcli("infer --model " + (scratch() / "run" / "latest.safetensors").string() +
                    " -i \"ROMEO:\" -n 16 -t 0 --devices 2 --trace " + infer_trace.string());
  INFO("infer stderr: " << g.err);
  REQUIRE(g.code == 0);
  const std::string infer_json = slurp(infer_trace);
  for (int device = 0; device < 2; ++device) {
    const std::string tid = "\"tid\":" + std::to_string(device) + ",";
    int forwards = 0, prefills = 0;
    std::istringstream lines(infer_json);
    for (std::string event; std::getline(lines, event);) {
      forwards += event.find(tid) != std::string::npos && event.find("\"name\":\"forward\"") != std::string::npos;
      prefills += event.find(tid) != std::string::npos && event.find("\"name\":\"prefill\"") != std::string::npos;
    }
    CHECK(prefills == 1);
    CHECK(forwards == 10);
  }

  // An unwritable trace path is refused before training, in one line.
  Run bad = run_tpcli("train " + path + " --trace /nonexistent/folder/trace.json");
  CHECK(bad.code == 2);
  CHECK(lines_of(bad.err) == 1);
  CHECK(bad.err.find("--trace /nonexistent/folder/trace.json: folder /nonexistent/folder does not exist") !=
        std::string::npos);
  CHECK(bad.err.find("step ") == std::string::npos);
}

TEST_CASE("tpcli export --to llama2c: the .bin gives the same greedy tokens in infer") {
  tpcli::testing::require_shared("data/tok512.bin");
  const std::string tok = tpcli::testing::shared_path("data/tok512.bin");
  fs::remove_all(scratch() / "run");
  const std::string path = write_config("bpe.toml", config_text("data = 1, model = 2", ""));
  Run r = run_tpcli("train " + path + " --set data.tokenizer=" + tok + " --set model.vocab_size=512");
  INFO("train stderr: " << r.err);
  REQUIRE(r.code == 0);
  const std::string ckpt = (scratch() / "run" / "latest.safetensors").string();
  const std::string bin = (scratch() / "exported.bin").string();
  Run e = run_tpcli("export --to llama2c --model " + ckpt + " --out " + bin);
  INFO("export stderr: " << e.err);
  REQUIRE(e.code == 0);
  Run a = run_tpcli("infer --model " + ckpt + " -z " + tok + " -i \"Once upon a time\" -n 24 -t 0");
  Run b = run_tpcli("infer --model " + bin + " -z " + tok + " -i \"Once upon a time\" -n 24 -t 0");
  INFO("infer stderr: " << a.err << " / " << b.err);
  REQUIRE(a.code == 0);
  REQUIRE(b.code == 0);
  CHECK(a.out.rfind("Once upon a time", 0) == 0);
  CHECK(a.out == b.out);
}

TEST_CASE("tpcli train prints the bytes per device that tpcli inspect shows, for the same config and mesh") {
  fs::remove_all(scratch() / "run");
  const std::string path = write_config("memory.toml", config_text("data = 2, model = 2"));
  for (const std::string sets : {"", " --set train.shard_optimizer=true --set train.recompute=true --set train.grad_accum=2",
                                  " --set mesh.sequence_parallel=true --set train.grad_accum=2"}) {
    Run t = run_tpcli("train " + path + " --set train.sample_tokens=0" + sets);
    Run i = run_tpcli("inspect " + path + sets);
    INFO("train stderr: " << t.err << "\ninspect: " << i.out);
    REQUIRE(t.code == 0);
    REQUIRE(i.code == 0);
    const auto at = t.err.find("memory per device (device 0): parameters ");
    REQUIRE(at != std::string::npos);
    const std::string line = t.err.substr(at, t.err.find('\n', at) - at);
    CHECK(i.out.find(line) != std::string::npos);
    CHECK((line.find("(sequence parallel)") != std::string::npos) == (sets.find("sequence_parallel") != std::string::npos));
  }
}

namespace {

// The loss of the first step in a run's metrics.jsonl, as written.
std::string first_loss(const fs::path& run_dir) {
  const std::string text = slurp(run_dir / "metrics.jsonl");
  const size_t at = text.find("\"loss\": ");
  if (at == std::string::npos) return "";
  return text.substr(at + 8, text.find_first_of(",}", at) - at - 8);
}

}  // namespace

TEST_CASE("tpcli train: model.init_from takes a Hugging Face directory, f32 gives the same first loss, bf16 a close one") {
  fs::remove_all(scratch() / "run");
  const std::string path = write_config("hf.toml", config_text("data = 1, model = 2"));
  Run r = run_tpcli("train " + path);
  INFO("train stderr: " << r.err);
  REQUIRE(r.code == 0);
  const std::string ckpt = (scratch() / "run" / "latest.safetensors").string();
  // Issue 25: a dim beside init_from was silently ignored; the dims come from the checkpoint.
  Run dims = run_tpcli("train " + path + " --set model.init_from='" + ckpt + "' --set train.steps=1");
  CHECK(dims.code == 2);
  CHECK(lines_of(dims.err) == 1);
  CHECK(dims.err.find(path + ":4:7: model.dim cannot be set with model.init_from (the dims come from " + ckpt + ")") !=
        std::string::npos);
  const std::string init_path = write_config("hf-init.toml", config_text("data = 1, model = 2", "", ""));
  Run set_dim = run_tpcli("train " + init_path + " --set model.init_from='" + ckpt + "' --set model.dim=128");
  CHECK(set_dim.code == 2);
  CHECK(set_dim.err.find("--set model.dim=128: model.dim cannot be set with model.init_from") != std::string::npos);
  for (const char* dtype : {"f32", "bf16"}) {
    Run e = run_tpcli("export --to hf --model " + ckpt + " --out " + (scratch() / (std::string("hf-") + dtype)).string() + " --dtype " + dtype);
    INFO("export stderr: " << e.err);
    REQUIRE(e.code == 0);
  }
  auto loss_from = [&](const std::string& init, const std::string& name) {
    const fs::path out = scratch() / name;
    fs::remove_all(out);
    Run t = run_tpcli("train " + init_path + " --set model.init_from='" + init + "' --set train.steps=1 --set train.out_dir='" +
                      out.string() + "'");
    INFO("train from " << init << ": " << t.err);
    CHECK(t.code == 0);
    return first_loss(out);
  };
  const std::string from_file = loss_from(ckpt, "from-file");
  REQUIRE(!from_file.empty());
  CHECK(loss_from((scratch() / "hf-f32").string(), "from-hf-f32") == from_file);
  const std::string from_bf16 = loss_from((scratch() / "hf-bf16").string(), "from-hf-bf16");
  REQUIRE(!from_bf16.empty());
  CHECK(std::abs(std::stod(from_bf16) / std::stod(from_file) - 1) < 0.02);
}

TEST_CASE("tpcli train fine-tunes Qwen2 and Qwen3 directories (biases, q/k norms): full, exported back to the "
          "architecture it read with the same logits, and LoRA") {
  tpcli::testing::require_shared("reference/hf-archs/qwen3/model.safetensors");
  const std::string tok = tpcli::testing::shared_path("data/tok512.bin");
  for (const std::string arch : {"qwen2", "qwen3"}) {
    const std::string dir = tpcli::testing::shared_path("reference/hf-archs/" + arch);
    const std::string path = write_config(arch + ".toml", config_text("data = 1, model = 2", "", ""));
    const fs::path out = scratch() / (arch + "-run");
    fs::remove_all(out);
    const std::string run = " --set model.init_from='" + dir + "' --set data.tokenizer=" + tok +
                            " --set train.sample_tokens=0 --set train.out_dir='" + out.string() + "'";
    Run full = run_tpcli("train " + path + run);
    INFO(arch << " train stderr: " << full.err);
    REQUIRE(full.code == 0);
    const std::string ckpt = (out / "latest.safetensors").string(), hf = (scratch() / (arch + "-hf")).string();
    Run e = run_tpcli("export --to hf --dtype f32 --model " + ckpt + " --out " + hf);
    INFO("export stderr: " << e.err);
    REQUIRE(e.code == 0);
    CHECK(slurp(fs::path(hf) / "config.json").find(arch == "qwen2" ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM") !=
          std::string::npos);
    Run from_ckpt = run_tpcli("logits --model " + ckpt + " --tokens 5,70,300,12");
    Run from_hf = run_tpcli("logits --model " + hf + " --tokens 5,70,300,12");
    Run base = run_tpcli("logits --model " + dir + " --tokens 5,70,300,12");
    REQUIRE(from_ckpt.code == 0);
    CHECK(from_hf.out == from_ckpt.out);
    CHECK(base.out != from_ckpt.out);  // the steps changed the model
    Run lora = run_tpcli("train " + path + run + " --set train.lora.rank=4");
    INFO("LoRA stderr: " << lora.err);
    CHECK(lora.code == 0);
    CHECK(fs::exists(out / "adapter" / "adapter_model.safetensors"));
  }
}

TEST_CASE("train.lora.init_from starts the adapters from a PEFT folder bit for bit, taking its rank, and a written rank that "
          "differs is a one-line error") {
  tpcli::testing::require_shared("data/stories260K.bin");
  const std::string path = write_config("lora-from.toml", config_text("data = 1, model = 2", "", ""));
  const fs::path first = scratch() / "lora-first", second = scratch() / "lora-second";
  fs::remove_all(first);
  fs::remove_all(second);
  const std::string base = " --set model.init_from='" + tpcli::testing::shared_path("data/stories260K.bin") +
                           "' --set data.tokenizer=" + tpcli::testing::shared_path("data/tok512.bin") +
                           " --set train.sample_tokens=0 --set train.lora.rank=4";
  Run a = run_tpcli("train " + path + base + " --set train.out_dir='" + first.string() + "'");
  INFO("first run: " << a.err);
  REQUIRE(a.code == 0);
  // A second run from the first's PEFT folder, its rank not written: steps of lr ~0 keep the adapters.
  const std::string from = " --set train.lora.init_from='" + (first / "adapter").string() + "'";
  Run b = run_tpcli("train " + path + base.substr(0, base.find(" --set train.lora.rank")) + from +
                    " --set train.lr=1e-30 --set train.min_lr=0 --set train.weight_decay=0 --set train.out_dir='" +
                    second.string() + "'");
  INFO("second run: " << b.err);
  REQUIRE(b.code == 0);
  const auto want = tpcli::testing::read_raw(first / "latest.safetensors");
  const auto got = tpcli::testing::read_raw(second / "latest.safetensors");
  int adapters = 0;
  for (const auto& [name, h] : want.header.items()) {
    if (!name.starts_with("layers.")) continue;  // the adapters, not their moments
    ++adapters;
    INFO(name);
    CHECK(got.f32(name) == want.f32(name));
  }
  CHECK(adapters == 2 * 7 * 5);  // stories260K: 5 blocks of 7 linears
  Run other_rank = run_tpcli("train " + path + base + from + " --set train.lora.rank=8");
  CHECK(other_rank.code == 2);
  CHECK(lines_of(other_rank.err) == 1);
  CHECK(other_rank.err.find("--set train.lora.rank=8: the adapter in " + (first / "adapter").string() + " has rank 4") !=
        std::string::npos);
}

namespace {

// "parameters X MB" of the memory line `tpcli train` prints at start (device 0's bytes).
std::string parameter_megabytes(const std::string& err) {
  const std::string key = "memory per device (device 0): parameters ";
  const size_t at = err.find(key);
  if (at == std::string::npos) return "";
  return err.substr(at + key.size(), err.find(',', at) - at - key.size());
}

}  // namespace

// [train.lora] on a Hugging Face directory keeps its base as stored: an MLX 4-bit directory (the
// checkpoint's f32 export quantized by tests/support/mlx_quantized_dir.h, in f32 as MLX quantizes
// an f32 model) gives the first loss and the memory of `tpcli quantize --bits 4` of the same
// checkpoint; a bf16 directory stays 16-bit. Without LoRA the MLX directory is converted to f32.
TEST_CASE("tpcli train: [train.lora] on an MLX-quantized or bf16 Hugging Face directory keeps the base packed") {
  const fs::path base_run = scratch() / "qlora-base";
  fs::remove_all(base_run);
  // Every matrix's input dimension a multiple of 32, so MLX and tpcli quantize every one.
  const std::string dims = "dim = 64\nhidden_dim = 128\nn_layers = 2\nn_heads = 4\nn_kv_heads = 2\nseq_len = 32\n";
  const std::string base_config = write_config("qlora-base.toml", config_text("data = 1, model = 2", "", dims));
  Run b = run_tpcli("train " + base_config + " --set train.out_dir='" + base_run.string() + "'");
  INFO("base train stderr: " << b.err);
  REQUIRE(b.code == 0);
  const std::string ckpt = (base_run / "latest.safetensors").string();
  const fs::path q4 = scratch() / "qlora-q4.safetensors", mlx4 = scratch() / "qlora-mlx4";
  const fs::path hf_f32 = scratch() / "qlora-hf-f32", hf_bf16 = scratch() / "qlora-hf-bf16";
  for (const fs::path& p : {q4, hf_f32, hf_bf16, mlx4}) fs::remove_all(p);
  for (const std::string& command : {"quantize --model " + ckpt + " --bits 4 --group-size 32 --out " + q4.string(),
                                     "export --to hf --model " + ckpt + " --out " + hf_f32.string() + " --dtype f32",
                                     "export --to hf --model " + ckpt + " --out " + hf_bf16.string() + " --dtype bf16"}) {
    Run r = run_tpcli(command);
    INFO(command << ": " << r.err);
    REQUIRE(r.code == 0);
  }
  tpcli::testing::write_mlx_dir(hf_f32, mlx4, 4, 32, tpcli::model::DType::F32);

  struct Trained {
    std::string first_loss, parameters;
  };
  auto train_from = [&](const fs::path& init, const std::string& name, bool lora) {
    const fs::path out = scratch() / name;
    fs::remove_all(out);
    const std::string lora_section = lora ? "[train.lora]\nrank = 4\n" : "";
    const std::string config = write_config(name + ".toml", config_text("data = 1, model = 2", lora_section, ""));
    Run t = run_tpcli("train " + config + " --set model.init_from='" + init.string() +
                      "' --set train.steps=2 --set train.out_dir='" + out.string() + "'");
    INFO("train from " << init << ": " << t.err);
    CHECK(t.code == 0);
    return Trained{first_loss(out), parameter_megabytes(t.err)};
  };
  const Trained from_q4 = train_from(q4, "qlora-from-q4", true), from_mlx4 = train_from(mlx4, "qlora-from-mlx4", true);
  const Trained from_f32 = train_from(hf_f32, "qlora-from-hf-f32", true);
  const Trained from_bf16 = train_from(hf_bf16, "qlora-from-hf-bf16", true);
  REQUIRE(!from_q4.first_loss.empty());
  REQUIRE(!from_q4.parameters.empty());
  CHECK(from_mlx4.first_loss == from_q4.first_loss);
  CHECK(from_mlx4.parameters == from_q4.parameters);
  CHECK(std::stod(from_mlx4.parameters) < std::stod(from_bf16.parameters));
  CHECK(std::stod(from_bf16.parameters) < std::stod(from_f32.parameters));
  // Full fine-tuning: the MLX directory's weights in f32, the same function as the packed base.
  const Trained full = train_from(mlx4, "qlora-full-from-mlx4", false);
  REQUIRE(!full.first_loss.empty());
  CHECK(std::abs(std::stod(full.first_loss) / std::stod(from_mlx4.first_loss) - 1) < 1e-4);
  CHECK(full.parameters == parameter_megabytes(b.err));  // the f32 model's, as when it was trained
}

// QLoRA takes no mixture-of-experts base yet: under [train.lora] a 16-bit MoE directory is
// converted to f32 as before, so LoRA trains on it (the same bytes as from the f32 directory).
TEST_CASE("tpcli train: [train.lora] on a bf16 mixture-of-experts directory trains on its f32 values") {
  tpcli::testing::require_shared("reference/hf-archs/mixtral/model.safetensors");
  const std::string f32 = tpcli::testing::shared_path("reference/hf-archs/mixtral");
  const fs::path bf16 = scratch() / "mixtral-bf16";
  fs::remove_all(bf16);
  Run e = run_tpcli("export --to hf --dtype bf16 --model " + f32 + " --out " + bf16.string());
  INFO("export stderr: " << e.err);
  REQUIRE(e.code == 0);
  const std::string lora_section = "[train.lora]\nrank = 4\n";
  const std::string path = write_config("moe-lora.toml", config_text("data = 1, model = 2", lora_section, ""));
  auto parameters_from = [&](const std::string& init) {
    const fs::path out = scratch() / "moe-lora-run";
    fs::remove_all(out);
    Run t = run_tpcli("train " + path + " --set model.init_from='" + init + "' --set data.tokenizer=" +
                      tpcli::testing::shared_path("data/tok512.bin") + " --set train.steps=1 --set train.sample_tokens=0" +
                      " --set train.out_dir='" + out.string() + "'");
    INFO("train from " << init << ": " << t.err);
    CHECK(t.code == 0);
    return parameter_megabytes(t.err);
  };
  const std::string from_f32 = parameters_from(f32);
  REQUIRE(!from_f32.empty());
  CHECK(parameters_from(bf16.string()) == from_f32);
}
