// LoRA fine-tuning of the trainable model (model/trainable_llama.h LoraOptions, nn/lora.h): a fresh
// adapter leaves the model as it was, the adapters' gradients match finite differences of the loss,
// and every data x model mesh (uneven heads and replicated KV heads included) gives the gradients
// of one device.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <vector>

#include "distributed/runtime.h"
#include "formats/peft_adapter.h"
#include "formats/safetensors.h"
#include "model/llama.h"
#include "model/lora_adapter.h"
#include "model/random_init.h"
#include "model/trainable_llama.h"
#include "nn/fd_check.h"
#include "support/error_of.h"
#include "support/rel_diff.h"
#include "support/synthetic_text.h"
#include "train/checkpoint.h"
#include "train/loop.h"
#include "train/lora_testing.h"
#include "train/quiet_run.h"

using namespace tpcli;

namespace {

using tpcli::testing::adapter_gradients_on_mesh;
using tpcli::testing::grads_of;
using tpcli::testing::random_adapters;
using tpcli::testing::random_tokens;
using tpcli::testing::losses_of;
using tpcli::testing::same_losses_on_meshes;

using tpcli::testing::rel_diff;

// Four query heads over two KV heads: three devices split the heads 2, 1, 1 and share a KV head.
model::LlamaConfig small_config() {
  return {.dim = 24, .hidden_dim = 40, .n_layers = 3, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 29, .seq_len = 16,
          .shared_classifier = false};
}

// The same with Qwen2's q/k/v biases and Qwen3's q/k norms (frozen: the gradient goes through them),
// heads of 8 (q 32 wide on dim 24).
model::LlamaConfig qwen_like_config() {
  model::LlamaConfig c = small_config();
  c.head_dim = 8;
  c.qkv_bias = c.qk_norm = true;
  return c;
}

// A mixture of experts whose adapted blocks (the last two) are one dense block and one MoE block:
// the MoE block's attention takes adapters, its experts none.
model::LlamaConfig moe_config() {
  model::LlamaConfig c = small_config();
  c.n_experts = 4;
  c.top_k = 2;
  c.expert_hidden_dim = 16;
  c.dense_layers = {1};
  return c;
}

std::string kind_of(const model::LlamaConfig& c) {
  return c.is_moe() ? "MoE" : c.qk_norm ? "Qwen-like" : "Llama";
}

model::LoraOptions lora_options() {
  model::LoraOptions o;
  o.rank = 3;
  o.alpha = 6;
  o.last_layers = 2;  // block 0 stays unadapted
  o.seed = 5;
  return o;
}




}  // namespace

TEST_CASE("a fresh LoRA adapter leaves the loss unchanged and only the adapters are parameters", "[train][lora]") {
  const auto c = small_config();
  const auto w = model::random_weights(c, 3);
  const int B = 2, T = 5;
  const auto tokens = random_tokens(B * T, c.vocab_size, 4), targets = random_tokens(B * T, c.vocab_size, 5);
  model::TrainableLlama base(w, dist::Group());
  model::TrainableLlama lora(w, dist::Group(), {}, lora_options());
  CHECK(lora.loss(tokens, targets, B, T) == base.loss(tokens, targets, B, T));  // B = 0: the same arithmetic plus zeros
  // 2 blocks x 7 linears x (A, B)
  REQUIRE(lora.parameters().size() == 2 * 7 * 2);
  int64_t adapter_floats = 0;
  for (const auto& p : lora.parameters()) {
    CHECK(p.spec->name.starts_with("layers."));
    CHECK_FALSE(p.spec->name.starts_with("layers.0."));
    adapter_floats += p.value->numel();
  }
  CHECK(static_cast<int64_t>(lora.grad_buffer().size()) == adapter_floats);
  // r (IN + OUT) per linear: wq wk wv wo w1 w3 w2 = (24+24) + 2 (24+12) + (24+24) + 2 (24+40) + (40+24)
  CHECK(adapter_floats == 2 * 3 * (48 + 72 + 48 + 128 + 64));
}

TEST_CASE("LoRA on a MoE model adapts every block's attention and the dense blocks' feed-forward, and refuses "
          "targets that adapt nothing", "[train][lora]") {
  const auto c = moe_config();
  const auto specs = model::lora_parameters(c, lora_options());
  std::vector<std::string> names;
  for (const auto& s : specs) names.push_back(s.name);
  CHECK(specs.size() == 2 * (7 + 4));  // block 1 (dense): all seven linears; block 2 (MoE): wq wk wv wo
  CHECK(std::ranges::count(names, std::string("layers.1.w2.lora_a")) == 1);
  CHECK(std::ranges::count(names, std::string("layers.2.w1.lora_a")) == 0);
  CHECK(std::ranges::count(names, std::string("layers.2.wo.lora_b")) == 1);
  model::LoraOptions ffn_only = lora_options();
  ffn_only.targets = {"w1", "w3", "w2"};
  ffn_only.last_layers = 1;  // block 2 alone: a MoE block
  CHECK(tpcli::testing::error_of([&] { model::lora_parameters(c, ffn_only); })
            .find("the LoRA targets adapt nothing in the last 1 blocks") != std::string::npos);
}

TEST_CASE("LoRA adapter gradients match finite differences of the loss", "[train][lora][grad]") {
  for (const model::LlamaConfig& c : {small_config(), qwen_like_config(), moe_config()}) {
    INFO(kind_of(c));
    const auto base = model::random_weights(c, 11);
    const auto o = lora_options();
    auto adapters = random_adapters(c, o, 12);
    const int B = 2, T = 4;
    const auto tokens = random_tokens(B * T, c.vocab_size, 13), targets = random_tokens(B * T, c.vocab_size, 14);
    const auto model_with = [&](const model::TensorWeights& a) {
      model::TrainableLlama m(base, dist::Group(), {}, o);
      m.load_parameters(a);
      return m;
    };
    model::TrainableLlama m = model_with(adapters);
    m.zero_grad();
    m.forward_backward(tokens, targets, B, T);
    const auto grads = grads_of(m);
    const auto loss_of = [&] { return double(model_with(adapters).loss(tokens, targets, B, T)); };
    tpcli::testing::check_by_differences(grads, adapters, loss_of, 3, 15);
  }
}

TEST_CASE("LoRA gradients on every data x model mesh equal one device's", "[train][lora]") {
  for (const model::LlamaConfig& c : {small_config(), qwen_like_config(), moe_config()}) {
    const std::string kind = kind_of(c);
    // float sums in another order: the q/k norms' backward adds its own
    const double tolerance = c.qk_norm ? 3e-5 : 1e-5;
    const auto base = model::random_weights(c, 21);
    const auto o = lora_options();
    const auto adapters = random_adapters(c, o, 22);
    const int B = 4, T = 6;
    const auto inputs = random_tokens(B * T, c.vocab_size, 23), targets = random_tokens(B * T, c.vocab_size, 24);

    model::TrainableLlama ref(base, dist::Group(), {}, o);
    ref.load_parameters(adapters);
    ref.zero_grad();
    const float ref_loss = ref.forward_backward(inputs, targets, B, T);
    const auto ref_grads = grads_of(ref);

    for (auto [D, TP] : std::vector<std::pair<int, int>>{{1, 1}, {1, 2}, {2, 1}, {2, 2}, {1, 3}, {2, 3}, {1, 4}}) {
      DYNAMIC_SECTION(kind << " mesh data=" << D << ",model=" << TP) {
        const auto got = adapter_gradients_on_mesh(base, o, adapters, inputs, targets, B, T, D, TP, ref_grads, tolerance);
        for (const auto& f : got.failures) UNSCOPED_INFO(f);
        CHECK(got.failures.empty());
        for (double l : got.losses) CHECK(l == Approx(ref_loss).epsilon(1e-5));
      }
    }
  }
}

namespace {

// A LoRA run on a character corpus from a fixed random base.
train::TrainOptions lora_run(const std::filesystem::path& dir) {
  return tpcli::testing::lora_run_options(small_config(), lora_options(), [&](const model::LlamaConfig& c) {
    const std::string base = (dir / "base.safetensors").string();
    formats::write_safetensors(base, model::random_weights(c, 31));
    return std::make_shared<formats::SafetensorsFile>(base);
  });
}

std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("tpcli_test_lora_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace

TEST_CASE("a LoRA run learns, gives the same losses on meshes 1x1 2x1 1x2 2x2 1x3, and saves only adapters", "[train][lora]") {
  const auto dir = fresh_dir("meshes");
  train::TrainOptions o = lora_run(dir);
  REQUIRE(o.steps == 8);
  const auto reference = same_losses_on_meshes(o, {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {1, 3}}, dir);
  CHECK(reference.back() < reference.front() - 0.1);
  formats::SafetensorsFile ckpt(train::latest_checkpoint((dir / "run11").string()));
  CHECK(ckpt.has("layers.2.wq.lora_a"));
  CHECK(ckpt.has("adam.exp_avg.layers.2.w2.lora_b"));
  CHECK_FALSE(ckpt.has("layers.2.wq"));
  CHECK_FALSE(ckpt.has("layers.0.wq.lora_a"));  // last_layers = 2 of 3
  CHECK(ckpt.metadata().at("lora.rank") == "3");
  // The PEFT folder beside it holds the same adapters.
  const model::LoraAdapterSet peft = formats::load_peft_adapter((dir / "run11" / "adapter").string(), o.model);
  CHECK(peft.rank == 3);
  CHECK(peft.tensors.size() == 2 * 2 * 7);
  for (const auto& [name, t] : peft.tensors) {
    const auto stored = ckpt.get(name);
    CHECK(std::equal(t.span().begin(), t.span().end(), stored.begin(), stored.end()));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("a resumed LoRA run continues the uninterrupted run's losses", "[train][lora]") {
  const auto dir = fresh_dir("resume");
  train::TrainOptions o = lora_run(dir);
  o.mesh = dist::Mesh({{"data", 2}, {"model", 2}});
  o.shard_optimizer = true;  // ZeRO-1 over the adapters' moments
  o.out_dir = (dir / "full").string();
  const auto full = losses_of(train::train(o));
  REQUIRE(full.size() == 8);

  o.out_dir = (dir / "cut").string();
  const auto first = losses_of(tpcli::testing::interrupted_run(o, 3));
  REQUIRE(first.size() == 3);
  o.resume = true;
  const auto tail = losses_of(train::train(o));
  REQUIRE(tail.size() == 5);
  for (size_t i = 0; i < 3; ++i) CHECK(first[i] == full[i]);
  for (size_t i = 0; i < 5; ++i) CHECK(tail[i] == full[i + 3]);
  // Other adapters than the checkpoint's: refused before any device starts, naming the key.
  o.lora->last_layers = 1;
  CHECK_THAT(tpcli::testing::error_of<std::runtime_error>([&] { train::train(o); }),
             Catch::Contains("the checkpoint's adapters have lora.last_layers = 2 but [train.lora] asks for 1"));
  o.lora.reset();
  CHECK_THAT(tpcli::testing::error_of<std::runtime_error>([&] { train::train(o); }),
             Catch::Contains("the checkpoint holds LoRA adapters but the config has no [train.lora]"));
  std::filesystem::remove_all(dir);
}

// Issue 39: kill -9 during a save left adapter.tmp-XXXXXX folders that no later save removed, and
// adapter/ one save behind latest.safetensors (a kill between the two writes). The next save (here
// the resume's rewrite) removes the temporaries, and --resume rewrites adapter/ from the checkpoint.
TEST_CASE("a killed LoRA save's leftovers: --resume rewrites a lagging adapter/ and removes stale temporaries", "[train][lora]") {
  const auto dir = fresh_dir("killed_save");
  train::TrainOptions o = lora_run(dir);
  o.out_dir = (dir / "run").string();
  const std::filesystem::path run(o.out_dir), adapter = run / "adapter";
  REQUIRE(losses_of(tpcli::testing::interrupted_run(o, 3)).size() == 3);
  std::filesystem::copy(adapter, dir / "adapter_step3");
  o.resume = true;
  REQUIRE(losses_of(train::train(o)).size() == 5);  // latest.safetensors and adapter/ at step 8
  // As a kill left them: adapter/ of the save before, and temporaries of killed saves.
  std::filesystem::remove_all(adapter);
  std::filesystem::copy(dir / "adapter_step3", adapter);
  for (const char* stale : {"adapter.tmp-a1b2c3", "adapter.tmp-zzzzzz"}) std::filesystem::copy(dir / "adapter_step3", run / stale);
  std::filesystem::create_directories(run / "adapter.tmp-mine-too");  // not a name of ours: kept

  CHECK(losses_of(train::train(o)).empty());  // resumed at the end: no step, but the files agree again
  const formats::SafetensorsFile ckpt(train::latest_checkpoint(o.out_dir));
  const model::LoraAdapterSet peft = formats::load_peft_adapter(adapter.string(), o.model);
  REQUIRE(peft.tensors.size() == 2 * 2 * 7);
  for (const auto& [name, t] : peft.tensors) {
    const auto stored = ckpt.get(name);
    CHECK(std::equal(t.span().begin(), t.span().end(), stored.begin(), stored.end()));
  }
  CHECK_FALSE(std::filesystem::exists(run / "adapter.tmp-a1b2c3"));
  CHECK_FALSE(std::filesystem::exists(run / "adapter.tmp-zzzzzz"));
  CHECK(std::filesystem::exists(run / "adapter.tmp-mine-too"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("bytes per device with LoRA: the accounting equals what the model and optimizer hold", "[train][lora]") {
  const auto c = small_config();
  const auto weights = model::random_weights(c, 41);
  const auto o = lora_options();
  const int rows = 2, T = 8;
  const auto tokens = random_tokens(rows * T, c.vocab_size, 42);
  for (bool shard : {false, true}) {
    INFO("shard " << shard);
    std::mutex mu;
    std::vector<std::string> failures;
    dist::run_on_mesh(dist::Mesh({{"data", 2}, {"model", 2}}), [&](dist::Device& dev) {
      dist::Group& data = dev.axis("data");
      dist::Group& tp = dev.axis("model");
      model::TrainableLlama llama(weights, tp, {}, o);
      train::ParallelAxes axes{&data, &dev.world(), 2, 2, 2, true};
      train::DataParallelOptimizer optimizer(llama, axes, tp.rank(), {}, shard, 101);
      llama.forward_backward(tokens, tokens, rows, T);
      train::MemoryLayout layout{2, 2, 2, true, rows, T, false, shard, 101, false};
      const train::DeviceBytes base = train::device_bytes(c, layout, tp.rank(), data.rank());
      layout.lora = o;
      const train::DeviceBytes want = train::device_bytes(c, layout, tp.rank(), data.rank());
      int64_t adapters = 0;
      for (auto& p : llama.parameters()) adapters += p.value->numel() * 4;
      std::lock_guard lock(mu);
      const auto expect = [&](bool ok, const std::string& what) {
        if (!ok) failures.push_back("device " + std::to_string(dev.rank()) + ": " + what);
      };
      expect(want.parameters == base.parameters + adapters, "parameters");
      expect(want.gradients == adapters, "gradients");
      expect(want.optimizer == optimizer.moment_bytes(), "optimizer");
      expect(want.optimizer < base.optimizer, "less optimizer state than a full fine-tune");
    });
    for (const auto& f : failures) UNSCOPED_INFO(f);
    CHECK(failures.empty());
  }
}

// Training's adapters (nn/lora.h, in the trainable model) and inference's (nn/quantized_lora.h, in
// model::Llama through PEFT's in-memory set) are two implementations: the same adapter must give
// the same logits, on 1 and 2 tensor devices.
TEST_CASE("a trained adapter gives the inference model's logits with --adapter", "[train][lora]") {
  for (const model::LlamaConfig& c : {small_config(), moe_config()}) {
    INFO(kind_of(c));
    const auto base = model::random_weights(c, 51);
    const auto o = lora_options();
    const auto adapters = random_adapters(c, o, 52);
    const int T = 7;
    const auto tokens = random_tokens(T, c.vocab_size, 53);
    model::LoraAdapterSet set;
    set.rank = o.rank;
    set.alpha = o.alpha;
    for (const auto& m : o.targets) set.targets.push_back(*model::lora_hf_module_of(m));
    for (const auto& spec : model::lora_parameters(c, o))
      set.tensors.emplace(spec.name, tensor::Tensor(spec.shape, adapters.get(spec.name)));
    for (int TP : {1, 2}) {
      std::vector<std::vector<float>> trained(TP), inferred(TP);
      dist::run_on_mesh(dist::Mesh::line(TP), [&](dist::Device& dev) {
        model::TrainableLlama m(base, dev.axis("model"), {}, o);
        m.load_parameters(adapters);
        trained[dev.rank()] = m.forward_logits(tokens, 1, T);  // [T, V]
        model::Llama llama(model::AdaptedWeights(std::make_unique<model::TensorWeights>(base), set, "test"), dev.axis("model"));
        for (int pos = 0; pos < T; ++pos) {
          const auto logits = llama.forward(tokens[static_cast<size_t>(pos)], pos);
          inferred[dev.rank()].insert(inferred[dev.rank()].end(), logits.begin(), logits.end());
        }
      });
      INFO(TP << " devices");
      CHECK(rel_diff(trained[0], inferred[0]) < 1e-5);
      CHECK(rel_diff(trained[TP - 1], inferred[0]) < 1e-5);
    }
  }
}

TEST_CASE("LoRA dropout draws the same masks on every mesh, and only in training passes", "[train][lora]") {
  const auto dir = fresh_dir("dropout");
  train::TrainOptions o = lora_run(dir);
  o.lora->dropout = 0.25;
  o.steps = 4;
  o.eval_every = 4;
  const auto reference = same_losses_on_meshes(o, {{1, 1}, {2, 2}, {1, 3}});
  o.mesh = dist::Mesh({{"data", 1}, {"model", 1}});
  o.lora->dropout = 0;
  const auto plain = losses_of(train::train(o));
  CHECK(plain[0] == reference[0]);  // B = 0 at the start: dropout on the adapters' inputs changes nothing yet
  CHECK(plain.back() != reference.back());
  // Evaluation never drops: the loss of a model with dropout set equals the one without.
  const auto c = small_config();
  const auto w = model::random_weights(c, 61);
  auto with = lora_options();
  with.dropout = 0.5;
  const auto adapters = random_adapters(c, with, 62);
  const auto tokens = random_tokens(12, c.vocab_size, 63);
  model::TrainableLlama a(w, dist::Group(), {}, with), b(w, dist::Group(), {}, lora_options());
  a.load_parameters(adapters);
  b.load_parameters(adapters);
  a.set_dropout_pass(9, 0);
  CHECK(a.loss(tokens, tokens, 2, 6) == b.loss(tokens, tokens, 2, 6));
  std::filesystem::remove_all(dir);
}
