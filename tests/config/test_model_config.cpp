// config/model_config: a [model] section as a model::LlamaConfig, with defaults, and errors that
// point at the line of the key they are about.
#include <catch2/catch.hpp>
#include <string>

#include "config/model_config.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

using tpcli::config::ConfigError;
using tpcli::config::load_model_config;
using tpcli::config::model_from_config;
using tpcli::testing::error_of;
using tpcli::testing::TempDir;

TEST_CASE("model_from_config: n_kv_heads defaults to n_heads, vocab_size to the tokenizer's") {
  TempDir dir;
  const std::string path = dir.write("m.toml", "dim = 64\nhidden_dim = 172\nn_layers = 2\nn_heads = 4\nseq_len = 64\n");
  const auto c = model_from_config(load_model_config(path), 65);
  CHECK(c.dim == 64);
  CHECK(c.hidden_dim == 172);
  CHECK(c.n_layers == 2);
  CHECK(c.n_kv_heads == 4);
  CHECK(c.vocab_size == 65);
  CHECK(c.seq_len == 64);
  CHECK_FALSE(c.is_moe());
  CHECK(error_of<ConfigError>([&] { model_from_config(load_model_config(path)); }) ==
        path + ": model.vocab_size is missing (set it in [model] or in the file named by model.config)");
}

TEST_CASE("model_from_config: errors name the key's line") {
  TempDir dir;
  const std::string heads = dir.write("heads.toml", "dim = 64\nhidden_dim = 172\nn_layers = 2\nn_heads = 3\nvocab_size = 65\nseq_len = 64\n");
  CHECK(error_of<ConfigError>([&] { model_from_config(load_model_config(heads)); }).starts_with(heads + ":4:"));
  const std::string small = dir.write("small.toml", "dim = 64\nhidden_dim = 172\nn_layers = 2\nn_heads = 4\nvocab_size = 65\nseq_len = 64\n");
  CHECK(error_of<ConfigError>([&] { model_from_config(load_model_config(small), 100); }) ==
        small + ":5:14: vocab_size = 65 is smaller than the tokenizer's 100 tokens");
  const std::string dense_moe = dir.write("moe.toml", "dim = 64\nhidden_dim = 172\nn_layers = 2\nn_heads = 4\nvocab_size = 65\nseq_len = 64\ntop_k = 2\n");
  CHECK(error_of<ConfigError>([&] { model_from_config(load_model_config(dense_moe)); }) ==
        dense_moe + ":7:9: top_k applies to mixture-of-experts models only: set n_experts >= 1 too");
  const std::string arch = dir.write("arch.toml", "dim = 64\nhidden_dim = 172\nn_layers = 2\nn_heads = 4\nvocab_size = 65\nseq_len = 64\nhf_architecture = \"GPT2\"\n");
  CHECK(error_of<ConfigError>([&] { model_from_config(load_model_config(arch)); }).starts_with(arch + ":7:19: hf_architecture = \"GPT2\" must be one of"));
}
