// tpcli::formats — LoRA adapters as llama.cpp stores them (convert_lora_to_gguf.py's GGUF file),
// read into the in-memory set of model/lora_adapter.h, and the one reader `--adapter` calls, which
// takes such a file or a PEFT folder (formats/peft_adapter.h).
//
// The file (llama.cpp's src/llama-adapter.cpp reads it so):
//   general.type "adapter", adapter.type "lora", adapter.lora.alpha (f32; 0 or absent: scale 1),
//   general.architecture as the base model's GGUF ("llama", "qwen2", "phi3")
//   blk.{l}.{attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down}.weight.lora_a  ne [IN, r]
//   ... .weight.lora_b                                                                  ne [r, OUT]
// so lora_a is A [r, IN] and lora_b is B [OUT, r] row-major, as PEFT's. The scale is alpha / r, r
// being lora_b's ne[0]. Like the base's q/k rows, lora_b's rows of attn_q / attn_k are stored for
// interleaved RoPE pairs in the llama architecture (tpcli's order, kept) and in rotate-half order
// in qwen2 and phi3 (reordered on the way in, as formats/gguf_model.h reorders the base's). Phi-3's
// adapters on its fused attn_qkv (q|k|v) and ffn_up (gate|up) become one adapter per part: lora_a
// shared, lora_b's rows dealt out in order (W_part x + s B_part (A x) is those rows of the fused one).
#pragma once

#include <string>

#include "model/llama_config.h"
#include "model/lora_adapter.h"

namespace tpcli::formats {

// Reads a GGUF LoRA adapter for a model of `config`: tensors of any type tensor/ggml_blocks.h
// dequantizes. Every error is one std::runtime_error line naming the file and the key or tensor:
// a GGUF that is no LoRA adapter, another architecture than the model's, a tensor tpcli does not
// adapt (token_embd, output, MoE experts...), a lora_a without its lora_b, a rank or
// shape that does not fit the model, non-finite values.
model::LoraAdapterSet load_gguf_adapter(const std::string& path, const model::LlamaConfig& config);

// `--adapter PATH`: a GGUF file (its first bytes "GGUF") or a PEFT folder.
model::LoraAdapterSet load_adapter(const std::string& path, const model::LlamaConfig& config);

}  // namespace tpcli::formats
