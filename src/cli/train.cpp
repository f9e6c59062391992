// tpcli train CONFIG — stub: validates the config (and the flags that change it) exactly as the
// real trainer will, then says training does not exist yet. The training helper replaces this file.
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/model_from_config.h"

namespace tpcli::cli {

namespace {

void setup_train(CLI::App& sub) {
  auto flags = add_run_flags(sub);
  auto path = std::make_shared<std::string>();
  sub.add_option("config", *path, "run config (TOML), e.g. configs/tiny.toml")->required()->type_name("CONFIG");
  sub.callback([flags, path] {
    const config::RunConfig config = load_config(*path, *flags);
    if (!config.model.init_from) {
      // vocab_size may come from the corpus tokenizer: stand in with the byte vocabulary until then.
      model_from_config(config.model, config.model.vocab_size ? std::nullopt : std::optional<int>(256));
    }
    to_mesh(config.mesh);
    throw UsageError("training is not implemented yet");
  });
}

const bool registered = register_command({"train", "Train a model from a TOML run config", setup_train});

}  // namespace

}  // namespace tpcli::cli
