// tpcli::config — a validated run config (config/run_config.h) turned into train::TrainOptions: corpus
// read and tokenized, model config resolved, initial weights opened, the backend chosen, every check
// done.
#pragma once

#include <string>

#include "config/run_config.h"
#include "train/loop.h"

namespace tpcli::config {

struct Prepared {
  train::TrainOptions options;
  std::string corpus_text;  // format "text": the corpus; "shards": each shard path and size (zmq ranks compare it)
};

// Every TrainOptions field the run config gives by itself: the mesh and its axis roles, the [train]
// section, data.shuffle and the config's path (metadata_note). Reads o.model (train.seq_len defaults
// to its seq_len); reads no file, opens nothing, checks nothing. prepare_training fills the options
// with it, and `tpcli inspect` sizes a run from it (train::memory_layout), so both read a config alike.
void set_config_fields(const RunConfig& config, train::TrainOptions& o);

// The model is init_from's checkpoint or the [model] section (config/model_config.h, vocab_size
// defaulting to the tokenizer's). Throws ConfigError (one line, naming the file and key) for
// anything that would make training fail: missing corpus, mesh that does not divide the heads or the
// batch, a tokenizer that does not fit the model, a mesh the launched processes do not match, ...
Prepared prepare_training(const RunConfig& config, bool resume);

}  // namespace tpcli::config
