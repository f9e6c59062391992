// tpcli::config — the TOML schema of a run and its strict validation.
//
// A run config (configs/*.toml) has four sections, every one optional:
//
//   [mesh]  axes = { data = 2, model = 4 }   # ordered as written; ranks are row-major over them
//           data_axis = "data"  tensor_axis = "model"  expert_axis = <data_axis>
//           backend = "threads" | "zmq" | "mpi"
//           sequence_parallel = false  # true: training splits the token rows over the tensor axis
//   [model] config = "models/tiny.toml"      # dims from a model file (see load_model_config) ...
//           dim = 64 ...                     # ... and/or inline; inline keys override the file's
//           init_from = "path.bin"           # llama2.c .bin, tpcli .safetensors or a Hugging Face directory;
//                                            # its dims are the model's: config and dims beside it are errors
//   [data]  path = "corpus.txt"  tokenizer = "chars" | "bytes" | "path/tokenizer.bin"  shuffle = true
//           format = "text" | "shards" | "chat" | "completions" | "jsonl-text"
//                                        # text: one plain text file, split 90/10
//                                        # shards: path and val_path are globs of token shards
//           val_path = "DIR/*_val_*.bin" # (tpcli tokenize); tokenizer: the one that wrote them
//           # Supervised fine-tuning (train/sft_examples.h): path = "train.jsonl", val_path =
//           # "val.jsonl" (needed when train.eval_batches > 0), one JSON object per line:
//           #   chat         {"messages": [{"role": "system"|"user"|"assistant", "content": ...}]}
//           #   completions  {"prompt": ..., "completion": ...}
//           #   jsonl-text   {"text": ...}   (format = "text" stays a plain text corpus)
//           # tokenizer = a tokenizer.bin, a tokenizer.json or a Hugging Face model directory;
//           template = "chatml"              # chat: a chat format by name (text/chat_template.h),
//                                            # else tokenizer_config.json's beside the tokenizer
//           train_on_prompt = false          # true: the loss counts every token, not just the answers
//           truncate = false                 # true: cut examples longer than train.seq_len + 1 tokens
//                                            # (else they are an error naming FILE:LINE)
//   [train] steps, batch_size, seq_len, seed, lr, min_lr, warmup_steps, decay, weight_decay,
//           beta1, beta2, eps, grad_clip, eval_every, eval_batches, out_dir, log_every,
//           sample_tokens, save_every, grad_accum, recompute, shard_optimizer, bucket_kb,
//           overlap_buckets
//   [train.lora] rank = 8  alpha = 16  dropout = 0.0   # LoRA: the base (model.init_from) frozen
//           targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
//           layers = "all" | N                         # adapters on the last N blocks
//           init_from = "ADAPTER_DIR"                  # start from a PEFT adapter (its rank, ... unless written)
//
// A model file (models/*.toml) holds the model dims as TOP-LEVEL keys (no [model] header):
//   dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len, n_experts, top_k,
//   moe_aux_loss, expert_hidden_dim, capacity_factor, shared_classifier, norm_eps, rope_theta,
//   head_dim, qkv_bias, qk_norm, norm_topk_prob, dense_layers = [0, ...], hf_architecture = "...".
//
// Relative paths (model.config, model.init_from, data.path, data.tokenizer when a file) are
// resolved against the config file's folder first, then the current directory; train.out_dir is
// taken as written (relative to the current directory).
//
// Every problem is a ConfigError whose message is "FILE:LINE:COL: message" (or "FILE: message"
// when no position applies, "--set KEY=VALUE: message" for an override). The mesh's axes and links
// are distributed/'s own types (dist::MeshAxis, dist::AxisLink), checked against its bounds.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "distributed/links.h"
#include "distributed/mesh.h"

namespace tpcli::config {

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Where each key came from: "mesh.axes.model" -> "configs/x.toml:3:10". Lets later stages (the
// trainer checking that the mesh divides the heads, say) point at the line to fix.
class SourceMap {
 public:
  SourceMap() = default;
  explicit SourceMap(std::string file) : file_(std::move(file)) {}
  const std::string& file() const { return file_; }
  // "FILE:LINE:COL" of `key`, or "FILE" when the key was not written in the file.
  std::string where(std::string_view key) const;
  void set(std::string key, std::string location) { where_[std::move(key)] = std::move(location); }
  bool has(std::string_view key) const { return where_.find(std::string(key)) != where_.end(); }

 private:
  std::string file_;
  std::map<std::string, std::string, std::less<>> where_;
};

enum class BackendKind { Threads, Zmq, Mpi };

struct MeshSection {
  std::vector<dist::MeshAxis> axes;  // declaration order; empty = not given (one device)
  std::string data_axis = "data";    // splits the batch
  std::string tensor_axis = "model"; // splits the weights
  std::optional<std::string> expert_axis;  // splits the experts; not given = data_axis
  BackendKind backend = BackendKind::Threads;
  // [mesh.links] AXIS = { gb_per_s = 100, latency_us = 1, topology = "ring" }: the modelled link of
  // one axis (distributed/links.h), whose collectives then take at least their modelled time.
  dist::LinkSpec links;  // empty = not modelled
  bool sequence_parallel = false;    // training: Megatron-style sequence parallelism (model/trainable_llama.h)

  const std::string& experts_axis() const { return expert_axis ? *expert_axis : data_axis; }
  dist::Mesh mesh() const;                // the axes as a mesh (one device on tensor_axis when empty)
  int device_count() const;               // product of the axis sizes (1 when empty)
  int axis_size(std::string_view name) const;  // 1 when the axis is absent
  std::string axes_string() const;        // "data=2,model=4" ("" when empty)
};

// Model dims as written. Optional where "not given" matters: a dim may come from init_from's
// checkpoint or (vocab_size) from the tokenizer; config/model_config fills the rest.
struct ModelSection {
  std::optional<std::string> config;     // resolved path of the models/*.toml file, if any
  std::optional<std::string> init_from;  // resolved path of a checkpoint to start from
  std::optional<int> dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
  std::optional<int> n_experts, top_k, expert_hidden_dim;
  std::optional<double> moe_aux_loss, capacity_factor, norm_eps, rope_theta;
  std::optional<bool> shared_classifier;
  std::optional<int> head_dim;                  // HS when not dim / n_heads (Qwen3)
  std::optional<bool> qkv_bias, qk_norm;        // Qwen2's q/k/v biases, Qwen3's q/k norms
  std::optional<bool> norm_topk_prob;           // MoE: top-k gates renormalised
  std::optional<std::vector<int>> dense_layers; // MoE: blocks with a dense feed-forward, ascending, >= 0
  std::optional<std::string> hf_architecture;   // as written; cli/ checks it is one tpcli runs
  SourceMap source;  // keys without the "model." prefix: "dim" -> "models/tiny.toml:1:7"
};

enum class TokenizerKind { Chars, Bytes, File };

enum class DataFormat { Text, Shards, Chat, Completions, JsonlText };

// The formats of supervised fine-tuning examples (JSONL files, batched by length).
inline bool is_sft_format(DataFormat format) {
  return format == DataFormat::Chat || format == DataFormat::Completions || format == DataFormat::JsonlText;
}

struct DataSection {
  DataFormat format = DataFormat::Text;
  // Text: the resolved corpus path (must exist when given). Shards: a resolved glob pattern
  // matching at least one file; val_path likewise (shards only).
  std::optional<std::string> path;
  std::optional<std::string> val_path;
  TokenizerKind tokenizer = TokenizerKind::Chars;
  bool tokenizer_given = false;  // data.tokenizer was written (shards need it written)
  std::string tokenizer_path;  // resolved, when tokenizer == File
  bool shuffle = true;
  // Fine-tuning formats only (is_sft_format).
  std::optional<std::string> chat_template;  // data.template as written (chat); cli/ checks the name
  bool train_on_prompt = false;
  bool truncate = false;
};

enum class DecayKind { Cosine, Constant };

// The linears LoRA can adapt, by their Hugging Face module names (PEFT's target_modules).
inline const std::vector<std::string> LORA_MODULES = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                      "gate_proj", "up_proj", "down_proj"};

struct LoraSection {
  int rank = 8;
  double alpha = 16;
  double dropout = 0;
  std::vector<std::string> targets = LORA_MODULES;  // distinct, each one of LORA_MODULES
  int layers = 0;  // adapt the last N blocks; 0 = "all"
  // A PEFT adapter folder the adapters start from (mlx-lm's --resume-adapter-file); rank, alpha,
  // targets and layers not written beside it are the folder's.
  std::optional<std::string> init_from;
  std::set<std::string> written;  // the keys above the file (or --set) gave
};

struct TrainSection {
  int steps = 2000;
  int batch_size = 12;           // global batch, split over the data axis
  std::optional<int> seq_len;    // not given = the model's seq_len
  uint64_t seed = 1337;
  double lr = 1e-3;
  double min_lr = 1e-4;
  int warmup_steps = 100;
  DecayKind decay = DecayKind::Cosine;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double eps = 1e-8;
  double grad_clip = 1.0;        // 0 = off
  int eval_every = 250;          // 0 = never
  int eval_batches = 20;         // 0 = no validation at all
  std::string out_dir;           // default "runs/<config file stem>"
  int log_every = 10;
  int sample_tokens = 200;       // length of the sample generated at the end (0 = none)
  std::optional<int> save_every; // not given = at every evaluation and at the end
  int grad_accum = 1;            // micro-batches of batch_size rows per optimizer step
  bool recompute = false;        // activation checkpointing per transformer block
  bool shard_optimizer = false;  // ZeRO-1: AdamW moments split over the data axis
  int bucket_kb = 1024;          // data-parallel gradient collectives run per bucket of this size
  bool overlap_buckets = true;   // start a bucket's collective during backward, once its gradients are done
  std::optional<LoraSection> lora;  // [train.lora]: fine-tune adapters instead of every weight
};

struct RunConfig {
  std::string path;  // the config file as given
  MeshSection mesh;
  ModelSection model;
  DataSection data;
  TrainSection train;
  SourceMap source;  // full keys: "train.steps" -> "configs/x.toml:12:9"; "--set train.steps=5"

  std::string where(std::string_view key) const { return source.where(key); }
};

// Loads and validates a run config. `overrides` are "section.key=value" strings (--set), applied
// before validation; the value is parsed as a TOML value and, failing that, taken as a string.
// `apply_flags` (the command line's --devices, --mesh, ...: cli/common_flags.h) runs after the
// overrides and before the checks, so a role given by --set may name an axis --mesh adds.
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides = {},
                          const std::function<void(RunConfig&)>& apply_flags = {});

// Loads a models/*.toml file (top-level dims, validated for types and ranges).
ModelSection load_model_config(const std::string& path);

// True when `path` is a models/*.toml file (top-level dims, no sections) rather than a run config.
// Throws ConfigError when the file is missing or not valid TOML.
bool is_model_file(const std::string& path);

// Parses "data=2,model=4" (the --mesh flag). Throws ConfigError("--mesh VALUE: ...") on empty
// or duplicate names, sizes that are not integers >= 1, or a malformed list.
std::vector<dist::MeshAxis> parse_mesh_axes(std::string_view text);

// Replaces the mesh axes (from --devices / --mesh, which override the file) and re-checks the
// axis roles against them; `origin` names the flag in errors and in the source map.
void set_mesh_axes(RunConfig& config, std::vector<dist::MeshAxis> axes, const std::string& origin);

// Sets one axis's modelled link (the --link flag) and re-checks that the axis exists.
void set_link(RunConfig& config, const std::string& axis, const dist::AxisLink& link, const std::string& origin);

// Sets the backend from a flag value ("threads" | "zmq" | "mpi").
void set_backend(RunConfig& config, const std::string& value, const std::string& origin);

// Enum names, for printing.
std::string to_string(BackendKind kind);
std::string to_string(TokenizerKind kind);
std::string to_string(DataFormat format);  // "text", "shards", "chat", "completions", "jsonl-text"
std::string to_string(DecayKind kind);

}  // namespace tpcli::config
