#include "cli/common_flags.h"

#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "distributed/mpi/mpi_backend.h"
#include "distributed/trace.h"
#include "distributed/zmq/zmq_backend.h"

namespace tpcli::cli {

std::shared_ptr<RunFlags> add_run_flags(CLI::App& sub, unsigned which) {
  auto flags = std::make_shared<RunFlags>();
  CLI::Option* devices = nullptr;
  if (which & FLAG_DEVICES)
    devices = sub.add_option("--devices", flags->devices, "run on N devices along one axis (the tensor axis)")
                  ->check(CLI::Range(1, 1 << 16))
                  ->type_name("N");
  if (which & FLAG_MESH) {
    auto* mesh = sub.add_option("--mesh", flags->mesh, "ordered mesh axes, e.g. data=2,model=4 (overrides [mesh] axes)")
                     ->type_name("AXES");
    if (devices) mesh->excludes(devices);
  }
  if (which & (FLAG_SET | FLAG_ROLES))
    sub.add_option("--set", flags->set,
                   which & FLAG_SET ? "override a config key, e.g. --set train.steps=10 (repeatable)"
                                    : "name a role's mesh axis: mesh.tensor_axis=NAME splits the weights (default model), "
                                      "mesh.expert_axis=NAME deals a MoE's experts out (default expert); repeatable")
        ->type_name("KEY=VALUE")
        ->allow_extra_args(false);  // one value per --set, so a following positional stays positional
  if (which & FLAG_TRACE)
    sub.add_option("--trace", flags->trace, "write a Chrome-trace JSON of every device's compute and collectives")
        ->type_name("FILE");
  if (which & FLAG_BACKEND)
    sub.add_option("--backend", flags->backend, "device transport (overrides [mesh] backend)")
        ->check(CLI::IsMember({"threads", "zmq", "mpi"}))
        ->type_name("threads|zmq|mpi");
  if (which & FLAG_LINK)
    sub.add_option("--link", flags->links,
                   "model an axis's links: GB/s per direction, latency in us, topology (overrides [mesh.links]), "
                   "e.g. --link model=100,1 --link data=10,25,switch")
        ->type_name("AXIS=GBPS,US[,ring|switch]")
        ->allow_extra_args(false);
  return flags;
}

dist::LinkSpec links_from_flags(const RunFlags& flags) {
  dist::LinkSpec spec;
  for (const std::string& text : flags.links) {
    try {
      auto [axis, link] = dist::parse_link_flag(text);
      spec.insert_or_assign(axis, link);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  }
  return spec;
}

std::optional<int> launched_devices(config::BackendKind backend) {
  if (backend == config::BackendKind::Mpi) {  // one device per process started by mpirun
    if (!dist::started_by_mpi()) return std::nullopt;
    try {
      return dist::mpi_process_count();
    } catch (const std::exception& e) {
      throw UsageError(e.what());
    }
  }
  if (backend != config::BackendKind::Zmq || !dist::ZmqConfig::in_env()) return std::nullopt;
  try {
    const dist::ZmqConfig launched = dist::ZmqConfig::from_env();
    return launched.world_size * launched.devices_per_process;
  } catch (const std::exception& e) {
    throw UsageError(e.what());
  }
}

// The flags that replace parts of the file, applied after --set and before the checks: flags win
// over --set, which wins over the file.
static void apply_run_flags(config::RunConfig& config, const RunFlags& flags) {
  if (flags.devices)
    config::set_mesh_axes(config, {{config.mesh.tensor_axis, *flags.devices}}, "--devices " + std::to_string(*flags.devices));
  if (!flags.mesh.empty()) config::set_mesh_axes(config, config::parse_mesh_axes(flags.mesh), "--mesh " + flags.mesh);
  if (!flags.backend.empty()) config::set_backend(config, flags.backend, "--backend " + flags.backend);
  for (const auto& [axis, link] : links_from_flags(flags))
    config::set_link(config, axis, link, "--link " + axis);
  // Neither the file nor a flag gave a mesh: a launched zmq or mpi run is the launched world.
  if (config.mesh.axes.empty())
    if (const std::optional<int> devices = launched_devices(config.mesh.backend))
      config::set_mesh_axes(config, {{config.mesh.tensor_axis, *devices}},
                            config.mesh.backend == config::BackendKind::Mpi
                                ? "the MPI world (" + std::to_string(*devices) + " processes, one device each)"
                                : "the launched world (TPCLI_WORLD_SIZE x TPCLI_DEVICES_PER_PROCESS = " +
                                      std::to_string(*devices) + " devices)");
}

config::RunConfig load_config(const std::string& path, const RunFlags& flags) {
  return config::load_run_config(path, flags.set, [&](config::RunConfig& config) { apply_run_flags(config, flags); });
}

dist::Mesh mesh_from_flags(const RunFlags& flags, const std::string& tensor_axis) {
  if (flags.devices) return dist::Mesh::line(*flags.devices, tensor_axis);
  if (flags.mesh.empty() && (flags.backend == "zmq" || flags.backend == "mpi"))
    if (const std::optional<int> devices =
            launched_devices(flags.backend == "mpi" ? config::BackendKind::Mpi : config::BackendKind::Zmq))
      return dist::Mesh::line(*devices, tensor_axis);
  if (flags.mesh.empty()) return dist::Mesh::line(1, tensor_axis);
  std::vector<dist::MeshAxis> axes;
  for (const auto& axis : config::parse_mesh_axes(flags.mesh)) axes.push_back({axis.name, axis.size});
  return dist::Mesh(std::move(axes));
}

namespace {

// --set mesh.tensor_axis=NAME / mesh.expert_axis=NAME (NAME as written, or quoted as in TOML).
model::AxisRoles roles_from_flags(const RunFlags& flags) {
  model::AxisRoles roles;
  for (const std::string& text : flags.set) {
    const size_t eq = text.find('=');
    const std::string key = text.substr(0, eq);
    std::string name = eq == std::string::npos ? "" : text.substr(eq + 1);
    if (name.size() >= 2 && name.front() == '"' && name.back() == '"') name = name.substr(1, name.size() - 2);
    std::string* role = key == "mesh.tensor_axis" ? &roles.tensor : key == "mesh.expert_axis" ? &roles.expert : nullptr;
    if (!role) throw UsageError("--set " + text + ": inference names only mesh.tensor_axis and mesh.expert_axis");
    const bool valid = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
    });
    if (!valid) throw UsageError("--set " + text + ": an axis name is letters, digits, '_' or '-'");
    *role = name;
  }
  return roles;
}

}  // namespace

InferenceAxes inference_mesh_from_flags(const RunFlags& flags) {
  const model::AxisRoles roles = roles_from_flags(flags);
  InferenceAxes where{mesh_from_flags(flags, roles.tensor), roles};
  try {
    model::check_axis_roles(where.mesh, where.roles);
  } catch (const std::invalid_argument& e) {
    std::string fix;  // the unused axis as the tensor axis
    for (const dist::MeshAxis& axis : where.mesh.axes())
      if (axis.size > 1 && axis.name != where.roles.tensor && axis.name != where.roles.expert && fix.empty())
        fix = " (e.g. --mesh " + where.roles.tensor + "=" + std::to_string(axis.size) + ", or --set mesh.tensor_axis=" +
              axis.name + ")";
    throw UsageError("--mesh " + where.mesh.to_string() + ": " + e.what() + fix);
  }
  return where;
}

void check_trace_path(const std::string& path, bool process_backend) {
  if (process_backend)
    throw UsageError("--trace " + path + ": works on the threads backend only (a zmq or mpi rank sees only its own devices)");
  const std::filesystem::path folder = std::filesystem::absolute(path).parent_path();
  if (!std::filesystem::is_directory(folder) || ::access(folder.c_str(), W_OK) != 0)
    throw UsageError("--trace " + path + ": folder " + folder.string() + " does not exist or is not writable");
}

void write_trace(const dist::Trace& trace, const std::string& path, const char* spans) {
  trace.write(path);
  std::fprintf(stderr, "trace: %s (every device's %s and collectives; open in ui.perfetto.dev)\n", path.c_str(), spans);
}

void add_sampling_flags(CLI::App& sub, engine::SamplingParams& p) {
  sub.add_option("--top-k", p.top_k, "sample from the k likeliest tokens only; 0 = off")->capture_default_str();
  sub.add_option("--min-p", p.min_p, "drop tokens less likely than this times the likeliest; 0 = off")->capture_default_str();
  sub.add_option("--presence-penalty", p.presence_penalty, "subtracted from the logit of every token generated so far (-2 to 2)")
      ->capture_default_str();
  sub.add_option("--frequency-penalty", p.frequency_penalty, "times each generated token's count, subtracted from its logit (-2 to 2)")
      ->capture_default_str();
  sub.add_option("--repetition-penalty", p.repetition_penalty,
                 "divides the positive logits, multiplies the negative, of the prompt's and generated tokens (0.01 to 100; 1 = off)")
      ->capture_default_str();
}

void check_sampling_flags(const engine::SamplingParams& params, int vocab) {
  try {
    engine::check_sampling_params(params, vocab);
  } catch (const engine::SamplingParamError& e) {
    std::string flag = "--" + e.field();
    std::ranges::replace(flag, '_', '-');
    throw UsageError(flag + ": " + e.what());
  }
}

void add_kv_dtype_flag(CLI::App& sub, std::string& value) {
  sub.add_option("--kv-dtype", value,
                 "KV cache elements: f32, or bf16 / f16 (half the bytes per position: twice the context in the same memory; "
                 "attention reads them widened to f32)")
      ->capture_default_str();
}

nn::KvDtype parse_kv_dtype(const std::string& text) {
  if (auto dtype = nn::kv_dtype_from_name(text)) return *dtype;
  throw UsageError("--kv-dtype " + text + ": not a KV cache type (f32, bf16 or f16)");
}

void add_speculate_flag(CLI::App& sub, std::string& value) {
  sub.add_option("--speculate", value,
                 "ngram[:K]: guess up to K tokens a step (default " + std::to_string(SPECULATE_GUESSES) +
                     ") from where the text's last tokens appeared before, and check them in the same forward; the "
                     "tokens are those of plain decoding, bit for bit. off: none")
      ->capture_default_str();
}

int parse_speculate(const std::string& text) {
  if (text == "off") return 0;
  if (text == "ngram") return SPECULATE_GUESSES;
  const std::string bad = "--speculate " + text + ": ";
  if (!text.starts_with("ngram:")) throw UsageError(bad + "not a speculation (ngram, ngram:K or off)");
  const std::string count = text.substr(6);
  int guesses = 0;
  const auto [end, error] = std::from_chars(count.data(), count.data() + count.size(), guesses);
  if (error != std::errc{} || end != count.data() + count.size() || guesses < 1 || guesses > SPECULATE_MAX_GUESSES)
    throw UsageError(bad + "K must be a whole number from 1 to " + std::to_string(SPECULATE_MAX_GUESSES));
  return guesses;
}

int64_t parse_bytes(const std::string& text, const std::string& flag) {
  const std::string what = flag.empty() ? "size '" + text + "'" : flag + " " + text;
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    throw UsageError(what + ": not a number (e.g. 4K, 16M)");
  }
  const std::string unit = text.substr(used);
  double scale = 1;
  if (unit == "K" || unit == "KB" || unit == "k") scale = 1024;
  else if (unit == "M" || unit == "MB") scale = 1024 * 1024;
  else if (unit == "G" || unit == "GB") scale = 1024.0 * 1024 * 1024;
  else if (!unit.empty() && unit != "B") throw UsageError(what + ": unknown unit '" + unit + "' (B, K, M or G)");
  const double bytes = value * scale;
  // 2^63 and beyond (or inf, nan) have no int64_t: the cast would wrap them to a negative size.
  if (std::isnan(bytes) || bytes >= 0x1p63) throw UsageError(what + ": not a size in bytes this machine could hold");
  if (bytes < 4) throw UsageError(what + ": below 4 bytes");
  return static_cast<int64_t>(bytes);
}

}  // namespace tpcli::cli
