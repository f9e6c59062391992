// tpcli::cli — opening a model checkpoint (llama2.c .bin, tpcli .safetensors, or a Hugging Face
// model directory) for infer, export and bench, with input errors as UsageError.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distributed/mesh.h"
#include "distributed/runtime.h"
#include "formats/open_model.h"
#include "model/placement.h"
#include "model/weights.h"
#include "tensor/packed_matrix.h"

namespace CLI {
class App;
}
namespace tpcli::model {
class Llama;
}

namespace tpcli::cli {

using formats::OpenedModel;  // formats/open_model.h

// formats::open, its errors as UsageError.
OpenedModel open_model(const std::string& path);
// The same; with `convert`, an f32 checkpoint is quantized (or stored 16-bit) on load
// (model::ConvertedWeights).
OpenedModel open_model(const std::string& path, const std::optional<tensor::WeightFormat>& convert);

// Where the model `path` opened as `opened` sits on `mesh` (after apply_load_flags and
// apply_adapter: the plans are those of the weights as built), the run's one model::Placement. A
// UsageError "PATH: cannot split ..." when the model does not split over the tensor axis.
model::Placement place_model(const OpenedModel& opened, const std::string& path, const dist::Mesh& mesh,
                             const model::AxisRoles& roles = {});

// `--quantize 4|8|mxfp8|bf16|f16` with `--group-size 32|64|128` (affine only) as a format;
// "" = nullopt. UsageError naming the flag for anything else.
std::optional<tensor::WeightFormat> parse_quantize_flag(const std::string& quantize, int group_size);
// `quant` as a format, `--bits`/`--group-size`/`--mode` spelled out (tpcli quantize).
tensor::WeightFormat parse_quantization(int bits, int group_size, const std::string& mode);

// `--dtype`: "auto" keeps the weights as stored (16-bit or quantized layers where the model has
// them), "f32" converts (dequantizes) them to f32 on load. `--context`: positions to allocate the
// KV cache for, at most the model's seq_len (0: the model's; a Hugging Face directory's
// max_position_embeddings is capped at DEFAULT_HF_CONTEXT unless --context asks for more).
// UsageError for a bad value.
constexpr int DEFAULT_HF_CONTEXT = 8192;
void apply_load_flags(OpenedModel& opened, const std::string& dtype, int context);

// `--adapter DIR` (infer, chat, serve, logits, perplexity): a Hugging Face PEFT LoRA folder
// (adapter_config.json + adapter_model.safetensors) applied unmerged on top of the model
// (model/lora_adapter.h). add_adapter_flag adds the flag, writing into `dir`; apply_adapter ("" =
// none) wraps opened.weights in model::AdaptedWeights, after apply_load_flags. UsageError, one
// line naming the file, for a folder that is not an adapter of this model's shape.
void add_adapter_flag(CLI::App& sub, std::string& dir);
void apply_adapter(OpenedModel& opened, const std::string& dir);

// --int8-activations (tensor::set_int8_activations), one wording for every command that loads weights.
void add_int8_activations_flag(CLI::App& sub, bool& on);

// `--out FILE` of a command that writes one file (export --to llama2c, quantize), checked before
// the model loads: UsageError when FILE is a folder, when it is `input` (the same file by device and
// inode, whatever the path: a hard link or a symlink counts; for a model folder, any file directly
// in it), or when it exists and `force` is false.
void check_output_file(const std::string& out, const std::string& input, bool force);

}  // namespace tpcli::cli
