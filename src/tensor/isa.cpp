#include "tensor/isa.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace tpcli::tensor {

namespace {

#if defined(__x86_64__)
// F16C through cpuid (leaf 1, ecx bit 29): clang 14's __builtin_cpu_supports has no "f16c".
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
}
#endif

Isa parse_isa(const std::string& name) {
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512})
    if (name == isa_name(isa)) return isa;
  throw std::invalid_argument("TPCLI_ISA=" + name + ": expected scalar, avx2 or avx512");
}

}  // namespace

Isa cpu_isa() {
#if defined(__x86_64__)
  static const Isa isa = [] {
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && cpu_has_f16c())
      return Isa::Avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c()) return Isa::Avx2;
    return Isa::Scalar;
  }();
  return isa;
#else
  return Isa::Scalar;
#endif
}

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__)
  static const bool has = [] {
    const char* use = std::getenv("TPCLI_AVX512_BF16");
    if (use != nullptr && std::string(use) == "0") return false;  // the kernels of AVX-512 CPUs without it
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 5)) != 0;
  }();
  return has;
#else
  return false;
#endif
}

Isa detected_isa() {
  static const Isa isa = [] {
    const char* forced = std::getenv("TPCLI_ISA");
    if (forced == nullptr || *forced == '\0') return cpu_isa();
    return std::min(parse_isa(forced), cpu_isa());  // never a set the CPU lacks (SIGILL)
  }();
  return isa;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "?";
}

}  // namespace tpcli::tensor
