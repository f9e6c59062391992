// tpcli::nn — token embedding lookup, plain and vocabulary-parallel.
//
// Dimension legend: N rows (tokens), V vocabulary, C channels; VL = this device's vocabulary rows.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "distributed/group.h"
#include "nn/linear.h"
#include "tensor/packed_matrix.h"
#include "tensor/tensor.h"

namespace tpcli::nn {

// out[N, C] = table[tokens[n]]. Throws std::out_of_range naming the token when outside [0, V).
void embedding_forward(float* out, const int* tokens, const float* table, int64_t N, int64_t V, int64_t C);
// dtable[V, C] += scatter of dout[N, C] by token.
void embedding_backward(float* dtable, const float* dout, const int* tokens, int64_t N, int64_t C);

// The lookup protocol of a table split by vocabulary rows over a group, whatever the rows are
// stored as (f32 or packed): member m keeps rows vocab[m] (dist::even_split, the classifier's
// split). The owner of a token holds its row. Every member reads the rows of the tokens it owns
// (in token order) and one all_gather_v hands everyone every row: P*C floats reach each member for
// P tokens, one collective per call whatever P is. (An all_sum of rows zero-filled elsewhere reads
// T times as much; a broadcast serves one owner per call.)
class VocabRowLookup {
 public:
  // Writes this member's local row r (0 <= r < VL) as C floats at dst.
  using RowReader = std::function<void(float* dst, int64_t r)>;

  VocabRowLookup() = default;
  // vocab: every member's rows of V, rank order, consecutive from 0; local_rows: the rows this
  // member holds (checked against vocab[rank]).
  VocabRowLookup(std::vector<dist::Range> vocab, dist::Group group, int64_t local_rows);

  int64_t vocab_size() const { return vocab_size_; }  // V
  dist::Range local_range() const { return vocab_.at(static_cast<size_t>(group_.rank())); }
  const std::vector<dist::Range>& vocab() const { return vocab_; }
  dist::Group& group() { return group_; }

  // out[N, C] (mirrored) = table[tokens[n]]. Every member passes the same tokens. A collective
  // (none on a lone member); a token outside [0, V) throws std::out_of_range on every member
  // before any communication.
  void forward(float* out, std::span<const int> tokens, int64_t C, const RowReader& read_row);

 private:
  int owner(int token) const;  // member holding the row of token

  std::vector<dist::Range> vocab_;  // [T] every member's rows
  std::vector<int64_t> counts_;     // [T] scratch: floats each member contributes to a lookup
  int64_t vocab_size_ = 0;
  dist::Group group_;
  std::vector<float> mine_, all_;   // [rows owned here, C], [N, C] scratch, in member order
};

// The embedding table [V, C] split by vocabulary rows over a group (Megatron's
// VocabParallelEmbedding; the JAX sharding P("model", None)), looked up by VocabRowLookup. Those
// rows are a Linear [VL, C], so a tied classifier is this very Linear used as an AllToSharded shard
// (logits_local = x @ rows^T): one copy of the table in the whole group, never one per device.
class VocabParallelEmbedding {
 public:
  VocabParallelEmbedding() = default;
  // rows: this member's rows [vocab[rank].count, C]; vocab: every member's rows of V, rank order,
  // consecutive from 0.
  VocabParallelEmbedding(tensor::Tensor rows, std::vector<dist::Range> vocab, dist::Group group);

  int64_t vocab_size() const { return lookup_.vocab_size(); }  // V
  int64_t dim() const { return rows_.in_features(); }          // C
  dist::Range local_range() const { return lookup_.local_range(); }
  // This member's rows [VL, C] (value and grad): the parameter, and the tied classifier's shard.
  Linear& rows() { return rows_; }
  const Linear& rows() const { return rows_; }

  // out[N, C] (mirrored) = table[tokens[n]]: VocabRowLookup::forward.
  void forward(float* out, std::span<const int> tokens);
  // rows.grad[VL, C] += dout[n] for every n whose token this member owns. dout[N, C] is mirrored,
  // so no communication: the gradient of the table lives on the owners' rows only.
  void backward(const float* dout, std::span<const int> tokens);
  // Collective: the full table [V, C] (grads: its gradient).
  tensor::Tensor gather_full(bool grads);

 private:
  Linear rows_;  // [VL, C]
  VocabRowLookup lookup_;
};

// The same split for a frozen table in a stored format (quantized or 16-bit, tensor::PackedMatrix):
// a lookup dequantizes the owned rows before the all_gather_v; a tied classifier reads the packed
// rows directly (rows().matmul). Inference only.
class PackedVocabParallelEmbedding {
 public:
  PackedVocabParallelEmbedding() = default;
  // rows: this member's rows [vocab[rank].count, C] in any format.
  PackedVocabParallelEmbedding(tensor::PackedMatrix rows, std::vector<dist::Range> vocab, dist::Group group);

  int64_t vocab_size() const { return lookup_.vocab_size(); }  // V
  int64_t dim() const { return rows_.cols(); }                 // C
  dist::Range local_range() const { return lookup_.local_range(); }
  const tensor::PackedMatrix& rows() const { return rows_; }  // [VL, C]
  int64_t bytes() const { return rows_.bytes(); }

  // out[N, C] (mirrored, f32) = table[tokens[n]]: VocabRowLookup::forward.
  void forward(float* out, std::span<const int> tokens);

 private:
  tensor::PackedMatrix rows_;  // [VL, C]
  VocabRowLookup lookup_;
};

}  // namespace tpcli::nn
