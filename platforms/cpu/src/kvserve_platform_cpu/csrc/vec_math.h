// ATen's at::vec at the widest width this -march=native build runs, and the row math that more than
// one of the CPU platform's libraries computes (layer_ops.cpp's ops, linear.cpp's gated product): one
// definition, so every path rounds alike. Include it before any other ATen header: CPU_CAPABILITY
// picks at::vec's implementation.
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#elif defined(__AVX2__) && defined(__FMA__)
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#else
#define CPU_CAPABILITY DEFAULT
#endif

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cstdint>
#include <type_traits>

namespace kvserve_vec {

using Vec = at::vec::Vectorized<float>;

// dst[i] = op(a[i], b[i]) over n floats, full vectors then one partial vector (never scalar code:
// the tail must round exactly as the body does).
template <typename Op>
inline void map2(float* dst, const float* a, const float* b, int64_t n, const Op& op) {
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) op(Vec::loadu(a + i), Vec::loadu(b + i)).store(dst + i);
  if (i < n) {
    const int64_t rest = n - i;
    op(Vec::loadu(a + i, rest), Vec::loadu(b + i, rest)).store(dst + i, rest);
  }
}

// Round float32 values through the storage dtype and back, as an unfused op's output would be.
template <typename T>
inline void round_through(float* values, T* scratch, int64_t n) {
  if constexpr (!std::is_same_v<T, float>) {
    at::vec::convert(values, scratch, n);
    at::vec::convert(scratch, values, n);
  }
}

// out = silu(gate) * up over one row of n values in T: float32 math, silu as PyTorch's kernel computes
// it (x / (1 + exp(-x)), Sleef's exp) and rounded to T before the multiply. a, b: n floats of scratch,
// scratch: n of T.
template <typename T>
inline void silu_and_mul_row(const T* gate, const T* up, int64_t n, T* out, float* a, float* b, T* scratch) {
  const Vec one(1.0f);
  at::vec::convert(gate, a, n);
  at::vec::convert(up, b, n);
  map2(a, a, a, n, [&](Vec x, Vec) { return x / (one + x.neg().exp()); });
  round_through(a, scratch, n);
  map2(a, a, b, n, [](Vec s, Vec v) { return s * v; });
  at::vec::convert(a, out, n);
}

}  // namespace kvserve_vec
