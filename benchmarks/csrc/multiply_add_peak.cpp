// This CPU's multiply-add peak, for decode_roofline.py: the arithmetic floor under a decode step.
//
// kvserve_bench::multiply_add_peak(iterations, bfloat16) -> FLOP/s over torch's intra-op threads,
// each thread running `iterations` rounds of 12 independent accumulators (enough to cover the
// latency of the multiply-add units) on the instruction the CPU platform's GEMM uses for that dtype:
// float32 FMA (AVX-512, else AVX2), bfloat16 pairs with vdpbf16ps (AVX512-BF16; without it the GEMM
// widens bfloat16 to float32 FMA, so the float32 rate is the bfloat16 one). 0 where neither exists.

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <chrono>
#include <cstdint>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace {

constexpr int kChains = 12;

// FLOPs one thread did (a multiply-add counts two); `sink` keeps the results alive.
double run_thread(int64_t iterations, bool bfloat16, float* sink) {
#if defined(__AVX512BF16__)
  if (bfloat16) {
    __m512 acc[kChains];
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
    for (int64_t k = 0; k < iterations; ++k)
      for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    for (int i = 0; i < kChains; ++i) *sink += _mm512_reduce_add_ps(acc[i]);
    return 2.0 * 32 * kChains * iterations;
  }
#endif
  (void)bfloat16;
#if defined(__AVX512F__)
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(1.0000001f), b = _mm512_set1_ps(1e-8f);
  for (int64_t k = 0; k < iterations; ++k)
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  for (int i = 0; i < kChains; ++i) *sink += _mm512_reduce_add_ps(acc[i]);
  return 2.0 * 16 * kChains * iterations;
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(1.0000001f), b = _mm256_set1_ps(1e-8f);
  for (int64_t k = 0; k < iterations; ++k)
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  float lanes[8];
  for (int i = 0; i < kChains; ++i) {
    _mm256_storeu_ps(lanes, acc[i]);
    for (float lane : lanes) *sink += lane;
  }
  return 2.0 * 8 * kChains * iterations;
#else
  (void)iterations;
  (void)sink;
  return 0.0;
#endif
}

double multiply_add_peak(int64_t iterations, bool bfloat16) {
  const int64_t threads = at::get_num_threads();
  std::vector<double> flops(threads, 0.0);
  std::vector<float> sinks(threads * 16, 0.0f);  // a cache line each
  const auto start = std::chrono::steady_clock::now();
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) flops[t] = run_thread(iterations, bfloat16, &sinks[t * 16]);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double total = 0.0;
  for (double f : flops) total += f;
  return seconds > 0.0 ? total / seconds : 0.0;
}

}  // namespace

TORCH_LIBRARY(kvserve_bench, m) { m.def("multiply_add_peak(int iterations, bool bfloat16) -> float", &multiply_add_peak); }
