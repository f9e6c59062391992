// tpcli::train — what one device holds while training, in bytes, computed from the model config
// and the mesh alone (no allocation): `tpcli train` prints it at start and `tpcli inspect` prints
// the same for a run config; tests check it against a real model and optimizer.
//
// Dimension legend: N = rows * T tokens of one micro-batch on this device, C dim, NH_L/QL/KVL
// this device's query heads / q rows / kv rows, FL ffn rows, VL vocabulary rows, L layers.
//
//   parameters   this device's shards of every parameter (f32), and with LoRA the adapters; a
//                QLoRA base (packed_base) at its stored bytes: each packable matrix's local rows or
//                columns in its stored format (packed_base, or its own in base_formats; a wo whose
//                local columns cut groups in f32, as the model keeps it), the rest f32
//   gradients    one gradient per parameter element (f32; not sharded, as in ZeRO-1); with LoRA
//                per adapter element only (the base is frozen), and so the moments
//   optimizer    AdamW's two moments: of every local element, or (shard_optimizer) of this data
//                rank's chunk of each gradient bucket plus the expert weights it owns
//   activations  what the forward keeps for the backward at its peak (model/trainable_llama.h
//                peak_activation_bytes): per block (model/block_activations.h, the sizes
//                TrainableLlama::block_forward allocates) [N, C] x 4, [N] x 2, [N, QL+2KVL], [N, QL],
//                [rows, NH_L, T, T] and the SwiGLU's [N, FL] x 6; then [N, C] x 3, [N] x 2,
//                [N, VL]. With recompute: only each block's input [N, C] plus one block's set.
//                Sequence parallel: the [N, C] and [N] of the residual stream and the norms are
//                this device's rows NL (even_split of N over the tensor axis), except the final
//                norm's gathered output [N, C] (the classifier's input).
//                Not counted: the backward's transient gradients; MoE expert buffers.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "model/llama_config.h"
#include "model/trainable_llama.h"
#include "tensor/packed_matrix.h"

namespace tpcli::train {

struct MemoryLayout {
  int data = 1;             // D
  int tensor = 1;           // TP
  int expert_group = 1;     // G (MoE)
  bool experts_on_data_axis = true;
  int rows = 1;             // micro-batch rows on this device (batch_size / D)
  int seq_len = 1;          // T
  bool recompute = false;
  bool shard_optimizer = false;
  int64_t bucket_elems = 262144;
  bool sequence_parallel = false;  // [mesh] sequence_parallel (model/trainable_llama.h set_sequence_parallel)
  std::optional<model::LoraOptions> lora;  // [train.lora]: only the adapters train
  // QLoRA (with lora): the format the frozen base's matrices are stored in (model/packed_weights.h);
  // empty: f32. A quantized format also sets how the planner deals out the FFN rows (whole groups).
  std::optional<tensor::WeightFormat> packed_base;
  // QLoRA: the matrices stored in another format than packed_base, by parameter name (an MLX
  // model leaves a matrix in float when the group does not divide its input dimension, and mixed
  // recipes give layers their own bits).
  std::map<std::string, tensor::WeightFormat> base_formats;
};

struct DeviceBytes {
  int64_t parameters = 0, gradients = 0, optimizer = 0, activations = 0;
};

// Device (tensor_rank, data_rank, expert_rank); the defaults, device 0, hold the most (even_split
// gives the first parts the extra element).
DeviceBytes device_bytes(const model::LlamaConfig& config, const MemoryLayout& layout, int tensor_rank = 0,
                         int data_rank = 0, int expert_rank = 0);

// Elements of device tensor_rank's parameters that every data rank holds alike: the flat buffer
// the data-parallel optimizer averages in buckets (train/param_table.h).
int64_t data_replicated_elements(const model::LlamaConfig& config, const MemoryLayout& layout, int tensor_rank = 0);

// "parameters 1.23 MB, gradients 1.23 MB, optimizer 2.46 MB, activations 7.10 MB"
std::string describe(const DeviceBytes& bytes);

}  // namespace tpcli::train
