// tpcli::tensor — shapes and owned, contiguous f32 storage.
//
// A Tensor owns its floats (row-major, contiguous, 64-byte aligned; large ones on huge pages:
// tensor/aligned_storage.h). Views are std::span<float> over a range of
// rows: layers take spans plus sizes (llm.c style), so a view never outlives its owner by accident
// and no strides leak past blas.h. The one exception is Tensor::view: a tensor over storage someone
// else owns (the model's gradients live in one contiguous buffer, model/llama.h), so that the
// layers keep writing into "their" gradient tensors. Copying a view gives an owning tensor.
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
  // Not owning: `storage` (numel(shape) floats) must outlive the tensor and every move of it.
  static Tensor view(Shape shape, std::span<float> storage);
  Tensor(const Tensor& other);             // an owning copy, also of a view
  Tensor& operator=(const Tensor& other);  // becomes an owning copy
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  bool is_view() const { return view_.data() != nullptr; }

  const Shape& shape() const { return shape_; }
  int64_t dim(int axis) const;  // negative axis counts from the end
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return static_cast<int64_t>(span().size()); }
  bool empty() const { return span().empty(); }

  float* data() { return span().data(); }
  const float* data() const { return span().data(); }
  std::span<float> span() { return is_view() ? view_ : std::span<float>(data_); }
  std::span<const float> span() const { return is_view() ? std::span<const float>(view_) : std::span<const float>(data_); }
  float& operator[](int64_t i) { return data()[i]; }
  float operator[](int64_t i) const { return data()[i]; }

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
  std::span<float> view_;  // set: the floats are there, data_ is empty
};

}  // namespace tpcli::tensor
