// `tpcli tokenizer`, `tpcli chat` and infer's -f, run as a user runs them (TPCLI_BINARY with stdin
// from a file): reference ids through the CLI, one-line errors, and a chat with stories260K.bin
// whose fed tokens, positions and streamed text are checked against `tpcli tokenizer`.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "support/run_tpcli.h"
#include "support/temp_dir.h"

using nlohmann::json;
using tpcli::testing::TempDir;

namespace {

const std::string SHARED = TPCLI_SHARED_DIR;

using Result = tpcli::testing::RunResult;

// Runs tpcli with `args` and `input` on stdin.
Result run(const std::vector<std::string>& args, const std::string& input) {
  return tpcli::testing::run_tpcli(args, {.input = input});
}

bool shared_present(const std::string& rel) { return std::filesystem::exists(SHARED + "/" + rel); }

#define REQUIRE_SHARED(rel)                                          \
  if (!shared_present(rel)) {                                        \
    WARN("SKIPPED: " << SHARED << "/" << rel << " is absent");        \
    return;                                                          \
  }

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

void check_one_line_error(const Result& r, const std::string& names) {
  CHECK(r.code == 2);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.find(names) != std::string::npos);
}

}  // namespace

TEST_CASE("tokenizer encode/decode/chat through the CLI give Hugging Face's ids and text") {
  REQUIRE_SHARED("reference/hf-tokenizers/llama3.jsonl");
  const std::string llama3 = SHARED + "/data/hf-tokenizers/llama3";
  std::ifstream in(SHARED + "/reference/hf-tokenizers/llama3.jsonl");
  std::vector<json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  const json& text_case = lines[4];  // code: newlines and indentation
  Result r = run({"tokenizer", "encode", "--tokenizer", llama3}, text_case["text"].get<std::string>());
  REQUIRE(r.code == 0);
  CHECK(json::parse(r.out) == text_case["ids"]);
  r = run({"tokenizer", "encode", "--bos", "--tokenizer", llama3 + "/tokenizer.json"}, "Hi");
  CHECK(json::parse(r.out) == json::array({128000, 13347}));
  r = run({"tokenizer", "decode", "--tokenizer", llama3}, text_case["ids"].dump());
  CHECK(r.out == text_case["text"].get<std::string>());

  const json& chat_case = lines.back();
  r = run({"tokenizer", "chat", "--tokenizer", llama3}, chat_case["chat"].dump());
  CHECK(r.out == chat_case["text"].get<std::string>());
  r = run({"tokenizer", "chat", "--ids", "--tokenizer", llama3}, chat_case["chat"].dump());
  CHECK(json::parse(r.out) == chat_case["ids"]);
}

TEST_CASE("tokenizer on a llama2.c tokenizer.bin: run.c's encoding, <s> and </s> as BOS/EOS") {
  REQUIRE_SHARED("data/tok512.bin");
  const std::string tok = SHARED + "/data/tok512.bin";
  const Result r = run({"tokenizer", "encode", "--bos", "--tokenizer", tok}, "Once upon a time</s>");
  REQUIRE(r.code == 0);
  const json ids = json::parse(r.out);
  CHECK(ids.front() == 1);
  CHECK(ids.back() == 2);
  const Result back = run({"tokenizer", "decode", "--tokenizer", tok}, ids.dump());
  CHECK(back.out == "<s>Once upon a time</s>");  // round trip: BOS/EOS by name, the dummy-prefix space dropped
}

TEST_CASE("tokenizer: bad paths, input and templates are one-line errors naming the culprit") {
  REQUIRE_SHARED("data/hf-tokenizers/llama3/tokenizer.json");
  TempDir dir;
  const std::string mistral = SHARED + "/data/hf-tokenizers/mistral";
  check_one_line_error(run({"tokenizer", "encode", "--tokenizer", "/nonexistent/tok.json"}, "x"), "/nonexistent/tok.json");
  check_one_line_error(run({"tokenizer", "encode", "--tokenizer", dir.path().string()}, "x"), "tokenizer.json");
  const std::string broken = dir.write("broken.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}");
  check_one_line_error(run({"tokenizer", "encode", "--tokenizer", broken}, "x"), "merges[0]");
  const std::string unigram = dir.write("unigram.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}");
  check_one_line_error(run({"tokenizer", "encode", "--tokenizer", unigram}, "x"), "Unigram");
  const std::string truncated = dir.write("truncated.json", "{\"model\": {\"type\": \"BPE\", ");
  check_one_line_error(run({"tokenizer", "encode", "--tokenizer", truncated}, "x"), "truncated.json: not valid JSON");
  check_one_line_error(run({"tokenizer", "decode", "--tokenizer", mistral}, "[1, 99999]"), "99999");
  check_one_line_error(run({"tokenizer", "decode", "--tokenizer", mistral}, "[1,"), "not valid JSON");
  check_one_line_error(run({"tokenizer", "chat", "--tokenizer", mistral}, "[]"), "--template");
  check_one_line_error(run({"tokenizer", "chat", "--tokenizer", mistral, "--template", "nope"}, "[]"), "nope");
  check_one_line_error(run({"tokenizer", "chat", "--tokenizer", mistral, "--template", "mistral"},
                           R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])"),
                       "alternate");
  check_one_line_error(run({"tokenizer", "chat", "--tokenizer", mistral, "--template", "zephyr"}, R"([{"role": 1}])"),
                       "message 0");
}

TEST_CASE("tokenizer chat --chat-template renders a template alone as transformers does, and its raise is exit 1") {
  const std::string refs = "reference/chat-templates";
  REQUIRE_SHARED(refs + "/cases.jsonl");
  const std::string dir = SHARED + "/" + refs;
  std::ifstream cases_file(dir + "/cases.jsonl"), renders_file(dir + "/renders/Qwen-Qwen3-4B.jsonl");
  int checked = 0, raised = 0;
  for (std::string c, r; std::getline(cases_file, c) && std::getline(renders_file, r);) {
    const json render = json::parse(r);
    INFO(render["id"]);
    const Result out = run({"tokenizer", "chat", "--chat-template", dir + "/templates/Qwen-Qwen3-4B.jinja", "--special-tokens",
                            dir + "/templates/Qwen-Qwen3-4B.json", "--now", "2026-07-26"},
                           c);
    if (render.contains("text")) {
      CHECK(out.code == 0);
      CHECK(out.out == render["text"].get<std::string>());
      ++checked;
    } else {
      CHECK(out.code == 1);
      CHECK(out.out.empty());
      CHECK(std::count(out.err.begin(), out.err.end(), '\n') == 1);
      ++raised;
    }
  }
  CHECK(checked + raised == 33);
  check_one_line_error(run({"tokenizer", "chat", "--chat-template", dir + "/templates/Qwen-Qwen3-4B.jinja"}, "{}"),
                       "--special-tokens");
  check_one_line_error(run({"tokenizer", "chat", "--chat-template", dir + "/templates/Qwen-Qwen3-4B.jinja", "--special-tokens",
                            dir + "/templates/Qwen-Qwen3-4B.json"},
                           "[]"),
                       "messages");
}

TEST_CASE("tokenizer chat --chat-template-kwargs passes extra variables to the template (Qwen3's enable_thinking)") {
  REQUIRE_SHARED("data/hf-tokenizers/qwen3/tokenizer_config.json");
  const std::string qwen3 = SHARED + "/data/hf-tokenizers/qwen3";
  const std::string hi = R"([{"role": "user", "content": "Hi"}])";
  const Result thinking = run({"tokenizer", "chat", "--tokenizer", qwen3}, hi);
  const Result quiet = run({"tokenizer", "chat", "--tokenizer", qwen3, "--chat-template-kwargs", R"({"enable_thinking": false})"}, hi);
  REQUIRE(thinking.code == 0);
  REQUIRE(quiet.code == 0);
  CHECK(quiet.out == thinking.out + "<think>\n\n</think>\n\n");
  check_one_line_error(run({"tokenizer", "chat", "--tokenizer", qwen3, "--chat-template-kwargs", "[1]"}, hi), "--chat-template-kwargs");
  check_one_line_error(run({"tokenizer", "chat", "--tokenizer", qwen3, "--chat-template-kwargs", "{"}, hi), "--chat-template-kwargs");
}

namespace {

// Runs `tpcli chat` on two user lines (and a blank one) and checks every turn against `tpcli
// tokenizer`: the tokens fed are the template's ids of the conversation so far past the common
// prefix with what the cache holds (turn 1's prompt and reply but its last pick), positions
// continue from there, replies end at the end-of-turn token or after 12 tokens, and stdout is each
// reply's decode and a newline.
void check_chat(const std::string& model, const std::string& tok, const std::string& template_name, int end_of_turn) {
  const std::vector<std::string> users{"Tell me about a cat.", "What did the dog do?"};
  const Result r = run({"chat", "--model", model, "-z", tok, "--template", template_name, "--devices", "2", "-t", "0",
                        "-n", "12", "--verbose"},
                       users[0] + "\n\n" + users[1] + "\n");
  REQUIRE(r.code == 0);
  std::vector<json> turns;
  for (const std::string& line : lines_of(r.err)) turns.push_back(json::parse(line));
  REQUIRE(turns.size() == 2);  // the blank line is no turn

  json messages = json::array();
  std::vector<int> cached;  // what the KV cache holds after each turn
  std::string streamed;
  for (size_t t = 0; t < 2; ++t) {
    messages.push_back({{"role", "user"}, {"content", users[t]}});
    const Result ids = run({"tokenizer", "chat", "--ids", "--template", template_name, "--tokenizer", tok}, messages.dump());
    const std::vector<int> prompt = json::parse(ids.out).get<std::vector<int>>();
    const size_t common = std::mismatch(prompt.begin(), prompt.end(), cached.begin(), cached.end()).first - prompt.begin();
    CHECK(turns[t]["start"] == common);
    CHECK(turns[t]["fed"] == json(std::vector<int>(prompt.begin() + static_cast<long>(common), prompt.end())));

    std::vector<int> generated = turns[t]["generated"].get<std::vector<int>>();
    const bool ended = turns[t]["end"] == "end_of_turn";
    CHECK(generated.size() <= 12);
    CHECK((ended ? generated.back() == end_of_turn : turns[t]["end"] == "reply_limit" && generated.size() == 12));
    cached = prompt;
    cached.insert(cached.end(), generated.begin(), generated.end() - 1);
    if (ended) generated.pop_back();
    const std::string reply = run({"tokenizer", "decode", "--tokenizer", tok}, json(generated).dump()).out;
    streamed += reply + "\n";
    messages.push_back({{"role", "assistant"}, {"content", reply}});
  }
  // Turn 1's prompt is not fed again (a template may re-tokenize its last token with the reply).
  CHECK(turns[1]["start"].get<size_t>() + 1 >= turns[0]["fed"].size());
  CHECK(r.out == streamed);
}

}  // namespace

TEST_CASE("chat: stories260K over 2 devices feeds the template's ids, continues positions, streams the decode") {
  REQUIRE_SHARED("data/stories260K.bin");
  check_chat(SHARED + "/data/stories260K.bin", SHARED + "/data/tok512.bin", "zephyr", 2);
  // The same model as a Hugging Face directory (bf16, written by tpcli export --to hf).
  TempDir dir;
  const std::string hf = (dir.path() / "hf").string();
  REQUIRE(run({"export", "--model", SHARED + "/data/stories260K.bin", "--to", "hf", "--out", hf}, "").code == 0);
  check_chat(hf, SHARED + "/data/tok512.bin", "llama2", 2);
  check_one_line_error(run({"chat", "--model", hf, "--template", "zephyr"}, "hi\n"), "no tokenizer.json");
}

TEST_CASE("chat: the same with a tokenizer.json directory (mistral's) and a random 32000-token model") {
  REQUIRE_SHARED("data/hf-tokenizers/mistral/tokenizer.json");
  TempDir dir;
  const std::string config = dir.write("v32k.toml", "dim = 32\nhidden_dim = 64\nn_layers = 1\nn_heads = 2\n"
                                                    "n_kv_heads = 2\nseq_len = 256\nvocab_size = 32000\n");
  const std::string model = (dir.path() / "v32k.bin").string();
  REQUIRE(run({"init", "--model-config", config, "--out", model, "--seed", "3"}, "").code == 0);
  check_chat(model, SHARED + "/data/hf-tokenizers/mistral", "mistral", 2);
  for (const char* name : {"llama2", "zephyr"}) check_chat(model, SHARED + "/data/hf-tokenizers/mistral", name, 2);

  // infer with a tokenizer.json: the prompt and what follows, as that tokenizer decodes it.
  const Result r = run({"infer", "--model", model, "-z", SHARED + "/data/hf-tokenizers/mistral", "-i", "Once upon a time",
                        "-n", "20", "-t", "0"}, "");
  REQUIRE(r.code == 0);
  CHECK(r.out.starts_with("Once upon a time"));
  CHECK(r.out.ends_with("\n"));
}

TEST_CASE("chat: a model without a tokenizer, or a vocabulary mismatch, is a one-line error") {
  REQUIRE_SHARED("data/stories260K.bin");
  const std::string model = SHARED + "/data/stories260K.bin";
  check_one_line_error(run({"chat", "--model", model, "--template", "zephyr"}, "hi\n"), "--tokenizer");
  check_one_line_error(run({"chat", "--model", model, "-z", SHARED + "/data/hf-tokenizers/mistral"}, "hi\n"),
                       "vocab_size is 512");
  check_one_line_error(run({"chat", "--model", model, "-z", SHARED + "/data/tokenizer.bin", "--template", "zephyr"}, "hi\n"),
                       "tokenizer.bin");
}

TEST_CASE("infer -f FILE prints what -i with the file's text prints") {
  REQUIRE_SHARED("data/stories260K.bin");
  TempDir dir;
  const std::string prompt = dir.write("prompt.txt", "Once upon a time, there was a dog");
  const std::vector<std::string> common{"infer", "--model", SHARED + "/data/stories260K.bin", "-z",
                                        SHARED + "/data/tok512.bin", "-t", "0", "-n", "40"};
  std::vector<std::string> from_file = common, inline_prompt = common;
  from_file.insert(from_file.end(), {"-f", prompt});
  inline_prompt.insert(inline_prompt.end(), {"-i", "Once upon a time, there was a dog"});
  const Result a = run(from_file, ""), b = run(inline_prompt, "");
  REQUIRE(a.code == 0);
  CHECK(a.out == b.out);
  CHECK(a.out.starts_with("Once upon a time, there was a dog"));
  std::vector<std::string> missing = common;
  missing.insert(missing.end(), {"-f", "/nonexistent/prompt.txt"});
  check_one_line_error(run(missing, ""), "/nonexistent/prompt.txt");
}
