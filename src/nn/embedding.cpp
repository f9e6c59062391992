#include "nn/embedding.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "nn/gather.h"

namespace tpcli::nn {

void embedding_forward(float* out, const int* tokens, const float* table, int64_t N, int64_t V, int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    const int tok = tokens[n];
    if (tok < 0 || tok >= V)
      throw std::out_of_range("embedding: token " + std::to_string(tok) + " outside the vocabulary [0, " +
                              std::to_string(V) + ")");
    std::copy(table + int64_t(tok) * C, table + int64_t(tok + 1) * C, out + n * C);
  }
}

void embedding_backward(float* dtable, const float* dout, const int* tokens, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    float* d = dtable + int64_t(tokens[n]) * C;
    const float* g = dout + n * C;
    for (int64_t j = 0; j < C; ++j) d[j] += g[j];
  }
}

// ---- VocabRowLookup ----

namespace {

void check_token(int tok, int64_t V) {
  if (tok < 0 || tok >= V)
    throw std::out_of_range("embedding: token " + std::to_string(tok) + " outside the vocabulary [0, " +
                            std::to_string(V) + ")");
}

}  // namespace

VocabRowLookup::VocabRowLookup(std::vector<dist::Range> vocab, dist::Group group, int64_t local_rows)
    : vocab_(std::move(vocab)), group_(std::move(group)) {
  if (static_cast<int>(vocab_.size()) != group_.size())
    throw std::invalid_argument("embedding: " + std::to_string(vocab_.size()) + " vocabulary ranges for " +
                                std::to_string(group_.size()) + " members");
  for (const auto& r : vocab_) {
    if (r.offset != vocab_size_)
      throw std::invalid_argument("embedding: vocabulary ranges must be consecutive from 0");
    vocab_size_ += r.count;
  }
  if (local_rows != local_range().count)
    throw std::invalid_argument("embedding: " + std::to_string(local_rows) + " rows held, the split gives " +
                                std::to_string(local_range().count));
  counts_.resize(vocab_.size());
}

int VocabRowLookup::owner(int token) const {
  int m = 0;
  while (token >= vocab_[static_cast<size_t>(m)].offset + vocab_[static_cast<size_t>(m)].count) ++m;
  return m;
}

void VocabRowLookup::forward(float* out, std::span<const int> tokens, int64_t C, const RowReader& read_row) {
  const int64_t N = static_cast<int64_t>(tokens.size());
  for (int tok : tokens) check_token(tok, vocab_size_);
  if (group_.size() == 1) {  // every row is here
    for (int64_t n = 0; n < N; ++n) read_row(out + n * C, tokens[static_cast<size_t>(n)]);
    return;
  }
  // Each member's rows, in token order, one block per member.
  std::fill(counts_.begin(), counts_.end(), 0);
  for (int tok : tokens) counts_[static_cast<size_t>(owner(tok))] += C;
  const dist::Range mine = local_range();
  mine_.resize(static_cast<size_t>(counts_[static_cast<size_t>(group_.rank())]));
  float* dst = mine_.data();
  for (int tok : tokens)
    if (tok >= mine.offset && tok < mine.offset + mine.count) {
      read_row(dst, tok - mine.offset);
      dst += C;
    }
  all_.resize(static_cast<size_t>(N * C));
  group_.all_gather_v(mine_, all_, counts_);
  // Unpack: the n-th token's row is the next unread row of its owner's block.
  std::vector<int64_t> next(vocab_.size(), 0);  // [T] read offset in each member's block
  int64_t start = 0;
  for (size_t m = 0; m < vocab_.size(); ++m) {
    next[m] = start;
    start += counts_[m];
  }
  for (int64_t n = 0; n < N; ++n) {
    int64_t& at = next[static_cast<size_t>(owner(tokens[static_cast<size_t>(n)]))];
    std::copy(all_.begin() + at, all_.begin() + at + C, out + n * C);
    at += C;
  }
}

// ---- VocabParallelEmbedding ----

VocabParallelEmbedding::VocabParallelEmbedding(tensor::Tensor rows, std::vector<dist::Range> vocab, dist::Group group)
    : rows_(std::move(rows)), lookup_(std::move(vocab), std::move(group), rows_.out_features()) {}

void VocabParallelEmbedding::forward(float* out, std::span<const int> tokens) {
  const int64_t C = dim();
  const float* table = rows_.weight().data();  // [VL, C]
  lookup_.forward(out, tokens, C, [&](float* dst, int64_t r) { std::copy(table + r * C, table + (r + 1) * C, dst); });
}

void VocabParallelEmbedding::backward(const float* dout, std::span<const int> tokens) {
  const int64_t C = dim();
  const dist::Range mine = local_range();
  float* dtable = rows_.grad().data();  // [VL, C]
  for (size_t n = 0; n < tokens.size(); ++n) {
    const int tok = tokens[n];
    if (tok < mine.offset || tok >= mine.offset + mine.count) continue;
    float* d = dtable + (tok - mine.offset) * C;
    const float* g = dout + static_cast<int64_t>(n) * C;
    for (int64_t j = 0; j < C; ++j) d[j] += g[j];
  }
}

tensor::Tensor VocabParallelEmbedding::gather_full(bool grads) {
  const float* local = grads ? rows_.grad().data() : rows_.weight().data();
  return gather_rows(lookup_.group(), local, lookup_.vocab(), vocab_size(), dim());
}

// ---- PackedVocabParallelEmbedding ----

PackedVocabParallelEmbedding::PackedVocabParallelEmbedding(tensor::PackedMatrix rows, std::vector<dist::Range> vocab,
                                                           dist::Group group)
    : rows_(std::move(rows)), lookup_(std::move(vocab), std::move(group), rows_.rows()) {}

void PackedVocabParallelEmbedding::forward(float* out, std::span<const int> tokens) {
  lookup_.forward(out, tokens, dim(), [&](float* dst, int64_t r) { rows_.dequantize_row(dst, r); });
}

}  // namespace tpcli::nn
