#include "config/train_setup.h"

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "config/model_config.h"
#include "distributed/mpi/mpi_backend.h"
#include "distributed/zmq/zmq_backend.h"
#include "formats/hf_model.h"
#include "formats/llama2c.h"
#include "formats/peft_adapter.h"
#include "formats/safetensors.h"
#include "model/lora_adapter.h"
#include "model/trainable_llama.h"
#include "model/weights_view.h"
#include "formats/gguf_vocabulary.h"
#include "train/checkpoint.h"
#include "train/sft_examples.h"
#include "train/token_shards.h"

namespace tpcli::config {

using namespace tpcli::train;

// A Hugging Face directory is read as stored when LoRA adapts it: a 16-bit or MLX-quantized base
// stays packed (QLoRA), as a `tpcli quantize`d checkpoint does. Full fine-tuning trains f32
// parameters only, so without LoRA its weights are converted (dequantized) to f32 on load; so are
// a mixture-of-experts model's under LoRA, whose packed experts have no backward yet (QLoRA
// refuses them), so that LoRA trains on its f32 values as before.
static std::shared_ptr<const model::WeightSource> open_weights(const std::string& path, bool lora) {
  if (std::filesystem::is_directory(path)) {
    auto dir = std::make_unique<formats::HfModelDir>(path);
    if (lora && !dir->config().is_moe()) return dir;
    auto view = std::make_shared<model::WeightsView>(std::move(dir));
    view->as_f32();
    return view;
  }
  if (path.ends_with(".safetensors")) return std::make_shared<formats::SafetensorsFile>(path);
  return std::make_shared<formats::Llama2cFile>(path);
}

// The zmq backend: this process is one rank of `tpcli launch` and runs its share of the mesh.
static void select_zmq(const RunConfig& config, Prepared& p) {
  TrainOptions& o = p.options;
  dist::ZmqConfig zmq;
  try {
    zmq = dist::ZmqConfig::from_env();
  } catch (const std::exception& e) {
    throw ConfigError(config.where("mesh.backend") + ": " + e.what());
  }
  const int P = zmq.world_size, K = zmq.devices_per_process, N = o.mesh.size();
  if (P * K != N)
    throw ConfigError(config.where("mesh.axes") + ": mesh " + o.mesh.to_string() + " has " + std::to_string(N) +
                      " devices but `tpcli launch` started " + std::to_string(P) + " processes x " +
                      std::to_string(K) + " devices per process (launch with -n P --devices-per-process K, P*K = " +
                      std::to_string(N) + ")");
  // Every rank reads the config, the corpus and the model on its own: the coordinator refuses to
  // start ranks that disagree on any of them (the command line is already in the hash).
  formats::Metadata model_keys;
  formats::config_to_metadata(o.model, model_keys);
  std::string model_text;
  for (const auto& [key, value] : model_keys) model_text += key + "=" + value + "\n";
  std::string config_text;
  try {
    config_text = read_text_file(config.path);
  } catch (const std::exception& e) {
    throw ConfigError(config.path + ": " + e.what());
  }
  zmq.config_hash = dist::fnv1a(model_text, dist::fnv1a(p.corpus_text, dist::fnv1a(config_text, zmq.config_hash)));
  dist::use_zmq_backend(o.run, zmq);
}

// The tokenizer of the fine-tuning formats: data.tokenizer (a tokenizer.bin, a tokenizer.json or a
// Hugging Face directory), else model.init_from when it is a Hugging Face directory (its own).
static std::string sft_tokenizer_path(const RunConfig& config) {
  const DataSection& data = config.data;
  if (data.tokenizer == TokenizerKind::File) return data.tokenizer_path;
  std::error_code ec;
  if (!data.tokenizer_given && config.model.init_from && std::filesystem::is_directory(*config.model.init_from, ec))
    return *config.model.init_from;
  throw ConfigError(config.where(data.tokenizer_given ? "data.tokenizer" : "data.format") +
                            ": the fine-tuning formats need data.tokenizer = a tokenizer.bin, a tokenizer.json or a "
                            "Hugging Face model directory (the model's own tokenizer; default: model.init_from's "
                            "when it is a Hugging Face directory)");
}

// The corpus's tokenizer when the data alone decides it (chars, bytes); nullopt for a llama2.c
// tokenizer.bin, which is opened once the model's vocab_size is known. A text corpus is read into
// p.corpus_text; shards are only checked to be shards here (open_corpus maps them).
static std::optional<TextTokenizer> open_data(const RunConfig& config, Prepared& p) {
  const DataSection& data = config.data;
  if (!data.path) throw ConfigError(config.path + ": data.path is required to train (the corpus, a text file)");
  if (data.format == DataFormat::Shards) {
    if (!data.tokenizer_given || data.tokenizer == TokenizerKind::Chars)
      throw ConfigError(config.where(data.tokenizer_given ? "data.tokenizer" : "data.format") +
                        ": format = \"shards\" needs data.tokenizer = the one that wrote the shards (\"bytes\", a "
                        "tokenizer.bin or a tokenizer.json): a \"chars\" vocabulary comes from a text corpus");
    // Shards are never read into memory; the zmq ranks agree on their paths and sizes instead.
    for (const auto& pattern : {data.path, data.val_path})
      if (pattern)
        for (const std::string& path : glob_files(*pattern)) {
          std::error_code ec;  // not a file: open_corpus says so, naming it
          p.corpus_text += path + ":" + std::to_string(std::filesystem::file_size(path, ec)) + "\n";
        }
  } else if (is_sft_format(data.format)) {
    const std::string tokenizer = sft_tokenizer_path(config);
    // Read whole here only for the zmq ranks to compare (sft_examples reads them again, by line).
    for (const auto& [path, key] : {std::pair{data.path, "data.path"}, std::pair{data.val_path, "data.val_path"}})
      if (path) try {
          p.corpus_text += read_text_file(*path);
        } catch (const std::exception& e) {
          throw ConfigError(config.where(key) + ": " + e.what());
        }
    if (!TextTokenizer::is_hf_json(tokenizer)) return std::nullopt;  // a tokenizer.bin: once vocab_size is known
    try {
      return TextTokenizer::hf_json(tokenizer);
    } catch (const std::exception& e) {
      throw ConfigError(config.where(data.tokenizer_given ? "data.tokenizer" : "model.init_from") + ": " + e.what());
    }
  } else {
    try {
      p.corpus_text = read_text_file(*data.path);
    } catch (const std::exception& e) {
      throw ConfigError(config.where("data.path") + ": " + e.what());
    }
  }
  if (data.tokenizer == TokenizerKind::Chars) return TextTokenizer::chars(p.corpus_text);
  if (data.tokenizer == TokenizerKind::Bytes) return TextTokenizer::bytes();
  if (TextTokenizer::is_hf_json(data.tokenizer_path)) {  // its own vocabulary: the model's
    try {
      return TextTokenizer::hf_json(data.tokenizer_path);
    } catch (const std::exception& e) {
      throw ConfigError(config.where("data.tokenizer") + ": " + e.what());
    }
  }
  return std::nullopt;  // a tokenizer.bin: read once the model's vocab_size is known
}

// The training and validation splits: the text tokenized and split 90/10, or the shards mapped
// (validation: data.val_path; none = no evaluation, so train.eval_batches must be 0).
static Corpus open_corpus(const RunConfig& config, const std::string& text, const TextTokenizer& tokenizer,
                          int vocab_size) {
  const DataSection& data = config.data;
  if (data.format == DataFormat::Text) {
    try {
      return split_corpus(tokenizer.encode(text));
    } catch (const std::exception& e) {
      throw ConfigError(config.where("data.path") + ": " + e.what());
    }
  }
  Corpus corpus;
  auto open = [&](const std::string& pattern, const std::string& key) {
    try {
      return std::make_shared<const ShardTokens>(pattern, vocab_size);
    } catch (const std::exception& e) {
      throw ConfigError(config.where(key) + ": " + e.what());
    }
  };
  corpus.train = open(*data.path, "data.path");
  if (data.val_path) corpus.val = open(*data.val_path, "data.val_path");
  if (!corpus.val && config.train.eval_batches > 0)
    throw ConfigError(config.where("data.format") +
                      ": format = \"shards\" evaluates on data.val_path: set it (e.g. \"DIR/*_val_*.bin\") or set "
                      "train.eval_batches = 0");
  return corpus;
}

// The chat format of format = "chat": data.template by name, else the chat_template of the
// tokenizer_config.json beside data.tokenizer (a Hugging Face directory or tokenizer.json).
static text::ChatTemplate sft_chat_template(const RunConfig& config) {
  const DataSection& data = config.data;
  if (data.chat_template) {
    try {
      return text::chat_template_named(*data.chat_template);
    } catch (const std::exception& e) {
      throw ConfigError(config.where("data.template") + ": " + e.what());
    }
  }
  std::optional<std::string> source;
  const std::string tokenizer = sft_tokenizer_path(config);
  if (TextTokenizer::is_hf_json(tokenizer)) {
    try {
      source = formats::load_tokenizer(tokenizer).chat_template;
    } catch (const std::exception& e) {
      throw ConfigError(config.where("data.tokenizer") + ": " + e.what());
    }
  }
  if (!source)
    throw ConfigError(config.where("data.format") + ": format = \"chat\" needs a chat template: set data.template = \"NAME\" (" +
                      text::chat_template_names() + "), or use a tokenizer with a tokenizer_config.json chat_template");
  try {
    return text::chat_template_from_source(*source, tokenizer + " chat_template");
  } catch (const std::exception& e) {
    throw ConfigError(config.where("data.tokenizer") + ": " + e.what() + " (set data.template = \"NAME\")");
  }
}

// Fine-tuning formats: the examples of data.path and data.val_path, read, encoded with the run's
// tokenizer and fitted to train.seq_len (errors name FILE:LINE).
static std::shared_ptr<const SftData> sft_examples(const RunConfig& config, const TextTokenizer& tokenizer,
                                                   int seq_len) {
  const DataSection& data = config.data;
  SftEncoding encoding;
  encoding.format = data.format == DataFormat::Chat          ? SftFormat::Chat
                    : data.format == DataFormat::Completions ? SftFormat::Completions
                                                                     : SftFormat::Text;
  encoding.tokenizer = tokenizer.interface();
  encoding.chat_tokens = {encoding.tokenizer->bos_text(), encoding.tokenizer->eos_text()};
  if (encoding.format == SftFormat::Chat) encoding.chat_template = sft_chat_template(config);
  encoding.train_on_prompt = data.train_on_prompt;
  auto sft = std::make_shared<SftData>();
  try {
    sft->train = std::make_shared<const std::vector<EncodedExample>>(encode_sft_file(*data.path, encoding, seq_len, data.truncate));
    if (data.val_path)
      sft->val = std::make_shared<const std::vector<EncodedExample>>(encode_sft_file(*data.val_path, encoding, seq_len, data.truncate));
  } catch (const SftDataError& e) {
    throw ConfigError(e.what());  // "FILE:LINE: ..."
  }
  const std::string eos = encoding.tokenizer->eos_text();
  sft->pad_token = eos.empty() ? 0 : encoding.tokenizer->token_id(eos).value_or(0);
  if (!sft->val && config.train.eval_batches > 0)
    throw ConfigError(config.where("data.format") + ": fine-tuning evaluates on data.val_path (a JSONL file): set it or set "
                              "train.eval_batches = 0");
  return sft;
}

// The mpi backend: this process is one rank of mpirun and runs its share of the mesh.
static void select_mpi(const RunConfig& config, Prepared& p) {
  try {
    dist::use_mpi_backend(p.options.run, p.options.mesh.size());
  } catch (const std::exception& e) {
    throw ConfigError(config.where("mesh.backend") + ": " + e.what());
  }
}

// On the threads backend every process trains the whole mesh into the same out_dir: refused when a
// launcher (`tpcli launch`, mpirun) started several.
static void refuse_several_thread_processes(const RunConfig& config) {
  int processes = 1;
  std::string launcher = "`tpcli launch`", fix = "--backend zmq";
  if (dist::ZmqConfig::in_env()) {
    try {
      processes = dist::ZmqConfig::from_env().world_size;
    } catch (const std::exception&) {
    }
  } else if (const char* n = std::getenv("OMPI_COMM_WORLD_SIZE"); n && dist::started_by_mpi()) {
    processes = std::atoi(n);
    launcher = "mpirun";
    fix = "--backend mpi";
  }
  if (processes > 1)
    throw ConfigError(config.where("mesh.backend") + ": backend threads, but " + launcher + " started " +
                              std::to_string(processes) + " processes: each would train the whole mesh into the same out_dir (add " +
                              fix + ")");
}

void set_config_fields(const RunConfig& config, TrainOptions& o) {
  const TrainSection& t = config.train;
  o.mesh = config.mesh.mesh();
  o.data_axis = config.mesh.data_axis;
  o.tensor_axis = config.mesh.tensor_axis;
  o.expert_axis = config.mesh.experts_axis();
  o.sequence_parallel = config.mesh.sequence_parallel;

  o.steps = t.steps;
  o.batch_size = t.batch_size;
  o.seq_len = t.seq_len.value_or(o.model.seq_len);
  o.seed = t.seed;
  o.schedule = {t.lr, t.min_lr, t.warmup_steps, t.steps,
                t.decay == DecayKind::Cosine ? Decay::Cosine : Decay::Constant};
  o.adamw = {t.beta1, t.beta2, t.eps, t.weight_decay};
  o.grad_clip = t.grad_clip;
  o.eval_every = t.eval_every;
  o.eval_batches = t.eval_batches;
  o.out_dir = t.out_dir;
  o.save_every = t.save_every;
  o.log_every = t.log_every;
  o.sample_tokens = t.sample_tokens;
  o.shuffle = config.data.shuffle;
  o.grad_accum = t.grad_accum;
  o.recompute = t.recompute;
  o.shard_optimizer = t.shard_optimizer;
  o.bucket_elems = int64_t{t.bucket_kb} * 1024 / static_cast<int64_t>(sizeof(float));
  o.overlap_buckets = t.overlap_buckets;
  o.metadata_note = config.path;
}

// [train.lora] as the model takes it, checked against the model it adapts.
static model::LoraOptions lora_options(const RunConfig& config, const model::LlamaConfig& model) {
  const LoraSection& lora = *config.train.lora;
  if (!config.model.init_from)
    throw ConfigError(config.where("train.lora") + ": train.lora needs model.init_from (the model to adapt)");
  if (lora.layers > model.n_layers)
    throw ConfigError(config.where("train.lora.layers") + ": train.lora.layers = " + std::to_string(lora.layers) +
                              " but the model has " + std::to_string(model.n_layers) + " blocks");
  model::LoraOptions o;
  o.rank = lora.rank;
  o.alpha = lora.alpha;
  o.last_layers = lora.layers;
  o.dropout = lora.dropout;
  o.seed = config.train.seed;
  o.targets.clear();
  for (const std::string& module : lora.targets) o.targets.push_back(*model::lora_matrix_of(module));
  return o;
}

// [train.lora] init_from's PEFT folder, read against the model: its tensors (the adapters' first
// values), and `o` given the folder's rank, alpha, targets and blocks where the config wrote none
// (a written one that differs is an error naming the key).
static std::shared_ptr<const model::WeightSource> initial_adapters(const RunConfig& config, const model::LlamaConfig& c,
                                                                   model::LoraOptions& o) {
  const LoraSection& lora = *config.train.lora;
  const std::string where = config.where("train.lora.init_from");
  model::LoraAdapterSet set;
  try {
    set = formats::load_peft_adapter(*lora.init_from, c);
  } catch (const std::exception& e) {
    throw ConfigError(where + ": " + e.what());
  }
  const std::vector<int> blocks = model::adapted_layers(set);
  const int last = static_cast<int>(blocks.size());
  if (blocks.empty() || blocks.front() != c.n_layers - last)
    throw ConfigError(where + ": the adapter's blocks are not the model's last ones (tpcli trains the last N)");
  std::vector<std::string> targets;
  for (const std::string& module : set.targets) targets.push_back(*model::lora_matrix_of(module));
  auto adopt = [&](const char* key, auto& mine, const auto& theirs, const std::string& shown) {
    if (lora.written.count(key) && mine != theirs)
      throw ConfigError(config.where(std::string("train.lora.") + key) + ": the adapter in " + *lora.init_from +
                                " has " + key + " " + shown);
    mine = theirs;
  };
  std::ranges::sort(targets);
  std::vector<std::string> mine = o.targets;
  std::ranges::sort(mine);
  std::string modules;
  for (const std::string& m : set.targets) modules += (modules.empty() ? "" : ", ") + m;
  adopt("targets", mine, targets, "[" + modules + "]");
  o.targets = targets;
  adopt("rank", o.rank, set.rank, std::to_string(set.rank));
  std::ostringstream alpha;
  alpha << set.alpha;
  adopt("alpha", o.alpha, set.alpha, alpha.str());
  adopt("layers", o.last_layers, last == c.n_layers ? 0 : last, last == c.n_layers ? "all" : std::to_string(last));
  auto weights = std::make_shared<model::TensorWeights>(c);
  for (auto& [name, t] : set.tensors) weights->set(name, std::move(t));
  return weights;
}

// The tokens a llama2.c tokenizer.bin holds (its records, to the end of the file): the model's
// vocab_size when [model] leaves it out, as for a tokenizer.json.
static int llama2c_vocab_size(const RunConfig& config) {
  try {
    return formats::load_tokenizer(config.data.tokenizer_path).tokenizer->vocab_size();
  } catch (const std::exception& e) {
    throw ConfigError(config.where("data.tokenizer") + ": " + e.what());
  }
}

Prepared prepare_training(const RunConfig& config, bool resume) {
  Prepared p;
  TrainOptions& o = p.options;

  std::optional<TextTokenizer> tokenizer = open_data(config, p);
  std::optional<int> tokenizer_vocab;
  if (tokenizer && tokenizer->kind() != train::TokenizerKind::Llama2c) tokenizer_vocab = tokenizer->vocab_size();
  else if (!tokenizer && !config.model.init_from && !config.model.vocab_size) tokenizer_vocab = llama2c_vocab_size(config);

  // Model: from init_from's checkpoint, or the [model] section.
  try {
    if (config.model.init_from) {
      o.init = open_weights(*config.model.init_from, config.train.lora.has_value());
      o.base_name = *config.model.init_from;
      o.model = o.init->config();
    } else {
      o.model = model_from_config(config.model, tokenizer_vocab);
    }
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    throw ConfigError(config.where("model.init_from") + ": " + e.what());
  }
  if (config.train.lora) o.lora = lora_options(config, o.model);
  if (config.train.lora && config.train.lora->init_from) o.lora_init = initial_adapters(config, o.model, *o.lora);
  if (!tokenizer) {
    try {
      tokenizer = TextTokenizer::llama2c(config.data.tokenizer_path, o.model.vocab_size);
    } catch (const std::exception& e) {
      throw ConfigError(config.where("data.tokenizer") + ": " + e.what());
    }
  }
  o.tokenizer = std::make_shared<const TextTokenizer>(*tokenizer);
  if (!is_sft_format(config.data.format))
    o.corpus = std::make_shared<const Corpus>(open_corpus(config, p.corpus_text, *tokenizer, o.model.vocab_size));

  // Mesh, its roles, optimisation and output; then the transport.
  set_config_fields(config, o);
  if (is_sft_format(config.data.format)) o.sft = sft_examples(config, *tokenizer, o.seq_len);
  if (config.mesh.backend == BackendKind::Zmq) {
    select_zmq(config, p);
  } else if (config.mesh.backend == BackendKind::Mpi) {
    select_mpi(config, p);
  } else {
    refuse_several_thread_processes(config);
  }
  o.resume = resume;

  try {
    check_options(o);
  } catch (const std::exception& e) {
    throw ConfigError(config.path + ": " + e.what());
  }
  if (resume && !std::filesystem::exists(latest_checkpoint(o.out_dir)))
    throw ConfigError(config.where("train.out_dir") + ": --resume: no checkpoint " + latest_checkpoint(o.out_dir));
  return p;
}

}  // namespace tpcli::config
