// tpcli::train — the training corpus: tokenize a text file, split it, and cut replayable batches.
//
// Dimension legend: B global batch rows, B_local = rows of this data rank, D data ranks,
// T sequence length (tokens per row), N tokens in a split (a text corpus's 90% or 10%, or the
// concatenation of a split's token shards, train/token_shards.h).
//
// Batches are a pure function of (step, row): a run can be resumed, re-split over another mesh, or
// replayed by another framework step for step. With shuffle = false, row r of step s is the window
// starting at o = ((s*B + r)*T) mod (N - T) (issue 4; N - T windows of T + 1 tokens, so a split of
// exactly T + 1 tokens trains); with shuffle = true, o is drawn from a
// generator seeded by (seed, s), so every data rank and every resumed run draws the same offsets.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tpcli::text {
class Tokenizer;
class TokenizerInterface;
}

namespace tpcli::train {

enum class TokenizerKind { Chars, Bytes, Llama2c, HfJson };

// The text <-> token mapping a training run uses; recorded in checkpoints so inference needs no flag.
class TextTokenizer {
 public:
  // nanoGPT's character vocabulary: the sorted unique bytes of the corpus; token = index.
  static TextTokenizer chars(std::string_view corpus);
  // The vocabulary given explicitly (as stored in a checkpoint): chars[i] is token i.
  static TextTokenizer chars_from_vocab(std::string vocab);
  // Raw bytes: vocab 256, token = byte value.
  static TextTokenizer bytes();
  // A llama2.c tokenizer.bin holding exactly vocab_size pieces (the model's vocab_size).
  static TextTokenizer llama2c(const std::string& path, int vocab_size);
  // A Hugging Face tokenizer.json (or a directory holding one), e.g. the one `tpcli tokenize`
  // wrote the token shards with; its own vocabulary size.
  static TextTokenizer hf_json(const std::string& path);
  // Whether `path` names a tokenizer.json (or a directory holding one) rather than a tokenizer.bin.
  static bool is_hf_json(const std::string& path);

  TokenizerKind kind() const { return kind_; }
  std::string kind_name() const;  // "chars" | "bytes" | "llama2c" | "hf"
  int vocab_size() const;
  const std::string& vocab() const { return vocab_; }  // chars: the vocabulary, in token order
  const std::string& path() const { return path_; }    // llama2c, hf: the tokenizer file
  const text::Tokenizer* bpe() const { return bpe_.get(); }  // llama2c: the BPE tokenizer
  // llama2c, hf: the tokenizer as generation and chat templates use it (special tokens by their
  // text, bos/eos); null for chars and bytes.
  const text::TokenizerInterface* interface() const;

  // Corpus encoding (no BOS). Chars: throws naming the byte when it is not in the vocabulary.
  std::vector<int> encode(std::string_view text) const;
  std::string decode(std::span<const int> tokens) const;

  TextTokenizer(const TextTokenizer&) = default;
  TextTokenizer& operator=(const TextTokenizer&) = default;
  ~TextTokenizer();

 private:
  TextTokenizer() = default;
  TokenizerKind kind_ = TokenizerKind::Bytes;
  std::string vocab_;
  std::string path_;
  std::shared_ptr<const text::Tokenizer> bpe_;  // llama2c only
  std::shared_ptr<const text::TokenizerInterface> hf_;  // hf only
  int char_to_token_[256] = {};                   // chars only; -1 when absent
};

// Read a whole text file; one-line error naming the path when it cannot be read or is empty.
std::string read_text_file(const std::string& path);

// A split's tokens, read a window at a time: held in memory (a text corpus tokenized at start-up)
// or memory-mapped from token shards (train/token_shards.h), never read whole.
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t size() const = 0;  // N
  // Tokens [offset, offset + out.size()) into out; requires offset + out.size() <= size().
  // Called by every device at once: implementations are read-only. Throws (one line naming the
  // file) on a token the model cannot take.
  virtual void read(int64_t offset, std::span<int> out) const = 0;
};

// Tokens in memory, owned.
class InMemoryTokens : public TokenSource {
 public:
  explicit InMemoryTokens(std::vector<int> tokens) : tokens_(std::move(tokens)) {}
  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }
  void read(int64_t offset, std::span<int> out) const override;
  const std::vector<int>& tokens() const { return tokens_; }

 private:
  std::vector<int> tokens_;  // (N,)
};

// The training and validation splits.
struct Corpus {
  std::shared_ptr<const TokenSource> train;  // (N_train,)
  std::shared_ptr<const TokenSource> val;    // (N_val,)
};
// A text corpus's tokens: first 90% for training and the rest for validation.
Corpus split_corpus(std::vector<int> tokens);

// What the step loop asks of a split: the rows of step s, a pure function of (s, row), the same on
// every data rank and every run. BatchSampler (text windows, below) and LengthBatches (supervised
// fine-tuning examples batched by length, train/sft_batches.h).
class StepBatches {
 public:
  virtual ~StepBatches() = default;
  virtual int batch_size() const = 0;               // B: rows of one step
  virtual int step_len(int64_t step) const = 0;     // T of the step's rows (<= seq_len)
  // Rows [row_begin, row_end) of step `step`: inputs and targets, each ((row_end-row_begin) * T,),
  // T = step_len(step). A target of -1 is not counted by the loss (nn/cross_entropy.h).
  virtual void fill(int64_t step, int row_begin, int row_end, std::span<int> inputs, std::span<int> targets) const = 0;
  // The counted targets of all B rows of the step, when the loss of a step is the mean over them
  // (train/step.h); nullopt when every target counts and each micro-batch is its own mean.
  virtual std::optional<int64_t> counted_targets(int64_t /*step*/) const { return std::nullopt; }
};

// Window offsets for the rows of a step; the same formula on every data rank and every run.
class BatchSampler : public StepBatches {
 public:
  // tokens: the split to sample (shared: a sampler may outlive the corpus that made it).
  // Throws when the split is too short for one window of T + 1 tokens.
  BatchSampler(std::shared_ptr<const TokenSource> tokens, int batch_size, int seq_len, bool shuffle, uint64_t seed);
  // tokens: kept by reference (it must outlive the sampler).
  BatchSampler(std::span<const int> tokens, int batch_size, int seq_len, bool shuffle, uint64_t seed);

  // Offset of global row `row` of step `step`.
  int64_t offset(int64_t step, int row) const;
  // Rows [row_begin, row_end) of step `step`: inputs and targets, each ((row_end-row_begin) * T,).
  void fill(int64_t step, int row_begin, int row_end, std::span<int> inputs, std::span<int> targets) const override;

  int batch_size() const override { return batch_size_; }
  int seq_len() const { return seq_len_; }
  int step_len(int64_t /*step*/) const override { return seq_len_; }

 private:
  std::shared_ptr<const TokenSource> tokens_;
  int batch_size_;
  int seq_len_;
  bool shuffle_;
  uint64_t seed_;
};

// Rows of the global batch that data rank d of D takes: [d*B/D, (d+1)*B/D).
struct RowRange {
  int begin = 0;
  int end = 0;
};
RowRange data_rows(int batch_size, int data_ranks, int data_rank);

}  // namespace tpcli::train
