#include "cli/model_file.h"

#include <filesystem>
#include <fstream>
#include <ostream>

#include "cli/commands.h"
#include "cli/inspect.h"
#include "model/hf_model.h"
#include "model/llama2c.h"
#include "model/safetensors.h"
#include "model/shard_plan.h"
#include "model/weights_view.h"

namespace tpcli::cli {

namespace {

bool looks_like_safetensors(const std::string& path) {
  if (path.ends_with(".safetensors")) return true;
  std::ifstream in(path, std::ios::binary);
  char head[9] = {};
  return in.read(head, 9) && head[8] == '{';
}

void describe_config(const model::LlamaConfig& c, std::ostream& out) {
  out << "  model      dim " << c.dim << ", hidden_dim " << c.hidden_dim << ", " << c.n_layers << " layers, "
      << c.n_heads << " heads (" << c.n_kv_heads << " kv), vocab " << c.vocab_size << ", seq_len " << c.seq_len
      << (c.shared_classifier ? ", shared classifier" : ", separate classifier") << "\n";
  out << "  parameters " << c.parameter_count() << " (" << c.parameter_count() * 4 / 1e6 << " MB as f32)\n";
}

const bool hf_inspector_registered = register_inspector(
    {"Hugging Face model directory", [](const std::string& path) { return model::is_hf_model_dir(path); },
     [](const std::string& path, std::ostream& out) {
       try {
         model::HfModelDir dir(path);
         out << path << ": Hugging Face model directory (" << dir.hf_config().architecture << ", "
             << (dir.hf_config().torch_dtype.empty() ? "dtype not stated" : dir.hf_config().torch_dtype) << ")\n";
         describe_config(dir.config(), out);
         if (const auto& q = dir.config().quantization)
           out << "  quantized  " << q->mode << ", " << q->bits << " bits, groups of " << q->group_size << "\n";
       } catch (const std::runtime_error& e) {
         throw UsageError(e.what());
       }
     }});

const bool inspector_registered = register_inspector(
    {"model checkpoint",
     [](const std::string& path) { return path.ends_with(".bin") || path.ends_with(".safetensors"); },
     [](const std::string& path, std::ostream& out) {
       if (looks_like_safetensors(path)) {
         try {
           model::SafetensorsFile f(path);
           out << path << ": safetensors checkpoint, " << f.names().size() << " tensors\n";
           if (f.has_model_config()) describe_config(f.config(), out);
           for (const auto& [k, v] : f.metadata())
             if (!k.starts_with("model.")) out << "  " << k << " = " << v << "\n";
         } catch (const std::runtime_error& e) {
           throw UsageError(e.what());
         }
         return;
       }
       try {
         model::Llama2cFile f(path);
         out << path << ": llama2.c checkpoint\n";
         describe_config(f.config(), out);
       } catch (const std::runtime_error& e) {
         throw UsageError(e.what());
       }
     }});

}  // namespace

OpenedModel open_model(const std::string& path) {
  OpenedModel opened;
  try {
    if (std::filesystem::is_directory(path)) {
      auto dir = std::make_unique<model::HfModelDir>(path);
      opened.hf_dir = path;
      opened.bos_token_id = dir->hf_config().bos_token_id;
      opened.eos_token_ids = dir->hf_config().eos_token_ids;
      opened.weights = std::move(dir);
    } else if (looks_like_safetensors(path)) {
      auto file = std::make_unique<model::SafetensorsFile>(path);
      file->config();  // a checkpoint without a model config is an input error here
      if (auto it = file->metadata().find("tokenizer"); it != file->metadata().end()) {
        std::filesystem::path tok(it->second);
        if (tok.is_relative()) tok = std::filesystem::path(path).parent_path() / tok;
        opened.tokenizer = tok.string();
      }
      opened.metadata = file->metadata();
      opened.weights = std::move(file);
    } else {
      opened.weights = std::make_unique<model::Llama2cFile>(path);
    }
  } catch (const std::runtime_error& e) {
    throw UsageError(e.what());
  }
  return opened;
}

void apply_load_flags(OpenedModel& opened, const std::string& dtype, int context) {
  if (dtype != "auto" && dtype != "f32") throw UsageError("--dtype " + dtype + ": expected auto or f32");
  if (context < 0) throw UsageError("--context " + std::to_string(context) + " must be >= 0");
  if (context == 0 && opened.hf_dir) context = DEFAULT_HF_CONTEXT;  // 128K-position models: no 8 GB KV cache
  if (dtype == "auto" && (context == 0 || context >= opened.weights->config().seq_len)) return;
  auto view = std::make_unique<model::WeightsView>(std::move(opened.weights));
  if (dtype == "f32") view->as_f32();
  if (context > 0) view->limit_context(context);
  opened.weights = std::move(view);
}

OpenedModel open_model(const std::string& path, const dist::Mesh& mesh) {
  OpenedModel opened = open_model(path);
  try {
    model::check_tensor_devices(opened.weights->config(), mesh.axis_size("model"));
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  return opened;
}

}  // namespace tpcli::cli
