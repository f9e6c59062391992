#include "cli/prompt_text.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "cli/commands.h"
#include "files/regular_file.h"

namespace tpcli::cli {

namespace {

std::string too_long(const std::string& path, int seq_len) {
  return path + ": more than " + std::to_string(max_text_bytes(seq_len)) + " bytes, more text than the model's context of " +
         std::to_string(seq_len) + " positions can hold";
}

}  // namespace

int64_t max_text_bytes(int seq_len) { return static_cast<int64_t>(seq_len) * MAX_TEXT_BYTES_PER_POSITION; }

std::string read_prompt_file(const std::string& path, int seq_len) {
  try {
    files::require_regular_file(path, "a prompt file");  // a FIFO would block, a device never end
  } catch (const std::runtime_error& e) {
    throw UsageError(e.what());
  }
  const auto limit = static_cast<size_t>(max_text_bytes(seq_len));
  std::error_code ec;
  if (std::filesystem::file_size(path, ec) > limit && !ec) throw UsageError(too_long(path, seq_len));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(path + ": cannot open the prompt file: " + std::strerror(errno));
  // Reads on while the text fits: a file that grows meanwhile is still refused, not read whole.
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
    text.append(chunk, static_cast<size_t>(in.gcount()));
    if (text.size() > limit) throw UsageError(too_long(path, seq_len));
  }
  if (in.bad()) throw UsageError(path + ": cannot read the prompt file: " + std::strerror(errno));
  return text;
}

void require_prompt_fits(const std::string& source, size_t tokens, int seq_len) {
  if (tokens <= static_cast<size_t>(seq_len)) return;
  throw UsageError(source + ": the prompt is " + std::to_string(tokens) + " tokens, more than the model's context of " +
                   std::to_string(seq_len) + " positions");
}

std::vector<int> parse_token_ids(const std::string& flag, const std::string& text, int vocab_size, int seq_len) {
  const std::string where = flag + " " + (text.empty() ? "''" : text);
  if (text.empty()) throw UsageError(where + ": no token ids (give them comma-separated, e.g. " + flag + " 5,17,3)");
  std::vector<int> ids;
  size_t begin = 0;
  while (true) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, comma - begin);
    long long id = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size())
      throw UsageError(where + ": '" + item + "' (item " + std::to_string(ids.size() + 1) + ") is not an integer token id");
    if (id < 0 || id >= vocab_size)
      throw UsageError(where + ": token id " + item + " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    ids.push_back(static_cast<int>(id));
    if (comma == text.size()) break;
    begin = comma + 1;
  }
  if (ids.size() > static_cast<size_t>(seq_len))
    throw UsageError(where + ": " + std::to_string(ids.size()) + " token ids, more than the model's context of " +
                     std::to_string(seq_len) + " positions");
  return ids;
}

}  // namespace tpcli::cli
