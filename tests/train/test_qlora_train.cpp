// QLoRA (model/trainable_llama.h): LoRA adapters trained on a frozen packed base (8-bit, 4-bit,
// mxfp8, bf16). References: f32 LoRA on the dequantized base (the same function of the same f32
// weight values, so only summation order differs); one device's gradients for every mesh; central
// differences of the loss; an uninterrupted run for a resumed one; the inference model's bytes
// for what the base costs a device.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <vector>

#include "distributed/runtime.h"
#include "formats/dtype.h"
#include "formats/hf_model.h"
#include "formats/safetensors.h"
#include "model/llama.h"
#include "model/packed_weights.h"
#include "model/random_init.h"
#include "model/trainable_llama.h"
#include "model/weights_view.h"
#include "nn/fd_check.h"
#include "support/mlx_quantized_dir.h"
#include "support/shared_data.h"
#include "support/synthetic_text.h"
#include "train/checkpoint.h"
#include "train/loop.h"
#include "train/lora_testing.h"
#include "train/memory.h"
#include "train/quiet_run.h"

using namespace tpcli;
using tensor::WeightFormat;

namespace {

using tpcli::testing::adapter_gradients_on_mesh;
using tpcli::testing::grads_of;
using tpcli::testing::random_adapters;
using tpcli::testing::random_tokens;
using tpcli::testing::losses_of;
using tpcli::testing::same_losses_on_meshes;

// Every matrix's input dimension a multiple of 32, so every one is packed: dim 64 (4 heads of 16
// over 2 KV heads: three devices split the heads 2, 1, 1, share a KV head, and the 1-head devices
// cut wo's groups of 32, holding the whole groups their columns touch), hidden 96 (3 groups of 32).
model::LlamaConfig qlora_config(bool tied = false) {
  return {.dim = 64, .hidden_dim = 96, .n_layers = 3, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 29, .seq_len = 16,
          .shared_classifier = tied};
}

model::LoraOptions lora_options() {
  model::LoraOptions o;
  o.rank = 3;
  o.alpha = 6;
  o.last_layers = 2;  // block 0 stays unadapted: its input gradient still flows through the packed base
  o.seed = 5;
  return o;
}


// The packed source's values as an f32 checkpoint: get() dequantizes.
model::TensorWeights dequantized(const model::WeightSource& packed) {
  model::LlamaConfig c = packed.config();
  c.quantization.reset();
  model::TensorWeights w(c);
  for (const auto& spec : model::llama_parameters(c)) {
    const auto v = packed.get(spec.name);
    w.set(spec.name, tensor::Tensor(spec.shape, std::vector<float>(v.begin(), v.end())));
  }
  return w;
}


double rel_diff(std::span<const float> a, std::span<const float> ref) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - ref[i]));
    scale = std::max(scale, std::abs(static_cast<double>(ref[i])));
  }
  return diff / std::max(scale, 1e-30);
}


}  // namespace

TEST_CASE("QLoRA: a packed base is refused without LoRA, taken with it", "[train][lora][qlora]") {
  const auto f32 = model::random_weights(qlora_config(), 50);
  const model::ConvertedWeights packed(f32, WeightFormat::affine(8, 32));
  std::string error;
  try {
    model::TrainableLlama full(packed, dist::Group());
  } catch (const std::invalid_argument& e) {
    error = e.what();
  }
  CHECK_THAT(error, Catch::Contains("full fine-tuning needs the f32 checkpoint"));
  model::TrainableLlama q(packed, dist::Group(), {}, lora_options());
  CHECK(q.parameters().size() == 2 * 7 * 2);
}

// Tolerance: the dequantized checkpoint holds exactly the f32 values the packed kernels compute
// with, so both models compute the same function; they differ only in the order of f32 sums (the
// packed products go a column block or a lane at a time, sgemm its own way): a few ulp per
// product, 1e-6 relative, compounded over 3 blocks. 1e-4 leaves a wide margin yet catches any
// missing or doubled term (those are O(1) relative).
TEST_CASE("QLoRA adapter gradients equal f32 LoRA's on the dequantized base", "[train][lora][qlora]") {
  const auto o = lora_options();
  const int B = 2, T = 6;
  for (bool tied : {false, true}) {
    const auto c = qlora_config(tied);
    const auto f32 = model::random_weights(c, 51);
    const auto adapters = random_adapters(c, o, 52);
    const auto tokens = random_tokens(B * T, c.vocab_size, 53), targets = random_tokens(B * T, c.vocab_size, 54);
    for (const auto& format : {WeightFormat::affine(8, 32), WeightFormat::affine(4, 32), WeightFormat::mxfp8(),
                               WeightFormat::bf16()}) {
      INFO(format.name() << (tied ? " tied" : ""));
      const model::ConvertedWeights packed(f32, format);
      REQUIRE(model::holds_packed_weights(packed));
      const model::TensorWeights reference_base = dequantized(packed);
      model::TrainableLlama q(packed, dist::Group(), {}, o), ref(reference_base, dist::Group(), {}, o);
      q.load_parameters(adapters);
      ref.load_parameters(adapters);
      q.zero_grad();
      ref.zero_grad();
      const float q_loss = q.forward_backward(tokens, targets, B, T);
      const float ref_loss = ref.forward_backward(tokens, targets, B, T);
      CHECK(q_loss == Approx(ref_loss).epsilon(1e-5));
      const auto qg = grads_of(q), rg = grads_of(ref);
      double worst = 0;
      for (const auto& [name, want] : rg) {
        const double d = rel_diff(qg.at(name), want);
        worst = std::max(worst, d);
        INFO(name);
        CHECK(d <= 1e-4);
      }
      UNSCOPED_INFO("worst relative difference " << worst);
    }
  }
}

TEST_CASE("QLoRA adapter gradients match finite differences of the loss", "[train][lora][qlora][grad]") {
  const auto c = qlora_config();
  const auto f32 = model::random_weights(c, 61);
  const model::ConvertedWeights packed(f32, WeightFormat::affine(4, 32));
  const auto o = lora_options();
  auto adapters = random_adapters(c, o, 62);
  const int B = 2, T = 4;
  const auto tokens = random_tokens(B * T, c.vocab_size, 63), targets = random_tokens(B * T, c.vocab_size, 64);
  model::TrainableLlama m(packed, dist::Group(), {}, o);
  m.load_parameters(adapters);
  m.zero_grad();
  m.forward_backward(tokens, targets, B, T);
  const auto grads = grads_of(m);
  const auto loss_of = [&] {
    m.load_parameters(adapters);
    return double(m.loss(tokens, targets, B, T));
  };
  tpcli::testing::check_by_differences(grads, adapters, loss_of, 2, 65);
}

TEST_CASE("QLoRA gradients on every data x model mesh equal one device's", "[train][lora][qlora]") {
  const auto c = qlora_config();
  const auto f32 = model::random_weights(c, 71);
  const auto o = lora_options();
  const auto adapters = random_adapters(c, o, 72);
  const int B = 4, T = 6;
  const auto inputs = random_tokens(B * T, c.vocab_size, 73), targets = random_tokens(B * T, c.vocab_size, 74);
  for (const auto& format : {WeightFormat::affine(4, 32), WeightFormat::bf16()}) {
    const model::ConvertedWeights packed(f32, format);
    model::TrainableLlama ref(packed, dist::Group(), {}, o);
    ref.load_parameters(adapters);
    ref.zero_grad();
    const float ref_loss = ref.forward_backward(inputs, targets, B, T);
    const auto ref_grads = grads_of(ref);
    for (auto [D, TP] : std::vector<std::pair<int, int>>{{1, 1}, {1, 2}, {2, 1}, {2, 2}, {1, 3}}) {
      DYNAMIC_SECTION(format.name() << " mesh data=" << D << ",model=" << TP) {
        const auto got = adapter_gradients_on_mesh(packed, o, adapters, inputs, targets, B, T, D, TP, ref_grads, 1e-5);
        for (const auto& f : got.failures) UNSCOPED_INFO(f);
        CHECK(got.failures.empty());
        for (double l : got.losses) CHECK(l == Approx(ref_loss).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("QLoRA with recompute gives the same gradients bit for bit", "[train][lora][qlora]") {
  const auto c = qlora_config();
  const auto f32 = model::random_weights(c, 75);
  const model::ConvertedWeights packed(f32, WeightFormat::affine(4, 32));
  const auto o = lora_options();
  const auto adapters = random_adapters(c, o, 76);
  const int B = 2, T = 6;
  const auto tokens = random_tokens(B * T, c.vocab_size, 77), targets = random_tokens(B * T, c.vocab_size, 78);
  std::vector<std::map<std::string, std::vector<float>>> grads;
  std::vector<int64_t> peaks;
  for (bool recompute : {false, true}) {
    model::TrainableLlama m(packed, dist::Group(), {}, o);
    m.load_parameters(adapters);
    m.set_recompute(recompute);
    m.zero_grad();
    m.forward_backward(tokens, targets, B, T);
    grads.push_back(grads_of(m));
    peaks.push_back(m.peak_activation_bytes());
  }
  CHECK(grads[0] == grads[1]);
  CHECK(peaks[1] < peaks[0]);
}

namespace {

std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("tpcli_test_qlora_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A QLoRA run on a character corpus from a fixed random base, saved 8-bit (as `tpcli quantize` writes it).
train::TrainOptions qlora_run(const std::filesystem::path& dir) {
  return tpcli::testing::lora_run_options(qlora_config(), lora_options(), [&](const model::LlamaConfig& c) {
    const std::string base = (dir / "base-q8.safetensors").string();
    formats::write_safetensors(base, model::ConvertedWeights(model::random_weights(c, 31), WeightFormat::affine(8, 32)));
    auto packed = std::make_shared<formats::SafetensorsFile>(base);
    REQUIRE(model::holds_packed_weights(*packed));
    return packed;
  });
}

// qlora_run's options without checkpoints, `steps` long, on a data=D x model=TP mesh.
train::TrainOptions short_run(const std::filesystem::path& dir, int steps, int D, int TP) {
  train::TrainOptions o = qlora_run(dir);
  o.out_dir.clear();
  o.steps = steps;
  o.schedule.total_steps = steps;
  o.mesh = dist::Mesh({{"data", D}, {"model", TP}});
  return o;
}

}  // namespace

TEST_CASE("a QLoRA run on an 8-bit base learns, gives the same losses on 1x1 and 1x2, saves only adapters", "[train][lora][qlora]") {
  const auto dir = fresh_dir("run");
  train::TrainOptions o = qlora_run(dir);
  REQUIRE(o.steps == 8);
  const auto reference = same_losses_on_meshes(o, {{1, 1}, {1, 2}, {2, 1}}, dir);
  CHECK(reference.back() < reference.front() - 0.1);
  formats::SafetensorsFile ckpt(train::latest_checkpoint((dir / "run11").string()));
  CHECK(ckpt.has("layers.2.wq.lora_a"));
  CHECK_FALSE(ckpt.has("layers.2.wq"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a QLoRA run with LoRA dropout gives the same losses on meshes 1x1 1x3 2x1", "[train][lora][qlora]") {
  const auto dir = fresh_dir("dropout");
  train::TrainOptions o = qlora_run(dir);
  o.lora->dropout = 0.2;
  o.steps = 4;
  o.schedule.total_steps = 4;
  same_losses_on_meshes(o, {{1, 1}, {1, 3}, {2, 1}}, dir);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a resumed QLoRA run continues the uninterrupted run's losses bit for bit", "[train][lora][qlora]") {
  const auto dir = fresh_dir("resume");
  train::TrainOptions o = qlora_run(dir);
  o.mesh = dist::Mesh({{"data", 2}, {"model", 2}});
  o.shard_optimizer = true;
  o.out_dir = (dir / "full").string();
  const auto full = losses_of(train::train(o));
  REQUIRE(full.size() == 8);
  std::atomic<bool> stop{false};
  o.out_dir = (dir / "cut").string();
  o.run.stop = &stop;
  o.on_step = [&](int64_t step, double) {
    if (step == 2) stop = true;
  };
  const auto first = losses_of(train::train(o));
  REQUIRE(first.size() == 3);
  stop = false;
  o.on_step = nullptr;
  o.resume = true;
  const auto tail = losses_of(train::train(o));
  REQUIRE(tail.size() == 5);
  for (size_t i = 0; i < 3; ++i) CHECK(first[i] == full[i]);
  for (size_t i = 0; i < 5; ++i) CHECK(tail[i] == full[i + 3]);
  std::filesystem::remove_all(dir);
}

// A stories15M-shaped model (dim 288, 6 layers, vocab 32000): the frozen base a device holds is
// the packed bytes, exactly what the inference model holds on that device.
TEST_CASE("QLoRA: a device holds the base packed, as the inference model does", "[train][lora][qlora][memory]") {
  const model::LlamaConfig c{.dim = 288, .hidden_dim = 768, .n_layers = 6, .n_heads = 6, .n_kv_heads = 6,
                             .vocab_size = 32000, .seq_len = 256, .shared_classifier = true};
  const auto f32 = model::random_weights(c, 81);
  model::LoraOptions o;  // rank 8 on every linear of every block
  std::map<std::string, std::vector<int64_t>> held;  // format -> [TP=1 device 0, TP=2 device 0, TP=2 device 1]
  for (const auto& format : {WeightFormat::f32(), WeightFormat::affine(8, 32), WeightFormat::affine(4, 32)}) {
    std::unique_ptr<model::ConvertedWeights> packed;
    if (format.quantized()) packed = std::make_unique<model::ConvertedWeights>(f32, format);
    const model::WeightSource& w = packed ? static_cast<const model::WeightSource&>(*packed) : f32;
    for (int TP : {1, 2}) {
      std::mutex mu;
      std::vector<std::string> failures;
      std::vector<int64_t> frozen(static_cast<size_t>(TP)), adapters(static_cast<size_t>(TP));
      dist::run_on_mesh(dist::Mesh::line(TP), [&](dist::Device& dev) {
        model::TrainableLlama trainable(w, dev.axis("model"), {}, o);
        const int64_t inference = model::Llama(w, dev.axis("model")).parameter_bytes();
        std::lock_guard lock(mu);
        frozen[static_cast<size_t>(dev.rank())] = trainable.frozen_bytes();
        adapters[static_cast<size_t>(dev.rank())] = trainable.parameter_bytes();
        if (packed && trainable.frozen_bytes() != inference)
          failures.push_back(format.name() + " TP " + std::to_string(TP) + " device " + std::to_string(dev.rank()) +
                             ": frozen " + std::to_string(trainable.frozen_bytes()) + ", inference " + std::to_string(inference));
      });
      for (const auto& f : failures) UNSCOPED_INFO(f);
      CHECK(failures.empty());
      for (int r = 0; r < TP; ++r) held[format.name()].push_back(frozen[static_cast<size_t>(r)]);
    }
  }
  // 8-bit: a byte per weight plus an f32 scale and bias per 32: 1.25 bytes against f32's 4; 4-bit
  // 0.75. (On 3 devices the one-head devices' 16 columns of wo cut its groups: they hold the group
  // their columns touch, as the inference model does.)
  const double f = static_cast<double>(held["f32"][0]);
  CHECK(held["affine 8-bit g32"][0] / f == Approx(1.25 / 4).epsilon(0.01));
  CHECK(held["affine 4-bit g32"][0] / f == Approx(0.75 / 4).epsilon(0.01));
  for (size_t i = 1; i < 3; ++i) CHECK(held["affine 4-bit g32"][i] < held["affine 8-bit g32"][i]);
}

TEST_CASE("QLoRA: train::device_bytes counts the packed base as the model holds it", "[train][lora][qlora][memory]") {
  const auto c = qlora_config();
  const auto f32 = model::random_weights(c, 91);
  const auto o = lora_options();
  for (const auto& format : {WeightFormat::affine(8, 32), WeightFormat::affine(4, 32), WeightFormat::bf16()}) {
    const model::ConvertedWeights packed(f32, format);
    for (int TP : {1, 2, 3}) {  // 3: devices of one head cut wo's groups and hold the groups they touch
      std::mutex mu;
      std::vector<std::string> failures;
      dist::run_on_mesh(dist::Mesh::line(TP), [&](dist::Device& dev) {
        model::TrainableLlama m(packed, dev.axis("model"), {}, o);
        train::MemoryLayout layout;
        layout.tensor = TP;
        layout.lora = o;
        layout.packed_base = format;
        const train::DeviceBytes want = train::device_bytes(c, layout, dev.rank());
        const int64_t held = m.frozen_bytes() + m.parameter_bytes();
        std::lock_guard lock(mu);
        if (want.parameters != held)
          failures.push_back(format.name() + " TP " + std::to_string(TP) + " device " + std::to_string(dev.rank()) +
                             ": counted " + std::to_string(want.parameters) + ", held " + std::to_string(held));
      });
      for (const auto& f : failures) UNSCOPED_INFO(f);
      CHECK(failures.empty());
    }
  }
}

namespace {

// The stored bytes of `name` in `w` (words, scales, biases or 16-bit values), for comparing two files.
std::vector<std::byte> stored_bytes_of(const model::WeightSource& w, const std::string& name) {
  const auto t = w.stored(name);
  if (!t) return {};
  const auto* p = static_cast<const std::byte*>(t->data);
  return {p, p + tensor::numel(t->shape) * static_cast<int64_t>(formats::dtype_bytes(t->dtype))};
}

// The tensors of two sources that differ: a matrix's stored bytes (the Hugging Face directory's
// q/k rows read back in tpcli's order, its f32 scales and biases as tpcli's quantizer made them),
// a norm's f32 values (a bf16 directory stores them 16-bit, a tpcli checkpoint f32).
std::vector<std::string> differing_tensors(const model::WeightSource& a, const model::WeightSource& b) {
  std::vector<std::string> differ;
  for (const auto& spec : model::llama_parameters(a.config())) {
    if (spec.shape.size() == 1) {
      const auto va = a.get(spec.name), vb = b.get(spec.name);
      if (!std::equal(va.begin(), va.end(), vb.begin(), vb.end())) differ.push_back(spec.name);
      continue;
    }
    for (const std::string suffix : {"", ".scales", ".biases"})
      if (stored_bytes_of(a, spec.name + suffix) != stored_bytes_of(b, spec.name + suffix)) differ.push_back(spec.name + suffix);
  }
  return differ;
}

// What each device of a TP-device model holds as a trainable model: its frozen base's bytes and its adapters'.
struct HeldBytes {
  std::vector<int64_t> frozen, adapters;  // [TP]
};

HeldBytes trainable_bytes_on(const model::WeightSource& w, int TP, const model::LoraOptions& o) {
  HeldBytes held{std::vector<int64_t>(static_cast<size_t>(TP)), std::vector<int64_t>(static_cast<size_t>(TP))};
  dist::run_on_mesh(dist::Mesh::line(TP), [&](dist::Device& dev) {
    const model::TrainableLlama m(w, dev.axis("model"), {}, o);
    held.frozen[static_cast<size_t>(dev.rank())] = m.frozen_bytes();
    held.adapters[static_cast<size_t>(dev.rank())] = m.parameter_bytes();
  });
  return held;
}

// What each device of a TP-device inference model holds.
std::vector<int64_t> inference_bytes_on(const model::WeightSource& w, int TP) {
  std::vector<int64_t> bytes(static_cast<size_t>(TP));
  dist::run_on_mesh(dist::Mesh::line(TP), [&](dist::Device& dev) {
    bytes[static_cast<size_t>(dev.rank())] = model::Llama(w, dev.axis("model")).parameter_bytes();
  });
  return bytes;
}

}  // namespace

// `[model] init_from = DIR` with [train.lora]: the directory is read as stored (cli/train_setup.cpp).
// An MLX-quantized one, affine or mxfp8 (written from the f32 base's Hugging Face export by the
// independent quantizer of tests/support/mlx_quantized_dir.h, in f32 as MLX quantizes an f32
// model), and a bf16 one hold the same values as the base quantized (stored 16-bit) by tpcli, so
// the runs from them must be the same run, bit for bit, with the base packed on every device.
TEST_CASE("QLoRA from a Hugging Face directory (MLX 4-bit, 8-bit and mxfp8, bf16) keeps the base packed and trains as from tpcli's packed checkpoint",
          "[train][lora][qlora][hf]") {
  const auto dir = fresh_dir("hf");
  train::TrainOptions o = qlora_run(dir);
  o.out_dir.clear();
  const model::TensorWeights f32 = model::random_weights(o.model, 31);  // qlora_run's base
  formats::write_hf_model((dir / "hf-f32").string(), f32, {.dtype = model::DType::F32});
  const auto f32_bytes = trainable_bytes_on(f32, 2, *o.lora).frozen;
  for (const auto& [name, format] : std::vector<std::pair<std::string, WeightFormat>>{
           {"mlx-4bit", WeightFormat::affine(4, 32)},
           {"mlx-8bit", WeightFormat::affine(8, 32)},
           {"mlx-mxfp8", WeightFormat::mxfp8()},
           {"bf16", WeightFormat::bf16()}}) {
    DYNAMIC_SECTION(name) {
      const auto hf_dir = dir / name;
      if (format.quantized())
        tpcli::testing::write_mlx_dir(dir / "hf-f32", hf_dir, format.bits, format.group_size, model::DType::F32,
                                      format.kind == tensor::WeightKind::Mxfp8 ? "mxfp8" : "affine");
      else
        formats::write_hf_model(hf_dir.string(), f32, {.dtype = model::DType::BF16});
      const std::string tpcli_file = (dir / (name + ".safetensors")).string();
      formats::write_safetensors(tpcli_file, model::ConvertedWeights(f32, format));
      const auto from_hf = std::make_shared<formats::HfModelDir>(hf_dir.string());
      const auto from_file = std::make_shared<formats::SafetensorsFile>(tpcli_file);
      REQUIRE(model::holds_packed_weights(*from_hf));
      const auto differ = differing_tensors(*from_hf, *from_file);
      for (const auto& d : differ) UNSCOPED_INFO("stored differently: " << d);
      REQUIRE(differ.empty());

      // Each of 2 devices holds the base as the inference model holds the packed checkpoint, not in f32.
      const auto held = trainable_bytes_on(*from_hf, 2, *o.lora).frozen;
      CHECK(held == trainable_bytes_on(*from_file, 2, *o.lora).frozen);
      CHECK(held == inference_bytes_on(*from_file, 2));
      // At most 2 bytes a weight (bf16) against f32's 4, beside the f32 norms.
      for (size_t r = 0; r < held.size(); ++r) CHECK(held[r] * 4 / 3 < f32_bytes[r]);
      o.init = from_hf;
      const train::DeviceBytes counted = train::run_device_bytes(o);
      o.init = from_file;
      CHECK(counted.parameters == train::run_device_bytes(o).parameters);

      std::vector<std::vector<double>> losses;
      for (const auto& init : std::vector<std::shared_ptr<const model::WeightSource>>{from_file, from_hf}) {
        o.init = init;
        o.mesh = dist::Mesh({{"data", 1}, {"model", 2}});
        losses.push_back(losses_of(train::train(o)));
      }
      REQUIRE(losses[0].size() == 8);
      CHECK(losses[1] == losses[0]);
      CHECK(losses[1].back() < losses[1].front() - 0.1);
    }
  }
  std::filesystem::remove_all(dir);
}

// An mlx-community directory as `mlx_lm.convert -q` writes it from a bf16 model: 4-bit groups of
// 64, bf16 scales and biases, and w2 (96 inputs, not a multiple of 64) left in bf16 beside the
// packed matrices. The trainable model holds what the inference model holds, the memory line
// counts it, and the adapters learn.
TEST_CASE("QLoRA from an mlx-community directory (bf16 scales, groups of 64, an unquantized w2) holds what inference holds and learns",
          "[train][lora][qlora][hf]") {
  const auto dir = fresh_dir("hf-mlx-community");
  train::TrainOptions o = qlora_run(dir);
  o.out_dir.clear();
  formats::write_hf_model((dir / "hf-f32").string(), model::random_weights(o.model, 31), {.dtype = model::DType::F32});
  tpcli::testing::write_mlx_dir(dir / "hf-f32", dir / "mlx", 4, 64, model::DType::BF16);
  const auto mlx = std::make_shared<formats::HfModelDir>((dir / "mlx").string());
  REQUIRE(mlx->stored("layers.0.w2")->dtype == model::DType::BF16);
  REQUIRE(mlx->stored("layers.0.w1")->dtype == model::DType::U32);
  for (int TP : {1, 2}) {
    INFO(TP << " devices");
    const HeldBytes held = trainable_bytes_on(*mlx, TP, *o.lora);
    CHECK(held.frozen == inference_bytes_on(*mlx, TP));
    o.init = mlx;
    o.mesh = dist::Mesh({{"data", 1}, {"model", TP}});
    CHECK(train::run_device_bytes(o).parameters == held.frozen[0] + held.adapters[0]);
  }
  o.mesh = dist::Mesh({{"data", 1}, {"model", 2}});
  const auto losses = losses_of(train::train(o));
  REQUIRE(losses.size() == 8);
  CHECK(losses.back() < losses.front() - 0.1);
  std::filesystem::remove_all(dir);
}

namespace {

// A source that counts release_conversions() and the reads after it (devices are threads: atomics).
class ReleaseRecorder : public model::WeightSource {
 public:
  explicit ReleaseRecorder(std::shared_ptr<const model::WeightSource> inner) : inner_(std::move(inner)) {}
  const model::LlamaConfig& config() const override { return inner_->config(); }
  std::span<const float> get(const std::string& name) const override {
    reads_after_release_ += releases_ > 0;
    return inner_->get(name);
  }
  std::optional<model::StoredTensor> stored(const std::string& name) const override {
    reads_after_release_ += releases_ > 0;
    return inner_->stored(name);
  }
  std::optional<model::Quantization> quantization_of(const std::string& name) const override { return inner_->quantization_of(name); }
  void release_conversions() const override {
    ++releases_;
    inner_->release_conversions();
  }
  void release_pages(const std::string& name) const override { inner_->release_pages(name); }
  void release_all_pages() const override { inner_->release_all_pages(); }
  int releases() const { return releases_; }
  int reads_after_release() const { return reads_after_release_; }

 private:
  std::shared_ptr<const model::WeightSource> inner_;
  mutable std::atomic<int> releases_{0}, reads_after_release_{0};
};

}  // namespace

// A Hugging Face directory converts what is not stored as the model holds it (16-bit weights for
// full fine-tuning, norms, reordered q/k rows) and keeps the copies until released: a run
// releases them once every device has built its model, and reads the source no more.
TEST_CASE("a run frees its source's conversions once every device has built its model", "[train][lora][qlora][hf][memory]") {
  const auto dir = fresh_dir("release");
  train::TrainOptions o = short_run(dir, 2, 2, 2);
  o.progress = true;  // its memory line reads the base's stored formats too
  formats::write_hf_model((dir / "hf-bf16").string(), model::random_weights(o.model, 31), {.dtype = model::DType::BF16});
  for (bool lora : {true, false}) {
    INFO((lora ? "QLoRA" : "full fine-tuning"));
    auto hf = std::make_shared<model::WeightsView>(std::make_unique<formats::HfModelDir>((dir / "hf-bf16").string()));
    if (!lora) hf->as_f32();  // as cli/train_setup.cpp opens it
    const auto recorder = std::make_shared<ReleaseRecorder>(hf);
    o.init = recorder;
    if (!lora) o.lora.reset();
    REQUIRE(losses_of(train::train(o)).size() == 2);
    CHECK(recorder->releases() == 1);
    CHECK(recorder->reads_after_release() == 0);
  }
  std::filesystem::remove_all(dir);
}

// Qwen3's bf16 reference directory (q/k norms, tied, head_dim 32 beside hidden 64) under LoRA:
// held 16-bit, it trains as LoRA on the same values in f32 (the directory read as f32), up to the
// order of f32 sums.
TEST_CASE("QLoRA on a bf16 Qwen3 directory (q/k norms) gives LoRA's losses on its f32 values", "[train][lora][qlora][hf]") {
  tpcli::testing::require_shared("reference/hf-archs/qwen3-bf16");
  const std::string qwen3 = tpcli::testing::shared_path("reference/hf-archs/qwen3-bf16");
  const auto dir = fresh_dir("qwen3");
  train::TrainOptions o = short_run(dir, 4, 1, 2);
  auto as_f32 = std::make_shared<model::WeightsView>(std::make_unique<formats::HfModelDir>(qwen3));
  as_f32->as_f32();
  const auto packed = std::make_shared<formats::HfModelDir>(qwen3);
  const auto held = trainable_bytes_on(*packed, 2, *o.lora).frozen;
  CHECK(held == inference_bytes_on(*packed, 2));
  CHECK(held[0] * 3 / 2 < trainable_bytes_on(*as_f32, 2, *o.lora).frozen[0]);
  std::vector<std::vector<double>> losses;
  for (const auto& base : std::vector<std::shared_ptr<const model::WeightSource>>{packed, as_f32}) {
    o.init = base;
    o.model = base->config();
    losses.push_back(losses_of(train::train(o)));
  }
  REQUIRE(losses[0].size() == 4);
  for (size_t i = 0; i < 4; ++i) CHECK(losses[0][i] == Approx(losses[1][i]).epsilon(1e-5));
  std::filesystem::remove_all(dir);
}
