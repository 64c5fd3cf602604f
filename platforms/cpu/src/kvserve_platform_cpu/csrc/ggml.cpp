// GGUF weights kept in llama.cpp's GGML blocks, multiplied by rows of activations in two ways; `ggml_layer`, a
// layer's one call, picks per part by the number of rows (up to `ggml_dot_rows` on the first) and by type, and
// float32 rows always take the second:
//
// - `ggml_linear`, a decode step's few rows: activations quantized as llama.cpp quantizes them, per 32-weight block
//   to int8 with one float scale (its Q8_0/Q8_1), so a block's product is an integer dot of 32 bytes scaled
//   once. Types: the 32-weight ones, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0. Every output feature's blocks are read
//   once per row from cache, so the weight streams from memory once per call. AVX-512 VNNI (`vpdpbusd` on 512-bit vectors, two blocks a step: u8 x s8
//   sums four products per int32 lane; four output features a step share the activations, their weights
//   prefetched well ahead) where the build has it, a portable scalar loop everywhere. Q8_0
//   weights are signed: as llama.cpp does, the weight's absolute value is the unsigned operand and its sign
//   moves onto the activation, which leaves every product unchanged (|-128| wraps to the unsigned 128).
// - `ggml_tiled_linear`, any number of rows (prefill chunks, batched decode steps; every row of float32
//   activations): each thread dequantizes a tile of kTile output features (the arithmetic of
//   kvserve_quant_gguf/ggml.py: the very weights `quantization="none"` holds) and multiplies every row against
//   it while it is in cache. So the weight is read once per call and each dequantized value serves all M rows;
//   no layer is ever dequantized whole. Types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K. bfloat16
//   rows take tiles rounded to bfloat16 (to nearest even), on AVX512-BF16 (`vdpbf16ps`: 4 rows x 4 features of
//   16-lane float32 sums, one 32-element k step per instruction) where the build has it, else in the float32
//   loop; float32 rows take float32 tiles (dequantized on AVX-512 where the build has it), multiplied on AVX-512
//   FMA or in a float32 loop the compiler vectorizes (4 rows x 4 features of 16-lane sums, 32-row panels 256 k
//   at a time), so their products are the dense float32 ones up to the order of the sums.
//
// Measured (single thread, 2-core AMD EPYC with AVX512-BF16, shared machine): see docs/gguf.md.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#include <immintrin.h>
#define KVSERVE_VNNI 1
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__) && defined(__F16C__)
#include <immintrin.h>
#define KVSERVE_AVX512 1
#endif
#if defined(__AVX512BF16__) && defined(KVSERVE_AVX512)
#define KVSERVE_BF16 1
#endif

namespace {

constexpr int64_t kBlock = 32;
constexpr int64_t kSuper = 256;  // the K-quants' super-block
// GGML type ids (ggml.h's enum ggml_type).
constexpr int64_t kQ4_0 = 2;
constexpr int64_t kQ4_1 = 3;
constexpr int64_t kQ5_0 = 6;
constexpr int64_t kQ5_1 = 7;
constexpr int64_t kQ8_0 = 8;
constexpr int64_t kQ4_K = 12;
constexpr int64_t kQ5_K = 13;
constexpr int64_t kQ6_K = 14;

// Weights and bytes per block of each type (ggml's block structs), the one place the kernels read them.
constexpr int64_t block_weights(int64_t type) {
  return type == kQ4_K || type == kQ5_K || type == kQ6_K ? kSuper : kBlock;
}
constexpr int64_t block_bytes(int64_t type) {
  switch (type) {
    case kQ4_0: return 18;
    case kQ4_1: return 20;
    case kQ5_0: return 22;
    case kQ5_1: return 24;
    case kQ8_0: return 34;
    case kQ4_K: return 144;
    case kQ5_K: return 176;
    case kQ6_K: return 210;
    default: return 0;  // not a type these kernels run
  }
}
// Bytes of one output feature's blocks over k (a multiple of the type's block).
constexpr int64_t row_bytes(int64_t type, int64_t k) { return k / block_weights(type) * block_bytes(type); }
// Rows up to which `ggml_linear`'s integer dots beat the tiles (single thread, Q4_1, SmolLM2's 30 layers of
// fused shapes, weights out of cache: 1 row 3.2-3.4 ms vs 6.7, 2 rows 6.0 vs 7.4, 3 rows 8.2-8.3 vs 9.5-9.7,
// 4 rows 10.7-10.8 vs 7.9-8.2).
constexpr int64_t kDotRows = 3;
// Output features a thread dequantizes at once: kTile x K bfloat16 stays in L2 (96 KiB at K = 1536) while
// every row passes over it, and a 576-feature layer still splits into 18 tiles across threads.
constexpr int64_t kTile = 32;
// How far ahead of the block being dequantized its weight is fetched: the blocks stream from memory once per
// call, and without a software prefetch a tile waits on them (one row of Q4_1 on SmolLM2's q, k, gate and down
// shapes, weights out of cache, single thread: 222 us without, 178 us at 1 KiB, 143 us at 2 KiB, 141 us at 4).
constexpr int64_t kPrefetchBytes = 2048;
// The register block of both tile loops: kMR rows x kNR features of 16-lane accumulators.
constexpr int kMR = 4, kNR = 4;

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return c10::detail::fp16_ieee_to_fp32_value(bits);
}

// ---------------------------------------------------------------------------------------------------
// Decode rows: integer dot products (Q8_0, Q4_1).

// One block of a quantized activation row.
struct ActBlock {
  float d;   // scale: x ~= d * q
  float ds;  // d * (sum of q): Q4_1's offset term is its min times this (llama.cpp's Q8_1 keeps it too)
  int8_t q[kBlock];
};

template <typename T>
void quantize_row(const T* x, int64_t blocks, ActBlock* out) {
  for (int64_t b = 0; b < blocks; ++b) {
    float v[kBlock];
    for (int i = 0; i < kBlock; ++i) v[i] = static_cast<float>(x[b * kBlock + i]);
    float amax = 0.f;
    for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float d = amax / 127.f;
    const float id = d > 0.f ? 1.f / d : 0.f;
    int32_t sum = 0;
    for (int i = 0; i < kBlock; ++i) {
      const int8_t q = static_cast<int8_t>(std::nearbyint(v[i] * id));
      out[b].q[i] = q;
      sum += q;
    }
    out[b].d = d;
    out[b].ds = d * static_cast<float>(sum);
  }
}

// Where the 32-weight types the dots take keep their fields (ggml's block_q4_0 ... block_q8_0): a weight is
// d * (q - bias) + m, q a signed byte (Q8_0) or a nibble with, for Q5_*, a fifth bit from the 32-bit `qh`.
struct DotLayout {
  int64_t min_at;     // byte offset of the float16 m, or -1
  int64_t high_at;    // byte offset of qh, or -1
  int64_t quants_at;  // byte offset of the quants
  int bias;           // 8 (Q4_0), 16 (Q5_0) or 0
};
constexpr DotLayout dot_layout(int64_t type) {
  switch (type) {
    case kQ4_0: return {-1, -1, 2, 8};
    case kQ4_1: return {2, -1, 4, 0};
    case kQ5_0: return {-1, 2, 6, 16};
    case kQ5_1: return {2, 4, 8, 0};
    default: return {-1, -1, 2, 0};  // Q8_0
  }
}
constexpr bool takes_dots(int64_t type) {
  return type == kQ4_0 || type == kQ4_1 || type == kQ5_0 || type == kQ5_1 || type == kQ8_0;
}

// Portable: one output feature against one activation row. A block's sum is d_w d_a sum(q x) - bias d_w ds
// (+ m ds): the bias and m terms need only the activation block's sum, never its elements.
float dot_portable(int64_t type, const uint8_t* w, const ActBlock* a, int64_t blocks) {
  const DotLayout layout = dot_layout(type);
  float acc = 0.f;
  for (int64_t b = 0; b < blocks; ++b, ++a, w += block_bytes(type)) {
    uint32_t high = 0;
    if (layout.high_at >= 0) std::memcpy(&high, w + layout.high_at, 4);
    const uint8_t* qs = w + layout.quants_at;
    int32_t isum = 0;
    if (type == kQ8_0) {
      const int8_t* q = reinterpret_cast<const int8_t*>(qs);
      for (int i = 0; i < kBlock; ++i) isum += q[i] * a->q[i];
    } else {
      for (int i = 0; i < kBlock / 2; ++i) {
        const int32_t low = (qs[i] & 0x0F) | (((high >> i) & 1) << 4);
        const int32_t upper = (qs[i] >> 4) | (((high >> (i + kBlock / 2)) & 1) << 4);
        isum += low * a->q[i] + upper * a->q[i + kBlock / 2];
      }
    }
    const float d = half_at(w);
    acc += d * a->d * static_cast<float>(isum) - static_cast<float>(layout.bias) * d * a->ds;
    if (layout.min_at >= 0) acc += half_at(w + layout.min_at) * a->ds;
  }
  return acc;
}

#if defined(KVSERVE_VNNI)
// Output features a VNNI step multiplies at once: the activation pair is loaded and arranged once for them,
// and their independent accumulators hide the multiply-add latency (one row of a 1536 x 576 Q4_1 layer, single
// thread, in cache: 40 us one feature at a time, 20 us four).
constexpr int kDotFeatures = 4;
// How far ahead of each feature's pair of blocks its weight is fetched: the dots need ~5 cycles a pair, far less
// than memory gives a single stream without help (one row over SmolLM2's 30 Q4_1 layers, weights out of cache,
// single thread: 5.9 ms with no prefetch, 5.8 at 1 KiB, 4.8 at 2 KiB, 3.1-3.6 at 8-32 KiB).
constexpr int64_t kDotPrefetchBytes = 16384;

// Two blocks' weight scales a step, times what multiplies them: lanes [d_w(b), d_w(b) or m_w(b), d_w(b+1),
// d_w(b+1) or m_w(b+1)] times [d_a(b), ds_a(b), d_a(b+1), ds_a(b+1)]. Lanes 0 and 2 scale the blocks' integer
// dots; lanes 1 and 3 are the m terms (Q4_1, Q5_1) or, times -bias, the bias terms (Q4_0, Q5_0).
template <int64_t kType>
inline __m128 pair_scales(const uint8_t* w, __m128 act) {
  constexpr int64_t size = block_bytes(kType);
  constexpr DotLayout layout = dot_layout(kType);
  uint16_t d0, d1, second0, second1;
  std::memcpy(&d0, w, 2);
  std::memcpy(&d1, w + size, 2);
  if constexpr (layout.min_at >= 0) {
    std::memcpy(&second0, w + layout.min_at, 2);
    std::memcpy(&second1, w + size + layout.min_at, 2);
  } else {
    second0 = d0, second1 = d1;
  }
  const __m128i halves = _mm_setr_epi16(d0, second0, d1, second1, 0, 0, 0, 0);
  return _mm_mul_ps(_mm_cvtph_ps(halves), act);
}

// The fifth bits of two Q5 blocks as 0x10 bytes, in the nibbles' order [low(b), low(b + 1), high(b), high(b + 1)].
inline __m512i high_bits(const uint8_t* w, int64_t size, int64_t at) {
  uint32_t h0, h1;
  std::memcpy(&h0, w + at, 4);
  std::memcpy(&h1, w + size + at, 4);
  const uint64_t mask = (h0 & 0xFFFFull) | (uint64_t{h1 & 0xFFFFu} << 16) | (uint64_t{h0 >> 16} << 32) |
                        (uint64_t{h1 >> 16} << 48);
  return _mm512_and_si512(_mm512_movm_epi8(mask), _mm512_set1_epi8(0x10));
}

// `kFeatures` consecutive output features (rows `row_stride` bytes apart from `w`) against one quantized activation row,
// two blocks a step on 512-bit vectors. Q8_0: lanes 0-7 of a step's sums are block b's, 8-15 block b + 1's;
// weights are signed, so |w| is the unsigned operand and w's sign moves onto x. Nibble types: the quants
// unpack as [low(b), low(b + 1), high(b), high(b + 1)] (16 bytes each), so x is arranged once a step to match,
// and lanes 0-3 and 8-11 are block b's.
template <int64_t kType, int kFeatures>
void dot_vnni(const uint8_t* w, int64_t row_stride, const ActBlock* a, int64_t blocks, float* out) {
  constexpr int64_t size = block_bytes(kType);
  constexpr DotLayout layout = dot_layout(kType);
  const __m512i scale_lanes = kType == kQ8_0 ? _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0)
                                             : _mm512_set_epi32(2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0);
  const __m512i nibble_shift = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0);
  const __m512i low_nibble = _mm512_set1_epi8(0x0F);
  __m512 acc[kFeatures];
  __m128 offset[kFeatures];  // the m or bias terms, in lanes 1 and 3
  for (int f = 0; f < kFeatures; ++f) {
    acc[f] = _mm512_setzero_ps();
    offset[f] = _mm_setzero_ps();
  }
  int64_t b = 0;
  for (; b + 1 < blocks; b += 2) {
    __m512i x = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].q))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b + 1].q)), 1);
    if constexpr (kType != kQ8_0) x = _mm512_shuffle_i64x2(x, x, _MM_SHUFFLE(3, 1, 2, 0));
    const __m128 act = _mm_set_ps(a[b + 1].ds, a[b + 1].d, a[b].ds, a[b].d);
    for (int f = 0; f < kFeatures; ++f) {
      const uint8_t* wb = w + f * row_stride + b * size;
      _mm_prefetch(reinterpret_cast<const char*>(wb + kDotPrefetchBytes), _MM_HINT_T0);
      const __m128 scales = pair_scales<kType>(wb, act);
      const uint8_t* qs = wb + layout.quants_at;
      __m512i isum;
      if constexpr (kType == kQ8_0) {
        const __m512i q = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs))),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + size)), 1);
        const __m512i signed_x = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(q), _mm512_setzero_si512(), x);
        isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(q), signed_x);
      } else {
        const __m256i packed = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs))),
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + size)), 1);
        __m512i q = _mm512_and_si512(_mm512_srlv_epi64(_mm512_broadcast_i64x4(packed), nibble_shift), low_nibble);
        if constexpr (layout.high_at >= 0) q = _mm512_or_si512(q, high_bits(wb, size, layout.high_at));
        isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, x);
        offset[f] = _mm_add_ps(offset[f], scales);
      }
      const __m512 scale = _mm512_permutexvar_ps(scale_lanes, _mm512_castps128_ps512(scales));
      acc[f] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[f]);
    }
  }
  for (int f = 0; f < kFeatures; ++f) {
    float total = _mm512_reduce_add_ps(acc[f]);
    if constexpr (kType != kQ8_0) {
      const float terms = _mm_cvtss_f32(_mm_shuffle_ps(offset[f], offset[f], 1)) +
                          _mm_cvtss_f32(_mm_shuffle_ps(offset[f], offset[f], 3));
      total += layout.bias ? -static_cast<float>(layout.bias) * terms : terms;
    }
    if (b < blocks) total += dot_portable(kType, w + f * row_stride + b * size, a + b, 1);
    out[f] = total;
  }
}

// `features` consecutive output features against the M quantized activation rows `act` (sums to `out`, [M,
// features]): each group of kDotFeatures features meets every row while its weights are in L1, so the weight
// streams from memory once whatever M.
template <int64_t kType>
void dot_vnni_features(const uint8_t* w, int64_t row_stride, const ActBlock* act, int64_t M, int64_t blocks,
                       int64_t features, float* out) {
  int64_t n = 0;
  for (; n + kDotFeatures <= features; n += kDotFeatures)
    for (int64_t m = 0; m < M; ++m)
      dot_vnni<kType, kDotFeatures>(w + n * row_stride, row_stride, act + m * blocks, blocks, out + m * features + n);
  for (; n < features; ++n)
    for (int64_t m = 0; m < M; ++m)
      dot_vnni<kType, 1>(w + n * row_stride, row_stride, act + m * blocks, blocks, out + m * features + n);
}
#endif

bool has_vnni() {
#if defined(KVSERVE_VNNI)
  return true;
#else
  return false;
#endif
}

template <typename T>
void dot_rows(const T* x, int64_t M, int64_t K, const uint8_t* w, int64_t type, int64_t N, bool vnni, T* y,
              int64_t ldy) {
  const int64_t nblocks = K / kBlock, bytes_per_row = row_bytes(type, K);
  std::vector<ActBlock> act(M * nblocks);
  // A decode step's one row is quantized on the calling thread: a parallel region costs more than its 18-48 blocks.
  if (M == 1) {
    quantize_row(x, nblocks, act.data());
  } else {
    at::parallel_for(0, M, 1, [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m) quantize_row(x + m * K, nblocks, &act[m * nblocks]);
    });
  }
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    const int64_t features = end - begin;
    const uint8_t* wt = w + begin * bytes_per_row;
    std::vector<float> sums(M * features);
    const ActBlock* a = act.data();
    float* s = sums.data();
#if defined(KVSERVE_VNNI)
    if (vnni) {
      switch (type) {
        case kQ4_0: dot_vnni_features<kQ4_0>(wt, bytes_per_row, a, M, nblocks, features, s); break;
        case kQ4_1: dot_vnni_features<kQ4_1>(wt, bytes_per_row, a, M, nblocks, features, s); break;
        case kQ5_0: dot_vnni_features<kQ5_0>(wt, bytes_per_row, a, M, nblocks, features, s); break;
        case kQ5_1: dot_vnni_features<kQ5_1>(wt, bytes_per_row, a, M, nblocks, features, s); break;
        default: dot_vnni_features<kQ8_0>(wt, bytes_per_row, a, M, nblocks, features, s);
      }
    } else
#endif
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < features; ++n)
        s[m * features + n] = dot_portable(type, wt + n * bytes_per_row, a + m * nblocks, nblocks);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < features; ++n) y[m * ldy + begin + n] = static_cast<T>(s[m * features + n]);
  });
}

// x: float32, bfloat16 or float16 [M, K]; blocks: the weight's blocks, uint8 [N * K / 32 * type_size];
// returns [M, N] in x's dtype (the sums are float32, rounded once on the way out).
at::Tensor ggml_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t type, int64_t out_features,
                       bool vnni) {
  TORCH_CHECK(takes_dots(type), "ggml_linear: GGML type ", type, " is not Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0");
  TORCH_CHECK(x.dim() == 2, "ggml_linear: x must be [M, K]");
  TORCH_CHECK(!vnni || has_vnni(), "ggml_linear: this build has no AVX-512 VNNI path");
  const at::Tensor rows = x.contiguous();
  const int64_t M = rows.size(0), K = rows.size(1), N = out_features;
  TORCH_CHECK(K % kBlock == 0, "ggml_linear: in_features ", K, " is not a multiple of 32");
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.is_contiguous() && blocks.numel() == N * row_bytes(type, K),
              "ggml_linear: blocks must be contiguous uint8 of ", N * row_bytes(type, K), " bytes");
  at::Tensor out = at::empty({M, N}, rows.options());
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, rows.scalar_type(), "ggml_linear", [&] {
    dot_rows(rows.data_ptr<scalar_t>(), M, K, w, type, N, vnni, out.data_ptr<scalar_t>(), N);
  });
  return out;
}

int64_t ggml_dot_rows() { return kDotRows; }

// ---------------------------------------------------------------------------------------------------
// Any rows: tiles dequantized to bfloat16, then a GEMM.

// The dequantization must round as ggml.py's does (a product, then a separate sum), so that the bfloat16
// weights equal the dense path's bit for bit: no fused multiply-adds here (GCC contracts `d * q + m` into
// one, even written with intrinsics, unless told not to).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
#if defined(__clang__)
#define KVSERVE_NO_CONTRACT _Pragma("clang fp contract(off)")
#else
#define KVSERVE_NO_CONTRACT
#endif

// Q4_0 / Q4_1 / Q5_0 / Q5_1: 32 weights; the low nibbles of the 16 quant bytes are elements 0-15, the high
// ones 16-31; Q5's fifth bit of element j is bit j of the little-endian 32-bit qh.
template <bool kOffset, bool kFifthBit>
inline void dequantize_q4_q5(const uint8_t* w, float* out) {
  KVSERVE_NO_CONTRACT
  const float d = half_at(w);
  const float m = kOffset ? half_at(w + 2) : 0.f;
  const uint8_t* p = w + (kOffset ? 4 : 2);
  uint32_t qh = 0;
  if (kFifthBit) {
    std::memcpy(&qh, p, 4);
    p += 4;
  }
  // Signed types subtract the middle of their range; the offset types add m (exactly ggml.py's order).
  const int bias = kOffset ? 0 : (kFifthBit ? 16 : 8);
  for (int j = 0; j < 16; ++j) {
    const int lo = (p[j] & 0x0F) | (kFifthBit ? static_cast<int>((qh >> j) & 1) << 4 : 0);
    const int hi = (p[j] >> 4) | (kFifthBit ? static_cast<int>((qh >> (j + 16)) & 1) << 4 : 0);
    if (kOffset) {
      out[j] = d * static_cast<float>(lo) + m;
      out[j + 16] = d * static_cast<float>(hi) + m;
    } else {
      out[j] = d * static_cast<float>(lo - bias);
      out[j + 16] = d * static_cast<float>(hi - bias);
    }
  }
}

inline void dequantize_q8_0(const uint8_t* w, float* out) {
  const float d = half_at(w);
  const int8_t* q = reinterpret_cast<const int8_t*>(w + 2);
  for (int i = 0; i < kBlock; ++i) out[i] = static_cast<float>(q[i]) * d;
}

// A Q4_K / Q5_K sub-block's 6-bit scale and min, from its super-block's 12 bytes at `scales` (both loops').
inline void k_scale_min(const uint8_t* scales, int s, int& sc, int& mn) {
  if (s < 4) {
    sc = scales[s] & 0x3F;
    mn = scales[s + 4] & 0x3F;
  } else {
    sc = (scales[s + 4] & 0x0F) | ((scales[s - 4] >> 2) & 0x30);
    mn = (scales[s + 4] >> 4) | ((scales[s] >> 2) & 0x30);
  }
}

// Q4_K / Q5_K: eight sub-blocks of 32, each with a 6-bit scale and min packed in 12 bytes; weight =
// (d * sc) * q - dmin * m. Sub-block s's quants are the low (s even) or high nibbles of bytes 32 * (s / 2)...;
// Q5_K's fifth bit of element l of sub-block s is bit s of qh[l].
template <bool kFifthBit>
inline void dequantize_k4_k5(const uint8_t* w, float* out) {
  KVSERVE_NO_CONTRACT
  const float d = half_at(w), dmin = half_at(w + 2);
  const uint8_t* scales = w + 4;
  const uint8_t* qh = w + 16;
  const uint8_t* qs = w + (kFifthBit ? 48 : 16);
  for (int s = 0; s < 8; ++s) {
    int sc, mn;
    k_scale_min(scales, s, sc, mn);
    const float ds = d * static_cast<float>(sc), dm = dmin * static_cast<float>(mn);
    const uint8_t* q = qs + 32 * (s / 2);
    const int shift = 4 * (s & 1);
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 0x0F) | (kFifthBit ? ((qh[l] >> s) & 1) << 4 : 0);
      out[32 * s + l] = ds * static_cast<float>(v) - dm;
    }
  }
}

// Q6_K: 256 weights in 8 rows of 32: row r's low four bits are nibble (r / 2) % 2 of ql[64 * (r / 4) + 32 * (r %
// 2) + l], its high two bits (qh[32 * (r / 4) + l] >> 2 * (r % 4)) & 3; weight = (d * scale[i / 16]) * (q - 32).
inline void dequantize_q6_k(const uint8_t* w, float* out) {
  const uint8_t* ql = w;
  const uint8_t* qh = w + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(w + 192);
  const float d = half_at(w + 208);
  for (int r = 0; r < 8; ++r) {
    const uint8_t* low = ql + 64 * (r / 4) + 32 * (r % 2);
    const uint8_t* high = qh + 32 * (r / 4);
    const int lshift = 4 * ((r / 2) % 2), hshift = 2 * (r % 4);
    const float d0 = d * static_cast<float>(scales[2 * r]), d1 = d * static_cast<float>(scales[2 * r + 1]);
    for (int l = 0; l < 32; ++l) {
      const int q = (((low[l] >> lshift) & 0x0F) | (((high[l] >> hshift) & 3) << 4)) - 32;
      out[32 * r + l] = (l < 16 ? d0 : d1) * static_cast<float>(q);
    }
  }
}

// `count` consecutive blocks (a tile's rows lie one after the other) into `out`, one type's loop each, so
// that the type's constants stay in registers across its blocks.
template <int64_t kType, typename T, void (*kDequantize)(const uint8_t*, T*)>
void dequantize_blocks(const uint8_t* w, int64_t count, T* out) {
  constexpr int64_t kWeights = block_weights(kType), kBytes = block_bytes(kType);
  for (int64_t b = 0; b < count; ++b) {
    __builtin_prefetch(w + b * kBytes + kPrefetchBytes);
    kDequantize(w + b * kBytes, out + b * kWeights);
  }
}

// `count` blocks of `type`, float32, exactly as ggml.py computes them.
void dequantize_tile(int64_t type, const uint8_t* w, int64_t count, float* out) {
  switch (type) {
    case kQ4_0: return dequantize_blocks<kQ4_0, float, dequantize_q4_q5<false, false>>(w, count, out);
    case kQ4_1: return dequantize_blocks<kQ4_1, float, dequantize_q4_q5<true, false>>(w, count, out);
    case kQ5_0: return dequantize_blocks<kQ5_0, float, dequantize_q4_q5<false, true>>(w, count, out);
    case kQ5_1: return dequantize_blocks<kQ5_1, float, dequantize_q4_q5<true, true>>(w, count, out);
    case kQ8_0: return dequantize_blocks<kQ8_0, float, dequantize_q8_0>(w, count, out);
    case kQ4_K: return dequantize_blocks<kQ4_K, float, dequantize_k4_k5<false>>(w, count, out);
    case kQ5_K: return dequantize_blocks<kQ5_K, float, dequantize_k4_k5<true>>(w, count, out);
    default: return dequantize_blocks<kQ6_K, float, dequantize_q6_k>(w, count, out);
  }
}

#if defined(KVSERVE_AVX512)
// The same values on AVX-512, in float32 (exactly the scalar loops' products and sums, in the same order) or
// straight to bfloat16. Q8_0 and Q6_K widen 32 quants to two float32 vectors and scale them; the 4- and 5-bit
// blocks (Q4_K's and Q5_K's sub-blocks too) compute their 16 or 32 levels and look them up by the quants, which
// costs less than widening and scaling each of the 32 weights. Each type's unpacking is written once, for both
// dtypes: it hands every 32 weights to a `Store` (StoreF32, StoreBf16), as `values` (the two float32 vectors) or
// to `lookup` (the quants as bytes and the levels v0, v1 they index).

// A float16 field by F16C's vcvtph2ps (exact, as c10's bit manipulation in half_at, in one instruction).
inline float half_f16c(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);
}

inline __m512 widen_u8(__m128i q, int bias) {
  return _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(q), _mm512_set1_epi32(bias)));
}

// The 32 nibbles of 16 bytes as bytes: low nibbles (elements 0-15), then high ones (16-31).
inline __m256i nibbles(const uint8_t* p) {
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i low = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), low), _mm_and_si128(qs, low));
}

// The levels q - bias for q = first, first + 1, ..., first + 15, as float32.
inline __m512 levels(int first) {
  return _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_set1_epi32(first),
                                             _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)));
}

// float32 tiles: 32 weights stored as they are, or looked up in their float32 levels.
struct StoreF32 {
  using Out = float;
  // Elements 0-15 and 16-31.
  static void values(__m512 lo, __m512 hi, float* out) {
    _mm512_storeu_ps(out, lo);
    _mm512_storeu_ps(out + 16, hi);
  }
  // 32 quants (bytes below 16, or below 32 with kFifthBit) to their levels: v0 holds levels 0-15, v1 16-31.
  template <bool kFifthBit>
  static void lookup(__m256i q, __m512 v0, __m512 v1, float* out) {
    const __m512i lo = _mm512_cvtepu8_epi32(_mm256_castsi256_si128(q));
    const __m512i hi = _mm512_cvtepu8_epi32(_mm256_extracti128_si256(q, 1));
    _mm512_storeu_ps(out, kFifthBit ? _mm512_permutex2var_ps(v0, lo, v1) : _mm512_permutexvar_ps(lo, v0));
    _mm512_storeu_ps(out + 16, kFifthBit ? _mm512_permutex2var_ps(v0, hi, v1) : _mm512_permutexvar_ps(hi, v0));
  }
};

#if defined(KVSERVE_BF16)
// bfloat16 tiles: the same, rounded to nearest even by vcvtne2ps2bf16 / vcvtneps2bf16; the 4- and 5-bit levels
// are rounded before the lookup (vpermw on 16-bit lanes).
struct StoreBf16 {
  using Out = uint16_t;
  static void values(__m512 lo, __m512 hi, uint16_t* out) {
    _mm512_storeu_si512(out, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
  template <bool kFifthBit>
  static void lookup(__m256i q, __m512 v0, __m512 v1, uint16_t* out) {
    const __m512i table = kFifthBit ? (__m512i)_mm512_cvtne2ps_pbh(v1, v0)
                                    : _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(v0));
    _mm512_storeu_si512(out, _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(q), table));
  }
};
#endif

template <typename Store, bool kOffset, bool kFifthBit>
inline void dequantize_q4_q5_avx512(const uint8_t* w, typename Store::Out* out) {
  const __m512 d = _mm512_set1_ps(half_f16c(w));
  const __m512 m = _mm512_set1_ps(kOffset ? half_f16c(w + 2) : 0.f);
  const uint8_t* p = w + (kOffset ? 4 : 2);
  const int bias = kOffset ? 0 : (kFifthBit ? 16 : 8);
  __m512 v0 = _mm512_mul_ps(levels(-bias), d), v1 = _mm512_mul_ps(levels(16 - bias), d);
  if (kOffset) {
    v0 = _mm512_add_ps(v0, m);
    v1 = _mm512_add_ps(v1, m);
  }
  __m256i q;
  if (kFifthBit) {
    uint32_t qh;
    std::memcpy(&qh, p, 4);
    q = nibbles(p + 4);
    q = _mm256_mask_add_epi8(q, qh, q, _mm256_set1_epi8(0x10));
  } else {
    q = nibbles(p);
  }
  Store::template lookup<kFifthBit>(q, v0, v1, out);
}

template <typename Store>
inline void dequantize_q8_0_avx512(const uint8_t* w, typename Store::Out* out) {
  const __m512 d = _mm512_set1_ps(half_f16c(w));
  const __m128i* q = reinterpret_cast<const __m128i*>(w + 2);
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q)));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1)));
  Store::values(_mm512_mul_ps(lo, d), _mm512_mul_ps(hi, d), out);
}

// Sub-block s's 32 quants of a Q4_K / Q5_K super-block, as bytes.
template <bool kFifthBit>
inline __m256i k_quants(const uint8_t* w, int s) {
  const uint8_t* qs = w + (kFifthBit ? 48 : 16);
  const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (s / 2)));
  __m256i q = _mm256_and_si256(s & 1 ? _mm256_srli_epi16(bytes, 4) : bytes, _mm256_set1_epi8(0x0F));
  if (kFifthBit) {
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16));
    q = _mm256_mask_add_epi8(q, _mm256_test_epi8_mask(qh, _mm256_set1_epi8(1 << s)), q, _mm256_set1_epi8(0x10));
  }
  return q;
}

// (bfloat16 without the fifth bit never reads v1, so the compiler drops it.)
template <typename Store, bool kFifthBit>
inline void dequantize_k4_k5_avx512(const uint8_t* w, typename Store::Out* out) {
  const float d = half_f16c(w), dmin = half_f16c(w + 2);
  for (int s = 0; s < 8; ++s) {
    int sc, mn;
    k_scale_min(w + 4, s, sc, mn);
    const __m512 ds = _mm512_set1_ps(d * static_cast<float>(sc)), dm = _mm512_set1_ps(dmin * static_cast<float>(mn));
    const __m512 v0 = _mm512_sub_ps(_mm512_mul_ps(levels(0), ds), dm);
    const __m512 v1 = _mm512_sub_ps(_mm512_mul_ps(levels(16), ds), dm);
    Store::template lookup<kFifthBit>(k_quants<kFifthBit>(w, s), v0, v1, out + 32 * s);
  }
}

// Row r of a Q6_K super-block's quants (q + 32, below 64), as bytes.
inline __m256i q6_k_quants(const uint8_t* w, int r) {
  const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 64 * (r / 4) + 32 * (r % 2)));
  const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 128 + 32 * (r / 4)));
  const __m256i lo4 = _mm256_and_si256((r / 2) % 2 ? _mm256_srli_epi16(ql, 4) : ql, _mm256_set1_epi8(0x0F));
  const __m256i hi2 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * (r % 4)), _mm256_set1_epi8(3));
  return _mm256_or_si256(lo4, _mm256_slli_epi16(hi2, 4));
}

template <typename Store>
inline void dequantize_q6_k_avx512(const uint8_t* w, typename Store::Out* out) {
  const int8_t* scales = reinterpret_cast<const int8_t*>(w + 192);
  const float d = half_f16c(w + 208);
  for (int r = 0; r < 8; ++r) {
    const __m256i q = q6_k_quants(w, r);
    const __m512 d0 = _mm512_set1_ps(d * static_cast<float>(scales[2 * r]));
    const __m512 d1 = _mm512_set1_ps(d * static_cast<float>(scales[2 * r + 1]));
    Store::values(_mm512_mul_ps(d0, widen_u8(_mm256_castsi256_si128(q), 32)),
                  _mm512_mul_ps(d1, widen_u8(_mm256_extracti128_si256(q, 1), 32)), out + 32 * r);
  }
}

// `count` blocks of `type` by `Store`: float32 equal to dequantize_tile's (StoreF32), or bfloat16 (StoreBf16).
template <typename Store>
void dequantize_tile_avx512(int64_t type, const uint8_t* w, int64_t count, typename Store::Out* out) {
  using T = typename Store::Out;
  switch (type) {
    case kQ4_0: return dequantize_blocks<kQ4_0, T, dequantize_q4_q5_avx512<Store, false, false>>(w, count, out);
    case kQ4_1: return dequantize_blocks<kQ4_1, T, dequantize_q4_q5_avx512<Store, true, false>>(w, count, out);
    case kQ5_0: return dequantize_blocks<kQ5_0, T, dequantize_q4_q5_avx512<Store, false, true>>(w, count, out);
    case kQ5_1: return dequantize_blocks<kQ5_1, T, dequantize_q4_q5_avx512<Store, true, true>>(w, count, out);
    case kQ8_0: return dequantize_blocks<kQ8_0, T, dequantize_q8_0_avx512<Store>>(w, count, out);
    case kQ4_K: return dequantize_blocks<kQ4_K, T, dequantize_k4_k5_avx512<Store, false>>(w, count, out);
    case kQ5_K: return dequantize_blocks<kQ5_K, T, dequantize_k4_k5_avx512<Store, true>>(w, count, out);
    default: return dequantize_blocks<kQ6_K, T, dequantize_q6_k_avx512<Store>>(w, count, out);
  }
}
#endif

#undef KVSERVE_NO_CONTRACT
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

// float32 -> bfloat16 bits, rounded to nearest even (as torch's `.to(torch.bfloat16)`; the weights are finite).
inline uint16_t bf16_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

inline float bf16_value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

#if defined(KVSERVE_AVX512)
// The sums of four 16-lane accumulators, stored to y[0..3]: halves added, then hadd trees within 128 bits.
inline void store_sums4(const __m512* acc, float* y) {
  __m256 h[4];
  for (int j = 0; j < 4; ++j)
    h[j] = _mm256_add_ps(_mm512_castps512_ps256(acc[j]), _mm512_extractf32x8_ps(acc[j], 1));
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(h[0], h[1]), _mm256_hadd_ps(h[2], h[3]));
  _mm_storeu_ps(y, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
}
#endif

#if defined(KVSERVE_BF16)

// MR rows of x against NR weight rows (bfloat16, K each), 32 elements a step; y[i * ldy + j] = the dot.
template <int MR, int NR>
void micro_bf16(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t K, float* y, int64_t ldy) {
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 32) {
    __m512bh wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = (__m512bh)_mm512_loadu_si512(w + j * K + k);
    for (int i = 0; i < MR; ++i) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + i * ldx + k);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    int j = 0;
    for (; j + 4 <= NR; j += 4) store_sums4(acc[i] + j, y + i * ldy + j);
    for (; j < NR; ++j) y[i * ldy + j] = _mm512_reduce_add_ps(acc[i][j]);
  }
}

using MicroBf16 = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, float*, int64_t);
// kMicroBf16[(MR - 1) * kNR + NR - 1]: full kMR x kNR blocks, and the smaller ones at a tile's or the rows' edge.
template <size_t... I>
constexpr std::array<MicroBf16, sizeof...(I)> micro_bf16_table(std::index_sequence<I...>) {
  return {micro_bf16<I / kNR + 1, I % kNR + 1>...};
}
constexpr auto kMicroBf16 = micro_bf16_table(std::make_index_sequence<kMR * kNR>());

#endif

bool has_bf16() {
#if defined(KVSERVE_BF16)
  return true;
#else
  return false;
#endif
}

// Float32: MR rows of x against NR weight rows over `kc` elements of k (rows `ldx` and `ldw` apart), in 16
// independent lanes per product so that the compiler vectorizes the loop (-march=native: AVX-512 or AVX2 FMA)
// without reassociating a sum; each sum is its 16 lanes added in order, stored to y[i * ldy + j] (`add`: added
// to it). Used for float32 rows (the weights as dequantized) and, where the build lacks AVX512-BF16, for
// bfloat16 ones (both sides widened from bfloat16).
template <int MR, int NR>
void micro_f32(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t kc, float* y, int64_t ldy,
               bool add) {
  float acc[MR][NR][16] = {};
  for (int64_t k = 0; k < kc; k += 16)
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j)
        for (int l = 0; l < 16; ++l) acc[i][j][l] += x[i * ldx + k + l] * w[j * ldw + k + l];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      float sum = 0.f;
      for (int l = 0; l < 16; ++l) sum += acc[i][j][l];
      y[i * ldy + j] = add ? y[i * ldy + j] + sum : sum;
    }
}

using MicroF32 = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, bool);
// kMicroF32[(MR - 1) * kNR + NR - 1], as kMicroBf16.
template <size_t... I>
constexpr std::array<MicroF32, sizeof...(I)> micro_f32_table(std::index_sequence<I...>) {
  return {micro_f32<I / kNR + 1, I % kNR + 1>...};
}
constexpr auto kMicroF32 = micro_f32_table(std::make_index_sequence<kMR * kNR>());

#if defined(KVSERVE_AVX512)
// The same on AVX-512 FMA, 16 elements a step (each sum's lanes added by store_sums4's tree instead).
template <int MR, int NR>
void micro_f32_avx512(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t kc, float* y, int64_t ldy,
                      bool add) {
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; k += 16) {
    __m512 wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = _mm512_loadu_ps(w + j * ldw + k);
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_loadu_ps(x + i * ldx + k);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    float sums[NR];
    int j = 0;
    for (; j + 4 <= NR; j += 4) store_sums4(acc[i] + j, sums + j);
    for (; j < NR; ++j) sums[j] = _mm512_reduce_add_ps(acc[i][j]);
    for (j = 0; j < NR; ++j) y[i * ldy + j] = add ? y[i * ldy + j] + sums[j] : sums[j];
  }
}

template <size_t... I>
constexpr std::array<MicroF32, sizeof...(I)> micro_f32_avx512_table(std::index_sequence<I...>) {
  return {micro_f32_avx512<I / kNR + 1, I % kNR + 1>...};
}
constexpr auto kMicroF32Avx512 = micro_f32_avx512_table(std::make_index_sequence<kMR * kNR>());
#endif

// The float32 loops' blocking: a panel of kRowPanel rows is multiplied kChunk elements of k at a time, so that
// its kRowPanel x kChunk floats (32 KiB) stay in L1 while every feature block of the tile passes over them
// (whole rows of a long k would be read back from L2 once per feature block). Each sum is its chunks' sums
// added in k order: fixed by k alone, so a row's products do not depend on the other rows.
constexpr int64_t kRowPanel = 32, kChunk = 256;

bool has_avx512() {
#if defined(KVSERVE_AVX512)
  return true;
#else
  return false;
#endif
}

// x: float32 or bfloat16 [M, K]; blocks: the weight's blocks, uint8 [N * K / block * bytes]; returns float32
// [M, N]. float32 rows multiply tiles of float32 weights, exactly as kvserve_quant_gguf/ggml.py dequantizes
// them (the values `quantization="none"` holds in float32), so their products differ from the dense float32
// ones by the order of the sums only. bfloat16 rows multiply tiles rounded to bfloat16. `simd` takes the
// build's AVX-512 path for the rows' dtype (AVX512-BF16 for bfloat16, AVX-512 FMA for float32), else the
// portable loops run (the same tiles; float32 sums in another order).
at::Tensor ggml_tiled_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t type, int64_t out_features,
                             bool simd) {
  TORCH_CHECK(block_bytes(type) > 0, "ggml_tiled_linear: GGML type ", type, " has no tile dequantization");
  const int64_t block = block_weights(type);
  const bool f32 = x.scalar_type() == at::kFloat;
  TORCH_CHECK(x.dim() == 2 && (f32 || x.scalar_type() == at::kBFloat16),
              "ggml_tiled_linear: x must be float32 or bfloat16 [M, K]");
  TORCH_CHECK(!simd || (f32 ? has_avx512() : has_bf16()), "ggml_tiled_linear: this build has no ",
              f32 ? "AVX-512" : "AVX512-BF16", " path");
  const at::Tensor rows = x.contiguous();
  const int64_t M = rows.size(0), K = rows.size(1), N = out_features;
  TORCH_CHECK(K % block == 0, "ggml_tiled_linear: in_features ", K, " is not a multiple of ", block);
  const int64_t bytes_per_row = row_bytes(type, K);
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.is_contiguous() && blocks.numel() == N * bytes_per_row,
              "ggml_tiled_linear: blocks must be contiguous uint8 of ", N * bytes_per_row, " bytes");
  at::Tensor out = at::empty({M, N}, rows.options().dtype(at::kFloat));
  if (M == 0) return out;  // no row to multiply: dequantize nothing
  float* y = out.data_ptr<float>();
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  const bool bf16 = simd && !f32;  // the AVX512-BF16 path
  // The float32 loops' rows: float32 ones as they are; bfloat16 ones widened once here, not once per tile.
  std::vector<float> widened(f32 || bf16 ? 0 : M * K);
  const uint16_t* xb = f32 ? nullptr : reinterpret_cast<const uint16_t*>(rows.data_ptr<at::BFloat16>());
  for (size_t i = 0; i < widened.size(); ++i) widened[i] = bf16_value(xb[i]);
  const float* xf = f32 ? rows.data_ptr<float>() : widened.data();
  const int64_t tiles = (N + kTile - 1) / kTile;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> tile(bf16 ? 0 : kTile * K);
#if defined(KVSERVE_BF16)
    std::vector<uint16_t> tile_bf16(bf16 ? kTile * K : 0);
#endif
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n0 = t * kTile, nt = std::min(kTile, N - n0);
      const uint8_t* tile_blocks = w + n0 * bytes_per_row;
      float* tile_out = y + n0;
#if defined(KVSERVE_BF16)
      if (bf16) {
        dequantize_tile_avx512<StoreBf16>(type, tile_blocks, nt * K / block, tile_bf16.data());
        for (int64_t n = 0; n < nt; n += kNR) {
          const int64_t nr = std::min<int64_t>(kNR, nt - n);
          for (int64_t m = 0; m < M; m += kMR) {
            const int64_t mr = std::min<int64_t>(kMR, M - m);
            kMicroBf16[(mr - 1) * kNR + nr - 1](xb + m * K, K, &tile_bf16[n * K], K, tile_out + m * N + n, N);
          }
        }
        continue;
      }
#endif
      const MicroF32* micro = kMicroF32.data();
#if defined(KVSERVE_AVX512)
      if (simd) {
        dequantize_tile_avx512<StoreF32>(type, tile_blocks, nt * K / block, tile.data());
        micro = kMicroF32Avx512.data();
      } else
#endif
      {
        dequantize_tile(type, tile_blocks, nt * K / block, tile.data());
        // bfloat16 rows: the float32 weights rounded to bfloat16 as the AVX512-BF16 path rounds them.
        if (!f32)
          for (int64_t i = 0; i < nt * K; ++i) tile[i] = bf16_value(bf16_bits(tile[i]));
      }
      for (int64_t m0 = 0; m0 < M; m0 += kRowPanel)
        for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
          const int64_t kc = std::min(kChunk, K - k0);
          for (int64_t n = 0; n < nt; n += kNR) {
            const int64_t nr = std::min<int64_t>(kNR, nt - n);
            for (int64_t m = m0; m < std::min(M, m0 + kRowPanel); m += kMR) {
              const int64_t mr = std::min<int64_t>(kMR, M - m);
              micro[(mr - 1) * kNR + nr - 1](xf + m * K + k0, K, &tile[n * K + k0], K, kc, tile_out + m * N + n, N,
                                             k0 > 0);
            }
          }
        }
    }
  });
  return out;
}

// A layer's product, the path picked per part as the header says: `types` and `out_features` are its parts
// in order (a fused layer's shards, neighbours of one type merged), their blocks one after another in
// `blocks`; returns [M, sum(out_features)] in x's dtype. One call a layer, so a decode step pays one
// dispatch per layer and no concatenation. `simd`: each path's instructions where the build has them.
at::Tensor ggml_layer(const at::Tensor& x, const at::Tensor& blocks, at::IntArrayRef types,
                      at::IntArrayRef out_features, bool simd) {
  TORCH_CHECK(x.dim() == 2, "ggml_layer: x must be [M, K]");
  TORCH_CHECK(!types.empty() && types.size() == out_features.size(),
              "ggml_layer: one GGML type per part's out_features");
  const at::Tensor rows = x.contiguous();
  const int64_t M = rows.size(0), K = rows.size(1);
  const bool f32 = rows.scalar_type() == at::kFloat;
  const bool dots = !f32 && M <= kDotRows;
  int64_t total = 0, bytes = 0;
  for (size_t i = 0; i < types.size(); ++i) {
    TORCH_CHECK(block_bytes(types[i]) > 0, "ggml_layer: GGML type ", types[i], " is not multiplied here");
    TORCH_CHECK(K % block_weights(types[i]) == 0, "ggml_layer: in_features ", K, " is not a multiple of ",
                block_weights(types[i]));
    total += out_features[i];
    bytes += out_features[i] * row_bytes(types[i], K);
  }
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.is_contiguous() && blocks.numel() == bytes,
              "ggml_layer: blocks must be contiguous uint8 of ", bytes, " bytes");
  // bfloat16 and float16 rows tile in bfloat16 (converted once, at the first part that tiles), float32 ones as they are.
  at::Tensor tile_rows;
  const auto tiled = [&](int64_t type, int64_t N, int64_t offset, int64_t part_bytes) {
    if (!tile_rows.defined()) tile_rows = f32 ? rows : rows.to(at::kBFloat16);
    return ggml_tiled_linear(tile_rows, blocks.narrow(0, offset, part_bytes), type, N,
                             simd && (f32 ? has_avx512() : has_bf16()));
  };
  if (types.size() == 1 && !(dots && takes_dots(types[0]))) {
    const at::Tensor y = tiled(types[0], total, 0, bytes);
    return f32 ? y : y.to(rows.scalar_type());
  }
  at::Tensor out = at::empty({M, total}, rows.options());
  int64_t column = 0, offset = 0;
  for (size_t i = 0; i < types.size(); ++i) {
    const int64_t type = types[i], N = out_features[i];
    const int64_t part_bytes = N * row_bytes(type, K);
    if (dots && takes_dots(type)) {
      const uint8_t* w = blocks.data_ptr<uint8_t>() + offset;
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, rows.scalar_type(), "ggml_layer", [&] {
        dot_rows(rows.data_ptr<scalar_t>(), M, K, w, type, N, simd && has_vnni(), out.data_ptr<scalar_t>() + column,
                 total);
      });
    } else {
      out.narrow(1, column, N).copy_(tiled(type, N, offset, part_bytes));
    }
    column += N;
    offset += part_bytes;
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(kvserve_cpu_ggml, m) {
  m.def("ggml_linear(Tensor x, Tensor blocks, int ggml_type, int out_features, bool vnni) -> Tensor");
  m.def("ggml_tiled_linear(Tensor x, Tensor blocks, int ggml_type, int out_features, bool simd) -> Tensor");
  m.def("ggml_layer(Tensor x, Tensor blocks, int[] ggml_types, int[] out_features, bool simd) -> Tensor");
  m.def("has_vnni() -> bool", &has_vnni);
  m.def("has_bf16() -> bool", &has_bf16);
  m.def("has_avx512() -> bool", &has_avx512);
  m.def("ggml_dot_rows() -> int", &ggml_dot_rows);
}

TORCH_LIBRARY_IMPL(kvserve_cpu_ggml, CPU, m) {
  m.impl("ggml_linear", &ggml_linear);
  m.impl("ggml_tiled_linear", &ggml_tiled_linear);
  m.impl("ggml_layer", &ggml_layer);
}
