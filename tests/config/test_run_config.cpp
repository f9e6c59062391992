// config/: loading, defaults, axis order, overrides and every validation error with its position.
//
// Expected positions are computed from the test's own TOML text (the line and column where a
// marker substring starts), never read back from the parser under test.
#include <algorithm>
#include <catch2/catch.hpp>
#include <functional>
#include <filesystem>
#include <string>
#include <vector>

#include "config/run_config.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

using tpcli::config::ConfigError;
using tpcli::config::load_model_config;
using tpcli::config::load_run_config;
using MeshAxisConfig = tpcli::dist::MeshAxis;
using tpcli::config::parse_mesh_axes;
using tpcli::config::RunConfig;
using tpcli::testing::TempDir;
using tpcli::testing::error_of;

namespace {

// "FILE:LINE:COL" of the first occurrence of `marker` in `text` (1-based, as editors count).
std::string where(const std::string& file, const std::string& text, const std::string& marker) {
  const size_t at = text.find(marker);
  REQUIRE(at != std::string::npos);
  const size_t line_start = text.rfind('\n', at == 0 ? 0 : at - 1);
  const size_t line = 1 + static_cast<size_t>(std::count(text.begin(), text.begin() + static_cast<long>(at), '\n'));
  const size_t column = at - (line_start == std::string::npos || at == 0 ? static_cast<size_t>(-1) : line_start);
  return file + ":" + std::to_string(line) + ":" + std::to_string(column);
}

const char* TINY_MODEL = "dim = 64\nhidden_dim = 172\nn_layers = 2\nn_heads = 4\nvocab_size = 65\nseq_len = 64\n";

}  // namespace

TEST_CASE("where() counts lines and columns from 1") {
  CHECK(where("f", "abc\ndef", "e") == "f:2:2");
  CHECK(where("f", "abc\ndef", "a") == "f:1:1");
  CHECK(where("f", "abc\ndef", "c") == "f:1:3");
}

TEST_CASE("a run config with every key loads") {
  TempDir dir;
  dir.write("corpus.txt", "hello world\n");
  dir.write("tok.bin", "x");
  dir.write("models/m.toml", TINY_MODEL);
  const std::string path = dir.write("run.toml", R"([mesh]
axes = { data = 2, model = 2 }
data_axis = "data"
tensor_axis = "model"
expert_axis = "data"
backend = "zmq"
[model]
config = "models/m.toml"
n_layers = 3
n_experts = 4
top_k = 2
moe_aux_loss = 0.02
expert_hidden_dim = 32
capacity_factor = 1.5
shared_classifier = false
norm_eps = 1e-6
rope_theta = 500000.0
head_dim = 32
qkv_bias = true
qk_norm = true
norm_topk_prob = false
dense_layers = [0, 2]
hf_architecture = "Qwen3MoeForCausalLM"
[data]
path = "corpus.txt"
tokenizer = "tok.bin"
shuffle = false
[train]
steps = 7
batch_size = 4
seq_len = 32
seed = 42
lr = 3e-4
min_lr = 3e-5
warmup_steps = 2
decay = "constant"
weight_decay = 0.0
beta1 = 0.8
beta2 = 0.95
eps = 1e-6
grad_clip = 0
eval_every = 3
eval_batches = 2
out_dir = "runs/x"
log_every = 1
sample_tokens = 0
save_every = 5
)");
  const RunConfig c = load_run_config(path);
  CHECK(c.mesh.axes == std::vector<MeshAxisConfig>{{"data", 2}, {"model", 2}});
  CHECK(c.mesh.backend == tpcli::config::BackendKind::Zmq);
  CHECK(c.mesh.experts_axis() == "data");
  CHECK(c.model.config == (dir.path() / "models/m.toml").string());
  CHECK(c.model.dim == 64);          // from the model file
  CHECK(c.model.n_layers == 3);      // inline key wins over the file's 2
  CHECK(c.model.n_experts == 4);
  CHECK(c.model.top_k == 2);
  CHECK(c.model.moe_aux_loss == Approx(0.02));
  CHECK(c.model.expert_hidden_dim == 32);
  CHECK(c.model.capacity_factor == Approx(1.5));
  CHECK(c.model.shared_classifier == false);
  CHECK(c.model.norm_eps == Approx(1e-6));
  CHECK(c.model.rope_theta == Approx(500000.0));
  CHECK(c.model.head_dim == 32);
  CHECK(c.model.qkv_bias == true);
  CHECK(c.model.qk_norm == true);
  CHECK(c.model.norm_topk_prob == false);
  CHECK(c.model.dense_layers == std::vector<int>{0, 2});
  CHECK(c.model.hf_architecture == "Qwen3MoeForCausalLM");  // checked against the list by config/model_config
  CHECK(c.data.path == (dir.path() / "corpus.txt").string());
  CHECK(c.data.tokenizer == tpcli::config::TokenizerKind::File);
  CHECK(c.data.tokenizer_path == (dir.path() / "tok.bin").string());
  CHECK_FALSE(c.data.shuffle);
  CHECK(c.train.steps == 7);
  CHECK(c.train.batch_size == 4);
  CHECK(c.train.seq_len == 32);
  CHECK(c.train.seed == 42u);
  CHECK(c.train.lr == Approx(3e-4));
  CHECK(c.train.min_lr == Approx(3e-5));
  CHECK(c.train.warmup_steps == 2);
  CHECK(c.train.decay == tpcli::config::DecayKind::Constant);
  CHECK(c.train.weight_decay == 0.0);
  CHECK(c.train.beta1 == Approx(0.8));
  CHECK(c.train.beta2 == Approx(0.95));
  CHECK(c.train.eps == Approx(1e-6));
  CHECK(c.train.grad_clip == 0.0);
  CHECK(c.train.eval_every == 3);
  CHECK(c.train.eval_batches == 2);
  CHECK(c.train.out_dir == "runs/x");
  CHECK(c.train.log_every == 1);
  CHECK(c.train.sample_tokens == 0);
  CHECK(c.train.save_every == 5);
}

TEST_CASE("an empty run config gives the documented defaults") {
  TempDir dir;
  const RunConfig c = load_run_config(dir.write("my-run.toml", ""));
  CHECK(c.mesh.axes.empty());
  CHECK(c.mesh.device_count() == 1);
  CHECK(c.mesh.data_axis == "data");
  CHECK(c.mesh.tensor_axis == "model");
  CHECK(c.mesh.experts_axis() == "data");
  CHECK(c.mesh.backend == tpcli::config::BackendKind::Threads);
  CHECK_FALSE(c.model.dim.has_value());
  CHECK(load_run_config(dir.write("mpi.toml", "[mesh]\nbackend = \"mpi\"\n")).mesh.backend ==
        tpcli::config::BackendKind::Mpi);
  CHECK_FALSE(c.data.path.has_value());
  CHECK(c.data.tokenizer == tpcli::config::TokenizerKind::Chars);
  CHECK(c.data.shuffle);
  // The issue's defaults (issue 4's schema).
  CHECK(c.train.steps == 2000);
  CHECK(c.train.batch_size == 12);
  CHECK_FALSE(c.train.seq_len.has_value());
  CHECK(c.train.seed == 1337u);
  CHECK(c.train.lr == 1e-3);
  CHECK(c.train.min_lr == 1e-4);
  CHECK(c.train.warmup_steps == 100);
  CHECK(c.train.decay == tpcli::config::DecayKind::Cosine);
  CHECK(c.train.weight_decay == 0.1);
  CHECK(c.train.beta1 == 0.9);
  CHECK(c.train.beta2 == 0.99);
  CHECK(c.train.eps == 1e-8);
  CHECK(c.train.grad_clip == 1.0);
  CHECK(c.train.eval_every == 250);
  CHECK(c.train.eval_batches == 20);
  CHECK(c.train.out_dir == "runs/my-run");
  CHECK_FALSE(c.train.save_every.has_value());
}

TEST_CASE("mesh axes keep their declaration order, not TOML++'s sorted order") {
  TempDir dir;
  SECTION("inline table") {
    const RunConfig c = load_run_config(dir.write("a.toml", "[mesh]\naxes = { model = 4, data = 2 }\n"));
    CHECK(c.mesh.axes == std::vector<MeshAxisConfig>{{"model", 4}, {"data", 2}});
    CHECK(c.mesh.axes_string() == "model=4,data=2");
    CHECK(c.mesh.device_count() == 8);
  }
  SECTION("standard table, three axes") {
    const RunConfig c = load_run_config(dir.write("b.toml", R"([mesh]
tensor_axis = "zeta"
expert_axis = "expert"
[mesh.axes]
zeta = 2
data = 3
expert = 2
)"));
    CHECK(c.mesh.axes == std::vector<MeshAxisConfig>{{"zeta", 2}, {"data", 3}, {"expert", 2}});
    CHECK(c.mesh.axis_size("expert") == 2);
    CHECK(c.mesh.axis_size("absent") == 1);
  }
  SECTION("--set on an existing axis keeps its place; a new axis goes last") {
    const RunConfig c = load_run_config(dir.write("c.toml", "[mesh]\naxes = { model = 4, data = 2 }\nexpert_axis = \"ep\"\n"),
                                        {"mesh.axes.ep=2", "mesh.axes.model=8"});
    CHECK(c.mesh.axes == std::vector<MeshAxisConfig>{{"model", 8}, {"data", 2}, {"ep", 2}});
  }
}

TEST_CASE("every validation error names FILE:LINE:COL of the culprit") {
  TempDir dir;
  dir.write("m.toml", TINY_MODEL);
  struct Case {
    std::string text, marker, message;
  };
  const std::vector<Case> cases = {
      {"[mesh]\naxes = { data = 2, model = 0 }\n", "0 }", "mesh.axes.model = 0 must be >= 1"},
      {"[mesh]\naxes = { data = -1 }\n", "-1", "mesh.axes.data = -1 must be >= 1"},
      {"[mesh]\naxes = { data = 2.0 }\n", "2.0", "mesh.axes.data must be an integer, got a float 2.0"},
      {"[mesh]\naxes = 4\n", "4", "mesh.axes must be a table of axis sizes, e.g. { data = 2, model = 4 }, got an integer 4"},
      {"[mesh]\naxes = {}\n", "{}", "mesh.axes must name at least one axis"},
      {"[mesh]\naxes = { \"a b\" = 2 }\n", "\"a b\"", "mesh axis name 'a b' must be letters, digits, '_' or '-'"},
      {"[mesh]\nbackend = \"nccl\"\n", "\"nccl\"", "mesh.backend = \"nccl\" must be one of \"threads\", \"zmq\", \"mpi\""},
      {"[mesh]\naxes = { data = 2 }\ndata_axis = \"dp\"\n", "\"dp\"",
       "mesh.data_axis = \"dp\" names no axis of the mesh data=2"},
      {"[mesh]\naxes = { data = 2, modle = 4 }\n", "4 }",
       "mesh axis 'modle' (size 4) has no role: name it in mesh.data_axis, mesh.tensor_axis or mesh.expert_axis "
       "(now \"data\", \"model\", \"data\")"},
      {"[mesh]\ndata_axis = \"model\"\n", "\"model\"", "mesh.data_axis and mesh.tensor_axis must differ (both are \"model\")"},
      {"[mesh]\nexpert_axis = \"model\"\n", "\"model\"",
       "mesh.expert_axis must differ from mesh.tensor_axis (both are \"model\")"},
      {"[mesh]\naxis = { data = 2 }\n", "axis", "unknown key 'mesh.axis' (did you mean 'axes'?)"},
      {"[training]\nsteps = 1\n", "training", "unknown key 'training' (did you mean 'train'?)"},
      {"[optimizer]\nlr = 1\n", "optimizer", "unknown key 'optimizer'; known: mesh, model, data, train"},
      {"train = 3\n", "3", "train must be a table ([train]), got an integer 3"},
      {"[train]\nstepz = 10\n", "stepz", "unknown key 'train.stepz' (did you mean 'steps'?)"},
      {"[train]\nwarmup = 10\n", "warmup", "unknown key 'train.warmup' (did you mean 'warmup_steps'?)"},
      {"[train]\nsteps = \"ten\"\n", "\"ten\"", "train.steps must be an integer, got a string \"ten\""},
      {"[train]\nsteps = 0\n", "0", "train.steps = 0 must be >= 1"},
      {"[train]\nsteps = 3000000000\n", "3000000000", "train.steps = 3000000000 must be <= 2147483647"},
      {"[train]\nbatch_size = 0\n", "0", "train.batch_size = 0 must be >= 1"},
      {"[train]\nseq_len = 0\n", "0", "train.seq_len = 0 must be >= 1"},
      {"[train]\nwarmup_steps = -1\n", "-1", "train.warmup_steps = -1 must be >= 0"},
      {"[train]\nlr = -1.0\n", "-1.0", "train.lr = -1.0 must be >= 0"},
      {"[train]\nlr = \"fast\"\n", "\"fast\"", "train.lr must be a number, got a string \"fast\""},
      {"[train]\nbeta1 = 1\n", "1\n", "train.beta1 = 1 must be in [0, 1)"},
      {"[train]\neps = 0.0\n", "0.0", "train.eps = 0.0 must be > 0"},
      {"[train]\nlr = nan\n", "nan", "train.lr = nan must be finite"},
      {"[train]\nlr = 0.01\nmin_lr = 0.1\n", "0.1\n", "train.min_lr = 0.1 must be <= train.lr = 0.01"},
      {"[train]\ndecay = \"linear\"\n", "\"linear\"", "train.decay = \"linear\" must be one of \"cosine\", \"constant\""},
      {"[train]\nout_dir = \"\"\n", "\"\"", "train.out_dir must not be empty"},
      {"[mesh]\naxes = { data = 4 }\n[train]\nbatch_size = 6\n", "6",
       "train.batch_size = 6 is not divisible by the data axis 'data' = 4 (mesh data=4)"},
      {"[data]\nshuffle = \"yes\"\n", "\"yes\"", "data.shuffle must be a boolean (true or false), got a string \"yes\""},
      {"[data]\ntokenizer = 5\n", "5", "data.tokenizer must be a string, got an integer 5"},
      {"[model]\ndim = 0\n", "0", "model.dim = 0 must be >= 1"},
      {"[model]\nn_experts = -2\n", "-2", "model.n_experts = -2 must be >= 0"},
      {"[model]\ncapacity_factor = 0\n", "0", "model.capacity_factor = 0 must be > 0"},
      {"[model]\nshared_classifier = 1\n", "1", "model.shared_classifier must be a boolean (true or false), got an integer 1"},
      {"[model]\nhead_dim = 0\n", "0", "model.head_dim = 0 must be >= 1"},
      {"[model]\nqkv_bias = \"yes\"\n", "\"yes\"", "model.qkv_bias must be a boolean (true or false), got a string \"yes\""},
      {"[model]\nqk_norm = 0\n", "0", "model.qk_norm must be a boolean (true or false), got an integer 0"},
      {"[model]\nnorm_topk_prob = 1.0\n", "1.0", "model.norm_topk_prob must be a boolean (true or false), got a float 1.0"},
      {"[model]\ndense_layers = 0\n", "0", "model.dense_layers must be an array of integers, e.g. [0, 2], got an integer 0"},
      {"[model]\ndense_layers = [0, \"1\"]\n", "\"1\"", "model.dense_layers must hold integers, got a string \"1\""},
      {"[model]\ndense_layers = [-1]\n", "-1", "model.dense_layers: -1 must be in [0, 2147483647]"},
      {"[model]\ndense_layers = [2, 1]\n", "1]", "model.dense_layers: 1 must be above the 2 before it (ascending, no repeats)"},
      {"[model]\ndense_layers = [1, 1]\n", "1]", "model.dense_layers: 1 must be above the 1 before it (ascending, no repeats)"},
      {"[model]\nhf_architecture = 3\n", "3", "model.hf_architecture must be a string, got an integer 3"},
      {"[model]\nhf_architecture = \"\"\n", "\"\"", "model.hf_architecture must not be empty"},
      {"[model]\nqk_norms = true\n", "qk_norms", "unknown key 'model.qk_norms' (did you mean 'qk_norm'?)"},
      {"[model]\nlayers = 2\n", "layers", "unknown key 'model.layers' (did you mean 'n_layers'?)"},
      {"[train.lora]\nrank = 0\n", "0", "train.lora.rank = 0 must be >= 1"},
      {"[train.lora]\nalpha = -1\n", "-1", "train.lora.alpha = -1 must be > 0"},
      {"[train.lora]\ndropout = 1.0\n", "1.0", "train.lora.dropout = 1.0 must be in [0, 1)"},
      {"[train.lora]\ntargets = [\"q_proj\", \"qkv\"]\n", "\"qkv\"",
       "train.lora.targets: \"qkv\" is not a module LoRA adapts (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)"},
      {"[train.lora]\ntargets = [\"q_proj\", \"q_proj\"]\n", "\"q_proj\"]", "train.lora.targets: \"q_proj\" is listed twice"},
      {"[train.lora]\ntargets = []\n", "[]",
       "train.lora.targets must be a non-empty array of module names, e.g. [\"q_proj\", \"v_proj\"], got an array []"},
      {"[train.lora]\nlayers = \"some\"\n", "\"some\"",
       "train.lora.layers must be \"all\" or a number of blocks (the last ones), got a string \"some\""},
      {"[train.lora]\nlayers = 0\n", "0", "train.lora.layers = 0 must be \"all\" or a count >= 1"},
      {"[train.lora]\nrnk = 4\n", "rnk", "unknown key 'train.lora.rnk' (did you mean 'rank'?)"},
      {"[train]\nlora = 8\n", "8", "train.lora must be a table ([train.lora] rank = 8 ...), got an integer 8"},
      {"[model]\nconfig = \"m.toml\"\nseq_len = 32\n[train]\nseq_len = 64\n", "64",
       "train.seq_len = 64 exceeds the model's seq_len = 32 (" + where("CONFIG", "[model]\nconfig = \"m.toml\"\nseq_len = 32\n", "32") + ")"},
  };
  int n = 0;
  for (const auto& c : cases) {
    const std::string path = dir.write("case" + std::to_string(n++) + ".toml", c.text);
    std::string expected = where(path, c.text, c.marker) + ": " + c.message;
    if (const size_t at = expected.find("CONFIG"); at != std::string::npos) expected.replace(at, 6, path);
    INFO(c.text);
    CHECK(error_of<ConfigError>([&] { load_run_config(path); }) == expected);
  }
}

TEST_CASE("missing files are errors at the key that names them") {
  TempDir dir;
  const std::string looked = " (looked in " + dir.path().string() + "/ and in the current directory)";
  const std::string long_name(5000, 'q');
  struct Case {
    std::string text, marker, message;
  };
  const std::vector<Case> cases = {
      {"[data]\npath = \"missing.txt\"\n", "\"missing.txt\"", "data.path = \"missing.txt\": no such file" + looked},
      {"[data]\ntokenizer = \"tok.bin\"\n", "\"tok.bin\"", "data.tokenizer = \"tok.bin\": no such file" + looked},
      {"[model]\nconfig = \"models/none.toml\"\n", "\"models/none.toml\"",
       "model.config = \"models/none.toml\": no such file" + looked},
      {"[model]\ninit_from = \"/nonexistent/x.bin\"\n", "\"/nonexistent/x.bin\"",
       "model.init_from = \"/nonexistent/x.bin\": no such file"},
      // Regression (fuzz_run_config): a name too long for the system threw std::filesystem's error.
      {"[model]\nconfig = \"" + long_name + "\"\n", "\"" + long_name + "\"",
       "model.config = \"" + long_name + "\": no such file" + looked},
  };
  int n = 0;
  for (const auto& c : cases) {
    const std::string path = dir.write("case" + std::to_string(n++) + ".toml", c.text);
    INFO(c.text);
    CHECK(error_of<ConfigError>([&] { load_run_config(path); }) == where(path, c.text, c.marker) + ": " + c.message);
  }
  CHECK(error_of<ConfigError>([&] { load_run_config((dir.path() / "nope.toml").string()); }) ==
        (dir.path() / "nope.toml").string() + ": no such file");
  CHECK(error_of<ConfigError>([&] { load_run_config(long_name + ".toml"); }) == long_name + ".toml: no such file");
}

// Regression (fuzz_run_config): TOML++ quoted the text it saw, newline included, and the error
// became two lines.
TEST_CASE("a TOML syntax error whose quoted text holds a newline is still one line") {
  TempDir dir;
  const std::string path = dir.write("cut.toml", "[data]\nshuffle = tru\n[train]\nsteps = 1\n");
  const std::string err = error_of<ConfigError>([&] { load_run_config(path); });
  CHECK(err.rfind(path + ":2:", 0) == 0);
  CHECK(err.find("TOML syntax error") != std::string::npos);
  CHECK(err.find('\n') == std::string::npos);
}

TEST_CASE("TOML syntax errors carry the parser's line and column") {
  TempDir dir;
  const std::string dup = dir.write("dup.toml", "[mesh]\naxes = { data = 2, data = 3 }\n");
  const std::string err = error_of<ConfigError>([&] { load_run_config(dup); });
  CHECK(err.rfind(dup + ":2:", 0) == 0);  // duplicate axis names are a TOML error already
  CHECK(err.find("TOML syntax error") != std::string::npos);
  CHECK(err.find("'data'") != std::string::npos);

  const std::string header = dir.write("header.toml", "steps = 1\n[train\n");
  const std::string err2 = error_of<ConfigError>([&] { load_run_config(header); });
  CHECK(err2.rfind(header + ":2:", 0) == 0);
  CHECK(err2.find('\n') == std::string::npos);  // one line
}

TEST_CASE("errors inside a model file name that file") {
  TempDir dir;
  const std::string model_text = "dim = 64\nheads = 4\n";
  const std::string model = dir.write("models/bad.toml", model_text);
  const std::string run_text = "[model]\nconfig = \"models/bad.toml\"\n";
  const std::string run = dir.write("run.toml", run_text);
  CHECK(error_of<ConfigError>([&] { load_run_config(run); }) ==
        where(run, run_text, "\"models/bad.toml\"") + ": model.config: " + where(model, model_text, "heads") +
            ": unknown key 'heads' (did you mean 'n_heads'?)");

  // Found by fuzz_run_config: a folder (or any file but a regular one) as the model file names the
  // run config's key too.
  const std::string folder_text = "[model]\nconfig = \"models\"\n";
  const std::string folder = dir.write("folder.toml", folder_text);
  CHECK(error_of<ConfigError>([&] { load_run_config(folder); }) ==
        where(folder, folder_text, "\"models\"") + ": model.config: " + (dir.path() / "models").string() +
            ": is a directory, not a TOML file");

  const std::string wrapped_text = "[model]\ndim = 64\n";
  const std::string wrapped = dir.write("models/wrapped.toml", wrapped_text);
  CHECK(error_of<ConfigError>([&] { load_model_config(wrapped); }) ==
        where(wrapped, wrapped_text, "[model]") +
            ": a model file holds its dims at top level (dim = 64 ...), not under [model]");
}

TEST_CASE("model files load with their dims and positions") {
  TempDir dir;
  const std::string path = dir.write("models/tiny.toml", TINY_MODEL);
  const auto m = load_model_config(path);
  CHECK(m.dim == 64);
  CHECK(m.hidden_dim == 172);
  CHECK(m.n_layers == 2);
  CHECK(m.n_heads == 4);
  CHECK_FALSE(m.n_kv_heads.has_value());
  CHECK(m.vocab_size == 65);
  CHECK(m.seq_len == 64);
  CHECK(m.source.where("n_heads") == where(path, TINY_MODEL, "4\nvocab"));
  CHECK(m.source.where("n_kv_heads") == path);  // not written: the file alone
  CHECK(tpcli::config::is_model_file(path));
  CHECK_FALSE(tpcli::config::is_model_file(dir.write("run.toml", "[train]\nsteps = 2\n")));
}

TEST_CASE("the Qwen3-shaped model files hold the keys beyond the Llama block") {
  const std::string models = std::string(TPCLI_SOURCE_DIR) + "/models/";
  const auto dense = load_model_config(models + "qwen3-0.6B.toml");
  CHECK(dense.head_dim == 128);
  CHECK(dense.qk_norm == true);
  CHECK_FALSE(dense.qkv_bias.has_value());
  CHECK_FALSE(dense.n_experts.has_value());
  CHECK(dense.hf_architecture == "Qwen3ForCausalLM");
  const auto moe = load_model_config(models + "qwen3-moe-small.toml");
  CHECK(moe.n_experts == 32);
  CHECK(moe.top_k == 4);
  CHECK(moe.dense_layers == std::vector<int>{0});
  CHECK(moe.norm_topk_prob == true);
  CHECK(moe.hf_architecture == "Qwen3MoeForCausalLM");
  CHECK(moe.source.where("dense_layers").rfind(models + "qwen3-moe-small.toml:", 0) == 0);
}

TEST_CASE("model.config resolves beside the config first, then in the current directory") {
  TempDir dir;
  dir.write("configs/models/m.toml", "dim = 32\n");  // beside the config
  dir.write("models/m.toml", "dim = 48\n");          // under the current directory
  dir.write("models/only_cwd.toml", "dim = 16\n");
  dir.write("configs/a.toml", "[model]\nconfig = \"models/m.toml\"\n");
  dir.write("configs/b.toml", "[model]\nconfig = \"models/only_cwd.toml\"\n");
  dir.write("configs/c.toml", "[data]\npath = \"../corpus.txt\"\n");
  dir.write("corpus.txt", "abc");
  tpcli::testing::ScopedCwd cwd(dir.path());

  const RunConfig beside = load_run_config("configs/a.toml");
  CHECK(beside.model.dim == 32);
  CHECK(beside.model.config == "configs/models/m.toml");

  const RunConfig from_cwd = load_run_config("configs/b.toml");
  CHECK(from_cwd.model.dim == 16);
  CHECK(from_cwd.model.config == "models/only_cwd.toml");

  // "../x" from configs/ is the project root here: the usual way to name data outside configs/.
  const RunConfig up = load_run_config("configs/c.toml");
  CHECK(up.data.path == "corpus.txt");
}

TEST_CASE("inline [model] keys override the model file and point at their own line") {
  TempDir dir;
  const std::string model = dir.write("m.toml", TINY_MODEL);
  const std::string run_text = "[model]\nconfig = \"m.toml\"\nn_heads = 8\n";
  const std::string run = dir.write("run.toml", run_text);
  const RunConfig c = load_run_config(run);
  CHECK(c.model.n_heads == 8);
  CHECK(c.model.dim == 64);
  CHECK(c.model.source.where("n_heads") == where(run, run_text, "8"));
  CHECK(c.model.source.where("dim") == where(model, TINY_MODEL, "64"));
  CHECK(c.where("model.dim") == where(model, TINY_MODEL, "64"));
  CHECK(c.where("model.n_heads") == where(run, run_text, "8"));
}

TEST_CASE("overrides (--set) parse TOML values, fall back to strings, and win over the file") {
  TempDir dir;
  dir.write("corpus.txt", "abc");
  const std::string path = dir.write("run.toml", "[train]\nsteps = 100\n");
  const RunConfig c = load_run_config(path, {"train.steps=10", "train.lr=3e-4", "data.tokenizer=bytes", "data.shuffle=false",
                                             "train.out_dir=out/a b", "data.path=corpus.txt", "mesh.axes={ data = 2 }"});
  CHECK(c.train.steps == 10);
  CHECK(c.train.lr == Approx(3e-4));
  CHECK(c.data.tokenizer == tpcli::config::TokenizerKind::Bytes);
  CHECK_FALSE(c.data.shuffle);
  CHECK(c.train.out_dir == "out/a b");
  CHECK(c.data.path == (dir.path() / "corpus.txt").string());
  CHECK(c.mesh.axes == std::vector<MeshAxisConfig>{{"data", 2}});
  CHECK(c.where("train.steps") == "--set train.steps=10");
  CHECK(c.where("train.lr") == "--set train.lr=3e-4");
}

TEST_CASE("mesh.sequence_parallel loads from the file and from --set, and must be a boolean") {
  TempDir dir;
  CHECK_FALSE(load_run_config(dir.write("plain.toml", "[train]\nsteps = 1\n")).mesh.sequence_parallel);
  const std::string path = dir.write("sp.toml", "[mesh]\nsequence_parallel = true\n");
  CHECK(load_run_config(path).mesh.sequence_parallel);
  CHECK_FALSE(load_run_config(path, {"mesh.sequence_parallel=false"}).mesh.sequence_parallel);
  CHECK(error_of<ConfigError>([&] { load_run_config(path, {"mesh.sequence_parallel=2"}); }).find("mesh.sequence_parallel") !=
        std::string::npos);
}

TEST_CASE("override (--set) errors name the flag") {
  TempDir dir;
  const std::string path = dir.write("run.toml", "[train]\nsteps = 100\n");
  auto err = [&](const std::string& set) { return error_of<ConfigError>([&] { load_run_config(path, {set}); }); };
  CHECK(err("train.steps=0") == "--set train.steps=0: train.steps = 0 must be >= 1");
  CHECK(err("train.stepz=5") == "--set train.stepz=5: unknown key 'train.stepz' (did you mean 'steps'?)");
  CHECK(err("training.steps=5") == "--set training.steps=5: unknown key 'training' (did you mean 'train'?)");
  CHECK(err("train.steps=ten") == "--set train.steps=ten: train.steps must be an integer, got a string \"ten\"");
  CHECK(err("train.steps") == "--set train.steps: expected SECTION.KEY=VALUE (e.g. train.steps=10)");
  CHECK(err("=5") == "--set =5: expected SECTION.KEY=VALUE (e.g. train.steps=10)");
  CHECK(err("steps=5") == "--set steps=5: expected SECTION.KEY=VALUE (e.g. train.steps=10), got key 'steps'");
  CHECK(err("train..x=1").rfind("--set train..x=1: 'train..x' is not a valid key path", 0) == 0);
  CHECK(err("train.steps.x=1") == "--set train.steps.x=1: 'steps' is an integer in the file, not a table");
}

TEST_CASE("parse_mesh_axes reads --mesh and rejects malformed lists") {
  CHECK(parse_mesh_axes("data=2,model=4") == std::vector<MeshAxisConfig>{{"data", 2}, {"model", 4}});
  CHECK(parse_mesh_axes("model=8") == std::vector<MeshAxisConfig>{{"model", 8}});
  CHECK(parse_mesh_axes("z=1,a=3,m=2") == std::vector<MeshAxisConfig>{{"z", 1}, {"a", 3}, {"m", 2}});
  auto err = [](const std::string& text) { return error_of<ConfigError>([&] { parse_mesh_axes(text); }); };
  CHECK(err("") == "--mesh : expected NAME=SIZE[,NAME=SIZE...], e.g. data=2,model=4");
  CHECK(err("data") == "--mesh data: 'data' is not NAME=SIZE (expected e.g. data=2,model=4)");
  CHECK(err("data=2,") == "--mesh data=2,: '' is not NAME=SIZE (expected e.g. data=2,model=4)");
  CHECK(err("=2") == "--mesh =2: axis name '' must be letters, digits, '_' or '-'");
  CHECK(err("data=0") == "--mesh data=0: axis data = 0 must be >= 1");
  CHECK(err("data=-3") == "--mesh data=-3: axis data = -3 must be >= 1");
  CHECK(err("data=x") == "--mesh data=x: size of axis 'data' must be an integer, got 'x'");
  CHECK(err("data=2x") == "--mesh data=2x: size of axis 'data' must be an integer, got '2x'");
  CHECK(err("data=2,data=4") == "--mesh data=2,data=4: axis 'data' appears twice");
  CHECK(err("da ta=2") == "--mesh da ta=2: axis name 'da ta' must be letters, digits, '_' or '-'");
}

TEST_CASE("mesh flags replace the file's axes and are checked against the roles") {
  TempDir dir;
  const std::string text = "[mesh]\naxes = { data = 2 }\n[train]\nbatch_size = 4\n";
  const std::string path = dir.write("run.toml", text);
  RunConfig c = load_run_config(path);
  tpcli::config::set_mesh_axes(c, parse_mesh_axes("data=4,model=2"), "--mesh data=4,model=2");
  CHECK(c.mesh.axes == std::vector<MeshAxisConfig>{{"data", 4}, {"model", 2}});
  CHECK(c.where("mesh.axes.model") == "--mesh data=4,model=2");

  CHECK(error_of<ConfigError>([&] { tpcli::config::set_mesh_axes(c, parse_mesh_axes("data=3"), "--mesh data=3"); }) ==
        where(path, text, "4\n") + ": train.batch_size = 4 is not divisible by the data axis 'data' = 3 (mesh data=3)");
  CHECK(error_of<ConfigError>([&] { tpcli::config::set_mesh_axes(c, parse_mesh_axes("tp=2"), "--mesh tp=2"); }) ==
        "--mesh tp=2: mesh axis 'tp' (size 2) has no role: name it in mesh.data_axis, mesh.tensor_axis or "
        "mesh.expert_axis (now \"data\", \"model\", \"data\")");

  tpcli::config::set_backend(c, "zmq", "--backend zmq");
  CHECK(c.mesh.backend == tpcli::config::BackendKind::Zmq);
  tpcli::config::set_backend(c, "mpi", "--backend mpi");
  CHECK(c.mesh.backend == tpcli::config::BackendKind::Mpi);
  CHECK(error_of<ConfigError>([&] { tpcli::config::set_backend(c, "nccl", "--backend nccl"); }) ==
        "--backend nccl: backend must be \"threads\", \"zmq\" or \"mpi\", got \"nccl\"");
}

TEST_CASE("[mesh.links] loads per axis, and its errors name FILE:LINE:COL") {
  TempDir dir;
  const std::string ok = dir.write("links.toml", R"([mesh]
axes = { data = 2, model = 2 }
[mesh.links]
model = { gb_per_s = 100, latency_us = 1 }
data = { gb_per_s = 12.5, latency_us = 25, topology = "switch" }
)");
  const RunConfig config = load_run_config(ok);
  REQUIRE(config.mesh.links.size() == 2);
  CHECK(config.mesh.links.at("model") == tpcli::dist::AxisLink{100, 1, tpcli::dist::Topology::Ring});
  CHECK(config.mesh.links.at("data") == tpcli::dist::AxisLink{12.5, 25, tpcli::dist::Topology::Switch});
  CHECK(load_run_config(dir.write("none.toml", "[mesh]\naxes = { model = 2 }\n")).mesh.links.empty());

  struct Case {
    std::string text, marker, message;
  };
  const std::string mesh = "[mesh]\naxes = { data = 2, model = 2 }\n";
  const std::vector<Case> cases = {
      {mesh + "[mesh.links]\nmodel = { gb_per_s = 0 }\n", "0 }", "mesh.links.model.gb_per_s = 0 must be > 0"},
      {mesh + "[mesh.links]\nmodel = { gb_per_s = 1, latency_us = -2 }\n", "-2", "mesh.links.model.latency_us = -2 must be >= 0"},
      {mesh + "[mesh.links]\nmodel = { gb_per_s = 0.0009765625 }\n", "0.0009765625", "mesh.links.model.gb_per_s = 0.0009765625 is below 0.001 GB/s (1 MB/s, a slow WAN)"},
      {mesh + "[mesh.links]\nmodel = { gb_per_s = 20000 }\n", "20000", "mesh.links.model.gb_per_s = 20000 is beyond 10000 GB/s (10 TB/s, faster than any interconnect)"},
      {mesh + "[mesh.links]\nmodel = { gb_per_s = 1, latency_us = 2000000 }\n", "2000000", "mesh.links.model.latency_us = 2000000 is beyond 1e+06 us (1 s, more than a satellite hop)"},
      {mesh + "[mesh.links]\nmodel = { gb_per_s = 1, latency_us = inf }\n", "inf", "mesh.links.model.latency_us = inf must be finite"},
      {mesh + "[mesh.links]\nmodel = { gb_per_s = nan }\n", "nan", "mesh.links.model.gb_per_s = nan must be finite"},
      {mesh + "[mesh.links]\nmodel = { gb_per_s = 1, topology = \"torus\" }\n", "\"torus\"",
       "mesh.links.model.topology = \"torus\" must be one of \"ring\", \"switch\""},
      {mesh + "[mesh.links]\nmodel = { latency_us = 1 }\n", "model = { latency", "mesh.links.model needs gb_per_s (GB/s per direction per link)"},
      {mesh + "[mesh.links]\nmodel = { gb_per_s = 1, bw = 2 }\n", "bw", "unknown key 'mesh.links.model.bw'; known: gb_per_s, latency_us, topology"},
      {mesh + "[mesh.links]\nmodel = 5\n", "model = 5", "mesh.links.model must be a table like { gb_per_s = 100, latency_us = 1 }, got an integer"},
      {mesh + "[mesh.links]\nexpert = { gb_per_s = 1 }\n", "expert =", "mesh.links.expert names no axis of the mesh data=2,model=2"},
  };
  int n = 0;
  for (const auto& c : cases) {
    const std::string path = dir.write("bad" + std::to_string(n++) + ".toml", c.text);
    INFO(c.text);
    CHECK(error_of<ConfigError>([&] { load_run_config(path); }) == where(path, c.text, c.marker) + ": " + c.message);
  }
}

// Issue 25: init_from's checkpoint brings its dims, so a dim beside it was silently ignored.
TEST_CASE("model dims beside model.init_from are errors naming the key, from the file or --set") {
  TempDir dir;
  const std::string init = dir.write("init.bin", "x");
  dir.write("models/m.toml", TINY_MODEL);
  const std::string tail = " cannot be set with model.init_from (the dims come from " + init + ")";

  const std::string dim_text = "[model]\ninit_from = \"init.bin\"\ndim = 128\n";
  const std::string dim_path = dir.write("dim.toml", dim_text);
  CHECK(error_of<ConfigError>([&] { load_run_config(dim_path); }) == where(dim_path, dim_text, "128") + ": model.dim" + tail);

  const std::string config_text = "[model]\nconfig = \"models/m.toml\"\ninit_from = \"init.bin\"\n";
  const std::string config_path = dir.write("config.toml", config_text);
  CHECK(error_of<ConfigError>([&] { load_run_config(config_path); }) ==
        where(config_path, config_text, "\"models/m.toml\"") + ": model.config" + tail);

  // init_from from --set, a dim in the file: the file's line.
  const std::string heads_text = "[model]\nn_heads = 4\n";
  const std::string heads_path = dir.write("heads.toml", heads_text);
  CHECK(error_of<ConfigError>([&] { load_run_config(heads_path, {"model.init_from=" + init}); }) ==
        where(heads_path, heads_text, "4") + ": model.n_heads" + tail);

  // Every dim key from --set names the flag.
  const std::string bare = dir.write("bare.toml", "[model]\ninit_from = \"init.bin\"\n");
  for (const std::string set : {"dim=128", "hidden_dim=64", "n_layers=2", "n_heads=4", "n_kv_heads=2", "vocab_size=65",
                                "seq_len=64", "n_experts=4", "top_k=2", "moe_aux_loss=0.01", "expert_hidden_dim=32",
                                "capacity_factor=1.5", "shared_classifier=false", "norm_eps=1e-6", "rope_theta=1e4",
                                "head_dim=16", "qkv_bias=true", "qk_norm=true", "norm_topk_prob=false", "dense_layers=[0]",
                                "hf_architecture=Qwen3ForCausalLM"}) {
    INFO(set);
    const std::string key = "model." + set.substr(0, set.find('='));
    CHECK(error_of<ConfigError>([&] { load_run_config(bare, {"model." + set}); }) == "--set model." + set + ": " + key + tail);
  }
  CHECK(load_run_config(bare).model.init_from == init);
}
