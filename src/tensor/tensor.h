// tpcli::tensor — shapes and owned, contiguous f32 storage.
//
// A Tensor owns its floats (row-major, contiguous, 64-byte aligned; large ones on huge pages:
// tensor/aligned_storage.h). Views are std::span<float> over a range of
// rows: layers take spans plus sizes (llm.c style), so a view never outlives its owner by accident
// and no strides leak past blas.h.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tensor/aligned_storage.h"

namespace tpcli::tensor {

using Shape = std::vector<int64_t>;

int64_t numel(const Shape& shape);
std::string to_string(const Shape& shape);  // "[4, 64]"

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Shape shape);  // zero-filled
  Tensor(Shape shape, std::span<const float> values);  // values.size() must equal numel(shape); copied
  Tensor(Shape shape, const std::vector<float>& values) : Tensor(std::move(shape), std::span<const float>(values)) {}

  const Shape& shape() const { return shape_; }
  int64_t dim(int axis) const;  // negative axis counts from the end
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return static_cast<int64_t>(data_.size()); }
  bool empty() const { return data_.empty(); }

  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  std::span<float> span() { return data_; }
  std::span<const float> span() const { return data_; }
  float& operator[](int64_t i) { return data_[static_cast<size_t>(i)]; }
  float operator[](int64_t i) const { return data_[static_cast<size_t>(i)]; }

  // Rows [first, first + count) of the leading dimension, as a flat span.
  std::span<float> rows(int64_t first, int64_t count);
  std::span<const float> rows(int64_t first, int64_t count) const;

  void fill(float value);
  void zero() { fill(0.0f); }
  // Same storage, new shape of the same element count.
  void reshape(Shape shape);

 private:
  Shape shape_;
  std::vector<float, AlignedAllocator<float>> data_;
};

}  // namespace tpcli::tensor
