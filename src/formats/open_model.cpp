#include "formats/open_model.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "files/regular_file.h"
#include "formats/gguf_keys.h"
#include "formats/gguf_model.h"
#include "formats/hf_model.h"
#include "formats/llama2c.h"
#include "formats/safetensors.h"

namespace tpcli::formats {

using files::require_regular_file;

bool looks_like_safetensors(const std::string& path) {
  if (path.ends_with(".safetensors")) return true;
  require_regular_file(path, "a model file");  // a FIFO would block the peek below
  std::ifstream in(path, std::ios::binary);
  char head[9] = {};
  return in.read(head, 9) && head[8] == '{';
}

OpenedModel open(const std::string& path) {
  OpenedModel opened;
  if (std::filesystem::is_directory(path)) {
    auto dir = std::make_unique<HfModelDir>(path);
    opened.hf_dir = path;
    opened.bos_token_id = dir->hf_config().bos_token_id;
    opened.eos_token_ids = dir->hf_config().eos_token_ids;
    opened.weights = std::move(dir);
  } else if (looks_like_safetensors(path)) {
    auto file = std::make_unique<SafetensorsFile>(path);
    file->config();  // a checkpoint without a model config is an input error here
    if (auto it = file->metadata().find("tokenizer"); it != file->metadata().end()) {
      std::filesystem::path tok(it->second);
      if (tok.is_relative()) tok = std::filesystem::path(path).parent_path() / tok;
      opened.tokenizer = tok.string();
    }
    opened.metadata = file->metadata();
    opened.weights = std::move(file);
  } else if (looks_like_gguf(path)) {
    auto file = std::make_unique<GgufModel>(path);
    if (const auto bos = file->file().integer(gguf_keys::BOS_ID)) opened.bos_token_id = static_cast<int>(*bos);
    for (const char* key : {gguf_keys::EOS_ID, gguf_keys::EOT_ID, gguf_keys::EOM_ID})
      if (const auto id = file->file().integer(key); id && !std::ranges::count(opened.eos_token_ids, static_cast<int>(*id)))
        opened.eos_token_ids.push_back(static_cast<int>(*id));
    if (file->file().find(gguf_keys::TOKENIZER_MODEL) || file->file().find(gguf_keys::TOKENS))
      opened.tokenizer = path;  // the file carries its tokenizer (formats/gguf_vocabulary.h)
    else
      opened.missing_tokenizer = path + ": this GGUF file holds no tokenizer (no tokenizer.ggml.model / tokenizer.ggml.tokens); "
                                        "pass one with -z/--tokenizer";
    opened.weights = std::move(file);
  } else {
    opened.weights = std::make_unique<Llama2cFile>(path);
  }
  return opened;
}

}  // namespace tpcli::formats
