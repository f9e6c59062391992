// tpcli train CONFIG [--resume] — train a model split over a mesh (data x tensor parallel).
//
// Everything the config names is checked before the first step: the mesh against the heads and
// the batch, the corpus, the tokenizer against the vocabulary. Errors are one line (exit 2).
// Ctrl-C stops after the current step, saves a checkpoint and exits cleanly.
#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/model_from_config.h"
#include "train/loop.h"
#include "train/train_setup.h"

namespace tpcli::cli {

namespace {

std::atomic<bool> stop_requested{false};

extern "C" void on_sigint(int) {
  if (stop_requested.exchange(true)) std::_Exit(130);  // a second Ctrl-C: leave now
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
    train::Prepared prepared = train::prepare(config, *resume, [&](std::optional<int> tokenizer_vocab) {
      return model_from_config(config.model, tokenizer_vocab);
    });
    train::TrainOptions& o = prepared.options;
    o.stop = &stop_requested;

    std::fprintf(stderr, "tpcli train: %s on mesh %s (data axis '%s', tensor axis '%s'), %lld parameters, %zu train / %zu val tokens\n",
                 config.path.c_str(), o.mesh.to_string().c_str(), o.data_axis.c_str(), o.tensor_axis.c_str(),
                 static_cast<long long>(o.model.parameter_count()), o.corpus->train.size(), o.corpus->val.size());
    auto previous = std::signal(SIGINT, on_sigint);
    train::TrainResult result = train::train(o);
    std::signal(SIGINT, previous);

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
    if (!result.checkpoint.empty()) {
      std::printf("checkpoint: %s\n", result.checkpoint.c_str());
      std::printf("generate:   tpcli infer --model %s -i \"%s\" -n 200\n", result.checkpoint.c_str(),
                  suggested_prompt(prepared.corpus_text).c_str());
    }
    if (result.interrupted)
      std::printf("interrupted at step %lld: to continue, run the same command with --resume\n",
                  static_cast<long long>(result.end_step));
    std::fflush(stdout);
  });
}

const bool registered = register_command({"train", "Train a model from a TOML run config", setup_train});

}  // namespace

}  // namespace tpcli::cli
