// tpcli::model — the trainable model's per-block and head parameters, shared by its two source
// files (trainable_llama.cpp: forward and backward; trainable_lora.cpp: the adapters). Internal.
#pragma once

#include <memory>

#include "model/llama_core.h"
#include "model/trainable_llama.h"
#include "nn/embedding.h"
#include "nn/feed_forward.h"

namespace tpcli::model {

struct TrainableLlama::Layer {
  tensor::Tensor attention_norm, attention_norm_grad;  // [C]
  tensor::Tensor ffn_norm, ffn_norm_grad;              // [C]
  F32AttentionLinears linears;
  std::unique_ptr<nn::TrainableFeedForward> ffn;
};

struct TrainableLlama::Head {
  nn::VocabParallelEmbedding embedding;  // [VL, C] this device's vocabulary rows
  tensor::Tensor norm, norm_grad;                // [C]
  nn::Linear output;                     // [VL, C] unshared classifier rows (empty when shared)
  bool tied = false;
  // The classifier's shard [VL, C]: the embedding's rows when shared, else the output rows.
  nn::Linear& classifier() { return tied ? embedding.rows() : output; }
};

}  // namespace tpcli::model
