// model/: one rule for the ids that end generation: the config's eos ids, the tokenizer's eos, the
// chat template's end-of-turn tokens, and a llama2.c tokenizer's BOS (run.c), each once; markers the
// tokenizer has no single token for stay as text only; ignore_eos stops at none.
#include <catch2/catch.hpp>

#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/end_of_generation.h"
#include "support/shared_data.h"
#include "text/tokenizer.h"

using namespace tpcli;

namespace {

// Special tokens by name, nothing else.
class NamedTokens : public text::TokenizerInterface {
 public:
  NamedTokens(std::map<std::string, int> ids, std::string eos) : ids_(std::move(ids)), eos_(std::move(eos)) {}
  int vocab_size() const override { return 100; }
  std::vector<int> encode_text(std::string_view, bool) const override { return {}; }
  std::string decode_ids(std::span<const int>, bool) const override { return {}; }
  std::string token_text(int) const override { return {}; }
  std::optional<int> token_id(std::string_view text) const override {
    const auto it = ids_.find(std::string(text));
    return it == ids_.end() ? std::nullopt : std::optional<int>(it->second);
  }
  std::string bos_text() const override { return "<s>"; }
  std::string eos_text() const override { return eos_; }

 private:
  std::map<std::string, int> ids_;
  std::string eos_;
};

}  // namespace

TEST_CASE("end of generation: the config's ids, the tokenizer's eos, the template's end of turn, each once") {
  const NamedTokens tokenizer({{"<|end|>", 5}, {"<|im_end|>", 7}}, "<|end|>");
  const std::vector<int> config = {9, 5};
  const engine::EndOfGeneration plain = engine::end_of_generation(tokenizer, config);
  CHECK(plain.ids == std::vector<int>{9, 5});
  CHECK(plain.texts == std::vector<std::string>{"<|end|>"});

  const text::ChatTemplate chatml = text::chat_template_named("chatml");
  const engine::EndOfGeneration chat = engine::end_of_generation(tokenizer, config, &chatml, {"<s>", "<|end|>"});
  CHECK(chat.ids == std::vector<int>{9, 5, 7});
  CHECK(chat.texts == std::vector<std::string>{"<|end|>", "<|im_end|>"});
  CHECK(chat.stop_ids(false) == chat.ids);
  CHECK(chat.stop_ids(true).empty());  // ignore_eos

  // A marker the tokenizer spells with several tokens is text only; a tokenizer without eos adds nothing.
  const NamedTokens bare({}, "");
  const engine::EndOfGeneration none = engine::end_of_generation(bare, {}, &chatml, {"", ""});
  CHECK(none.ids.empty());
  CHECK(none.texts == std::vector<std::string>{"<|im_end|>"});
}

TEST_CASE("end of generation: a llama2.c tokenizer ends at BOS too, as run.c") {
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  const text::Tokenizer tokenizer(testing::shared_path("data/tok512.bin"), 512);
  const engine::EndOfGeneration end = engine::end_of_generation(tokenizer, {});
  CHECK(end.ids == std::vector<int>{text::BOS_TOKEN, 2});  // BOS, then </s>
  CHECK(end.texts == std::vector<std::string>{"</s>"});
  const text::ChatTemplate zephyr = text::chat_template_named("zephyr");
  CHECK(engine::end_of_generation(tokenizer, std::vector<int>{2}, &zephyr, {"<s>", "</s>"}).ids == std::vector<int>{2, text::BOS_TOKEN});
}
