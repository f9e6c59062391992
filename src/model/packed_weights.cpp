#include "model/packed_weights.h"

#include <cstring>
#include <stdexcept>

#include "tensor/quant_formats.h"

namespace tpcli::model {

using tensor::PackedMatrix;
using tensor::WeightFormat;
using tensor::WeightKind;

void check_quantization(const Quantization& q) {
  if (q.mode == "mxfp8") {
    if (q.bits != 8 || q.group_size != 32)
      throw std::invalid_argument("quantization: mxfp8 needs bits = 8 and group_size = 32, got bits = " +
                                  std::to_string(q.bits) + ", group_size = " + std::to_string(q.group_size));
    return;
  }
  if (q.mode != "affine") throw std::invalid_argument("quantization: mode '" + q.mode + "' is not affine or mxfp8");
  if (q.bits < 2 || q.bits > 8) throw std::invalid_argument("quantization: bits = " + std::to_string(q.bits) + " outside 2..8");
  if (q.group_size != 32 && q.group_size != 64 && q.group_size != 128)
    throw std::invalid_argument("quantization: group_size = " + std::to_string(q.group_size) + " is not 32, 64 or 128");
}

WeightFormat weight_format(const Quantization& q) {
  check_quantization(q);
  return q.mode == "mxfp8" ? WeightFormat::mxfp8() : WeightFormat::affine(q.bits, q.group_size);
}

namespace {

// [rows, cols] of a parameter: leading dims folded into rows.
std::pair<int64_t, int64_t> matrix_dims(const tensor::Shape& shape) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  return {rows, shape.empty() ? 1 : shape.back()};
}

// A matrix a checkpoint may store packed: every 2-D (or expert) parameter but the MoE router.
bool is_matrix(const ParamSpec& spec) {
  const bool router = spec.block && spec.block->matrix == Matrix::Router;
  return spec.shape.size() >= 2 && !router;
}

// f32 copy of a stored scales/biases tensor (F32 here; MLX files keep them in the weight dtype).
std::vector<float> floats_of(const StoredTensor& t, const std::string& name) {
  const int64_t n = tensor::numel(t.shape);
  std::vector<float> out(static_cast<size_t>(n));
  const auto* bytes = static_cast<const uint8_t*>(t.data);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h = 0;
    switch (t.dtype) {
      case DType::F32: std::memcpy(&out[size_t(i)], bytes + 4 * i, 4); break;
      case DType::BF16: std::memcpy(&h, bytes + 2 * i, 2); out[size_t(i)] = tensor::bf16_to_f32(h); break;
      case DType::F16: std::memcpy(&h, bytes + 2 * i, 2); out[size_t(i)] = tensor::f16_to_f32(h); break;
      default: throw std::invalid_argument("weights: " + name + " must be F32, F16 or BF16");
    }
  }
  return out;
}

// The stored scales/biases as f32: in place when stored F32 (a device needs only its rows of them,
// so a whole-tensor copy per device would only add to the peak memory of a load), else converted
// into `copy`.
const float* f32_values(const StoredTensor& t, const std::string& name, std::vector<float>& copy) {
  if (t.dtype == DType::F32) return static_cast<const float*>(t.data);
  copy = floats_of(t, name);
  return copy.data();
}

StoredTensor require(const WeightSource& w, const std::string& name) {
  auto t = w.stored(name);
  if (!t) throw std::out_of_range("weights: quantized parameter's tensor '" + name + "' is missing");
  return *t;
}

}  // namespace

std::vector<std::pair<std::string, tensor::Shape>> packed_shapes(const ParamSpec& spec, const Quantization& q) {
  tensor::Shape words = spec.shape, scales = spec.shape;
  words.back() = spec.shape.back() * q.bits / 32;
  scales.back() = spec.shape.back() / q.group_size;
  std::vector<std::pair<std::string, tensor::Shape>> out = {{spec.name, words}, {spec.name + ".scales", scales}};
  if (q.mode == "affine") out.emplace_back(spec.name + ".biases", scales);
  return out;
}

bool packable(const ParamSpec& spec, const WeightFormat& format) {
  if (!is_matrix(spec) || format.kind == WeightKind::F32) return false;
  return !format.quantized() || spec.shape.back() % format.group_size == 0;
}

WeightFormat stored_format(const WeightSource& weights, const std::string& name) {
  auto t = weights.stored(name);
  if (!t) return WeightFormat::f32();
  if (t->ggml_blocks) return WeightFormat::ggml_blocks(*t->ggml_blocks);
  switch (t->dtype) {
    case DType::F32: return WeightFormat::f32();
    case DType::BF16: return WeightFormat::bf16();
    case DType::F16: return WeightFormat::f16();
    case DType::U32: {
      const std::optional<Quantization> q = weights.quantization_of(name);
      if (!q) throw std::invalid_argument("weights: '" + name + "' is packed (U32) but the checkpoint has no quantization");
      return weight_format(*q);
    }
    case DType::U8: break;
  }
  throw std::invalid_argument("weights: '" + name + "' is stored as U8, not a weight format");
}

bool holds_packed_weights(const WeightSource& weights) {
  if (weights.config().quantization) return true;
  for (const auto& spec : llama_parameters(weights.config()))
    if (is_matrix(spec) && stored_format(weights, spec.name).kind != WeightKind::F32) return true;
  return false;
}

PackedMatrix load_packed(const WeightSource& weights, const std::string& name, int64_t rows, int64_t cols,
                         int64_t row0, int64_t nrows, const std::vector<tensor::Columns>& columns) {
  const WeightFormat format = stored_format(weights, name);
  PackedMatrix::Parts parts;
  std::vector<float> scales, biases;  // f32 copies when stored in another float dtype (f32_values)
  if (format.kind == WeightKind::F32) {
    auto src = weights.get(name);
    if (static_cast<int64_t>(src.size()) != rows * cols)
      throw std::invalid_argument("weights: '" + name + "' has " + std::to_string(src.size()) + " values, expected " +
                                  std::to_string(rows) + " x " + std::to_string(cols));
    parts.data = src.data();
  } else if (format.kind == WeightKind::Ggml) {
    const StoredTensor t = require(weights, name);
    if (t.shape != tensor::Shape{rows, cols})
      throw std::invalid_argument("weights: '" + name + "' stored as " + tensor::to_string(t.shape) + " " + format.name() +
                                  " is not " + std::to_string(rows) + " x " + std::to_string(cols));
    parts.data = t.data;
  } else {
    const StoredTensor t = require(weights, name);
    if (tensor::numel(t.shape) * (t.dtype == DType::U32 ? 32 : 16) != rows * cols * format.bits)
      throw std::invalid_argument("weights: '" + name + "' stored as " + tensor::to_string(t.shape) + " does not hold " +
                                  std::to_string(rows) + " x " + std::to_string(cols) + " " + format.name() + " values");
    parts.data = t.data;
  }
  const bool with_scales = format.kind == WeightKind::Affine || format.kind == WeightKind::Mxfp8;  // ggml blocks hold theirs
  if (with_scales) {
    const StoredTensor s = require(weights, name + ".scales");
    const int64_t groups = rows * (cols / format.group_size);
    if (tensor::numel(s.shape) != groups)
      throw std::invalid_argument("weights: '" + name + ".scales' has " + std::to_string(tensor::numel(s.shape)) +
                                  " entries, expected " + std::to_string(groups));
    if (format.kind == WeightKind::Mxfp8) {
      if (s.dtype != DType::U8) throw std::invalid_argument("weights: '" + name + ".scales' of mxfp8 must be U8");
      parts.scale_bytes = static_cast<const uint8_t*>(s.data);
    } else {
      const StoredTensor b = require(weights, name + ".biases");
      if (tensor::numel(b.shape) != groups)
        throw std::invalid_argument("weights: '" + name + ".biases' has " + std::to_string(tensor::numel(b.shape)) +
                                    " entries, expected " + std::to_string(groups));
      parts.scales = f32_values(s, name + ".scales", scales);
      parts.biases = f32_values(b, name + ".biases", biases);
    }
  }
  PackedMatrix local = PackedMatrix::copy_of(format, rows, cols, parts, row0, nrows, columns);
  // Copied: the file's pages of it need not stay resident (weights.h).
  weights.release_pages(name);
  if (with_scales) weights.release_pages(name + ".scales");
  if (format.kind == WeightKind::Affine) weights.release_pages(name + ".biases");
  return local;
}

PackedMatrix load_packed_full(const WeightSource& weights, const std::string& name) {
  for (const auto& spec : llama_parameters(weights.config()))
    if (spec.name == name) {
      const auto [rows, cols] = matrix_dims(spec.shape);
      return load_packed(weights, name, rows, cols, 0, rows);
    }
  throw std::out_of_range("weights: no parameter named '" + name + "'");
}

dist::Range held_columns(const WeightFormat& f, dist::Range mine) {
  if (!f.quantized() || mine.count == 0) return mine;
  const int64_t g = f.group_size, first = mine.offset / g * g, end = (mine.offset + mine.count + g - 1) / g * g;
  return {first, end - first};
}

int64_t stored_bytes(const WeightFormat& f, int64_t rows, int64_t cols) {
  const int64_t groups = f.quantized() ? rows * (cols / f.group_size) : 0;
  const int64_t group_bytes = f.kind == WeightKind::Mxfp8 ? 1 : f.kind == WeightKind::Affine ? 8 : 0;  // scale (+bias)
  return rows * f.row_bytes(cols) + groups * group_bytes;
}

DecodeStorage decode_storage(const WeightSource& weights) {
  return {[&weights](const std::string& tensor, int64_t rows, int64_t cols) {
            const WeightFormat f = stored_format(weights, tensor);
            return stored_bytes(f, rows, held_columns(f, {0, cols}).count);  // device 0's columns
          },
          !holds_packed_weights(weights)};
}

int64_t shard_bytes(const WeightSource& weights, const ShardPlan& plan) {
  const LlamaConfig& c = weights.config();
  const int64_t FE = c.expert_hidden_dim ? c.expert_hidden_dim : c.hidden_dim;
  int64_t total = 0;
  for (const auto& spec : llama_parameters(c)) {
    const auto [rows, cols] = matrix_dims(spec.shape);
    const WeightFormat f = is_matrix(spec) ? stored_format(weights, spec.name) : WeightFormat::f32();
    const int64_t full = stored_bytes(f, rows, cols);
    // The fraction held: local rows (or columns: whole groups) over all of them, along the dimension
    // it is split by.
    int64_t part = 1, of = 1;
    if (spec.sharded_dim == ShardedDim::Experts) part = plan.expert_ffn.count, of = FE;
    else if (spec.split != Split::Replicated) {
      const dist::Range mine = plan.range_of(spec.sharded_dim);
      const bool by_rows = spec.split == Split::Rows;
      part = by_rows ? mine.count : held_columns(f, mine).count;
      of = by_rows ? spec.shape[0] : spec.shape[1];
    }
    total += full * part / of;
  }
  return total;
}

// ---- ConvertedWeights ----

ConvertedWeights::ConvertedWeights(const WeightSource& source, WeightFormat format)
    : source_(source), config_(source.config()), format_(format) {
  if (holds_packed_weights(source))
    throw std::invalid_argument("convert: the checkpoint is already stored as " +
                                (config_.quantization ? weight_format(*config_.quantization).name() : std::string("16-bit")) +
                                "; convert the f32 checkpoint");
  if (format.quantized())
    config_.quantization = Quantization{format.bits, format.group_size, format.kind == WeightKind::Mxfp8 ? "mxfp8" : "affine"};
  for (const auto& spec : llama_parameters(config_)) {
    if (!packable(spec, format)) continue;
    const auto [rows, cols] = matrix_dims(spec.shape);
    auto src = source.get(spec.name);
    packed_.emplace(spec.name, Packed{PackedMatrix::from_f32(src.data(), rows, cols, format), spec.shape, {}});
    source.release_pages(spec.name);  // else the whole f32 file stays resident beside its packed copy
  }
}

void ConvertedWeights::release_pages(const std::string& name) const {
  if (packed_.count(name) || name.ends_with(".scales") || name.ends_with(".biases")) return;  // made here, not the source's
  source_.release_pages(name);
}

std::span<const float> ConvertedWeights::get(const std::string& name) const {
  auto it = packed_.find(name);
  if (it == packed_.end()) return source_.get(name);
  std::lock_guard<std::mutex> lock(dequantize_mutex_);
  if (it->second.dequantized.empty()) {
    const tensor::Tensor d = it->second.matrix.dequantize();
    it->second.dequantized.assign(d.span().begin(), d.span().end());
  }
  return it->second.dequantized;
}

std::optional<StoredTensor> ConvertedWeights::stored(const std::string& name) const {
  auto base = [&](const std::string& n) { return packed_.find(n); };
  if (auto it = base(name); it != packed_.end()) {
    const Packed& p = it->second;
    const auto parts = p.matrix.parts();
    if (!format_.quantized())
      return StoredTensor{format_.kind == WeightKind::BF16 ? DType::BF16 : DType::F16, p.shape, parts.data};
    tensor::Shape words = p.shape;
    words.back() = p.shape.back() * format_.bits / 32;
    return StoredTensor{DType::U32, words, parts.data};
  }
  for (const char* suffix : {".scales", ".biases"}) {
    const std::string s = suffix;
    if (name.size() <= s.size() || name.compare(name.size() - s.size(), s.size(), s) != 0) continue;
    auto it = base(name.substr(0, name.size() - s.size()));
    if (it == packed_.end() || !format_.quantized()) return std::nullopt;
    tensor::Shape shape = it->second.shape;
    shape.back() = shape.back() / format_.group_size;
    const auto parts = it->second.matrix.parts();
    if (format_.kind == WeightKind::Mxfp8)
      return s == ".scales" ? std::optional<StoredTensor>(StoredTensor{DType::U8, shape, parts.scale_bytes}) : std::nullopt;
    return StoredTensor{DType::F32, shape, s == ".scales" ? static_cast<const void*>(parts.scales) : parts.biases};
  }
  auto src = source_.stored(name);
  if (src) return src;
  return std::nullopt;
}

}  // namespace tpcli::model
