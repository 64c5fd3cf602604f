// Paged attention on the CPU that reads K/V in place through block tables.
//
// kvserve_attention_cpu::paged_attention_out(out, query, kv_cache, block_tables, seq_lens, query_start_loc,
//                                  scale, sliding_window, soft_cap)
// kvserve_attention_cpu::isa() -> str   "avx512", "avx2" or "portable": what its loops run on here
//
// Writes, for every sequence s of the batch (num_seqs = seq_lens.numel()), the attention of its
// query rows query[query_start_loc[s] : query_start_loc[s+1]] (the last rows of the sequence: causal
// within the chunk, over all cached keys before it) into the same rows of out; rows past
// query_start_loc[num_seqs] (padding) are untouched.
// kv_cache is (2, num_blocks, block_size, kv_heads, head_dim), K then V, read where it lies: no
// gather, no padding to the longest sequence. Scores, softmax and the output accumulate in float32
// for float32, bfloat16 and float16 inputs (two passes over an L2-sized window of keys, whose scores
// a per-thread buffer keeps; an item's rows share each window, merging their windows as they go).
// A prefill item's rows score a window against keys transposed 32 at a time (a register tile of
// rows x keys) where enough rows and heads share them; decodes and short items score row by row.
// Work is one (sequence, query rows) item over every head, or, for a long decode or a short chunk
// over a long context, a slice of its keys merged afterwards (flash-decoding), so that two threads
// get even shares; items are handed out largest first from a shared counter on torch's intra-op
// pool. An item walks each cache block's token rows (all KV heads) front to back, prefetching the
// next tile's keys and values a little at a time.
// With AVX-512 (float32; bfloat16 q·k also needs AVX512-BF16) or AVX2 with FMA (float32 and
// bfloat16, widened) and a head size of 64, 128 or 256 (compiled in), a row scored on its own runs
// q·k 16 keys at a time with one transpose-add reduction, and p·V keeps a GQA group's (or a tile's
// pairs') accumulators in registers so each value row is converted once for all of them; other
// dtypes, head sizes and CPUs take portable loops the compiler vectorizes. Prefill rows score packed
// key tiles on both (AVX2: float32 tiles, bfloat16 keys widened as they are packed). No AMX.
// A speculative decoding verification step (1 + k rows after a long context, k <= 7) is a short item:
// its rows share each window, so K/V come from memory once for all of them, and what grows with k
// is the arithmetic, every row's q.k and p.V multiply-adds (4-6 per key, head and row; the loops run
// at this CPU's FMA rate). Measured, one thread, 32 sequences, bfloat16: 1 + 3 rows cost 2.8x a
// decode after 500 keys and 2.4x after 2,000 with 9/3 heads of 64, 2.4x and 2.3x with 32/8
// (benchmarks/attention_kernels.py --lookahead); scoring them against packed key tiles, one window
// over the whole context, or spreading the prefetches each changed that by under 5%.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__F16C__) || defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

// ---- rows of the input dtype to and from float32 (loops the compiler vectorizes) ----

inline void to_float(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }

inline void to_float(const c10::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint32_t>(bits[i]) << 16;  // bf16 is float's top half
}

inline void to_float(const c10::Half* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// A row as float32: float32 rows are used where they lie, others converted into buf.
template <typename T>
inline const float* as_float(const T* src, float* buf, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    to_float(src, buf, n);
    return buf;
  }
}

template <typename T>
inline void from_float(const float* src, T* dst, int64_t n, float mul) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src[i] * mul);
}

// ---- exp and tanh for the portable path (std::exp and std::tanh are library calls); the AVX-512
// path has 16-lane versions of both below ----

// exp(x) for x <= 0 (scores minus their max): 2^k * exp(r), |r| <= ln2 / 2, degree-6 Taylor
// polynomial (relative error ~1e-7); below -87 it returns ~1e-38 instead of a smaller number.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.f);
  const float k = std::floor(x * 1.44269504f + 0.5f);
  const float r = x - k * 0.693145751953125f - k * 1.428606765330187e-06f;  // ln2 split hi + lo
  const float poly =
      1.f + r * (1.f + r * (0.5f + r * (0.16666667f + r * (0.041666668f + r * (0.008333334f + r * 0.0013888889f)))));
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float two_k;
  std::memcpy(&two_k, &bits, sizeof(float));
  return poly * two_k;
}

// cap * tanh(x / cap) = sign(x) * cap * (1 - 2 / (exp(2|x| / cap) + 1))
inline float soft_capped(float x, float cap) {
  const float e = 1.f / exp_nonpositive(-std::min(2.f * std::abs(x) / cap, 80.f));
  return std::copysign(cap * (1.f - 2.f / (e + 1.f)), x);
}

// AVX512-BF16's vdpbf16ps multiplies bf16 pairs exactly in float32 and accumulates: q · k without
// converting either row.
#if defined(__AVX512BF16__)
constexpr bool kHaveBf16Dot = true;
#else
constexpr bool kHaveBf16Dot = false;
#endif

// ---- AVX-512 building blocks (the portable loops below serve everything else) ----

#if defined(__AVX512F__)
constexpr bool kHaveAvx512 = true;

// Sixteen vectors in, one out: lane t holds the sum of the lanes of acc[t] (a transpose-add tree,
// 45 shuffles and adds for 16 dot products instead of 16 horizontal reductions).
inline __m512 sum_each16(const __m512* acc) {
  __m512 t[8], u[4], v[2];
  for (int k = 0; k < 8; ++k)  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] of the pair (a, b)
    t[k] = _mm512_add_ps(_mm512_unpacklo_ps(acc[2 * k], acc[2 * k + 1]), _mm512_unpackhi_ps(acc[2 * k], acc[2 * k + 1]));
  for (int k = 0; k < 4; ++k)  // per 128-bit lane: that lane's sum of each of 4 vectors
    u[k] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * k], t[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(t[2 * k], t[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int k = 0; k < 2; ++k)  // then across the 128-bit lanes
    v[k] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * k], u[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(u[2 * k], u[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// 16 float32 of a row of T (bfloat16: the top half of a float32).
inline __m512 load16(const float* x) { return _mm512_loadu_ps(x); }
inline __m512 load16(const c10::BFloat16* x) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// The first `count` lanes (all 16 from 16 on).
inline __mmask16 lanes_below(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << count) - 1);
}

// exp_nonpositive and soft_capped on 16 lanes (GCC does not vectorize the scalar versions' floor).
inline __m512 exp_nonpositive16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 poly = _mm512_set1_ps(0.0013888889f);
  for (const float c : {0.008333334f, 0.041666668f, 0.16666667f, 0.5f, 1.f, 1.f})
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(c));
  return _mm512_scalef_ps(poly, k);  // poly * 2^k
}

inline __m512 soft_capped16(__m512 x, float cap) {
  const __m512 magnitude = _mm512_abs_ps(x);
  const __m512 a = _mm512_min_ps(_mm512_mul_ps(magnitude, _mm512_set1_ps(2.f / cap)), _mm512_set1_ps(80.f));
  const __m512 e = _mm512_div_ps(_mm512_set1_ps(1.f), exp_nonpositive16(_mm512_sub_ps(_mm512_setzero_ps(), a)));
  const __m512 y = _mm512_mul_ps(_mm512_set1_ps(cap), _mm512_sub_ps(_mm512_set1_ps(1.f),
                                 _mm512_div_ps(_mm512_set1_ps(2.f), _mm512_add_ps(e, _mm512_set1_ps(1.f)))));
  // the sign of x onto y (y >= 0)
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(y), _mm512_and_si512(_mm512_castps_si512(x),
                             _mm512_set1_epi32(static_cast<int32_t>(0x80000000u)))));
}

// The (unscaled) dot products of query row q with 16 key rows, one per lane; HEAD_DIM % 32 == 0.
template <typename T, int HEAD_DIM>
inline __m512 dots16(const T* q, const T* const* keys) {
  __m512 acc[16];
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) {
    acc[t] = _mm512_setzero_ps();
    if constexpr (std::is_same_v<T, c10::BFloat16> && kHaveBf16Dot) {  // bf16 pairs, exact products
#pragma GCC unroll 8
      for (int d = 0; d < HEAD_DIM; d += 32)
        acc[t] = _mm512_dpbf16_ps(acc[t], (__m512bh)_mm512_loadu_si512(q + d), (__m512bh)_mm512_loadu_si512(keys[t] + d));
    } else {
#pragma GCC unroll 16
      for (int d = 0; d < HEAD_DIM; d += 16) acc[t] = _mm512_fmadd_ps(load16(q + d), load16(keys[t] + d), acc[t]);
    }
  }
  return sum_each16(acc);
}

// acc[g][0..HEAD_DIM) = sum_j probs[g * stride + j] * v_j for GROUP rows of probabilities over the
// same values (the heads of one KV head, or those of several query rows), where v_j = values[j] +
// offset (a row of HEAD_DIM, a multiple of 64); with `accumulate`, added to what acc_out holds. The
// 64-wide column strips keep GROUP x 4 accumulators in registers and convert each value row once for
// all GROUP rows.
template <typename T, int HEAD_DIM, int GROUP>
inline void weighted_values(const T* const* values, int64_t offset, int64_t n, const float* probs, int64_t stride,
                            float* acc_out, bool accumulate = false) {
  for (int d0 = 0; d0 < HEAD_DIM; d0 += 64) {
    __m512 acc[GROUP][4];
    for (int g = 0; g < GROUP; ++g)
      for (int c = 0; c < 4; ++c)
        acc[g][c] = accumulate ? _mm512_loadu_ps(acc_out + g * HEAD_DIM + d0 + 16 * c) : _mm512_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      const T* v = values[j] + offset + d0;
      const __m512 v0 = load16(v), v1 = load16(v + 16), v2 = load16(v + 32), v3 = load16(v + 48);
      for (int g = 0; g < GROUP; ++g) {
        const __m512 w = _mm512_set1_ps(probs[g * stride + j]);
        acc[g][0] = _mm512_fmadd_ps(w, v0, acc[g][0]);
        acc[g][1] = _mm512_fmadd_ps(w, v1, acc[g][1]);
        acc[g][2] = _mm512_fmadd_ps(w, v2, acc[g][2]);
        acc[g][3] = _mm512_fmadd_ps(w, v3, acc[g][3]);
      }
    }
    for (int g = 0; g < GROUP; ++g)
      for (int c = 0; c < 4; ++c) _mm512_storeu_ps(acc_out + g * HEAD_DIM + d0 + 16 * c, acc[g][c]);
  }
}

// out[t] = scale * q . keys[t] for the first `count` (<= 16) of 16 keys.
template <typename T, int HEAD_DIM>
inline void score16(const T* q, const T* const* keys, float scale, int64_t count, float* out) {
  _mm512_mask_storeu_ps(out, lanes_below(count), _mm512_mul_ps(dots16<T, HEAD_DIM>(q, keys), _mm512_set1_ps(scale)));
}
#else
constexpr bool kHaveAvx512 = false;
#endif

// ---- AVX2 building blocks (CPUs with AVX2 and FMA but no AVX-512, such as AMD's before Zen 4) ----
// The row path's score16, weighted_values and softmax on 8-lane vectors (the packed prefill tiles'
// pack_keys and score_tile are further down); bfloat16 is widened to float32 as it is loaded (there
// is no bfloat16 instruction), so both dtypes multiply in float32. Measured on a 2-core AMD EPYC
// (Zen 3) per layer against the portable loops, SmolLM2's heads (benchmarks/attention_kernels.py,
// best of 3 alternating runs): the 32-sequence decode (100-500 cached) 0.80 -> 0.51 ms in float32,
// 0.81 -> 0.45 in bfloat16; a 512-token chunk after 2,488 cached 90 -> 45 ms and 109 -> 53 by rows,
// 29 and 36 with packed tiles (SDPA over gathered K/V: 32 ms in float32); 4 prompts of 128 2.1 ->
// 1.05 ms and 2.6 -> 1.3 by rows, 0.80 and 1.03 with tiles.

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define KVSERVE_AVX2 1
constexpr bool kHaveAvx2 = true;

inline __m256 load8(const float* x) { return _mm256_loadu_ps(x); }
inline __m256 load8(const c10::BFloat16* x) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// Lane t all ones where t < count: the mask of _mm256_maskload_ps / _mm256_maskstore_ps.
inline __m256i lanes_below8(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(count, 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Eight vectors in, one out: lane t holds the sum of the lanes of acc[t].
inline __m256 sum_each8(const __m256* acc) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
  // a: sums of acc[0..4) over the low 128-bit lane, then over the high one; b likewise for acc[4..8)
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

// out[t] = scale * q . keys[t] for the first `count` (<= 16) of 16 keys; HEAD_DIM % 8 == 0.
template <typename T, int HEAD_DIM>
inline void score16(const T* q, const T* const* keys, float scale, int64_t count, float* out) {
  for (int half = 0; half < 16 && half < count; half += 8) {
    __m256 acc[8];
#pragma GCC unroll 8
    for (int t = 0; t < 8; ++t) acc[t] = _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int d = 0; d < HEAD_DIM; d += 8) {
      const __m256 qd = load8(q + d);
#pragma GCC unroll 8
      for (int t = 0; t < 8; ++t) acc[t] = _mm256_fmadd_ps(qd, load8(keys[half + t] + d), acc[t]);
    }
    const __m256 dots = _mm256_mul_ps(sum_each8(acc), _mm256_set1_ps(scale));
    if (count - half >= 8)  // masked stores are slow on AMD's cores: only a partial vector takes one
      _mm256_storeu_ps(out + half, dots);
    else
      _mm256_maskstore_ps(out + half, lanes_below8(count - half), dots);
  }
}

// As the AVX-512 weighted_values: acc[g][0..HEAD_DIM) (+)= sum_j probs[g * stride + j] * v_j, in
// 16-column strips (GROUP x 2 accumulators, GROUP <= 4, each value row converted once per strip).
template <typename T, int HEAD_DIM, int GROUP>
inline void weighted_values(const T* const* values, int64_t offset, int64_t n, const float* probs, int64_t stride,
                            float* acc_out, bool accumulate = false) {
  for (int d0 = 0; d0 < HEAD_DIM; d0 += 16) {
    __m256 acc[GROUP][2];
    for (int g = 0; g < GROUP; ++g)
      for (int c = 0; c < 2; ++c)
        acc[g][c] = accumulate ? _mm256_loadu_ps(acc_out + g * HEAD_DIM + d0 + 8 * c) : _mm256_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      const T* v = values[j] + offset + d0;
      const __m256 v0 = load8(v), v1 = load8(v + 8);
      for (int g = 0; g < GROUP; ++g) {
        const __m256 w = _mm256_broadcast_ss(probs + g * stride + j);
        acc[g][0] = _mm256_fmadd_ps(w, v0, acc[g][0]);
        acc[g][1] = _mm256_fmadd_ps(w, v1, acc[g][1]);
      }
    }
    for (int g = 0; g < GROUP; ++g)
      for (int c = 0; c < 2; ++c) _mm256_storeu_ps(acc_out + g * HEAD_DIM + d0 + 8 * c, acc[g][c]);
  }
}

// exp_nonpositive on 8 lanes (2^k built in the exponent bits: k >= -126 after the clamp).
inline __m256 exp_nonpositive8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.428606765330187e-06f), r);
  __m256 poly = _mm256_set1_ps(0.0013888889f);
  for (const float c : {0.008333334f, 0.041666668f, 0.16666667f, 0.5f, 1.f, 1.f})
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(c));
  const __m256i two_k = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(poly, _mm256_castsi256_ps(two_k));
}

inline float reduce_max8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline float reduce_add8(__m256 v) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
}
#else
constexpr bool kHaveAvx2 = false;
#endif

// The row path's vector building blocks (score16, weighted_values) exist on this CPU.
constexpr bool kHaveVectorRows = kHaveAvx512 || kHaveAvx2;

// ---- one unit of work ----

struct Item {
  int64_t seq;      // row of block_tables / seq_lens
  int64_t q_begin;  // query rows of the sequence, relative to its first new token
  int64_t q_end;
  int64_t key_begin;  // a key slice [key_begin, key_end) of every row; -1: all visible keys
  int64_t key_end;
  int64_t partial;  // where a slice's first row's (max, sum, acc) go in the partials buffer (row r: partial + r);
                    // -1: write out directly
  int64_t cost;     // keys times query rows: the order items are handed out in
};

struct Problem {
  int64_t heads, kv_heads, head_dim, group, block_size, max_blocks;
  int64_t q_stride_token, q_stride_head, out_stride_token, out_stride_head;
  int64_t kv_stride_token, kv_stride_block, kv_half;  // elements: next token, next block, K -> V
  float scale, soft_cap;
  int64_t window;  // 0: none
  const int32_t* block_tables;
  const int32_t* seq_lens;
  const int32_t* query_start;
};

// Scratch of one thread, reused across items.
struct Scratch {
  std::vector<const void*> keys;  // each visible key's token row (all KV heads) in the cache
  std::vector<float> q, row, scores, acc, stats, state;
  std::vector<float> packed;                        // the tiled path's transposed key tile
  std::vector<const void*> query_rows;              // its (row, head) query vectors
  std::vector<std::pair<int64_t, int64_t>> ranges;  // an item's rows' visible keys
};

constexpr int64_t kKeyTile = 16;  // keys per dots16 call; score rows are padded to a multiple of it
constexpr int64_t kWindowBytes = 384 << 10;  // keys and values an item's rows share at a time: fits L2

// Asks for the cache lines of key rows [from, to) of keys (clipped to n; `row` elements each, from
// `offset` elements on: p.kv_half for the value rows), into the cache level HINT names.
// Blocks lie anywhere in the cache, so the hardware's stride prefetchers lose the trail at every
// block boundary; these hints keep the loads ahead of the arithmetic.
template <auto HINT = _MM_HINT_T0, typename T>
inline void prefetch_rows(const T* const* keys, int64_t from, int64_t to, int64_t n, int64_t row, int64_t offset = 0) {
  for (int64_t j = from; j < std::min(to, n); ++j) {
    const char* line = reinterpret_cast<const char*>(keys[j] + offset);
    for (int64_t b = 0; b < row * static_cast<int64_t>(sizeof(T)); b += 64) _mm_prefetch(line + b, HINT);
  }
}

// Scores of query row q_row (all heads) against keys[0..n): sc[h * stride + j], scaled. With `fetch`
// (the first row through a window of keys; the later rows find them cached), each tile of keys
// prefetches the next tile's key and value rows, a share before each head's dot products: issued in
// one burst, the requests overflow the core's miss queue and stall the loads behind them (measured:
// decode 1.2-1.5x slower from a cold cache). The values come along because they are weighed right
// after the scores. The tile after that is asked for into L2 in one burst, which L2's deeper miss
// queue takes: a decode's keys come from DRAM (every layer's cache in turn outgrows L3), and one tile
// of lead left the loads waiting on it. Measured on a 2-core AVX-512 CPU, 32 decodes, 12/4 heads of
// 64, 12 layers' caches in turn, evicted from L3 between passes, the kernel before and after built
// side by side and alternated for 11-15 rounds: bfloat16 0.93x the time after 50 keys, 0.78x after
// 150, 0.76x after 500-2,000; float32 1.0x / 0.85-0.91x / 0.84-0.88x; from hot caches unchanged; a
// further tile gained nothing. (`benchmarks/attention_kernels.py --layers 12` times such steps.)
template <typename T, int HEAD_DIM>
void score_keys(const Problem& p, const T* q_row, const T* const* keys, int64_t n, float* sc, int64_t stride,
                Scratch& s, bool fetch) {
  const int64_t D = HEAD_DIM ? HEAD_DIM : p.head_dim;
  if constexpr (kHaveVectorRows && HEAD_DIM % 32 == 0 && HEAD_DIM > 0 &&
                (std::is_same_v<T, float> || (std::is_same_v<T, c10::BFloat16> && (kHaveBf16Dot || kHaveAvx2)))) {
#if defined(__AVX512F__) || defined(KVSERVE_AVX2)
    const T* tile[kKeyTile];
    const int64_t row = p.kv_heads * D;
    const int64_t row_lines = (row * static_cast<int64_t>(sizeof(T)) + 63) / 64;
    if (fetch) prefetch_rows(keys, 0, kKeyTile, n, row);
    for (int64_t j0 = 0; j0 < n; j0 += kKeyTile) {
      const int64_t count = std::min(kKeyTile, n - j0);
      const int64_t ahead = j0 + kKeyTile;
      const int64_t lines = fetch ? std::clamp<int64_t>(n - ahead, 0, kKeyTile) * row_lines : 0;
      const int64_t per_head = (lines + p.heads - 1) / p.heads;  // one division a tile: one a head cost ~8%
      int64_t issued = 0, next_key = ahead, next_line = 0;  // the next line to ask for: (key, line of its row)
      if (fetch) {
        prefetch_rows<_MM_HINT_T1>(keys, ahead + kKeyTile, ahead + 2 * kKeyTile, n, row);
        prefetch_rows<_MM_HINT_T1>(keys, ahead + kKeyTile, ahead + 2 * kKeyTile, n, row, p.kv_half);
      }
      for (int64_t kv_head = 0; kv_head < p.kv_heads; ++kv_head) {
        for (int64_t t = 0; t < kKeyTile; ++t)  // a short tile repeats its last key; those lanes are not stored
          tile[t] = keys[j0 + std::min(t, count - 1)] + kv_head * D;
        for (int64_t h = kv_head * p.group; h < (kv_head + 1) * p.group; ++h) {
          for (const int64_t share = std::min(lines, issued + per_head); issued < share; ++issued) {
            const T* key_row = keys[next_key];
            _mm_prefetch(reinterpret_cast<const char*>(key_row) + next_line * 64, _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(key_row + p.kv_half) + next_line * 64, _MM_HINT_T0);
            if (++next_line == row_lines) {  // counters: a division a line cost a quarter of a decode's time
              next_line = 0;
              ++next_key;
            }
          }
          score16<T, HEAD_DIM>(q_row + h * p.q_stride_head, tile, p.scale, count, sc + h * stride + j0);
        }
      }
    }
#endif
  } else {
    s.q.resize(D);
    s.row.resize(D);
    for (int64_t h = 0; h < p.heads; ++h) {
      float* qf = s.q.data();
      to_float(q_row + h * p.q_stride_head, qf, D);
      const int64_t kv_offset = (h / p.group) * D;
      for (int64_t j = 0; j < n; ++j) {
        const float* kf = as_float(keys[j] + kv_offset, s.row.data(), D);
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < D; ++d) dot += qf[d] * kf[d];
        sc[h * stride + j] = dot * p.scale;
      }
    }
  }
}

// acc[h * D + d] = sum_j sc[h * stride + j] * V_j[h's KV head][d] for every head h.
template <typename T, int HEAD_DIM>
void weigh_values(const Problem& p, const T* const* keys, int64_t n, const float* sc, int64_t stride, float* acc,
                  Scratch& s) {
  const int64_t D = HEAD_DIM ? HEAD_DIM : p.head_dim;
  if constexpr (kHaveVectorRows && HEAD_DIM % 64 == 0 && HEAD_DIM > 0 &&
                (std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>)) {
#if defined(__AVX512F__) || defined(KVSERVE_AVX2)
    for (int64_t kv_head = 0; kv_head < p.kv_heads; ++kv_head) {
      const int64_t offset = p.kv_half + kv_head * D;
      for (int64_t g = 0; g < p.group; g += 4) {  // heads of the group four at a time
        const int64_t h = kv_head * p.group + g;
        const float* probs = sc + h * stride;
        float* out = acc + h * D;
        switch (std::min<int64_t>(4, p.group - g)) {
          case 4: weighted_values<T, HEAD_DIM, 4>(keys, offset, n, probs, stride, out); break;
          case 3: weighted_values<T, HEAD_DIM, 3>(keys, offset, n, probs, stride, out); break;
          case 2: weighted_values<T, HEAD_DIM, 2>(keys, offset, n, probs, stride, out); break;
          default: weighted_values<T, HEAD_DIM, 1>(keys, offset, n, probs, stride, out); break;
        }
      }
    }
#endif
  } else {
    s.row.resize(D);
    std::fill(acc, acc + p.heads * D, 0.f);
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t kv_head = 0; kv_head < p.kv_heads; ++kv_head) {
        const float* vf = as_float(keys[j] + p.kv_half + kv_head * D, s.row.data(), D);  // once for the group
        for (int64_t h = kv_head * p.group; h < (kv_head + 1) * p.group; ++h) {
          const float w = sc[h * stride + j];
          float* ah = acc + h * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) ah[d] += w * vf[d];
        }
      }
    }
  }
}

// scores[0..n) -> exp(score - max) in place (after the soft cap, if any); their max and sum out.
inline void softmax_unnormalized(float* scores, int64_t n, float soft_cap, float& max_out, float& sum_out) {
#if defined(__AVX512F__)
  const __m512 lowest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 m = lowest;
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 in = lanes_below(n - j);
    __m512 x = _mm512_maskz_loadu_ps(in, scores + j);
    if (soft_cap > 0.f) {
      x = soft_capped16(x, soft_cap);
      _mm512_mask_storeu_ps(scores + j, in, x);
    }
    m = _mm512_mask_max_ps(m, in, m, x);
  }
  const float top = _mm512_reduce_max_ps(m);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 in = lanes_below(n - j);
    const __m512 e = exp_nonpositive16(_mm512_sub_ps(_mm512_maskz_loadu_ps(in, scores + j), _mm512_set1_ps(top)));
    _mm512_mask_storeu_ps(scores + j, in, e);
    sum = _mm512_mask_add_ps(sum, in, sum, e);
  }
  max_out = top;
  sum_out = _mm512_reduce_add_ps(sum);
#elif defined(KVSERVE_AVX2)
  if (soft_cap > 0.f)
    for (int64_t j = 0; j < n; ++j) scores[j] = soft_capped(scores[j], soft_cap);
  const __m256 lowest = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 m = lowest;
  const int64_t whole = n / 8 * 8;  // whole vectors take plain loads and stores, the tail masked ones
  for (int64_t j = 0; j < whole; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(scores + j));
  const __m256i tail = lanes_below8(n - whole);
  if (whole < n)
    m = _mm256_max_ps(m, _mm256_blendv_ps(lowest, _mm256_maskload_ps(scores + whole, tail), _mm256_castsi256_ps(tail)));
  const float top = reduce_max8(m);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t j = 0; j < whole; j += 8) {
    const __m256 e = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(scores + j), _mm256_set1_ps(top)));
    _mm256_storeu_ps(scores + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (whole < n) {
    const __m256 e = _mm256_and_ps(
        exp_nonpositive8(_mm256_sub_ps(_mm256_maskload_ps(scores + whole, tail), _mm256_set1_ps(top))),
        _mm256_castsi256_ps(tail));
    _mm256_maskstore_ps(scores + whole, tail, e);
    sum = _mm256_add_ps(sum, e);
  }
  max_out = top;
  sum_out = reduce_add8(sum);
#else
  if (soft_cap > 0.f) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) scores[j] = soft_capped(scores[j], soft_cap);
  }
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < n; ++j) m = std::max(m, scores[j]);
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    scores[j] = exp_nonpositive(scores[j] - m);
    sum += scores[j];
  }
  max_out = m;
  sum_out = sum;
#endif
}

// Merges one window's (max, sum, acc[D]) of a row and head into its running state (max, sum, acc...):
// both rescaled to the larger max. A state with sum 0 has seen nothing yet and takes the window's.
inline void fold(float* state, float max, float sum, const float* acc, int64_t D) {
  if (state[1] == 0.f) {
    state[0] = max;
    state[1] = sum;
    std::memcpy(state + 2, acc, D * sizeof(float));
    return;
  }
  const float top = std::max(state[0], max), a = std::exp(state[0] - top), b = std::exp(max - top);
  state[0] = top;
  state[1] = state[1] * a + sum * b;
  float* st = state + 2;
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) st[d] = st[d] * a + acc[d] * b;
}

// ---- prefill: query rows against tiles of packed keys ----
// Scoring a row against keys one dot product at a time ends every dot in a reduction across lanes.
// A prefill item's rows (times the heads of a KV head) share each key, so its keys are transposed
// once, 32 at a time, and each query element is broadcast against 32 keys: a register tile of (row,
// head) pairs x 32 keys with no reduction, the packing paid once for all the pairs.

// Tiling pays once this many (row, head) pairs share a packed tile (measured: 8 rows x 3 heads ran
// 0.93-1.00x of the row-by-row path, 12 x 3 1.07-1.14x).
constexpr int64_t kMinTiledPairs = 32;
// ... and over a window of at least this many keys. AVX2: its 32-key tiles over fewer keys cost more
// than the rows' own scoring (measured, SmolLM2's heads: 16 prompts of 16 tokens 1.2x slower tiled, 8
// of 24 1.1x, 8 of 32 even, 8 of 64 1.45x faster, 2 of 300 1.7x).
constexpr int64_t kMinTiledKeys = kHaveAvx2 ? 33 : 1;

template <typename T, int HEAD_DIM>
constexpr bool kTiled = HEAD_DIM % 64 == 0 && HEAD_DIM > 0 &&
                        ((kHaveAvx512 && (std::is_same_v<T, float> || (std::is_same_v<T, c10::BFloat16> && kHaveBf16Dot))) ||
                         (kHaveAvx2 && (std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>)));

constexpr int64_t kPackKeys = 32;   // keys a packed tile holds: two (AVX2: four) vectors of scores per pair
constexpr int64_t kValueKeys = 128;  // keys whose values the pairs weigh before moving on: stays in L1

#if defined(__AVX512F__)

// r[0..16) becomes its transpose (32-bit lanes): r[c] lane t = the old r[t] lane c.
inline void transpose16(__m512* r) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // in each 128-bit lane L: u[4i + k] = column 4L + k of rows 4i..4i+3
    u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {  // then a 4 x 4 transpose of the 128-bit lanes of u[k], u[4+k], u[8+k], u[12+k]
    const __m512 v0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88), v1 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xDD);
    const __m512 v2 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88), v3 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xDD);
    r[k] = _mm512_shuffle_f32x4(v0, v2, 0x88);
    r[4 + k] = _mm512_shuffle_f32x4(v1, v3, 0x88);
    r[8 + k] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
    r[12 + k] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
  }
}

// Words (32 bits: a float32, or a pair of bfloat16) of a head row.
template <typename T, int HEAD_DIM>
constexpr int64_t kWords = std::is_same_v<T, float> ? HEAD_DIM : HEAD_DIM / 2;

// kt[w * 32 + t] = word w of key row keys[t] + offset, for t < count (<= 32); zero for the rest.
template <typename T, int HEAD_DIM>
inline void pack_keys(const T* const* keys, int64_t count, int64_t offset, float* kt) {
  for (int64_t half = 0; half < kPackKeys; half += 16) {
    for (int64_t w0 = 0; w0 < kWords<T, HEAD_DIM>; w0 += 16) {
      __m512 r[16];
      for (int64_t t = 0; t < 16; ++t)
        r[t] = half + t < count ? _mm512_loadu_ps(reinterpret_cast<const float*>(keys[half + t] + offset) + w0)
                                : _mm512_setzero_ps();
      transpose16(r);
      for (int64_t c = 0; c < 16; ++c) _mm512_storeu_ps(kt + (w0 + c) * kPackKeys + half, r[c]);
    }
  }
}

// sc[i * stride + t] = scale * q[i] . key t, for P query rows q[i] and the 32 keys packed in kt:
// each word of a query row is broadcast against 32 keys' words (bfloat16: vdpbf16ps on pairs).
template <typename T, int HEAD_DIM, int P>
inline void score_tile(const T* const* q, const float* kt, float scale, float* sc, int64_t stride) {
  __m512 lo[P], hi[P];
  for (int i = 0; i < P; ++i) lo[i] = hi[i] = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int64_t w = 0; w < kWords<T, HEAD_DIM>; ++w) {
    const __m512 k0 = _mm512_loadu_ps(kt + w * kPackKeys), k1 = _mm512_loadu_ps(kt + w * kPackKeys + 16);
    for (int i = 0; i < P; ++i) {
      if constexpr (std::is_same_v<T, float>) {
        const __m512 b = _mm512_set1_ps(q[i][w]);
        lo[i] = _mm512_fmadd_ps(b, k0, lo[i]);
        hi[i] = _mm512_fmadd_ps(b, k1, hi[i]);
      } else {
        const __m512bh b = (__m512bh)_mm512_set1_epi32(reinterpret_cast<const int32_t*>(q[i])[w]);
        lo[i] = _mm512_dpbf16_ps(lo[i], b, (__m512bh)_mm512_castps_si512(k0));
        hi[i] = _mm512_dpbf16_ps(hi[i], b, (__m512bh)_mm512_castps_si512(k1));
      }
    }
  }
  const __m512 s = _mm512_set1_ps(scale);
  for (int i = 0; i < P; ++i) {
    _mm512_storeu_ps(sc + i * stride, _mm512_mul_ps(lo[i], s));
    _mm512_storeu_ps(sc + i * stride + 16, _mm512_mul_ps(hi[i], s));
  }
}

#elif defined(KVSERVE_AVX2)
// AVX2 has no bfloat16 pair products: a packed tile holds float32 words, bfloat16 keys widened as
// they are packed.
template <typename T, int HEAD_DIM>
constexpr int64_t kWords = HEAD_DIM;

// r[0..8) becomes its transpose: r[c] lane t = the old r[t] lane c.
inline void transpose8(__m256* r) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {  // in each 128-bit lane L: u[4i + k] = column 4L + k of rows 4i..4i+3
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {  // then the 128-bit lanes: rows 0-3's with rows 4-7's, low halves, then high
    r[k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
    r[4 + k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
  }
}

// kt[d * 32 + t] = element d (as float32) of key row keys[t] + offset, for t < count (<= 32); zero
// for the rest.
template <typename T, int HEAD_DIM>
inline void pack_keys(const T* const* keys, int64_t count, int64_t offset, float* kt) {
  for (int64_t part = 0; part < kPackKeys; part += 8) {
    for (int64_t d0 = 0; d0 < HEAD_DIM; d0 += 8) {
      __m256 r[8];
      for (int64_t t = 0; t < 8; ++t)
        r[t] = part + t < count ? load8(keys[part + t] + offset + d0) : _mm256_setzero_ps();
      transpose8(r);
      for (int64_t c = 0; c < 8; ++c) _mm256_storeu_ps(kt + (d0 + c) * kPackKeys + part, r[c]);
    }
  }
}

// sc[i * stride + t] = scale * q[i] . key t, for P (<= 6) query rows q[i] and the 32 keys packed in
// kt, 16 keys at a time: each element of a query row is broadcast against 16 keys' elements, P x 2
// accumulators (the linear kernel's register tile).
template <typename T, int HEAD_DIM, int P>
inline void score_tile(const T* const* q, const float* kt, float scale, float* sc, int64_t stride) {
  for (int64_t half = 0; half < kPackKeys; half += 16) {
    __m256 acc[P][2];
    for (int i = 0; i < P; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int64_t d = 0; d < HEAD_DIM; ++d) {
      const __m256 k0 = _mm256_loadu_ps(kt + d * kPackKeys + half), k1 = _mm256_loadu_ps(kt + d * kPackKeys + half + 8);
      for (int i = 0; i < P; ++i) {
        const __m256 b = _mm256_set1_ps(static_cast<float>(q[i][d]));
        acc[i][0] = _mm256_fmadd_ps(b, k0, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(b, k1, acc[i][1]);
      }
    }
    const __m256 s = _mm256_set1_ps(scale);
    for (int i = 0; i < P; ++i) {
      _mm256_storeu_ps(sc + i * stride + half, _mm256_mul_ps(acc[i][0], s));
      _mm256_storeu_ps(sc + i * stride + half + 8, _mm256_mul_ps(acc[i][1], s));
    }
  }
}
#endif

// Attention of one window of keys, keys[0..n) = keys [w0, w0 + n), for rows [q_begin, q_end) of an
// item (ranges[r]: the keys row q_begin + r sees), folded into each row's state (s.state, as in
// run_item), one KV head at a time: score every (row, head of the group) pair against packed key
// tiles, turn each pair's scores into probabilities over the keys its row sees (zero elsewhere),
// weigh the values for four pairs at a time, kValueKeys keys at a time, and fold.
template <typename T, int HEAD_DIM>
void attend_window_tiled(const Problem& p, const Item& item, const T* query, int64_t q_start, const T* const* keys,
                         int64_t w0, int64_t n, const std::pair<int64_t, int64_t>* ranges, Scratch& s) {
#if defined(__AVX512F__) || defined(KVSERVE_AVX2)
  if constexpr (kTiled<T, HEAD_DIM>) {
    constexpr int64_t D = HEAD_DIM;
    const int64_t rows = item.q_end - item.q_begin, G = p.group, pairs = rows * G;
    const int64_t stride = (n + kPackKeys - 1) / kPackKeys * kPackKeys;
    s.packed.resize(kWords<T, HEAD_DIM> * kPackKeys);
    s.scores.resize(pairs * stride);
    s.acc.resize(pairs * D);
    s.stats.resize(2 * pairs);
    s.query_rows.resize(pairs);
    float *sc = s.scores.data(), *maxes = s.stats.data(), *sums = maxes + pairs;
    const T** q = reinterpret_cast<const T**>(s.query_rows.data());
    for (int64_t kv_head = 0; kv_head < p.kv_heads; ++kv_head) {
      for (int64_t r = 0; r < rows; ++r)  // pair r * G + g: row q_begin + r, head kv_head * G + g
        for (int64_t g = 0; g < G; ++g)
          q[r * G + g] = query + (q_start + item.q_begin + r) * p.q_stride_token + (kv_head * G + g) * p.q_stride_head;
      for (int64_t j0 = 0; j0 < n; j0 += kPackKeys) {
        // the next tile's keys into L1 for its packing, this tile's values into L2 for the weighing
        for (int64_t t = j0 + kPackKeys; t < std::min(n, j0 + 2 * kPackKeys); ++t)
          for (int64_t b = 0; b < D * static_cast<int64_t>(sizeof(T)); b += 64) {
            _mm_prefetch(reinterpret_cast<const char*>(keys[t] + kv_head * D) + b, _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(keys[t - kPackKeys] + p.kv_half + kv_head * D) + b, _MM_HINT_T1);
          }
        pack_keys<T, HEAD_DIM>(keys + j0, std::min(kPackKeys, n - j0), kv_head * D, s.packed.data());
        for (int64_t i = 0; i < pairs; i += 6) {
          float* tile_sc = sc + i * stride + j0;
          switch (std::min<int64_t>(6, pairs - i)) {
            case 6: score_tile<T, HEAD_DIM, 6>(q + i, s.packed.data(), p.scale, tile_sc, stride); break;
            case 5: score_tile<T, HEAD_DIM, 5>(q + i, s.packed.data(), p.scale, tile_sc, stride); break;
            case 4: score_tile<T, HEAD_DIM, 4>(q + i, s.packed.data(), p.scale, tile_sc, stride); break;
            case 3: score_tile<T, HEAD_DIM, 3>(q + i, s.packed.data(), p.scale, tile_sc, stride); break;
            case 2: score_tile<T, HEAD_DIM, 2>(q + i, s.packed.data(), p.scale, tile_sc, stride); break;
            default: score_tile<T, HEAD_DIM, 1>(q + i, s.packed.data(), p.scale, tile_sc, stride); break;
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t a = std::clamp(ranges[r].first - w0, int64_t{0}, n), b = std::clamp(ranges[r].second - w0, a, n);
        for (int64_t k = r * G; k < (r + 1) * G; ++k) {
          float* row = sc + k * stride;
          sums[k] = 0.f;  // a row that sees none of the window's keys folds nothing
          if (b > a) softmax_unnormalized(row + a, b - a, p.soft_cap, maxes[k], sums[k]);
          std::fill(row, row + a, 0.f);
          std::fill(row + b, row + n, 0.f);
        }
      }
      const int64_t offset = p.kv_half + kv_head * D;
      for (int64_t j0 = 0; j0 < n; j0 += kValueKeys) {
        const int64_t m = std::min(kValueKeys, n - j0);
        for (int64_t i = 0; i < pairs; i += 4) {
          const float* probs = sc + i * stride + j0;
          float* acc = s.acc.data() + i * D;
          switch (std::min<int64_t>(4, pairs - i)) {
            case 4: weighted_values<T, HEAD_DIM, 4>(keys + j0, offset, m, probs, stride, acc, j0 > 0); break;
            case 3: weighted_values<T, HEAD_DIM, 3>(keys + j0, offset, m, probs, stride, acc, j0 > 0); break;
            case 2: weighted_values<T, HEAD_DIM, 2>(keys + j0, offset, m, probs, stride, acc, j0 > 0); break;
            default: weighted_values<T, HEAD_DIM, 1>(keys + j0, offset, m, probs, stride, acc, j0 > 0); break;
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = r * G; k < (r + 1) * G; ++k)
          if (sums[k] > 0.f)
            fold(s.state.data() + (r * p.heads + kv_head * G + k - r * G) * (D + 2), maxes[k], sums[k],
                 s.acc.data() + k * D, D);
    }
  }
#endif
}

// attend_window_tiled's job one row at a time, for decodes, few rows and the portable path: each row
// scores the keys it sees for all heads, the window's first row prefetching them for the others.
template <typename T, int HEAD_DIM>
void attend_window_rows(const Problem& p, const Item& item, const T* query, int64_t q_start, const T* const* keys,
                        int64_t w0, int64_t n, const std::pair<int64_t, int64_t>* ranges, Scratch& s) {
  const int64_t D = HEAD_DIM ? HEAD_DIM : p.head_dim, H = p.heads;
  s.acc.resize(H * D);
  s.stats.resize(2 * H);
  float *maxes = s.stats.data(), *sums = maxes + H;
  bool fetched = false;
  for (int64_t r = 0; r < item.q_end - item.q_begin; ++r) {
    const int64_t lo = std::max(ranges[r].first, w0), hi = std::min(ranges[r].second, w0 + n), count = hi - lo;
    if (count <= 0) continue;
    const int64_t stride = (count + kKeyTile - 1) / kKeyTile * kKeyTile;
    s.scores.resize(H * stride);
    float* sc = s.scores.data();
    const T* const* row_keys = keys + (lo - w0);
    score_keys<T, HEAD_DIM>(p, query + (q_start + item.q_begin + r) * p.q_stride_token, row_keys, count, sc, stride, s,
                            !fetched);
    fetched = true;
    for (int64_t h = 0; h < H; ++h) softmax_unnormalized(sc + h * stride, count, p.soft_cap, maxes[h], sums[h]);
    weigh_values<T, HEAD_DIM>(p, row_keys, count, sc, stride, s.acc.data(), s);
    for (int64_t h = 0; h < H; ++h) fold(s.state.data() + (r * H + h) * (D + 2), maxes[h], sums[h], s.acc.data() + h * D, D);
  }
}

// Attention of query rows [q_begin, q_end) of one item, every head. Keys [lo, hi) of each row; writes
// either out (normalized) or a partial. HEAD_DIM: the head size as a constant (the loops over it
// unroll and the AVX-512 paths apply), or 0 to read it from p.
template <typename T, int HEAD_DIM>
void run_item(const Problem& p, const Item& item, const T* query, const T* kv, T* out, float* partials,
              Scratch& s) {
  const int64_t D = HEAD_DIM ? HEAD_DIM : p.head_dim, H = p.heads;
  const int32_t* table = p.block_tables + item.seq * p.max_blocks;
  const int64_t seq_len = p.seq_lens[item.seq];
  const int64_t q_start = p.query_start[item.seq];
  const int64_t q_len = p.query_start[item.seq + 1] - q_start;
  const int64_t context = seq_len - q_len;
  // Keys [lo, hi) that row i sees; both bounds grow with i, so one pointer per key of the item's
  // widest range serves every row.
  const auto visible = [&](int64_t i) {
    const int64_t pos = context + i;
    int64_t lo = p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1) : 0, hi = pos + 1;
    if (item.key_begin >= 0) {
      lo = std::max(lo, item.key_begin);
      hi = std::min(hi, item.key_end);
    }
    return std::make_pair(lo, std::max(lo, hi));
  };
  const int64_t first = visible(item.q_begin).first, last = visible(item.q_end - 1).second;
  s.keys.resize(last - first);
  const T** keys_from_first = reinterpret_cast<const T**>(s.keys.data());
  for (int64_t j = first; j < last;) {  // block by block: no division per key
    const T* row = kv + table[j / p.block_size] * p.kv_stride_block + (j % p.block_size) * p.kv_stride_token;
    for (const int64_t end = std::min(last, (j / p.block_size + 1) * p.block_size); j < end; ++j, row += p.kv_stride_token)
      keys_from_first[j - first] = row;
  }

  // Rows walk the item's keys a window at a time, every row through one window before the next, so
  // that a window's keys and values, sized to stay in L2, come from memory once for all the rows
  // rather than once a row (a 16-row tile over 3,000 keys read its 2.3 MB sixteen times). Each row
  // keeps (max, sum, acc) per head across windows, merged as key slices are. A decode walks windows
  // too: over one window of all its keys, the values its scoring prefetches leave L2 before they are
  // weighed once the context's K/V outgrow it, and come from memory twice (measured, one thread, 32
  // decodes of 2,000 keys, heads of 64: bfloat16 32/8 heads 30.5 -> 16.9 ms, 9/3 6.6 -> 5.4 ms;
  // float32 39.1 -> 25.4 and 11.0 -> 9.5 ms; after 500 keys 1-10% faster).
  const int64_t key_bytes = 2 * p.kv_stride_token * static_cast<int64_t>(sizeof(T));
  const int64_t rows = item.q_end - item.q_begin;
  const int64_t window = std::max<int64_t>(kKeyTile, kWindowBytes / key_bytes / kKeyTile * kKeyTile);
  s.state.resize(rows * H * (D + 2));  // per row and head: max, sum, acc[D]; sum 0: nothing yet
  for (int64_t k = 0; k < rows * H; ++k) {  // a row that sees none of a slice's keys stays so (merged as empty)
    s.state[k * (D + 2)] = -std::numeric_limits<float>::infinity();
    s.state[k * (D + 2) + 1] = 0.f;
  }
  s.ranges.resize(rows);
  for (int64_t i = item.q_begin; i < item.q_end; ++i) s.ranges[i - item.q_begin] = visible(i);
  const bool tiled = kTiled<T, HEAD_DIM> && rows * p.group >= kMinTiledPairs;
  for (int64_t w0 = first; w0 < last; w0 += window) {
    const T* const* window_keys = keys_from_first + (w0 - first);
    const int64_t n = std::min(window, last - w0);
    if (tiled && n >= kMinTiledKeys)
      attend_window_tiled<T, HEAD_DIM>(p, item, query, q_start, window_keys, w0, n, s.ranges.data(), s);
    else
      attend_window_rows<T, HEAD_DIM>(p, item, query, q_start, window_keys, w0, n, s.ranges.data(), s);
  }

  for (int64_t i = item.q_begin; i < item.q_end; ++i) {
    const float* row_state = s.state.data() + (i - item.q_begin) * H * (D + 2);
    if (item.partial >= 0) {  // a key slice: (max, sum, acc) per head, merged later
      std::memcpy(partials + (item.partial + i - item.q_begin) * H * (D + 2), row_state, H * (D + 2) * sizeof(float));
    } else {
      T* o = out + (q_start + i) * p.out_stride_token;
      for (int64_t h = 0; h < H; ++h) {
        const float* st = row_state + h * (D + 2);
        from_float(st + 2, o + h * p.out_stride_head, D, st[1] > 0.f ? 1.f / st[1] : 0.f);
      }
    }
  }
}

// Combines the key slices of one query row (token), partials first, first + stride, ..., folding
// each into a running (max, sum, acc) as a prefill row folds its windows. A slice wholly after the
// row's position (a chunk's early rows) is empty: sum 0, skipped.
template <typename T>
void merge_slices(const Problem& p, int64_t token, int64_t first, int64_t count, int64_t stride,
                  const float* partials, T* out, std::vector<float>& state) {
  const int64_t D = p.head_dim, H = p.heads;
  state.resize(D + 2);
  for (int64_t h = 0; h < H; ++h) {
    state[1] = 0.f;
    for (int64_t k = 0; k < count; ++k) {
      const float* ph = partials + ((first + k * stride) * H + h) * (D + 2);
      if (ph[1] != 0.f) fold(state.data(), ph[0], ph[1], ph + 2, D);
    }
    T* o = out + token * p.out_stride_token + h * p.out_stride_head;
    if (state[1] > 0.f)
      from_float(state.data() + 2, o, D, 1.f / state[1]);
    else
      std::fill(o, o + D, T(0));
  }
}

// Runs fn(item index) for indices 0..n-1 on torch's intra-op threads, each taking the next index.
template <typename F>
void run_dynamic(int64_t n, const F& fn) {
  std::atomic<int64_t> next{0};
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), n);
  at::parallel_for(0, std::max<int64_t>(threads, 1), 1, [&](int64_t, int64_t) {
    for (int64_t i; (i = next.fetch_add(1)) < n;) fn(i);
  });
}

constexpr int64_t kQueryTile = 16;        // query rows per prefill item
constexpr int64_t kMaxSlicedChunk = 64;   // a chunk of at most this many rows may have its keys sliced
constexpr int64_t kMinSliceKeys = 256;    // a key slice is at least this long

void paged_attention_out(at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache,
                         const at::Tensor& block_tables, const at::Tensor& seq_lens,
                         const at::Tensor& query_start_loc, double scale,
                         int64_t sliding_window, double soft_cap) {
  TORCH_CHECK(query.device().is_cpu() && kv_cache.device().is_cpu(), "paged_attention_out: CPU tensors only");
  TORCH_CHECK(query.dim() == 3 && out.sizes() == query.sizes(), "query and out must be [tokens, heads, head_dim]");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(),
              "kv_cache must be a contiguous (2, num_blocks, block_size, kv_heads, head_dim) tensor");
  TORCH_CHECK(query.scalar_type() == kv_cache.scalar_type() && out.scalar_type() == query.scalar_type(),
              "query, out and kv_cache must share a dtype");
  TORCH_CHECK(query.stride(2) == 1 && out.stride(2) == 1, "query and out need a contiguous last dimension");
  for (const at::Tensor* t : {&block_tables, &seq_lens, &query_start_loc})
    TORCH_CHECK(t->scalar_type() == at::kInt && t->is_contiguous() && t->device().is_cpu(),
                "block_tables, seq_lens and query_start_loc must be contiguous int32 CPU tensors");
  const int64_t num = seq_lens.numel();
  TORCH_CHECK(query_start_loc.numel() == num + 1 && block_tables.dim() == 2 && block_tables.size(0) >= num,
              "query_start_loc must have num_seqs + 1 entries and block_tables num_seqs rows (num_seqs = ", num, ")");
  Problem p;
  p.heads = query.size(1);
  p.kv_heads = kv_cache.size(3);
  p.head_dim = query.size(2);
  TORCH_CHECK(kv_cache.size(4) == p.head_dim && p.heads % p.kv_heads == 0, "head sizes or head counts disagree");
  p.group = p.heads / p.kv_heads;
  p.block_size = kv_cache.size(2);
  p.max_blocks = block_tables.size(1);
  p.q_stride_token = query.stride(0);
  p.q_stride_head = query.stride(1);
  p.out_stride_token = out.stride(0);
  p.out_stride_head = out.stride(1);
  p.kv_stride_token = p.kv_heads * p.head_dim;
  p.kv_stride_block = p.block_size * p.kv_stride_token;
  p.kv_half = kv_cache.size(1) * p.kv_stride_block;
  p.scale = static_cast<float>(scale);
  p.soft_cap = static_cast<float>(soft_cap);
  p.window = sliding_window;
  p.block_tables = block_tables.data_ptr<int32_t>();
  p.seq_lens = seq_lens.data_ptr<int32_t>();
  p.query_start = query_start_loc.data_ptr<int32_t>();

  // plan: query tiles for prefills; decodes whole. A decode's keys are sliced when the decodes alone
  // cannot keep every thread busy for long; a short prefill's (a chunk among decodes) when, whole, it
  // would be one item costlier than a thread's fair share of the step, leaving one thread to finish it
  // alone. Slices split keys, not rows, so each key row is still read once.
  const int64_t threads = at::get_num_threads();
  int64_t decodes = 0, total_cost = 0;  // cost: query rows times the keys they span
  const auto span_begin = [&](int64_t seq_len, int64_t q_len) {  // the first key any of the rows sees
    return p.window > 0 ? std::max<int64_t>(0, seq_len - q_len - p.window + 1) : 0;
  };
  for (int64_t seq = 0; seq < num; ++seq) {
    const int64_t q_len = p.query_start[seq + 1] - p.query_start[seq], seq_len = p.seq_lens[seq];
    TORCH_CHECK(seq_len >= q_len && (seq_len + p.block_size - 1) / p.block_size <= p.max_blocks,
                "sequence ", seq, ": seq_len ", seq_len, " does not fit its query or block table");
    decodes += q_len == 1;
    total_cost += q_len * (seq_len - span_begin(seq_len, q_len));
  }
  const int64_t fair_share = std::max<int64_t>(1, total_cost / (2 * threads));
  std::vector<Item> items;
  struct Merge { int64_t token, first, count, stride; };  // a row's slices: partials first, first + stride, ...
  std::vector<Merge> merges;
  int64_t num_partials = 0;
  for (int64_t seq = 0; seq < num; ++seq) {
    const int64_t q_len = p.query_start[seq + 1] - p.query_start[seq];
    const int64_t seq_len = p.seq_lens[seq];
    if (q_len == 0) continue;
    const int64_t lo = span_begin(seq_len, q_len), span = seq_len - lo;
    int64_t slices = 1;
    if (threads > 1 && q_len == 1 && decodes < 4 * threads)
      slices = std::min<int64_t>((4 * threads + decodes - 1) / decodes, span / kMinSliceKeys);
    else if (threads > 1 && q_len > 1 && q_len <= kMaxSlicedChunk)
      slices = std::min<int64_t>((q_len * span + fair_share - 1) / fair_share, span / kMinSliceKeys);
    if (slices <= 1) {
      for (int64_t q0 = 0; q0 < q_len; q0 += kQueryTile) {
        const int64_t q1 = std::min(q_len, q0 + kQueryTile);
        items.push_back({seq, q0, q1, -1, -1, -1, span * (q1 - q0)});
      }
      continue;
    }
    // partials slice-major: slice k's row r at num_partials + k * q_len + r
    for (int64_t r = 0; r < q_len; ++r) merges.push_back({p.query_start[seq] + r, num_partials + r, slices, q_len});
    for (int64_t k = 0; k < slices; ++k) {
      const int64_t b = lo + span * k / slices, e = lo + span * (k + 1) / slices;
      items.push_back({seq, 0, q_len, b, e, num_partials + k * q_len, (e - b) * q_len});
    }
    num_partials += slices * q_len;
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
  std::vector<float> partials(num_partials * p.heads * (p.head_dim + 2));

  auto run = [&](auto* tag) {
    using scalar_t = std::remove_pointer_t<decltype(tag)>;
    const scalar_t* q = query.data_ptr<scalar_t>();
    const scalar_t* kv = kv_cache.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    float* parts = partials.data();
    auto item_fn = p.head_dim == 64    ? &run_item<scalar_t, 64>
                   : p.head_dim == 128 ? &run_item<scalar_t, 128>
                   : p.head_dim == 256 ? &run_item<scalar_t, 256>
                                       : &run_item<scalar_t, 0>;
    run_dynamic(static_cast<int64_t>(items.size()), [&](int64_t i) {
      thread_local Scratch scratch;
      item_fn(p, items[i], q, kv, o, parts, scratch);
    });
    if (!merges.empty())
      run_dynamic(static_cast<int64_t>(merges.size()), [&](int64_t i) {
        thread_local std::vector<float> state;
        const Merge& m = merges[i];
        merge_slices<scalar_t>(p, m.token, m.first, m.count, m.stride, parts, o, state);
      });
  };
  switch (query.scalar_type()) {
    case at::kFloat: run(static_cast<float*>(nullptr)); break;
    case at::kBFloat16: run(static_cast<c10::BFloat16*>(nullptr)); break;
    case at::kHalf: run(static_cast<c10::Half*>(nullptr)); break;
    default: TORCH_CHECK(false, "paged_attention_out: dtype ", query.scalar_type(), " not supported (float32, bfloat16, float16)");
  }
}

// The vector instructions the kernel's loops run on here: "avx512", "avx2" or "portable".
std::string isa() { return kHaveAvx512 ? "avx512" : kHaveAvx2 ? "avx2" : "portable"; }

}  // namespace

TORCH_LIBRARY(kvserve_attention_cpu, m) {
  m.def("isa() -> str", &isa);
  m.def(
      "paged_attention_out(Tensor(a!) out, Tensor query, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, "
      "Tensor query_start_loc, float scale, int sliding_window, float soft_cap) -> ()");
}

TORCH_LIBRARY_IMPL(kvserve_attention_cpu, CPU, m) { m.impl("paged_attention_out", &paged_attention_out); }
