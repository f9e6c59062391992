// tpcli::text — chat templates as data: the Jinja source of tokenizer_config.json is recognised as
// one of a few known formats by features of its text, and one small renderer writes each format
// exactly as transformers' Jinja rendering of that template does (trim_blocks, lstrip_blocks).
//
// Recognised (first rule that matches wins):
//   llama3-dated  "<|start_header_id|>" and "Cutting Knowledge Date" (Llama 3.1 / 3.2: a system
//                 header with the knowledge cut-off and "Today Date: " + today ("%d %b %Y") when the
//                 source calls strftime_now, else "26 Jul 2024")
//   llama3        "<|start_header_id|>" and "<|eot_id|>" (Llama 3: header per message, content
//                 trimmed, BOS before the first; the assistant header is always added unless the
//                 source tests add_generation_prompt)
//   qwen3         "<|im_start|>" and "</think>" (ChatML with Qwen3's reasoning rules and tool turns)
//   chatml        "<|im_start|>" (Qwen 2.5, SmolLM: a default system turn when the source writes
//                 one literally, '<|im_start|>system\n...<|im_end|>')
//   llama2        "[INST]" and "<<SYS>>" (Llama 2 chat: system folded into the first user turn)
//   mistral       "[INST]" without "<<SYS>>" or "system_message" (Mistral 7B Instruct v0.1)
//   zephyr        "<|user|>" and "<|assistant|>" (Zephyr, TinyLlama chat)
// Anything else is an error; `--template NAME` picks a format by these names instead.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tpcli::text {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
};

enum class ChatFormat { Llama3Dated, Llama3, Qwen3, ChatML, Llama2, Mistral, Zephyr };

struct ChatTemplate {
  ChatFormat format = ChatFormat::ChatML;
  std::string default_system;          // chatml: the system turn written when there is none
  bool generation_prompt_always = false;  // llama3: the assistant header even without asking
  std::string date;                    // llama3-dated: "Today Date: " value
  std::string knowledge_cutoff = "December 2023";  // llama3-dated
};

std::string_view chat_format_name(ChatFormat format);
std::string chat_format_names();  // "llama3, llama3-dated, ..." for messages

// Throws std::runtime_error("... chat template not recognised ...") for an unknown source.
ChatTemplate recognise_chat_template(std::string_view jinja_source);
// Throws std::invalid_argument listing the known names.
ChatTemplate chat_template_named(std::string_view name);

struct ChatTokens {
  std::string bos, eos;  // the tokenizer's bos_token / eos_token text
};

// The prompt for `messages`, with the assistant's opening when `add_generation_prompt`. Throws
// std::invalid_argument where the template raises (roles that do not alternate in llama2/mistral).
std::string render_chat(const ChatTemplate& chat_template, std::span<const ChatMessage> messages,
                        const ChatTokens& tokens, bool add_generation_prompt);

// The tokens that end an assistant turn in this format ("<|eot_id|>", "<|im_end|>", eos).
std::vector<std::string> end_of_turn_tokens(const ChatTemplate& chat_template, const ChatTokens& tokens);

}  // namespace tpcli::text
