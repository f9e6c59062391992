// tpcli init --model-config models/NAME.toml --out PATH [--seed S] — a random-weight checkpoint of
// any shape: llama2.c format (PATH.bin, runs in llama2.c too) or safetensors (PATH.safetensors).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "config/model_config.h"
#include "config/run_config.h"
#include "formats/llama2c.h"
#include "formats/safetensors.h"
#include "model/random_init.h"

namespace tpcli::cli {

namespace {

struct InitFlags {
  std::string model_config;
  std::string out;
  uint64_t seed = 1337;
};

void run_init(const InitFlags& f) {
  const config::ModelSection section = config::load_model_config(f.model_config);
  if (!section.vocab_size)
    throw UsageError(f.model_config + ": vocab_size is not set (init needs every dim; add vocab_size = N)");
  const model::LlamaConfig config = config::model_from_config(section);
  const bool safetensors = f.out.ends_with(".safetensors");
  if (!safetensors && config.is_moe())
    throw UsageError(f.out + ": llama2.c files cannot hold a mixture-of-experts model: write a .safetensors file");
  const model::TensorWeights weights = model::random_weights(config, f.seed);
  try {
    if (safetensors) {
      formats::write_safetensors(f.out, weights, {{"init.seed", std::to_string(f.seed)}});
    } else {
      formats::write_llama2c(f.out, weights);
    }
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  std::fprintf(stderr, "wrote %s: %lld parameters (%.1f MB), seed %llu\n", f.out.c_str(),
               static_cast<long long>(config.parameter_count()), config.parameter_count() * 4 / 1e6,
               static_cast<unsigned long long>(f.seed));
}

void setup_init(CLI::App& sub) {
  auto flags = std::make_shared<InitFlags>();
  sub.add_option("--model-config", flags->model_config, "model shape (models/NAME.toml)")->required();
  sub.add_option("--out", flags->out, "checkpoint to write: .bin (llama2.c) or .safetensors")->required();
  sub.add_option("--seed", flags->seed, "random seed")->capture_default_str();
  sub.callback([flags] { run_init(*flags); });
}

const bool registered =
    register_command({"init", "Write a randomly initialised model checkpoint (llama2.c .bin or .safetensors)", setup_init});

}  // namespace

}  // namespace tpcli::cli
