// tpcli::train — a validated run config (config/run_config.h) turned into TrainOptions: corpus
// read and tokenized, model config resolved, initial weights opened, every check done.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "config/run_config.h"
#include "train/loop.h"

namespace tpcli::train {

struct Prepared {
  TrainOptions options;
  std::string corpus_text;  // format "text": the corpus; "shards": each shard path and size (zmq ranks compare it)
};

// model_config(tokenizer_vocab): the [model] section as a LlamaConfig (cli/model_from_config.h),
// with vocab_size defaulting to the tokenizer's. Throws config::ConfigError (one line, naming the
// file and key) for anything that would make training fail: missing corpus, mesh that does not
// divide the heads or the batch, a tokenizer that does not fit the model, ...
Prepared prepare(const config::RunConfig& config, bool resume,
                 const std::function<model::LlamaConfig(std::optional<int> tokenizer_vocab)>& model_config);

}  // namespace tpcli::train
