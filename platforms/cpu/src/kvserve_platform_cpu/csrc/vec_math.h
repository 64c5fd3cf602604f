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

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace kvserve_vec {

using Vec = at::vec::Vectorized<float>;

// `count` (at most Vec::size()) values of T at p, widened to float32 (lanes past count: zero).
template <typename T>
inline Vec load_float(const T* p, int64_t count) {
  if constexpr (std::is_same_v<T, float>) {
    return Vec::loadu(p, count);
  } else {
    if constexpr (at::is_reduced_floating_point_v<T>) {
      if (count == Vec::size()) {
        Vec out;
        at::vec::load_to_float<T>(p, out);
        return out;
      }
    }
    alignas(64) float wide[Vec::size()] = {};
    at::vec::convert(p, wide, count);
    return Vec::loadu(wide);
  }
}

#if defined(__AVX512BF16__)
// 16 float32 rounded to bfloat16 (nearest even) in one instruction where the CPU has it (at::vec rounds
// with integer arithmetic): the same bits for every finite value.
inline __m256i to_bf16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }
#endif

// v as T holds it: rounded to bfloat16 or float16 and widened back (float32 and float64 hold it exactly).
template <typename T>
inline Vec rounded(const Vec& v) {
#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, c10::BFloat16>)
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16(v)), 16));
  else
#endif
  if constexpr (at::is_reduced_floating_point_v<T>)
    return std::get<0>(at::vec::convert_to_float<T>(at::vec::convert_from_float<T>(v, v)));
  else
    return v;
}

// v's first `count` lanes stored at p in T (rounded to nearest even, as at::vec::convert rounds).
template <typename T>
inline void store_as(T* p, const Vec& v, int64_t count) {
  if constexpr (std::is_same_v<T, float>) {
    v.store(p, count);
#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__)
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    _mm256_mask_storeu_epi16(p, static_cast<__mmask16>((1u << count) - 1), to_bf16(v));
#endif
  } else if constexpr (at::is_reduced_floating_point_v<T>) {
    at::vec::convert_from_float<T>(v, v).store(p, count);
  } else {
    alignas(64) float narrow[Vec::size()];
    v.store(narrow);
    at::vec::convert(narrow, p, count);
  }
}

// out = silu(gate) * up over one row of n values in T (out may be gate): float32 math, silu as PyTorch's
// kernel computes it (x / (1 + exp(-x)), Sleef's exp) and rounded to T before the multiply; one pass
// over registers.
template <typename T>
inline void silu_and_mul_row(const T* gate, const T* up, int64_t n, T* out) {
  const Vec one(1.0f);
  for (int64_t i = 0; i < n; i += Vec::size()) {
    const int64_t count = std::min<int64_t>(Vec::size(), n - i);
    const Vec x = load_float(gate + i, count);
    store_as(out + i, rounded<T>(x / (one + x.neg().exp())) * load_float(up + i, count), count);
  }
}

}  // namespace kvserve_vec
