// tpcli train over the ZeroMQ backend, through the binary: `tpcli launch -n P [--devices-per-process
// K] -- tpcli train CONFIG --backend zmq` gives the thread backend's per-step losses and the same
// checkpoint on the same mesh, with one writer (the rank hosting device 0); a resumed zmq run
// continues the thread run's loss sequence; a wrong process count, ranks that disagree on the
// config or on the checkpoint they resume, and a rank killed mid-run end the run with one-line
// errors and no half-written file.
#include <catch2/catch.hpp>

#include "support/run_tpcli.h"
#include "support/temp_dir.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "formats/safetensors.h"

namespace fs = std::filesystem;
using tpcli::testing::slurp;

using tpcli::testing::scratch;

namespace {

using Run = tpcli::testing::RunResult;

// `args` after the binary (a shell command line), run in the scratch folder.
Run run_tpcli(const std::string& args) {
  return tpcli::testing::run_tpcli_line(args, {.cwd = scratch().string(), .environment = "OMP_WAIT_POLICY=passive"});
}

// A tiny model on the in-repo corpus: seeded shuffling, constant lr (so a run cut short and
// resumed with more steps follows the same schedule), validation and a checkpoint every 3 steps.
// mesh "": no [mesh] section.
std::string write_config(const std::string& name, const std::string& mesh) {
  const std::string text =
      (mesh.empty() ? std::string() : "[mesh]\naxes = { " + mesh + " }\n") +
      "[model]\ndim = 32\nhidden_dim = 64\nn_layers = 2\nn_heads = 4\nn_kv_heads = 2\nseq_len = 32\n"
      "[data]\npath = \"" + std::string(TPCLI_SOURCE_DIR) + "/configs/data/verona.txt\"\ntokenizer = \"chars\"\n"
      "shuffle = true\n"
      "[train]\nsteps = 6\nbatch_size = 4\nseq_len = 16\nseed = 7\nlr = 1e-2\nwarmup_steps = 0\ndecay = \"constant\"\n"
      "eval_every = 3\neval_batches = 1\nsample_tokens = 8\nout_dir = \"unused\"\n";
  const fs::path p = scratch() / name;
  std::ofstream(p) << text;
  return p.string();
}

struct Metrics {
  std::vector<double> loss, val_loss;
};

double number_after(const std::string& line, const std::string& key) {
  const size_t at = line.find("\"" + key + "\": ");
  REQUIRE(at != std::string::npos);
  return std::strtod(line.c_str() + at + key.size() + 4, nullptr);
}

Metrics read_metrics(const fs::path& dir) {
  std::istringstream in(slurp(dir / "metrics.jsonl"));
  Metrics m;
  for (std::string line; std::getline(in, line);) {
    m.loss.push_back(number_after(line, "loss"));
    if (line.find("\"val_loss\"") != std::string::npos) m.val_loss.push_back(number_after(line, "val_loss"));
  }
  return m;
}

void check_same(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("index " << i);
    CHECK(got[i] == Approx(want[i]).epsilon(1e-5));
  }
}

std::set<std::string> files_in(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

// The sample block of a train run's stdout ("" if none).
std::string sample_of(const std::string& out) {
  const size_t begin = out.find("---- sample ----"), end = out.find("----------------", begin);
  return begin == std::string::npos || end == std::string::npos ? "" : out.substr(begin, end - begin);
}

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string train_command(const std::string& config, const fs::path& out_dir, const std::string& extra = "") {
  return std::string("train ") + config + " --set train.out_dir=" + out_dir.string() + " " + extra;
}

std::string launch(int processes, int per_process, const std::string& train, const std::string& flags = "") {
  return "launch -n " + std::to_string(processes) + " --devices-per-process " + std::to_string(per_process) + " " +
         flags + " -- tpcli " + train + " --backend zmq";
}

}  // namespace

TEST_CASE("tpcli train over zmq: the thread backend's losses and checkpoint, one writer (data=2, model=2, 2x2)") {
  struct Case {
    std::string name, mesh;
    int processes, per_process;
  };
  for (const Case& c : std::vector<Case>{{"data2", "data = 2, model = 1", 2, 1},
                                         {"model2", "data = 1, model = 2", 2, 1},
                                         {"2x2", "data = 2, model = 2", 2, 2}}) {
    INFO("mesh " << c.mesh << " as " << c.processes << " processes x " << c.per_process);
    const std::string config = write_config(c.name + ".toml", c.mesh);
    const fs::path threads_dir = scratch() / (c.name + "_threads"), zmq_dir = scratch() / (c.name + "_zmq");
    const Run threads = run_tpcli(train_command(config, threads_dir));
    INFO("threads stderr: " << threads.err);
    REQUIRE(threads.code == 0);
    const Run zmq = run_tpcli(launch(c.processes, c.per_process, train_command(config, zmq_dir)));
    INFO("zmq stderr: " << zmq.err << "\nzmq stdout: " << zmq.out);
    REQUIRE(zmq.code == 0);

    // Same losses step by step, same validation losses, same sample.
    const Metrics want = read_metrics(threads_dir), got = read_metrics(zmq_dir);
    REQUIRE(want.loss.size() == 6);
    check_same(got.loss, want.loss);
    REQUIRE(want.val_loss.size() == 2);
    check_same(got.val_loss, want.val_loss);
    CHECK(!sample_of(threads.out).empty());
    CHECK(sample_of(zmq.out) == sample_of(threads.out));

    // One writer: one set of files, one result on stdout, nothing printed by the other ranks.
    CHECK(files_in(zmq_dir) == std::set<std::string>{"latest.safetensors", "loss.svg", "metrics.jsonl"});
    CHECK(count_of(zmq.out, "checkpoint: ") == 1);
    CHECK(count_of(zmq.err, "tpcli train: ") == 1);
    CHECK(count_of(zmq.err, "[1] ") == 0);

    // The same checkpoint: every weight and AdamW moment, and the training metadata.
    const tpcli::formats::SafetensorsFile a(threads_dir / "latest.safetensors"), b(zmq_dir / "latest.safetensors");
    REQUIRE(a.names() == b.names());
    CHECK(a.metadata() == b.metadata());
    CHECK(b.metadata().at("train.step") == "6");
    double worst = 0;
    for (const std::string& name : a.names()) {
      const auto x = a.tensor(name).data, y = b.tensor(name).data;
      REQUIRE(x.size() == y.size());
      for (size_t i = 0; i < x.size(); ++i)
        worst = std::max(worst, std::abs(double(x[i]) - double(y[i])) / (1e-6 + std::abs(double(x[i]))));
    }
    CHECK(worst <= 1e-5);
  }
}

TEST_CASE("tpcli train over zmq: a config without a mesh runs on the launched world (2 processes x 2 devices)") {
  const std::string config = write_config("no_mesh.toml", "");
  const fs::path threads_dir = scratch() / "no_mesh_threads", zmq_dir = scratch() / "no_mesh_zmq";
  const Run threads = run_tpcli(train_command(config, threads_dir, "--devices 4"));
  INFO("threads stderr: " << threads.err);
  REQUIRE(threads.code == 0);
  const Run zmq = run_tpcli(launch(2, 2, train_command(config, zmq_dir)));
  INFO("zmq stderr: " << zmq.err);
  REQUIRE(zmq.code == 0);
  CHECK(zmq.err.find("on mesh model=4") != std::string::npos);
  check_same(read_metrics(zmq_dir).loss, read_metrics(threads_dir).loss);
}

TEST_CASE("tpcli train over zmq: --resume reads the shared checkpoint and continues the thread run's losses") {
  const std::string config = write_config("resume.toml", "data = 2, model = 2");
  const fs::path threads_dir = scratch() / "resume_threads", zmq_dir = scratch() / "resume_zmq";
  const Run threads = run_tpcli(train_command(config, threads_dir));
  INFO("threads stderr: " << threads.err);
  REQUIRE(threads.code == 0);

  const Run first = run_tpcli(launch(2, 2, train_command(config, zmq_dir, "--set train.steps=3")));
  INFO("first stderr: " << first.err);
  REQUIRE(first.code == 0);
  const Run second = run_tpcli(launch(2, 2, train_command(config, zmq_dir, "--resume")));
  INFO("second stderr: " << second.err);
  REQUIRE(second.code == 0);
  const Metrics want = read_metrics(threads_dir), got = read_metrics(zmq_dir);
  check_same(got.loss, want.loss);  // 3 + 3 lines: appended once, by one process
  check_same(got.val_loss, want.val_loss);
  CHECK(files_in(zmq_dir) == std::set<std::string>{"latest.safetensors", "loss.svg", "metrics.jsonl"});
}

TEST_CASE("tpcli train over zmq: start-up errors are one line per rank and write nothing") {
  const std::string config = write_config("bad.toml", "data = 2, model = 2");

  // 2 processes x 1 device for a mesh of 4.
  const fs::path out_dir = scratch() / "bad_count";
  const Run count = run_tpcli(launch(2, 1, train_command(config, out_dir)));
  INFO("stderr: " << count.err);
  CHECK(count.code == 2);
  // Each rank's error (unless the launcher stopped it first) and the launcher's note.
  const int errors = count_of(count.err, "has 4 devices but `tpcli launch` started 2 processes x 1 devices per process");
  CHECK(errors >= 1);
  CHECK(count_of(count.err, "\n") == errors + 1);
  CHECK(!fs::exists(out_dir));

  // Launched, but on threads: each rank would train the whole mesh into the same files.
  const Run threads = run_tpcli("launch -n 2 -- tpcli " + train_command(config, out_dir, "--backend threads"));
  INFO("stderr: " << threads.err);
  CHECK(threads.code == 2);
  CHECK(threads.err.find("--backend threads: backend threads, but `tpcli launch` started 2 processes") !=
        std::string::npos);
  CHECK(!fs::exists(out_dir));

  // Same command line, different config files (each rank in its own folder): the coordinator
  // refuses to start ranks that would train different things.
  fs::create_directories(scratch() / "rank0");
  fs::create_directories(scratch() / "rank1");
  fs::copy_file(write_config("a.toml", "data = 2, model = 1"), scratch() / "rank0" / "run.toml");
  fs::copy_file(write_config("b.toml", "data = 1, model = 2"), scratch() / "rank1" / "run.toml");
  const Run differ = run_tpcli("launch -n 2 --timeout 10 -- sh -c 'cd rank$TPCLI_RANK && exec " +
                               std::string(TPCLI_BINARY) + " train run.toml --backend zmq'");
  INFO("stderr: " << differ.err);
  CHECK(differ.code != 0);
  CHECK(differ.err.find("rank 1 has config hash") != std::string::npos);
  CHECK(!fs::exists(scratch() / "rank0" / "unused"));
  CHECK(!fs::exists(scratch() / "rank1" / "unused"));

  // Same command and config, but each rank's relative out_dir holds a checkpoint of another step:
  // the processes would train from different states.
  for (int rank : {0, 1}) {
    const fs::path dir = scratch() / ("resume" + std::to_string(rank));
    fs::create_directories(dir);
    fs::copy_file(config, dir / "run.toml");
    const Run made = run_tpcli("train " + (dir / "run.toml").string() + " --set train.out_dir=" + (dir / "out").string() +
                               " --set train.steps=" + std::to_string(3 + 3 * rank));
    REQUIRE(made.code == 0);
  }
  const std::string metrics_before = slurp(scratch() / "resume0" / "out" / "metrics.jsonl");
  const Run mixed = run_tpcli("launch -n 2 --devices-per-process 2 --timeout 10 -- sh -c 'cd resume$TPCLI_RANK && exec " +
                              std::string(TPCLI_BINARY) + " train run.toml --set train.out_dir=out --backend zmq --resume'");
  INFO("stderr: " << mixed.err);
  CHECK(mixed.code == 1);
  CHECK(mixed.err.find(": out/latest.safetensors: the processes resume from different steps (3 to 6): every process "
                       "must read the same checkpoint") != std::string::npos);
  CHECK(slurp(scratch() / "resume0" / "out" / "metrics.jsonl") == metrics_before);
}

TEST_CASE("tpcli train over zmq: a rank killed mid-run ends the run, and no file is half-written") {
  const std::string config = write_config("kill.toml", "data = 2, model = 1");
  const fs::path out_dir = scratch() / "kill";
  // Rank 1 is killed (SIGKILL) once rank 0 has logged 30 steps of a long run (or after 15 s);
  // rank 0 saves a checkpoint every 3 steps.
  const std::string train = train_command(config, out_dir, "--set train.steps=100000 --backend zmq");
  const std::string logged = "$(cat " + (out_dir / "metrics.jsonl").string() + " 2>/dev/null | wc -l)";
  const Run r = run_tpcli("launch -n 2 --timeout 10 -- sh -c 'if [ $TPCLI_RANK = 1 ]; then (i=0; until [ " + logged +
                          " -ge 30 ] || [ $i -ge 300 ]; do sleep 0.05; i=$((i+1)); done; kill -9 $$) "
                          ">/dev/null 2>&1 & fi; exec " + std::string(TPCLI_BINARY) + " " + train + "'");
  INFO("stderr: " << r.err);
  CHECK(r.code == 137);
  CHECK(r.seconds < 25);
  CHECK(r.err.find("rank 1 was killed by signal 9") != std::string::npos);
  // Rank 0 says one line of its own: either that it lost rank 1, or, when rank 1 had already sent
  // its share of the next step's stop vote before it died, that it stopped on the launcher's
  // SIGTERM after a step both ranks agreed on (exit 130, checkpoint saved).
  const int lost = count_of(r.err, "[0] tpcli: device 0: zmq: lost rank 1");
  const int stopped = count_of(r.err, "[0] interrupted: stopped after step ");
  CHECK(lost + stopped == 1);
  CHECK(count_of(r.err, "[0] tpcli: ") == lost);
  CHECK(r.err.find("terminate called") == std::string::npos);
  REQUIRE(fs::exists(out_dir / "latest.safetensors"));
  CHECK(files_in(out_dir) == std::set<std::string>{"latest.safetensors", "loss.svg", "metrics.jsonl"});
  const tpcli::formats::SafetensorsFile ckpt(out_dir / "latest.safetensors");  // whole: it loads
  CHECK(std::stoll(ckpt.metadata().at("train.step")) % 3 == 0);
}

// Issue 25: the launcher's SIGTERM reached ranks whose step was held for hours by a modelled link;
// they only meant to stop after the step, and the launcher had to SIGKILL them. Now each rank's
// wait in the collective ends a second or two later, with one line, inside the launcher's grace.
TEST_CASE("tpcli train over zmq: SIGTERM ends ranks stuck in a collective on a link of hours, before any SIGKILL") {
  const std::string config = write_config("slow_link.toml", "data = 1, model = 2");
  const fs::path out_dir = scratch() / "slow_link";
  const std::string train =
      train_command(config, out_dir, "--set train.steps=100000 --link model=0.001,1000000 --backend zmq");
  // timeout sends the launcher (alone: --foreground) SIGTERM after 5 s; the launcher passes it on to
  // the ranks, and would SIGKILL them 3 s later.
  const Run r = tpcli::testing::run_tpcli_line(
      "launch -n 2 -- tpcli " + train,
      {.cwd = scratch().string(), .environment = "OMP_WAIT_POLICY=passive", .launcher = "timeout --foreground -s TERM 5"});
  INFO("stderr: " << r.err);
  CHECK(r.code == 124);  // timeout's own code: the launcher was stopped
  CHECK(r.seconds < 5 + 3);
  CHECK(r.err.find("was killed by signal 9") == std::string::npos);
  // The rank whose watcher fires first says so; the other may name its abort instead.
  CHECK(count_of(r.err, "] tpcli train: stopped by SIGTERM: ") >= 1);
  CHECK(!fs::exists(out_dir / "latest.safetensors"));
}
