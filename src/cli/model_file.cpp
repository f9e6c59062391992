#include "cli/model_file.h"

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>

#include "cli/commands.h"
#include "cli/inspect.h"
#include "formats/gguf_model.h"
#include "formats/hf_model.h"
#include "formats/llama2c.h"
#include "formats/gguf_adapter.h"
#include "formats/safetensors.h"
#include "model/llama.h"
#include "model/lora_adapter.h"
#include "model/packed_weights.h"
#include "model/shard_plan.h"
#include "model/weights_view.h"

namespace tpcli::cli {

namespace {

void describe_config(const model::LlamaConfig& c, std::ostream& out) {
  out << "  model      dim " << c.dim << ", hidden_dim " << c.hidden_dim << ", " << c.n_layers << " layers, "
      << c.n_heads << " heads (" << c.n_kv_heads << " kv), vocab " << c.vocab_size << ", seq_len " << c.seq_len
      << (c.shared_classifier ? ", shared classifier" : ", separate classifier") << "\n";
  out << "  parameters " << c.parameter_count() << " (" << c.parameter_count() * 4 / 1e6 << " MB as f32)\n";
}

// The stored format and the weight bytes each tensor-parallel device holds, for the device counts
// the model splits over (up to 8).
void describe_storage(const model::WeightSource& w, std::ostream& out) {
  const model::LlamaConfig& c = w.config();
  if (c.quantization)
    out << "  quantization " << model::weight_format(*c.quantization).name() << " (mode " << c.quantization->mode
        << ", bits " << c.quantization->bits << ", group_size " << c.quantization->group_size << ")\n";
  out << "  weight bytes per device (MB):";
  for (int devices = 1; devices <= std::min(8, c.n_heads); ++devices) {
    std::vector<model::ShardPlan> plans;
    try {
      plans = model::plan_all_shards(c, devices);
    } catch (const std::invalid_argument&) {
      continue;  // this count does not split the model
    }
    out << (devices == 1 ? " " : " | ") << devices << ":";
    for (const auto& plan : plans) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), " %.2f", static_cast<double>(model::shard_bytes(w, plan)) / 1e6);
      out << buf;
    }
  }
  out << "\n";
}

const bool hf_inspector_registered = register_inspector(
    {"Hugging Face model directory", [](const std::string& path) { return formats::is_hf_model_dir(path); },
     [](const std::string& path, std::ostream& out) {
       try {
         formats::HfModelDir dir(path);
         out << path << ": Hugging Face model directory (" << dir.hf_config().architecture << ", "
             << (dir.hf_config().torch_dtype.empty() ? "dtype not stated" : dir.hf_config().torch_dtype) << ")\n";
         describe_config(dir.config(), out);
         if (const auto& q = dir.config().quantization)
           out << "  quantized  " << q->mode << ", " << q->bits << " bits, groups of " << q->group_size << "\n";
       } catch (const std::runtime_error& e) {
         throw UsageError(e.what());
       }
     }});

// A GGUF file: its architecture and tensor types with counts, read from the container alone (so a
// file of an architecture tpcli does not run is still described), then the model tpcli reads.
void describe_gguf(const std::string& path, std::ostream& out) {
  const formats::gguf::GgufFile f(path);
  std::map<std::string, int> types;
  uint64_t bytes = 0;
  for (const auto& t : f.tensors()) {
    ++types[tensor::ggml_traits(t.type).name];
    bytes += t.bytes;
  }
  out << path << ": GGUF v" << f.version() << ", architecture " << f.string("general.architecture").value_or("(not stated)") << ", "
      << f.tensors().size() << " tensors (" << bytes / 1e6 << " MB):";
  for (const auto& [type, count] : types) out << " " << type << " x" << count;
  out << "\n";
  if (f.string("general.type") == "adapter") {  // convert_lora_to_gguf.py's file: no model to describe
    out << "  LoRA adapter (adapter.type " << f.string("adapter.type").value_or("(not stated)") << ", alpha "
        << f.number("adapter.lora.alpha").value_or(0) << "): run it as --adapter beside its base model\n";
    return;
  }
  const formats::GgufModel model(path);
  describe_config(model.config(), out);
  out << "  kept as stored: each tensor in its own type (a device whose columns cut a block holds the whole block)\n";
  describe_storage(model, out);
}

const bool gguf_inspector_registered = register_inspector(
    {"GGUF model file", [](const std::string& path) { return path.ends_with(".gguf"); },
     [](const std::string& path, std::ostream& out) {
       try {
         describe_gguf(path, out);
       } catch (const std::runtime_error& e) {
         throw UsageError(e.what());
       }
     }});

const bool inspector_registered = register_inspector(
    {"model checkpoint",
     [](const std::string& path) { return path.ends_with(".bin") || path.ends_with(".safetensors"); },
     [](const std::string& path, std::ostream& out) {
       if (formats::looks_like_safetensors(path)) {
         try {
           formats::SafetensorsFile f(path);
           out << path << ": safetensors checkpoint, " << f.names().size() << " tensors\n";
           if (f.has_model_config()) {
             describe_config(f.config(), out);
             describe_storage(f, out);
           }
           for (const auto& [k, v] : f.metadata())
             if (!k.starts_with("model.")) out << "  " << k << " = " << v << "\n";
         } catch (const std::runtime_error& e) {
           throw UsageError(e.what());
         }
         return;
       }
       try {
         formats::Llama2cFile f(path);
         out << path << ": llama2.c checkpoint\n";
         describe_config(f.config(), out);
         describe_storage(f, out);
       } catch (const std::runtime_error& e) {
         throw UsageError(e.what());
       }
     }});

}  // namespace

OpenedModel open_model(const std::string& path) {
  try {
    return formats::open(path);
  } catch (const std::runtime_error& e) {
    throw UsageError(e.what());
  }
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

void add_adapter_flag(CLI::App& sub, std::string& dir) {
  sub.add_option("--adapter", dir, "LoRA adapter, applied unmerged: a Hugging Face PEFT folder or a llama.cpp GGUF adapter file");
}

void add_int8_activations_flag(CLI::App& sub, bool& on) {
  sub.add_flag("--int8-activations", on,
               "8- and 4-bit affine weights: quantize activations to int8 per group and multiply integers (other "
               "formats unchanged)");
}

void apply_adapter(OpenedModel& opened, const std::string& dir) {
  if (dir.empty()) return;
  try {
    model::LoraAdapterSet set = formats::load_adapter(dir, opened.weights->config());
    opened.weights = std::make_unique<model::AdaptedWeights>(std::move(opened.weights), std::move(set), dir);
  } catch (const std::runtime_error& e) {
    throw UsageError(std::string("--adapter ") + e.what());
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--adapter ") + e.what());
  }
}

OpenedModel open_model(const std::string& path, const std::optional<tensor::WeightFormat>& convert) {
  OpenedModel opened = open_model(path);
  if (!convert) return opened;
  try {
    opened.original = std::move(opened.weights);
    opened.weights = std::make_unique<model::ConvertedWeights>(*opened.original, *convert);
  } catch (const std::invalid_argument& e) {
    throw UsageError(path + ": " + e.what());
  }
  return opened;
}

model::Placement place_model(const OpenedModel& opened, const std::string& path, const dist::Mesh& mesh,
                             const model::AxisRoles& roles) {
  try {
    return model::Placement(*opened.weights, mesh, roles);
  } catch (const std::invalid_argument& e) {
    throw UsageError(path + ": " + e.what());
  }
}

std::optional<tensor::WeightFormat> parse_quantize_flag(const std::string& quantize, int group_size) {
  if (quantize.empty()) return std::nullopt;
  if (quantize == "bf16") return tensor::WeightFormat::bf16();
  if (quantize == "f16") return tensor::WeightFormat::f16();
  if (quantize == "mxfp8") return tensor::WeightFormat::mxfp8();
  if (quantize == "4" || quantize == "8") return parse_quantization(std::stoi(quantize), group_size, "affine");
  throw UsageError("--quantize " + quantize + ": expected 4, 8, mxfp8, bf16 or f16");
}

tensor::WeightFormat parse_quantization(int bits, int group_size, const std::string& mode) {
  if (mode == "mxfp8") {
    if (bits != 8) throw UsageError("--bits " + std::to_string(bits) + ": mxfp8 is 8-bit");
    if (group_size != 32 && group_size != 64) throw UsageError("--group-size " + std::to_string(group_size) + ": mxfp8 groups are 32");
    return tensor::WeightFormat::mxfp8();
  }
  if (mode != "affine") throw UsageError("--mode " + mode + ": expected affine or mxfp8");
  if (bits != 4 && bits != 8) throw UsageError("--bits " + std::to_string(bits) + ": expected 4 or 8");
  if (group_size != 32 && group_size != 64 && group_size != 128)
    throw UsageError("--group-size " + std::to_string(group_size) + ": expected 32, 64 or 128");
  return tensor::WeightFormat::affine(bits, group_size);
}

namespace {

// Whether `a` and `b` name the same file (both exist).
bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::error_code ec;
  return std::filesystem::equivalent(a, b, ec) && !ec;
}

}  // namespace

void check_output_file(const std::string& out, const std::string& input, bool force) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(out, ec)) throw UsageError("--out " + out + ": is a folder; give a file path");
  bool is_input = same_file(out, input);
  if (!is_input && fs::is_directory(input, ec))
    for (const fs::directory_entry& entry : fs::directory_iterator(input, ec)) is_input = is_input || same_file(out, entry.path());
  if (is_input) throw UsageError("--out " + out + ": is the input model " + input + "; write to another file");
  if (!force && fs::exists(fs::symlink_status(out, ec)))
    throw UsageError("--out " + out + ": already exists; choose a new file or pass --force to replace it");
}

}  // namespace tpcli::cli
