// tpcli::formats — Hugging Face PEFT's LoRA adapter folder, read into and written from the in-memory
// set of model/lora_adapter.h (whose top gives the tensors' names and layout).
//
// PEFT's folder (what peft.PeftModel.from_pretrained reads):
//   adapter_config.json        peft_type "LORA", task_type "CAUSAL_LM", r, lora_alpha, lora_dropout,
//                              target_modules (HF names), base_model_name_or_path, bias "none",
//                              fan_in_fan_out false, use_rslora false, use_dora false,
//                              layers_to_transform (only when some blocks carry no adapter)
//   adapter_model.safetensors  base_model.model.model.layers.{l}.self_attn.q_proj.lora_A.weight [r, IN]
//                              ... .lora_B.weight [OUT, r]; mlp.gate_proj etc.; metadata format "pt"
// q_proj / k_proj lora_B rows are in Hugging Face's rotate-half order there (permuted on the way
// out and in, exactly as the base's rows); lora_A needs none (its columns are the input features).
#pragma once

#include <string>

#include "model/llama_config.h"
#include "model/lora_adapter.h"

namespace tpcli::formats {

// Writes `dir`/adapter_config.json and `dir`/adapter_model.safetensors (each atomically; `dir`
// created when missing). Validates first (std::invalid_argument); std::runtime_error for I/O.
void save_peft_adapter(const std::string& dir, const model::LoraAdapterSet& set, const model::LlamaConfig& config);
// Reads a PEFT LoRA folder for a model of `config`: F32, F16 or BF16 tensors, with or without the
// "base_model.model." prefix. Every error is one std::runtime_error line naming the file and the
// key or tensor: a missing file, a PEFT feature tpcli does not apply (DoRA, rsLoRA, rank_pattern,
// bias, modules_to_save...), an unknown module, a rank or shape that does not fit the model,
// non-finite values.
model::LoraAdapterSet load_peft_adapter(const std::string& dir, const model::LlamaConfig& config);

}  // namespace tpcli::formats
