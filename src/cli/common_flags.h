// tpcli::cli — the flags every mesh-running subcommand shares, and how they become a config/mesh.
//
//   void setup_train(CLI::App& sub) {
//     auto flags = add_run_flags(sub);                 // --devices --mesh --set --trace --backend
//     auto path = std::make_shared<std::string>();
//     sub.add_option("config", *path, "run config (TOML)")->required();
//     sub.callback([flags, path] {
//       config::RunConfig config = load_config(*path, *flags);   // --set, then --devices/--mesh/--backend
//       dist::Mesh mesh = config.mesh.mesh();
//       ...
//     });
//   }
//
// Commands without a config file (infer) use mesh_from_flags(). The flags object is returned as a
// shared_ptr so the sub-app's callback can own it (CLI11 writes into it while parsing).
//
// Precedence: the config file < --set overrides < --devices / --mesh / --backend.
// Said once: a zmq run started by `tpcli launch -n P [--devices-per-process K]` whose command and
// config give no mesh runs on the launched world, P*K devices along the tensor axis (as
// `mlx.launch -n N` gives the script a group of N).
// --devices N is one axis of N devices named after the tensor axis ("model" unless the config's
// [mesh] tensor_axis says otherwise); --mesh data=2,model=4 lists axes in order. The two flags
// exclude each other. Errors are config::ConfigError (exit 2, one line).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/run_config.h"
#include "distributed/links.h"
#include "distributed/mesh.h"
#include "engine/sampling_params.h"
#include "model/placement.h"
#include "nn/attention.h"

namespace CLI {
class App;
}
namespace tpcli::dist {
class Trace;
}

namespace tpcli::cli {

struct RunFlags {
  std::optional<int> devices;    // --devices N
  std::string mesh;              // --mesh data=2,model=4 ("" = not given)
  std::vector<std::string> set;  // --set section.key=value (repeatable)
  std::string trace;             // --trace FILE: Chrome-trace JSON ("" = off)
  std::string backend;           // --backend threads|zmq|mpi ("" = the config's, else threads)
  std::vector<std::string> links;  // --link AXIS=GBPS,LATENCY_US[,ring|switch] (repeatable)
};

// Which flags add_run_flags adds (bit set).
enum RunFlagBits : unsigned {
  FLAG_DEVICES = 1u << 0,
  FLAG_MESH = 1u << 1,
  FLAG_SET = 1u << 2,
  FLAG_TRACE = 1u << 3,
  FLAG_BACKEND = 1u << 4,
  FLAG_LINK = 1u << 5,
  FLAG_ALL = 0x3fu,
  // Commands that run a model without a config: --set names only the roles' axes (inference_mesh_from_flags).
  FLAG_ROLES = 1u << 6,
};

std::shared_ptr<RunFlags> add_run_flags(CLI::App& sub, unsigned which = FLAG_ALL);

// Loads `path` through config::load_run_config with flags.set, then applies --devices / --mesh /
// --backend (re-validating the mesh roles against the new axes).
config::RunConfig load_config(const std::string& path, const RunFlags& flags);

// Devices of the run a launcher started this process into: zmq, `tpcli launch`'s TPCLI_WORLD_SIZE x
// TPCLI_DEVICES_PER_PROCESS (nullopt outside launch); mpi, MPI_COMM_WORLD's size, one device per
// process (nullopt outside mpirun). Other backends: nullopt. A malformed environment, or a build
// without MPI, is a UsageError.
std::optional<int> launched_devices(config::BackendKind backend);

// The mesh of --devices / --mesh alone (no config). Neither given: the launched world with
// --backend zmq under `tpcli launch` or --backend mpi under mpirun, else one device. --devices and
// the launched world are one axis named `tensor_axis`.
dist::Mesh mesh_from_flags(const RunFlags& flags, const std::string& tensor_axis = model::AxisRoles{}.tensor);

// A command that runs a model (infer, serve, chat, eval, perplexity, logits): the mesh of the flags
// and the roles of its axes (model/placement.h).
struct InferenceAxes {
  dist::Mesh mesh;
  model::AxisRoles roles;
};
// The roles --set gives (FLAG_ROLES: mesh.tensor_axis=NAME, mesh.expert_axis=NAME, the keys of a
// run config's [mesh], config/run_config.h; the others are "model" and "expert"), and
// mesh_from_flags with --devices N and the launched world named after the tensor role. UsageError,
// one line: a --set key that is not a role, an axis longer than 1 with no role, naming it
// (model::check_axis_roles), not N copies of the same work (--mesh tp=4 ran four whole replicas).
InferenceAxes inference_mesh_from_flags(const RunFlags& flags);

// The modelled links of --link alone (commands without a config; UsageError on a bad value).
dist::LinkSpec links_from_flags(const RunFlags& flags);


// --trace FILE, checked before the run rather than after it: refused on the zmq and mpi backends (a
// rank sees only its own devices) and when FILE's folder cannot be written. UsageError, one line.
void check_trace_path(const std::string& path, bool process_backend);
// Writes the trace to `path` and says so on stderr; `spans` names what it shows besides collectives.
void write_trace(const dist::Trace& trace, const std::string& path, const char* spans);

// A size in bytes: a number with an optional unit, B, K/KB, M/MB or G/GB (powers of 1024). A
// UsageError names `flag` (or "size") and the text when it is none, below 4 bytes or past int64_t.
int64_t parse_bytes(const std::string& text, const std::string& flag = "");

// --top-k --min-p --presence-penalty --frequency-penalty --repetition-penalty (engine/sampling_params.h).
void add_sampling_flags(CLI::App& sub, engine::SamplingParams& params);
// UsageError naming the flag of the first value out of range.
void check_sampling_flags(const engine::SamplingParams& params, int vocab);
// --kv-dtype f32|bf16|f16, the KV cache's element type (default f32): the flag, and its value
// read (a UsageError naming the flag and the value when it is none of them).
void add_kv_dtype_flag(CLI::App& sub, std::string& value);
nn::KvDtype parse_kv_dtype(const std::string& text);

// --speculate ngram[:K] | off: guesses checked per decode step (engine/batch_engine.h,
// Speculation), from prompt lookup; the tokens do not change. parse_speculate gives K (ngram
// alone: SPECULATE_GUESSES; off: 0), a UsageError naming the flag and the value otherwise.
inline constexpr int SPECULATE_GUESSES = 8, SPECULATE_MAX_GUESSES = 64;
void add_speculate_flag(CLI::App& sub, std::string& value);
int parse_speculate(const std::string& text);

}  // namespace tpcli::cli
