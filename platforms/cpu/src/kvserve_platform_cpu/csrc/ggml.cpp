// GGUF weights kept in llama.cpp's GGML blocks, multiplied by rows of activations quantized as llama.cpp
// quantizes them: per 32-weight block to int8 with one float scale (its Q8_0/Q8_1), so a block's product is
// an integer dot of 32 bytes scaled once. Types: Q8_0 and Q4_1 (the embedded SmolLM2's).
//
// Two paths, chosen per call (tests run both): AVX-512 VNNI (`vpdpbusd` on 512-bit vectors, two blocks a
// step: u8 x s8 sums four products per int32 lane) where the build has it, and a portable scalar loop everywhere. Q8_0 weights
// are signed: as llama.cpp does, the weight's absolute value is the unsigned operand and its sign moves onto
// the activation, which leaves every product unchanged (|-128| wraps to the unsigned 128).
//
// For rows of decode steps (a few rows): every output feature's blocks are read once per row from cache, so
// the weight streams from memory once per call. Many rows go to the caller's dequantize-and-GEMM path.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#include <immintrin.h>
#define KVSERVE_VNNI 1
#endif

namespace {

constexpr int64_t kBlock = 32;
// GGML type ids (ggml.h's enum ggml_type).
constexpr int64_t kQ4_1 = 3;
constexpr int64_t kQ8_0 = 8;

// One block of a quantized activation row.
struct ActBlock {
  float d;       // scale: x ~= d * q
  int32_t sum;   // sum of q (Q4_1's offset term multiplies it)
  int8_t q[kBlock];
};

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return c10::detail::fp16_ieee_to_fp32_value(bits);
}

void quantize_row(const float* x, int64_t blocks, ActBlock* out) {
  for (int64_t b = 0; b < blocks; ++b) {
    const float* v = x + b * kBlock;
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
    out[b].sum = sum;
  }
}

int64_t type_size(int64_t type) { return type == kQ8_0 ? 34 : 20; }

// Portable: one output feature against one activation row.
float dot_portable(int64_t type, const uint8_t* w, const ActBlock* a, int64_t blocks) {
  float acc = 0.f;
  for (int64_t b = 0; b < blocks; ++b, ++a) {
    int32_t isum = 0;
    if (type == kQ8_0) {
      const int8_t* q = reinterpret_cast<const int8_t*>(w + 2);
      for (int i = 0; i < kBlock; ++i) isum += q[i] * a->q[i];
      acc += half_at(w) * a->d * static_cast<float>(isum);
    } else {
      const uint8_t* qs = w + 4;
      for (int i = 0; i < kBlock / 2; ++i) isum += (qs[i] & 0x0F) * a->q[i] + (qs[i] >> 4) * a->q[i + 16];
      acc += half_at(w) * a->d * static_cast<float>(isum) + half_at(w + 2) * a->d * static_cast<float>(a->sum);
    }
    w += type_size(type);
  }
  return acc;
}

#if defined(KVSERVE_VNNI)
inline float half_fast(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);
}

// The 32 quants of block `w` as bytes in element order: Q8_0's signed ones, Q4_1's nibbles (low, then high).
inline __m256i block_quants(int64_t type, const uint8_t* w) {
  if (type == kQ8_0) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2));
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 4));
  const __m128i low = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), low), _mm_and_si128(qs, low));
}

// Two blocks a step on 512-bit vectors: lanes 0-7 hold block b's partial sums, 8-15 block b + 1's.
float dot_vnni(int64_t type, const uint8_t* w, const ActBlock* a, int64_t blocks) {
  const int64_t size = type_size(type);
  __m512 acc = _mm512_setzero_ps();
  float offset = 0.f;
  int64_t b = 0;
  for (; b + 1 < blocks; b += 2, w += 2 * size, a += 2) {
    const __m512i x = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[0].q))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[1].q)), 1);
    const __m512i q =
        _mm512_inserti64x4(_mm512_castsi256_si512(block_quants(type, w)), block_quants(type, w + size), 1);
    __m512i isum;
    if (type == kQ8_0) {  // |w| unsigned times x with w's sign
      const __m512i signed_x = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(q), _mm512_setzero_si512(), x);
      isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(q), signed_x);
    } else {
      isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, x);
      offset += (half_fast(w + 2) * a[0].d) * static_cast<float>(a[0].sum) +
                (half_fast(w + size + 2) * a[1].d) * static_cast<float>(a[1].sum);
    }
    const __m512 scale = _mm512_insertf32x8(_mm512_set1_ps(half_fast(w) * a[0].d),
                                            _mm256_set1_ps(half_fast(w + size) * a[1].d), 1);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc);
  }
  float total = _mm512_reduce_add_ps(acc) + offset;
  if (b < blocks) total += dot_portable(type, w, a, 1);
  return total;
}
#endif

bool has_vnni() {
#if defined(KVSERVE_VNNI)
  return true;
#else
  return false;
#endif
}

// x: float32 [M, K]; blocks: the weight's blocks, uint8 [N * K / 32 * type_size]; returns float32 [M, N].
at::Tensor ggml_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t type, int64_t out_features,
                       bool vnni) {
  TORCH_CHECK(type == kQ8_0 || type == kQ4_1, "ggml_linear: GGML type ", type, " is not Q8_0 (8) or Q4_1 (3)");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "ggml_linear: x must be float32 [M, K]");
  TORCH_CHECK(!vnni || has_vnni(), "ggml_linear: this build has no AVX-512 VNNI path");
  const at::Tensor rows = x.contiguous();
  const int64_t M = rows.size(0), K = rows.size(1), N = out_features;
  TORCH_CHECK(K % kBlock == 0, "ggml_linear: in_features ", K, " is not a multiple of 32");
  const int64_t nblocks = K / kBlock, row_bytes = nblocks * type_size(type);
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.is_contiguous() && blocks.numel() == N * row_bytes,
              "ggml_linear: blocks must be contiguous uint8 of ", N * row_bytes, " bytes");
  std::vector<ActBlock> act(M * nblocks);
  at::parallel_for(0, M, 1, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) quantize_row(rows.data_ptr<float>() + m * K, nblocks, &act[m * nblocks]);
  });
  at::Tensor out = at::empty({M, N}, rows.options());
  float* y = out.data_ptr<float>();
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      for (int64_t m = 0; m < M; ++m) {
        const ActBlock* a = &act[m * nblocks];
#if defined(KVSERVE_VNNI)
        y[m * N + n] = vnni ? dot_vnni(type, w + n * row_bytes, a, nblocks)
                            : dot_portable(type, w + n * row_bytes, a, nblocks);
#else
        y[m * N + n] = dot_portable(type, w + n * row_bytes, a, nblocks);
#endif
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(kvserve_cpu_ggml, m) {
  m.def("ggml_linear(Tensor x, Tensor blocks, int ggml_type, int out_features, bool vnni) -> Tensor");
  m.def("has_vnni() -> bool", &has_vnni);
}

TORCH_LIBRARY_IMPL(kvserve_cpu_ggml, CPU, m) { m.impl("ggml_linear", &ggml_linear); }
