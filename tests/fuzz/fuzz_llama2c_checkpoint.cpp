// libFuzzer target: a llama2.c checkpoint (.bin): the 7-int header, its limits and the file size it implies.
#include <cmath>
#include <stdexcept>

#include "formats/llama2c.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tpcli::fuzz::InputFile file(data, size);
  try {
    tpcli::formats::Llama2cFile model(file.path());
    double sum = 0;  // touch every parameter's span: a view past the map would fault under ASan
    for (const auto& spec : tpcli::model::llama_parameters(model.config())) {
      auto values = model.get(spec.name);
      if (!values.empty()) sum += values.front() + values.back();
    }
    if (std::isnan(sum)) return 0;
  } catch (const std::runtime_error& e) {
    tpcli::fuzz::check_error_names(e.what(), file.path());
  }
  return 0;
}
