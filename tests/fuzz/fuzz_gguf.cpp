// libFuzzer target: a GGUF file's container (formats/gguf_file.h): the header, metadata keys and
// values (arrays, strings), tensor descriptions, alignment and the tensors' places in the file.
#include <stdexcept>

#include "formats/gguf_file.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tpcli::fuzz::InputFile file(data, size);
  try {
    const tpcli::formats::gguf::GgufFile gguf(file.path());
    unsigned sum = 0;
    for (const auto& t : gguf.tensors()) sum += static_cast<unsigned>(t.data.front()) + static_cast<unsigned>(t.data.back());
    // Typed reads of the keys a model loader asks for, whatever their type in this file.
    for (const char* key : {"general.architecture", "tokenizer.ggml.model", "llama.block_count", "tokenizer.ggml.tokens",
                            "tokenizer.ggml.scores", "tokenizer.ggml.token_type"}) {
      try {
        (void)gguf.string(key);
      } catch (const std::runtime_error& e) {
        tpcli::fuzz::check_error_names(e.what(), file.path());
      }
      try {
        (void)gguf.integer(key);
        (void)gguf.numbers(key);
      } catch (const std::runtime_error& e) {
        tpcli::fuzz::check_error_names(e.what(), file.path());
      }
    }
    (void)sum;
  } catch (const std::runtime_error& e) {
    tpcli::fuzz::check_error_names(e.what(), file.path());
  }
  return 0;
}
