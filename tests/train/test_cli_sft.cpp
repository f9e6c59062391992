// Supervised fine-tuning through the binary: `tpcli train` on a small chat JSONL from the
// stories260K checkpoint (its loss falls, and `tpcli eval` then finds the memorised answers),
// malformed lines as FILE:LINE errors, and `tpcli eval` on completions whose references are the
// greedy continuations `tpcli infer -t 0` prints (so the expected count is known).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "support/run_tpcli.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"

namespace {

using tpcli::testing::RunResult;

RunResult run_tpcli(const std::string& args) {
  return tpcli::testing::run_tpcli_line(args, {.environment = "OMP_WAIT_POLICY=passive"});
}

std::string q(const std::string& s) { return tpcli::testing::shell_quote(s); }

const std::vector<std::pair<std::string, std::string>> QA = {
    {"What did Lily find?", "Lily found a red ball in the park."},
    {"Who is Tom?", "Tom is a little boy who likes to play."},
    {"What color is the sky?", "The sky is blue and big."},
    {"Where did the cat go?", "The cat went to the garden to sleep."},
    {"What did mom say?", "Mom said it was time for bed."},
    {"Why was Ben sad?", "Ben was sad because his toy broke."}};

std::string chat_line(const std::string& question, const std::string& answer, bool system = false) {
  nlohmann::json messages = nlohmann::json::array();
  if (system) messages.push_back({{"role", "system"}, {"content", "Be brief."}});
  messages.push_back({{"role", "user"}, {"content", question}});
  messages.push_back({{"role", "assistant"}, {"content", answer}});
  return nlohmann::json{{"messages", messages}}.dump() + "\n";
}

std::string last_line(const std::string& text) {
  std::string t = text;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  const size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

std::vector<double> losses(const std::string& metrics_jsonl) {
  std::vector<double> out;
  std::istringstream in(metrics_jsonl);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  return out;
}

}  // namespace

TEST_CASE("tpcli train fine-tunes stories260K on a chat JSONL (data=2, grad_accum=2): the loss falls and tpcli eval finds the answers") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  tpcli::testing::TempDir dir;
  std::string train, val;
  for (const auto& [question, answer] : QA) train += chat_line(question, answer);
  for (size_t i = 0; i < 2; ++i) val += chat_line(QA[i].first, QA[i].second, /*system=*/true);
  dir.write("train.jsonl", train);
  dir.write("val.jsonl", val);
  const std::string config = dir.write("sft.toml",
      "[mesh]\naxes = { data = 2, model = 1 }\n"
      "[model]\ninit_from = \"" + tpcli::testing::shared_path("data/stories260K.bin") + "\"\n"
      "[data]\nformat = \"chat\"\ntemplate = \"zephyr\"\npath = \"train.jsonl\"\nval_path = \"val.jsonl\"\n"
      "tokenizer = \"" + tpcli::testing::shared_path("data/tok512.bin") + "\"\n"
      "[train]\nsteps = 30\nbatch_size = 2\ngrad_accum = 2\nseq_len = 128\nlr = 3e-3\nwarmup_steps = 0\n"
      "eval_every = 10\neval_batches = 1\nsample_tokens = 0\nout_dir = \"" + (dir.path() / "run").string() + "\"\n");
  const RunResult r = run_tpcli("train " + q(config));
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.err.find("6 train / 2 val chat examples") != std::string::npos);
  const std::vector<double> l = losses(tpcli::testing::slurp((dir.path() / "run" / "metrics.jsonl").string()));
  REQUIRE(l.size() == 30);
  CHECK(l.back() < 0.25 * l.front());
  const std::string checkpoint = (dir.path() / "run" / "latest.safetensors").string();

  // The answers are memorised: one reference changed, so 5 of 6 match.
  std::string references;
  for (size_t i = 0; i < QA.size(); ++i) references += chat_line(QA[i].first, i == 3 ? "Something else." : QA[i].second);
  const RunResult e = run_tpcli("eval --model " + q(checkpoint) + " --data " + q(dir.write("refs.jsonl", references)) +
                                " --template zephyr --verbose");
  INFO(e.out << e.err);
  REQUIRE(e.code == 0);
  CHECK(last_line(e.out) == "exact match: 5/6");
}

TEST_CASE("tpcli train: a malformed JSONL line or a too long example fails with FILE:LINE before training") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  tpcli::testing::TempDir dir;
  const std::string good = chat_line("Hi", "Hello");
  struct Bad {
    std::string name, second_line, expect;
  };
  const std::vector<Bad> cases = {
      {"not JSON", "{\"messages\": [\n", "not valid JSON"},
      {"unknown role", R"({"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]})" "\n",
       "unknown role \"robot\""},
      {"too long", chat_line("Tell me a long story", std::string(400, 'a')), "more than train.seq_len + 1"},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    const std::string path = dir.write("train.jsonl", good + c.second_line);
    const std::string config = dir.write("sft.toml",
        "[model]\ninit_from = \"" + tpcli::testing::shared_path("data/stories260K.bin") + "\"\n"
        "[data]\nformat = \"chat\"\ntemplate = \"zephyr\"\npath = \"train.jsonl\"\n"
        "tokenizer = \"" + tpcli::testing::shared_path("data/tok512.bin") + "\"\n"
        "[train]\nsteps = 2\nbatch_size = 1\nseq_len = 64\neval_batches = 0\nsample_tokens = 0\n"
        "out_dir = \"" + (dir.path() / "run").string() + "\"\n");
    const RunResult r = run_tpcli("train " + q(config));
    CHECK(r.code == 2);
    CHECK(r.err.find(path + ":2: ") != std::string::npos);
    CHECK(r.err.find(c.expect) != std::string::npos);
    // truncate = true cuts the long example instead.
    if (c.name == "too long") CHECK(run_tpcli("train " + q(config) + " --set data.truncate=true").code == 0);
  }
  // Issue 39: a prompt longer than the cut keeps no answer token: refused, not trained at loss 0.
  const std::string path = dir.write("train.jsonl", good + chat_line(std::string(400, 'a'), "Hello"));
  const std::string config = dir.write("sft.toml",
      "[model]\ninit_from = \"" + tpcli::testing::shared_path("data/stories260K.bin") + "\"\n"
      "[data]\nformat = \"chat\"\ntemplate = \"zephyr\"\npath = \"train.jsonl\"\ntruncate = true\n"
      "tokenizer = \"" + tpcli::testing::shared_path("data/tok512.bin") + "\"\n"
      "[train]\nsteps = 2\nbatch_size = 1\nseq_len = 64\neval_batches = 0\nsample_tokens = 0\n"
      "out_dir = \"" + (dir.path() / "run").string() + "\"\n");
  const RunResult cut = run_tpcli("train " + q(config));
  INFO(cut.err);
  CHECK(cut.code == 2);
  CHECK(cut.err.find(path + ":2: data.truncate cut the example") != std::string::npos);
  CHECK(cut.out.find("loss 0.0000") == std::string::npos);
}

TEST_CASE("tpcli eval on stories260K completions: exact match counts the references equal to the greedy continuation") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  tpcli::testing::TempDir dir;
  const std::string model = q(tpcli::testing::shared_path("data/stories260K.bin"));
  const std::string tokenizer = q(tpcli::testing::shared_path("data/tok512.bin"));
  // References: what `tpcli infer -t 0` continues each prompt with (to the end of the story or of
  // the context), except for the second prompt, whose reference is wrong.
  const std::vector<std::string> prompts = {"Once upon a time", "The sun", "Tom had a dog"};
  std::string jsonl;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const RunResult r = run_tpcli("infer --model " + model + " -z " + tokenizer + " -t 0 -n 0 -i " + q(prompts[i]));
    REQUIRE(r.code == 0);
    REQUIRE(r.out.rfind(prompts[i], 0) == 0);
    const std::string continuation = i == 1 ? "is not what the model says." : r.out.substr(prompts[i].size());
    jsonl += nlohmann::json{{"prompt", prompts[i]}, {"completion", continuation}}.dump() + "\n";
  }
  const std::string data = q(dir.write("completions.jsonl", jsonl));
  const RunResult e = run_tpcli("eval --model " + model + " -z " + tokenizer + " --data " + data + " --max-tokens 1000 --verbose");
  INFO(e.out << e.err);
  REQUIRE(e.code == 0);
  CHECK(last_line(e.out) == "exact match: 2/3");
  CHECK(e.out.find("{\"example\":2,\"match\":false") != std::string::npos);
  // Tensor-parallel: the same answers.
  CHECK(last_line(run_tpcli("eval --model " + model + " -z " + tokenizer + " --data " + data + " --max-tokens 1000 --devices 2").out) ==
        "exact match: 2/3");
  // A short answer limit: the long references no longer match.
  CHECK(last_line(run_tpcli("eval --model " + model + " -z " + tokenizer + " --data " + data + " --max-tokens 8").out) ==
        "exact match: 0/3");
  // A text example has no prompt: an error naming FILE:LINE.
  const std::string text = dir.write("text.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"completion\": \"b\"}\n");
  const RunResult bad = run_tpcli("eval --model " + model + " -z " + tokenizer + " --data " + q(text));
  CHECK(bad.code == 2);
  CHECK(bad.err.find(text + ":2: ") != std::string::npos);
  // A prompt that fills the context leaves no room to answer: an error naming it, before generating.
  std::string words;
  for (int i = 0; i < 600; ++i) words += "Once upon a time ";
  const std::string longer = dir.write("long.jsonl", nlohmann::json{{"prompt", words}, {"completion", "x"}}.dump() + "\n");
  const RunResult too_long = run_tpcli("eval --model " + model + " -z " + tokenizer + " --data " + q(longer));
  CHECK(too_long.code == 2);
  CHECK(too_long.err.find(longer + ":1: the prompt is ") != std::string::npos);
}
