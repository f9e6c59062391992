// libFuzzer target: a token shard (llm.c's format): the 256-int32 header, the magic/version pair,
// the token count against the file size, and reading every token through the split's reader.
#include <stdexcept>
#include <vector>

#include "fuzz_input.h"
#include "train/token_shards.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tpcli::fuzz::InputFile file(data, size);
  try {
    const tpcli::train::ShardTokens split(file.path(), 65536);
    std::vector<int> tokens(static_cast<size_t>(split.size()));  // at most size / 2 tokens
    split.read(0, tokens);
  } catch (const std::runtime_error& e) {
    tpcli::fuzz::check_error_names(e.what(), file.path());
  }
  return 0;
}
