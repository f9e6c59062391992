// libFuzzer target: a Hugging Face model directory's JSON files as read before any tensor:
// config.json (architecture, dims, rope_scaling, quantization, token ids), generation_config.json
// and tokenizer_config.json (special tokens, chat template), and model.safetensors.index.json
// (its weight_map, the shard names it lists). The input is the four files separated by NUL bytes;
// a missing part is an absent file.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>

#include "formats/hf_model.h"
#include "fuzz_input.h"
#include "text/chat_template.h"
#include "text/hf_tokenizer.h"

namespace fs = std::filesystem;

namespace {

// One folder per fuzzing process, rewritten for every input and removed when the process exits
// (libFuzzer ends a timed run with exit(), which runs static destructors).
struct FuzzFolder {
  fs::path path = fs::temp_directory_path() / ("tpcli-fuzz-hf-config-" + std::to_string(::getpid()));
  FuzzFolder() { fs::create_directories(path); }
  ~FuzzFolder() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

const fs::path& model_dir() {
  static const FuzzFolder folder;
  return folder.path;
}

void write_or_remove(const fs::path& path, std::string_view bytes, bool present) {
  if (!present) {
    std::error_code ignored;
    fs::remove(path, ignored);
    return;
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  const char* names[] = {"config.json", "generation_config.json", "tokenizer_config.json", "model.safetensors.index.json"};
  for (int i = 0; i < 4; ++i) {
    const size_t end = rest.find('\0');
    write_or_remove(model_dir() / names[i], rest.substr(0, end), i == 0 || !rest.empty());
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
  }
  const std::string dir = model_dir().string();
  try {
    const tpcli::formats::HfConfig c = tpcli::formats::read_hf_config(dir);
    (void)c.llama.parameter_count();
  } catch (const std::runtime_error& e) {
    tpcli::fuzz::check_error_names(e.what(), dir);
  }
  if (fs::exists(model_dir() / "model.safetensors.index.json")) {
    try {  // config.json again, then the index: its weight_map and every shard it names
      const tpcli::formats::HfModelDir model(dir);
    } catch (const std::runtime_error& e) {
      tpcli::fuzz::check_error_names(e.what(), dir);
    }
  }
  const std::string tokenizer_config = (model_dir() / "tokenizer_config.json").string();
  if (!fs::exists(tokenizer_config)) return 0;
  tpcli::text::TokenizerConfig tc;
  try {
    tc = tpcli::text::read_tokenizer_config(tokenizer_config);
  } catch (const std::runtime_error& e) {
    tpcli::fuzz::check_error_names(e.what(), tokenizer_config);
    return 0;
  }
  if (!tc.chat_template) return 0;
  try {  // its chat template, compiled and rendered (these errors name the template, not a file)
    const auto chat = tpcli::text::chat_template_from_source(*tc.chat_template, "chat_template");
    const tpcli::text::ChatMessage turns[] = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"},
                                               {"user", "Bye"}};
    (void)tpcli::text::render_chat(chat, turns, {tc.bos_token, tc.eos_token}, true);
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
