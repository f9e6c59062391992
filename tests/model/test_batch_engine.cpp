// model/: the batched engine is batch-invariant. Sixteen seeded requests of mixed prompt lengths
// run together give each the logits (bit for bit) and tokens it gets alone through forward() and
// its own sampler: in f32, bf16, 8-bit and 4-bit, on 1 and 2 devices; and so do prompts prefilled
// in chunks of 7, sequences preempted by a small KV pool and re-prefilled, and prompts whose first
// blocks come from the prefix cache. Greedy tokens agree on 1, 2, 3 and 4 devices. A sequence
// whose logits overflow fails alone, and a cancel arriving after its sequence ended is nothing. A
// stop string ends its sequence at the step whose token completed it, on every device.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <vector>

#include "distributed/runtime.h"
#include "engine/batch_engine.h"
#include "engine/sampler.h"
#include "model/llama.h"
#include "model/lora_adapter.h"
#include "model/packed_weights.h"
#include "random_lora.h"
#include "random_model.h"
#include "tensor/packed_matrix.h"
#include "text/tokenizer_interface.h"

using namespace tpcli;
using namespace tpcli::testing;

namespace {

struct Outcome {
  std::vector<int> tokens;
  std::vector<std::vector<float>> logits;  // [V] before each sampled token
  engine::FinishReason finish_reason = engine::FinishReason::length;
};

model::LlamaConfig engine_config() {
  model::LlamaConfig c = make_config(64, 4, 2, 96, 2, 67, false);
  c.seq_len = 96;
  return c;
}

// 16 requests: prompts of 1 to 41 tokens, greedy and sampled, different lengths to generate.
std::vector<engine::BatchRequest> mixed_requests(int vocab, std::span<const int> shared_prefix = {}) {
  std::vector<engine::BatchRequest> requests;
  for (int i = 0; i < 16; ++i) {
    engine::BatchRequest r;
    r.prompt.assign(shared_prefix.begin(), shared_prefix.end());
    const std::vector<int> own = random_tokens(1 + (i * 11) % 41, vocab, 300 + static_cast<uint32_t>(i));
    r.prompt.insert(r.prompt.end(), own.begin(), own.end());
    r.max_tokens = 2 + i % 5;
    r.temperature = i % 3 == 0 ? 0.0f : 0.9f;
    r.seed = 100 + static_cast<uint64_t>(i);
    r.logits = true;  // the tests compare them
    requests.push_back(r);
  }
  return requests;
}

std::vector<Outcome> run_alone(const model::WeightSource& w, int devices, const std::vector<engine::BatchRequest>& requests,
                               nn::KvDtype kv_dtype = nn::KvDtype::F32);

// Each request alone: forward() token by token, sampled by its own sampler.
std::vector<Outcome> run_alone(const model::WeightSource& w, const dist::Mesh& mesh, const std::vector<engine::BatchRequest>& requests,
                               nn::KvDtype kv_dtype = nn::KvDtype::F32) {
  std::vector<Outcome> out;
  dist::run_on_mesh(mesh, [&](dist::Device& dev) {
    model::Llama m(w, dev.axis("model"), dev.axis("expert"), kv_dtype);
    std::vector<Outcome> mine;
    for (const engine::BatchRequest& r : requests) {
      Outcome o;
      engine::Sampler sampler(w.config().vocab_size, r.temperature, r.topp, r.seed);
      std::vector<int> tokens = r.prompt;
      for (size_t pos = 0; static_cast<int>(o.tokens.size()) < r.max_tokens; ++pos) {
        std::span<const float> l = m.forward(tokens[pos], static_cast<int>(pos));
        if (pos + 1 < tokens.size()) continue;
        std::vector<float> logits(l.begin(), l.end());
        o.logits.push_back(logits);
        tokens.push_back(sampler.sample(logits));
        o.tokens.push_back(tokens.back());
      }
      o.finish_reason = engine::FinishReason::length;
      mine.push_back(std::move(o));
    }
    if (dev.rank() == 0) out = std::move(mine);
  });
  return out;
}

std::vector<Outcome> run_alone(const model::WeightSource& w, int devices, const std::vector<engine::BatchRequest>& requests,
                               nn::KvDtype kv_dtype) {
  return run_alone(w, dist::Mesh::line(devices), requests, kv_dtype);
}

struct EngineRun {
  std::vector<Outcome> outcomes;
  engine::EngineStats stats;
};

using Guess = std::function<void(std::span<engine::BatchEngine::GuessRequest>)>;

EngineRun run_engine(const model::WeightSource& w, const dist::Mesh& mesh, const std::vector<engine::BatchRequest>& requests,
                     const engine::EngineOptions& options, const Guess& guess = {});

EngineRun run_engine(const model::WeightSource& w, int devices, const std::vector<engine::BatchRequest>& requests,
                     const engine::EngineOptions& options, const Guess& guess = {}) {
  return run_engine(w, dist::Mesh::line(devices), requests, options, guess);
}

EngineRun run_engine(const model::WeightSource& w, const dist::Mesh& mesh, const std::vector<engine::BatchRequest>& requests,
                     const engine::EngineOptions& options, const Guess& guess) {
  EngineRun out;
  dist::run_on_mesh(mesh, [&](dist::Device& dev) {
    model::Llama m(w, dev.axis("model"), dev.axis("expert"));
    engine::BatchEngine engine(m, options);
    engine.guess = guess;
    std::vector<Outcome> mine(requests.size());
    engine.on_logits = [&](int id, std::span<const float> l) { mine[static_cast<size_t>(id)].logits.emplace_back(l.begin(), l.end()); };
    for (const engine::BatchRequest& r : requests) engine.add(r);
    while (engine.step()) {
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      mine[i].tokens = engine.result(static_cast<int>(i)).tokens;
      mine[i].finish_reason = engine.result(static_cast<int>(i)).finish_reason;
    }
    if (dev.rank() == 0) out = {std::move(mine), engine.stats()};
  });
  return out;
}

void require_same(const std::vector<Outcome>& got, const std::vector<Outcome>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("request " << i);
    CHECK(got[i].tokens == want[i].tokens);
    CHECK(got[i].finish_reason == want[i].finish_reason);
    REQUIRE(got[i].logits.size() == want[i].logits.size());
    for (size_t t = 0; t < want[i].logits.size(); ++t) {
      INFO("token " << t);
      CHECK(std::memcmp(got[i].logits[t].data(), want[i].logits[t].data(), want[i].logits[t].size() * sizeof(float)) == 0);
    }
  }
}

}  // namespace

TEST_CASE("finish reasons are named as OpenAI's finish_reason") {
  CHECK(engine::finish_reason_name(engine::FinishReason::stop) == "stop");
  CHECK(engine::finish_reason_name(engine::FinishReason::length) == "length");
  CHECK(engine::finish_reason_name(engine::FinishReason::cancelled) == "cancelled");
  CHECK(engine::finish_reason_name(engine::FinishReason::error) == "error");
}

TEST_CASE("batch engine: 16 requests together equal each alone through forward(), bit for bit, in f32, bf16, 8- and 4-bit",
          "[llama][batch]") {
  const model::LlamaConfig c = engine_config();
  const model::TensorWeights f32 = random_weights(c, 21);
  const model::ConvertedWeights bf16(f32, tensor::WeightFormat::bf16()), q8(f32, tensor::WeightFormat::affine(8, 32)),
      q4(f32, tensor::WeightFormat::affine(4, 32));
  const std::vector<engine::BatchRequest> requests = mixed_requests(c.vocab_size);
  const std::pair<const char*, const model::WeightSource*> formats[] = {{"f32", &f32}, {"bf16", &bf16}, {"8-bit", &q8}, {"4-bit", &q4}};
  for (const auto& [name, w] : formats)
    for (int devices : {1, 2}) {
      INFO(name << " on " << devices << " devices");
      const EngineRun together = run_engine(*w, devices, requests, {});
      CHECK(together.stats.steps < 16 * 6);  // the requests did share steps
      require_same(together.outcomes, run_alone(*w, devices, requests));
    }
}

TEST_CASE("batch engine: with a LoRA adapter, 16 requests together equal each alone, bit for bit, in f32 and 8-bit",
          "[llama][batch][lora]") {
  const model::LlamaConfig c = engine_config();
  const model::TensorWeights f32 = random_weights(c, 24);
  const model::ConvertedWeights q8(f32, tensor::WeightFormat::affine(8, 32));
  const model::LoraAdapterSet set = random_adapter(c, LORA_ALL, {0, 1}, 4, 41);
  const model::AdaptedWeights adapted_f32(std::make_unique<model::TensorWeights>(f32), set, "test"),
      adapted_q8(std::make_unique<model::ConvertedWeights>(f32, tensor::WeightFormat::affine(8, 32)), set, "test");
  const std::vector<engine::BatchRequest> requests = mixed_requests(c.vocab_size);
  const std::pair<const model::WeightSource*, const model::WeightSource*> formats[] = {{&adapted_f32, &f32}, {&adapted_q8, &q8}};
  for (const auto& [w, base] : formats)
    for (int devices : {1, 2}) {
      INFO((w == &adapted_f32 ? "f32" : "8-bit") << " on " << devices << " devices");
      const std::vector<Outcome> alone = run_alone(*w, devices, requests);
      require_same(run_engine(*w, devices, requests, {}).outcomes, alone);
      CHECK(alone[0].logits != run_alone(*base, devices, requests)[0].logits);  // the adapter acts
    }
}

TEST_CASE("batch engine: chunked prefill, preemption and prefix sharing change no bit", "[llama][batch]") {
  const model::LlamaConfig c = engine_config();
  const model::TensorWeights f32 = random_weights(c, 23);
  const model::ConvertedWeights q4(f32, tensor::WeightFormat::affine(4, 32));
  const std::vector<int> system = random_tokens(37, c.vocab_size, 9);  // two full blocks and some
  const std::vector<engine::BatchRequest> requests = mixed_requests(c.vocab_size, system);
  for (const model::WeightSource* w : {static_cast<const model::WeightSource*>(&f32), static_cast<const model::WeightSource*>(&q4)})
    for (int devices : {1, 2}) {
      INFO((w == &f32 ? "f32" : "4-bit") << " on " << devices << " devices");
      engine::EngineOptions fresh;
      fresh.prefix_sharing = false;
      const EngineRun plain = run_engine(*w, devices, requests, fresh);
      CHECK(plain.stats.cached_tokens == 0);
      require_same(plain.outcomes, run_alone(*w, devices, requests));

      engine::EngineOptions chunked = fresh;
      chunked.step_tokens = 7;  // prompts of up to 78 tokens cut into steps of 7 rows
      chunked.parallel = 4;
      require_same(run_engine(*w, devices, requests, chunked).outcomes, plain.outcomes);

      engine::EngineOptions busy = fresh;
      busy.busy_prefill_tokens = 3;  // prompts trickle in beside the decoding sequences
      busy.parallel = 6;
      require_same(run_engine(*w, devices, requests, busy).outcomes, plain.outcomes);

      engine::EngineOptions small_pool = fresh;
      small_pool.kv_blocks = 8;  // 128 positions for 16 sequences of up to 84
      const EngineRun preempted = run_engine(*w, devices, requests, small_pool);
      CHECK(preempted.stats.preemptions > 0);
      require_same(preempted.outcomes, plain.outcomes);

      engine::EngineOptions four_at_once;
      four_at_once.parallel = 4;
      const EngineRun shared = run_engine(*w, devices, requests, four_at_once);
      CHECK(shared.stats.cached_tokens >= 12 * 32);  // every request after the first four reuses the two system blocks
      require_same(shared.outcomes, plain.outcomes);
    }
}

TEST_CASE("batch engine: on a bf16 or f16 KV pool, requests together and prompts in chunks equal each alone, bit for bit",
          "[llama][batch][kv]") {
  const model::LlamaConfig c = engine_config();
  const model::TensorWeights f32 = random_weights(c, 25);
  const std::vector<engine::BatchRequest> requests = mixed_requests(c.vocab_size);
  for (nn::KvDtype kv : {nn::KvDtype::BF16, nn::KvDtype::F16})
    for (int devices : {1, 2}) {
      INFO(nn::kv_dtype_name(kv) << " KV on " << devices << " devices");
      const std::vector<Outcome> alone = run_alone(f32, devices, requests, kv);  // token by token through forward()
      engine::EngineOptions together;
      together.kv_dtype = kv;
      together.prefix_sharing = false;
      const EngineRun one_chunk = run_engine(f32, devices, requests, together);  // each prompt in one step
      CHECK(one_chunk.stats.steps < 16 * 6);
      require_same(one_chunk.outcomes, alone);
      engine::EngineOptions chunked = together;
      chunked.step_tokens = 7;
      chunked.parallel = 4;
      require_same(run_engine(f32, devices, requests, chunked).outcomes, alone);
      engine::EngineOptions shared = together;
      shared.prefix_sharing = true;
      shared.kv_blocks = 8;  // preempted and re-prefilled
      require_same(run_engine(f32, devices, requests, shared).outcomes, alone);
      CHECK(alone[0].logits != run_alone(f32, devices, requests)[0].logits);  // the rounded cache acts
    }
}

TEST_CASE("batch engine: --kv-memory holds twice the blocks in bf16 or f16 as in f32", "[llama][batch][kv]") {
  const model::LlamaConfig c = engine_config();
  engine::EngineOptions o;
  o.kv_memory = int64_t{3} << 20;
  const int f32_blocks = engine::kv_pool_blocks(c, model::plan_all_shards(c, 1), 1, o);
  CHECK(f32_blocks == (int64_t{3} << 20) / (2 * c.n_layers * o.block_size * c.kv_dim() * 4));
  for (nn::KvDtype kv : {nn::KvDtype::BF16, nn::KvDtype::F16}) {
    o.kv_dtype = kv;
    CHECK(engine::kv_pool_blocks(c, model::plan_all_shards(c, 1), 1, o) == 2 * f32_blocks);
    CHECK(engine::kv_pool_blocks(c, model::plan_all_shards(c, 2), 2, o) == 4 * f32_blocks);  // each device holds half the kv heads
  }
  // and the pool is that many bytes
  dist::run_on_mesh(dist::Mesh::line(1), [&](dist::Device& dev) {
    model::TensorWeights w = random_weights(c, 26);
    model::Llama m(w, dev.axis("model"));
    o.kv_dtype = nn::KvDtype::BF16;
    engine::BatchEngine bf16(m, o);
    o.kv_dtype = nn::KvDtype::F32;
    engine::BatchEngine f32(m, o);
    CHECK(bf16.kv_blocks() == 2 * f32.kv_blocks());
    CHECK(bf16.kv_pool_bytes() == f32.kv_pool_bytes());
    CHECK(bf16.kv_pool_bytes() <= o.kv_memory);
  });
}

TEST_CASE("batch engine: MoE requests together equal each alone, bit for bit, tensor- and expert-parallel", "[llama][batch][moe]") {
  model::LlamaConfig c{.dim = 64, .hidden_dim = 96, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 64,
                       .seq_len = 96, .n_experts = 4, .top_k = 2};
  const model::TensorWeights f32 = random_weights(c, 27);
  const model::ConvertedWeights q8(f32, tensor::WeightFormat::affine(8, 32));
  const std::vector<engine::BatchRequest> requests = mixed_requests(c.vocab_size);
  for (const model::WeightSource* w : {static_cast<const model::WeightSource*>(&f32), static_cast<const model::WeightSource*>(&q8)})
    for (const dist::Mesh& mesh : {dist::Mesh::line(1), dist::Mesh::line(2), dist::Mesh({{"expert", 2}, {"model", 1}})}) {
      INFO((w == &f32 ? "f32" : "8-bit") << " on " << mesh.to_string());
      require_same(run_engine(*w, mesh, requests, {}).outcomes, run_alone(*w, mesh, requests));
    }
}

TEST_CASE("batch engine: greedy tokens agree on 1, 2, 3 and 4 devices", "[llama][batch]") {
  model::LlamaConfig c = make_config(48, 12, 6, 72, 2, 61, true);
  c.seq_len = 64;
  const model::TensorWeights w = random_weights(c, 31);
  std::vector<engine::BatchRequest> requests = mixed_requests(c.vocab_size);
  for (engine::BatchRequest& r : requests) r.temperature = 0.0f;
  const EngineRun one = run_engine(w, 1, requests, {});
  for (int devices : {2, 3, 4}) {
    INFO(devices << " devices");
    const EngineRun many = run_engine(w, devices, requests, {});
    for (size_t i = 0; i < requests.size(); ++i) CHECK(many.outcomes[i].tokens == one.outcomes[i].tokens);
  }
}

TEST_CASE("batch engine: greedy steps move each device's best (logit, token), not the logits, and pick the same tokens",
          "[llama][batch]") {
  model::LlamaConfig c = make_config(48, 12, 6, 72, 2, 61, true);
  c.seq_len = 64;
  const model::TensorWeights w = random_weights(c, 31);
  std::vector<engine::BatchRequest> requests = mixed_requests(c.vocab_size);
  for (engine::BatchRequest& r : requests) r.temperature = 0.0f;
  for (const int devices : {2, 3}) {
    INFO(devices << " devices");
    // Requests that want their logits (for on_logits) have them gathered; without, greedy rows' tokens only.
    std::vector<std::vector<int>> tokens[2];
    uint64_t received[2] = {0, 0};
    int64_t most_local_vocab = 0;
    for (const bool hook : {true, false}) {
      dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
        model::Llama m(w, dev.axis("model"));
        engine::BatchEngine engine(m, {});
        engine.on_logits = [](int, std::span<const float>) {};
        for (engine::BatchRequest r : requests) {
          r.logits = hook;
          engine.add(r);
        }
        const uint64_t before = dev.stats().bytes_received;
        while (engine.step()) {
        }
        if (dev.rank() != 0) return;
        received[hook ? 0 : 1] = dev.stats().bytes_received - before;
        for (size_t i = 0; i < requests.size(); ++i) tokens[hook ? 0 : 1].push_back(engine.result(static_cast<int>(i)).tokens);
        for (const model::ShardPlan& p : m.plans()) most_local_vocab = std::max(most_local_vocab, p.vocab.count);
      });
    }
    CHECK(tokens[1] == tokens[0]);
    int64_t picked = 0;
    for (const std::vector<int>& t : tokens[0]) picked += static_cast<int64_t>(t.size());
    // Per picked token device 0 receives the other devices' logits ((V - its own) floats) with the
    // hook, 8 bytes a device without.
    const int64_t saved_per_token = (c.vocab_size - most_local_vocab) * 4 - 8 * (devices - 1);
    CHECK(static_cast<int64_t>(received[0] - received[1]) >= picked * saved_per_token);
  }
}

TEST_CASE("batch engine: stop ids and on_token end a sequence early, and a prompt the context cannot hold is refused",
          "[llama][batch]") {
  const model::LlamaConfig c = engine_config();
  const model::TensorWeights w = random_weights(c, 41);
  std::vector<engine::BatchRequest> requests = mixed_requests(c.vocab_size);
  for (int t = 0; t < c.vocab_size; ++t) requests[4].stop_ids.push_back(t);  // any token stops it
  requests[5].max_tokens = 50;
  dist::run_on_mesh(dist::Mesh::line(1), [&](dist::Device& dev) {
    model::Llama m(w, dev.axis("model"));
    engine::BatchEngine engine(m, {});
    for (const engine::BatchRequest& r : requests) engine.add(r);
    engine.on_token = [&](int id, int) { return id != 5 || engine.result(5).tokens.size() < 3; };
    while (engine.step()) {
    }
    CHECK(engine.result(5).tokens.size() == 3);
    CHECK(engine.result(5).finish_reason == engine::FinishReason::stop);
    CHECK(engine.result(4).finish_reason == engine::FinishReason::stop);
    CHECK(engine.result(4).tokens.size() == 1);
    CHECK(engine.result(0).finish_reason == engine::FinishReason::length);
    CHECK(engine.kv_blocks_free() == engine.kv_blocks());  // every finished sequence gave its blocks back
    engine::BatchRequest too_long;
    too_long.prompt.assign(static_cast<size_t>(c.seq_len + 1), 1);
    CHECK_THROWS_WITH(engine.add(too_long), Catch::Contains("request 16") && Catch::Contains("96"));
  });
}

namespace {

// One ASCII character per id ('0' + id): text for stop strings to be found in.
class CharTokenizer : public text::TokenizerInterface {
 public:
  explicit CharTokenizer(int vocab) : vocab_(vocab) {}
  int vocab_size() const override { return vocab_; }
  std::vector<int> encode_text(std::string_view text, bool) const override {
    std::vector<int> ids;
    for (const char c : text) ids.push_back(c - '0');
    return ids;
  }
  std::string decode_ids(std::span<const int> ids, bool) const override {
    std::string s;
    for (const int id : ids) s += static_cast<char>('0' + id);
    return s;
  }
  std::string token_text(int id) const override { return std::string(1, static_cast<char>('0' + id)); }
  std::optional<int> token_id(std::string_view) const override { return std::nullopt; }
  std::string bos_text() const override { return ""; }
  std::string eos_text() const override { return ""; }

 private:
  int vocab_;
};

struct StopRun {
  engine::BatchResult result;
  engine::EngineStats stats;
};

// One request through an engine with the tokenizer on `devices` devices; every device's result.
std::vector<StopRun> run_with_text(const model::WeightSource& w, int devices, const engine::BatchRequest& r,
                                   const text::TokenizerInterface& tokenizer) {
  std::vector<StopRun> out(static_cast<size_t>(devices));
  dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
    model::Llama m(w, dev.axis("model"));
    engine::BatchEngine engine(m, {}, &tokenizer);
    engine.add(r);
    while (engine.step()) {
    }
    out[static_cast<size_t>(dev.rank())] = {engine.result(0), engine.stats()};
  });
  return out;
}

}  // namespace

TEST_CASE("batch engine: a stop string ends its sequence at the step that produced it, on every device", "[llama][batch]") {
  const model::LlamaConfig c = engine_config();
  const model::TensorWeights w = random_weights(c, 53);
  const CharTokenizer tokenizer(c.vocab_size);
  engine::BatchRequest r;
  r.prompt = random_tokens(9, c.vocab_size, 11);
  r.max_tokens = 24;
  r.temperature = 0.0f;
  const StopRun free = run_with_text(w, 1, r, tokenizer)[0];
  REQUIRE(free.result.tokens.size() == 24);
  CHECK(free.result.text == tokenizer.decode_ids(free.result.tokens, false));
  CHECK(free.stats.steps == 24);  // the prompt's step gives the first token, each step one more

  // A stop string from the middle of the text: the token completing its first occurrence is the last.
  const std::string stop = free.result.text.substr(12, 2);
  const size_t at = free.result.text.find(stop);
  const size_t tokens = at + stop.size();  // one character per token
  r.stop = {stop, "not in the text"};
  for (const int devices : {1, 2}) {
    INFO(devices << " devices");
    for (const StopRun& run : run_with_text(w, devices, r, tokenizer)) {
      CHECK(run.result.finish_reason == engine::FinishReason::stop);
      CHECK(run.result.tokens == std::vector<int>(free.result.tokens.begin(), free.result.tokens.begin() + static_cast<long>(tokens)));
      CHECK(run.result.text == free.result.text.substr(0, at));
      CHECK(run.stats.steps == static_cast<int64_t>(tokens));  // no step after the one that produced the stop
      CHECK(run.stats.rows == free.stats.rows - static_cast<int64_t>(24 - tokens));
    }
  }

  // A stop id ends the text too, without its own text; an engine without a tokenizer refuses stop strings.
  r.stop.clear();
  r.stop_ids = {free.result.tokens[5]};
  const size_t first = static_cast<size_t>(std::ranges::find(free.result.tokens, r.stop_ids[0]) - free.result.tokens.begin());
  const StopRun by_id = run_with_text(w, 1, r, tokenizer)[0];
  CHECK(by_id.result.tokens.size() == first + 1);
  CHECK(by_id.result.text == free.result.text.substr(0, first));
  r.stop = {stop};
  dist::run_on_mesh(dist::Mesh::line(1), [&](dist::Device& dev) {
    model::Llama m(w, dev.axis("model"));
    engine::BatchEngine engine(m, {});
    CHECK_THROWS_WITH(engine.add(r), Catch::Contains("stop strings need the engine's tokenizer"));
  });
}

TEST_CASE("batch engine: a sequence reaching the context's end finishes with length", "[llama][batch]") {
  const model::LlamaConfig c = engine_config();
  const model::TensorWeights w = random_weights(c, 43);
  engine::BatchRequest r;
  r.prompt = random_tokens(90, c.vocab_size, 5);
  r.max_tokens = 100;
  engine::EngineOptions o;
  o.kv_blocks = 6;  // exactly the context: 96 positions
  const EngineRun run = run_engine(w, 1, {r}, o);
  CHECK(run.outcomes[0].finish_reason == engine::FinishReason::length);
  CHECK(run.outcomes[0].tokens.size() == 7);  // positions 90..95 fed, the 7th token's position would be 96
}

TEST_CASE("batch engine: a cancelled sequence gives its blocks back at once and the others keep their bits", "[llama][batch]") {
  const model::LlamaConfig c = engine_config();
  const model::TensorWeights w = random_weights(c, 47);
  std::vector<engine::BatchRequest> requests = mixed_requests(c.vocab_size);
  for (engine::BatchRequest& r : requests) r.max_tokens = 8;
  const std::vector<Outcome> alone = run_alone(w, 2, requests);
  struct Seen {  // device 0's observations, checked on the test's thread (Catch2 is not thread-safe)
    int free_before = 0, free_after_cancel = 0, running = 0, waiting = 0, free_at_end = 0, blocks = 0;
    std::vector<Outcome> outcomes;
    bool forgotten_result_throws = false, second_forget_throws = false;
  } seen;
  dist::run_on_mesh(dist::Mesh::line(2), [&](dist::Device& dev) {
    model::Llama m(w, dev.axis("model"));
    engine::EngineOptions o;
    o.parallel = 8;  // 8 wait while 8 run
    engine::BatchEngine engine(m, o);
    std::vector<Outcome> outcomes(requests.size());
    engine.on_logits = [&](int id, std::span<const float> l) { outcomes[static_cast<size_t>(id)].logits.emplace_back(l.begin(), l.end()); };
    for (const engine::BatchRequest& r : requests) engine.add(r);
    engine.step();
    engine.step();
    Seen mine;
    mine.free_before = engine.kv_blocks_free();
    engine.cancel(3);   // running, mid-generation
    engine.cancel(12);  // still waiting
    mine.free_after_cancel = engine.kv_blocks_free();
    mine.running = engine.running();
    mine.waiting = engine.waiting();
    engine.cancel(3);  // again: nothing
    while (engine.step()) {
    }
    mine.free_at_end = engine.kv_blocks_free();
    mine.blocks = engine.kv_blocks();
    for (size_t i = 0; i < requests.size(); ++i) {
      outcomes[i].tokens = engine.result(static_cast<int>(i)).tokens;
      outcomes[i].finish_reason = engine.result(static_cast<int>(i)).finish_reason;
    }
    mine.outcomes = std::move(outcomes);
    engine.forget(3);
    try {
      engine.result(3);
    } catch (const std::out_of_range&) {
      mine.forgotten_result_throws = true;
    }
    try {
      engine.forget(3);
    } catch (const std::out_of_range&) {
      mine.second_forget_throws = true;
    }
    if (dev.rank() == 0) seen = std::move(mine);
  });
  CHECK(seen.free_after_cancel > seen.free_before);
  CHECK(seen.running == 7);
  CHECK(seen.waiting == 7);
  CHECK(seen.free_at_end == seen.blocks);
  CHECK(seen.forgotten_result_throws);
  CHECK(seen.second_forget_throws);
  for (size_t i = 0; i < requests.size(); ++i) {
    INFO("request " << i);
    const Outcome& o = seen.outcomes[i];
    if (i == 3 || i == 12) {
      CHECK(o.finish_reason == engine::FinishReason::cancelled);
      CHECK(o.tokens.size() < 8);
      continue;
    }
    CHECK(o.tokens == alone[i].tokens);
    REQUIRE(o.logits.size() == alone[i].logits.size());
    for (size_t t = 0; t < o.logits.size(); ++t)
      CHECK(std::memcmp(o.logits[t].data(), alone[i].logits[t].data(), o.logits[t].size() * sizeof(float)) == 0);
  }
}

TEST_CASE("batch engine: a cancel that crosses its sequence's end, or names no sequence, changes nothing", "[llama][batch]") {
  const model::LlamaConfig c = engine_config();
  const model::TensorWeights w = random_weights(c, 53);
  std::vector<engine::BatchRequest> requests = mixed_requests(c.vocab_size);
  requests[0].max_tokens = 1;
  const std::vector<Outcome> alone = run_alone(w, 1, requests);
  std::vector<Outcome> outcomes(requests.size());
  bool stale_cancels_were_nothing = false;
  dist::run_on_mesh(dist::Mesh::line(1), [&](dist::Device& dev) {
    model::Llama m(w, dev.axis("model"));
    engine::BatchEngine engine(m, {});
    engine.on_logits = [&](int id, std::span<const float> l) { outcomes[static_cast<size_t>(id)].logits.emplace_back(l.begin(), l.end()); };
    std::vector<int> finished;
    engine.on_finished = [&](int id) { finished.push_back(id); };
    for (const engine::BatchRequest& r : requests) engine.add(r);
    engine.step();  // request 0 finishes at its first token
    for (const int id : finished) engine.forget(id);
    const int running = engine.running();
    engine.cancel(0);    // finished and forgotten: the server's HTTP thread asked too late
    engine.cancel(-1);   // never given
    engine.cancel(999);  // not yet given
    stale_cancels_were_nothing = engine.running() == running;
    while (engine.step()) {
    }
    for (size_t i = 1; i < requests.size(); ++i) outcomes[i].tokens = engine.result(static_cast<int>(i)).tokens;
  });
  CHECK(stale_cancels_were_nothing);
  for (size_t i = 1; i < requests.size(); ++i) {
    INFO("request " << i);
    CHECK(outcomes[i].tokens == alone[i].tokens);
    CHECK(outcomes[i].logits == alone[i].logits);
  }
}

TEST_CASE("batch engine: a sequence whose logits are not finite fails alone, and the others keep their bits", "[llama][batch]") {
  const model::LlamaConfig c = engine_config();
  const model::TensorWeights clean = random_weights(c, 59);
  model::TensorWeights poisoned = random_weights(c, 59);
  constexpr int POISON = 30;  // its embedding row holds +inf: any sequence that feeds it overflows
  poisoned.at("tok_embeddings").data()[static_cast<size_t>(POISON * c.dim + 5)] = std::numeric_limits<float>::infinity();
  std::vector<engine::BatchRequest> requests = mixed_requests(c.vocab_size);
  for (engine::BatchRequest& r : requests) std::ranges::replace(r.prompt, POISON, POISON + 1);
  requests[2].prompt.insert(requests[2].prompt.begin() + 1, POISON);
  const std::vector<Outcome> alone = run_alone(clean, 1, requests);
  const auto feeds_poison = [&](size_t i) {  // a generated token is fed back unless it is the last
    const std::vector<int>& t = alone[i].tokens;
    return i == 2 || std::find(t.begin(), t.end() - 1, POISON) != t.end() - 1;
  };
  for (const int devices : {1, 2}) {
    INFO(devices << " devices");
    std::vector<engine::BatchResult> results;
    std::vector<std::vector<std::vector<float>>> logits(requests.size());
    int free_at_end = 0, blocks = 0;
    dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
      model::Llama m(poisoned, dev.axis("model"));
      engine::BatchEngine engine(m, {});
      std::vector<std::vector<std::vector<float>>> mine(requests.size());
      engine.on_logits = [&](int id, std::span<const float> l) { mine[static_cast<size_t>(id)].emplace_back(l.begin(), l.end()); };
      for (const engine::BatchRequest& r : requests) engine.add(r);
      while (engine.step()) {
      }
      if (dev.rank() != 0) return;
      for (size_t i = 0; i < requests.size(); ++i) results.push_back(engine.result(static_cast<int>(i)));
      logits = std::move(mine);
      free_at_end = engine.kv_blocks_free();
      blocks = engine.kv_blocks();
    });
    CHECK(free_at_end == blocks);
    for (size_t i = 0; i < requests.size(); ++i) {
      INFO("request " << i);
      if (feeds_poison(i)) {
        CHECK(results[i].finish_reason == engine::FinishReason::error);
        CHECK_THAT(results[i].error, Catch::Contains("not finite") && Catch::Contains("position"));
        continue;
      }
      CHECK(results[i].finish_reason == engine::FinishReason::length);
      CHECK(results[i].tokens == alone[i].tokens);
      CHECK(logits[i] == alone[i].logits);
    }
  }
}

namespace {

// Half of mixed_requests given penalties, a logit_bias, top_k or min_p (greedy ones too).
// The even-numbered outcomes of a batch (its plain requests) equal `alone`, bit for bit.
void require_even_ones_same(const std::vector<Outcome>& together, const std::vector<Outcome>& alone) {
  for (size_t i = 0; i < alone.size(); ++i) {
    INFO("plain request " << 2 * i);
    CHECK(together[2 * i].tokens == alone[i].tokens);
    REQUIRE(together[2 * i].logits.size() == alone[i].logits.size());
    for (size_t t = 0; t < alone[i].logits.size(); ++t)
      CHECK(std::memcmp(together[2 * i].logits[t].data(), alone[i].logits[t].data(), alone[i].logits[t].size() * sizeof(float)) == 0);
  }
}

std::vector<engine::BatchRequest> penalised_requests(int vocab) {
  std::vector<engine::BatchRequest> requests = mixed_requests(vocab);
  for (size_t i = 1; i < requests.size(); i += 2) {
    engine::SamplingParams& p = requests[i].sampling;
    p.presence_penalty = 0.5f + 0.1f * static_cast<float>(i % 4);
    p.frequency_penalty = i % 3 == 0 ? 1.5f : 0.0f;
    p.repetition_penalty = i % 5 == 0 ? 1.3f : 1.0f;
    p.logit_bias = {{static_cast<int>(i) % vocab, 2.0f}, {(static_cast<int>(i) * 7) % vocab, -100.0f}};
    p.top_k = i % 4 == 1 ? 5 : 0;
    p.min_p = i % 4 == 3 ? 0.05f : 0.0f;
    requests[i].max_tokens = 8;
  }
  return requests;
}

}  // namespace

TEST_CASE("batch engine: penalised and plain sequences together: the plain keep their bits, the penalised their tokens",
          "[llama][batch][sampling]") {
  const model::LlamaConfig c = engine_config();
  const model::TensorWeights w = random_weights(c, 77);
  const std::vector<engine::BatchRequest> requests = penalised_requests(c.vocab_size);
  std::vector<engine::BatchRequest> plain;
  for (size_t i = 0; i < requests.size(); i += 2) plain.push_back(requests[i]);
  const EngineRun together = run_engine(w, 1, requests, {});
  const std::vector<Outcome> alone = run_alone(w, 1, plain);  // forward() and run.c's sampler
  require_even_ones_same(together.outcomes, alone);
  // Each penalised request alone in the engine picks the tokens it picked in the batch.
  for (size_t i = 1; i < requests.size(); i += 2) {
    INFO("penalised request " << i);
    const EngineRun one = run_engine(w, 1, {requests[i]}, {});
    CHECK(one.outcomes[0].tokens == together.outcomes[i].tokens);
    for (int t : together.outcomes[i].tokens) CHECK(t != (static_cast<int>(i) * 7) % c.vocab_size);  // biased -100: never
  }
}

TEST_CASE("batch engine: greedy with penalties and a bias picks the argmax of the logits penalised as OpenAI defines it",
          "[llama][batch][sampling]") {
  const model::LlamaConfig c = engine_config();
  const model::TensorWeights w = random_weights(c, 78);
  engine::BatchRequest r;
  r.prompt = random_tokens(9, c.vocab_size, 5);
  r.max_tokens = 12;
  r.temperature = 0.0f;
  r.sampling.presence_penalty = 1.0f;
  r.sampling.frequency_penalty = 2.0f;
  r.sampling.logit_bias = {{3, 1.5f}};
  r.logits = true;
  // A request that does not want its logits would take the greedy fast path (each device's best
  // raw logit): the bias and penalties must route it through the whole logits, on 2 devices too.
  engine::BatchRequest quiet = r;
  quiet.logits = false;
  const EngineRun run = run_engine(w, 1, {r}, {});
  const EngineRun fast = run_engine(w, 2, {quiet}, {});
  REQUIRE(run.outcomes[0].logits.size() == run.outcomes[0].tokens.size());
  std::map<int, int> count;
  for (size_t t = 0; t < run.outcomes[0].tokens.size(); ++t) {
    std::vector<float> l = run.outcomes[0].logits[t];  // raw: on_logits sees them before the bias and penalties
    l[3] += 1.5f;
    for (const auto& [token, n] : count) l[static_cast<size_t>(token)] -= 2.0f * static_cast<float>(n) + 1.0f;
    const int want = static_cast<int>(std::ranges::max_element(l) - l.begin());
    INFO("token " << t);
    CHECK(run.outcomes[0].tokens[t] == want);
    ++count[want];
  }
  CHECK(count.size() > 1);  // the penalties moved it off a repeated token
  CHECK(fast.outcomes[0].tokens == run.outcomes[0].tokens);
}

TEST_CASE("batch engine: penalised requests pick the same tokens on 1 and 2 devices", "[llama][batch][sampling]") {
  const model::LlamaConfig c = engine_config();
  const model::TensorWeights w = random_weights(c, 79);
  std::vector<engine::BatchRequest> requests = penalised_requests(c.vocab_size);
  for (engine::BatchRequest& r : requests) r.logits = false;  // greedy plain ones take the fast path
  const EngineRun one = run_engine(w, 1, requests, {});
  const EngineRun two = run_engine(w, 2, requests, {});
  for (size_t i = 0; i < requests.size(); ++i) {
    INFO("request " << i);
    CHECK(two.outcomes[i].tokens == one.outcomes[i].tokens);
  }
}

namespace {

// A constraint written for the test: tokens of one residue class mod `modulus` only, whole after
// `whole_after` tokens and ended after `end_after`.
class ResidueConstraint : public engine::TokenConstraint {
 public:
  ResidueConstraint(int vocab, int modulus, int residue, int whole_after, int end_after)
      : vocab_(vocab), modulus_(modulus), residue_(residue), whole_after_(whole_after), end_after_(end_after) {}
  void allowed_tokens(std::span<uint32_t> bits) const override {
    if (must_end()) return;
    for (int t = residue_; t < vocab_; t += modulus_) bits[static_cast<size_t>(t / 32)] |= 1u << (t % 32);
  }
  void accept(int token) override {
    REQUIRE(token % modulus_ == residue_);
    ++accepted_;
  }
  bool can_end() const override { return accepted_ >= whole_after_; }
  bool must_end() const override { return accepted_ >= end_after_; }
  static bool allows(int token, int modulus, int residue) { return token % modulus == residue; }

 private:
  int vocab_, modulus_, residue_, whole_after_, end_after_, accepted_ = 0;
};

engine::TokenConstraintFactory residue_constraint(int vocab, int modulus, int residue, int whole_after, int end_after) {
  return [=] { return std::make_unique<ResidueConstraint>(vocab, modulus, residue, whole_after, end_after); };
}

}  // namespace

TEST_CASE("batch engine: a constrained sequence takes only the tokens its constraint allows, and its neighbours keep their bits",
          "[llama][batch][constraint]") {
  const model::LlamaConfig c = engine_config();
  const model::TensorWeights w = random_weights(c, 79);
  std::vector<engine::BatchRequest> requests = mixed_requests(c.vocab_size);
  std::vector<engine::BatchRequest> plain;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (i % 2 == 0) {
      plain.push_back(requests[i]);
      continue;
    }
    engine::BatchRequest& r = requests[i];
    r.max_tokens = 12;
    r.constraint = residue_constraint(c.vocab_size, 5, static_cast<int>(i % 5), 3, 6 + static_cast<int>(i % 4));
    r.stop_ids = {static_cast<int>(i % 5) + 5, static_cast<int>(i + 1) % 5 + 10};  // in the constraint's tokens, and not
  }
  const EngineRun together = run_engine(w, 1, requests, {});
  const std::vector<Outcome> alone = run_alone(w, 1, plain);
  require_even_ones_same(together.outcomes, alone);
  for (size_t i = 1; i < requests.size(); i += 2) {
    INFO("constrained request " << i);
    const Outcome& o = together.outcomes[i];
    const int residue = static_cast<int>(i % 5), end_after = 6 + static_cast<int>(i % 4);
    CHECK(o.finish_reason == engine::FinishReason::stop);
    REQUIRE(!o.tokens.empty());
    const std::vector<int>& stops = requests[i].stop_ids;
    const auto is_stop = [&](int token) { return std::ranges::find(stops, token) != stops.end(); };
    const bool stopped_by_id = is_stop(o.tokens.back());
    if (!stopped_by_id) CHECK(static_cast<int>(o.tokens.size()) == end_after);
    for (size_t t = 0; t < o.tokens.size(); ++t) {
      if (t + 1 == o.tokens.size() && stopped_by_id) CHECK(t >= 3);  // a stop id only once whole
      else CHECK(ResidueConstraint::allows(o.tokens[t], 5, residue));
    }
    // Greedy ones pick the argmax of their raw logits among the tokens allowed (and the stop id once whole).
    if (requests[i].temperature == 0.0f) {
      REQUIRE(o.logits.size() == o.tokens.size());
      for (size_t t = 0; t < o.tokens.size(); ++t) {
        int best = -1;
        for (int v = 0; v < c.vocab_size; ++v) {
          const bool allowed = is_stop(v) ? t >= 3 : ResidueConstraint::allows(v, 5, residue);
          if (allowed && (best < 0 || o.logits[t][static_cast<size_t>(v)] > o.logits[t][static_cast<size_t>(best)])) best = v;
        }
        CHECK(o.tokens[t] == best);
      }
    }
    const EngineRun one = run_engine(w, 1, {requests[i]}, {});
    CHECK(one.outcomes[0].tokens == o.tokens);
    const EngineRun two = run_engine(w, 2, {requests[i]}, {});
    CHECK(two.outcomes[0].tokens == o.tokens);
  }
}

TEST_CASE("batch engine: the n choices of one prompt prefill its blocks once and keep their bits", "[llama][batch]") {
  const model::LlamaConfig c = engine_config();
  const model::TensorWeights w = random_weights(c, 80);
  engine::BatchRequest r;
  r.prompt = random_tokens(40, c.vocab_size, 9);  // two whole blocks of 16, then 8
  r.max_tokens = 5;
  r.temperature = 0.9f;
  r.logits = true;
  std::vector<engine::BatchRequest> choices;
  for (uint64_t i = 0; i < 4; ++i) {
    choices.push_back(r);
    choices.back().seed = 50 + i;
  }
  const EngineRun together = run_engine(w, 1, choices, {});
  require_same(together.outcomes, run_alone(w, 1, choices));
  CHECK(together.stats.cached_tokens == 3 * 32);  // the three after the first reuse its two blocks
  CHECK(together.stats.rows == 40 + 3 * 8 + 4 * 4);
}

// Speculation: a sequence's guessed tokens are checked as more rows of its step, and its picks
// are those of plain decoding, bit for bit and seed for seed, whatever the guesses are.
namespace {

// Guesses from what plain decoding gave each request, each step's made wrong at one place that
// moves with the position: some steps all right, some right up to a point, some wrong at once.
Guess oracle_guess(const std::vector<engine::BatchRequest>& requests, const std::vector<Outcome>& truth, int vocab) {
  return [&requests, &truth, vocab](std::span<engine::BatchEngine::GuessRequest> sequences) {
    for (engine::BatchEngine::GuessRequest& g : sequences) {
      const size_t done = g.tokens.size() - requests[static_cast<size_t>(g.id)].prompt.size();
      const std::vector<int>& next = truth[static_cast<size_t>(g.id)].tokens;
      for (size_t j = done; j < next.size() && std::ssize(g.guesses) < g.count; ++j) g.guesses.push_back(next[j]);
      const size_t wrong = (done * 7 + static_cast<size_t>(g.id)) % static_cast<size_t>(g.count + 2);
      if (wrong < g.guesses.size()) g.guesses[wrong] = (g.guesses[wrong] + 1) % vocab;
    }
  };
}

engine::EngineOptions speculating(engine::EngineOptions options, int guesses) {
  options.speculation.guesses = guesses;
  return options;
}

}  // namespace

TEST_CASE("speculation: guesses right and wrong change no bit of 16 requests, greedy and sampled, in f32, 8- and 4-bit, on 1 and 2 devices",
          "[llama][batch][speculation]") {
  const model::LlamaConfig c = engine_config();
  const model::TensorWeights f32 = random_weights(c, 91);
  const model::ConvertedWeights q8(f32, tensor::WeightFormat::affine(8, 32)), q4(f32, tensor::WeightFormat::affine(4, 32));
  std::vector<engine::BatchRequest> requests = mixed_requests(c.vocab_size);
  for (size_t i = 0; i < requests.size(); ++i) requests[i].max_tokens = 6 + static_cast<int>(i % 7);
  const std::pair<const char*, const model::WeightSource*> formats[] = {{"f32", &f32}, {"8-bit", &q8}, {"4-bit", &q4}};
  for (const auto& [name, w] : formats)
    for (int devices : {1, 2}) {
      INFO(name << " on " << devices << " devices");
      const EngineRun plain = run_engine(*w, devices, requests, {});
      const EngineRun guessed = run_engine(*w, devices, requests, speculating({}, 4), oracle_guess(requests, plain.outcomes, c.vocab_size));
      require_same(guessed.outcomes, plain.outcomes);
      CHECK(guessed.stats.guessed_right > 0);
      CHECK(guessed.stats.guessed_right < guessed.stats.guessed);
      CHECK(guessed.stats.steps < plain.stats.steps);  // right guesses saved steps
      CHECK(guessed.stats.rows == plain.stats.rows + guessed.stats.guessed - guessed.stats.guessed_right);
    }
}

TEST_CASE("speculation: under chunked prefill, a busy prefill budget, preemption and prefix sharing, guesses change no bit",
          "[llama][batch][speculation]") {
  const model::LlamaConfig c = engine_config();
  const model::TensorWeights w = random_weights(c, 92);
  const std::vector<int> system = random_tokens(37, c.vocab_size, 9);
  std::vector<engine::BatchRequest> requests = mixed_requests(c.vocab_size, system);
  for (size_t i = 0; i < requests.size(); ++i) requests[i].max_tokens = 5 + static_cast<int>(i % 9);
  engine::EngineOptions fresh;
  fresh.prefix_sharing = false;
  const EngineRun plain = run_engine(w, 1, requests, fresh);
  const Guess guess = oracle_guess(requests, plain.outcomes, c.vocab_size);
  engine::EngineOptions chunked = fresh, busy = fresh, small_pool, shared;
  chunked.step_tokens = 7;
  chunked.parallel = 4;
  busy.busy_prefill_tokens = 3;
  busy.parallel = 6;
  small_pool.kv_blocks = 9;
  shared.parallel = 4;
  for (const engine::EngineOptions& o : {fresh, chunked, busy, small_pool, shared})
    for (int devices : {1, 2}) {
      INFO("step_tokens " << o.step_tokens << ", busy " << o.busy_prefill_tokens << ", kv_blocks " << o.kv_blocks << ", parallel "
                          << o.parallel << ", on " << devices << " devices");
      const EngineRun guessed = run_engine(w, devices, requests, speculating(o, 3), guess);
      require_same(guessed.outcomes, plain.outcomes);
      CHECK(guessed.stats.guessed_right > 0);
      if (o.kv_blocks) CHECK(guessed.stats.preemptions > 0);
      if (o.prefix_sharing) CHECK(guessed.stats.cached_tokens > 0);
    }
}

TEST_CASE("speculation: stop ids, on_token, max_tokens and a grammar met inside a step's guesses end where plain decoding does",
          "[llama][batch][speculation]") {
  const model::LlamaConfig c = engine_config();
  const model::TensorWeights w = random_weights(c, 93);
  std::vector<engine::BatchRequest> requests = mixed_requests(c.vocab_size);
  std::vector<engine::BatchRequest> unstopped = requests;
  for (auto& r : unstopped) r.max_tokens = 12;
  const EngineRun free = run_engine(w, 1, unstopped, {});
  for (size_t i = 0; i < requests.size(); ++i) {
    engine::BatchRequest& r = requests[i];
    r.max_tokens = 12;
    if (i % 3 == 0) r.stop_ids = {free.outcomes[i].tokens[3 + i % 5]};  // met part way through some step's guesses
    if (i % 3 == 1) r.constraint = residue_constraint(c.vocab_size, 5, static_cast<int>(i % 5), 3, 6 + static_cast<int>(i % 4));
  }
  const EngineRun plain = run_engine(w, 1, requests, {});
  for (const Guess& guess : {oracle_guess(requests, plain.outcomes, c.vocab_size), oracle_guess(unstopped, free.outcomes, c.vocab_size)}) {
    const EngineRun guessed = run_engine(w, 1, requests, speculating({}, 5), guess);
    require_same(guessed.outcomes, plain.outcomes);
    CHECK(guessed.stats.guessed_right > 0);
  }
  // on_token ending a sequence part way through its guesses: the tokens after are not taken.
  dist::run_on_mesh(dist::Mesh::line(1), [&](dist::Device& dev) {
    model::Llama m(w, dev.axis("model"));
    engine::BatchEngine engine(m, speculating({}, 5));
    engine.guess = oracle_guess(unstopped, free.outcomes, c.vocab_size);
    for (const engine::BatchRequest& r : unstopped) engine.add(r);
    engine.on_token = [&](int id, int) { return id != 2 || engine.result(2).tokens.size() < 4; };
    while (engine.step()) {
    }
    CHECK(engine.result(2).tokens == std::vector<int>(free.outcomes[2].tokens.begin(), free.outcomes[2].tokens.begin() + 4));
    CHECK(engine.result(2).finish_reason == engine::FinishReason::stop);
    CHECK(engine.kv_blocks_free() == engine.kv_blocks());  // no block left behind by dropped rows
  });
}

TEST_CASE("speculation: prompt lookup guesses what followed the latest earlier occurrence of the sequence's end",
          "[batch][speculation]") {
  using engine::lookup_guesses;
  const std::vector<int> tokens = {5, 1, 2, 3, 4, 7, 1, 2, 3};
  CHECK(lookup_guesses(tokens, 3) == std::vector<int>{4, 7, 1});  // "1 2 3" came before, then "4 7 1"
  CHECK(lookup_guesses(tokens, 1) == std::vector<int>{4});
  CHECK(lookup_guesses(tokens, 10) == std::vector<int>{4, 7, 1, 2, 3});  // up to the end
  CHECK(lookup_guesses(tokens, 0).empty());
  const std::vector<int> twice = {8, 2, 3, 9, 6, 2, 3, 5, 1, 2, 3};
  CHECK(lookup_guesses(twice, 2) == std::vector<int>{5, 1});  // the latest of two occurrences
  const std::vector<int> longer = {4, 2, 3, 7, 1, 2, 3, 8, 4, 2, 3};
  CHECK(lookup_guesses(longer, 2) == std::vector<int>{7, 1});  // "4 2 3" matched before the shorter "2 3"
  CHECK(lookup_guesses(std::vector<int>{1, 2, 3, 4, 5, 6}, 4).empty());  // no end came before
  CHECK(lookup_guesses(std::vector<int>{9, 1, 2, 3, 4, 5, 6, 1}, 4).empty());  // one token says too little
  CHECK(lookup_guesses(std::vector<int>{9, 1, 2, 3, 4, 5, 6, 1}, 4, {.longest = 4, .shortest = 1}) == std::vector<int>{2, 3, 4, 5});
  CHECK(lookup_guesses(std::vector<int>{7, 7, 7, 7}, 3) == std::vector<int>{7});  // overlapping runs
  CHECK(lookup_guesses(std::vector<int>{}, 3).empty());
}

TEST_CASE("speculation: prompt lookup on outputs that repeat their prompt guesses right and changes no bit",
          "[llama][batch][speculation]") {
  const model::LlamaConfig c = engine_config();
  const model::TensorWeights w = random_weights(c, 94);
  // Greedy continuations of a small random model fall into loops: the output soon repeats itself.
  std::vector<engine::BatchRequest> requests = mixed_requests(c.vocab_size);
  for (engine::BatchRequest& r : requests) {
    r.max_tokens = 40;
    r.temperature = 0.0f;
  }
  engine::EngineOptions one_at_a_time;  // the steps then count each request's own
  one_at_a_time.parallel = 1;
  const EngineRun plain = run_engine(w, 1, requests, one_at_a_time);
  for (int devices : {1, 2}) {
    const EngineRun looked_up = run_engine(w, devices, requests, speculating(one_at_a_time, 6));
    require_same(looked_up.outcomes, plain.outcomes);
    CHECK(looked_up.stats.guessed_right > 0);
    CHECK(looked_up.stats.steps < plain.stats.steps);
    require_same(run_engine(w, devices, requests, speculating({}, 6)).outcomes, plain.outcomes);  // together
  }
  // Per request: none for one, the engine's for the others.
  requests[0].guesses = 0;
  const EngineRun one_off = run_engine(w, 1, {requests[0]}, speculating({}, 6));
  CHECK(one_off.stats.guessed == 0);
  require_same(one_off.outcomes, {plain.outcomes[0]});
}
