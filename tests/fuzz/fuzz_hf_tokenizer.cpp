// libFuzzer target: a Hugging Face tokenizer.json (model vocab and merges, normalizer,
// pre-tokenizer with its regexes, decoder, added tokens), then encoding and decoding with it:
// texts that reach every stage (added-token lookalikes, bytes that are not UTF-8, digits, CJK,
// whitespace runs) and every id the vocabulary has, up to a bound.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "text/hf_tokenizer.h"

namespace {

const std::vector<std::string>& texts() {
  static const std::vector<std::string> t = {
      "Hello, world! It's 2024: 12345 tokens.", "  leading  and\ttrailing \n\n spaces  ",
      "<s>[INST] hi [/INST]</s><|eot_id|><|im_start|>user", "\xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80 caf\xc3\xa9",
      std::string("bad \xff\xfe utf-8 \xc3", 14), "don't can't we'll I'M", ""};
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tpcli::fuzz::InputFile file(data, size);
  try {
    const tpcli::text::HfTokenizer tok(file.path(), tpcli::text::TokenizerConfig{});
    for (const std::string& text : texts()) {
      const std::vector<int> ids = tok.encode_text(text, false);
      (void)tok.decode_ids(ids);
    }
    std::vector<int> every(static_cast<size_t>(std::min(tok.vocab_size(), 2048)));
    for (size_t i = 0; i < every.size(); ++i) every[i] = static_cast<int>(i);
    (void)tok.decode_ids(every);
  } catch (const std::runtime_error& e) {
    tpcli::fuzz::check_error_names(e.what(), file.path());
  }
  return 0;
}
