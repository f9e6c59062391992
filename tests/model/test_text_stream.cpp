// model/: the incremental detokenizer holds back what a stop string may still claim, cuts the text
// before a stop string met, and sends whole UTF-8 characters only.
#include <catch2/catch.hpp>

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/text_stream.h"
#include "text/utf8.h"

using namespace tpcli;
using text::TextStream;

namespace {

// A tokenizer of single characters (id = byte), with two ids whose bytes make one UTF-8 character.
class ByteTokenizer : public text::TokenizerInterface {
 public:
  int vocab_size() const override { return 256; }
  std::vector<int> encode_text(std::string_view text, bool) const override {
    std::vector<int> ids;
    for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  std::string decode_ids(std::span<const int> ids, bool) const override {
    std::string s;
    for (const int id : ids) s += static_cast<char>(id);
    return s;
  }
  std::string token_text(int id) const override { return std::string(1, static_cast<char>(id)); }
  std::optional<int> token_id(std::string_view) const override { return std::nullopt; }
  std::string bos_text() const override { return ""; }
  std::string eos_text() const override { return ""; }
};

// The same, decoding as Hugging Face's byte-level decoders do: bytes that are no character become U+FFFD.
class LossyByteTokenizer : public ByteTokenizer {
 public:
  std::string decode_ids(std::span<const int> ids, bool clean_up) const override {
    return text::utf8::lossy(ByteTokenizer::decode_ids(ids, clean_up));
  }
};

std::vector<std::string> pieces(TextStream& s, std::string_view text) {
  std::vector<std::string> out;
  for (const char c : text) out.push_back(s.add(static_cast<unsigned char>(c)));
  out.push_back(s.flush());
  return out;
}

}  // namespace

TEST_CASE("text stream: held back while a stop string may begin, cut before it, whole UTF-8 characters only") {
  const ByteTokenizer tokenizer;
  const std::vector<int> prompt{'>', ' '};
  TextStream plain(tokenizer, prompt, {});
  CHECK(pieces(plain, "ab") == std::vector<std::string>{"a", "b", ""});

  TextStream stopped(tokenizer, prompt, {"END", "xy"});
  CHECK(pieces(stopped, "abENxENDzz") == std::vector<std::string>{"a", "b", "", "", "EN", "x", "", "", "", "", ""});  // "x" may begin "xy"
  CHECK(stopped.stopped());
  CHECK(stopped.text() == "abENx");

  TextStream held(tokenizer, prompt, {"END"});
  CHECK(pieces(held, "aEN") == std::vector<std::string>{"a", "", "", "EN"});  // the sequence ended: what was held is sent
  CHECK(!held.stopped());

  TextStream utf8(tokenizer, prompt, {});
  CHECK(pieces(utf8, "\xc3\xa9!") == std::vector<std::string>{"", "\xc3\xa9", "!", ""});
}

TEST_CASE("text stream: a lossy decoder's U+FFFD for an unfinished character is held back until the character completes") {
  const LossyByteTokenizer tokenizer;
  const std::vector<int> prompt{'>', ' '};
  TextStream utf8(tokenizer, prompt, {});
  CHECK(pieces(utf8, "a\xc3\xa9!") == std::vector<std::string>{"a", "", "\xc3\xa9", "!", ""});
  TextStream invalid(tokenizer, prompt, {});  // a byte that begins no character stays U+FFFD, sent with what follows
  CHECK(pieces(invalid, "a\xff!") == std::vector<std::string>{"a", "", "\xEF\xBF\xBD!", ""});
  TextStream at_end(tokenizer, prompt, {});
  CHECK(pieces(at_end, "a\xc3") == std::vector<std::string>{"a", "", "\xEF\xBF\xBD"});
}

TEST_CASE("text stream: bytes that never make a character are held a few tokens, not to the end") {
  const LossyByteTokenizer tokenizer;
  TextStream stream(tokenizer, std::vector<int>{'>'}, {});
  const std::vector<std::string> out = pieces(stream, std::string(20, '\xff'));
  const std::string fffd = "\xEF\xBF\xBD";
  std::string nine;
  for (int i = 0; i < 9; ++i) nine += fffd;
  for (size_t i = 0; i < 20; ++i) CHECK(out[i] == (i == 8 || i == 17 ? nine : ""));
  CHECK(out[20] == fffd + fffd);  // flush: the last two
}
