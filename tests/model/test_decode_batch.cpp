// model/: a batched decode step is batch-invariant. Sequences of mixed prompt lengths decoded
// together (joining and leaving the batch as they start and finish) give, bit for bit, the logits
// each gives decoded alone through forward(), and so the same greedy tokens: f32, bf16, 8-bit and
// 4-bit weights, on 1 and 2 devices.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

#include "distributed/runtime.h"
#include "model/batch_generate.h"
#include "model/llama.h"
#include "model/packed_weights.h"
#include "random_model.h"
#include "tensor/packed_matrix.h"

using namespace tpcli;
using namespace tpcli::testing;

namespace {

constexpr int GENERATED = 4;  // greedy tokens after each prompt

struct Sequence {
  std::vector<int> tokens;                 // the prompt, then the greedy tokens as they come
  size_t prompt = 0;
  std::vector<std::vector<float>> logits;  // one [V] per step
};

int greedy(const std::vector<float>& logits) {
  return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Each sequence alone through forward(), token by token.
std::vector<Sequence> decode_alone(const model::WeightSource& w, int devices, const std::vector<Sequence>& seqs) {
  std::vector<Sequence> out;
  dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
    model::Llama m(w, dev.axis("model"));
    std::vector<Sequence> mine = seqs;
    for (Sequence& s : mine)
      for (size_t pos = 0; pos < s.prompt + GENERATED - 1; ++pos) {
        const std::span<const float> l = m.forward(s.tokens[pos], static_cast<int>(pos));
        std::vector<float> logits(l.begin(), l.end());
        if (pos + 1 >= s.prompt) s.tokens.push_back(greedy(logits));
        s.logits.push_back(std::move(logits));
      }
    if (dev.rank() == 0) out = std::move(mine);
  });
  return out;
}

// All at once: every step, each unfinished sequence contributes its next position.
std::vector<Sequence> decode_together(const model::WeightSource& w, int devices, const std::vector<Sequence>& seqs) {
  std::vector<Sequence> out;
  dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
    model::Llama m(w, dev.axis("model"));
    std::vector<Sequence> mine = seqs;
    std::vector<model::Llama::KvCache> caches;
    for (size_t i = 0; i < mine.size(); ++i) caches.push_back(m.new_kv_cache());
    for (size_t step = 0;; ++step) {
      std::vector<int> tokens, positions;
      std::vector<model::Llama::KvCache*> batch;
      std::vector<size_t> who;
      for (size_t i = 0; i < mine.size(); ++i)
        if (step < mine[i].prompt + GENERATED - 1) {
          tokens.push_back(mine[i].tokens[step]);
          positions.push_back(static_cast<int>(step));
          batch.push_back(&caches[i]);
          who.push_back(i);
        }
      if (who.empty()) break;
      const std::vector<float> logits = m.decode_batch(tokens, positions, batch);  // [B, V]
      const size_t V = logits.size() / who.size();
      for (size_t b = 0; b < who.size(); ++b) {
        Sequence& s = mine[who[b]];
        std::vector<float> row(logits.begin() + static_cast<std::ptrdiff_t>(b * V), logits.begin() + static_cast<std::ptrdiff_t>((b + 1) * V));
        if (step + 1 >= s.prompt) s.tokens.push_back(greedy(row));
        s.logits.push_back(std::move(row));
      }
    }
    if (dev.rank() == 0) out = std::move(mine);
  });
  return out;
}

}  // namespace

TEST_CASE("decode_batch: sequences decoded together equal each decoded alone, bit for bit, in f32, bf16, 8- and 4-bit",
          "[llama][batch]") {
  const model::LlamaConfig c = make_config(64, 4, 2, 96, 2, 67, false);
  const model::TensorWeights f32 = random_weights(c, 21);
  std::vector<Sequence> seqs;
  uint32_t seed = 30;
  for (size_t prompt : {1, 5, 3, 7, 2}) seqs.push_back({random_tokens(static_cast<int>(prompt), c.vocab_size, seed++), prompt, {}});
  const model::ConvertedWeights bf16(f32, tensor::WeightFormat::bf16()), q8(f32, tensor::WeightFormat::affine(8, 32)),
      q4(f32, tensor::WeightFormat::affine(4, 32));
  const std::pair<const char*, const model::WeightSource*> formats[] = {{"f32", &f32}, {"bf16", &bf16}, {"8-bit", &q8}, {"4-bit", &q4}};
  for (const auto& [name, w] : formats)
    for (int devices : {1, 2}) {
      const std::vector<Sequence> alone = decode_alone(*w, devices, seqs), together = decode_together(*w, devices, seqs);
      for (size_t i = 0; i < seqs.size(); ++i) {
        INFO(name << " on " << devices << " devices, sequence " << i << " (prompt " << seqs[i].prompt << ")");
        CHECK(together[i].tokens == alone[i].tokens);
        REQUIRE(together[i].logits.size() == alone[i].logits.size());
        for (size_t step = 0; step < alone[i].logits.size(); ++step) {
          INFO("step " << step);
          CHECK(std::memcmp(together[i].logits[step].data(), alone[i].logits[step].data(),
                            alone[i].logits[step].size() * sizeof(float)) == 0);
        }
      }
    }
}

namespace {

std::vector<model::BatchResult> run_batch(const model::WeightSource& w, int devices, const std::vector<model::BatchRequest>& requests,
                                          int parallel) {
  std::vector<model::BatchResult> out;
  dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
    model::Llama m(w, dev.axis("model"));
    std::vector<model::BatchResult> r = model::generate_batch(m, requests, parallel);
    if (dev.rank() == 0) out = std::move(r);
  });
  return out;
}

}  // namespace

TEST_CASE("generate_batch: continuous batching gives every request the tokens it gets alone, and greedy is the prefill+forward loop",
          "[llama][batch]") {
  const model::LlamaConfig c = make_config(64, 4, 2, 96, 2, 67, true);
  const model::TensorWeights f32 = random_weights(c, 41);
  const model::ConvertedWeights q8(f32, tensor::WeightFormat::affine(8, 32));
  std::vector<model::BatchRequest> requests;
  uint32_t seed = 50;
  for (int i = 0; i < 7; ++i) {
    model::BatchRequest r;
    r.prompt = random_tokens(1 + (i * 5) % 7, c.vocab_size, seed++);
    r.max_tokens = 3 + i % 4;
    r.temperature = i % 3 == 0 ? 0.0f : 0.9f;
    r.seed = 100 + static_cast<uint64_t>(i);
    if (i == 4) r.stop_ids = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27,
                              28, 29, 30, 31, 32, 33};  // about half the vocabulary: stops early, likely
    requests.push_back(r);
  }
  for (const model::WeightSource* w : {static_cast<const model::WeightSource*>(&f32), static_cast<const model::WeightSource*>(&q8)})
    for (int devices : {1, 2}) {
      const std::vector<model::BatchResult> together = run_batch(*w, devices, requests, 3);
      const auto ends_by = [&](const char* reason) {
        return std::ranges::any_of(together, [&](const model::BatchResult& r) { return r.finish_reason == reason; });
      };
      CHECK(ends_by("stop"));  // request 4's stop ids
      CHECK(ends_by("length"));
      for (size_t i = 0; i < requests.size(); ++i) {
        const model::BatchResult alone = run_batch(*w, devices, {requests[i]}, 1).front();
        INFO((w == &f32 ? "f32" : "8-bit") << " on " << devices << " devices, request " << i);
        CHECK(together[i].tokens == alone.tokens);
        CHECK(together[i].finish_reason == alone.finish_reason);
        CHECK(!alone.tokens.empty());
        CHECK(static_cast<int>(alone.tokens.size()) <= requests[i].max_tokens);
      }
    }
  // greedy: the single-sequence path's tokens (prefill, then forward token by token)
  const model::BatchRequest& g = requests[3];
  REQUIRE(g.temperature == 0.0f);
  std::vector<int> want;
  dist::run_on_mesh(dist::Mesh::line(1), [&](dist::Device& dev) {
    model::Llama m(f32, dev.axis("model"));
    std::span<const float> l = m.prefill(g.prompt, 0);
    for (int pos = static_cast<int>(g.prompt.size()); static_cast<int>(want.size()) < g.max_tokens; ++pos) {
      want.push_back(static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin()));
      l = m.forward(want.back(), pos);
    }
  });
  CHECK(run_batch(f32, 1, requests, 4)[3].tokens == want);
}
