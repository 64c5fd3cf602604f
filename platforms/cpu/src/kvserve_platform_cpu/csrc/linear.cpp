// y = x W^T + b on AVX-512, for weights packed once into column panels that stream front to back.
//
// kvserve_cpu_linear::pack(weight) -> packed    weight [N, K] float32 or bfloat16, contiguous
// kvserve_cpu_linear::linear(x, packed, bias?) -> y    x [..., K] in the weight's dtype
// kvserve_cpu_linear::supports(dtype) -> bool   whether this build runs the dtype
//
// Why not oneDNN's packed matmul: at decode sizes (1-64 rows) a layer's weight is read from DRAM
// once per step while each weight element does only `rows` multiply-adds, and oneDNN's kernels
// there alternate between waiting for memory and computing. Here every thread streams its own
// contiguous run of panels and, while its row tiles compute on one chunk of a panel out of L1,
// prefetches the next chunk into L2 (float32 at decode sizes: half-size chunks, into L1), spreading
// the requests over the tiles so the stream never stalls; the last chunk's tiles write the output
// (and add the bias) straight from registers.
//
// Layout: columns are cut into panels of 48 (3 vectors of 16 float32 outputs; the last panel may be
// narrower, width r). A panel holds, for each k (bfloat16: each pair of k, the pair adjacent, the
// operand layout of AVX512-BF16's vdpbf16ps), its r weights in column order. The packed tensor has
// the weight's shape and dtype (the same elements, reordered), as the LinearKernel seam requires.
// float32 multiplies with FMA in k order; bfloat16 multiplies pairs exactly with vdpbf16ps and
// accumulates in float32, rounding to bfloat16 once at the end.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kPanel = 48;       // output columns per panel
constexpr int64_t kRowTile = 8;      // rows per register tile: 8 x 3 accumulators
constexpr int64_t kChunkBytes = 24 << 10;  // a panel's slice of k the row tiles share: half of a 48 KiB L1
// float32 at decode sizes: chunks half as large, the next one prefetched into L1 rather than L2. Its
// row tiles compute twice as long per byte as bfloat16's, so a chunk's compute hides the next one's
// fetch only when the fetch lands next to the core (measured over SmolLM2's decode projections:
// 1.13x at 1 row, 1.27x at 8, 1.34x at 32, 1.09x at 64; 0.94-0.98x at 512-2048 rows, and for
// bfloat16 0.91-1.01x, so those keep the default).
constexpr int64_t kDecodeChunkBytes = 12 << 10;
constexpr int64_t kDecodeRows = 64;
constexpr int64_t kRowBlock = 128;   // rows per pass over the panels (bounds the float32 scratch)

bool supports(at::ScalarType dtype) {
#if defined(__AVX512F__)
  if (dtype == at::kFloat) return true;
#if defined(__AVX512BF16__)
  if (dtype == at::kBFloat16) return true;
#endif
#endif
  return false;
}

void check_weight(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.device().is_cpu(),
              "the weight must be a contiguous 2-D CPU tensor [out_features, in_features]");
  TORCH_CHECK(supports(weight.scalar_type()), "dtype ", weight.scalar_type(), " is not run by this build");
  TORCH_CHECK(weight.scalar_type() != at::kBFloat16 || weight.size(1) % 2 == 0,
              "bfloat16 weights need an even in_features (vdpbf16ps multiplies pairs of k)");
}

at::Tensor pack(const at::Tensor& weight) {
  check_weight(weight);
  const int64_t N = weight.size(0), K = weight.size(1);
  const int64_t pair = weight.scalar_type() == at::kBFloat16 ? 2 : 1;  // k values kept adjacent
  at::Tensor packed = at::empty_like(weight);
  const int64_t elt = weight.element_size();
  const char* src = static_cast<const char*>(weight.data_ptr());
  char* dst = static_cast<char*>(packed.data_ptr());
  at::parallel_for(0, (N + kPanel - 1) / kPanel, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * kPanel, r = std::min(kPanel, N - n0);
      char* panel = dst + n0 * K * elt;
      for (int64_t k = 0; k < K; k += pair)
        for (int64_t c = 0; c < r; ++c)
          std::memcpy(panel + ((k / pair) * r + c) * pair * elt, src + ((n0 + c) * K + k) * elt, pair * elt);
    }
  });
  return packed;
}

#if defined(__AVX512F__)

inline __mmask16 lanes(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF) : count <= 0 ? 0 : static_cast<__mmask16>((1u << count) - 1);
}

inline __m512 load_bias(const float* b, __mmask16 m) { return _mm512_maskz_loadu_ps(m, b); }
inline __m512 load_bias(const c10::BFloat16* b, __mmask16 m) {
  const __m256i bits = _mm256_maskz_loadu_epi16(m, b);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

inline void store_out(float* o, __mmask16 m, __m512 v) { _mm512_mask_storeu_ps(o, m, v); }
#if defined(__AVX512BF16__)
inline void store_out(c10::BFloat16* o, __mmask16 m, __m512 v) {
  _mm256_mask_storeu_epi16(o, m, (__m256i)_mm512_cvtneps_pbh(v));  // round to nearest even
}
#else
inline void store_out(c10::BFloat16*, __mmask16, __m512) {}  // bfloat16 is refused by supports()
#endif

template <bool TO_L1>
inline void prefetch_line(const char* line) {
  if constexpr (TO_L1)
    _mm_prefetch(line, _MM_HINT_T0);
  else
    _mm_prefetch(line, _MM_HINT_T1);
}

// One register tile: ROWS rows of x against one panel (width r) over k in [k0, k1). Accumulators
// start at zero (first chunk) or from the scratch c, and go back to c, or, on the last chunk, to out
// (+ bias) in T. Every `every`-th k step, starting at `phase`, prefetches the weight lines `ahead`
// bytes on (the next chunk), into L1 or L2 (TO_L1), so that the tiles of one chunk request the next
// one between them.
// Every loop over rows or blocks is unrolled: an accumulator indexed at run time anywhere would keep
// the whole array in memory.
template <typename T, int ROWS, bool TO_L1>
void tile(const T* x, int64_t ldx, const T* w, int64_t r, int64_t k0, int64_t k1, float* c, bool first,
          int64_t ahead, int64_t phase, int64_t every, T* out, int64_t ldo, const T* bias) {
  constexpr bool kBf16 = std::is_same_v<T, c10::BFloat16>;
  const __mmask16 m0 = lanes(r), m1 = lanes(r - 16), m2 = lanes(r - 32);
  __m512 acc[ROWS][3];
  #pragma GCC unroll 8
  for (int i = 0; i < ROWS; ++i)
    #pragma GCC unroll 3
    for (int b = 0; b < 3; ++b) acc[i][b] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * kPanel + 16 * b);
  constexpr int64_t step = kBf16 ? 2 : 1;  // k per multiply
  int64_t turn = phase;
  for (int64_t k = k0; k < k1; k += step) {
    const T* wk = w + (k / step) * r * step;  // this k (pair)'s r weights (pairs)
    if (turn == 0) {
      const char* line = reinterpret_cast<const char*>(wk) + ahead;
      prefetch_line<TO_L1>(line);
      prefetch_line<TO_L1>(line + 64);
      prefetch_line<TO_L1>(line + 128);
      turn = every;
    }
    --turn;
    if constexpr (kBf16) {
#if defined(__AVX512BF16__)
      const __m512bh w0 = (__m512bh)_mm512_maskz_loadu_epi32(m0, wk);
      const __m512bh w1 = (__m512bh)_mm512_maskz_loadu_epi32(m1, wk + 32);
      const __m512bh w2 = (__m512bh)_mm512_maskz_loadu_epi32(m2, wk + 64);
      #pragma GCC unroll 8
      for (int i = 0; i < ROWS; ++i) {
        const __m512bh xi = (__m512bh)_mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x + i * ldx + k));
        acc[i][0] = _mm512_dpbf16_ps(acc[i][0], xi, w0);
        acc[i][1] = _mm512_dpbf16_ps(acc[i][1], xi, w1);
        acc[i][2] = _mm512_dpbf16_ps(acc[i][2], xi, w2);
      }
#endif
    } else {
      const __m512 w0 = _mm512_maskz_loadu_ps(m0, wk), w1 = _mm512_maskz_loadu_ps(m1, wk + 16),
                   w2 = _mm512_maskz_loadu_ps(m2, wk + 32);
      #pragma GCC unroll 8
      for (int i = 0; i < ROWS; ++i) {
        const __m512 xi = _mm512_set1_ps(x[i * ldx + k]);
        acc[i][0] = _mm512_fmadd_ps(xi, w0, acc[i][0]);
        acc[i][1] = _mm512_fmadd_ps(xi, w1, acc[i][1]);
        acc[i][2] = _mm512_fmadd_ps(xi, w2, acc[i][2]);
      }
    }
  }
  if (out == nullptr) {
    #pragma GCC unroll 8
    for (int i = 0; i < ROWS; ++i)
      #pragma GCC unroll 3
      for (int b = 0; b < 3; ++b) _mm512_storeu_ps(c + i * kPanel + 16 * b, acc[i][b]);
    return;
  }
  #pragma GCC unroll 3
  for (int b = 0; b < 3; ++b) {
    const __mmask16 mask = lanes(r - 16 * b);
    if (!mask) break;
    const __m512 add = bias ? load_bias(bias + 16 * b, mask) : _mm512_setzero_ps();
    #pragma GCC unroll 8
    for (int i = 0; i < ROWS; ++i) store_out(out + i * ldo + 16 * b, mask, _mm512_add_ps(acc[i][b], add));
  }
}

template <typename T>
using TileFn = void (*)(const T*, int64_t, const T*, int64_t, int64_t, int64_t, float*, bool, int64_t, int64_t,
                        int64_t, T*, int64_t, const T*);

template <typename T, bool TO_L1>
constexpr TileFn<T> kTiles[kRowTile + 1] = {nullptr,
                                            &tile<T, 1, TO_L1>, &tile<T, 2, TO_L1>, &tile<T, 3, TO_L1>, &tile<T, 4, TO_L1>,
                                            &tile<T, 5, TO_L1>, &tile<T, 6, TO_L1>, &tile<T, 7, TO_L1>, &tile<T, 8, TO_L1>};

template <typename T>
void run(const T* x, int64_t M, int64_t K, const T* packed, int64_t N, const T* bias, T* out) {
  const int64_t panels = (N + kPanel - 1) / kPanel;
  const bool decode = std::is_same_v<T, float> && M <= kDecodeRows;
  // k per chunk: 256 bfloat16, 128 float32 (64 at decode sizes)
  const int64_t chunk = (decode ? kDecodeChunkBytes : kChunkBytes) / (kPanel * static_cast<int64_t>(sizeof(T)));
  const TileFn<T>* tiles_fn = decode ? kTiles<T, true> : kTiles<T, false>;
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    std::vector<float> scratch(std::min(M, kRowBlock) * kPanel);
    // The first chunk of this thread's run: nothing before it prefetched it.
    const char* start = reinterpret_cast<const char*>(packed + p0 * kPanel * K);
    const int64_t first_bytes = std::min(chunk, K) * std::min(kPanel, N - p0 * kPanel) * sizeof(T);
    for (int64_t b = 0; b < first_bytes; b += 64) _mm_prefetch(start + b, _MM_HINT_T1);
    for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
      const int64_t rows = std::min(kRowBlock, M - m0), tiles = (rows + kRowTile - 1) / kRowTile;
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t n0 = p * kPanel, r = std::min(kPanel, N - n0);
        const T* w = packed + n0 * K;
        for (int64_t k0 = 0; k0 < K; k0 += chunk) {
          const int64_t k1 = std::min(K, k0 + chunk);
          const int64_t ahead = (k1 - k0) * r * sizeof(T);  // bytes from a k to the same k of the next chunk
          for (int64_t t = 0; t < tiles; ++t) {
            const int64_t i0 = m0 + t * kRowTile, n = std::min(kRowTile, M - i0);
            tiles_fn[n](x + i0 * K, K, w, r, k0, k1, scratch.data() + t * kRowTile * kPanel, k0 == 0, ahead, t,
                         tiles, k1 == K ? out + i0 * N + n0 : nullptr, N, bias ? bias + n0 : nullptr);
          }
        }
      }
    }
  });
}

#endif  // __AVX512F__

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias) {
  check_weight(packed);
  const int64_t N = packed.size(0), K = packed.size(1);
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == packed.scalar_type() && x.size(-1) == K,
              "x must be a CPU tensor [..., ", K, "] of the weight's dtype ", packed.scalar_type());
  TORCH_CHECK(!bias.has_value() || (bias->dim() == 1 && bias->size(0) == N && bias->scalar_type() == x.scalar_type() &&
                                    bias->is_contiguous()),
              "bias must be a contiguous [", N, "] tensor of x's dtype");
  const at::Tensor rows = x.reshape({-1, K}).contiguous();
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  at::Tensor out = at::empty(shape, x.options());
#if defined(__AVX512F__)
  const int64_t M = rows.size(0);
  if (M > 0) {
    if (x.scalar_type() == at::kFloat)
      run<float>(rows.data_ptr<float>(), M, K, packed.data_ptr<float>(), N,
                 bias ? bias->data_ptr<float>() : nullptr, out.data_ptr<float>());
    else
      run<c10::BFloat16>(rows.data_ptr<c10::BFloat16>(), M, K, packed.data_ptr<c10::BFloat16>(), N,
                         bias ? bias->data_ptr<c10::BFloat16>() : nullptr, out.data_ptr<c10::BFloat16>());
  }
#endif
  return out;
}

}  // namespace

TORCH_LIBRARY(kvserve_cpu_linear, m) {
  m.def("pack(Tensor weight) -> Tensor");
  m.def("linear(Tensor x, Tensor packed, Tensor? bias) -> Tensor");
  m.def("supports(ScalarType dtype) -> bool", &supports);
}

TORCH_LIBRARY_IMPL(kvserve_cpu_linear, CPU, m) {
  m.impl("pack", &pack);
  m.impl("linear", &linear);
}
