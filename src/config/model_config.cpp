#include "config/model_config.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "formats/hf_config.h"
#include "model/shard_plan.h"

namespace tpcli::config {

namespace {

int required(const ModelSection& section, const std::optional<int>& value, const char* key) {
  if (!value)
    throw ConfigError(section.source.file() + ": model." + key + " is missing (set it in [model] or in the " +
                              "file named by model.config)");
  return *value;
}

// hf_architecture must name one tpcli runs (formats/hf_config.h), so that export --to hf can write it.
std::string architecture(const ModelSection& section) {
  if (!section.hf_architecture) return "";
  const auto& names = formats::supported_architectures();
  if (std::ranges::find(names, *section.hf_architecture) != names.end()) return *section.hf_architecture;
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "\"" : ", \"") + n + "\"";
  throw ConfigError(section.source.where("hf_architecture") + ": hf_architecture = \"" + *section.hf_architecture +
                            "\" must be one of " + list);
}

}  // namespace

model::LlamaConfig model_from_config(const ModelSection& section, std::optional<int> tokenizer_vocab) {
  model::LlamaConfig c;
  c.dim = required(section, section.dim, "dim");
  c.hidden_dim = required(section, section.hidden_dim, "hidden_dim");
  c.n_layers = required(section, section.n_layers, "n_layers");
  c.n_heads = required(section, section.n_heads, "n_heads");
  c.n_kv_heads = section.n_kv_heads.value_or(c.n_heads);
  c.vocab_size = required(section, section.vocab_size ? section.vocab_size : tokenizer_vocab, "vocab_size");
  c.seq_len = required(section, section.seq_len, "seq_len");
  c.shared_classifier = section.shared_classifier.value_or(c.shared_classifier);
  c.norm_eps = static_cast<float>(section.norm_eps.value_or(c.norm_eps));
  c.rope_theta = static_cast<float>(section.rope_theta.value_or(c.rope_theta));
  c.n_experts = section.n_experts.value_or(0);
  c.top_k = section.top_k.value_or(c.n_experts > 0 ? 1 : 0);
  c.expert_hidden_dim = section.expert_hidden_dim.value_or(0);
  c.moe_aux_loss = static_cast<float>(section.moe_aux_loss.value_or(c.is_moe() ? 0.01 : 0.0));
  if (section.capacity_factor) c.capacity_factor = static_cast<float>(*section.capacity_factor);
  c.norm_topk_prob = section.norm_topk_prob.value_or(c.norm_topk_prob);
  c.dense_layers = section.dense_layers.value_or(c.dense_layers);
  c.head_dim = section.head_dim.value_or(0);
  c.qkv_bias = section.qkv_bias.value_or(false);
  c.qk_norm = section.qk_norm.value_or(false);
  c.hf_architecture = architecture(section);
  if (!c.is_moe()) {
    for (auto [key, given] : {std::pair{"top_k", section.top_k.has_value()},
                              std::pair{"expert_hidden_dim", section.expert_hidden_dim.has_value()},
                              std::pair{"capacity_factor", section.capacity_factor.has_value()},
                              std::pair{"norm_topk_prob", section.norm_topk_prob.has_value()},
                              std::pair{"dense_layers", section.dense_layers.has_value()}})
      if (given)
        throw ConfigError(section.source.where(key) + ": " + key +
                                  " applies to mixture-of-experts models only: set n_experts >= 1 too");
  }
  if (tokenizer_vocab && c.vocab_size < *tokenizer_vocab)
    throw ConfigError(section.source.where("vocab_size") + ": vocab_size = " + std::to_string(c.vocab_size) +
                              " is smaller than the tokenizer's " + std::to_string(*tokenizer_vocab) + " tokens");
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    // validate() names the field first ("n_heads = 3 does not divide dim = 64"): point at its line.
    const std::string message = e.what();
    const std::string field = message.substr(0, message.find_first_of(" =:"));
    throw ConfigError(section.source.where(field) + ": " + message);
  }
  return c;
}

void check_model_fits_mesh(const RunConfig& config, const model::LlamaConfig& model) {
  const std::string key = "mesh.axes." + config.mesh.tensor_axis;
  const int devices = config.mesh.axis_size(config.mesh.tensor_axis);
  try {
    model::check_tensor_devices(model, devices);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(config.where(key) + ": " + key + " = " + std::to_string(devices) + ": " + e.what());
  }
}

}  // namespace tpcli::config
