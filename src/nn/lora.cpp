#include "nn/lora.h"

#include <stdexcept>

namespace tpcli::nn {

LoraAdapter make_lora_adapter(tensor::Tensor a, tensor::Tensor b, double alpha) {
  if (a.rank() != 2 || b.rank() != 2 || a.dim(0) < 1 || b.dim(1) != a.dim(0))
    throw std::invalid_argument("lora: A " + tensor::to_string(a.shape()) + " and B " + tensor::to_string(b.shape()) +
                                " are not [r, IN] and [OUT, r]");
  LoraAdapter ad;
  ad.scale = static_cast<float>(alpha / static_cast<double>(a.dim(0)));
  ad.a_grad = tensor::Tensor(a.shape());
  ad.b_grad = tensor::Tensor(b.shape());
  ad.a = std::move(a);
  ad.b = std::move(b);
  return ad;
}

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// mask[j] for row n: 0 or 1 / (1 - p), from the element's global indices.
void fill_mask(const LoraAdapter& ad, int64_t n, int64_t IN, std::vector<float>& mask) {
  const uint64_t row_key = mix(mix(ad.pass_seed ^ ad.stream) + static_cast<uint64_t>(ad.row_offset + n));
  const auto threshold = static_cast<uint64_t>(static_cast<double>(ad.dropout) * 0x1.0p24);
  const float keep = 1.0f / (1.0f - ad.dropout);
  mask.resize(static_cast<size_t>(IN));
  for (int64_t j = 0; j < IN; ++j)
    mask[static_cast<size_t>(j)] = (mix(row_key + static_cast<uint64_t>(ad.column_offset + j)) >> 40) < threshold ? 0.0f : keep;
}

}  // namespace

const float* lora_input(const LoraAdapter& ad, const float* inp, int64_t N, int64_t IN, std::vector<float>& scratch) {
  if (!ad.drops()) return inp;
  scratch.resize(static_cast<size_t>(N * IN));
  std::vector<float> mask;
  for (int64_t n = 0; n < N; ++n) {
    fill_mask(ad, n, IN, mask);
    for (int64_t j = 0; j < IN; ++j) scratch[static_cast<size_t>(n * IN + j)] = inp[n * IN + j] * mask[static_cast<size_t>(j)];
  }
  return scratch.data();
}

void lora_input_gradient(const LoraAdapter& ad, float* g, int64_t N, int64_t IN) {
  if (!ad.drops()) return;
  std::vector<float> mask;
  for (int64_t n = 0; n < N; ++n) {
    fill_mask(ad, n, IN, mask);
    for (int64_t j = 0; j < IN; ++j) g[n * IN + j] *= mask[static_cast<size_t>(j)];
  }
}

}  // namespace tpcli::nn
