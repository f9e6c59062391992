// tpcli inspect FILE — says what a file is and what it holds: a run config (validated, with its
// mesh, model dims and parameter count) or a models/*.toml file. Checkpoint formats plug in
// through register_inspector (cli/inspect.h).
#include "cli/inspect.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/model_file.h"
#include "config/model_config.h"
#include "cli/plan_report.h"
#include "config/train_setup.h"
#include "model/llama_config.h"
#include "model/packed_weights.h"
#include "model/shard_plan.h"
#include "perf/measure_rates.h"
#include "train/data.h"
#include "train/memory.h"
#include "train/step_plan.h"

namespace tpcli::cli {

namespace {

std::vector<Inspector>& inspector_list() {
  static std::vector<Inspector> list;
  return list;
}

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

void describe_model(const model::LlamaConfig& c, std::ostream& out) {
  out << "  model      dim " << c.dim << ", hidden_dim " << c.hidden_dim << ", " << c.n_layers << " layers, " << c.n_heads
      << " heads (" << c.n_kv_heads << " kv, head size " << c.head_size() << "), vocab " << c.vocab_size << ", seq_len "
      << c.seq_len << (c.shared_classifier ? ", shared classifier" : ", separate classifier") << "\n";
  if (c.is_moe())
    out << "  experts    " << c.n_experts << " experts, top_k " << c.top_k << ", expert_hidden_dim "
        << (c.expert_hidden_dim ? c.expert_hidden_dim : c.hidden_dim) << ", aux loss " << number(c.moe_aux_loss)
        << (c.capacity_factor ? ", capacity factor " + number(*c.capacity_factor) : std::string()) << "\n";
  out << "  parameters " << with_commas(c.parameter_count()) << "\n";
}

// How the tensor axis splits the model: "heads 2,2,1,1 · kv heads 1,1,1,1 · ffn rows 43,43,43,43".
void describe_shards(const model::LlamaConfig& c, int devices, std::ostream& out) {
  if (devices <= 1) return;
  std::string heads, kv, ffn, vocab;
  for (const auto& plan : model::plan_all_shards(c, devices)) {
    const char* sep = heads.empty() ? "" : ",";
    heads += sep + std::to_string(plan.heads.count);
    kv += sep + std::to_string(plan.kv_heads.count);
    ffn += sep + std::to_string(c.is_moe() ? plan.expert_ffn.count : plan.ffn.count);
    vocab += sep + std::to_string(plan.vocab.count);
  }
  out << "  per tensor device: heads " << heads << "; kv heads " << kv << (c.is_moe() ? "; expert ffn rows " : "; ffn rows ")
      << ffn << "; vocab rows " << vocab << "\n";
}

void describe_model_file(const std::string& path, std::ostream& out) {
  const config::ModelSection section = config::load_model_config(path);
  out << path << ": model config\n";
  if (!section.vocab_size) {
    out << "  (vocab_size not set: it comes from the run's tokenizer)\n";
    describe_model(config::model_from_config(section, 256), out);
    out << "  (parameter count shown for vocab_size = 256)\n";
  } else {
    describe_model(config::model_from_config(section), out);
  }
}

// The vocabulary the run's tokenizer will have, when it does not depend on the model: 256 for
// bytes, the corpus's distinct characters for chars (read with the trainer's own tokenizer).
std::optional<int> corpus_vocab_size(const config::DataSection& data) {
  if (data.tokenizer == config::TokenizerKind::Bytes) return 256;
  if (data.tokenizer == config::TokenizerKind::Chars && data.path && data.format == config::DataFormat::Text)
    return train::TextTokenizer::chars(train::read_text_file(*data.path)).vocab_size();
  return std::nullopt;
}

// The bytes `tpcli train` prints at start for the same config and mesh (train/memory.h): the
// options prepare_training gives the run, without reading its corpus or weights.
train::MemoryLayout memory_layout(const config::RunConfig& config, const model::LlamaConfig& c) {
  train::TrainOptions options;
  options.model = c;
  config::set_config_fields(config, options);
  return train::memory_layout(options);
}

void describe_memory(const config::RunConfig& config, const model::LlamaConfig& c, std::ostream& out) {
  const config::TrainSection& t = config.train;
  const train::MemoryLayout layout = memory_layout(config, c);
  out << "  memory per device (device 0): " << train::describe(train::device_bytes(c, layout))
      << (t.recompute ? " (recompute)" : "") << (t.shard_optimizer ? " (optimizer sharded)" : "")
      << (layout.sequence_parallel ? " (sequence parallel)" : "") << "\n";
}

// The rates predictions use: measured now (every device at once), with --matmul-gflops for every matmul.
// A checkpoint's matrices (decode) are measured through the model's matvec kernels at their shapes.
perf::WorkRates work_rates(const std::vector<model::PlannedWork>& work, const std::vector<model::PlannedCollective>& comm,
                           double given_gflops, const perf::PlanMesh& mesh, std::ostream& out,
                           const model::WeightSource* weights = nullptr, int64_t weight_bytes = 0) {
  const int devices = mesh.devices();
  perf::WorkRates rates = perf::measure_work_rates(work, comm, mesh, 0, given_gflops);
  if (weights) rates.weight_bytes_per_s = perf::measure_weight_rates(work, *weights, devices, 0, weight_bytes);
  out << "  work (rates measured now with " << devices << " device(s) at once"
      << (given_gflops > 0 ? ", matmuls at --matmul-gflops" : "; --matmul-gflops to give the matmul rate") << "):\n";
  print_work(work, rates, out);
  return rates;
}

// What a MoE checkpoint's decode moves that the dense plan does not: routing is data-dependent,
// so the all_to_all_v bytes are an upper bound (every chosen expert on another member).
void describe_moe_decode_traffic(const model::LlamaConfig& c, int expert_devices, std::ostream& out) {
  int moe_blocks = 0;
  for (int l = 0; l < c.n_layers; ++l) moe_blocks += c.is_moe_layer(l);
  if (expert_devices <= 1) {
    out << "  collectives: MoE blocks' experts are split inside each expert over the tensor axis (no expert axis): "
           "not planned here (the dense plan's, with all_to_all_v of data-dependent size)\n";
    return;
  }
  const double row = 4.0 * c.dim, per_block = 2.0 * c.top_k * row;  // dispatch + combine of top_k rows
  char line[512];
  std::snprintf(line, sizeof line,
                "  MoE per decoded token, over 'expert' (%d devices): all_to_all_v moves at most %.1f KB per MoE block "
                "(dispatch and combine of top_k = %d rows of %d floats), then an all_gather re-mirrors the row (%.1f KB); "
                "%d MoE blocks: at most %.1f KB per token\n",
                expert_devices, per_block / 1e3, c.top_k, c.dim, row / 1e3, moe_blocks, moe_blocks * (per_block + row) / 1e3);
  out << line;
}

// Sharding, collectives per optimizer step and the predicted step time of a run config.
void describe_training_plan(const config::RunConfig& config, const model::LlamaConfig& c, double gflops,
                            std::ostream& out) {
  const config::MeshSection& ms = config.mesh;
  perf::PlanMesh mesh{ms.tensor_axis, ms.data_axis, ms.axis_size(ms.tensor_axis), ms.axis_size(ms.data_axis),
                      ms.links};
  print_sharding(c, mesh, ms.experts_axis(), [](const model::ParamSpec&) { return std::string("f32"); }, out);
  if (c.is_moe()) {
    out << "  collectives: not planned for MoE models (all_to_all_v moves data-dependent amounts)\n";
    return;
  }
  const train::MemoryLayout layout = memory_layout(config, c);
  if (layout.sequence_parallel && layout.tensor > 1) {
    out << "  collectives: not planned with sequence_parallel yet (its collective matmuls' ppermutes)\n";
    return;
  }
  const int K = config.train.grad_accum;
  const auto plan = train::plan_step_collectives(c, layout, K);
  out << "  collectives per training step, device 0 (" << K << " micro-batch(es) of " << layout.rows << " x "
      << layout.seq_len << " tokens):\n";
  print_collectives(plan, mesh, out);
  const auto work = train::plan_step_work(c, layout, K);
  const perf::WorkRates rates = work_rates(work, plan, gflops, mesh, out);
  out << "  step time: " << describe(perf::predict(work, plan, mesh, rates, config.train.overlap_buckets, K))
      << (mesh.links.empty() ? " (links unmodelled: collectives as measured on the threads backend)" : "") << "\n";
}

void describe_run_config(const config::RunConfig& config, double gflops, std::ostream& out) {
  const config::MeshSection& m = config.mesh;
  out << config.path << ": run config\n";
  out << "  mesh       " << (m.axes.empty() ? "(none: 1 device)" : m.axes_string()) << ", " << m.device_count()
      << " device(s), " << config::to_string(m.backend) << " backend\n";
  out << "  roles      data axis '" << m.data_axis << "' = " << m.axis_size(m.data_axis) << ", tensor axis '"
      << m.tensor_axis << "' = " << m.axis_size(m.tensor_axis) << ", expert axis '" << m.experts_axis()
      << "' = " << m.axis_size(m.experts_axis()) << "\n";
  if (config.model.config) out << "  model file " << *config.model.config << "\n";
  if (config.model.init_from) out << "  init from  " << *config.model.init_from << "\n";
  if (config.model.dim) {
    const std::optional<int> tokenizer_vocab = corpus_vocab_size(config.data);
    const bool vocab_known = config.model.vocab_size || tokenizer_vocab;
    const model::LlamaConfig c = config::model_from_config(config.model, vocab_known ? tokenizer_vocab : 256);
    config::check_model_fits_mesh(config, c);
    describe_model(c, out);
    if (!vocab_known) out << "  (vocab_size comes from the tokenizer; parameters counted with vocab_size = 256)\n";
    describe_shards(c, m.axis_size(m.tensor_axis), out);
    describe_memory(config, c, out);
  }
  const config::DataSection& d = config.data;
  const std::string examples = d.format == config::DataFormat::Chat          ? "chat examples "
                               : d.format == config::DataFormat::Completions ? "completions examples "
                               : d.format == config::DataFormat::JsonlText   ? "jsonl-text examples "
                                                                             : "";
  out << "  data       " << (d.format == config::DataFormat::Shards ? "token shards " : examples)
      << (d.path ? *d.path : "(no corpus)") << (d.val_path ? " (validation " + *d.val_path + ")" : "") << ", tokenizer "
      << (d.tokenizer == config::TokenizerKind::File ? d.tokenizer_path : config::to_string(d.tokenizer))
      << (d.shuffle ? ", shuffled" : ", replayable order (shuffle = false)") << "\n";
  const config::TrainSection& t = config.train;
  out << "  train      " << t.steps << " steps, batch " << t.batch_size << " x seq_len "
      << (t.seq_len ? std::to_string(*t.seq_len) : "(model's)") << ", seed " << t.seed << "\n";
  out << "  optimizer  AdamW lr " << number(t.lr) << " -> " << number(t.min_lr) << " (" << config::to_string(t.decay)
      << ", warm-up " << t.warmup_steps << "), weight decay " << number(t.weight_decay) << ", betas (" << number(t.beta1)
      << ", " << number(t.beta2) << "), eps " << number(t.eps) << ", grad clip "
      << (t.grad_clip > 0 ? number(t.grad_clip) : "off") << (t.grad_accum > 1 ? ", grad_accum " + std::to_string(t.grad_accum) : "")
      << (t.shard_optimizer ? ", state sharded over the data axis" : "") << "\n";
  if (t.lora) {
    std::string targets;
    for (const std::string& m : t.lora->targets) targets += (targets.empty() ? "" : ", ") + m;
    out << "  lora       rank " << t.lora->rank << ", alpha " << number(t.lora->alpha) << ", dropout "
        << number(t.lora->dropout) << " on " << targets << " of "
        << (t.lora->layers == 0 ? std::string("every block") : "the last " + std::to_string(t.lora->layers) + " blocks")
        << " (the base frozen)\n";
  }
  out << "  output     " << t.out_dir << " (eval every " << t.eval_every << " steps x " << t.eval_batches
      << " batches, log every " << t.log_every << ", sample " << t.sample_tokens << " tokens)\n";
  if (config.model.dim) {
    const std::optional<int> tokenizer_vocab = corpus_vocab_size(config.data);
    const bool vocab_known = config.model.vocab_size || tokenizer_vocab;
    describe_training_plan(config, config::model_from_config(config.model, vocab_known ? tokenizer_vocab : 256), gflops, out);
  }
}

// "f32", "bf16", "q4g64" (MLX affine 4-bit, groups of 64), "mxfp8": how a checkpoint stores a tensor.
std::string stored_dtype(const model::WeightSource& w, const model::ParamSpec& spec) {
  const std::optional<model::StoredTensor> t = w.stored(spec.name);
  if (!t) return "f32";
  switch (t->dtype) {
    case model::DType::F32: return "f32";
    case model::DType::F16: return "f16";
    case model::DType::BF16: return "bf16";
    case model::DType::U32:
    case model::DType::U8: {
      const auto& q = w.config().quantization;
      if (!q) return t->dtype == model::DType::U32 ? "u32" : "u8";
      if (q->mode == "mxfp8") return "mxfp8";
      return "q" + std::to_string(q->bits) + "g" + std::to_string(q->group_size);
    }
  }
  return "?";
}

// A checkpoint on the tensor axis of --devices / --mesh: sharding, bytes per device, the
// collectives of one decoded token and the predicted time per token.
void describe_decode_plan(const std::string& path, const RunFlags& flags, double gflops, std::ostream& out) {
  const dist::Mesh mesh = mesh_from_flags(flags);
  const OpenedModel opened = open_model(path);
  const model::Placement placement = place_model(opened, path, mesh);
  const model::WeightSource& w = *opened.weights;
  const model::LlamaConfig& c = w.config();
  const model::AxisRoles& roles = placement.roles();
  perf::PlanMesh pm{roles.tensor, "data", placement.tensor_devices(), mesh.axis_size("data"), links_from_flags(flags)};
  out << "plan on " << mesh.to_string() << " (decode: the tensor axis '" << roles.tensor << "' splits the model";
  out << (pm.data > 1 ? "; each 'data' replica decodes its own sequences)\n" : ")\n");
  const std::string expert_axis = mesh.has_axis(roles.expert) ? roles.expert : "";  // as infer deals a MoE's experts
  print_sharding(c, pm, expert_axis, [&](const model::ParamSpec& spec) { return stored_dtype(w, spec); }, out);
  out << "  (quantized tensors show their logical shape: q4g64 = MLX affine 4-bit in groups of 64, stored as u32 words"
         " with per-group scales and biases; mxfp8 = 8-bit floats with a shared exponent per 32)\n";
  const model::ShardPlan& plan = placement.plans().front();
  const int64_t kv = 2 * int64_t{c.n_layers} * c.seq_len * plan.kv_rows().count * static_cast<int64_t>(sizeof(float));
  char line[160];
  std::snprintf(line, sizeof line, "  bytes per device (device 0): weights %.2f MB, KV cache %.2f MB (f32, %d positions)\n",
                static_cast<double>(model::shard_bytes(w, plan)) / 1e6, static_cast<double>(kv) / 1e6, c.seq_len);
  out << line;
  if (c.is_moe()) {
    describe_moe_decode_traffic(c, placement.expert_devices(), out);
    return;
  }
  const auto calls = model::plan_decode_collectives(c, plan);
  out << "  collectives per decoded token, device 0 (sampling; greedy gathers 2 floats per device instead of the logits):\n";
  print_collectives(calls, pm, out);
  const auto work = model::plan_decode_work(c, plan, c.seq_len / 2, model::decode_storage(w));
  const perf::WorkRates rates = work_rates(work, calls, gflops, perf::PlanMesh{pm.tensor_axis, pm.data_axis, pm.tensor, 1, pm.links}, out, &w,
                                           model::shard_bytes(w, plan));
  out << "  time per token at position " << c.seq_len / 2 << " (memory at one thread per device; `tpcli bench decode`"
      << " measures the full read bandwidth): " << describe(perf::predict(work, calls, pm, rates)) << "\n";
}

void setup_inspect(CLI::App& sub) {
  auto flags = add_run_flags(sub, FLAG_DEVICES | FLAG_MESH | FLAG_SET | FLAG_BACKEND | FLAG_LINK);
  auto path = std::make_shared<std::string>();
  auto gflops = std::make_shared<double>(0);
  sub.add_option("file", *path, "a run config, a models/*.toml file or a checkpoint")->required()->type_name("FILE");
  sub.add_option("--matmul-gflops", *gflops, "matmul rate per device for the predicted times (default: measured briefly)")
      ->check(CLI::NonNegativeNumber);
  sub.callback([flags, path, gflops] {
    for (const auto& inspector : inspectors()) {
      if (inspector.accepts(*path)) {
        if (!flags->set.empty()) throw UsageError("--set applies to run configs, and " + *path + " is a " + inspector.kind);
        inspector.describe(*path, std::cout);
        if (flags->devices || !flags->mesh.empty() || !flags->links.empty()) describe_decode_plan(*path, *flags, *gflops, std::cout);
        return;
      }
    }
    if (!std::filesystem::exists(*path)) throw UsageError(*path + ": no such file");
    if (std::filesystem::path(*path).extension() != ".toml")
      throw UsageError(*path + ": unknown file kind (expected a .toml run or model config" +
                       (inspectors().empty() ? std::string(")") : ", or a checkpoint") + ")");
    if (config::is_model_file(*path)) {
      if (!flags->set.empty() || flags->devices || !flags->mesh.empty())
        throw UsageError("--set, --devices and --mesh apply to run configs, and " + *path + " is a model file");
      describe_model_file(*path, std::cout);
    } else {
      const config::RunConfig config = load_config(*path, *flags);
      config.mesh.mesh();
      describe_run_config(config, *gflops, std::cout);
    }
  });
}

const bool registered = register_command({"inspect", "Describe a config or checkpoint file", setup_inspect});

}  // namespace

bool register_inspector(Inspector inspector) {
  inspector_list().push_back(std::move(inspector));
  return true;
}

const std::vector<Inspector>& inspectors() { return inspector_list(); }

}  // namespace tpcli::cli
