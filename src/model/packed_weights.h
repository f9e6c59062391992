// tpcli::model — parameters in their stored formats (16-bit floats, MLX-quantized words) as
// tensor::PackedMatrix, and the conversion of an f32 checkpoint into such formats (`tpcli
// quantize`, `infer --quantize`).
//
// Dimension legend: R rows (output features), K columns (input features), GS group size.
// What gets packed when a checkpoint is quantized: every weight matrix whose K is a multiple of
// GS (wq wk wv wo w1 w2 w3, output, tok_embeddings, and the MoE experts.w1/w2/w3 stacks as
// [E*rows, K]); norms and the MoE router stay f32, as does a matrix whose K is not a multiple of
// GS (mlx-lm's converter does the same).
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/llama_config.h"
#include "model/shard_plan.h"
#include "model/comm_plan.h"
#include "model/weights.h"
#include "tensor/packed_matrix.h"

namespace tpcli::model {

// Throws std::invalid_argument naming the field: affine needs bits 2..8 and group size 32/64/128,
// mxfp8 bits 8 and group size 32.
void check_quantization(const Quantization& q);
tensor::WeightFormat weight_format(const Quantization& q);
// The tensors a quantized parameter is stored as: NAME (U32 words), NAME.scales, [NAME.biases].
std::vector<std::pair<std::string, tensor::Shape>> packed_shapes(const ParamSpec& spec, const Quantization& q);
// Whether `spec` is stored packed in a checkpoint converted to `format`.
bool packable(const ParamSpec& spec, const tensor::WeightFormat& format);

// The format parameter `name` is stored in (F32 when the source holds only f32).
tensor::WeightFormat stored_format(const WeightSource& weights, const std::string& name);
// Whether any matrix of the model is stored other than f32 (a model built from it is frozen).
bool holds_packed_weights(const WeightSource& weights);
// Rows [row0, row0 + nrows) of parameter `name` (a [rows, cols] matrix), and only `columns` when
// given (whole groups), copied in the stored format.
tensor::PackedMatrix load_packed(const WeightSource& weights, const std::string& name, int64_t rows, int64_t cols,
                                 int64_t row0, int64_t nrows, const std::vector<tensor::Columns>& columns = {});
// The whole parameter (leading dims folded into rows), in its stored format.
tensor::PackedMatrix load_packed_full(const WeightSource& weights, const std::string& name);

// The columns a device holds of `mine` in format f: whole quantization groups, those `mine` touches.
dist::Range held_columns(const tensor::WeightFormat& f, dist::Range mine);

// Bytes of [rows, cols] in format f as stored (tensor::PackedMatrix::bytes): the elements plus, per
// group, an f32 scale and bias (affine) or a shared exponent byte (mxfp8).
int64_t stored_bytes(const tensor::WeightFormat& f, int64_t rows, int64_t cols);
// Decode's view of the matrices of `weights` (model/comm_plan.h): each at its stored bytes; an
// all-f32 source is fused (a trainable model), a packed one is not.
DecodeStorage decode_storage(const WeightSource& weights);

// Bytes of the weights (as stored) that the device of `plan` holds: its rows or columns of the
// split matrices (the embedding and classifier by vocabulary rows), every replicated tensor (norms,
// router) whole.
int64_t shard_bytes(const WeightSource& weights, const ShardPlan& plan);

// An f32 source with its packable parameters converted to `format` (all at construction, so
// device threads can share it): stored() gives the packed tensors, get() their f32 values
// (dequantized on first use), config() carries the quantization. Non-packable parameters pass
// through. The source must outlive it.
class ConvertedWeights : public WeightSource {
 public:
  ConvertedWeights(const WeightSource& source, tensor::WeightFormat format);
  const LlamaConfig& config() const override { return config_; }
  std::span<const float> get(const std::string& name) const override;
  std::optional<StoredTensor> stored(const std::string& name) const override;
  // The packed tensors are this object's own memory; the others are the source's.
  void release_pages(const std::string& name) const override;
  void release_all_pages() const override { source_.release_all_pages(); }
  const LoraAdapterSet* adapter() const override { return source_.adapter(); }  // kept in f32
  const tensor::WeightFormat& format() const { return format_; }

 private:
  struct Packed {
    tensor::PackedMatrix matrix;
    tensor::Shape shape;             // the parameter's shape
    mutable std::vector<float> dequantized;  // f32 values, made by the first get()
  };
  const WeightSource& source_;
  LlamaConfig config_;
  tensor::WeightFormat format_;
  std::map<std::string, Packed> packed_;
  mutable std::mutex dequantize_mutex_;
};

}  // namespace tpcli::model
