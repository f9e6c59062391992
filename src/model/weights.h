// tpcli::model — where full (unsharded) parameters come from when a device builds its shard.
//
// A device asks for a parameter by its ParamSpec name and copies only its own slice, so an
// mmap'd checkpoint is never copied whole into any device; then it releases the tensor
// (release_pages), so the file's pages do not stay resident beside the devices' copies.
#pragma once

#include <atomic>
#include <map>
#include <optional>
#include <span>
#include <string>

#include "model/llama_config.h"
#include "tensor/ggml_blocks.h"
#include "tensor/tensor.h"

namespace tpcli::model {

struct LoraAdapterSet;  // model/lora_adapter.h

// How a tensor is stored in its file. 16-bit floats and packed quantized words stay as they are
// (the layers read them with their own kernels); WeightSource::get() gives f32.
enum class DType { F32, F16, BF16, U32, U8 };

struct StoredTensor {
  DType dtype = DType::F32;
  tensor::Shape shape;         // as stored (a packed weight: [OUT, IN * bits / 32] words)
  const void* data = nullptr;  // row-major, little-endian, numel(shape) elements of dtype
  // Blocks of a ggml quantized type (a GGUF file's): then dtype is U8, shape the values' [OUT, IN]
  // and data OUT rows of WeightFormat::ggml_blocks(type).row_bytes(IN) bytes each.
  std::optional<tensor::GgmlType> ggml_blocks;
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual const LlamaConfig& config() const = 0;
  // The full tensor named by llama_parameters(config()), row-major in its ParamSpec shape, in f32
  // (converted or dequantized when stored otherwise). Throws std::out_of_range naming it when absent.
  virtual std::span<const float> get(const std::string& name) const = 0;
  // The tensor as stored, unconverted: parameter names, and for a quantized weight NAME also
  // NAME.scales and NAME.biases (../shared/QUANT.md). nullopt when absent or when the source holds
  // only f32 in memory (then get() is the way).
  virtual std::optional<StoredTensor> stored(const std::string& name) const { return std::nullopt; }
  // How parameter `name` is quantized when stored packed: config().quantization, unless the source
  // knows better for that tensor (a Hugging Face directory's MoE routers).
  virtual std::optional<Quantization> quantization_of(const std::string& name) const { return config().quantization; }
  // Frees the copies that get() and stored() keep (f32 conversions of 16-bit or quantized tensors,
  // reordered rows), so that a model built from them is not held twice. What they returned before
  // is invalid afterwards: call it when every device of the process has copied its shard.
  virtual void release_conversions() const {}
  // The caller has copied what it needs of tensor `name` (a parameter, or NAME.scales / NAME.biases):
  // a source that reads a mapped file drops the file's pages under it from the process's memory,
  // so that a model built from the file is not resident twice while it loads. Spans from get() and
  // stored() stay valid (reading them again faults the pages in from the file); conversions are
  // kept (other devices may still copy from them) until release_conversions.
  virtual void release_pages(const std::string& name) const {}
  // The same for every page of the file(s): what fault-around mapped back in around a released
  // tensor, and tensors read by code that does not release them.
  virtual void release_all_pages() const {}
  // LoRA adapters to apply unmerged on top of these weights (model/lora_adapter.h AdaptedWeights);
  // nullptr: none.
  virtual const LoraAdapterSet* adapter() const { return nullptr; }
};

// This process's devices, each reporting when it has built its model from `weights` (a collective
// of those devices' threads): the last one frees what only building needed, the source's f32
// conversions (`--dtype f32` on a 16-bit model would otherwise hold the model twice), the file
// pages still mapped in (fault-around and tensors read whole bring some back after each device
// released its own), and glibc's free lists in the devices' arenas.
class DevicesBuilding {
 public:
  DevicesBuilding(const WeightSource& weights, int local_devices) : weights_(weights), left_(local_devices) {}
  void built();

 private:
  const WeightSource& weights_;
  std::atomic<int> left_;
};

// Parameters held in memory (random init, tests, safetensors after reading).
class TensorWeights : public WeightSource {
 public:
  explicit TensorWeights(LlamaConfig config) : config_(std::move(config)) {}
  const LlamaConfig& config() const override { return config_; }
  std::span<const float> get(const std::string& name) const override;
  tensor::Tensor& at(const std::string& name) { return tensors_.at(name); }
  void set(const std::string& name, tensor::Tensor value) { tensors_[name] = std::move(value); }

 private:
  LlamaConfig config_;
  std::map<std::string, tensor::Tensor> tensors_;
};

}  // namespace tpcli::model
