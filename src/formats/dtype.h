// tpcli::formats — element types of stored tensors (safetensors dtypes) and conversion to and from
// f32. 16-bit floats: IEEE half (F16) and bfloat16 (BF16, the top half of an f32).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "model/weights.h"

namespace tpcli::formats {

int dtype_bytes(model::DType dtype);  // bytes per element
const char* dtype_name(model::DType dtype);                            // "F32", "BF16", ... as in safetensors
std::optional<model::DType> dtype_from_name(const std::string& name);  // nullopt for an unknown name
bool is_float(model::DType dtype);                                     // F32, F16, BF16

// out[n] = the f32 values of src[n] (F32, F16 or BF16; std::invalid_argument otherwise).
void to_f32(float* out, const void* src, model::DType dtype, int64_t n);
// out[n] in dtype (F32, F16 or BF16), rounded to nearest even.
void from_f32(void* out, const float* src, model::DType dtype, int64_t n);

}  // namespace tpcli::formats
