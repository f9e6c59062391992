// libFuzzer target: a TOML run config through the whole schema and its validation.
#include <stdexcept>

#include "config/run_config.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tpcli::fuzz::InputFile file(data, size);
  try {
    (void)tpcli::config::load_run_config(file.path());
  } catch (const tpcli::config::ConfigError& e) {
    tpcli::fuzz::check_error_names(e.what(), file.path());
  }
  return 0;
}
