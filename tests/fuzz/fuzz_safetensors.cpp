// libFuzzer target: a safetensors file: the 8-byte length, the JSON header, tensor entries
// (dtype, shape, offsets), the "model.*" metadata and the tokenizer keys of a training checkpoint.
#include <stdexcept>

#include "formats/safetensors.h"
#include "fuzz_input.h"
#include "train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tpcli::fuzz::InputFile file(data, size);
  try {
    tpcli::formats::SafetensorsFile st(file.path());
    double sum = 0;
    for (const std::string& name : st.names()) {
      auto values = st.tensor(name).data;
      if (!values.empty()) sum += values.front() + values.back();
    }
    if (st.has_model_config()) {
      for (const auto& spec : tpcli::model::llama_parameters(st.config())) {
        auto values = st.get(spec.name);
        if (!values.empty()) sum += values.back();
      }
      // A training checkpoint's tokenizer keys (a llama2c tokenizer path is not opened: it names
      // files outside the input).
      auto kind = st.metadata().find("tokenizer.kind");
      if (kind != st.metadata().end() && kind->second != "llama2c")
        (void)tpcli::train::tokenizer_from_metadata(st.metadata(), file.path(), st.config().vocab_size);
    }
    (void)sum;
  } catch (const std::runtime_error& e) {
    tpcli::fuzz::check_error_names(e.what(), file.path());
  } catch (const std::invalid_argument& e) {
    // tokenizer_from_metadata's vocabulary errors (chars tokenizer) do not know the file.
  }
  return 0;
}
