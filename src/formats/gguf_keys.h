// tpcli::formats — the GGUF metadata keys tpcli reads and writes, as llama.cpp names them
// (llama-arch.cpp, LLM_KV_NAMES; gguf-py's constants.py). The model keys sit under the
// architecture's prefix: "llama.block_count" is arch_key("llama", BLOCK_COUNT).
#pragma once

#include <cstdint>
#include <string>

namespace tpcli::formats::gguf_keys {

constexpr const char* ARCHITECTURE = "general.architecture";
constexpr const char* NAME = "general.name";
constexpr const char* ALIGNMENT = "general.alignment";
constexpr const char* FILE_TYPE = "general.file_type";
constexpr const char* QUANTIZATION_VERSION = "general.quantization_version";

// Under "{arch}.".
constexpr const char* CONTEXT_LENGTH = "context_length";
constexpr const char* EMBEDDING_LENGTH = "embedding_length";
constexpr const char* BLOCK_COUNT = "block_count";
constexpr const char* FEED_FORWARD_LENGTH = "feed_forward_length";
constexpr const char* HEAD_COUNT = "attention.head_count";
constexpr const char* HEAD_COUNT_KV = "attention.head_count_kv";
constexpr const char* KEY_LENGTH = "attention.key_length";
constexpr const char* VALUE_LENGTH = "attention.value_length";
constexpr const char* RMS_EPSILON = "attention.layer_norm_rms_epsilon";
constexpr const char* SLIDING_WINDOW = "attention.sliding_window";
constexpr const char* ROPE_DIMENSION_COUNT = "rope.dimension_count";
constexpr const char* ROPE_FREQ_BASE = "rope.freq_base";
constexpr const char* EXPERT_COUNT = "expert_count";
constexpr const char* EXPERT_USED_COUNT = "expert_used_count";
constexpr const char* VOCAB_SIZE = "vocab_size";

inline std::string arch_key(const std::string& architecture, const char* key) { return architecture + "." + key; }

// The tokenizer (llama-vocab.cpp).
constexpr const char* TOKENIZER_MODEL = "tokenizer.ggml.model";  // "llama" (SentencePiece), "gpt2" (byte-level BPE)
constexpr const char* TOKENIZER_PRE = "tokenizer.ggml.pre";      // the pre-tokenizer of a "gpt2" vocabulary
constexpr const char* TOKENS = "tokenizer.ggml.tokens";
constexpr const char* SCORES = "tokenizer.ggml.scores";
constexpr const char* TOKEN_TYPE = "tokenizer.ggml.token_type";
constexpr const char* MERGES = "tokenizer.ggml.merges";
constexpr const char* BOS_ID = "tokenizer.ggml.bos_token_id";
constexpr const char* EOS_ID = "tokenizer.ggml.eos_token_id";
constexpr const char* EOT_ID = "tokenizer.ggml.eot_token_id";  // end of turn
constexpr const char* EOM_ID = "tokenizer.ggml.eom_token_id";  // end of message (Llama 3.1 tool calls)
constexpr const char* UNKNOWN_ID = "tokenizer.ggml.unknown_token_id";
constexpr const char* PADDING_ID = "tokenizer.ggml.padding_token_id";
constexpr const char* ADD_BOS = "tokenizer.ggml.add_bos_token";
constexpr const char* ADD_EOS = "tokenizer.ggml.add_eos_token";
constexpr const char* ADD_SPACE_PREFIX = "tokenizer.ggml.add_space_prefix";
constexpr const char* CHAT_TEMPLATE = "tokenizer.chat_template";

// A tensor, not a key: Llama 3's "llama3" RoPE scaling as a divisor per pair of head dimensions
// [HS/2] (llama.cpp's convert_hf_to_gguf.py writes it; the metadata holds no rope_scaling).
constexpr const char* ROPE_FREQS_TENSOR = "rope_freqs.weight";

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : int32_t { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

}  // namespace tpcli::formats::gguf_keys
