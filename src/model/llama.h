// tpcli::model — the inference model: one tensor-parallel device's shard of a Llama model, its KV
// cache, decode and prefill. Its weights stay as the source stores them: f32, or packed (quantized
// or 16-bit, nn/quantized_linear.h). Training is model/trainable_llama.h, on the same core
// (model/llama_core.h: the sharding recipe, shard plans, RoPE).
//
// Dimension legend: P positions of one call, C dim, V vocab, S seq_len, L layers; *_L = this
// device's part (QL = NH_L*HS, KVL = NKV_L*HS, VL vocab rows).
//
// A call runs P tokens at positions pos..pos+P-1 in one pass: P = 1 is decode (matrix-vector
// products, llama2.c's operation order), P > 1 a batched prefill (gemm through BLIS, attention over
// the KV cache two gemms per head); both fill the KV cache at those positions.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "distributed/group.h"
#include "model/llama_core.h"
#include "model/placement.h"
#include "model/weights.h"
#include "nn/attention.h"
#include "nn/feed_forward.h"
#include "nn/quantized_linear.h"

namespace tpcli::model {

// Whether a model split over `tensor_devices` (x `expert_devices`) computes the same logits, bit for
// bit, as on 1 device: every device's columns of wo and w2 are a whole subtree of their sums' lanes
// (nn/quantized_linear.h), on a power-of-two count of devices, and no block is MoE. Otherwise
// seeded sampling may part from 1 device's text (greedy tokens rarely).
bool split_invariant(const WeightSource& weights, int tensor_devices, int expert_devices = 1);
// The same, given every tensor device's shard plan (plan_all_shards(weights.config(), T)).
bool split_invariant(const WeightSource& weights, const std::vector<ShardPlan>& plans, int expert_devices);

class Llama {
 public:
  // Copies only this device's slices of each tensor. LoRA adapters the weights carry
  // (WeightSource::adapter(), model/lora_adapter.h) are applied unmerged, sharded as the linears
  // they adapt: wq wk wv w1 w3 with no communication, wo and w2 with one more all_sum of [P, r]
  // each (nn/quantized_lora.h). tensor_group: the devices that split the
  // weights. expert_group (MoE only): the devices the experts are dealt out over (nn/moe.h); size
  // 1: every expert here. Every member of it runs the same sequence: a MoE block routes each
  // member's share of the rows to the experts' owners, then gathers every row again.
  // kv_dtype: the element type of the model's own KV caches (forward, prefill, prefill_losses).
  Llama(const WeightSource& weights, dist::Group tensor_group, dist::Group expert_group = {},
        nn::KvDtype kv_dtype = nn::KvDtype::F32);
  // The same, built inside a tensor::HugePageArena: every weight that decode streams lies back to
  // back on 2 MB pages, however its matrices were cut.
  static Llama on_huge_pages(const WeightSource& weights, dist::Group tensor_group, dist::Group expert_group = {},
                             nn::KvDtype kv_dtype = nn::KvDtype::F32);
  // Device `dev`'s model where `placement` puts it: its groups along the placement's tensor and
  // expert axes, the run's shard plans (not planned again), on huge pages.
  static Llama on_huge_pages(const WeightSource& weights, const Placement& placement, dist::Device& dev,
                             nn::KvDtype kv_dtype = nn::KvDtype::F32);
  // The same, not on huge pages.
  Llama(const WeightSource& weights, const Placement& placement, dist::Device& dev, nn::KvDtype kv_dtype = nn::KvDtype::F32);
  ~Llama();
  Llama(Llama&&) noexcept;
  Llama& operator=(Llama&&) noexcept;

  const LlamaConfig& config() const { return core_.config; }
  const ShardPlan& plan() const { return core_.plan; }
  const std::vector<ShardPlan>& plans() const { return core_.all_plans; }  // [T] every tensor device's
  // Devices that split the weights (the tensor group), and all the model is split over (x experts).
  int tensor_devices() const { return core_.group.size(); }
  int devices() const { return core_.group.size() * core_.expert_group.size(); }
  // split_invariant(weights, tensor devices, expert devices) for this model's mesh.
  bool split_invariant() const { return split_invariant_; }
  // Whether the weights are packed (quantized or 16-bit, WeightSource::stored()).
  bool packed() const;

  // Decode one token at position pos (0 <= pos < seq_len), filling the KV cache at pos.
  // Returns the logits [V], full vocabulary on every device (valid until the next call).
  std::span<const float> forward(int token, int pos);
  // Like forward, but only the greedy token: each device's local argmax, reduced across devices
  // (moves 2 floats per device instead of the logits). Ties go to the lowest token id; -1 (on
  // every device) when any device's logits are not finite.
  int forward_argmax(int token, int pos);

  // Batched prefill: tokens[P] at positions pos..pos+P-1 in one pass, filling the KV cache there
  // (pos + P <= seq_len; pos > 0 continues a sequence, e.g. a chat turn). Returns the logits [V] of
  // the last position: bit for bit what feeding the tokens one by one through forward() returns
  // last (every product and attention row of every call keeps the single-token arithmetic).
  std::span<const float> prefill(std::span<const int> tokens, int pos);
  // The greedy token after the last position, as forward_argmax.
  int prefill_argmax(std::span<const int> tokens, int pos);
  // Logits [P, V] of every position (tests, scoring a prompt).
  std::vector<float> prefill_logits(std::span<const int> tokens, int pos);
  // Perplexity: tokens and targets hold W windows of S one after another; each window is
  // prefilled from position 0 in one pass over all of them (its own KV cache, made here) and
  // scored. Returns each window's mean cross-entropy [W], the softmax over the vocabulary split as
  // in training (no logits gathered).
  std::vector<float> prefill_losses(std::span<const int> tokens, std::span<const int> targets, int64_t windows);

  // Keys and values on this device, in blocks of positions: block b holds, for every layer, the
  // [block_size, KVL] rows of whichever sequence was given it, as elements of dtype(). The model's
  // own cache (forward, prefill) is one block of seq_len positions, made at its first use; the
  // batched engine (engine/batch_engine.h) runs many sequences over one pool of small blocks.
  class KvCache {
   public:
    int64_t bytes() const;
    int blocks() const { return blocks_; }
    int block_size() const { return block_size_; }
    int positions() const { return blocks_ * block_size_; }
    nn::KvDtype dtype() const { return dtype_; }
   private:
    friend class Llama;
    int blocks_ = 0, block_size_ = 0;
    nn::KvDtype dtype_ = nn::KvDtype::F32;
    std::vector<std::vector<std::byte>> k_, v_;  // [L][blocks * block_size * KVL elements]
  };
  // Zero-filled, of the model's kv_dtype. One block of `positions` positions (0: seq_len; at most seq_len).
  KvCache new_kv_cache(int positions = 0) const;
  // A pool of `blocks` blocks of `block_size` positions.
  KvCache new_kv_pool(int blocks, int block_size, nn::KvDtype dtype) const;
  nn::KvDtype kv_dtype() const { return kv_dtype_; }

  // The rows of one sequence in a batched step: `count` tokens at positions pos..pos+count-1, whose
  // keys and values go into (and whose attention reads) the pool blocks `blocks` (position t in
  // blocks[t / block_size]). `logits`: return the logits after each of its last `logits` rows
  // (0 to count; one for a decode token, several for the guesses a speculating sequence checks).
  struct SequenceRows {
    int64_t count = 0;
    int pos = 0;
    std::span<const int32_t> blocks;
    int64_t logits = 0;
  };
  // One step of the batched engine over `pool`: tokens holds each sequence's rows in turn. As in
  // every call here, each product keeps every row's single-row arithmetic (tensor/blas.h
  // DecodeRows) and attention runs each row alone over its sequence's blocks, so a row's bits are what forward() gives that token on
  // its own: they depend neither on the other sequences, nor on where the blocks lie, nor on how
  // a prompt was cut into steps (tested on 1 and 2 devices; on more, the all-sums may add in
  // another order). Returns the logits [n, V], full vocabulary on every device, of the rows
  // asked for, in order (valid until the next step; the caller may overwrite them). MoE
  // blocks too: the router and every expert run row by row.
  std::span<float> step(std::span<const int> tokens, std::span<const SequenceRows> sequences, KvCache& pool);
  // The same step when only the greedy token of each row asked for is wanted: argmax of its
  // logits, ties to the lowest token id, -1 (on every device) when they are not finite. Moves one
  // (logit, token) record per row and device instead of the logits, as forward_argmax.
  std::span<const int> step_greedy(std::span<const int> tokens, std::span<const SequenceRows> sequences, KvCache& pool);
  // The logits [n, V] of the last step_greedy's rows, gathered now (every device calls it,
  // e.g. to name a non-finite logit).
  std::span<float> step_logits();

  int64_t parameter_bytes() const;  // this device's weights as held
  int64_t kv_cache_bytes() const;   // this device's own KV cache (made at the first forward or prefill)

 private:
  struct Layer;
  struct Vocab;
  // placement: the run's plans and split invariance (null: derived from the groups here).
  Llama(const WeightSource& weights, dist::Group tensor_group, dist::Group expert_group, nn::KvDtype kv_dtype,
        const Placement* placement);
  void load_f32_layers(const WeightSource& weights);
  void attach_lora(const LoraAdapterSet& set);  // weights.adapter(), unmerged (nn/quantized_lora.h)
  void load_packed_layers(const WeightSource& weights);
  // Rows [first, first + count) of a call are one sequence's positions pos.. in `blocks` of `cache`.
  struct Segment {
    int64_t first = 0, count = 0;
    int pos = 0;
    KvCache* cache = nullptr;
    std::span<const int32_t> blocks;
  };
  KvCache& own_cache();  // made at first use
  // tokens[P] through every block, each segment's rows attending over its cache (filled at their
  // positions); the residual stream is left in run_.x.
  void blocks_forward(std::span<const int> tokens, std::span<const Segment> segments);
  void blocks_forward(std::span<const int> tokens, int pos);  // one segment: the model's own cache
  // blocks_forward and the final norm of every position, then this device's logits [rows, VL] of
  // the last `rows` positions into `local`.
  void logits_local(float* local, std::span<const int> tokens, int pos, int64_t rows);
  // The final norm of x[rows, C] (in place), then this device's logits local[rows, VL].
  void head_local(float* local, float* x, int64_t rows);
  // logits_local of the last position: into logits_ itself on a lone device.
  float* last_logits_local(std::span<const int> tokens, int pos);
  std::span<const float> gather_logits(const float* local);  // [VL] split -> [V] mirrored
  int argmax_over_devices(const float* local);                // greedy token from [VL] split logits
  // argmax_over_devices of `rows` rows of local[rows, VL] into tokens[rows], one gather for all.
  void argmax_rows(const float* local, int64_t rows, int* tokens);
  // step()'s forward and this device's logits of the sequences asking, into step_local_ (alone:
  // step_logits_, the whole vocabulary); returns how many sequences asked.
  int64_t step_local(std::span<const int> tokens, std::span<const SequenceRows> sequences, KvCache& pool);

  LlamaCore core_;
  nn::KvDtype kv_dtype_;
  bool split_invariant_ = false;
  KvCache own_cache_;
  std::unique_ptr<Vocab> vocab_;  // token embedding and classifier, f32 or packed
  tensor::Tensor norm_;           // [C]
  std::vector<Layer> layers_;

  // inference state, sized for the last P rows
  struct Run {
    std::vector<float> x, xb, xb2;  // [P, C]
    std::vector<float> qkv;         // [P, QL+2KVL]
    std::vector<float> y;           // [P, QL]
  } run_;
  std::vector<float> logits_local_, logits_;  // [VL], [V]
  std::vector<float> step_local_, step_logits_;  // step(): [n, VL], [n, V]
  std::vector<int> step_tokens_;                 // step_greedy(): [n]
  std::vector<int64_t> vocab_counts_;         // [TP] vocab rows of each device
};

}  // namespace tpcli::model
