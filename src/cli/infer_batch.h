// tpcli::cli — `tpcli infer --batch prompts.jsonl [--parallel N]`: many prompts through one model
// with continuous batching (model/batch_generate.h), results as JSONL in input order.
//
// Each input line is a JSON object: {"prompt": TEXT} or {"messages": [{"role", "content"}...]} (the
// tokenizer's chat template, with the assistant's opening), and optionally "max_tokens",
// "temperature", "top_p", "seed" (else -n, -t, -p, -s). Each output line: {"index", "text",
// "tokens", "finish_reason": "stop" | "length"}. A bad line is a one-line error naming the file, the
// line and the key, before any generation.
#pragma once

#include <string>

#include "cli/model_file.h"
#include "distributed/mesh.h"
#include "distributed/runtime.h"

namespace tpcli::cli {

struct BatchInferOptions {
  std::string jsonl;           // --batch FILE
  int parallel = 16;           // sequences decoding at once
  std::string tokenizer_path;  // a tokenizer.json, a directory holding one, or a llama2.c tokenizer.bin
  int max_tokens = 256;        // the defaults of lines that do not say
  float temperature = 1.0f, topp = 0.9f;
  unsigned long long seed = 1;
};

void run_infer_batch(const BatchInferOptions& o, const OpenedModel& opened, const dist::Mesh& mesh,
                     const dist::RunOptions& run_options);

}  // namespace tpcli::cli
