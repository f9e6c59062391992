// tpcli::perf — BLIS sgemm rates the benches set their throughput against: the one-thread peak
// (`bench train`'s MFU) and the rate of one device's w1 product while every device runs its own
// (`bench prefill`).
#pragma once

namespace tpcli::perf {

// GFLOP/s of one [1024, 1024] x [1024, 1024]^T sgemm on one BLIS thread: best of 3 after a warm-up.
double sgemm_peak_gflops();

// GFLOP/s of BLIS sgemm at [P, C] x [C, FL]^T (the w1 product of one device), `threads` threads,
// in `devices` threads at once (as the devices run); best of 11 calls, slowest thread.
double measure_gemm_gflops(int P, int C, int FL, int threads, int devices);

}  // namespace tpcli::perf
