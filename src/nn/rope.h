// tpcli::nn — rotary position embedding, llama2.c's convention.
//
// Dimension legend: S positions (seq_len), HS head size, H heads of the rotated rows.
// Within every head, the pair (2i, 2i+1) is rotated by the angle pos * theta^(-2i / HS), computed
// in float exactly as llama2.c's run.c does (powf, then cosf/sinf of pos * freq).
#pragma once

#include <cstdint>
#include <vector>

namespace tpcli::nn {

class RopeTable {
 public:
  RopeTable() = default;
  RopeTable(int seq_len, int head_size, float theta);

  int head_size() const { return head_size_; }
  int seq_len() const { return seq_len_; }

  // Rotate, in place, `heads` heads of HS floats starting at x (one row at position pos).
  void forward(float* x, int heads, int pos) const;
  // The backward of forward: rotate the gradient by the opposite angle, in place.
  void backward(float* dx, int heads, int pos) const;

 private:
  int seq_len_ = 0, head_size_ = 0;
  std::vector<float> cos_, sin_;  // [S, HS/2]
};

}  // namespace tpcli::nn
