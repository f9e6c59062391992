// tpcli export --to llama2c --model CKPT --out PATH.bin — a checkpoint (tpcli .safetensors, e.g.
// runs/NAME/latest.safetensors, a llama2.c .bin or a Hugging Face directory) as a llama2.c .bin
// that llama2.c's `run` and `tpcli infer` load. An existing PATH.bin is refused unless --force; the
// input model never (the same file by inode, whatever the path).
// tpcli export --to peft --model runs/NAME/latest.safetensors --out DIR — the adapters of a LoRA
// training run ([train.lora]) as a Hugging Face PEFT adapter folder (model/lora_adapter.h), which
// infer --adapter, export --fuse and peft.PeftModel.from_pretrained read.
// tpcli export ... --adapter ADAPTER --fuse — any format with a LoRA adapter (a PEFT folder or a GGUF
// adapter file, formats/gguf_adapter.h) merged in
// (W + alpha/r * B @ A in f32; a quantized model is dequantized first and written unquantized).
// tpcli export --to hf --model CKPT --out DIR [--dtype bf16|f16|f32] [--shards K] — the same as a
// Hugging Face model directory (config.json, generation_config.json, model.safetensors or K shards
// with model.safetensors.index.json) that transformers and llama.cpp's convert_hf_to_gguf.py read,
// in the architecture the model was read as (formats/hf_names.h; LlamaForCausalLM for a Llama). DIR must be absent or empty; it is written as a sibling temporary
// folder renamed into place when complete, so a failure (a full disk) leaves no DIR at all.
// Only the weights travel: the optimizer state stays behind, and the tokenizer must be given
// separately (a chars or bytes vocabulary has no llama2.c tokenizer.bin; a model trained with a
// tokenizer.bin uses that file; no tokenizer.json is written for --to hf).
// tpcli export --to gguf --model CKPT --out FILE.gguf [--dtype f32|f16|bf16|q8_0] [-z TOKENIZER] — one
// GGUF v3 file that llama.cpp (and Ollama, LM Studio) load: the weights under llama.cpp's names
// (formats/gguf_writer.h), the tokenizer inside (cli/gguf_vocabulary.h: -z, else the model's own
// tokenizer.json or recorded tokenizer). Written through a temporary renamed into place; an
// existing FILE is refused unless --force. With --adapter DIR --fuse the merged model is written.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>

#include "cli/commands.h"
#include "cli/gguf_vocabulary.h"
#include "cli/model_file.h"
#include "files/atomic_file.h"
#include "formats/gguf_adapter.h"
#include "formats/gguf_writer.h"
#include "formats/hf_model.h"
#include "formats/llama2c.h"
#include "formats/peft_adapter.h"
#include "formats/safetensors.h"
#include "model/llama_config.h"
#include "model/lora_adapter.h"
#include "train/checkpoint_io.h"

namespace tpcli::cli {

namespace {

struct ExportFlags {
  std::string to = "llama2c";
  std::string model;
  std::string out;
  std::string dtype = "bf16";  // --to hf, gguf
  std::string tokenizer;       // --to gguf: -z FILE ("" = the model's own)
  int shards = 1;              // --to hf
  std::string adapter;         // --adapter PATH (with --fuse): a PEFT LoRA folder or GGUF LoRA file
  bool fuse = false;           // --fuse: write W + scale * B @ A for every adapted matrix
  bool force = false;          // --force: --to llama2c or gguf may replace an existing --out (never the input)
};

model::DType export_dtype(const std::string& name) {
  if (name == "bf16") return model::DType::BF16;
  if (name == "f16") return model::DType::F16;
  if (name == "f32") return model::DType::F32;
  throw UsageError("--dtype " + name + ": expected bf16, f16 or f32");
}

tensor::GgmlType gguf_type(const std::string& name) {
  if (name == "f32") return tensor::GgmlType::F32;
  if (name == "f16") return tensor::GgmlType::F16;
  if (name == "bf16") return tensor::GgmlType::BF16;
  if (name == "q8_0") return tensor::GgmlType::Q8_0;
  throw UsageError("--dtype " + name + ": expected f32, f16, bf16 or q8_0 for --to gguf");
}

// Each shard holds whole tensors, so there can be no more shards than tensors.
void check_shards(const ExportFlags& f, const model::LlamaConfig& config) {
  const size_t tensors = model::llama_parameters(config).size();
  if (static_cast<size_t>(f.shards) > tensors)
    throw UsageError("--shards " + std::to_string(f.shards) + ": the model has " + std::to_string(tensors) +
                     " tensors, and a shard holds whole tensors: at most " + std::to_string(tensors));
}

// The safetensors files written into `dir`, counted rather than assumed from --shards.
int safetensors_files(const std::string& dir) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    files += entry.path().extension() == ".safetensors" ? 1 : 0;
  return files;
}

// --out must be absent or an empty folder; one holding a model is named as such.
void require_new_out(const std::string& out) {
  try {
    files::require_new_folder(out);
  } catch (const std::runtime_error& e) {
    const std::filesystem::path dir(out);
    if (std::filesystem::exists(dir / "config.json") || std::filesystem::exists(dir / "model.safetensors") ||
        std::filesystem::exists(dir / "model.safetensors.index.json"))
      throw UsageError(out + ": already holds a model (config.json or safetensors): choose a new folder");
    throw UsageError(e.what());
  }
}

// The folder appears whole or not at all (files/atomic_file.h): a full disk or an error half way
// leaves no folder with some shards and no config.json.
void export_hf(const ExportFlags& f, const OpenedModel& opened) {
  check_shards(f, opened.weights->config());
  require_new_out(f.out);
  formats::HfExportOptions options;
  options.dtype = export_dtype(f.dtype);
  options.shards = f.shards;
  if (opened.hf_dir) {  // a Hugging Face model keeps its own token ids
    options.bos_token_id = opened.bos_token_id;
    options.eos_token_ids = opened.eos_token_ids;
  }
  int files = 0;
  try {
    files::write_directory_atomically(f.out, [&](const std::string& tmp) {
      formats::write_hf_model(tmp, *opened.weights, options);
      files = safetensors_files(tmp);
    });
  } catch (const std::invalid_argument& e) {
    throw UsageError(f.model + ": " + e.what());
  } catch (const std::runtime_error& e) {
    throw UsageError(e.what());
  }
  const std::string& architecture = opened.weights->config().hf_architecture;
  std::fprintf(stderr, "wrote %s (Hugging Face %s, %s, %d safetensors file%s, %lld parameters)\n", f.out.c_str(),
               architecture.empty() ? "LlamaForCausalLM" : architecture.c_str(), f.dtype.c_str(), files, files == 1 ? "" : "s",
               static_cast<long long>(opened.weights->config().parameter_count()));
}

// The tokenizer that goes inside: -z, else a Hugging Face directory's, else the one a checkpoint records.
std::string gguf_tokenizer_path(const ExportFlags& f, const OpenedModel& opened) {
  if (!f.tokenizer.empty()) return f.tokenizer;
  if (opened.hf_dir && std::filesystem::exists(std::filesystem::path(*opened.hf_dir) / "tokenizer.json")) return *opened.hf_dir;
  if (opened.tokenizer) return *opened.tokenizer;
  throw UsageError(f.model + ": no tokenizer recorded: --to gguf needs -z tokenizer.bin or tokenizer.json (llama.cpp reads the vocabulary from the file)");
}

void export_gguf(const ExportFlags& f, const OpenedModel& opened) {
  formats::GgufExportOptions options;
  options.type = gguf_type(f.dtype);
  options.name = std::filesystem::path(f.model).filename().replace_extension().string();
  const model::LlamaConfig& c = opened.weights->config();
  const std::optional<int> eos = opened.eos_token_ids.empty() ? std::nullopt : std::optional<int>(opened.eos_token_ids[0]);
  options.vocabulary = gguf_vocabulary(gguf_tokenizer_path(f, opened), c.vocab_size, opened.bos_token_id, eos);
  std::vector<std::string> kept_f16;
  try {
    kept_f16 = formats::write_gguf_model(f.out, *opened.weights, options);
  } catch (const std::invalid_argument& e) {
    throw UsageError(f.model + ": " + e.what());
  } catch (const std::runtime_error& e) {
    throw UsageError(e.what());
  }
  std::fprintf(stderr, "wrote %s (GGUF %s, %s, %lld parameters, tokenizer %s)\n", f.out.c_str(),
               formats::gguf_architecture_of(c).c_str(), f.dtype.c_str(), static_cast<long long>(c.parameter_count()),
               options.vocabulary->model.c_str());
  if (!kept_f16.empty())
    std::fprintf(stderr, "note: %zu matrices have rows that are not a multiple of 32 (e.g. %s) and were written F16, as llama.cpp's converter does\n",
                 kept_f16.size(), kept_f16[0].c_str());
}

// --fuse: the model seen merged with the adapter (model::LoraMergedWeights over the opened file,
// which moves to opened.original; `set` must outlive the export). A quantized base is dequantized,
// merged in f32 and written in the export's dtype: it is not quantized again (tpcli quantize can).
void fuse_adapter(const ExportFlags& f, OpenedModel& opened, std::optional<model::LoraAdapterSet>& set) {
  if (f.adapter.empty()) throw UsageError("--fuse needs --adapter PATH (a PEFT LoRA folder or a GGUF LoRA file)");
  try {
    set = formats::load_adapter(f.adapter, opened.weights->config());
    opened.original = std::move(opened.weights);
    opened.weights = std::make_unique<model::LoraMergedWeights>(*opened.original, *set, f.adapter);
  } catch (const std::runtime_error& e) {
    throw UsageError(std::string("--adapter ") + e.what());
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--adapter ") + e.what());
  }
  if (opened.original->config().quantization)
    std::fprintf(stderr, "note: %s is quantized: dequantized, merged in f32 and written unquantized (%s); `tpcli quantize` can quantize the result\n",
                 f.model.c_str(), f.to == "hf" || f.to == "gguf" ? f.dtype.c_str() : "f32");
}

// A LoRA training checkpoint (format tpcli-lora: the adapters "layers.L.wq.lora_a" ... beside their
// AdamW moments, lora.rank and lora.alpha, the base's config under "base.") as the adapter it holds.
model::LoraAdapterSet adapter_of_checkpoint(const formats::SafetensorsFile& file, model::LlamaConfig& base) {
  const formats::Metadata& meta = file.metadata();
  auto format = meta.find("format");
  if (format == meta.end() || format->second != train::LORA_FORMAT)
    throw UsageError(file.path() + ": not a LoRA training checkpoint (metadata format " + train::LORA_FORMAT +
                     "): --to peft exports the adapters a [train.lora] run saved");
  formats::Metadata config;
  for (const auto& [key, value] : meta)
    if (key.starts_with("base.")) config[key.substr(5)] = value;
  model::LoraAdapterSet set;
  try {
    base = formats::config_from_metadata(config, file.path());
    set.rank = std::stoi(meta.at("lora.rank"));
    set.alpha = std::stod(meta.at("lora.alpha"));
  } catch (const std::runtime_error& e) {
    throw UsageError(e.what());
  } catch (const std::exception&) {
    throw UsageError(file.path() + ": metadata lora.rank / lora.alpha missing or not numbers");
  }
  for (const std::string& name : file.names())
    if (name.starts_with("layers.") && (name.ends_with(".lora_a") || name.ends_with(".lora_b"))) {
      const std::optional<model::StoredTensor> st = file.stored(name);
      set.tensors.emplace(name, tensor::Tensor(st->shape, file.get(name)));
    }
  for (const std::string& m : model::lora_matrices())
    for (const auto& [name, t] : set.tensors)
      if (name.ends_with("." + m + ".lora_a")) {
        set.targets.push_back(*model::lora_hf_module_of(m));
        break;
      }
  return set;
}

// --to peft: a new folder (absent or empty) with adapter_config.json and adapter_model.safetensors.
void export_peft(const ExportFlags& f) {
  if (!f.model.ends_with(".safetensors"))
    throw UsageError(f.model + ": not a LoRA training checkpoint (the .safetensors a [train.lora] run saves)");
  require_new_out(f.out);
  std::unique_ptr<formats::SafetensorsFile> file;
  try {
    file = std::make_unique<formats::SafetensorsFile>(f.model);
  } catch (const std::runtime_error& e) {
    throw UsageError(e.what());
  }
  model::LlamaConfig base;
  const model::LoraAdapterSet set = adapter_of_checkpoint(*file, base);
  try {
    files::write_directory_atomically(f.out, [&](const std::string& tmp) { formats::save_peft_adapter(tmp, set, base); });
  } catch (const std::invalid_argument& e) {
    throw UsageError(f.model + ": " + e.what());
  } catch (const std::runtime_error& e) {
    throw UsageError(e.what());
  }
  std::fprintf(stderr, "wrote %s (PEFT LoRA adapter, rank %d, alpha %g, %zu tensors on %zu modules)\n", f.out.c_str(), set.rank,
               set.alpha, set.tensors.size(), set.targets.size());
}

void run_export(const ExportFlags& f) {
  if (f.force && f.to != "llama2c" && f.to != "gguf")
    throw UsageError("--force: only --to llama2c and gguf replace a file; --to " + f.to + " writes a new folder");
  if (!f.tokenizer.empty() && f.to != "gguf") throw UsageError("--tokenizer: only --to gguf writes a tokenizer");
  if (f.to == "peft") {
    if (f.fuse || !f.adapter.empty()) throw UsageError("--to peft exports a LoRA training checkpoint's adapters: no --adapter or --fuse");
    return export_peft(f);
  }
  if (f.to != "llama2c" && f.to != "hf" && f.to != "gguf") throw UsageError("--to " + f.to + ": expected llama2c, hf, gguf or peft");
  if (f.to == "gguf") gguf_type(f.dtype);
  if (f.shards < 1) throw UsageError("--shards " + std::to_string(f.shards) + " must be >= 1");
  if (!f.adapter.empty() && !f.fuse)
    throw UsageError("--adapter " + f.adapter + ": export merges an adapter only with --fuse (it does not convert adapters)");
  if (f.to == "llama2c" || f.to == "gguf") check_output_file(f.out, f.model, f.force);
  OpenedModel opened = open_model(f.model);
  std::optional<model::LoraAdapterSet> set;
  if (f.fuse) fuse_adapter(f, opened, set);
  if (f.to == "hf") return export_hf(f, opened);
  if (f.to == "gguf") return export_gguf(f, opened);
  try {
    formats::write_llama2c(f.out, *opened.weights);
  } catch (const std::invalid_argument& e) {
    throw UsageError(f.model + ": " + e.what());
  }
  std::fprintf(stderr, "wrote %s (llama2.c format, %lld parameters)\n", f.out.c_str(),
               static_cast<long long>(opened.weights->config().parameter_count()));
  auto kind = opened.metadata.find("tokenizer.kind");
  if (kind != opened.metadata.end() && kind->second != "llama2c")
    std::fprintf(stderr, "note: the model uses a %s vocabulary; llama2.c's run needs a tokenizer.bin, which it has none of\n",
                 kind->second.c_str());
}

void setup_export(CLI::App& sub) {
  auto flags = std::make_shared<ExportFlags>();
  sub.add_option("--to", flags->to, "format to write: llama2c, hf, gguf (llama.cpp), or peft (a LoRA training checkpoint's adapters)")
      ->capture_default_str();
  sub.add_option("--model", flags->model, "checkpoint to export (.safetensors, .bin or a Hugging Face directory)")->required();
  sub.add_option("--out", flags->out, "output file (llama2c: model.bin; gguf: model.gguf) or new folder (hf; absent or empty)")->required();
  sub.add_option("--dtype", flags->dtype, "hf: weight dtype, bf16, f16 or f32; gguf: also q8_0")->capture_default_str();
  sub.add_option("-z,--tokenizer", flags->tokenizer, "gguf: the tokenizer to put inside (tokenizer.bin, tokenizer.json or its folder; default: the model's)");
  sub.add_option("--shards", flags->shards, "hf: number of safetensors files, at most the model's tensor count")->capture_default_str();
  sub.add_option("--adapter", flags->adapter, "with --fuse: LoRA adapter to merge (a Hugging Face PEFT folder or a llama.cpp GGUF adapter file)");
  sub.add_flag("--fuse", flags->fuse, "write the model merged with --adapter (W + alpha/r * B @ A, in f32, then --dtype)");
  sub.add_flag("--force", flags->force, "llama2c, gguf: replace --out if it exists (never the input model)");
  sub.callback([flags] { run_export(*flags); });
}

const bool registered = register_command({"export", "Convert a checkpoint to llama2.c's .bin format, a Hugging Face model directory or a GGUF file", setup_export});

}  // namespace

}  // namespace tpcli::cli
