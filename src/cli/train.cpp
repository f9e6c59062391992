// tpcli train CONFIG [--resume] — train a model split over a mesh (data x tensor parallel).
//
// Everything the config names is checked before the first step: the mesh against the heads and
// the batch, the corpus, the tokenizer against the vocabulary. Errors are one line (exit 2).
// Ctrl-C (or SIGTERM) stops after the current step, saves a checkpoint and exits with 130; the
// same signal again exits at once (128 + the signal). A step that cannot finish, a device stuck in
// a collective (a modelled link of hours, a hung peer), ends about a second later with one line and
// 128 + the signal, saving nothing: it has no whole step to save (distributed/collective_watch.h).
//
// Over ZeroMQ (`tpcli launch -n P [--devices-per-process K] -- tpcli train CONFIG --backend zmq`,
// or [mesh] backend = "zmq"), every rank runs this command on its share of the mesh (P*K devices);
// only the rank hosting device 0 writes out_dir and prints. On Ctrl-C the launcher also sends
// SIGTERM to every rank: the ranks agree on the step to stop at, as with threads.
#include <CLI/CLI.hpp>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "config/model_config.h"
#include "config/train_setup.h"
#include "distributed/runtime.h"
#include "distributed/trace.h"
#include "train/loop.h"

namespace tpcli::cli {

namespace {

std::atomic<bool> stop_requested{false};
constexpr int INTERRUPTED_EXIT_CODE = 128 + SIGINT;  // 130, on every backend
std::atomic<bool> got_sigint{false}, got_sigterm{false};
std::atomic<int> first_stop_signal{0};  // the signal that asked first, for the exit code
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free,
              "a signal handler may only touch lock-free atomics");

// Each signal counts on its own: Ctrl-C under `tpcli launch` brings a SIGINT (the terminal) and a
// SIGTERM (the launcher), and that is still a first request.
extern "C" void on_stop_signal(int sig) {
  if ((sig == SIGINT ? got_sigint : got_sigterm).exchange(true)) std::_Exit(128 + sig);  // again: leave now
  int none = 0;
  first_stop_signal.compare_exchange_strong(none, sig);
  stop_requested = true;
}

// A stop that came while a device could not leave a collective: one line, and the exit code of
// the signal, as a second signal gives (there is no checkpoint of a half-done step).
[[noreturn]] void exit_stopped_in_collective(const dist::RunStopped& e) {
  const int sig = first_stop_signal.load();
  std::fprintf(stderr, "tpcli train: stopped by %s: %s; the unfinished step was not saved\n",
               sig == SIGTERM ? "SIGTERM" : "Ctrl-C (SIGINT)", e.what());
  throw CLI::RuntimeError(128 + (sig ? sig : SIGINT));
}

// train::train on a thread that blocks SIGINT and SIGTERM, as do the device, ZeroMQ and BLIS threads
// it starts: the signals reach only this thread, waiting in join, so no system call of theirs
// fails with EINTR (a ZeroMQ poll would throw).
train::TrainResult train_stoppable(const train::TrainOptions& o) {
  struct sigaction action {}, old_int{}, old_term{};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, &old_int);
  sigaction(SIGTERM, &action, &old_term);
  sigset_t stop_signals, previous;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, &previous);
  train::TrainResult result;
  std::exception_ptr error;
  try {
    std::thread worker([&] {
      try {
        result = train::train(o);
      } catch (...) {
        error = std::current_exception();
      }
    });
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    worker.join();
  } catch (...) {  // could not start the thread
    error = std::current_exception();
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  if (!error) return result;
  try {
    std::rethrow_exception(error);
  } catch (const dist::RunStopped& e) {
    exit_stopped_in_collective(e);
  }
}

// Prompt for the final hint: the first characters of the corpus's first line, like "ROMEO:".
std::string suggested_prompt(const std::string& text) {
  for (const char* name : {"ROMEO:", "JULIET:", "Once upon a time"})
    if (text.find(name) != std::string::npos) return name;
  std::string prompt = text.substr(0, std::min<size_t>(text.find('\n'), 16));
  for (char& c : prompt)
    if (c == '"' || c == '\\' || c == '$' || c == '`') c = ' ';
  return prompt;
}

void setup_train(CLI::App& sub) {
  auto flags = add_run_flags(sub);
  auto path = std::make_shared<std::string>();
  auto resume = std::make_shared<bool>(false);
  sub.add_option("config", *path, "run config (TOML), e.g. configs/tiny.toml")->required()->type_name("CONFIG");
  sub.add_flag("--resume", *resume, "continue from out_dir/latest.safetensors (same loss sequence as an uninterrupted run)");
  sub.callback([flags, path, resume] {
    const config::RunConfig config = load_config(*path, *flags);
    config::Prepared prepared = config::prepare_training(config, *resume);
    train::TrainOptions& o = prepared.options;
    o.run.stop = &stop_requested;
    o.run.links = config.mesh.links;
    const bool writer = train::is_writer_process(o);  // the other ranks of a zmq run print nothing
    std::optional<dist::Trace> trace;
    if (!flags->trace.empty()) {
      check_trace_path(flags->trace, !o.run.local_ranks.empty());
      o.run.trace = &trace.emplace();
    }

    if (writer) {
      std::string data;  // what the run trains on
      if (o.sft) {
        auto count = [](const auto& examples) { return examples ? static_cast<long long>(examples->size()) : 0LL; };
        data = std::to_string(count(o.sft->train)) + " train / " + std::to_string(count(o.sft->val)) + " val " +
               std::string(config::to_string(config.data.format)) + " examples";
      } else {
        data = std::to_string(o.corpus->train->size()) + " train / " +
               std::to_string(o.corpus->val ? o.corpus->val->size() : 0) + " val tokens";
      }
      std::fprintf(stderr, "tpcli train: %s on mesh %s (data axis '%s', tensor axis '%s'), %lld parameters, %s\n",
                   config.path.c_str(), o.mesh.to_string().c_str(), o.data_axis.c_str(), o.tensor_axis.c_str(),
                   static_cast<long long>(o.model.parameter_count()), data.c_str());
    }
    train::TrainResult result = train_stoppable(o);
    if (trace) write_trace(*trace, flags->trace, "steps");
    if (!writer) {
      if (result.interrupted) throw CLI::RuntimeError(INTERRUPTED_EXIT_CODE);
      return;
    }

    if (!result.sample.empty()) std::printf("---- sample ----\n%s\n----------------\n", result.sample.c_str());
    const auto& last = result.records;
    if (!last.empty()) {
      std::printf("steps %lld..%lld in %.1f s, final loss %.4f", static_cast<long long>(result.start_step),
                  static_cast<long long>(result.end_step), result.seconds, last.back().loss);
      for (auto it = last.rbegin(); it != last.rend(); ++it)
        if (it->val_loss) {
          std::printf(", val loss %.4f (step %lld)", *it->val_loss, static_cast<long long>(it->step));
          break;
        }
      std::printf("\n");
    }
    if (!o.out_dir.empty() && std::filesystem::exists(std::filesystem::path(o.out_dir) / "loss.svg"))
      std::printf("loss curves: %s/loss.svg\n", o.out_dir.c_str());
    if (!result.checkpoint.empty()) {
      std::printf("checkpoint: %s\n", result.checkpoint.c_str());
      // A LoRA run's model is the base with the PEFT folder written beside the checkpoint.
      const std::string model = o.lora ? o.base_name + " --adapter " + (std::filesystem::path(o.out_dir) / "adapter").string()
                                       : result.checkpoint;
      if (o.sft && config.data.format != config::DataFormat::JsonlText && config.data.val_path)
        std::printf("evaluate:   tpcli eval --model %s --data %s%s\n", model.c_str(), config.data.val_path->c_str(),
                    config.data.chat_template ? (" --template " + *config.data.chat_template).c_str() : "");
      if (config.data.format == config::DataFormat::Text)
        std::printf("generate:   tpcli infer --model %s -i \"%s\" -n 200\n", model.c_str(),
                    suggested_prompt(prepared.corpus_text).c_str());
      else
        std::printf("generate:   tpcli infer --model %s -n 200\n", model.c_str());
    }
    if (result.interrupted)
      std::printf("interrupted at step %lld: to continue, run the same command with --resume\n",
                  static_cast<long long>(result.end_step));
    std::fflush(stdout);
    if (result.interrupted) throw CLI::RuntimeError(INTERRUPTED_EXIT_CODE);  // as a shell reports Ctrl-C
  });
}

const bool registered = register_command({"train", "Train a model from a TOML run config", setup_train});

}  // namespace

}  // namespace tpcli::cli
