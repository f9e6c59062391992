// tpcli::tensor — the instruction sets the hand-written kernels come in, chosen at run time.
//
// The binary is built for a portable baseline (CMakeLists.txt: x86-64-v3), so it runs on any
// x86-64 host with AVX2; the AVX-512 kernels carry their own target attributes and run only where
// cpuid says so. TPCLI_ISA=scalar|avx2|avx512 in the environment lowers the level (never above
// what the CPU has), so the other kernel sets can be run and compared on an AVX-512 machine.
#pragma once

namespace tpcli::tensor {

enum class Isa { Scalar, Avx2, Avx512 };

// The best set this CPU has (x86-64: cpuid; elsewhere Scalar).
Isa cpu_isa();
// The set the kernels use: cpu_isa(), lowered by TPCLI_ISA when set. Read once; a TPCLI_ISA value
// other than scalar/avx2/avx512 is std::invalid_argument naming it.
Isa detected_isa();
const char* isa_name(Isa isa);
// AVX512_BF16 (vdpbf16ps; cpuid leaf 7 subleaf 1, eax bit 5): the AVX-512 set uses it for 4-bit
// affine weights and the Q4_K and Q6_K blocks when present. TPCLI_AVX512_BF16=0 says absent, so
// the kernels of AVX-512 CPUs without it run (and are tested) where the CPU has it.
bool cpu_has_avx512_bf16();

}  // namespace tpcli::tensor
