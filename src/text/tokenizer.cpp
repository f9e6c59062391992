#include "files/atomic_file.h"
#include "files/regular_file.h"
#include "text/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <queue>
#include <stdexcept>

namespace tpcli::text {

using files::require_regular_file;
using files::write_atomically;

namespace {

// llama2.c's merge loop starts from best_score = -1e10 and needs a strictly higher score.
constexpr float MIN_MERGE_SCORE = -1e10f;

template <typename T>
bool read_pod(const std::string& bytes, size_t& offset, T& value) {
  if (bytes.size() - offset < sizeof(T)) return false;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  offset += sizeof(T);
  return true;
}

// run.c uses C strings: a piece ends at its first NUL.
std::string c_string(std::string s) {
  auto nul = s.find('\0');
  if (nul != std::string::npos) s.resize(nul);
  return s;
}

bool is_hex(char ch) { return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F'); }
int hex_value(char ch) { return ch <= '9' ? ch - '0' : (ch | 0x20) - 'a' + 10; }

// Every byte as a one-byte string (run.c's byte_pieces).
const std::array<char, 256> BYTE_PIECES = [] {
  std::array<char, 256> bytes{};
  for (int b = 0; b < 256; ++b) bytes[static_cast<size_t>(b)] = static_cast<char>(b);
  return bytes;
}();

}  // namespace

Tokenizer::Tokenizer(const std::string& path, std::optional<int> vocab_size) {
  require_regular_file(path, "a llama2.c tokenizer file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open tokenizer file");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t offset = 0;
  int32_t max_len = 0;
  if (!read_pod(bytes, offset, max_len) || max_len < 1 || max_len > (1 << 16))
    throw std::runtime_error(path + ": not a llama2.c tokenizer (max_token_length = " + std::to_string(max_len) + ")");
  max_token_length_ = max_len;
  while (offset < bytes.size()) {
    const size_t record = pieces_.size();
    float score = 0;
    int32_t len = 0;
    if (!read_pod(bytes, offset, score) || !read_pod(bytes, offset, len))
      throw std::runtime_error(path + ": record " + std::to_string(record) + " is truncated");
    if (len < 0 || len > max_len || bytes.size() - offset < static_cast<size_t>(len))
      throw std::runtime_error(path + ": record " + std::to_string(record) + " has length " + std::to_string(len) +
                               " (max_token_length " + std::to_string(max_len) + ", " +
                               std::to_string(bytes.size() - offset) + " bytes left)");
    pieces_.push_back(c_string(bytes.substr(offset, static_cast<size_t>(len))));
    scores_.push_back(score);
    offset += static_cast<size_t>(len);
  }
  if (vocab_size && static_cast<int>(pieces_.size()) != *vocab_size)
    throw std::runtime_error(path + ": tokenizer holds " + std::to_string(pieces_.size()) +
                             " tokens but the model's vocab_size is " + std::to_string(*vocab_size) +
                             " (wrong tokenizer for this model? pass the right one with -z)");
  build_index(path);
}

Tokenizer::Tokenizer(std::vector<std::string> pieces, std::vector<float> scores, int max_token_length)
    : scores_(std::move(scores)), max_token_length_(max_token_length) {
  if (pieces.size() != scores_.size()) throw std::invalid_argument("tokenizer: pieces and scores differ in length");
  for (auto& p : pieces) pieces_.push_back(c_string(std::move(p)));
  build_index("tokenizer");
}

void Tokenizer::build_index(const std::string& origin) {
  origin_ = origin;
  if (pieces_.size() < 3) throw std::runtime_error(origin + ": a tokenizer needs at least <unk>, BOS and EOS");
  index_.reserve(pieces_.size() * 2);
  // First occurrence wins on duplicate pieces (llama2.c's bsearch would pick any of them).
  for (size_t i = 0; i < pieces_.size(); ++i) index_.emplace(pieces_[i], static_cast<int>(i));
}

int Tokenizer::lookup(std::string_view s) const {
  auto it = index_.find(s);
  return it == index_.end() ? -1 : it->second;
}

std::vector<int> Tokenizer::encode(std::string_view text, bool bos, bool eos) const {
  // run.c stops at the first NUL.
  if (auto nul = text.find('\0'); nul != std::string_view::npos) text = text.substr(0, nul);
  std::vector<int> tokens;
  tokens.reserve(text.size() + 3);
  if (bos) tokens.push_back(BOS_TOKEN);
  if (!text.empty()) {
    const int dummy_prefix = lookup(" ");
    if (dummy_prefix < 0) throw std::runtime_error(origin_ + ": no \" \" token for the dummy prefix");
    tokens.push_back(dummy_prefix);
  }

  // Code points (at most 4 bytes: a leading byte plus up to 3 continuation bytes) or byte fallback.
  const auto is_continuation = [](char ch) { return (static_cast<unsigned char>(ch) & 0xC0) == 0x80; };
  for (size_t i = 0; i < text.size();) {
    size_t len = 1;
    while (i + len < text.size() && is_continuation(text[i + len]) && len < 4) ++len;
    const int id = lookup(text.substr(i, len));
    if (id >= 0) {
      tokens.push_back(id);
    } else {
      // <0xNN> is id NN + 3 in a full llama2.c vocabulary; a smaller one has no such piece: <unk>.
      for (size_t j = 0; j < len; ++j) {
        const int byte_id = static_cast<unsigned char>(text[i + j]) + 3;
        tokens.push_back(byte_id < vocab_size() ? byte_id : UNK_TOKEN);
      }
    }
    i += len;
  }

  // Greedy merges: a doubly linked list over the tokens and a max-heap of candidate pairs keyed by
  // (score, leftmost position). A merged token keeps its left node, so node order = position order
  // and the heap's tie-break equals run.c's "first best pair from the left". Stale candidates
  // (a side already merged away or changed) are skipped when popped.
  const int n = static_cast<int>(tokens.size());
  std::vector<int> prev(n), next(n);  // [n] list links; -1 = none
  std::vector<char> alive(n, 1);      // [n]
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    float score;
    int left, left_id, right_id, merged;
    bool operator<(const Candidate& o) const {  // priority_queue pops the "largest"
      if (score != o.score) return score < o.score;
      return left > o.left;
    }
  };
  std::priority_queue<Candidate> heap;
  std::string pair;
  auto consider = [&](int left) {
    if (left < 0 || next[left] < 0) return;
    const int right = next[left];
    pair.assign(pieces_[static_cast<size_t>(tokens[left])]);
    pair.append(pieces_[static_cast<size_t>(tokens[right])]);
    const int id = lookup(pair);
    if (id >= 0 && scores_[static_cast<size_t>(id)] > MIN_MERGE_SCORE)
      heap.push({scores_[static_cast<size_t>(id)], left, tokens[left], tokens[right], id});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int right = next[c.left];
    if (!alive[c.left] || right < 0 || tokens[c.left] != c.left_id || tokens[right] != c.right_id) continue;
    tokens[c.left] = c.merged;
    alive[right] = 0;
    next[c.left] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.left;
    consider(prev[c.left]);
    consider(c.left);
  }
  std::vector<int> out;
  out.reserve(tokens.size() + 1);
  for (int i = n > 0 ? 0 : -1; i >= 0; i = next[i]) out.push_back(tokens[i]);
  if (eos) out.push_back(EOS_TOKEN);
  return out;
}

std::string_view Tokenizer::decode(int prev_token, int token) const {
  std::string_view piece = pieces_.at(static_cast<size_t>(token));
  if (prev_token == BOS_TOKEN && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
  // "<0xNN>" (run.c parses it with sscanf "<0x%02hhX>": one or two hex digits suffice).
  if (piece.size() >= 4 && piece.substr(0, 3) == "<0x" && is_hex(piece[3])) {
    int value = hex_value(piece[3]);
    if (piece.size() >= 5 && is_hex(piece[4])) value = value * 16 + hex_value(piece[4]);
    return std::string_view(BYTE_PIECES.data() + value, value == 0 ? 0 : 1);  // byte 0: an empty C string
  }
  return piece;
}

std::string_view Tokenizer::printable_piece(std::string_view piece) {
  if (piece.size() == 1) {
    // isprint || isspace in the C locale.
    const auto b = static_cast<unsigned char>(piece[0]);
    const bool printable = b >= 0x20 && b < 0x7F;
    const bool space = b == ' ' || (b >= '\t' && b <= '\r');
    if (!printable && !space) return {};
  }
  return piece;
}

std::vector<int> Tokenizer::encode_text(std::string_view text, bool bos) const {
  std::vector<int> ids;
  if (bos) ids.push_back(BOS_TOKEN);
  // Split at "<s>" / "</s>": the special tokens' text stands for them, as in tokenizer.json files.
  while (!text.empty()) {
    const size_t at = std::min(text.find(bos_text()), text.find(eos_text()));
    const std::vector<int> span = encode(text.substr(0, at), /*bos=*/false, /*eos=*/false);
    ids.insert(ids.end(), span.begin(), span.end());
    if (at == std::string_view::npos) break;
    const bool is_bos = text.substr(at).starts_with(bos_text());
    ids.push_back(is_bos ? BOS_TOKEN : EOS_TOKEN);
    text.remove_prefix(at + (is_bos ? bos_text() : eos_text()).size());
  }
  return ids;
}

std::string Tokenizer::decode_ids(std::span<const int> ids, bool) const {
  std::string text;
  int prev = BOS_TOKEN;  // as after BOS: the dummy-prefix space of the first piece goes
  for (int id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    // BOS/EOS as the names encode_text reads (llama2.c's files store "\n<s>\n" / "\n</s>\n").
    text += id == BOS_TOKEN ? bos_text() : id == EOS_TOKEN ? eos_text() : std::string(decode(prev, id));
    prev = id;
  }
  return text;
}

std::string Tokenizer::token_text(int id) const {
  return id >= 0 && id < vocab_size() ? pieces_[static_cast<size_t>(id)] : std::string();
}

std::optional<int> Tokenizer::token_id(std::string_view text) const {
  if (text == bos_text()) return BOS_TOKEN;
  if (text == eos_text()) return EOS_TOKEN;
  const int id = lookup(text);
  return id >= 0 ? std::optional<int>(id) : std::nullopt;
}

void Tokenizer::save(const std::string& path) const {
  write_atomically(path, [&](std::ostream& out) {
    const int32_t max_len = max_token_length_;
    out.write(reinterpret_cast<const char*>(&max_len), sizeof(max_len));
    for (size_t i = 0; i < pieces_.size(); ++i) {
      const int32_t len = static_cast<int32_t>(pieces_[i].size());
      out.write(reinterpret_cast<const char*>(&scores_[i]), sizeof(float));
      out.write(reinterpret_cast<const char*>(&len), sizeof(len));
      out.write(pieces_[i].data(), len);
    }
  });
}

}  // namespace tpcli::text
