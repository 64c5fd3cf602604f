// y = x W^T + b on AVX-512 or AVX2, for weights packed once into column panels that stream front to back.
//
// kvserve_cpu_linear::pack(weight) -> packed    weight [N, K] float32 or bfloat16, contiguous
// kvserve_cpu_linear::linear(x, packed, bias?) -> y    x [..., K] in the weight's dtype
// kvserve_cpu_linear::gated_linear(x, gate, up) -> y  y = silu(x G^T) * (x U^T), G and U packed alike
// kvserve_cpu_linear::logits(x, packed) -> y    linear(x, packed) widened to float32 (the LM head's)
// kvserve_cpu_linear::isa() -> str              "avx512" or "avx2": the instructions the products run on
// kvserve_cpu_linear::supports(dtype) -> bool   whether this build runs the dtype
// kvserve_cpu_linear::amx() -> bool             whether bfloat16 runs on AMX tiles here
// kvserve_cpu_linear::on_amx(weight) -> bool    whether this weight does (its sizes fill the tiles)
// kvserve_cpu_linear::pack_fp8(weight) -> packed                 weight [N, K] float8_e4m3fn, K even
// kvserve_cpu_linear::fp8_linear(x, packed, scale, bias?) -> y   y = (x W^T) * scale + b, scale float32
//                                                                [] / [1] (per tensor) or N (per column)
// kvserve_cpu_linear::fp8_supports(dtype) -> bool  whether this build runs x of dtype with float8 weights
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
//
// AMX (built with -march=native on a CPU with AMX-BF16, and Linux grants the process its tile
// state): bfloat16 weights whose columns fill 32-wide panels and whose k fills 32-wide tiles are
// packed in panels of 32 instead (the same pair layout, so a 16-column tile of a panel is one
// strided tile load) and multiplied on tiles, two 16-row groups x two 16-column tiles at a time.
// Measured over the 125M Llama's projections in turn (gemm_shapes.py --sweep), against oneDNN's
// prepacked tile kernels: 1.2x at 1 row, 1.07-1.2x at 8-64, parity at 512, 0.73x at 2048 rows
// (there oneDNN's blocking keeps both operands nearer the core); in the engine, bfloat16 decoding
// 1.08x (the 125M Llama, 32 sequences) and 1.13x (SmolLM2's chat mix, its prefill included),
// prefilling 2,000-token prompts 0.95x.
//
// AVX2 (built on a CPU with AVX2 and FMA but no AVX-512, such as AMD's before Zen 4): panels of 16
// columns (two vectors of 8 float32), k-major, bfloat16 without pairs: there is no bfloat16
// instruction, so bfloat16 weights are widened to float32 (exactly: they are its top half) and every
// product is a float32 FMA, 6 rows x 2 vectors per register tile; bfloat16 outputs are rounded to
// nearest even. Each panel's tiles prefetch the next panel into L2 between them. Measured on a
// 2-core AMD EPYC over the 125M Llama's projections in turn (gemm_shapes.py --sweep): float32
// 1.1-1.3x oneDNN at 1 row, 1.2-1.6x at 8, 1.0-1.3x at 32 rows, 0.9x at 512 (noisy shared
// machine); bfloat16, which oneDNN and F.linear run there only through conversions, 1.5x F.linear at
// 1 row and 5-7x at 32 rows.

#include "vec_math.h"  // first: it picks at::vec's width

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#define KVSERVE_AVX2 1
#endif

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define KVSERVE_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
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

constexpr int64_t kAmxPanel = 32;  // AMX: output columns per panel, two 16-column tiles
constexpr int64_t kAmxK = 32;      // AMX: k per tile multiply (16 bfloat16 pairs)

constexpr int64_t kAvx2Panel = 16;     // AVX2: output columns per panel, two vectors of 8 float32
constexpr int64_t kAvx2RowTile = 6;    // AVX2: rows per register tile, 6 x 2 of the 16 vector registers
constexpr int64_t kAvx2RowBlock = 64;  // AVX2: rows whose float32 x stays in L2 while a thread's panels pass
// AVX2: k per chunk of a panel that its row tiles share out of L1 (16 KiB of float32, half a 32 KiB
// L1). Measured against whole panels (48 KiB at k = 768, out of L2) on the 125M Llama's sweep: 1.3x
// at 8 rows, within noise at 32.
constexpr int64_t kAvx2Chunk = 256;

#if defined(KVSERVE_AMX)
// Linux gives a process AMX's tile state only once it asks (arch_prctl ARCH_REQ_XCOMP_PERM for
// XTILEDATA); the first tile instruction without it faults. Asked once; refused: no AMX path.
bool amx_usable() {
  static const bool usable = [] {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return usable;
}
#endif

// Whether a weight runs on AMX tiles (bfloat16 whose columns fill 32-wide panels and whose k fills
// whole tiles), packed into panels of 32 rather than 48.
bool on_amx(at::ScalarType dtype, int64_t N, int64_t K) {
#if defined(KVSERVE_AMX)
  return dtype == at::kBFloat16 && N % kAmxPanel == 0 && K % kAmxK == 0 && amx_usable();
#else
  return false;
#endif
}

bool amx() {
#if defined(KVSERVE_AMX)
  return amx_usable();
#else
  return false;
#endif
}

bool weight_on_amx(const at::Tensor& weight) {
  return weight.dim() == 2 && on_amx(weight.scalar_type(), weight.size(0), weight.size(1));
}

// The instruction set the products run on: "avx512" or "avx2" (AMX, where it runs, comes on top).
std::string isa() {
#if defined(__AVX512F__)
  return "avx512";
#else
  return "avx2";
#endif
}

bool supports(at::ScalarType dtype) {
#if defined(KVSERVE_AVX2)
  return dtype == at::kFloat || dtype == at::kBFloat16;
#endif
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
#if defined(__AVX512F__)
  TORCH_CHECK(weight.scalar_type() != at::kBFloat16 || weight.size(1) % 2 == 0,
              "bfloat16 weights need an even in_features (vdpbf16ps multiplies pairs of k)");
#endif
}

// weight [N, K] in column panels of `width`: for each k (each `pair` of adjacent k), the panel's
// columns in order. Same shape, dtype and elements as weight.
at::Tensor pack_panels(const at::Tensor& weight, int64_t pair, int64_t width) {
  const int64_t N = weight.size(0), K = weight.size(1);
  at::Tensor packed = at::empty_like(weight);
  const int64_t elt = weight.element_size();
  const char* src = static_cast<const char*>(weight.data_ptr());
  char* dst = static_cast<char*>(packed.data_ptr());
  at::parallel_for(0, (N + width - 1) / width, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * width, r = std::min(width, N - n0);
      char* panel = dst + n0 * K * elt;
      for (int64_t k = 0; k < K; k += pair)
        for (int64_t c = 0; c < r; ++c)
          std::memcpy(panel + ((k / pair) * r + c) * pair * elt, src + ((n0 + c) * K + k) * elt, pair * elt);
    }
  });
  return packed;
}

at::Tensor pack(const at::Tensor& weight) {
  check_weight(weight);
#if defined(KVSERVE_AVX2)
  return pack_panels(weight, 1, kAvx2Panel);  // widened to float32 before multiplying: no pairs
#else
  const int64_t pair = weight.scalar_type() == at::kBFloat16 ? 2 : 1;  // k values kept adjacent
  return pack_panels(weight, pair, on_amx(weight.scalar_type(), weight.size(0), weight.size(1)) ? kAmxPanel : kPanel);
#endif
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
  _mm256_mask_storeu_epi16(o, m, kvserve_vec::to_bf16(v));
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
// (+ bias) in O: T, or float32 holding T's rounded values (the LM head's logits). Every `every`-th k
// step, starting at `phase`, prefetches the weight lines `ahead` bytes on (the next chunk), into L1 or
// L2 (TO_L1), so that the tiles of one chunk request the next one between them.
// Every loop over rows or blocks is unrolled: an accumulator indexed at run time anywhere would keep
// the whole array in memory.
template <typename T, typename O, int ROWS, bool TO_L1>
void tile(const T* x, int64_t ldx, const T* w, int64_t r, int64_t k0, int64_t k1, float* c, bool first,
          int64_t ahead, int64_t phase, int64_t every, O* out, int64_t ldo, const T* bias) {
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
    for (int i = 0; i < ROWS; ++i) {
      const __m512 sum = _mm512_add_ps(acc[i][b], add);
      store_out(out + i * ldo + 16 * b, mask, std::is_same_v<O, T> ? sum : __m512(kvserve_vec::rounded<T>(sum)));
    }
  }
}

template <typename T, typename O>
using TileFn = void (*)(const T*, int64_t, const T*, int64_t, int64_t, int64_t, float*, bool, int64_t, int64_t,
                        int64_t, O*, int64_t, const T*);

template <typename T, typename O, bool TO_L1>
constexpr TileFn<T, O> kTiles[kRowTile + 1] = {
    nullptr,                   &tile<T, O, 1, TO_L1>, &tile<T, O, 2, TO_L1>, &tile<T, O, 3, TO_L1>,
    &tile<T, O, 4, TO_L1>,     &tile<T, O, 5, TO_L1>, &tile<T, O, 6, TO_L1>, &tile<T, O, 7, TO_L1>,
    &tile<T, O, 8, TO_L1>};

// How a product of M rows streams its panels: k per chunk (256 bfloat16, 128 float32, 64 at
// decode sizes) and the tiles that prefetch the next chunk into L1 or L2 and write O.
template <typename T, typename O = T>
struct Streaming {
  int64_t chunk;
  const TileFn<T, O>* tiles;

  explicit Streaming(int64_t M) {
    const bool decode = std::is_same_v<T, float> && M <= kDecodeRows;
    chunk = (decode ? kDecodeChunkBytes : kChunkBytes) / (kPanel * static_cast<int64_t>(sizeof(T)));
    tiles = decode ? kTiles<T, O, true> : kTiles<T, O, false>;
  }

  // The first chunk of a thread's run of panels (width r from w): nothing before it prefetched it.
  void prefetch_first(const T* w, int64_t r, int64_t K) const {
    const char* start = reinterpret_cast<const char*>(w);
    const int64_t bytes = std::min(chunk, K) * r * sizeof(T);
    for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(start + b, _MM_HINT_T1);
  }

  // `rows` rows of x (row stride K) times one panel (width r, weights w) over all of K, chunk by chunk;
  // the last chunk's tiles write out (row stride ldo, plus bias). `next`: the weights this thread
  // streams after this panel, whose first chunk the last chunk's tiles prefetch.
  void panel(const T* x, int64_t rows, int64_t K, const T* w, int64_t r, const T* next, float* scratch, O* out,
             int64_t ldo, const T* bias) const {
    const int64_t count = (rows + kRowTile - 1) / kRowTile;
    for (int64_t k0 = 0; k0 < K; k0 += chunk) {
      const int64_t k1 = std::min(K, k0 + chunk);
      // Bytes from a k of this chunk to the same k of the next (which may lie in another tensor).
      const auto at = [](const T* p) { return reinterpret_cast<intptr_t>(p); };
      const int64_t ahead = at(k1 < K ? w + k1 * r : next) - at(w + k0 * r);
      for (int64_t t = 0; t < count; ++t) {
        const int64_t i0 = t * kRowTile, n = std::min(kRowTile, rows - i0);
        tiles[n](x + i0 * K, K, w, r, k0, k1, scratch + t * kRowTile * kPanel, k0 == 0, ahead, t, count,
                 k1 == K ? out + i0 * ldo : nullptr, ldo, bias);
      }
    }
  }
};

template <typename T, typename O = T>
void run(const T* x, int64_t M, int64_t K, const T* packed, int64_t N, const T* bias, O* out) {
  const int64_t panels = (N + kPanel - 1) / kPanel;
  const Streaming<T, O> stream(M);
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    std::vector<float> scratch(std::min(M, kRowBlock) * kPanel);
    stream.prefetch_first(packed + p0 * kPanel * K, std::min(kPanel, N - p0 * kPanel), K);
    for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
      const int64_t rows = std::min(kRowBlock, M - m0);
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t n0 = p * kPanel, r = std::min(kPanel, N - n0);
        const T* w = packed + n0 * K;
        stream.panel(x + m0 * K, rows, K, w, r, w + r * K, scratch.data(), out + m0 * N + n0, N,
                     bias ? bias + n0 : nullptr);
      }
    }
  });
}

// silu(x G^T) * (x U^T) for gate and up packed alike: each thread streams gate's panel p, then up's
// panel p, into two small buffers in T (rounded as the unfused products' outputs are) and writes
// silu-and-mul of them (vec_math.h's, as the fused layer op computes it) to out's columns of p. The
// same values as two products and the layer op, without their [M, N] outputs going through memory
// twice, nor the op's own pass over them.
template <typename T>
void run_gated(const T* x, int64_t M, int64_t K, const T* gate, const T* up, int64_t N, T* out) {
  const int64_t panels = (N + kPanel - 1) / kPanel;
  const Streaming<T> stream(M);
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    const int64_t block = std::min(M, kRowBlock);
    std::vector<float> scratch(block * kPanel);
    std::vector<T> halves(2 * block * kPanel);
    T* g = halves.data();
    T* u = g + block * kPanel;
    stream.prefetch_first(gate + p0 * kPanel * K, std::min(kPanel, N - p0 * kPanel), K);
    for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
      const int64_t rows = std::min(kRowBlock, M - m0);
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t n0 = p * kPanel, r = std::min(kPanel, N - n0);
        const T* gw = gate + n0 * K;
        const T* uw = up + n0 * K;
        stream.panel(x + m0 * K, rows, K, gw, r, uw, scratch.data(), g, kPanel, nullptr);
        stream.panel(x + m0 * K, rows, K, uw, r, gw + r * K, scratch.data(), u, kPanel, nullptr);
        for (int64_t i = 0; i < rows; ++i)
          kvserve_vec::silu_and_mul_row(g + i * kPanel, u + i * kPanel, r, out + (m0 + i) * N + n0);
      }
    }
  });
}

#endif  // __AVX512F__

#if defined(KVSERVE_AVX2)

// bfloat16 is float32's top half: 8 of them widened exactly.
inline __m256 widen8(const c10::BFloat16* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

inline void store8(float* o, __m256 v) { _mm256_storeu_ps(o, v); }

// Rounds to nearest even, as c10::BFloat16 does (AVX2 has no instruction for it); NaN stays NaN.
inline void store8(c10::BFloat16* o, __m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), nan);
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(o), packed);
}

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) { return widen8(p); }

// One register tile: ROWS rows of float32 x (row stride ldx) against a panel of 16 columns (W:
// float32, or bfloat16 widened as it is loaded) over k in [k0, k1). Accumulators start at zero
// (first chunk) or from the scratch c, and go back to c, or, on the last chunk (out not null), plus
// the panel's bias (16 float32, zero past r), into the first r columns of out. Every `every`-th k it
// prefetches the next line of [prefetch, prefetch_end) (this tile's share of the next panel) into
// L2, so the next panel arrives while this one computes.
template <typename W, typename T, int ROWS>
void tile_avx2(const float* x, int64_t ldx, const W* w, int64_t k0, int64_t k1, float* c, bool first,
               const float* bias, int64_t r, T* out, int64_t ldo, const char*& prefetch, const char* prefetch_end,
               int64_t every) {
  __m256 acc[ROWS][2];
  #pragma GCC unroll 6
  for (int i = 0; i < ROWS; ++i)
    #pragma GCC unroll 2
    for (int v = 0; v < 2; ++v) acc[i][v] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(c + i * kAvx2Panel + 8 * v);
  int64_t turn = 0;
  for (int64_t k = k0; k < k1; ++k) {
    if (--turn < 0 && prefetch < prefetch_end) {
      _mm_prefetch(prefetch, _MM_HINT_T1);
      prefetch += 64;
      turn = every - 1;
    }
    const __m256 w0 = load8(w + k * kAvx2Panel), w1 = load8(w + k * kAvx2Panel + 8);
    #pragma GCC unroll 6
    for (int i = 0; i < ROWS; ++i) {
      const __m256 xi = _mm256_broadcast_ss(x + i * ldx + k);
      acc[i][0] = _mm256_fmadd_ps(xi, w0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(xi, w1, acc[i][1]);
    }
  }
  if (out == nullptr) {
    #pragma GCC unroll 6
    for (int i = 0; i < ROWS; ++i)
      #pragma GCC unroll 2
      for (int v = 0; v < 2; ++v) _mm256_storeu_ps(c + i * kAvx2Panel + 8 * v, acc[i][v]);
    return;
  }
  const __m256 b0 = _mm256_loadu_ps(bias), b1 = _mm256_loadu_ps(bias + 8);
  #pragma GCC unroll 6
  for (int i = 0; i < ROWS; ++i) {
    if (r == kAvx2Panel) {
      store8(out + i * ldo, _mm256_add_ps(acc[i][0], b0));
      store8(out + i * ldo + 8, _mm256_add_ps(acc[i][1], b1));
    } else {  // the last, narrower panel
      T row[kAvx2Panel];
      store8(row, _mm256_add_ps(acc[i][0], b0));
      store8(row + 8, _mm256_add_ps(acc[i][1], b1));
      std::memcpy(out + i * ldo, row, r * sizeof(T));
    }
  }
}

template <typename W, typename T>
using Avx2TileFn = void (*)(const float*, int64_t, const W*, int64_t, int64_t, float*, bool, const float*, int64_t,
                            T*, int64_t, const char*&, const char*, int64_t);

template <typename W, typename T>
constexpr Avx2TileFn<W, T> kAvx2Tiles[kAvx2RowTile + 1] = {
    nullptr, &tile_avx2<W, T, 1>, &tile_avx2<W, T, 2>, &tile_avx2<W, T, 3>,
    &tile_avx2<W, T, 4>, &tile_avx2<W, T, 5>, &tile_avx2<W, T, 6>};

// A packed panel (width r, k-major) as float32, 16 columns wide with zeros past r.
template <typename T>
void widen_panel(const T* panel, int64_t r, int64_t K, float* dst) {
  if (r == kAvx2Panel) {
    for (int64_t i = 0; i < K * kAvx2Panel; i += 8) _mm256_storeu_ps(dst + i, load8(panel + i));
    return;
  }
  for (int64_t k = 0; k < K; ++k)
    for (int64_t c = 0; c < kAvx2Panel; ++c) dst[k * kAvx2Panel + c] = c < r ? static_cast<float>(panel[k * r + c]) : 0.0f;
}

// Rows from which a bfloat16 panel is widened into a float32 buffer once for all its row tiles, rather
// than in registers by each tile (that costs a tile 2 conversions per 12 multiply-adds).
constexpr int64_t kAvx2WidenRows = 2 * kAvx2RowTile + 1;

// AVX2 (no AVX-512): x and bias come as float32, every product is float32 FMA. Each thread takes a
// run of 16-column panels, once per block of 64 rows. A full panel is read in place (bfloat16
// widened in registers) unless a bfloat16 panel has enough row tiles to share one widening into a
// per-thread float32 buffer; the last, narrower panel is always widened there (zero-padded). A
// panel's k is cut into chunks that stay in L1 while its row tiles pass over them; meanwhile the
// tiles prefetch the next panel into L2, each its share.
template <typename T>
void run_avx2(const float* x, int64_t M, int64_t K, const T* packed, int64_t N, const float* bias, T* out) {
  const int64_t panels = (N + kAvx2Panel - 1) / kAvx2Panel;
  constexpr int64_t chunk = kAvx2Chunk;
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    std::vector<float> widened, scratch(kAvx2RowBlock * kAvx2Panel);
    for (int64_t m0 = 0; m0 < M; m0 += kAvx2RowBlock) {
      const int64_t m1 = std::min(M, m0 + kAvx2RowBlock), tiles = (m1 - m0 + kAvx2RowTile - 1) / kAvx2RowTile;
      // Rows shared evenly among the tiles where each gets 5 or more (32 rows: 6, 6, 5, 5, 5, 5, not five
      // of 6 and one of 2, whose 4 accumulators keep one FMA pipe of two busy): measured on one hot
      // 2048 x 768 weight, 1.02x at 32 rows and 1.11x at 16. Tiles of 4 ran slower than 6 + 2 (8 rows:
      // 0.79x), their 8 accumulators just enough to cover the FMA latency, so those keep tiles of 6.
      const int64_t even = (m1 - m0) / tiles >= kAvx2RowTile - 1;
      const int64_t base = even ? (m1 - m0) / tiles : kAvx2RowTile, extra = even ? (m1 - m0) % tiles : 0;
      const bool widen = !std::is_same_v<T, float> && m1 - m0 >= kAvx2WidenRows;
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t n0 = p * kAvx2Panel, r = std::min(kAvx2Panel, N - n0);
        const T* panel = packed + n0 * K;
        const float* wide = nullptr;
        if (widen || r < kAvx2Panel) {
          widened.resize(K * kAvx2Panel);
          widen_panel(panel, r, K, widened.data());
          wide = widened.data();
        }
        // The next panel of this run, cut into one share per tile and chunk (whole lines).
        const char* next = reinterpret_cast<const char*>(panel + r * K);
        const int64_t next_bytes = p + 1 < p1 ? std::min(kAvx2Panel, N - n0 - r) * K * sizeof(T) : 0;
        const int64_t chunks = (K + chunk - 1) / chunk, shares = tiles * chunks;
        const int64_t share = (next_bytes / shares + 63) / 64 * 64;
        const int64_t every = std::max<int64_t>(1, std::min(chunk, K) / std::max<int64_t>(1, share / 64));
        const char* prefetch = next;
        const char* const prefetch_end = next + next_bytes;
        for (int64_t k0 = 0; k0 < K; k0 += chunk) {
          const int64_t k1 = std::min(K, k0 + chunk);
          for (int64_t t = 0; t < tiles; ++t) {
            const int64_t i0 = m0 + t * base + std::min(t, extra), n = std::min(base + (t < extra), m1 - i0);
            float* c = scratch.data() + (i0 - m0) * kAvx2Panel;
            T* o = k1 == K ? out + i0 * N + n0 : nullptr;
            const char* share_end = std::min(prefetch + share, prefetch_end);
            if (wide != nullptr)
              kAvx2Tiles<float, T>[n](x + i0 * K, K, wide, k0, k1, c, k0 == 0, bias + n0, r, o, N, prefetch, share_end, every);
            else
              kAvx2Tiles<T, T>[n](x + i0 * K, K, panel, k0, k1, c, k0 == 0, bias + n0, r, o, N, prefetch, share_end, every);
          }
        }
      }
    }
  });
}

#endif  // KVSERVE_AVX2

#if defined(KVSERVE_AMX)

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

constexpr int64_t kAmxRows = 16;        // rows of a tile
constexpr int64_t kAmxRowBlock = 128;   // rows whose x stays in L2 while a thread's panels pass

// Every tile 16 rows x 64 bytes: float32 accumulators C[group][column tile] in tmm0-3 (two groups of
// 16 rows x a panel's two 16-column tiles), x's 16 rows x 32 k of each group in tmm4-5, the
// panel's 16 k pairs x 16 columns (pairs adjacent, as packed) of each column tile in tmm6-7.
void configure_tiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = kAmxRows;
  }
  _tile_loadconfig(&config);
}

inline void zero_accumulators() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

// One k step: x's tile group at `xk` (and the next group when `two`) times the panel step's two
// column tiles at `wk`, into the accumulators.
inline void multiply_step(const char* wk, int64_t ldw, const char* xk, int64_t ldx, bool two) {
  _tile_loadd(6, wk, ldw);
  _tile_loadd(7, wk + 64, ldw);
  _tile_loadd(4, xk, ldx);
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  if (two) {
    _tile_loadd(5, xk + kAmxRows * ldx, ldx);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
}

// The accumulators into `c` (kAmxPanel floats a row), then their first `rows` to `out` (row stride N,
// columns n0..n0+kAmxPanel) times `scale` (null: none, else one or one per column) plus `bias`.
inline void write_panel(float* c, bool two, int64_t rows, const float* scale, bool per_column,
                        const c10::BFloat16* bias, int64_t n0, int64_t N, c10::BFloat16* out) {
  constexpr int64_t ldc = kAmxPanel * sizeof(float);
  _tile_stored(0, c, ldc);
  _tile_stored(1, c + 16, ldc);
  if (two) {
    _tile_stored(2, c + kAmxRows * kAmxPanel, ldc);
    _tile_stored(3, c + kAmxRows * kAmxPanel + 16, ldc);
  }
  for (int64_t b = 0; b < 2; ++b) {
    const __m512 add = bias ? load_bias(bias + n0 + 16 * b, 0xFFFF) : _mm512_setzero_ps();
    const __m512 times = !scale ? _mm512_set1_ps(1.0f)
                         : per_column ? _mm512_loadu_ps(scale + n0 + 16 * b) : _mm512_set1_ps(*scale);
    for (int64_t i = 0; i < rows; ++i)  // times 1 is exact: the dense sums as they were
      store_out(out + i * N + n0 + 16 * b, 0xFFFF,
                _mm512_fmadd_ps(_mm512_load_ps(c + i * kAmxPanel + 16 * b), times, add));
  }
}

// bfloat16 on AMX: each thread streams its run of 32-column panels, once per block of 128 rows; for
// every 32 rows (two tile groups) a panel's k runs through four accumulator tiles, each weight and x
// tile loaded once per k (so no load waits on a multiply still reading its tile). The first 32
// rows of a row block prefetch the next k step's weights (2 KiB on; after a panel's last step, the
// next panel's first) into L1: a tile load waiting on L2 holds up the multiplies queued behind it,
// so without it their time adds to the stream's instead of hiding in it. Measured with the same
// packed weights, alternating in one process (separate processes differ by up to 15% with where
// the weights land in memory): the 125M Llama's projections in turn 1.09-1.13x at 32 rows,
// 1.06-1.08x at 64, unchanged at 1 row (already at the memory's bandwidth); in the engine, bfloat16
// 1.10x on the 125M Llama's 32-sequence decode and 1.03x on SmolLM2's chat mix. 4-8 KiB ahead gained
// less or nothing, 16 KiB ahead into L2 nothing.
// Rows are zero-padded to whole tiles. `panel_of(p, buffer)` gives panel p's bfloat16 pairs (all k):
// the packed weight's own, or FP8 weights converted into the thread's buffer; `scale` (null: none, else
// one or one per column) multiplies the sums before the bias is added.
template <typename PanelOf>
void run_amx_panels(const c10::BFloat16* x, int64_t M, int64_t K, int64_t N, const float* scale, bool per_column,
                    const c10::BFloat16* bias, c10::BFloat16* out, PanelOf panel_of) {
  const int64_t padded_rows = (M + kAmxRows - 1) / kAmxRows * kAmxRows;
  std::vector<c10::BFloat16> padded;
  if (padded_rows != M) {  // whole tiles: rows past M zero
    padded.assign(padded_rows * K, c10::BFloat16(0.0f));
    std::memcpy(padded.data(), x, M * K * sizeof(c10::BFloat16));
    x = padded.data();
  }
  constexpr int64_t ldw = kAmxPanel * 2 * sizeof(c10::BFloat16);  // bytes per k pair of a panel
  constexpr int64_t step_bytes = kAmxK / 2 * ldw;                // a panel's weights per k step
  const int64_t ldx = K * sizeof(c10::BFloat16);
  at::parallel_for(0, N / kAmxPanel, 1, [&](int64_t p0, int64_t p1) {
    configure_tiles();
    alignas(64) float c[2 * kAmxRows * kAmxPanel];
    std::vector<c10::BFloat16> buffer;
    for (int64_t mb = 0; mb < padded_rows; mb += kAmxRowBlock) {
     for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * kAmxPanel;
      const char* w = reinterpret_cast<const char*>(panel_of(p, buffer));
      for (int64_t m0 = mb; m0 < std::min(padded_rows, mb + kAmxRowBlock); m0 += 2 * kAmxRows) {
        const bool two = m0 + kAmxRows < padded_rows;
        zero_accumulators();
        const char* xm = reinterpret_cast<const char*>(x + m0 * K);
        for (int64_t k = 0; k < K; k += kAmxK) {
          const char* wk = w + k / 2 * ldw;
          const char* xk = xm + k * sizeof(c10::BFloat16);
          if (m0 == mb) {  // prefetching never faults, so the run's last step may reach past it
            #pragma GCC unroll 32
            for (int64_t line = 0; line < step_bytes; line += 64) _mm_prefetch(wk + step_bytes + line, _MM_HINT_T0);
          }
          multiply_step(wk, ldw, xk, ldx, two);
        }
        write_panel(c, two, std::min(2 * kAmxRows, M - m0), scale, per_column, bias, n0, N, out + m0 * N);
      }
     }
    }
    _tile_release();
  });
}

void run_amx(const c10::BFloat16* x, int64_t M, int64_t K, const c10::BFloat16* packed, int64_t N,
             const c10::BFloat16* bias, c10::BFloat16* out) {
  run_amx_panels(x, M, K, N, nullptr, false, bias, out,
                 [&](int64_t p, std::vector<c10::BFloat16>&) { return packed + p * kAmxPanel * K; });
}

#endif  // KVSERVE_AMX

// ---- FP8 weights: y = (x W^T) * scale + b for W in float8 E4M3, converted in registers ----------
//
// The weight stays one byte an element: packed into panels of 32 columns in the bfloat16 pair layout
// (for each pair of k, each column's two bytes adjacent), 64 bytes per k pair; in a full panel those
// 64 bytes are reordered (pack_fp8) so that in-lane unpacks interleave them. They become two vectors
// of 32 bfloat16 (16 columns' pairs each), exactly, with two 128-entry table lookups (vpermi2b on the
// 7 bits below the sign: the low and the high byte of each value), the sign or-ed into the high
// bytes, and two byte unpacks interleaving low and high (a narrower last panel, in column order:
// two cross-lane vpermt2b); every E4M3 value (subnormals, NaN) is a bfloat16. bfloat16 x then
// multiplies with vdpbf16ps; float32 x with FMA on the pairs split into float32 (each is a float32's
// top half). The scale (one, or one per output column) multiplies the float32 sums once, with the
// bias added, before the one rounding to x's dtype.
// Up to kFp8StageRows rows every row tile converts the panel in its registers (decode: no copy of
// any weight); above, a panel's chunk of k is converted once into a per-thread bfloat16 buffer that
// all the row tiles read, while they prefetch the next chunk's bytes into L2 between them (nothing
// else touches the FP8 stream while they multiply, so without it each chunk's conversion waited on
// DRAM). Measured on a 2-core AMD EPYC (Zen 5: AVX-512, AVX512-BF16, no AMX) over the benchmark
// model's projections (16 layers of 768->1280, 768->768, 2x 768->2048, 2048->768, from DRAM),
// bfloat16 x, ms per sweep, medians of alternating rounds, before -> after (dense bfloat16). One
// thread, 5 rounds: 1 row 3.37 -> 3.25 (5.65), 8 rows 5.44 -> 5.27 (5.78), 16 rows 9.69 -> 9.06
// (8.63), 32 rows 20.26 -> 16.34 (14.70), 64 rows 33.83 -> 30.35 (28.43); at 32 rows the prefetch
// gave 0.84x, the unpacks (in place of two cross-lane interleaves) 0.95x. Two threads, 7 rounds:
// 1 row 2.65 -> 2.51 (6.07), 8 rows 3.23 -> 3.16 (5.65), 17 rows 9.13 -> 6.80 (6.44), 32 rows
// 11.65 -> 9.71 (8.37). In the engine (benchmarks/quantization.py --decode-rounds 5
// --decode-prompts 32, runs of the old and new tree in turn) FP8 decode against bfloat16's: 0.86,
// 0.86, 0.89x before, 0.91, 0.96, 1.00, 1.09x after. The staged tiles alone (conversion skipped,
// timing only) ran 32 rows on one thread in 13.6 ms, the dense kernel's rate: the rest is the
// conversion. No gain: 12- or 16-row staged tiles (fewer loads per multiply), chunks of 128 or 512
// k, staging from 9 rows, prefetching into L1, and converting the next chunk a pair at a time
// between the tiles' multiplies into a second buffer (within 3% of converting it first: the
// conversion's shuffles do not hide behind vdpbf16ps).
// AMX (bfloat16 x, weights whose sizes fill its tiles, as for bfloat16 weights): the converted pairs
// are the tiles' weight operand, so a panel's k steps are converted into L1 buffers that the tiles
// load (up to 32 rows), or a whole panel into a per-thread buffer shared by every row group (more).
// Needs AVX512-VBMI (the byte lookups); bfloat16 x also AVX512-BF16. Without them (AVX2-only CPUs)
// fp8_supports() is false and the caller keeps its own path.

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VBMI__)
#define KVSERVE_FP8 1
#endif

bool fp8_supports(at::ScalarType dtype) {
#if defined(KVSERVE_FP8)
  if (dtype == at::kFloat) return true;
#if defined(__AVX512BF16__)
  if (dtype == at::kBFloat16) return true;
#endif
#endif
  return false;
}

constexpr int64_t kFp8Panel = 32;      // output columns per panel: two vectors of 16 float32
constexpr int64_t kFp8StageK = 256;    // k per chunk a staged panel is converted in: 16 KiB of bfloat16
constexpr int64_t kFp8StageRows = 16;  // more rows than this share one conversion per chunk
// FP8 bytes prefetched ahead of the conversion, into L1. At 8 rows on the 2-core Xeon (AMX path, the
// projections of a 16-layer 768-wide Llama in turn, one thread, a shared machine) FP8 weights ran
// 1.16x faster than bfloat16 ones without it, 1.44x at 1 KiB ahead, 1.72x at 2 KiB (4 KiB: slower at 8
// rows on two threads).
constexpr int64_t kFp8Ahead = 2048;

void check_fp8_weight(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.device().is_cpu() &&
                  weight.scalar_type() == at::kFloat8_e4m3fn,
              "the weight must be a contiguous 2-D CPU float8_e4m3fn tensor [out_features, in_features]");
  TORCH_CHECK(weight.size(1) % 2 == 0, "float8 weights need an even in_features (they multiply in pairs of k)");
}

at::Tensor pack_fp8(const at::Tensor& weight) {
  check_fp8_weight(weight);
  TORCH_CHECK(fp8_supports(at::kFloat), "this build runs no float8 weights (it needs AVX-512 with VBMI)");
  at::Tensor packed = pack_panels(weight, 2, kFp8Panel);
  // Full panels: each k pair's 64 bytes reordered so that the in-lane byte unpacks of fp8_to_bf16 give
  // the pairs in column order (byte 16l + j of the packed pair: its byte 8l + j, 16l + 8 + j: 32 + 8l + j).
  const int64_t K = weight.size(1), full = weight.size(0) / kFp8Panel;
  uint8_t* bytes = static_cast<uint8_t*>(packed.data_ptr());
  at::parallel_for(0, full, 1, [&](int64_t p0, int64_t p1) {
    uint8_t pair[2 * kFp8Panel];
    for (uint8_t* g = bytes + p0 * kFp8Panel * K; g < bytes + p1 * kFp8Panel * K; g += 2 * kFp8Panel) {
      std::memcpy(pair, g, sizeof(pair));
      for (int l = 0; l < 4; ++l)
        for (int j = 0; j < 8; ++j) {
          g[16 * l + j] = pair[8 * l + j];
          g[16 * l + 8 + j] = pair[32 + 8 * l + j];
        }
    }
  });
  return packed;
}

#if defined(KVSERVE_FP8)

// The bfloat16 bits of the E4M3 value whose bits below the sign are v (0x7F: NaN).
constexpr uint16_t e4m3_bf16_bits(int v) {
  if (v == 0x7F) return 0x7FC0;
  int e = v >> 3, m = v & 7;
  if (e == 0) {  // subnormal m * 2^-9: normalized, as bfloat16 has the exponent range
    if (m == 0) return 0;
    e = 1;
    while (m < 8) {
      m <<= 1;
      --e;
    }
    m -= 8;
  }
  return static_cast<uint16_t>(((e + 120) << 7) | (m << 4));  // exponent bias 7 -> 127
}

struct alignas(64) Fp8Tables {
  uint8_t lo[128], hi[128];    // each value's low and high bfloat16 byte, by its 7 bits below the sign
  uint8_t first[64], second[64];  // vpermt2b indices interleaving lo and hi bytes 0-31 and 32-63
};

constexpr Fp8Tables make_fp8_tables() {
  Fp8Tables t{};
  for (int v = 0; v < 128; ++v) {
    t.lo[v] = static_cast<uint8_t>(e4m3_bf16_bits(v) & 0xFF);
    t.hi[v] = static_cast<uint8_t>(e4m3_bf16_bits(v) >> 8);
  }
  for (int p = 0; p < 64; ++p) {  // byte p of a word vector: low (even p) or high (odd p, table 2) byte of p / 2
    t.first[p] = static_cast<uint8_t>((p % 2 ? 64 : 0) + p / 2);
    t.second[p] = static_cast<uint8_t>((p % 2 ? 64 : 0) + 32 + p / 2);
  }
  return t;
}

constexpr Fp8Tables kFp8Tables = make_fp8_tables();

struct Fp8Lut {
  __m512i lo0, lo1, hi0, hi1, first, second, sign;
  Fp8Lut()
      : lo0(_mm512_load_si512(kFp8Tables.lo)), lo1(_mm512_load_si512(kFp8Tables.lo + 64)),
        hi0(_mm512_load_si512(kFp8Tables.hi)), hi1(_mm512_load_si512(kFp8Tables.hi + 64)),
        first(_mm512_load_si512(kFp8Tables.first)), second(_mm512_load_si512(kFp8Tables.second)),
        sign(_mm512_set1_epi8(static_cast<char>(0x80))) {}
};

// 64 E4M3 bytes (a k pair of 32 columns) as bfloat16 pairs: w0 the first 16 columns', w1 the next 16.
// A full panel's bytes are in pack_fp8's order, so in-lane unpacks interleave the low and high bytes
// (a cross-lane vpermt2b each for a narrower panel's, which are in column order).
inline void fp8_to_bf16(__m512i raw, const Fp8Lut& t, bool full, __m512i& w0, __m512i& w1) {
  const __m512i lo = _mm512_permutex2var_epi8(t.lo0, raw, t.lo1);  // index bit 7 (the sign) ignored
  __m512i hi = _mm512_permutex2var_epi8(t.hi0, raw, t.hi1);
  hi = _mm512_ternarylogic_epi32(hi, raw, t.sign, 0xF8);  // hi | (raw & 0x80)
  if (full) {
    w0 = _mm512_unpacklo_epi8(lo, hi);
    w1 = _mm512_unpackhi_epi8(lo, hi);
  } else {
    w0 = _mm512_permutex2var_epi8(lo, t.first, hi);
    w1 = _mm512_permutex2var_epi8(lo, t.second, hi);
  }
}

inline __mmask64 fp8_pair_bytes(int64_t r) { return r >= kFp8Panel ? ~0ULL : (1ULL << (2 * r)) - 1; }

// One register tile: ROWS rows of x (row stride ldx) against one panel (width r) over k in [k0, k1),
// its weights converted from the panel's bytes (STAGED false) or read from `wide`, the chunk starting
// at k0 already converted (32 columns' bfloat16 pairs per k pair). Accumulators start at zero (first)
// or from the scratch c and go back to c, or, on the last chunk, times the scale plus the bias into
// out. The fp8 stream prefetches kFp8Ahead bytes on, into L1; staged, every `every`-th k pair from
// `phase` prefetches the same pair's line of the next chunk into L2 (the tiles of a chunk share it out).
template <typename T, int ROWS, bool STAGED>
void fp8_tile(const T* x, int64_t ldx, const uint8_t* panel, const c10::BFloat16* wide, int64_t r, int64_t k0,
              int64_t k1, float* c, bool first, bool last, const float* scale, bool per_column, const T* bias,
              T* out, int64_t ldo, int64_t phase, int64_t every) {
  const Fp8Lut lut;
  int64_t turn = phase;
  const __mmask64 bytes = fp8_pair_bytes(r);
  __m512 acc[ROWS][2];
  #pragma GCC unroll 8
  for (int i = 0; i < ROWS; ++i)
    #pragma GCC unroll 2
    for (int b = 0; b < 2; ++b) acc[i][b] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * kFp8Panel + 16 * b);
  for (int64_t k = k0; k < k1; k += 2) {
    __m512i w0, w1;
    if constexpr (STAGED) {
      const c10::BFloat16* wk = wide + (k - k0) * kFp8Panel;
      w0 = _mm512_loadu_si512(wk);
      w1 = _mm512_loadu_si512(wk + 32);
      if (turn == 0) {  // the chunk ends at k1: the next one (or the next panel's first) follows it
        _mm_prefetch(reinterpret_cast<const char*>(panel + k * r + (k1 - k0) * r), _MM_HINT_T1);
        turn = every;
      }
      --turn;
    } else {
      const uint8_t* wk = panel + k * r;  // this k pair's 2r bytes
      _mm_prefetch(reinterpret_cast<const char*>(wk) + kFp8Ahead, _MM_HINT_T0);
      fp8_to_bf16(_mm512_maskz_loadu_epi8(bytes, wk), lut, r == kFp8Panel, w0, w1);
    }
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
#if defined(__AVX512BF16__)
      #pragma GCC unroll 8
      for (int i = 0; i < ROWS; ++i) {
        const __m512bh xi = (__m512bh)_mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x + i * ldx + k));
        acc[i][0] = _mm512_dpbf16_ps(acc[i][0], xi, (__m512bh)w0);
        acc[i][1] = _mm512_dpbf16_ps(acc[i][1], xi, (__m512bh)w1);
      }
#endif
    } else {  // each 32-bit lane holds k's bfloat16 in its low half and k+1's in its high half
      const __m512i top = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
      const __m512 a0 = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16)), b0 = _mm512_castsi512_ps(_mm512_and_si512(w0, top));
      const __m512 a1 = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16)), b1 = _mm512_castsi512_ps(_mm512_and_si512(w1, top));
      #pragma GCC unroll 8
      for (int i = 0; i < ROWS; ++i) {
        const __m512 x0 = _mm512_set1_ps(x[i * ldx + k]), x1 = _mm512_set1_ps(x[i * ldx + k + 1]);
        acc[i][0] = _mm512_fmadd_ps(x1, b0, _mm512_fmadd_ps(x0, a0, acc[i][0]));
        acc[i][1] = _mm512_fmadd_ps(x1, b1, _mm512_fmadd_ps(x0, a1, acc[i][1]));
      }
    }
  }
  if (!last) {
    #pragma GCC unroll 8
    for (int i = 0; i < ROWS; ++i)
      #pragma GCC unroll 2
      for (int b = 0; b < 2; ++b) _mm512_storeu_ps(c + i * kFp8Panel + 16 * b, acc[i][b]);
    return;
  }
  #pragma GCC unroll 2
  for (int b = 0; b < 2; ++b) {
    const __mmask16 mask = lanes(r - 16 * b);
    if (!mask) break;
    const __m512 s = per_column ? _mm512_maskz_loadu_ps(mask, scale + 16 * b) : _mm512_set1_ps(*scale);
    const __m512 add = bias ? load_bias(bias + 16 * b, mask) : _mm512_setzero_ps();
    #pragma GCC unroll 8
    for (int i = 0; i < ROWS; ++i) store_out(out + i * ldo + 16 * b, mask, _mm512_fmadd_ps(acc[i][b], s, add));
  }
}

template <typename T>
using Fp8TileFn = void (*)(const T*, int64_t, const uint8_t*, const c10::BFloat16*, int64_t, int64_t, int64_t, float*,
                           bool, bool, const float*, bool, const T*, T*, int64_t, int64_t, int64_t);

template <typename T, bool STAGED>
constexpr Fp8TileFn<T> kFp8Tiles[kRowTile + 1] = {
    nullptr, &fp8_tile<T, 1, STAGED>, &fp8_tile<T, 2, STAGED>, &fp8_tile<T, 3, STAGED>, &fp8_tile<T, 4, STAGED>,
    &fp8_tile<T, 5, STAGED>, &fp8_tile<T, 6, STAGED>, &fp8_tile<T, 7, STAGED>, &fp8_tile<T, 8, STAGED>};

// A panel's k in [k0, k1) converted to bfloat16 pairs, 32 columns per k pair (zeros past r).
void convert_fp8_chunk(const uint8_t* panel, int64_t r, int64_t k0, int64_t k1, c10::BFloat16* wide) {
  const Fp8Lut lut;
  const __mmask64 bytes = fp8_pair_bytes(r);
  for (int64_t k = k0; k < k1; k += 2) {
    __m512i w0, w1;
    _mm_prefetch(reinterpret_cast<const char*>(panel + k * r) + kFp8Ahead, _MM_HINT_T0);
    fp8_to_bf16(_mm512_maskz_loadu_epi8(bytes, panel + k * r), lut, r == kFp8Panel, w0, w1);
    _mm512_storeu_si512(wide + (k - k0) * kFp8Panel, w0);
    _mm512_storeu_si512(wide + (k - k0) * kFp8Panel + 32, w1);
  }
}

// Each thread takes a run of panels. Up to kFp8StageRows rows: per panel, each row tile runs the whole
// k converting in registers. More: per block of kRowBlock rows and chunk of kFp8StageK, the chunk is
// converted once and every row tile reads it, sums kept in a per-thread float32 scratch between chunks.
template <typename T>
void run_fp8(const T* x, int64_t M, int64_t K, const uint8_t* packed, int64_t N, const float* scale,
             bool per_column, const T* bias, T* out) {
  const int64_t panels = (N + kFp8Panel - 1) / kFp8Panel;
  const bool staged = M > kFp8StageRows;
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    std::vector<float> scratch(staged ? std::min(M, kRowBlock) * kFp8Panel : 0);
    std::vector<c10::BFloat16> wide(staged ? kFp8StageK * kFp8Panel : 0);
    for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
      const int64_t rows = std::min(kRowBlock, M - m0), tiles = (rows + kRowTile - 1) / kRowTile;
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t n0 = p * kFp8Panel, r = std::min(kFp8Panel, N - n0);
        const uint8_t* panel = packed + n0 * K;
        const float* s = per_column ? scale + n0 : scale;
        const T* b = bias ? bias + n0 : nullptr;
        const int64_t chunk = staged ? kFp8StageK : K;
        for (int64_t k0 = 0; k0 < K; k0 += chunk) {
          const int64_t k1 = std::min(K, k0 + chunk);
          if (staged) convert_fp8_chunk(panel, r, k0, k1, wide.data());
          for (int64_t t = 0; t < tiles; ++t) {
            const int64_t i0 = m0 + t * kRowTile, n = std::min(kRowTile, M - i0);
            (staged ? kFp8Tiles<T, true> : kFp8Tiles<T, false>)[n](
                x + i0 * K, K, panel, wide.data(), r, k0, k1, scratch.data() + t * kRowTile * kFp8Panel, k0 == 0,
                k1 == K, s, per_column, b, out + i0 * N + n0, N, t, tiles);
          }
        }
      }
    }
  });
}

#if defined(KVSERVE_AMX)
// More than 32 rows: each panel converted whole (its k pairs in the layout the tiles load) into the
// thread's buffer, once per block of 128 rows, then multiplied on tiles as bfloat16 weights are.
static_assert(kFp8Panel == kAmxPanel, "an FP8 panel converts into one AMX panel");

// Up to 32 rows (one pass of two tile groups): each k step of a panel is converted into one of two
// L1 buffers just before its tiles load it, so no converted panel leaves L1.
void run_fp8_amx_decode(const c10::BFloat16* x, int64_t M, int64_t K, const uint8_t* packed, int64_t N,
                        const float* scale, bool per_column, const c10::BFloat16* bias, c10::BFloat16* out) {
  const int64_t padded_rows = (M + kAmxRows - 1) / kAmxRows * kAmxRows;
  std::vector<c10::BFloat16> padded(padded_rows * K, c10::BFloat16(0.0f));
  std::memcpy(padded.data(), x, M * K * sizeof(c10::BFloat16));
  constexpr int64_t ldw = kAmxPanel * 2 * sizeof(c10::BFloat16);
  const int64_t ldx = K * sizeof(c10::BFloat16);
  const bool two = padded_rows > kAmxRows;
  at::parallel_for(0, N / kAmxPanel, 1, [&](int64_t p0, int64_t p1) {
    configure_tiles();
    alignas(64) float c[2 * kAmxRows * kAmxPanel];
    alignas(64) c10::BFloat16 steps[2][kAmxK * kAmxPanel];
    const char* xm = reinterpret_cast<const char*>(padded.data());
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * kAmxPanel;
      const uint8_t* panel = packed + n0 * K;
      zero_accumulators();
      for (int64_t k = 0; k < K; k += kAmxK) {
        c10::BFloat16* step = steps[(k / kAmxK) % 2];
        convert_fp8_chunk(panel, kAmxPanel, k, k + kAmxK, step);
        const char* wk = reinterpret_cast<const char*>(step);
        const char* xk = xm + k * sizeof(c10::BFloat16);
        multiply_step(wk, ldw, xk, ldx, two);
      }
      write_panel(c, two, M, scale, per_column, bias, n0, N, out);
    }
    _tile_release();
  });
}

void run_fp8_amx(const c10::BFloat16* x, int64_t M, int64_t K, const uint8_t* packed, int64_t N, const float* scale,
                 bool per_column, const c10::BFloat16* bias, c10::BFloat16* out) {
  run_amx_panels(x, M, K, N, scale, per_column, bias, out, [&](int64_t p, std::vector<c10::BFloat16>& buffer) {
    buffer.resize(K * kFp8Panel);
    convert_fp8_chunk(packed + p * kFp8Panel * K, kFp8Panel, 0, K, buffer.data());
    return static_cast<const c10::BFloat16*>(buffer.data());
  });
}
#endif

#endif  // KVSERVE_FP8

// x's rows as one contiguous [M, K] matrix, and an empty output of x's shape with N last, in `dtype`
// (default: x's).
std::pair<at::Tensor, at::Tensor> rows_and_output(const at::Tensor& x, int64_t K, int64_t N,
                                                  c10::optional<at::ScalarType> dtype = c10::nullopt) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  return {x.reshape({-1, K}).contiguous(), at::empty(shape, x.options().dtype(dtype.value_or(x.scalar_type())))};
}

at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                      const c10::optional<at::Tensor>& bias) {
  check_fp8_weight(packed);
  const int64_t N = packed.size(0), K = packed.size(1);
  TORCH_CHECK(x.device().is_cpu() && fp8_supports(x.scalar_type()) && x.size(-1) == K,
              "x must be a CPU tensor [..., ", K, "] of a dtype this build runs with float8 weights (got ",
              x.scalar_type(), ")");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && (scale.numel() == 1 || scale.numel() == N),
              "scale must be a contiguous float32 tensor of 1 or ", N, " elements");
  TORCH_CHECK(!bias.has_value() || (bias->dim() == 1 && bias->size(0) == N && bias->scalar_type() == x.scalar_type() &&
                                    bias->is_contiguous()),
              "bias must be a contiguous [", N, "] tensor of x's dtype");
  const auto [rows, out] = rows_and_output(x, K, N);
#if defined(KVSERVE_FP8)
  const int64_t M = rows.size(0);
  const uint8_t* w = static_cast<const uint8_t*>(packed.data_ptr());
  const bool per_column = scale.numel() > 1;
  if (M > 0 && x.scalar_type() == at::kFloat)
    run_fp8<float>(rows.data_ptr<float>(), M, K, w, N, scale.data_ptr<float>(), per_column,
                   bias ? bias->data_ptr<float>() : nullptr, out.data_ptr<float>());
#if defined(KVSERVE_AMX)
  else if (M > 0 && M <= 2 * kAmxRows && on_amx(at::kBFloat16, N, K))
    run_fp8_amx_decode(rows.data_ptr<c10::BFloat16>(), M, K, w, N, scale.data_ptr<float>(), per_column,
                       bias ? bias->data_ptr<c10::BFloat16>() : nullptr, out.data_ptr<c10::BFloat16>());
  else if (M > 0 && on_amx(at::kBFloat16, N, K))
    run_fp8_amx(rows.data_ptr<c10::BFloat16>(), M, K, w, N, scale.data_ptr<float>(), per_column,
                bias ? bias->data_ptr<c10::BFloat16>() : nullptr, out.data_ptr<c10::BFloat16>());
#endif
  else if (M > 0)
    run_fp8<c10::BFloat16>(rows.data_ptr<c10::BFloat16>(), M, K, w, N, scale.data_ptr<float>(), per_column,
                           bias ? bias->data_ptr<c10::BFloat16>() : nullptr, out.data_ptr<c10::BFloat16>());
#endif
  return out;
}

void check_x(const at::Tensor& x, const at::Tensor& packed) {
  check_weight(packed);
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == packed.scalar_type() && x.size(-1) == packed.size(1),
              "x must be a CPU tensor [..., ", packed.size(1), "] of the weight's dtype ", packed.scalar_type());
}

at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias) {
  check_x(x, packed);
  const int64_t N = packed.size(0), K = packed.size(1);
  TORCH_CHECK(!bias.has_value() || (bias->dim() == 1 && bias->size(0) == N && bias->scalar_type() == x.scalar_type() &&
                                    bias->is_contiguous()),
              "bias must be a contiguous [", N, "] tensor of x's dtype");
  const auto [rows, out] = rows_and_output(x, K, N);
#if defined(__AVX512F__)
  const int64_t M = rows.size(0);
  if (M > 0) {
    if (x.scalar_type() == at::kFloat)
      run<float>(rows.data_ptr<float>(), M, K, packed.data_ptr<float>(), N,
                 bias ? bias->data_ptr<float>() : nullptr, out.data_ptr<float>());
#if defined(KVSERVE_AMX)
    else if (on_amx(at::kBFloat16, N, K))
      run_amx(rows.data_ptr<c10::BFloat16>(), M, K, packed.data_ptr<c10::BFloat16>(), N,
              bias ? bias->data_ptr<c10::BFloat16>() : nullptr, out.data_ptr<c10::BFloat16>());
#endif
    else
      run<c10::BFloat16>(rows.data_ptr<c10::BFloat16>(), M, K, packed.data_ptr<c10::BFloat16>(), N,
                         bias ? bias->data_ptr<c10::BFloat16>() : nullptr, out.data_ptr<c10::BFloat16>());
  }
#elif defined(KVSERVE_AVX2)
  const int64_t M = rows.size(0);
  if (M > 0) {
    const at::Tensor x32 = rows.to(at::kFloat);
    // The bias as float32 and zero-padded to whole panels, so each tile adds two full vectors.
    at::Tensor bias32 = at::zeros({(N + kAvx2Panel - 1) / kAvx2Panel * kAvx2Panel}, x32.options());
    if (bias) bias32.narrow(0, 0, N).copy_(*bias);
    if (x.scalar_type() == at::kFloat)
      run_avx2<float>(x32.data_ptr<float>(), M, K, packed.data_ptr<float>(), N, bias32.data_ptr<float>(),
                      out.data_ptr<float>());
    else
      run_avx2<c10::BFloat16>(x32.data_ptr<float>(), M, K, packed.data_ptr<c10::BFloat16>(), N,
                              bias32.data_ptr<float>(), out.data_ptr<c10::BFloat16>());
  }
#endif
  return out;
}

// linear(x, packed) widened to float32: the LM head's logits. Where bfloat16 runs on the AVX-512 panels
// the tiles write the rounded sums as float32 themselves, sparing the logits a second pass (and whole
// cache lines: a panel's 48 float32 are three); elsewhere the product, then the widening.
at::Tensor logits(const at::Tensor& x, const at::Tensor& packed) {
  check_x(x, packed);
#if defined(__AVX512F__) && defined(__AVX512BF16__)
  const int64_t N = packed.size(0), K = packed.size(1);
  if (x.scalar_type() == at::kBFloat16 && !on_amx(at::kBFloat16, N, K)) {
    const auto [rows, out] = rows_and_output(x, K, N, at::kFloat);
    if (rows.size(0) > 0)
      run<c10::BFloat16, float>(rows.data_ptr<c10::BFloat16>(), rows.size(0), K, packed.data_ptr<c10::BFloat16>(),
                                N, nullptr, out.data_ptr<float>());
    return out;
  }
#endif
  return packed_linear(x, packed, c10::nullopt).to(at::kFloat);
}

template <typename T>
void gated_rows(const at::Tensor& rows, const at::Tensor& gate, const at::Tensor& up, at::Tensor& out) {
  const int64_t M = rows.size(0), N = gate.size(0), K = gate.size(1);
  T* dst = out.data_ptr<T>();
#if defined(__AVX512F__)
  // Prefill sizes keep the two products: there the epilogue's pass no longer hides in the weight stream
  // (bfloat16 at 256 rows ran 0.97x of two products and the layer op in benchmarks/gated_mlp.py --kernel).
  if (!on_amx(gate.scalar_type(), N, K) && M <= kDecodeRows) {
    run_gated<T>(rows.data_ptr<T>(), M, K, gate.data_ptr<T>(), up.data_ptr<T>(), N, dst);
    return;
  }
#endif
  const at::Tensor gate_out = packed_linear(rows, gate, c10::nullopt);
  const at::Tensor up_out = packed_linear(rows, up, c10::nullopt);
  const T* gs = gate_out.data_ptr<T>();
  const T* us = up_out.data_ptr<T>();
  at::parallel_for(0, M, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) kvserve_vec::silu_and_mul_row(gs + i * N, us + i * N, N, dst + i * N);
  });
}

// silu(x G^T) * (x U^T) for gate and up packed by pack() (one shape and dtype, no bias): one pass
// over both weights where the product runs on the AVX-512 panels at decode sizes (up to kDecodeRows
// rows); elsewhere (more rows, AMX tiles, AVX2) the two products, then silu-and-mul row by row.
// Either way the values of two linear() ops and the layer op's silu_and_mul.
at::Tensor gated_linear(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up) {
  check_weight(gate);
  TORCH_CHECK(up.sizes() == gate.sizes() && up.scalar_type() == gate.scalar_type() && up.is_contiguous(),
              "gate and up must be packed weights of one shape and dtype, got ", gate.sizes(), " ",
              gate.scalar_type(), " and ", up.sizes(), " ", up.scalar_type());
  const int64_t N = gate.size(0), K = gate.size(1);
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == gate.scalar_type() && x.size(-1) == K,
              "x must be a CPU tensor [..., ", K, "] of the weights' dtype ", gate.scalar_type());
  auto [rows, out] = rows_and_output(x, K, N);
  if (rows.size(0) == 0) return out;
  if (x.scalar_type() == at::kFloat)
    gated_rows<float>(rows, gate, up, out);
  else
    gated_rows<c10::BFloat16>(rows, gate, up, out);
  return out;
}

}  // namespace

TORCH_LIBRARY(kvserve_cpu_linear, m) {
  m.def("pack(Tensor weight) -> Tensor");
  m.def("linear(Tensor x, Tensor packed, Tensor? bias) -> Tensor");
  m.def("gated_linear(Tensor x, Tensor gate, Tensor up) -> Tensor");
  m.def("logits(Tensor x, Tensor packed) -> Tensor");
  m.def("isa() -> str", &isa);
  m.def("supports(ScalarType dtype) -> bool", &supports);
  m.def("amx() -> bool", &amx);
  m.def("on_amx(Tensor weight) -> bool", &weight_on_amx);
  m.def("pack_fp8(Tensor weight) -> Tensor");
  m.def("fp8_linear(Tensor x, Tensor packed, Tensor scale, Tensor? bias) -> Tensor");
  m.def("fp8_supports(ScalarType dtype) -> bool", &fp8_supports);
}

TORCH_LIBRARY_IMPL(kvserve_cpu_linear, CPU, m) {
  m.impl("pack", &pack);
  m.impl("linear", &packed_linear);
  m.impl("gated_linear", &gated_linear);
  m.impl("logits", &logits);
  m.impl("pack_fp8", &pack_fp8);
  m.impl("fp8_linear", &fp8_linear);
}
