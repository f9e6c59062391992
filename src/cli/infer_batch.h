// tpcli::cli — `tpcli infer --batch prompts.jsonl [--parallel N]`: many prompts through one model
// through the batched engine (engine/batch_engine.h: continuous batching, a paged KV pool, prefix
// sharing), results as JSONL in input order.
//
// Each input line is a JSON object: {"prompt": TEXT} or {"messages": [{"role", "content"}...]} (the
// tokenizer's chat template, with the assistant's opening), and optionally "max_tokens",
// "temperature", "top_p", "seed" (else -n, -t, -p, -s), the server's "top_k", "min_p",
// "presence_penalty", "frequency_penalty", "repetition_penalty" and "logit_bias" (else --top-k,
// --min-p, ...; engine/sampling_params.h) and "stop" (a string or a list: the text
// ends before the first one, matched across token boundaries). A line also ends at an
// end-of-generation token (engine/end_of_generation.h, as in serve). Each output line: {"index", "text",
// "tokens", "finish_reason": "stop" | "length" | "error"}; an "error" line (its logits were not
// finite) says why under "error", the others run on, and the run exits 1 at the end naming how many
// failed. A bad line is a one-line error naming the file, the line and the key (an unknown key
// too), before any generation.
//
// Memory follows --parallel, not the file's length: the file is read once to check every line,
// then again as the engine has room for lines; a finished line's result is printed as soon as the
// lines before it are out, and forgotten. A line is at most files::MAX_LINE_BYTES.
#pragma once

#include <string>

#include "cli/model_file.h"
#include "cli/tokenizer_setup.h"
#include "distributed/mesh.h"
#include "distributed/runtime.h"
#include "engine/batch_engine.h"

namespace tpcli::cli {

struct BatchInferOptions {
  std::string jsonl;           // --batch FILE
  std::string tokenizer_path;  // a tokenizer.json, a directory holding one, or a llama2.c tokenizer.bin
  ChatTemplateFlags chat_template;  // the template of "messages" lines
  int max_tokens = 256;        // the defaults of lines that do not say
  float temperature = 1.0f, topp = 0.9f;
  unsigned long long seed = 1;
  engine::SamplingParams sampling;  // --top-k, --min-p, --presence-penalty, ...
  engine::EngineOptions engine;  // --parallel, --kv-memory, --kv-blocks, --step-tokens
};

void run_infer_batch(const BatchInferOptions& o, const OpenedModel& opened, const model::Placement& placement,
                     const dist::RunOptions& run_options);

}  // namespace tpcli::cli
