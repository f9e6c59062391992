// Test support: a serve::PromptModel of one token per byte (id = byte + 1, 0 the beginning of
// sequence), whose chat prompt is "role: content\n" lines: request parsing checked without a
// tokenizer (tests/serve, the fuzz target).
#pragma once

#include <string>
#include <vector>

#include "serve/api_request.h"

namespace tpcli::testing {

inline serve::PromptModel byte_prompt_model(int context) {
  serve::PromptModel m;
  m.name = "tiny";
  m.context = context;
  m.vocab = 257;
  m.encode = [](std::string_view text) {
    std::vector<int> ids{0};
    for (const char c : text) ids.push_back(static_cast<unsigned char>(c) + 1);
    return ids;
  };
  m.chat = [](const nlohmann::ordered_json& messages, const nlohmann::ordered_json&, const nlohmann::ordered_json&) {
    std::vector<int> ids;
    for (const auto& msg : messages)
      for (const char c : msg["role"].get<std::string>() + ": " + msg["content"].get<std::string>() + "\n")
        ids.push_back(static_cast<unsigned char>(c) + 1);
    return ids;
  };
  return m;
}

}  // namespace tpcli::testing
