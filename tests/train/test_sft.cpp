// Supervised fine-tuning data (train/sft_examples.h, train/sft_batches.h): loss masks against
// token lists built by hand from the tokenizer, FILE:LINE errors, batches by length, and the
// global-count normalisation of a step against one device holding the whole batch.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <vector>

#include "distributed/runtime.h"
#include "model/random_init.h"
#include "model/trainable_llama.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"
#include "text/load_tokenizer.h"
#include "train/data_parallel_optimizer.h"
#include "train/loop.h"
#include "train/sft_batches.h"
#include "train/sft_examples.h"
#include "train/step.h"

using namespace tpcli;
using train::EncodedExample;
using train::SftFormat;

namespace {

std::vector<int> cat(std::initializer_list<std::vector<int>> parts) {
  std::vector<int> all;
  for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

// The tokens whose mask says counted, in order.
std::vector<int> counted_tokens(const EncodedExample& e) {
  std::vector<int> out;
  for (size_t i = 0; i < e.tokens.size(); ++i)
    if (e.counted[i]) out.push_back(e.tokens[i]);
  return out;
}

train::SftExample chat_example(std::vector<text::ChatMessage> messages) {
  train::SftExample e;
  e.where = "test:1";
  e.messages = std::move(messages);
  return e;
}

// An example of n tokens (ids from `first`), the last `counted` of them counted.
EncodedExample example_of_length(int n, int counted, int first = 3) {
  EncodedExample e;
  for (int i = 0; i < n; ++i) {
    e.tokens.push_back(first + i);
    e.counted.push_back(i >= n - counted ? 1 : 0);
  }
  return e;
}

}  // namespace

TEST_CASE("sft chat mask with chatml: exactly the assistant content and its <|im_end|>, not the role headers") {
  TPCLI_REQUIRE_SHARED("data/hf-tokenizers/qwen3/tokenizer.json");
  const text::LoadedTokenizer loaded = text::load_tokenizer(testing::shared_path("data/hf-tokenizers/qwen3"));
  const text::TokenizerInterface& tok = *loaded.tokenizer;
  const int im_end = *tok.token_id("<|im_end|>");
  train::SftEncoding enc{SftFormat::Chat, &tok, text::chat_template_named("chatml"), {tok.bos_text(), tok.eos_text()}};
  const auto example = chat_example({{"system", "You are kind."},
                                     {"user", "Hi"},
                                     {"assistant", "Hello there"},
                                     {"user", "Bye"},
                                     {"assistant", "See you"}});
  const EncodedExample e = train::encode_example(example, enc);
  auto encode = [&](const std::string& text) { return tok.encode_text(text, false); };
  const std::vector<int> prompt1 = encode("<|im_start|>system\nYou are kind.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<int> answer1 = cat({encode("Hello there"), {im_end}});
  const std::vector<int> prompt2 = encode("\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<int> answer2 = cat({encode("See you"), {im_end}});
  const std::vector<int> tail = encode("\n");
  CHECK(e.tokens == cat({prompt1, answer1, prompt2, answer2, tail}));
  std::vector<uint8_t> mask;
  for (auto [part, counted] : std::vector<std::pair<const std::vector<int>*, int>>{
           {&prompt1, 0}, {&answer1, 1}, {&prompt2, 0}, {&answer2, 1}, {&tail, 0}})
    mask.insert(mask.end(), part->size(), static_cast<uint8_t>(counted));
  CHECK(e.counted == mask);
  CHECK(tok.decode_ids(counted_tokens(e), false) == "Hello there<|im_end|>See you<|im_end|>");
  CHECK(e.counted_targets() == static_cast<int64_t>(answer1.size() + answer2.size()));

  // train_on_prompt: every target counts.
  enc.train_on_prompt = true;
  const EncodedExample all = train::encode_example(example, enc);
  CHECK(all.tokens == e.tokens);
  CHECK(all.counted_targets() == static_cast<int64_t>(all.tokens.size()) - 1);

  // eval: the prompt is everything before the last answer, with the generation prompt.
  const train::EvalCase c = train::eval_case(example, enc);
  CHECK(c.prompt == cat({prompt1, answer1, prompt2}));
  CHECK(c.reference == "See you");
}

TEST_CASE("sft chat mask with zephyr on a llama2.c tokenizer: the answer and its EOS") {
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  const text::LoadedTokenizer loaded = text::load_tokenizer(testing::shared_path("data/tok512.bin"), 512);
  const text::TokenizerInterface& tok = *loaded.tokenizer;
  const train::SftEncoding enc{SftFormat::Chat, &tok, text::chat_template_named("zephyr"), {tok.bos_text(), tok.eos_text()}};
  const EncodedExample e = train::encode_example(chat_example({{"user", "Tell a story"}, {"assistant", "Once upon a time"}}), enc);
  const std::vector<int> answer = cat({tok.encode_text("Once upon a time", false), {2}});  // EOS = 2
  CHECK(counted_tokens(e) == answer);
  CHECK(e.tokens == cat({tok.encode_text("<|user|>\nTell a story</s>\n<|assistant|>\n", false), answer,
                         tok.encode_text("\n", false)}));
}

TEST_CASE("sft completions mask: BOS and prompt not counted, completion and EOS counted, train_on_prompt counts all") {
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  const text::LoadedTokenizer loaded = text::load_tokenizer(testing::shared_path("data/tok512.bin"), 512);
  const text::TokenizerInterface& tok = *loaded.tokenizer;
  train::SftEncoding enc{SftFormat::Completions, &tok, {}, {tok.bos_text(), tok.eos_text()}};
  train::SftExample ex;
  ex.where = "test:1";
  ex.prompt = "The cat";
  ex.completion = " sat on the mat.";
  const EncodedExample e = train::encode_example(ex, enc);
  const std::vector<int> prompt = tok.encode_text("The cat", false), completion = tok.encode_text(" sat on the mat.", false);
  CHECK(e.tokens == cat({{1}, prompt, completion, {2}}));
  std::vector<uint8_t> mask(1 + prompt.size(), 0);
  mask.insert(mask.end(), completion.size() + 1, 1);
  CHECK(e.counted == mask);
  enc.train_on_prompt = true;
  CHECK(train::encode_example(ex, enc).counted_targets() == static_cast<int64_t>(e.tokens.size()) - 1);
  const train::EvalCase c = train::eval_case(ex, enc);
  CHECK(c.prompt == cat({{1}, prompt}));
  CHECK(c.reference == "sat on the mat.");
}

TEST_CASE("sft: every malformed line is an error naming FILE:LINE") {
  testing::TempDir dir;
  const std::string good = R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})";
  struct Bad {
    std::string line, expect;
    SftFormat format = SftFormat::Chat;
  };
  const std::vector<Bad> cases = {
      {"{not json", "not valid JSON"},
      {"[1, 2]", "expected a JSON object"},
      {R"({"text": "x"})", "\"messages\" is missing"},
      {R"({"messages": "hi"})", "\"messages\" is not a list"},
      {R"({"messages": []})", "\"messages\" is empty"},
      {R"({"messages": [{"role": "robot", "content": "x"}]})", "unknown role \"robot\""},
      {R"({"messages": [{"role": "user", "content": 3}]})", "\"content\" is missing or not a string"},
      {R"({"messages": [{"content": "x"}]})", "\"role\" is missing"},
      {R"({"messages": [{"role": "user", "content": "x"}]})", "no assistant message"},
      {R"({"prompt": "x"})", "\"completion\" is missing", SftFormat::Completions},
      {R"({"prompt": 1, "completion": "y"})", "\"prompt\" is not a string", SftFormat::Completions},
      {R"({"messages": []})", "\"text\" is missing", SftFormat::Text},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO(cases[i].line);
    const SftFormat format = cases[i].format;
    std::string first = good;  // line 1 valid, line 2 blank, line 3 the bad one
    if (format == SftFormat::Completions) first = R"({"prompt": "p", "completion": "c"})";
    if (format == SftFormat::Text) first = R"({"text": "t"})";
    const std::string path = dir.write("bad" + std::to_string(i) + ".jsonl", first + "\n\n" + cases[i].line + "\n");
    CHECK_THROWS_WITH(train::read_sft_examples(path, format), Catch::StartsWith(path + ":3: ") && Catch::Contains(cases[i].expect));
  }
  const std::string empty = dir.write("empty.jsonl", "\n  \n");
  CHECK_THROWS_WITH(train::read_sft_examples(empty, SftFormat::Chat), Catch::StartsWith(empty + ": ") && Catch::Contains("no example"));
  CHECK_THROWS_WITH(train::read_sft_examples(dir.path().string() + "/absent.jsonl", SftFormat::Chat), Catch::Contains("absent.jsonl"));
  CHECK(train::read_sft_examples(dir.write("good.jsonl", good + "\n" + good), SftFormat::Chat).size() == 2);
}

TEST_CASE("sft: an example longer than seq_len + 1 tokens is an error naming FILE:LINE, or cut with truncate") {
  EncodedExample e = example_of_length(10, 4);
  CHECK_THROWS_WITH(train::fit_example(e, "f.jsonl:7", 8, false),
                    Catch::StartsWith("f.jsonl:7: the example is 10 tokens, more than train.seq_len + 1 = 9"));
  train::fit_example(e, "f.jsonl:7", 8, true);
  CHECK(e.tokens.size() == 9);
  CHECK(e.counted.size() == 9);
  EncodedExample one = example_of_length(1, 1);
  CHECK_THROWS_WITH(train::fit_example(one, "f.jsonl:2", 8, true), Catch::StartsWith("f.jsonl:2: "));
  // Issue 39: a cut that removes every counted target trained on nothing ("loss 0.0000").
  EncodedExample answer_cut = example_of_length(12, 3);
  CHECK_THROWS_WITH(train::fit_example(answer_cut, "f.jsonl:4", 8, true),
                    Catch::StartsWith("f.jsonl:4: data.truncate cut the example from 12 to train.seq_len + 1 = 9 tokens, which keeps none"));
}

TEST_CASE("sft batches: rows are whole examples right-padded with -1 targets, T is the step's longest") {
  auto examples = std::make_shared<std::vector<EncodedExample>>();
  examples->push_back(example_of_length(4, 2, 10));  // tokens 10..13, targets 11..13, last two counted
  examples->push_back(example_of_length(6, 6, 20));
  const train::LengthBatches b(examples, 2, 8, false, 1, /*pad_token=*/0);
  REQUIRE(b.steps_per_pass() == 1);
  CHECK(b.step_len(0) == 5);
  CHECK(*b.counted_targets(0) == 2 + 5);
  std::vector<int> inputs(10), targets(10);
  b.fill(0, 0, 2, inputs, targets);
  CHECK(inputs == std::vector<int>{10, 11, 12, 0, 0, 20, 21, 22, 23, 24});
  CHECK(targets == std::vector<int>{-1, 12, 13, -1, -1, 21, 22, 23, 24, 25});
}

TEST_CASE("sft batches: a step's rows and T are a pure function of (step, row), alike on every data rank, by similar lengths") {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> length(2, 33);
  auto examples = std::make_shared<std::vector<EncodedExample>>();
  for (int i = 0; i < 37; ++i) examples->push_back(example_of_length(length(rng), 1, i));
  const int B = 4, seq_len = 32;
  const train::LengthBatches a(examples, B, seq_len, true, 7), again(examples, B, seq_len, true, 7),
      other_seed(examples, B, seq_len, true, 8);
  bool seed_matters = false;
  for (int64_t step = 0; step < 3 * a.steps_per_pass(); ++step) {
    const int T = a.step_len(step);
    CHECK(T == again.step_len(step));
    std::vector<int> whole_in(B * T), whole_tg(B * T);
    again.fill(step, 0, B, whole_in, whole_tg);
    size_t longest = 0, shortest = 1000;
    for (int d = 0; d < 2; ++d) {  // two data ranks, each its half
      const train::RowRange rows = train::data_rows(B, 2, d);
      std::vector<int> in((rows.end - rows.begin) * T), tg(in.size());
      a.fill(step, rows.begin, rows.end, in, tg);
      CHECK(std::equal(in.begin(), in.end(), whole_in.begin() + rows.begin * T));
      CHECK(std::equal(tg.begin(), tg.end(), whole_tg.begin() + rows.begin * T));
    }
    for (int r = 0; r < B; ++r) {
      const size_t n = (*examples)[a.example_of(step, r)].tokens.size();
      longest = std::max(longest, n);
      shortest = std::min(shortest, n);
      seed_matters = seed_matters || a.example_of(step, r) != other_seed.example_of(step, r);
    }
    CHECK(T == static_cast<int>(longest) - 1);
    CHECK(longest - shortest <= 8);  // 37 examples of lengths in [2, 33] sorted into batches of 4
  }
  CHECK(seed_matters);
  // Each pass takes every example at least once.
  for (int64_t pass = 0; pass < 2; ++pass) {
    std::set<size_t> seen;
    for (int64_t s = 0; s < a.steps_per_pass(); ++s)
      for (int r = 0; r < B; ++r) seen.insert(a.example_of(pass * a.steps_per_pass() + s, r));
    CHECK(seen.size() == examples->size());
  }
}

TEST_CASE("sft step: 2 data ranks x 2 micro-batches give the loss and gradients of one device on the whole batch (mean over counted targets)") {
  const model::LlamaConfig config{.dim = 32, .hidden_dim = 56, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                                  .vocab_size = 37, .seq_len = 16, .shared_classifier = false};
  const auto weights = model::random_weights(config, 3);
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> token(0, config.vocab_size - 1);
  auto examples = std::make_shared<std::vector<EncodedExample>>();
  // Rows of different lengths and very different counted targets: a mean of per-micro-batch means would differ.
  for (auto [n, counted] : std::vector<std::pair<int, int>>{{9, 1}, {12, 11}, {10, 2}, {11, 7}}) {
    EncodedExample e = example_of_length(n, counted);
    for (int& t : e.tokens) t = token(rng);
    examples->push_back(e);
  }
  const int B = 4;
  const train::LengthBatches batches(examples, B, config.seq_len, false, 1);
  const int T = batches.step_len(0);
  std::vector<int> inputs(B * T), targets(B * T);
  batches.fill(0, 0, B, inputs, targets);
  // Reference: one device, the whole batch, the plain mean over the counted targets.
  model::TrainableLlama ref(weights, dist::Group());
  ref.zero_grad();
  const float ref_loss = ref.forward_backward(inputs, targets, B, T);
  double by_hand = 0;  // the same mean from per-token losses: sum over rows / total count
  {
    model::TrainableLlama one(weights, dist::Group());
    double sum = 0;
    for (int r = 0; r < B; ++r) {
      std::span<const int> in(inputs.data() + r * T, T), tg(targets.data() + r * T, T);
      sum += one.loss(in, tg, 1, T) * static_cast<double>((*examples)[batches.example_of(0, r)].counted_targets());
    }
    by_hand = sum / static_cast<double>(*batches.counted_targets(0));
  }
  CHECK(ref_loss == Approx(by_hand).epsilon(1e-5));
  std::map<std::string, std::vector<float>> ref_grads;
  for (auto& p : ref.parameters()) ref_grads[p.spec->name].assign(p.grad->data(), p.grad->data() + p.grad->numel());

  for (auto [D, TP, K] : std::vector<std::tuple<int, int, int>>{{2, 1, 2}, {1, 1, 2}, {2, 2, 2}, {1, 1, 1}}) {
    DYNAMIC_SECTION("data=" << D << " model=" << TP << " micro-batches=" << K) {
      dist::Mesh mesh({{"data", D}, {"model", TP}});
      std::mutex mu;
      std::vector<std::string> failures;
      std::vector<double> losses;
      dist::run_on_mesh(mesh, [&](dist::Device& dev) {
        dist::Group& data = dev.axis("data");
        train::ParallelAxes axes{&data, &dev.world(), D, TP, D, true};
        model::TrainableLlama llama(weights, dev.axis("model"));
        train::DataParallelOptimizer optimizer(llama, axes, dev.axis("model").rank(), {}, false, 1 << 20);
        std::vector<int> in, tg;
        auto loss = static_cast<float>(
            train::accumulate_gradients(llama, batches, 0, train::data_rows(B, D, data.rank()), K, in, tg));
        optimizer.reduce_gradients(K);
        data.mean(std::span<float>(&loss, 1));
        model::TensorWeights grads = train::gather_gradients(llama);
        std::lock_guard lock(mu);
        losses.push_back(loss);
        for (const auto& [name, g] : ref_grads) {
          const std::span<const float> got = grads.get(name);
          double diff = 0;
          for (size_t i = 0; i < g.size(); ++i) diff = std::max(diff, std::abs(double(got[i]) - g[i]));
          if (!(diff <= 1e-5)) failures.push_back("device " + std::to_string(dev.rank()) + " " + name + " max diff " + std::to_string(diff));
        }
      });
      for (const auto& f : failures) UNSCOPED_INFO(f);
      CHECK(failures.empty());
      for (double l : losses) CHECK(l == Approx(ref_loss).epsilon(1e-5));
    }
  }
}

TEST_CASE("sft jsonl-text: BOS, the text and EOS, every target counted, so a row's targets are its inputs shifted by one") {
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  const text::LoadedTokenizer loaded = text::load_tokenizer(testing::shared_path("data/tok512.bin"), 512);
  const text::TokenizerInterface& tok = *loaded.tokenizer;
  const train::SftEncoding enc{SftFormat::Text, &tok, {}, {tok.bos_text(), tok.eos_text()}};
  train::SftExample ex;
  ex.where = "test:1";
  ex.text = "Lily saw a cat.";
  const EncodedExample e = train::encode_example(ex, enc);
  CHECK(e.tokens == cat({{1}, tok.encode_text("Lily saw a cat.", false), {2}}));
  CHECK(e.counted_targets() == static_cast<int64_t>(e.tokens.size()) - 1);
  auto examples = std::make_shared<std::vector<EncodedExample>>(std::vector<EncodedExample>{e});
  const train::LengthBatches b(examples, 1, 64, true, 3);
  const int T = b.step_len(0);
  std::vector<int> inputs(T), targets(T);
  b.fill(0, 0, 1, inputs, targets);
  CHECK(inputs == std::vector<int>(e.tokens.begin(), e.tokens.end() - 1));
  CHECK(targets == std::vector<int>(e.tokens.begin() + 1, e.tokens.end()));
  CHECK_THROWS_WITH(train::eval_case(ex, enc), Catch::StartsWith("test:1: "));
}
