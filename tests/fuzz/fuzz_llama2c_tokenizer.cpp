// libFuzzer target: a llama2.c tokenizer.bin, then encode/decode with it (byte fallback past a
// small vocabulary, merges of odd pieces).
#include <cstring>
#include <stdexcept>
#include <string>

#include "fuzz_input.h"
#include "text/tokenizer.h"

namespace {

// Whole records in the file: the vocab_size a model would have to claim for it to load.
int count_records(const uint8_t* data, size_t size) {
  size_t at = 4;
  int records = 0;
  while (at + 8 <= size) {
    int32_t len = 0;
    std::memcpy(&len, data + at + 4, 4);
    if (len < 0 || static_cast<size_t>(len) > size - at - 8) break;
    at += 8 + static_cast<size_t>(len);
    ++records;
  }
  return records;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tpcli::fuzz::InputFile file(data, size);
  try {
    tpcli::text::Tokenizer tokenizer(file.path(), count_records(data, size));
    // Text to encode: the file's last bytes (any byte values), and a byte no small vocabulary holds.
    const size_t n = size < 48 ? size : 48;
    const std::string text(reinterpret_cast<const char*>(data + size - n), n);
    for (const std::string& prompt : {text, std::string("\xff\xfe hello \xe2\x82\xac")}) {
      const std::vector<int> ids = tokenizer.encode(prompt, true, true);
      int previous = tpcli::text::BOS_TOKEN;
      for (int id : ids) {
        if (id < 0 || id >= tokenizer.vocab_size()) std::abort();  // encode must stay in the vocabulary
        (void)tpcli::text::Tokenizer::printable_piece(tokenizer.decode(previous, id));
        previous = id;
      }
    }
  } catch (const std::runtime_error& e) {
    tpcli::fuzz::check_error_names(e.what(), file.path());
  }
  return 0;
}
