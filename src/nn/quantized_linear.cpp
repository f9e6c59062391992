#include "nn/quantized_linear.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "distributed/tree_reduce.h"

namespace tpcli::nn {

using tensor::Columns;
using tensor::PackedMatrix;

QuantizedLinear::QuantizedLinear(PackedMatrix weight) : weight_(std::move(weight)), in_(weight_.cols()) {}

QuantizedLinear::QuantizedLinear(PackedMatrix weight, int64_t lead, int64_t in_features)
    : weight_(std::move(weight)), lead_(lead), in_(in_features) {
  if (lead < 0 || in_features < 0 || lead + in_features > weight_.cols())
    throw std::invalid_argument("quantized linear: columns [" + std::to_string(lead) + ", " + std::to_string(lead + in_features) +
                                ") are not within the weight's " + std::to_string(weight_.cols()));
}

namespace {

// Rows of `n` floats placed at column `lead` of rows of `width` zeros (thread-local: a step's scratch).
const float* among_zeros(const float* rows, int64_t N, int64_t n, int64_t lead, int64_t width) {
  thread_local std::vector<float> wide;
  wide.assign(static_cast<size_t>(N * width), 0.0f);
  for (int64_t r = 0; r < N; ++r) std::copy(rows + r * n, rows + (r + 1) * n, wide.begin() + r * width + lead);
  return wide.data();
}

}  // namespace

QuantizedLinear QuantizedLinear::from_linear(const Linear& linear, tensor::WeightFormat format) {
  const auto& w = linear.weight();
  return QuantizedLinear(PackedMatrix::from_f32(w.data(), linear.out_features(), linear.in_features(), format));
}

void QuantizedLinear::forward(float* out, const float* inp, int64_t N, int64_t ld_out) const {
  if (out_features() == 0) return;
  if (in_features() == 0) {  // a device holding none of the input columns contributes zeros
    const int64_t ld = ld_out ? ld_out : out_features();
    for (int64_t n = 0; n < N; ++n) std::fill(out + n * ld, out + n * ld + out_features(), 0.0f);
    return;
  }
  weight_.matmul(out, padded() ? among_zeros(inp, N, in_, lead_, weight_.cols()) : inp, N, ld_out);
}

void QuantizedLinear::input_gradient(float* target, const float* dout, int64_t N, bool accumulate, int64_t ld_dout,
                                     int64_t ld_target) const {
  if (!padded()) return weight_.transposed_product(target, dout, N, accumulate ? 1.0f : 0.0f, ld_dout, ld_target);
  const int64_t width = weight_.cols(), ld = ld_target ? ld_target : in_;
  std::vector<float> wide(static_cast<size_t>(N * width));
  weight_.transposed_product(wide.data(), dout, N, 0.0f, ld_dout, width);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t i = 0; i < in_; ++i) {
      const float g = wide[static_cast<size_t>(r * width + lead_ + i)];
      target[r * ld + i] = accumulate ? target[r * ld + i] + g : g;
    }
}

// ---- QuantizedAllToShardedLinear ----

QuantizedAllToShardedLinear::QuantizedAllToShardedLinear(std::vector<QuantizedLinear> parts, dist::Group group)
    : parts_(std::move(parts)), group_(std::move(group)) {
  if (parts_.empty()) throw std::invalid_argument("quantized all-to-sharded linear: no parts");
  for (const auto& p : parts_) {
    if (p.in_features() != parts_[0].in_features())
      throw std::invalid_argument("quantized all-to-sharded linear: parts have different input sizes");
    out_local_ += p.out_features();
  }
}

int64_t QuantizedAllToShardedLinear::bytes() const {
  int64_t n = 0;
  for (const auto& p : parts_) n += p.bytes();
  return n;
}

std::vector<int64_t> QuantizedAllToShardedLinear::part_rows() const {
  std::vector<int64_t> rows;
  for (const auto& p : parts_) rows.push_back(p.out_features());
  return rows;
}

void QuantizedAllToShardedLinear::set_adapter(int i, LoraAdapter adapter) {
  const QuantizedLinear& p = parts_.at(static_cast<size_t>(i));
  if (adapter.a.dim(1) != in_features() || adapter.b.dim(0) != p.out_features() || adapter.b.dim(1) != adapter.rank())
    throw std::invalid_argument("quantized all-to-sharded linear: adapter A " + tensor::to_string(adapter.a.shape()) +
                                ", B " + tensor::to_string(adapter.b.shape()) + " do not fit a part of [" +
                                std::to_string(p.out_features()) + ", " + std::to_string(p.in_features()) + "]");
  adapters_.resize(parts_.size());
  adapters_[static_cast<size_t>(i)] = std::move(adapter);
}

LoraAdapter* QuantizedAllToShardedLinear::adapter(int i) {
  if (static_cast<size_t>(i) >= adapters_.size() || adapters_[static_cast<size_t>(i)].a.empty()) return nullptr;
  return &adapters_[static_cast<size_t>(i)];
}

void QuantizedAllToShardedLinear::forward(float* out, const float* inp, int64_t N) const {
  int64_t col = 0;
  for (const auto& p : parts_) {
    p.forward(out + col, inp, N, out_local_);
    col += p.out_features();
  }
  if (!adapters_.empty()) lora_parts_forward(out, inp, N, in_features(), part_rows(), adapters_);
}

void QuantizedAllToShardedLinear::backward(float* dinp, const float* dout, const float* inp, int64_t N) {
  const int64_t IN = in_features(), R = lora_rank_sum(adapters_);
  if (R == 0) return backward(dinp, dout, N);
  // [N, IN] the base's partial dinp, then [N, R] the adapters' partial dxa: one all_sum for both.
  dinp_partial_.resize(static_cast<size_t>(N * (IN + R)));
  float* dxa = dinp_partial_.data() + N * IN;
  input_gradient(dinp_partial_.data(), dout, N, false);
  lora_parts_output_gradients(dxa, dout, inp, N, IN, part_rows(), adapters_);
  if (group_.size() > 1) group_.all_sum(dinp_partial_);  // sum_gradients: partial -> mirrored
  if (dinp)
    for (int64_t i = 0; i < N * IN; ++i) dinp[i] += dinp_partial_[static_cast<size_t>(i)];
  lora_parts_input_gradients(dinp, dxa, inp, N, IN, adapters_);
}

void QuantizedAllToShardedLinear::input_gradient(float* target, const float* dout, int64_t N, bool accumulate) const {
  int64_t col = 0;
  for (size_t i = 0; i < parts_.size(); ++i) {  // target[N, IN] (+)= dout[:, part's columns] @ W_part
    parts_[i].input_gradient(target, dout + col, N, accumulate || i > 0, out_local_);
    col += parts_[i].out_features();
  }
}

void QuantizedAllToShardedLinear::backward(float* dinp, const float* dout, int64_t N) {
  const int64_t IN = in_features();
  if (group_.size() == 1) {  // nothing to sum over: straight into dinp
    if (dinp) input_gradient(dinp, dout, N, true);
    return;
  }
  dinp_partial_.resize(static_cast<size_t>(N * IN));  // [N, IN], overwritten
  input_gradient(dinp_partial_.data(), dout, N, false);
  group_.all_sum(std::span<float>(dinp_partial_.data(), static_cast<size_t>(N * IN)));  // sum_gradients: partial -> mirrored
  if (!dinp) return;
  for (int64_t i = 0; i < N * IN; ++i) dinp[i] += dinp_partial_[static_cast<size_t>(i)];
}

// ---- QuantizedShardedToAllLinear ----

QuantizedShardedToAllLinear::QuantizedShardedToAllLinear(QuantizedLinear local, dist::Group group)
    : QuantizedShardedToAllLinear(std::vector<QuantizedLinear>{std::move(local)}, std::move(group)) {}

QuantizedShardedToAllLinear::QuantizedShardedToAllLinear(std::vector<QuantizedLinear> lanes, dist::Group group)
    : lanes_(std::move(lanes)), group_(std::move(group)) {
  if (lanes_.empty()) throw std::invalid_argument("quantized sharded-to-all linear: no lanes");
  for (const auto& l : lanes_)
    if (l.out_features() != lanes_[0].out_features() || l.in_features() != lanes_[0].in_features())
      throw std::invalid_argument("quantized sharded-to-all linear: lanes of different shapes");
  in_local_ = lanes_[0].in_features() * static_cast<int64_t>(lanes_.size());
}

int64_t QuantizedShardedToAllLinear::bytes() const {
  int64_t n = 0;
  for (const auto& l : lanes_) n += l.bytes();
  return n;
}

void QuantizedShardedToAllLinear::local_forward(float* out, const float* inp, int64_t N) const {
  const int64_t OUT = out_features(), L = lanes(), IN_lane = lanes_[0].in_features(), rows = N * OUT;
  if (L == 1) {
    lanes_[0].forward(out, inp, N);
  } else {
    // One scratch per thread (a device), not per layer: every layer's would be sized for the
    // largest step and kept.
    thread_local std::vector<float> lane_in, lane_out;  // [N, IN_lane], [lanes, N, OUT]
    lane_out.resize(static_cast<size_t>(L * rows));
    if (N > 1) lane_in.resize(static_cast<size_t>(N * IN_lane));
    thread_local std::vector<const float*> parts;  // [L] each lane's out[N, OUT]
    parts.resize(static_cast<size_t>(L));
    for (int64_t l = 0; l < L; ++l) {
      const float* x = inp + l * IN_lane;  // one row: the lane's columns lie together
      if (N > 1) {
        for (int64_t n = 0; n < N; ++n) std::copy_n(inp + n * in_local_ + l * IN_lane, IN_lane, lane_in.data() + n * IN_lane);
        x = lane_in.data();
      }
      float* y = lane_out.data() + l * rows;
      lanes_[static_cast<size_t>(l)].forward(y, x, N);
      parts[static_cast<size_t>(l)] = y;
    }
    dist::tree_reduce(out, parts.data(), static_cast<int>(L), 0, rows, [](float a, float b) { return a + b; });
  }
}

void QuantizedShardedToAllLinear::forward(float* out, const float* inp, int64_t N) {
  const int64_t OUT = out_features();
  if (!adapter()) {
    local_forward(out, inp, N);
    group_.all_sum(std::span<float>(out, static_cast<size_t>(N * OUT)));  // partial -> mirrored
    return;
  }
  const int64_t r = adapter_.rank();
  summed_.assign(static_cast<size_t>(N * (OUT + r)), 0.0f);  // [N, OUT] base, then [N, r] xa
  float* xa = summed_.data() + N * OUT;
  local_forward(summed_.data(), inp, N);
  lora_partial_xa(xa, inp, N, adapter_);
  group_.all_sum(summed_);  // partial -> mirrored, the adapter's xa with the base's output
  std::copy(summed_.begin(), summed_.begin() + N * OUT, out);
  xa_.assign(xa, xa + N * r);  // for backward's dB
  lora_add_output(out, xa, N, adapter_);  // out += scale * xa B^T
}

void QuantizedShardedToAllLinear::set_adapter(LoraAdapter adapter) {
  if (adapter.a.dim(1) != in_features() || adapter.b.dim(0) != out_features() || adapter.b.dim(1) != adapter.rank())
    throw std::invalid_argument("quantized sharded-to-all linear: adapter A " + tensor::to_string(adapter.a.shape()) +
                                ", B " + tensor::to_string(adapter.b.shape()) + " do not fit [" +
                                std::to_string(out_features()) + ", " + std::to_string(in_features()) + "]");
  adapter_ = std::move(adapter);
}

void QuantizedShardedToAllLinear::backward(float* dinp, const float* dout, const float* inp, int64_t N) {
  if (dinp && in_features() > 0) input_gradient(dinp, dout, N, true);
  if (adapter()) lora_mirrored_backward(dinp, dout, xa_.data(), inp, N, adapter_);
}


void QuantizedShardedToAllLinear::input_gradient(float* target, const float* dout, int64_t N, bool accumulate) const {
  const int64_t IN_lane = lanes_[0].in_features();
  for (size_t l = 0; l < lanes_.size(); ++l)  // target[:, lane l's columns] (+)= dout[N, OUT] @ W_lane
    lanes_[l].input_gradient(target + static_cast<int64_t>(l) * IN_lane, dout, N, accumulate, 0, in_local_);
}

// ---- shard_linear / shard_inplace ----

std::vector<Segment> even_group_segments(int64_t n, int parts, int64_t unit, const dist::Group& group) {
  if (parts < 1 || n % parts != 0 || (n / parts) % unit != 0)
    throw std::invalid_argument("shard_linear: " + std::to_string(n) + " columns do not split into " +
                                std::to_string(parts) + " segments of whole groups of " + std::to_string(unit));
  std::vector<Segment> segs;
  for (int s = 0; s < parts; ++s) {
    const dist::Range g = dist::even_split(n / parts / unit, group.size(), group.rank());
    segs.push_back({n / parts, {g.offset * unit, g.count * unit}});
  }
  return segs;
}

namespace {

// Absolute ranges of the split dimension (length n) this device keeps, segment by segment.
std::vector<Columns> local_columns(int64_t n, const std::vector<Segment>& segments) {
  std::vector<Columns> out;
  int64_t start = 0;
  for (const auto& s : segments) {
    if (s.local.offset < 0 || s.local.count < 0 || s.local.offset + s.local.count > s.size)
      throw std::invalid_argument("shard_linear: local range [" + std::to_string(s.local.offset) + ", +" +
                                  std::to_string(s.local.count) + ") outside a segment of " + std::to_string(s.size));
    out.push_back({start + s.local.offset, s.local.count});
    start += s.size;
  }
  if (start != n)
    throw std::invalid_argument("shard_linear: segments add up to " + std::to_string(start) + ", the weight has " +
                                std::to_string(n));
  return out;
}

std::vector<QuantizedLinear> row_parts(const QuantizedLinear& linear, const dist::Group& group,
                                       std::vector<Segment> segments) {
  if (segments.empty()) segments.push_back({linear.out_features(), dist::even_split(linear.out_features(), group.size(), group.rank())});
  std::vector<QuantizedLinear> parts;
  for (const auto& c : local_columns(linear.out_features(), segments))
    parts.emplace_back(linear.weight().slice_rows(c.offset, c.count));
  return parts;
}

PackedMatrix column_shard(const QuantizedLinear& linear, const dist::Group& group, std::vector<Segment> segments) {
  const auto& f = linear.format();
  const int64_t unit = f.quantized() ? f.group_size : 1;
  if (segments.empty()) segments = even_group_segments(linear.in_features(), 1, unit, group);
  const auto columns = local_columns(linear.in_features(), segments);
  for (const auto& c : columns)
    if (c.offset % unit != 0 || c.count % unit != 0)
      throw std::invalid_argument("shard_linear: device " + std::to_string(group.rank()) + " of " +
                                  std::to_string(group.size()) + " would hold input columns [" +
                                  std::to_string(c.offset) + ", " + std::to_string(c.offset + c.count) +
                                  "), which cut a " + f.name() + " group of " + std::to_string(unit) + " columns");
  return linear.weight().slice_columns(columns);
}

}  // namespace

QuantizedShardedLinear shard_linear(const QuantizedLinear& linear, Sharding sharding, dist::Group group,
                                    std::vector<Segment> segments) {
  if (sharding == Sharding::AllToSharded)
    return QuantizedAllToShardedLinear(row_parts(linear, group, std::move(segments)), std::move(group));
  PackedMatrix local = column_shard(linear, group, std::move(segments));
  return QuantizedShardedToAllLinear(QuantizedLinear(std::move(local)), std::move(group));
}

void shard_inplace(QuantizedLinear& linear, Sharding sharding, const dist::Group& group, std::vector<Segment> segments) {
  if (sharding == Sharding::ShardedToAll) {
    linear = QuantizedLinear(column_shard(linear, group, std::move(segments)));
    return;
  }
  std::vector<PackedMatrix> rows;
  for (auto& p : row_parts(linear, group, std::move(segments))) rows.push_back(p.weight());
  linear = QuantizedLinear(PackedMatrix::concat_rows(rows));
}

}  // namespace tpcli::nn
