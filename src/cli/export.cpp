// tpcli export --to llama2c --model CKPT --out PATH.bin — a checkpoint (tpcli .safetensors, e.g.
// runs/NAME/latest.safetensors) as a llama2.c .bin that llama2.c's `run` and `tpcli infer` load.
// Only the weights travel: the optimizer state stays behind, and the tokenizer must be given to
// `run` separately (a chars or bytes vocabulary has no llama2.c tokenizer.bin; a model trained with
// a tokenizer.bin uses that file).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <stdexcept>

#include "cli/commands.h"
#include "cli/model_file.h"
#include "model/llama2c.h"

namespace tpcli::cli {

namespace {

struct ExportFlags {
  std::string to = "llama2c";
  std::string model;
  std::string out;
};

void run_export(const ExportFlags& f) {
  if (f.to != "llama2c") throw UsageError("--to " + f.to + ": the only export format is llama2c");
  OpenedModel opened = open_model(f.model);
  try {
    model::write_llama2c(f.out, *opened.weights);
  } catch (const std::invalid_argument& e) {
    throw UsageError(f.model + ": " + e.what());
  }
  std::fprintf(stderr, "wrote %s (llama2.c format, %lld parameters)\n", f.out.c_str(),
               static_cast<long long>(opened.weights->config().parameter_count()));
  auto kind = opened.metadata.find("tokenizer.kind");
  if (kind != opened.metadata.end() && kind->second != "llama2c")
    std::fprintf(stderr, "note: the model uses a %s vocabulary; llama2.c's run needs a tokenizer.bin, which it has none of\n",
                 kind->second.c_str());
}

void setup_export(CLI::App& sub) {
  auto flags = std::make_shared<ExportFlags>();
  sub.add_option("--to", flags->to, "format to write (llama2c)")->capture_default_str();
  sub.add_option("--model", flags->model, "checkpoint to export (.safetensors or .bin)")->required();
  sub.add_option("--out", flags->out, "output file, e.g. model.bin")->required();
  sub.callback([flags] { run_export(*flags); });
}

const bool registered = register_command({"export", "Convert a checkpoint to llama2.c's .bin format", setup_export});

}  // namespace

}  // namespace tpcli::cli
