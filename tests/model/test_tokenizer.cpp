// Tokenizer vs llama2.c: reference token ids and stdout from llama2.c's run, and a literal
// transcription of run.c's quadratic encode loop as the reference on random text.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <unistd.h>

#include "reference_files.h"
#include "text/tokenizer.h"

using tpcli::text::Tokenizer;
using namespace tpcli::testing;

namespace {

// run.c's encode as written there (linear lookups, rescans every pair after every merge).
std::vector<int> run_c_encode(const Tokenizer& t, const std::string& text) {
  auto lookup = [&](const std::string& s) {
    for (int i = 0; i < t.vocab_size(); ++i)
      if (t.piece(i) == s) return i;
    return -1;
  };
  std::vector<int> tokens{1};
  if (!text.empty()) tokens.push_back(lookup(" "));
  std::string buf;
  for (size_t c = 0; c < text.size(); ++c) {
    if ((text[c] & 0xC0) != 0x80) buf.clear();
    buf += text[c];
    if (c + 1 < text.size() && (text[c + 1] & 0xC0) == 0x80 && buf.size() < 4) continue;
    int id = lookup(buf);
    if (id != -1) {
      tokens.push_back(id);
    } else {
      for (unsigned char b : buf) tokens.push_back(b + 3);
    }
    buf.clear();
  }
  for (;;) {
    float best_score = -1e10f;
    int best_id = -1, best_idx = -1;
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      int id = lookup(t.piece(tokens[i]) + t.piece(tokens[i + 1]));
      if (id != -1 && t.score(id) > best_score) {
        best_score = t.score(id);
        best_id = id;
        best_idx = static_cast<int>(i);
      }
    }
    if (best_idx == -1) break;
    tokens[static_cast<size_t>(best_idx)] = best_id;
    tokens.erase(tokens.begin() + best_idx + 1);
  }
  return tokens;
}

std::string decode_all(const Tokenizer& t, const std::vector<int>& ids) {
  std::string text;
  for (size_t i = 1; i < ids.size(); ++i) text += Tokenizer::printable_piece(t.decode(ids[i - 1], ids[i]));
  return text;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("tpcli_test_tok_" + std::to_string(::getpid()) + "_" + name)).string();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("tokenizer encodes the reference prompts to llama2.c's ids", "[tokenizer]") {
  TPCLI_REQUIRE_SHARED("reference/stories260K_tokens.txt");
  Tokenizer tok(shared_path("data/tok512.bin"), 512);
  std::ifstream in(shared_path("reference/stories260K_tokens.txt"));
  std::string line, prompt;
  int checked = 0;
  while (std::getline(in, line)) {
    if (line.rfind("== prompt=", 0) == 0) {
      const auto start = line.find('"'), end = line.find("\" args=");
      prompt = line.substr(start + 1, end - start - 1);
    } else if (line.rfind("PROMPT_TOKENS", 0) == 0) {
      const auto expected = parse_ints(line.substr(line.find(':') + 1));
      CHECK(tok.encode(prompt, true, false) == expected);
      ++checked;
    }
  }
  CHECK(checked >= 2);
  for (const auto& c : read_run_cases()) {
    const auto ids = tok.encode(c.prompt, true, false);
    REQUIRE(ids.size() <= c.token_ids.size());
    CHECK(std::vector<int>(c.token_ids.begin(), c.token_ids.begin() + static_cast<long>(ids.size())) == ids);
  }
}

TEST_CASE("tokenizer decodes the reference token ids to llama2.c's stdout", "[tokenizer]") {
  TPCLI_REQUIRE_SHARED("reference/llama2c_stories260K.tsv");
  Tokenizer tok(shared_path("data/tok512.bin"), 512);
  const auto cases = read_run_cases();
  REQUIRE(cases.size() >= 4);
  for (const auto& c : cases) {
    INFO(c.name);
    auto ids = c.token_ids;
    if (ids.back() == 1) ids.pop_back();  // stopped on BOS: not printed
    const std::string text = decode_all(tok, ids);
    CHECK(text + "\n" == c.stdout_text);
    // Round trip: the printed text encodes back to ids that decode to the same text.
    CHECK(decode_all(tok, tok.encode(text, true, false)) == text);
  }
}

TEST_CASE("tokenizer round-trips the reference ids of the prompt", "[tokenizer]") {
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  Tokenizer tok(shared_path("data/tok512.bin"), 512);
  const std::vector<int> ids{1, 403, 407, 261, 378};  // "Once upon a time" per llama2.c
  CHECK(decode_all(tok, ids) == "Once upon a time");
  CHECK(tok.encode(decode_all(tok, ids), true, false) == ids);
  CHECK(tok.encode("", true, false) == std::vector<int>{1});
  CHECK(tok.encode("", true, true) == std::vector<int>{1, 2});
  CHECK(tok.encode("", false, false).empty());
}

TEST_CASE("tokenizer matches run.c's encode loop on random text, byte fallback included", "[tokenizer]") {
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  for (const auto& [file, vocab] : {std::pair{"data/tok512.bin", 512}, std::pair{"data/tokenizer.bin", 32000}}) {
    if (!shared_present(file)) continue;
    Tokenizer tok(shared_path(file), vocab);
    std::mt19937 rng(1234);
    const std::vector<std::string> alphabet{"a", "b", "e", "t", "h", " ", "  ", "\n", ".", ",", "the", "é",
                                            "日本", "\xF0\x9F\x98\x80", "\x80", "\xFF", "Once", "q", "z", "Z"};
    for (int trial = 0; trial < (vocab == 512 ? 60 : 15); ++trial) {
      std::string text;
      const int pieces = std::uniform_int_distribution<int>(0, 40)(rng);
      for (int i = 0; i < pieces; ++i) text += alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
      INFO(file << " text: " << text);
      CHECK(tok.encode(text, true, false) == run_c_encode(tok, text));
    }
  }
}

TEST_CASE("tokenizer byte fallback: <0xNN> ids are byte + 3 and decode to the raw byte", "[tokenizer]") {
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  Tokenizer tok(shared_path("data/tok512.bin"), 512);
  // "ß" = C3 9F is not a token of the 512-token vocabulary ("é" = C3 A9 is, id 485): two byte
  // tokens follow the dummy space.
  REQUIRE(tok.piece(0xC3 + 3) == "<0xC3>");
  int space = -1;
  for (int i = 0; i < tok.vocab_size(); ++i)
    if (tok.piece(i) == " ") space = i;
  CHECK(tok.encode("\xC3\xA9", true, false) == std::vector<int>{1, space, 485});
  const auto ids = tok.encode("\xC3\x9F", true, false);
  REQUIRE(ids.size() == 4);
  CHECK(ids[2] == 0xC3 + 3);
  CHECK(ids[3] == 0x9F + 3);
  CHECK(tok.decode(ids[1], ids[2]) == "\xC3");
  // safe_printf drops a single unprintable byte, keeps printable ones and whitespace.
  CHECK(Tokenizer::printable_piece("\xC3").empty());
  CHECK(Tokenizer::printable_piece("\x01").empty());
  CHECK(Tokenizer::printable_piece("\n") == "\n");
  CHECK(Tokenizer::printable_piece("a") == "a");
  CHECK(tok.decode(1, 0x0A + 3) == "\n");
  CHECK(tok.decode(1, 0x00 + 3).empty());  // byte 0 is an empty C string
  // Leading space stripped only right after BOS.
  REQUIRE(tok.piece(261) == " a");
  CHECK(tok.decode(1, 261) == "a");
  CHECK(tok.decode(403, 261) == " a");
}

// Its speed is `tpcli bench tokenizer`'s business (a ratio in one run), not a timed test's.
TEST_CASE("tokenizer encodes the 1 MB tinyshakespeare corpus and decodes it back", "[tokenizer]") {
  TPCLI_REQUIRE_SHARED("data/tinyshakespeare.txt");
  Tokenizer tok(shared_path("data/tok512.bin"), 512);
  const std::string text = read_bytes(shared_path("data/tinyshakespeare.txt"));
  const auto ids = tok.encode(text, false, false);
  CHECK(ids.size() > text.size() / 8);
  CHECK(ids.size() < text.size());
  // The encoding reproduces the text (no byte tokens needed for ASCII, so nothing is dropped).
  std::string back;
  for (size_t i = 0; i < ids.size(); ++i) back += tok.decode(i ? ids[i - 1] : 0, ids[i]);
  CHECK(back == " " + text);
}

TEST_CASE("tokenizer save writes the llama2.c file back byte for byte", "[tokenizer]") {
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  Tokenizer tok(shared_path("data/tok512.bin"), 512);
  const std::string out = temp_path("save.bin");
  tok.save(out);
  CHECK(read_bytes(out) == read_bytes(shared_path("data/tok512.bin")));
  std::filesystem::remove(out);
}

TEST_CASE("tokenizer rejects bad files with a one-line error naming the file", "[tokenizer]") {
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  const std::string good = read_bytes(shared_path("data/tok512.bin"));
  const std::string path = temp_path("bad.bin");
  auto error_of = [&](const std::string& bytes, int vocab) -> std::string {
    write_bytes(path, bytes);
    try {
      Tokenizer t(path, vocab);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  };
  auto one_line_naming_file = [&](const std::string& msg) {
    INFO(msg);
    CHECK(msg.find(path) == 0);
    CHECK(msg.find('\n') == std::string::npos);
  };
  std::string msg = error_of(good.substr(0, good.size() - 3), 512);  // truncated record
  one_line_naming_file(msg);
  CHECK(msg.find("record 511") != std::string::npos);
  msg = error_of(good, 32000);  // wrong model
  one_line_naming_file(msg);
  CHECK(msg.find("vocab_size is 32000") != std::string::npos);
  msg = error_of(std::string("\xff\xff\xff\x7f garbage garbage", 20), 512);
  one_line_naming_file(msg);
  msg = error_of("", 512);
  one_line_naming_file(msg);
  std::string huge_len = good;
  const int32_t len = 1 << 30;
  std::memcpy(huge_len.data() + 8, &len, 4);  // first record's length
  msg = error_of(huge_len, 512);
  one_line_naming_file(msg);
  CHECK(msg.find("length") != std::string::npos);
  CHECK_THROWS_WITH(Tokenizer("/nonexistent/tok.bin", 512), Catch::Contains("/nonexistent/tok.bin"));
  std::filesystem::remove(path);
}
