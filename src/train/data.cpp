#include "train/data.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "files/regular_file.h"
#include "formats/gguf_vocabulary.h"
#include "text/tokenizer.h"
#include "train/bpe.h"

namespace tpcli::train {

// ---- tokenizers ----

TextTokenizer::~TextTokenizer() = default;

TextTokenizer TextTokenizer::chars(std::string_view corpus) {
  bool present[256] = {};
  for (char c : corpus) present[static_cast<unsigned char>(c)] = true;
  std::string vocab;
  for (int b = 0; b < 256; ++b)
    if (present[b]) vocab.push_back(static_cast<char>(b));
  return chars_from_vocab(std::move(vocab));
}

TextTokenizer TextTokenizer::chars_from_vocab(std::string vocab) {
  if (vocab.empty()) throw std::invalid_argument("chars tokenizer: empty vocabulary (is the corpus empty?)");
  TextTokenizer t;
  t.kind_ = TokenizerKind::Chars;
  std::fill(std::begin(t.char_to_token_), std::end(t.char_to_token_), -1);
  for (size_t i = 0; i < vocab.size(); ++i) {
    int& slot = t.char_to_token_[static_cast<unsigned char>(vocab[i])];
    if (slot >= 0) throw std::invalid_argument("chars tokenizer: byte " + std::to_string(static_cast<unsigned char>(vocab[i])) +
                                               " appears twice in the vocabulary");
    slot = static_cast<int>(i);
  }
  t.vocab_ = std::move(vocab);
  return t;
}

TextTokenizer TextTokenizer::bytes() {
  TextTokenizer t;
  t.kind_ = TokenizerKind::Bytes;
  return t;
}

TextTokenizer TextTokenizer::llama2c(const std::string& path, int vocab_size) {
  TextTokenizer t;
  t.kind_ = TokenizerKind::Llama2c;
  t.path_ = path;
  t.bpe_ = load_bpe(path, vocab_size);
  return t;
}

bool TextTokenizer::is_hf_json(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec) || std::filesystem::path(path).extension() == ".json";
}

TextTokenizer TextTokenizer::hf_json(const std::string& path) {
  text::LoadedTokenizer loaded = formats::load_tokenizer(path);
  TextTokenizer t;
  t.kind_ = TokenizerKind::HfJson;
  t.path_ = loaded.path;
  t.hf_ = std::move(loaded.tokenizer);
  return t;
}

const text::TokenizerInterface* TextTokenizer::interface() const {
  if (kind_ == TokenizerKind::Llama2c) return bpe_.get();
  if (kind_ == TokenizerKind::HfJson) return hf_.get();
  return nullptr;
}

std::string TextTokenizer::kind_name() const {
  switch (kind_) {
    case TokenizerKind::Chars: return "chars";
    case TokenizerKind::Bytes: return "bytes";
    case TokenizerKind::Llama2c: return "llama2c";
    case TokenizerKind::HfJson: return "hf";
  }
  return "?";
}

int TextTokenizer::vocab_size() const {
  switch (kind_) {
    case TokenizerKind::Chars: return static_cast<int>(vocab_.size());
    case TokenizerKind::Bytes: return 256;
    case TokenizerKind::Llama2c: return bpe_vocab_size(*bpe_);
    case TokenizerKind::HfJson: return hf_->vocab_size();
  }
  return 0;
}

std::vector<int> TextTokenizer::encode(std::string_view text) const {
  std::vector<int> tokens;
  if (kind_ == TokenizerKind::Llama2c) return bpe_encode(*bpe_, text);
  if (kind_ == TokenizerKind::HfJson) return hf_->encode_text(text, /*bos=*/false);
  tokens.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    auto byte = static_cast<unsigned char>(text[i]);
    if (kind_ == TokenizerKind::Bytes) {
      tokens.push_back(byte);
      continue;
    }
    int token = char_to_token_[byte];
    if (token < 0)
      throw std::invalid_argument("chars tokenizer: byte " + std::to_string(byte) + " at offset " + std::to_string(i) +
                                  " is not in the " + std::to_string(vocab_.size()) + "-character vocabulary");
    tokens.push_back(token);
  }
  return tokens;
}

std::string TextTokenizer::decode(std::span<const int> tokens) const {
  if (kind_ == TokenizerKind::Llama2c) return bpe_decode(*bpe_, tokens);
  if (kind_ == TokenizerKind::HfJson) return hf_->decode_ids(tokens, /*clean_up=*/false);
  std::string text;
  text.reserve(tokens.size());
  for (int token : tokens) {
    if (token < 0 || token >= vocab_size())
      throw std::out_of_range("tokenizer: token " + std::to_string(token) + " outside vocabulary of " +
                              std::to_string(vocab_size()));
    text.push_back(kind_ == TokenizerKind::Chars ? vocab_[static_cast<size_t>(token)] : static_cast<char>(token));
  }
  return text;
}

// ---- corpus ----

std::string read_text_file(const std::string& path) {
  files::require_regular_file(path, "a text file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open the corpus (data.path)");
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().empty()) throw std::runtime_error(path + ": the corpus is empty (data.path)");
  return text.str();
}

void InMemoryTokens::read(int64_t offset, std::span<int> out) const {
  if (offset < 0 || offset + static_cast<int64_t>(out.size()) > size())
    throw std::out_of_range("tokens: read past the end of the split");
  std::copy_n(tokens_.begin() + offset, out.size(), out.begin());
}

namespace {

// A borrowed span as a TokenSource (BatchSampler's span constructor).
class BorrowedTokens : public TokenSource {
 public:
  explicit BorrowedTokens(std::span<const int> tokens) : tokens_(tokens) {}
  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }
  void read(int64_t offset, std::span<int> out) const override {
    std::copy_n(tokens_.begin() + offset, out.size(), out.begin());
  }

 private:
  std::span<const int> tokens_;
};

}  // namespace

Corpus split_corpus(std::vector<int> tokens) {
  // nanoGPT's prepare.py: n = len(data); train = data[:int(n*0.9)], val = the rest.
  auto n_train = static_cast<size_t>(static_cast<double>(tokens.size()) * 0.9);
  std::vector<int> val(tokens.begin() + static_cast<std::ptrdiff_t>(n_train), tokens.end());
  tokens.resize(n_train);
  return {std::make_shared<InMemoryTokens>(std::move(tokens)), std::make_shared<InMemoryTokens>(std::move(val))};
}

// ---- batches ----

BatchSampler::BatchSampler(std::span<const int> tokens, int batch_size, int seq_len, bool shuffle, uint64_t seed)
    : BatchSampler(std::make_shared<BorrowedTokens>(tokens), batch_size, seq_len, shuffle, seed) {}

BatchSampler::BatchSampler(std::shared_ptr<const TokenSource> tokens, int batch_size, int seq_len, bool shuffle,
                           uint64_t seed)
    : tokens_(std::move(tokens)), batch_size_(batch_size), seq_len_(seq_len), shuffle_(shuffle), seed_(seed) {
  if (batch_size < 1 || seq_len < 1) throw std::invalid_argument("batches: batch_size and seq_len must be >= 1");
  if (tokens_->size() < int64_t{seq_len} + 1)
    throw std::invalid_argument("corpus split of " + std::to_string(tokens_->size()) +
                                " tokens is too short for windows of seq_len + 1 = " + std::to_string(seq_len + 1) +
                                " tokens");
}

int64_t BatchSampler::offset(int64_t step, int row) const {
  // A window is seq_len + 1 tokens (inputs and their shifted targets): valid starts [0, windows).
  const auto windows = tokens_->size() - seq_len_;
  if (!shuffle_) return ((step * batch_size_ + row) * seq_len_) % windows;
  // One generator per step, seeded by (seed, step): every rank and every resumed run agrees.
  std::seed_seq seq{static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32), static_cast<uint32_t>(step),
                    static_cast<uint32_t>(step >> 32)};
  std::mt19937_64 gen(seq);
  uint64_t draw = 0;
  for (int r = 0; r <= row; ++r) draw = gen();
  return static_cast<int64_t>(draw % static_cast<uint64_t>(windows));
}

void BatchSampler::fill(int64_t step, int row_begin, int row_end, std::span<int> inputs, std::span<int> targets) const {
  const auto rows = static_cast<size_t>(row_end - row_begin), T = static_cast<size_t>(seq_len_);
  if (inputs.size() != rows * T || targets.size() != rows * T)
    throw std::invalid_argument("batches: buffers do not hold (rows * T) tokens");
  std::vector<int> window(T + 1);  // (T + 1,): a row's inputs, and its targets one token later
  for (int r = row_begin; r < row_end; ++r) {
    tokens_->read(offset(step, r), window);
    auto out = static_cast<std::ptrdiff_t>(r - row_begin) * static_cast<std::ptrdiff_t>(T);
    std::copy_n(window.begin(), T, inputs.begin() + out);
    std::copy_n(window.begin() + 1, T, targets.begin() + out);
  }
}

RowRange data_rows(int batch_size, int data_ranks, int data_rank) {
  return {data_rank * batch_size / data_ranks, (data_rank + 1) * batch_size / data_ranks};
}

}  // namespace tpcli::train
