#include "train/train_setup.h"

#include <filesystem>
#include <stdexcept>

#include "dist/zmq/zmq_backend.h"
#include "model/hf_model.h"
#include "model/llama2c.h"
#include "model/safetensors.h"
#include "model/weights_view.h"
#include "train/checkpoint.h"

namespace tpcli::train {

static dist::Mesh to_dist_mesh(const config::MeshSection& section) {
  std::vector<dist::MeshAxis> axes;
  for (const auto& a : section.axes) axes.push_back({a.name, a.size});
  if (axes.empty()) axes.push_back({section.tensor_axis, 1});
  return dist::Mesh(axes);
}

// A Hugging Face directory is read as f32 (16-bit or quantized weights converted on load): the
// model trains f32 parameters only.
static std::shared_ptr<const model::WeightSource> open_weights(const std::string& path) {
  if (std::filesystem::is_directory(path)) {
    auto view = std::make_shared<model::WeightsView>(std::make_unique<model::HfModelDir>(path));
    view->as_f32();
    return view;
  }
  if (path.ends_with(".safetensors")) return std::make_shared<model::SafetensorsFile>(path);
  return std::make_shared<model::Llama2cFile>(path);
}

// The zmq backend: this process is one rank of `tpcli launch` and runs its share of the mesh.
static void select_zmq(const config::RunConfig& config, Prepared& p) {
  using config::ConfigError;
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
  model::Metadata model_keys;
  model::config_to_metadata(o.model, model_keys);
  std::string model_text;
  for (const auto& [key, value] : model_keys) model_text += key + "=" + value + "\n";
  std::string config_text;
  try {
    config_text = read_text_file(config.path);
  } catch (const std::exception& e) {
    throw ConfigError(config.path + ": " + e.what());
  }
  zmq.config_hash = dist::fnv1a(model_text, dist::fnv1a(p.corpus_text, dist::fnv1a(config_text, zmq.config_hash)));
  dist::RunOptions run;
  dist::use_zmq_backend(run, zmq);
  o.make_backend = std::move(run.make_backend);
  o.local_ranks = std::move(run.local_ranks);
}

Prepared prepare(const config::RunConfig& config, bool resume,
                 const std::function<model::LlamaConfig(std::optional<int>)>& model_config) {
  using config::ConfigError;
  Prepared p;
  TrainOptions& o = p.options;
  const auto& t = config.train;

  // Data: the corpus and its tokenizer.
  if (!config.data.path) throw ConfigError(config.path + ": data.path is required to train (the corpus, a text file)");
  try {
    p.corpus_text = read_text_file(*config.data.path);
  } catch (const std::exception& e) {
    throw ConfigError(config.where("data.path") + ": " + e.what());
  }
  std::optional<TextTokenizer> tokenizer;
  if (config.data.tokenizer == config::TokenizerKind::Chars) tokenizer = TextTokenizer::chars(p.corpus_text);
  if (config.data.tokenizer == config::TokenizerKind::Bytes) tokenizer = TextTokenizer::bytes();
  std::optional<int> tokenizer_vocab;
  if (tokenizer) tokenizer_vocab = tokenizer->vocab_size();

  // Model: from init_from's checkpoint, or the [model] section.
  try {
    if (config.model.init_from) {
      o.init = open_weights(*config.model.init_from);
      o.model = o.init->config();
    } else {
      o.model = model_config(tokenizer_vocab);
    }
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    throw ConfigError(config.where("model.init_from") + ": " + e.what());
  }
  if (!tokenizer) {
    try {
      tokenizer = TextTokenizer::llama2c(config.data.tokenizer_path, o.model.vocab_size);
    } catch (const std::exception& e) {
      throw ConfigError(config.where("data.tokenizer") + ": " + e.what());
    }
  }
  o.tokenizer = std::make_shared<const TextTokenizer>(*tokenizer);
  try {
    o.corpus = std::make_shared<const Corpus>(split_corpus(tokenizer->encode(p.corpus_text)));
  } catch (const std::exception& e) {
    throw ConfigError(config.where("data.path") + ": " + e.what());
  }

  // Mesh and its roles.
  o.mesh = to_dist_mesh(config.mesh);
  if (config.mesh.backend == config::BackendKind::Zmq) {
    select_zmq(config, p);
  } else if (dist::ZmqConfig::in_env()) {
    // Under `tpcli launch` on threads, every rank would train the whole mesh into the same files.
    int processes = 1;
    try {
      processes = dist::ZmqConfig::from_env().world_size;
    } catch (const std::exception&) {
    }
    if (processes > 1)
      throw ConfigError(config.where("mesh.backend") + ": backend threads, but `tpcli launch` started " +
                        std::to_string(processes) +
                        " processes: each would train the whole mesh into the same out_dir (add --backend zmq)");
  }
  o.data_axis = config.mesh.data_axis;
  o.tensor_axis = config.mesh.tensor_axis;
  o.expert_axis = config.mesh.experts_axis();

  // Optimisation and output.
  o.steps = t.steps;
  o.batch_size = t.batch_size;
  o.seq_len = t.seq_len.value_or(o.model.seq_len);
  o.seed = t.seed;
  o.schedule = {t.lr, t.min_lr, t.warmup_steps, t.steps,
                t.decay == config::DecayKind::Cosine ? Decay::Cosine : Decay::Constant};
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
  o.resume = resume;
  o.metadata_note = config.path;

  try {
    check_options(o);
  } catch (const std::exception& e) {
    throw ConfigError(config.path + ": " + e.what());
  }
  if (resume && !std::filesystem::exists(latest_checkpoint(o.out_dir)))
    throw ConfigError(config.where("train.out_dir") + ": --resume: no checkpoint " + latest_checkpoint(o.out_dir));
  return p;
}

}  // namespace tpcli::train
