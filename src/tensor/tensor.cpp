#include "tensor/tensor.h"

#include <algorithm>
#include <new>
#include <stdexcept>

namespace tpcli::tensor {

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("tensor: negative dimension in shape " + to_string(shape));
    n *= d;
  }
  return n;
}

std::string to_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A failed allocation says what it was for and how much, not just "std::bad_alloc".
static std::vector<float, AlignedAllocator<float>> zeros(const Shape& shape) {
  const int64_t n = numel(shape);
  try {
    return std::vector<float, AlignedAllocator<float>>(static_cast<size_t>(n), 0.0f);
  } catch (const std::bad_alloc&) {
    throw std::runtime_error("tensor: out of memory allocating shape " + to_string(shape) + " (" +
                             std::to_string(n * static_cast<int64_t>(sizeof(float)) / 1000000) + " MB)");
  } catch (const std::length_error&) {
    throw std::runtime_error("tensor: shape " + to_string(shape) + " is too large to allocate");
  }
}

Tensor::Tensor(Shape shape) : shape_(std::move(shape)), data_(zeros(shape_)) {}

Tensor::Tensor(Shape shape, std::span<const float> values)
    : shape_(std::move(shape)), data_(values.begin(), values.end()) {
  if (static_cast<int64_t>(data_.size()) != tensor::numel(shape_))
    throw std::invalid_argument("tensor: " + std::to_string(data_.size()) + " values do not fill shape " +
                                to_string(shape_));
}

Tensor Tensor::view(Shape shape, std::span<float> storage) {
  if (static_cast<int64_t>(storage.size()) != tensor::numel(shape))
    throw std::invalid_argument("tensor: a view of " + std::to_string(storage.size()) + " floats cannot have shape " +
                                to_string(shape));
  Tensor t;
  t.shape_ = std::move(shape);
  t.view_ = storage;
  return t;
}

Tensor::Tensor(const Tensor& other)
    : shape_(other.shape_), data_(other.span().begin(), other.span().end()) {}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this == &other) return *this;
  std::vector<float, AlignedAllocator<float>> copy(other.span().begin(), other.span().end());
  shape_ = other.shape_;
  data_ = std::move(copy);
  view_ = {};
  return *this;
}

int64_t Tensor::dim(int axis) const {
  int n = rank();
  int a = axis < 0 ? axis + n : axis;
  if (a < 0 || a >= n) throw std::out_of_range("tensor: axis " + std::to_string(axis) + " of shape " + to_string(shape_));
  return shape_[static_cast<size_t>(a)];
}

static int64_t row_size(const Shape& shape) {
  return shape.empty() ? 1 : numel(Shape(shape.begin() + 1, shape.end()));
}

std::span<float> Tensor::rows(int64_t first, int64_t count) {
  int64_t r = row_size(shape_);
  if (first < 0 || count < 0 || (first + count) * r > numel())
    throw std::out_of_range("tensor: rows [" + std::to_string(first) + ", +" + std::to_string(count) + ") of " +
                            to_string(shape_));
  return span().subspan(static_cast<size_t>(first * r), static_cast<size_t>(count * r));
}

std::span<const float> Tensor::rows(int64_t first, int64_t count) const {
  return const_cast<Tensor*>(this)->rows(first, count);
}

void Tensor::fill(float value) { std::ranges::fill(span(), value); }

void Tensor::reshape(Shape shape) {
  if (tensor::numel(shape) != numel())
    throw std::invalid_argument("tensor: cannot reshape " + to_string(shape_) + " to " + to_string(shape));
  shape_ = std::move(shape);
}

}  // namespace tpcli::tensor
