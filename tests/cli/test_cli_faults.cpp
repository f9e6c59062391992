// The command line under bad input (issue 12): CLI11's errors are one line with the tpcli prefix;
// a FIFO or a directory where a file belongs is refused by name at once; NaN sampling settings
// are refused before anything runs. Issue 25: a prompt file or chat line is bounded by what the
// context holds; numeric flags out of range are refused by name; a chat that outgrows its context
// exits non-zero; an export folder appears whole or not at all, even on a full disk.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/poisoned_model.h"
#include "support/run_tpcli.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;

using tpcli::testing::scratch;

namespace {

using Run = tpcli::testing::RunResult;

// Under a 20 s timeout: a blocked open fails the test (exit 124) instead of hanging the suite.
Run run_tpcli(const std::string& args) {
  return tpcli::testing::run_tpcli_line(
      args, {.cwd = TPCLI_SOURCE_DIR, .environment = "OMP_WAIT_POLICY=passive", .timeout_seconds = 20});
}

int lines_of(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

// A usage error: exit 2, one line on stderr, starting with `start`.
void check_usage_error(const Run& r, const std::string& start) {
  INFO("stderr: " << r.err);
  CHECK(r.code == 2);
  CHECK(lines_of(r.err) == 1);
  CHECK(r.err.rfind(start, 0) == 0);
}

// A random-weight model with a 512-token vocabulary (models/stories260K.toml), made once.
const std::string& model_file() {
  static const std::string path = [] {
    const std::string p = (scratch() / "model.bin").string();
    const Run r = run_tpcli("init --model-config models/stories260K.toml --out " + p + " --seed 1");
    REQUIRE(r.code == 0);
    return p;
  }();
  return path;
}

}  // namespace

TEST_CASE("cli faults: CLI11's errors are one line with the tpcli prefix, exit 2") {
  for (const auto& [args, expect] : std::vector<std::pair<std::string, std::string>>{
           {"infer", "tpcli infer: --model is required"},
           {"infer --model x --bogus", "tpcli infer: "},
           {"train", "tpcli train: "},
           {"infer --model x -n notanumber", "tpcli infer: "},
           {"nosuchcommand", "tpcli: "}}) {
    INFO("tpcli " << args);
    check_usage_error(run_tpcli(args), expect);
  }
  const Run help = run_tpcli("infer --help");  // help stays CLI11's, exit 0
  CHECK(help.code == 0);
  CHECK(help.out.find("--model") != std::string::npos);
}

TEST_CASE("cli faults: a FIFO as --model or -z is refused by name at once") {
  const std::string fifo = (scratch() / "pipe").string();
  fs::remove(fifo);
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const std::string& args : {"infer --model " + fifo, "infer --model " + model_file() + " -z " + fifo + " -n 4",
                                  "inspect " + fifo + ".bin"}) {
    INFO("tpcli " << args);
    if (args.starts_with("inspect")) fs::rename(fifo, fifo + ".bin");
    const Run r = run_tpcli(args);
    INFO("stderr: " << r.err);
    CHECK(r.code != 0);
    CHECK(r.code != 124);  // not killed by the timeout
    CHECK(r.seconds < 10);
    CHECK(lines_of(r.err) == 1);
    CHECK(r.err.find("is a FIFO (named pipe)") != std::string::npos);
  }
}

// A directory is a valid -z when it holds a tokenizer.json; an empty one is refused by name.
TEST_CASE("cli faults: a tokenizer path that is a directory names the path") {
  const std::string dir = scratch().string();
  const Run r = run_tpcli("infer --model " + model_file() + " -z " + dir + " -n 4");
  INFO("stderr: " << r.err);
  CHECK(r.code == 2);
  CHECK(lines_of(r.err) == 1);
  CHECK(r.err.find(dir + ": no tokenizer.json in this directory") != std::string::npos);
}

namespace {

// A tokenizer.json whose `key` is Sequences nested `depth` deep around `leaf`, as text (the
// file the crash was reported with: 2.8 MB at 100,000 levels).
std::string nested_tokenizer_json(const std::string& key, const std::string& list_key, const std::string& leaf, int depth) {
  std::string nested;
  for (int i = 0; i < depth; ++i) nested += R"({"type":"Sequence",")" + list_key + R"(":[)";
  nested += leaf;
  for (int i = 0; i < depth; ++i) nested += "]}";
  return R"({"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":[]},")" + key + "\":" + nested + "}";
}

}  // namespace

// RLIMIT_DATA bounds the heap and every private mapping, thread stacks included. Not under
// AddressSanitizer, which maps terabytes of shadow memory at start-up and dies under the limit.
#if defined(__SANITIZE_ADDRESS__)
constexpr const char* MODEST_MEMORY = "";
#else
constexpr const char* MODEST_MEMORY = "prlimit --data=400000000";
#endif

TEST_CASE("cli faults: Sequences nested 100,000 deep in tokenizer.json are one line, no crash, in modest memory") {
  const std::string parts[][3] = {{"decoder", "decoders", R"({"type":"Fuse"})"},
                                   {"normalizer", "normalizers", R"({"type":"Lowercase"})"},
                                   {"pre_tokenizer", "pretokenizers", R"({"type":"Digits"})"}};
  for (const auto& [key, list_key, leaf] : parts) {
    INFO(key);
    const fs::path dir = scratch() / ("nested_" + key);
    fs::create_directories(dir);
    const std::string path = (dir / "tokenizer.json").string();
    std::ofstream(path) << nested_tokenizer_json(key, list_key, leaf, 100000);
    // Before the fix: a stack overflow (exit 139); at 10,000 levels, 1 GB of key-path strings.
    const Run r = tpcli::testing::run_tpcli_line(
        "tokenizer decode --tokenizer " + dir.string(),
        {.cwd = TPCLI_SOURCE_DIR, .environment = "OMP_WAIT_POLICY=passive", .input = "[0, 1]", .timeout_seconds = 20,
         .launcher = MODEST_MEMORY});
    INFO("exit " << r.code << ", stderr: " << r.err);
    CHECK(r.code > 0);
    CHECK(r.code < 128);
    CHECK(lines_of(r.err) == 1);
    CHECK(r.err.find(path + ": " + key + ": JSON nested deeper than 256 levels") != std::string::npos);
  }
}

TEST_CASE("cli faults: -t nan and -p nan are refused with one line before generating") {
  for (const std::string flag : {"-t nan", "-p nan", "-t inf"}) {
    INFO(flag);
    const Run r = run_tpcli("infer --model " + model_file() + " -z /nonexistent/tok.bin -n 4 " + flag);
    INFO("stderr: " << r.err);
    CHECK(r.code == 2);
    CHECK(lines_of(r.err) == 1);
    CHECK(r.err.find("is not a finite number") != std::string::npos);
    CHECK(r.out.empty());
  }
}

namespace {

// A one-line error, exit 2, that names `names`, within the timeout.
void check_one_line_error(const Run& r, const std::string& names) {
  INFO("stderr: " << r.err);
  CHECK(r.code == 2);
  CHECK(lines_of(r.err) == 1);
  CHECK(r.err.find(names) != std::string::npos);
}

// Entries of `dir` whose names start with `prefix` (an export's temporaries: OUT.tmp-XXXXXX).
std::vector<std::string> entries_starting(const fs::path& dir, const std::string& prefix) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().starts_with(prefix)) names.push_back(entry.path().filename().string());
  return names;
}

}  // namespace

TEST_CASE("cli faults: infer -f refuses a device, a directory, and a file too big for the context, by name") {
  const std::string base = "infer --model " + model_file() + " -z /nonexistent/tok.bin -n 4 -f ";
  const Run zero = run_tpcli(base + "/dev/zero");  // was: read until memory ran out (15.8 GB)
  CHECK(zero.seconds < 10);
  check_one_line_error(zero, "/dev/zero: is a character device, not a prompt file");
  check_one_line_error(run_tpcli(base + scratch().string()), scratch().string() + ": is a directory");
  // seq_len 512: more than 512 x 256 bytes cannot fit, whatever the tokenizer; refused from the size.
  const tpcli::testing::TempDir dir;
  const std::string big = dir.write("big.txt", std::string(512 * 256 + 1, 'a'));
  check_one_line_error(run_tpcli(base + big), big + ": more than 131072 bytes");
  const std::string fits = dir.write("fits.txt", std::string(512 * 256, 'a'));
  CHECK(run_tpcli(base + fits).err.find("more than 131072 bytes") == std::string::npos);
}

TEST_CASE("cli faults: a prompt of more tokens than the context is refused naming its file, not truncated") {
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  const std::string tokenizer = tpcli::testing::shared_path("data/tok512.bin");
  const tpcli::testing::TempDir dir;
  std::string story;
  for (int i = 0; i < 20; ++i) story += "Once upon a time, there was a little dog. ";
  const std::string prompt = dir.write("prompt.txt", story);  // ~200 tokens
  const std::string base = "infer --model " + model_file() + " -z " + tokenizer + " -n 0 -t 0 ";
  const Run r = run_tpcli(base + "--context 64 -f " + prompt);
  check_one_line_error(r, prompt + ": the prompt is ");
  CHECK(r.err.find("more than the model's context of 64 positions") != std::string::npos);
  CHECK(r.out.empty());
  check_one_line_error(run_tpcli(base + "--context 64 -i '" + story + "'"), "-i/--prompt: the prompt is ");
  CHECK(run_tpcli(base + "-f " + prompt).code == 0);  // the model's own 512 positions hold it
}

TEST_CASE("cli faults: numeric flags out of range are one-line errors naming the flag") {
  const tpcli::testing::TempDir dir;
  const std::string text = dir.write("t.txt", std::string(3000, 'x'));
  const std::string out = (dir.path() / "shards").string();
  for (const std::string value : {"nan", "inf", "-0.5", "1"}) {  // nan was accepted, and wrote nothing
    INFO("--val-fraction " << value);
    check_one_line_error(run_tpcli("tokenize --tokenizer bytes --out " + out + " --val-fraction " + value + " " + text),
                         "--val-fraction");
    CHECK(!fs::exists(out));
  }
  check_one_line_error(run_tpcli("tokenize --tokenizer bytes --out " + out + " --jobs -4 " + text), "--jobs");
  check_one_line_error(run_tpcli("perplexity --model " + model_file() + " --data " + text + " --windows -1"), "--windows");
  // stories260K has 2 + 5 x 9 = 47 tensors; each shard holds whole ones (was: "100000 files", 47 written).
  const Run shards = run_tpcli("export --to hf --model " + model_file() + " --out " + out + " --shards 100000");
  check_one_line_error(shards, "--shards 100000");
  CHECK(shards.err.find("at most 47") != std::string::npos);
  CHECK(!fs::exists(out));
}

TEST_CASE("cli faults: export --to hf reports the files it wrote, and the folder must be absent or empty") {
  const tpcli::testing::TempDir dir;
  const std::string out = (dir.path() / "hf").string();
  const Run all = run_tpcli("export --to hf --model " + model_file() + " --out " + out + " --shards 47");
  INFO("stderr: " << all.err);
  REQUIRE(all.code == 0);
  int files = 0;
  for (const auto& entry : fs::directory_iterator(out)) files += entry.path().extension() == ".safetensors";
  CHECK(all.err.find(", " + std::to_string(files) + " safetensors files,") != std::string::npos);
  CHECK(fs::exists(fs::path(out) / "config.json"));
  CHECK(entries_starting(dir.path(), "hf.tmp-").empty());
  // A folder holding anything is not written over; an empty one is replaced.
  check_one_line_error(run_tpcli("export --to hf --model " + model_file() + " --out " + out), out + ": already holds a model");
  const std::string other = dir.write("other/notes.txt", "mine");
  check_one_line_error(run_tpcli("export --to hf --model " + model_file() + " --out " + (dir.path() / "other").string()),
                       (dir.path() / "other").string() + ": already exists and is not empty");
  CHECK(tpcli::testing::slurp(other) == "mine");
  const std::string empty = (dir.path() / "empty").string();
  fs::create_directories(empty);
  CHECK(run_tpcli("export --to hf --model " + model_file() + " --out " + empty + "/").code == 0);
  CHECK(fs::exists(fs::path(empty) / "model.safetensors"));
}

// RLIMIT_FSIZE stands in for a full disk: a write past it fails with EFBIG (SIGXFSZ ignored, as
// its default action would kill the process). The limit lets the first shard through and stops a
// later, bigger one, as a disk that fills half way.
TEST_CASE("cli faults: export --to hf onto a full disk leaves no folder and no temporary") {
  const tpcli::testing::TempDir dir;
  const std::string export_line = "export --to hf --model " + model_file() + " --shards 4 --dtype f32 --out ";
  const fs::path whole = dir.path() / "whole";
  REQUIRE(run_tpcli(export_line + whole.string()).code == 0);
  const uintmax_t first = fs::file_size(whole / "model-00001-of-00004.safetensors");
  uintmax_t largest = 0;
  for (const char* later : {"model-00002-of-00004.safetensors", "model-00003-of-00004.safetensors",
                            "model-00004-of-00004.safetensors"})
    largest = std::max(largest, fs::file_size(whole / later));
  REQUIRE(largest > first);
  const std::string out = (dir.path() / "hf").string();
  const Run r = tpcli::testing::run_tpcli_line(
      export_line + out,
      {.cwd = TPCLI_SOURCE_DIR, .timeout_seconds = 20,
       .launcher = "prlimit --fsize=" + std::to_string(first) + " sh -c 'trap \"\" XFSZ; exec \"$0\" \"$@\"'"});
  INFO("stderr: " << r.err);
  CHECK(r.code == 2);
  CHECK(lines_of(r.err) == 1);
  CHECK(r.err.find("-of-00004.safetensors") != std::string::npos);  // names the shard that failed
  CHECK(r.err.find("File too large") != std::string::npos);
  CHECK(!fs::exists(out));
  CHECK(entries_starting(dir.path(), "hf").empty());
}

TEST_CASE("cli faults: chat that outgrows its context says so in one line and exits 1, not 0") {
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  const std::string chat = "chat --model " + model_file() + " -z " + tpcli::testing::shared_path("data/tok512.bin") +
                           " --template zephyr -t 0 ";
  auto run_chat = [&](const std::string& flags, const std::string& input) {
    return tpcli::testing::run_tpcli_line(chat + flags, {.cwd = TPCLI_SOURCE_DIR, .environment = "OMP_WAIT_POLICY=passive",
                                                         .input = input, .timeout_seconds = 20});
  };
  // A reply cut short by the context's end.
  const Run cut = run_chat("--context 40 -n 200", "Hi there.\nAnd then?\n");
  INFO("stderr: " << cut.err);
  CHECK(cut.code == 1);
  CHECK(lines_of(cut.err) == 1);
  CHECK(cut.err.find("tpcli chat: the model's context of 40 positions is full: reply 1 was cut short") == 0);
  // A turn whose conversation no longer fits.
  std::string long_turn;
  for (int i = 0; i < 10; ++i) long_turn += "Tell me a story about a dog. ";
  const Run unanswered = run_chat("--context 40 -n 4", long_turn + "\n");
  INFO("stderr: " << unanswered.err);
  CHECK(unanswered.code == 1);
  CHECK(lines_of(unanswered.err) == 1);
  CHECK(unanswered.err.find("no longer fits the model's context of 40") != std::string::npos);
  // A line longer than 16 positions x 256 bytes can hold is not read on (stdin may be /dev/zero).
  check_one_line_error(run_chat("--context 16 -n 4", std::string(5000, 'a') + "\n"),
                       "stdin: line 1 is longer than 4096 bytes");
  const Run fits = run_chat("-n 4", "Hi there.\n");
  INFO("stderr: " << fits.err);
  CHECK(fits.code == 0);
}

// As export: the shards of a run that fails half way (here file b's shard does not fit under
// RLIMIT_FSIZE, a stand-in for a full disk) must not be left for a training glob to pick up.
TEST_CASE("cli faults: tokenize onto a full disk leaves no folder, and a non-empty --out is refused") {
  const tpcli::testing::TempDir dir;
  const std::string a = dir.write("a.txt", std::string(1000, 'a')), b = dir.write("b.txt", std::string(100000, 'b'));
  const std::string out = (dir.path() / "shards").string();
  const Run r = tpcli::testing::run_tpcli_line(
      "tokenize --tokenizer bytes --jobs 1 --val-fraction 0 --out " + out + " " + a + " " + b,
      {.cwd = TPCLI_SOURCE_DIR, .timeout_seconds = 20,
       .launcher = "prlimit --fsize=65536 sh -c 'trap \"\" XFSZ; exec \"$0\" \"$@\"'"});
  INFO("stderr: " << r.err);
  CHECK(r.code != 0);
  CHECK(r.err.find("b_train_000000.bin") != std::string::npos);
  CHECK(!fs::exists(out));
  CHECK(entries_starting(dir.path(), "shards").empty());
  REQUIRE(run_tpcli("tokenize --tokenizer bytes --out " + out + " " + a).code == 0);
  CHECK(fs::exists(fs::path(out) / "a_train_000000.bin"));
  check_one_line_error(run_tpcli("tokenize --tokenizer bytes --out " + out + " " + a), "--out " + out + ": already exists");
}

// Issue 25: absurd modelled links ran forever (or, inf, did nothing).
TEST_CASE("cli faults: absurd --link values are one line naming the flag and the bound, exit 2") {
  for (const auto& [args, expect] : std::vector<std::pair<std::string, std::string>>{
           {"infer --model " + model_file() + " -n 2 --devices 2 --link model=1,1e12",
            "tpcli infer: --link model=1,1e12: latency 1e+12 us is beyond 1e+06 us"},
           {"infer --model " + model_file() + " -n 2 --devices 2 --link model=1e-12,1",
            "tpcli infer: --link model=1e-12,1: bandwidth 1e-12 GB/s is below 0.001 GB/s"},
           {"infer --model " + model_file() + " -n 2 --devices 2 --link model=1,inf",
            "tpcli infer: --link model=1,inf: latency inf us is not a finite number >= 0"}}) {
    INFO("tpcli " << args);
    check_usage_error(run_tpcli(args), expect);
  }
}

// Issue 25: -n 1000 started a thousand processes.
TEST_CASE("cli faults: launch -n beyond the ranks a host may run is one line naming -n, exit 2") {
  check_usage_error(run_tpcli("launch -n 1000 -- true"),
                    "tpcli launch: -n 1000: 1000 ranks on this machine, more than the 256 a host may run");
}

// Issue 39, items 5 and 6: a batch run's memory follows --parallel, not the file; endless lines
// and devices are refused by name.
TEST_CASE("cli faults: infer --batch and eval refuse /dev/zero and a line past the bound, naming file and line") {
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  const std::string tok = tpcli::testing::shared_path("data/tok512.bin");
  const std::string batch = "infer --model " + model_file() + " -z " + tok + " --batch ";
  const std::string eval = "eval --model " + model_file() + " -z " + tok + " --data ";
  for (const std::string& command : {batch, eval}) {  // were: 6.8 GB in 16 s, 1.2 GB in 6 s
    const Run zero = run_tpcli(command + "/dev/zero");
    CHECK(zero.seconds < 10);
    check_one_line_error(zero, "/dev/zero: is a character device, not a JSONL file");
  }
  const tpcli::testing::TempDir dir;
  const std::string endless = dir.write("endless.jsonl", "{\"prompt\": \"hi\"}\n{\"prompt\": \"" + std::string(17 << 20, 'a'));
  check_one_line_error(run_tpcli(batch + endless), endless + ":2: line 2 is longer than 16777216 bytes");
  const std::string endless_examples =
      dir.write("endless_examples.jsonl", "{\"prompt\": \"hi\", \"completion\": \"yes\"}\n{\"prompt\": \"" + std::string(17 << 20, 'a'));
  check_one_line_error(run_tpcli(eval + endless_examples), endless_examples + ":2: line 2 is longer than 16777216 bytes");
}

TEST_CASE("cli faults: infer --batch lines: a max_tokens past int, an unknown key, messages without a template are named") {
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  const std::string batch = "infer --model " + model_file() + " -z " + tpcli::testing::shared_path("data/tok512.bin") + " --batch ";
  const tpcli::testing::TempDir dir;
  const std::string wraps = dir.write("wraps.jsonl", "{\"prompt\": \"hi\"}\n{\"prompt\": \"hi\", \"max_tokens\": 4294967297}\n");
  const Run wrapped = run_tpcli(batch + wraps);  // was: read as 1
  check_one_line_error(wrapped, wraps + ":2: \"max_tokens\" = 4294967297 is not an integer in [1, 2147483647]");
  CHECK(wrapped.out.empty());
  const std::string unknown = dir.write("unknown.jsonl", "{\"prompt\": \"hi\", \"max_token\": 4}\n");
  check_one_line_error(run_tpcli(batch + unknown), unknown + ":1: unknown key \"max_token\" (a line holds prompt, messages,");
  // The error's advice is a flag infer has.
  const std::string chat = dir.write("chat.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 2}\n");
  const Run no_template = run_tpcli(batch + chat);
  check_one_line_error(no_template, "--template NAME");
  const Run with_template = run_tpcli(batch + chat + " --template zephyr -t 0");
  INFO("stderr: " << with_template.err);
  CHECK(with_template.code == 0);
  CHECK(with_template.out.find("\"index\":0") != std::string::npos);
}

TEST_CASE("cli faults: infer --batch lines and infer's flags: a sampling parameter out of range is named, a bias is obeyed") {
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  const std::string batch = "infer --model " + model_file() + " -z " + tpcli::testing::shared_path("data/tok512.bin") + " --batch ";
  const tpcli::testing::TempDir dir;
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"\"top_k\": -3", "'top_k' must be an integer"},     {"\"min_p\": 1.5", "'min_p' must be between 0 and 1"},
      {"\"presence_penalty\": 3", "'presence_penalty'"}, {"\"frequency_penalty\": \"1\"", "'frequency_penalty' must be a number"},
      {"\"repetition_penalty\": 0", "'repetition_penalty'"}, {"\"logit_bias\": {\"512\": 1}", "'logit_bias' keys must be token ids from 0 to 511"},
  };
  for (const auto& [field, message] : bad) {
    const std::string file = dir.write("bad.jsonl", "{\"prompt\": \"hi\"}\n{\"prompt\": \"hi\", " + field + "}\n");
    check_one_line_error(run_tpcli(batch + file), file + ":2: " + message);
  }
  check_one_line_error(run_tpcli(batch + dir.write("ok.jsonl", "{\"prompt\": \"hi\"}\n") + " --min-p 2"), "--min-p: 'min_p' must be between 0 and 1");
  // Greedy with a bias of 100 on one token: every token is it (tok512's 400 is one piece of text).
  const std::string biased = dir.write("biased.jsonl", "{\"prompt\": \"hi\", \"max_tokens\": 5, \"temperature\": 0, \"logit_bias\": {\"400\": 100}}\n"
                                                        "{\"prompt\": \"hi\", \"max_tokens\": 5, \"temperature\": 0}\n");
  const Run r = run_tpcli(batch + biased);
  INFO("stderr: " << r.err);
  REQUIRE(r.code == 0);
  const nlohmann::json first = nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
  CHECK(first["tokens"] == 5);
  const std::string text = first["text"];
  REQUIRE(text.size() % 5 == 0);
  std::string five;
  for (int i = 0; i < 5; ++i) five += text.substr(0, text.size() / 5);
  CHECK(text == five);
  const Run plain = run_tpcli(batch + biased + " --top-k 1 --frequency-penalty 0.5");  // flags are the lines' defaults
  CHECK(plain.code == 0);
}

TEST_CASE("cli faults: infer --batch holds no vocabulary-sized buffer per line: 2,000 lines of a 32,000-token model in 400 MB") {
  TPCLI_REQUIRE_SHARED("data/hf-tokenizers/mistral/tokenizer.json");
  const tpcli::testing::TempDir dir;
  const std::string config = dir.write("wide.toml", "dim = 16\nhidden_dim = 32\nn_layers = 1\nn_heads = 2\nvocab_size = 32000\nseq_len = 64\n");
  const std::string model = (dir.path() / "wide.bin").string();
  REQUIRE(run_tpcli("init --model-config " + config + " --out " + model + " --seed 1").code == 0);
  std::string lines;
  for (int i = 0; i < 2000; ++i)  // greedy (fast), every 100th line top-p (its scratch taken while it runs)
    lines += "{\"prompt\": \"Once upon a time\", \"max_tokens\": 1" +
             std::string(i % 100 ? "" : ", \"temperature\": 0.8, \"top_p\": 0.9, \"seed\": " + std::to_string(i + 1)) + "}\n";
  const std::string prompts = dir.write("many.jsonl", lines);
  // Before: a 256 KB sampler scratch per line from the start, 512 MB for the file.
  const Run r = tpcli::testing::run_tpcli_line(
      "infer --model " + model + " -z " + tpcli::testing::shared_path("data/hf-tokenizers/mistral") + " --batch " + prompts +
          " --parallel 32 -t 0",
      {.cwd = TPCLI_SOURCE_DIR, .environment = "OMP_WAIT_POLICY=passive", .timeout_seconds = 60, .launcher = MODEST_MEMORY});
  INFO("exit " << r.code << ", stderr: " << r.err.substr(0, 2000));
  CHECK(r.code == 0);
  CHECK(lines_of(r.out) == 2000);
  const size_t last_line = r.out.rfind('\n', r.out.size() - 2) + 1;
  CHECK(r.out.find("\"index\":1999,", last_line) != std::string::npos);  // in input order, the last last
}

// Issue 39, item 9: every text request would get a 500, "prompt": [600] too.
TEST_CASE("cli faults: serve and infer --batch refuse a tokenizer larger than the model's vocabulary at start") {
  TPCLI_REQUIRE_SHARED("data/hf-tokenizers/mistral/tokenizer.json");
  const std::string tok = tpcli::testing::shared_path("data/hf-tokenizers/mistral");
  const tpcli::testing::TempDir dir;
  const std::string prompts = dir.write("p.jsonl", "{\"prompt\": \"Once upon a time\"}\n");
  const std::string expect = "tokenizer has 32000 tokens but the model's vocab_size is 512";
  check_one_line_error(run_tpcli("infer --model " + model_file() + " -z " + tok + " --batch " + prompts), expect);
  check_one_line_error(run_tpcli("serve --model " + model_file() + " -z " + tok + " --port 0"), expect);
}

// Issue 39, items 15 and 16: runs that silently did something else than asked.
TEST_CASE("cli faults: an inference mesh axis with no role is a one-line error naming it") {
  for (const std::string& command : {"infer --model " + model_file() + " -n 4 -z /nonexistent/tok.bin",
                                     "logits --model " + model_file() + " --tokens 1,2"}) {
    INFO(command);
    const Run r = run_tpcli(command + " --mesh tp=4");  // was: four whole replicas
    check_one_line_error(r, "--mesh tp=4: axis 'tp' (size 4) has no role in inference");
    CHECK(r.err.find("e.g. --mesh model=4") != std::string::npos);
    CHECK(r.err.find("or --set mesh.tensor_axis=tp") != std::string::npos);
  }
  // Only the role keys are taken, and an axis name is letters, digits, '_' or '-'.
  check_one_line_error(run_tpcli("infer --model " + model_file() + " --tokens 1,2 --ids --set train.steps=3"),
                       "--set train.steps=3: inference names only mesh.tensor_axis and mesh.expert_axis");
  check_one_line_error(run_tpcli("infer --model " + model_file() + " --tokens 1,2 --ids --set mesh.tensor_axis=a.b"),
                       "--set mesh.tensor_axis=a.b: an axis name is letters, digits, '_' or '-'");
  // Naming the expert axis as the tensor axis leaves nothing to split the experts over.
  check_one_line_error(run_tpcli("infer --model " + model_file() + " --tokens 1,2 --ids --mesh tp=2 --set mesh.tensor_axis=tp "
                                 "--set mesh.expert_axis=tp"),
                       "the tensor and expert roles name one axis 'tp'");
}

namespace {

// "device 0: parameters 0.27 MB, KV cache 0.13 MB" of an infer run's report (moved bytes left out).
std::string device0_memory(const Run& r) {
  const size_t at = r.err.find("device 0: parameters");
  if (at == std::string::npos) return "";
  return r.err.substr(at, r.err.find(", moved", at) - at);
}

}  // namespace

TEST_CASE("cli: --set mesh.tensor_axis=tp splits the model over the axis the user named, as --devices does over 'model'") {
  const std::string base = "infer --model " + model_file() + " --tokens 1,2,3 --ids -n 12 -t 0";
  const Run named = run_tpcli(base + " --mesh tp=4 --set mesh.tensor_axis=tp");
  const Run model4 = run_tpcli(base + " --devices 4");
  const Run one = run_tpcli(base);
  INFO("named: " << named.err << "\nmodel=4: " << model4.err << "\none: " << one.err);
  REQUIRE(named.code == 0);
  REQUIRE(model4.code == 0);
  REQUIRE(one.code == 0);
  CHECK(named.out == model4.out);  // the same greedy ids
  CHECK(named.out == one.out);
  // Each of the four devices holds a quarter of the heads: not four replicas of the whole model.
  CHECK(!device0_memory(named).empty());
  CHECK(device0_memory(named) == device0_memory(model4));
  CHECK(device0_memory(named) != device0_memory(one));
  CHECK(named.err.find("device 3: parameters") != std::string::npos);
  // --devices names its one axis after the tensor role.
  const Run devices = run_tpcli(base + " --devices 4 --set mesh.tensor_axis=tp");
  CHECK(devices.code == 0);
  CHECK(device0_memory(devices) == device0_memory(model4));
}

TEST_CASE("cli faults: quantize --mode mxfp8 implies 8 bits, and perplexity --help names Hugging Face directories") {
  const tpcli::testing::TempDir dir;
  const std::string out = (dir.path() / "q.safetensors").string();
  const Run mxfp8 = run_tpcli("quantize --model " + model_file() + " --out " + out + " --mode mxfp8");
  INFO("stderr: " << mxfp8.err);
  CHECK(mxfp8.code == 0);
  CHECK(fs::exists(out));
  check_one_line_error(run_tpcli("quantize --model " + model_file() + " --out " + out + " --mode mxfp8 --bits 4"), "--bits 4: mxfp8 is 8-bit");
  const Run help = run_tpcli("perplexity --help");
  CHECK(help.out.find("Hugging Face model directory") != std::string::npos);
  CHECK(help.out.find("tokenizer.json") != std::string::npos);
}

TEST_CASE("cli faults: --mesh wins over the file and --set names a role on its axes") {
  const tpcli::testing::TempDir dir;
  dir.write("model.toml", "dim = 32\nhidden_dim = 64\nn_layers = 1\nn_heads = 2\nvocab_size = 64\nseq_len = 16\nn_experts = 2\ntop_k = 1\n");
  dir.write("corpus.txt", std::string(2000, 'a'));
  const std::string config = dir.write("run.toml", "[model]\nconfig = \"model.toml\"\n[data]\npath = \"corpus.txt\"\n"
                                                   "[train]\nsteps = 1\nbatch_size = 4\n[mesh]\naxes = { data = 2 }\n");
  const Run r = run_tpcli("inspect " + config + " --mesh data=2,expert=2 --set mesh.expert_axis=expert");
  INFO("stderr: " << r.err);  // was: "names no axis of the mesh data=2", the file's
  CHECK(r.code == 0);
  CHECK(r.out.find("data=2,expert=2") != std::string::npos);
  check_one_line_error(run_tpcli("inspect " + config + " --mesh data=2 --set mesh.expert_axis=expert"),
                       "mesh.expert_axis = \"expert\" names no axis of the mesh data=2");
}

TEST_CASE("cli faults: a model file without vocab_size takes a llama2.c tokenizer.bin's, as the README says") {
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  const tpcli::testing::TempDir dir;
  dir.write("model.toml", "dim = 32\nhidden_dim = 64\nn_layers = 1\nn_heads = 2\nseq_len = 16\n");
  dir.write("corpus.txt", std::string(3000, 'a') + " Once upon a time there was a dog.\n");
  const std::string config = dir.write(
      "run.toml", "[model]\nconfig = \"model.toml\"\n[data]\npath = \"corpus.txt\"\ntokenizer = \"" +
                      tpcli::testing::shared_path("data/tok512.bin") + "\"\n[train]\nsteps = 1\nbatch_size = 2\n"
                      "eval_batches = 0\nsample_tokens = 0\nout_dir = \"" + (dir.path() / "run").string() + "\"\n");
  const Run r = run_tpcli("train " + config);
  INFO("stderr: " << r.err);  // was: "vocab_size is required"
  CHECK(r.code == 0);
}

// Issue 39: export --to llama2c wrote over any --out, the input model included (cp m.bin; export
// --model m.bin --out m.bin). Now an existing --out needs --force, and the input is never one, by
// inode: another path or a hard link to it is refused too. quantize --out alike.
TEST_CASE("cli faults: export --to llama2c and quantize refuse an existing --out without --force, and the input always") {
  const tpcli::testing::TempDir dir;
  const fs::path model = dir.path() / "m.bin", alias = dir.path() / "alias.bin", taken = dir.path() / "taken.bin";
  fs::copy_file(model_file(), model);
  fs::create_hard_link(model, alias);
  const std::string original = tpcli::testing::slurp(model.string());
  const std::string export_line = "export --to llama2c --model " + model.string() + " --out ";
  check_usage_error(run_tpcli(export_line + model.string()), "tpcli export: --out " + model.string() + ": is the input model");
  check_usage_error(run_tpcli(export_line + alias.string() + " --force"), "tpcli export: --out " + alias.string() + ": is the input model");
  check_usage_error(run_tpcli(export_line + (dir.path() / "." / "m.bin").string() + " --force"), "tpcli export: --out ");
  CHECK(tpcli::testing::slurp(model.string()) == original);

  dir.write("taken.bin", "keep");
  check_usage_error(run_tpcli(export_line + taken.string()), "tpcli export: --out " + taken.string() + ": already exists");
  CHECK(tpcli::testing::slurp(taken.string()) == "keep");
  CHECK(run_tpcli(export_line + taken.string() + " --force").code == 0);
  CHECK(fs::file_size(taken) == original.size());  // the llama2.c model
  check_usage_error(run_tpcli("export --to hf --model " + model.string() + " --out " + (dir.path() / "hf").string() + " --force"),
                    "tpcli export: --force: only --to llama2c and gguf replace a file");

  const fs::path quantized = dir.path() / "q.safetensors";
  const std::string quantize_line = "quantize --model " + model.string() + " --out " + quantized.string();
  REQUIRE(run_tpcli(quantize_line).code == 0);
  check_usage_error(run_tpcli(quantize_line), "tpcli quantize: --out " + quantized.string() + ": already exists");
  CHECK(run_tpcli(quantize_line + " --force").code == 0);
  check_usage_error(run_tpcli("quantize --model " + quantized.string() + " --out " + quantized.string() + " --force"),
                    "tpcli quantize: --out " + quantized.string() + ": is the input model");
}

// Issue 39, item 2 as infer --batch meets it: a line whose logits are not finite fails alone.
TEST_CASE("cli faults: infer --batch answers every line but one whose logits are not finite, says why there, and exits 1") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  const tpcli::testing::TempDir dir;
  const std::string model = (dir.path() / "inf.bin").string();
  tpcli::testing::write_poisoned_stories260k(300, model);  // "ha" is token 300
  const std::string lines = dir.write("lines.jsonl", "{\"prompt\": \"The cat sat\"}\n{\"prompt\": \"ha ha\"}\n{\"prompt\": \"He had a hat\"}\n");
  const Run r = run_tpcli("infer --model " + model + " -z " + tpcli::testing::shared_path("data/tok512.bin") +
                          " --batch " + lines + " -n 12 -t 0");
  INFO("stderr: " << r.err);
  CHECK(r.code == 1);
  CHECK(r.err.find(lines + ": 1 of 3 lines failed") != std::string::npos);
  REQUIRE(lines_of(r.out) == 3);
  const size_t second = r.out.find('\n') + 1, third = r.out.find('\n', second) + 1;
  const std::string failed = r.out.substr(second, third - second);
  CHECK(failed.find("\"index\":1,") != std::string::npos);
  CHECK(failed.find("\"finish_reason\":\"error\"") != std::string::npos);
  CHECK(failed.find("not finite") != std::string::npos);
  for (const std::string& answered : {r.out.substr(0, second), r.out.substr(third)}) {
    INFO(answered);
    CHECK(answered.find("\"finish_reason\":\"error\"") == std::string::npos);
    CHECK(answered.find("\"text\":") != std::string::npos);
  }
}
