// Multi-LoRA shrink (h = x A) and expand (y += h B) for the CPU platform: SGMV and BGMV.
//
// kvserve_cpu_lora::paths() -> str[]    the paths this build runs, best first: "avx512-bf16", "avx512",
//                                       "portable"
// kvserve_cpu_lora::shrink(x, lora_a, rows, items, path) -> h
// kvserve_cpu_lora::expand(y!, h, lora_b[], rows, items, path)
// kvserve_cpu_lora::add_lora_linear(y!, x, lora_a, lora_b[], rows, items, path, prefetch[])
//                                       shrink then expand in one pass, then the slots' parts of the
//                                       `prefetch` tensors (the next layer's A and B) brought into cache
//
// The work comes planned by the caller, once per step: `rows` (int64) lists token indices and `items`
// (int64 [n, 3]: begin, end, slot) says that rows[begin:end] use adapter `slot`. A prefill segment is
// an item of consecutive rows (SGMV); the decode rows of one adapter, wherever they sit in the batch,
// are one item (BGMV), so an adapter's A or B is streamed from memory once per step for all its rows
// rather than once per row. Base tokens are in no item: never read or written.
//
// An item is cut into register tiles of 8, 4, 2 and 1 rows; a tile multiplies its rows against up to
// 48 columns (three vectors of 16 float32) of the slot's matrix, k by k, accumulating in float32,
// and writes h (shrink) or adds into y (expand), rounding to the storage dtype once. shrink and
// expand share the tiles out column block by column block; add_lora_linear, what a layer runs, shares
// out whole row tiles, each computing its h into a per-thread buffer and expanding it at once (see
// run_fused): one thread-pool wake per layer instead of two, bit for bit the two calls' result.
//
// Long prefill segments stay here too, not on ATen's matmul: at LoRA's shapes (a rank of 16-64 on
// one side) ATen's was slower in all but one case measured on this project's 2-core AVX512-BF16 CPU
// (shrink + expand of SmolLM2's qkv, gate/up and down, one adapter, bfloat16 and float32, a loaded
// machine: 2.4-5.6x this kernel's time at 32 tokens, 1.1-100x at 256, 1.6-8.4x at 2048 but for
// bfloat16 qkv at 2048 tokens, 0.92x).
//
// Paths (a build has those its -march=native CPU can run; the caller picks one, so each is tested and
// measured on a CPU that has them all):
//   avx512-bf16  bfloat16 pairs of k multiplied with vdpbf16ps (AVX512-BF16): the matrix's rows k and
//                k+1 interleaved in registers (one vpermw per 16 columns, shared by the tile's rows),
//                float32 as in avx512;
//   avx512       float32 FMA, bfloat16 widened exactly to float32 as it is read and rounded to nearest
//                even in integer arithmetic: the path of an AVX-512 CPU without BF16;
//   portable     plain C++ loops (what the compiler makes of them), for CPUs without AVX-512.
// No AMX path: at LoRA ranks (16-64) a tile's k or columns would be mostly padding.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/StringUtil.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define KVSERVE_LORA_AVX512 1
#endif

namespace {

constexpr int kRowTile = 8;            // rows of the largest register tile
constexpr int64_t kBlock = 48;         // columns per tile: 3 vectors of 16 float32
// Below this many multiply-adds one thread runs the call: waking the pool costs more. In a step the
// adapters' A and B come from DRAM (read once a step, evicted by the base weights in between), so a
// call waits on memory far longer than its multiply-adds suggest, and two threads wait in parallel:
// at 1 << 20 every decode call of SmolLM2 at batch 32 ran on one thread, and 4 adapters decoded at
// 0.70-0.73x of the base model; at 1 << 16, 0.78-0.85x (1 << 13: 0.77-0.79x).
constexpr int64_t kParallelMacs = 1 << 16;

enum class Path { kPortable, kAvx512, kAvx512Bf16 };

std::vector<std::string> paths() {
  std::vector<std::string> names;
#if defined(KVSERVE_LORA_AVX512) && defined(__AVX512BF16__)
  names.push_back("avx512-bf16");
#endif
#if defined(KVSERVE_LORA_AVX512)
  names.push_back("avx512");
#endif
  names.push_back("portable");
  return names;
}

Path parse_path(const std::string& name) {
  const std::vector<std::string> built = paths();
  TORCH_CHECK(std::find(built.begin(), built.end(), name) != built.end(), "LoRA path '", name,
              "' is not in this build (it has ", c10::Join(", ", built), ")");
  return name == "avx512-bf16" ? Path::kAvx512Bf16 : name == "avx512" ? Path::kAvx512 : Path::kPortable;
}

// One operand pair of a tile: out[rows, c0:c0+nc] (+)= in[rows, 0:K] @ w[0:K, c0:c0+nc].
template <typename T>
struct Tile {
  const T* in[kRowTile];
  T* out[kRowTile];  // already offset by c0
  int rows;
  const T* w;  // already offset by c0; row k at w + k * ldw
  int64_t ldw;
  int64_t K;
  int64_t nc;
};

template <typename T, bool ADD>
void tile_portable(const Tile<T>& t) {
  float acc[kRowTile][kBlock] = {};
  float wk[kBlock];  // row k of the matrix in float32, converted once for all the tile's rows
  for (int64_t k = 0; k < t.K; ++k) {
    for (int64_t c = 0; c < t.nc; ++c) wk[c] = static_cast<float>(t.w[k * t.ldw + c]);
    for (int i = 0; i < t.rows; ++i) {
      const float xi = static_cast<float>(t.in[i][k]);
      for (int64_t c = 0; c < t.nc; ++c) acc[i][c] += xi * wk[c];
    }
  }
  for (int i = 0; i < t.rows; ++i)
    for (int64_t c = 0; c < t.nc; ++c)
      t.out[i][c] = static_cast<T>(ADD ? static_cast<float>(t.out[i][c]) + acc[i][c] : acc[i][c]);
}

#if defined(KVSERVE_LORA_AVX512)

inline __mmask16 lanes(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF) : count <= 0 ? 0 : static_cast<__mmask16>((1u << count) - 1);
}

inline __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load(const c10::BFloat16* p, __mmask16 m) {  // bfloat16 is float32's top half: exact
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

template <bool DPBF16>
inline void store(float* p, __mmask16 m, __m512 v) {
  _mm512_mask_storeu_ps(p, m, v);
}
template <bool DPBF16>
inline void store(c10::BFloat16* p, __mmask16 m, __m512 v) {
  __m256i bits;
#if defined(__AVX512BF16__)
  if constexpr (DPBF16) bits = (__m256i)_mm512_cvtneps_pbh(v);
#endif
  if constexpr (!DPBF16) {  // round to nearest even by hand, NaN kept a (quiet) NaN
    const __m512i u = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
    bits = _mm512_cvtepi32_epi16(r);
  }
  _mm256_mask_storeu_epi16(p, m, bits);
}

// The tile's accumulators to its outputs: written (shrink) or added to what is there (expand).
template <typename T, int ROWS, int NV, bool ADD, bool DPBF16>
inline void finish(const Tile<T>& t, __m512 (&acc)[ROWS][NV]) {
  #pragma GCC unroll 3
  for (int b = 0; b < NV; ++b) {
    const __mmask16 m = lanes(t.nc - 16 * b);
    #pragma GCC unroll 8
    for (int i = 0; i < ROWS; ++i) {
      T* o = t.out[i] + 16 * b;
      store<DPBF16>(o, m, ADD ? _mm512_add_ps(load(o, m), acc[i][b]) : acc[i][b]);
    }
  }
}

// float32 FMA, k by k; bfloat16 widened as it is read. Every loop over rows or vectors is unrolled:
// an accumulator indexed at run time would keep the whole array in memory.
template <typename T, int ROWS, int NV, bool ADD>
void tile_avx512(const Tile<T>& t) {
  __mmask16 m[NV];
  __m512 acc[ROWS][NV];
  #pragma GCC unroll 3
  for (int b = 0; b < NV; ++b) {
    m[b] = lanes(t.nc - 16 * b);
    #pragma GCC unroll 8
    for (int i = 0; i < ROWS; ++i) acc[i][b] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < t.K; ++k) {
    const T* wk = t.w + k * t.ldw;
    __m512 w[NV];
    #pragma GCC unroll 3
    for (int b = 0; b < NV; ++b) w[b] = load(wk + 16 * b, m[b]);
    #pragma GCC unroll 8
    for (int i = 0; i < ROWS; ++i) {
      const __m512 xi = _mm512_set1_ps(static_cast<float>(t.in[i][k]));
      #pragma GCC unroll 3
      for (int b = 0; b < NV; ++b) acc[i][b] = _mm512_fmadd_ps(xi, w[b], acc[i][b]);
    }
  }
  finish<T, ROWS, NV, ADD, false>(t, acc);
}

#if defined(__AVX512BF16__)
// bfloat16 pairs of k with vdpbf16ps: rows k and k+1 of the matrix (16 columns each) interleaved
// into one vector of pairs, the operand layout of the instruction; each input row's pair of k
// broadcast as one 32-bit lane. An odd K's last k pairs with zeros.
template <int ROWS, int NV, bool ADD>
void tile_avx512_bf16(const Tile<c10::BFloat16>& t) {
  alignas(64) static const uint16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                       8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i interleave = _mm512_load_si512(kInterleave);
  __mmask16 m[NV];
  __m512 acc[ROWS][NV];
  #pragma GCC unroll 3
  for (int b = 0; b < NV; ++b) {
    m[b] = lanes(t.nc - 16 * b);
    #pragma GCC unroll 8
    for (int i = 0; i < ROWS; ++i) acc[i][b] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < t.K; k += 2) {
    const bool pair = k + 1 < t.K;
    const c10::BFloat16* wk = t.w + k * t.ldw;
    __m512bh w[NV];
    #pragma GCC unroll 3
    for (int b = 0; b < NV; ++b) {
      const __m256i lo = _mm256_maskz_loadu_epi16(m[b], wk + 16 * b);
      const __m256i hi = _mm256_maskz_loadu_epi16(pair ? m[b] : 0, wk + t.ldw + 16 * b);
      w[b] = (__m512bh)_mm512_permutexvar_epi16(interleave, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
    }
    #pragma GCC unroll 8
    for (int i = 0; i < ROWS; ++i) {
      uint32_t bits = 0;  // the pair (x[k], x[k+1]) as one lane; the last k of an odd K with zero
      if (pair)
        std::memcpy(&bits, t.in[i] + k, 4);
      else
        std::memcpy(&bits, t.in[i] + k, 2);
      const __m512bh xi = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(bits));
      #pragma GCC unroll 3
      for (int b = 0; b < NV; ++b) acc[i][b] = _mm512_dpbf16_ps(acc[i][b], xi, w[b]);
    }
  }
  finish<c10::BFloat16, ROWS, NV, ADD, true>(t, acc);
}
#endif

template <typename T, int ROWS, bool ADD>
void tile_rows(const Tile<T>& t, Path path) {
  const int nv = static_cast<int>((t.nc + 15) / 16);
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (path == Path::kAvx512Bf16) {
      if (nv == 1) return tile_avx512_bf16<ROWS, 1, ADD>(t);
      if (nv == 2) return tile_avx512_bf16<ROWS, 2, ADD>(t);
      return tile_avx512_bf16<ROWS, 3, ADD>(t);
    }
  }
#endif
  if (nv == 1) return tile_avx512<T, ROWS, 1, ADD>(t);
  if (nv == 2) return tile_avx512<T, ROWS, 2, ADD>(t);
  tile_avx512<T, ROWS, 3, ADD>(t);
}

#endif  // KVSERVE_LORA_AVX512

template <typename T, bool ADD>
void run_tile(const Tile<T>& t, Path path) {
#if defined(KVSERVE_LORA_AVX512)
  if (path != Path::kPortable) {
    switch (t.rows) {
      case 8: return tile_rows<T, 8, ADD>(t, path);
      case 4: return tile_rows<T, 4, ADD>(t, path);
      case 2: return tile_rows<T, 2, ADD>(t, path);
      default: return tile_rows<T, 1, ADD>(t, path);
    }
  }
#endif
  tile_portable<T, ADD>(t);
}

// One output slice of the product: rows of `in` (from in_offset, K wide) times the slot's matrix
// (w + slot * w_slot, K x n, row stride ldw) into rows of `out` (from out_offset, n wide).
template <typename T>
struct Slice {
  const T* in;
  int64_t ldin, in_offset;
  const T* w;
  int64_t w_slot, ldw, K, n;
  T* out;
  int64_t ldout, out_offset;
};

// Rows `in_rows` / `out_rows` (count of them, row indices into the slice's in and out) times the
// slot's matrix, columns [c0, c0 + kBlock) of the slice.
template <typename T, bool ADD>
void slice_tile(const Slice<T>& s, int64_t slot, int64_t c0, const int64_t* in_rows, const int64_t* out_rows,
                int count, Path path) {
  Tile<T> t;
  t.rows = count;
  t.w = s.w + slot * s.w_slot + c0;
  t.ldw = s.ldw;
  t.K = s.K;
  t.nc = std::min(kBlock, s.n - c0);
  for (int i = 0; i < count; ++i) {
    t.in[i] = s.in + in_rows[i] * s.ldin + s.in_offset;
    t.out[i] = s.out + out_rows[i] * s.ldout + s.out_offset + c0;
  }
  run_tile<T, ADD>(t, path);
}

// The row tiles of every item: `count` (8, 4, 2 or 1) rows from rows[first] use `slot`.
struct RowTile {
  int64_t first, slot;
  int count;
};

std::vector<RowTile> row_tiles(const int64_t* items, int64_t n_items) {
  std::vector<RowTile> tiles;
  for (int64_t it = 0; it < n_items; ++it) {
    const int64_t begin = items[3 * it], end = items[3 * it + 1], slot = items[3 * it + 2];
    for (int64_t first = begin; first < end;) {
      int count = kRowTile;
      while (count > end - first) count /= 2;
      tiles.push_back({first, slot, count});
      first += count;
    }
  }
  return tiles;
}

int64_t grain_for(int64_t macs, int64_t jobs) { return macs < kParallelMacs ? std::max<int64_t>(1, jobs) : 1; }

// Every item, tile by tile (a row tile times a column block of a slice), in parallel over tiles when
// the work is large enough.
template <typename T, bool ADD>
void run_items(const std::vector<Slice<T>>& slices, const int64_t* rows, const int64_t* items, int64_t n_items,
               Path path) {
  struct Job {
    RowTile tile;
    size_t slice;
    int64_t c0;
  };
  std::vector<Job> jobs;
  int64_t macs = 0;
  for (const RowTile& tile : row_tiles(items, n_items)) {
    for (size_t s = 0; s < slices.size(); ++s) {
      for (int64_t c0 = 0; c0 < slices[s].n; c0 += kBlock) jobs.push_back({tile, s, c0});
      macs += tile.count * slices[s].K * slices[s].n;
    }
  }
  at::parallel_for(0, static_cast<int64_t>(jobs.size()), grain_for(macs, jobs.size()), [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      const Job& job = jobs[j];
      const int64_t* r = rows + job.tile.first;
      slice_tile<T, ADD>(slices[job.slice], job.tile.slot, job.c0, r, r, job.tile.count, path);
    }
  });
}

// Shrink and expand of one layer in one pass: a job is one row tile, whose h (rounded to the storage
// dtype, as shrink returns it) waits in a per-thread buffer between the two. In a decode step this
// wakes the thread pool once per layer rather than twice, and h never leaves L1; the row tiles of
// different adapters (a step's usual case) are what the threads share out.
//
// Then each thread prefetches the slots of its tiles in `prefetch` (the next LoRA layer's matrices, as
// (first byte, bytes per slot)): in a step the adapters' A and B come from DRAM, a tile reads them in
// runs too short for the hardware prefetcher, and the next layer's base GEMM is compute-bound at batch
// sizes where LoRA matters, leaving the memory bus free to bring them in meanwhile. The next call has
// the same tiles, so a thread's prefetches mostly land in the cache of the core that reads them.
template <typename T>
void run_fused(const Slice<T>& a, const std::vector<Slice<T>>& b, const int64_t* rows, const int64_t* items,
               int64_t n_items, const std::vector<std::pair<const char*, int64_t>>& prefetch, Path path) {
  const std::vector<RowTile> tiles = row_tiles(items, n_items);
  int64_t macs = 0;
  for (const RowTile& tile : tiles) {
    macs += tile.count * a.K * a.n;
    for (const Slice<T>& s : b) macs += tile.count * s.K * s.n;
  }
  static const int64_t kLocal[kRowTile] = {0, 1, 2, 3, 4, 5, 6, 7};
  const int64_t n_tiles = static_cast<int64_t>(tiles.size());
  at::parallel_for(0, n_tiles, grain_for(macs, n_tiles), [&](int64_t j0, int64_t j1) {
    std::vector<T> h(static_cast<size_t>(kRowTile * a.n));
    Slice<T> shrink = a;
    shrink.out = h.data();
    shrink.ldout = a.n;
    std::vector<Slice<T>> expand = b;
    for (Slice<T>& s : expand) {
      s.in = h.data();
      s.ldin = a.n;
    }
    for (int64_t j = j0; j < j1; ++j) {
      const RowTile& tile = tiles[j];
      const int64_t* r = rows + tile.first;
      for (int64_t c0 = 0; c0 < a.n; c0 += kBlock)
        slice_tile<T, false>(shrink, tile.slot, c0, r, kLocal, tile.count, path);
      for (const Slice<T>& s : expand)
        for (int64_t c0 = 0; c0 < s.n; c0 += kBlock) slice_tile<T, true>(s, tile.slot, c0, kLocal, r, tile.count, path);
    }
    for (int64_t j = j0; j < j1; ++j) {
      if (j > j0 && tiles[j].slot == tiles[j - 1].slot) continue;
      for (const auto& [first, slot_bytes] : prefetch) {
        const char* p = first + tiles[j].slot * slot_bytes;
        for (int64_t offset = 0; offset < slot_bytes; offset += 64) __builtin_prefetch(p + offset, 0, 2);
      }
    }
  });
}

void check_plan(const at::Tensor& rows, const at::Tensor& items, int64_t num_tokens, int64_t slots) {
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong && rows.is_contiguous() && rows.device().is_cpu(),
              "rows must be a contiguous int64 CPU vector");
  TORCH_CHECK(items.dim() == 2 && items.size(1) == 3 && items.scalar_type() == at::kLong && items.is_contiguous() &&
                  items.device().is_cpu(),
              "items must be a contiguous int64 CPU tensor [n, 3]");
  const int64_t* r = rows.data_ptr<int64_t>();
  const int64_t* it = items.data_ptr<int64_t>();
  for (int64_t i = 0; i < rows.numel(); ++i)
    TORCH_CHECK(r[i] >= 0 && r[i] < num_tokens, "row ", r[i], " is outside the ", num_tokens, " tokens");
  for (int64_t i = 0; i < items.size(0); ++i)
    TORCH_CHECK(0 <= it[3 * i] && it[3 * i] <= it[3 * i + 1] && it[3 * i + 1] <= rows.numel() && 0 <= it[3 * i + 2] &&
                    it[3 * i + 2] < slots,
                "item ", i, " (", it[3 * i], ", ", it[3 * i + 1], ", slot ", it[3 * i + 2], ") is out of range");
}

void check_matrix(const at::Tensor& m, const at::Tensor& x, const char* what) {
  TORCH_CHECK(m.dim() == 3 && m.is_contiguous() && m.device().is_cpu(), what, " must be a contiguous 3-D CPU tensor");
  TORCH_CHECK(m.scalar_type() == x.scalar_type(), what, " is ", m.scalar_type(), " but the input is ", x.scalar_type());
}

void check_rows(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.dim() == 2 && t.stride(1) == 1 && t.device().is_cpu(), what,
              " must be a 2-D CPU tensor with contiguous rows");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, what,
              ": float32 and bfloat16 only, got ", t.scalar_type());
}

// fn(T{}) for the dtype's T: float32 or bfloat16 (check_rows refused the others).
template <typename Fn>
void dispatch(at::ScalarType dtype, const Fn& fn) {
  if (dtype == at::kFloat)
    fn(float{});
  else
    fn(c10::BFloat16{});
}

void check_shrink(const at::Tensor& x, const at::Tensor& lora_a) {
  check_rows(x, "x");
  check_matrix(lora_a, x, "lora_a");
  TORCH_CHECK(lora_a.size(1) == x.size(1), "lora_a is ", lora_a.sizes(), " for x of ", x.size(1), " features");
}

// Checks expand's operands for an h of h_width columns; returns the slices' common rank.
int64_t check_expand(const at::Tensor& y, const std::vector<at::Tensor>& lora_b, int64_t h_width) {
  check_rows(y, "y");
  TORCH_CHECK(!lora_b.empty(), "lora_b: at least one slice");
  const int64_t rank = lora_b[0].size(1);
  int64_t width = 0;
  for (const at::Tensor& b : lora_b) {
    check_matrix(b, y, "lora_b");
    TORCH_CHECK(b.size(1) == rank && b.size(0) == lora_b[0].size(0), "every slice's lora_b must be [slots, ",
                rank, ", out]; got ", b.sizes());
    width += b.size(2);
  }
  TORCH_CHECK(h_width == static_cast<int64_t>(lora_b.size()) * rank, "h has ", h_width, " columns for ",
              lora_b.size(), " slices of rank ", rank);
  TORCH_CHECK(y.size(1) == width, "y has ", y.size(1), " columns, the slices ", width);
  return rank;
}

// x's rows times the slot's lora_a, into h (K = x's features, n = lora_a's columns).
template <typename T>
Slice<T> shrink_slice(const at::Tensor& x, const at::Tensor& lora_a, T* h) {
  const int64_t K = x.size(1), R = lora_a.size(2);
  return {x.data_ptr<T>(), x.stride(0), 0, lora_a.data_ptr<T>(), K * R, R, K, R, h, R, 0};
}

// h's columns s*rank : (s+1)*rank times slice s's lora_b, added into y's columns of that slice.
template <typename T>
std::vector<Slice<T>> expand_slices(const at::Tensor& y, const T* h, int64_t ldh, const std::vector<at::Tensor>& lora_b,
                                    int64_t rank) {
  std::vector<Slice<T>> slices;
  int64_t offset = 0;
  for (size_t s = 0; s < lora_b.size(); ++s) {
    const int64_t out = lora_b[s].size(2);
    slices.push_back({h, ldh, static_cast<int64_t>(s) * rank, lora_b[s].data_ptr<T>(), rank * out, out, rank, out,
                      y.data_ptr<T>(), y.stride(0), offset});
    offset += out;
  }
  return slices;
}

at::Tensor shrink(const at::Tensor& x, const at::Tensor& lora_a, const at::Tensor& rows, const at::Tensor& items,
                  const std::string& path_name) {
  check_shrink(x, lora_a);
  check_plan(rows, items, x.size(0), lora_a.size(0));
  const Path path = parse_path(path_name);
  at::Tensor h = at::empty({x.size(0), lora_a.size(2)}, x.options());
  dispatch(x.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    run_items<scalar_t, false>({shrink_slice<scalar_t>(x, lora_a, h.data_ptr<scalar_t>())}, rows.data_ptr<int64_t>(),
                               items.data_ptr<int64_t>(), items.size(0), path);
  });
  return h;
}

void expand(const at::Tensor& y, const at::Tensor& h, const std::vector<at::Tensor>& lora_b, const at::Tensor& rows,
            const at::Tensor& items, const std::string& path_name) {
  check_rows(h, "h");
  const int64_t rank = check_expand(y, lora_b, h.size(1));
  TORCH_CHECK(h.scalar_type() == y.scalar_type(), "h is ", h.scalar_type(), " but y is ", y.scalar_type());
  TORCH_CHECK(h.size(0) == y.size(0), "h has ", h.size(0), " rows, y ", y.size(0));
  check_plan(rows, items, y.size(0), lora_b[0].size(0));
  const Path path = parse_path(path_name);
  dispatch(y.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    run_items<scalar_t, true>(expand_slices<scalar_t>(y, h.data_ptr<scalar_t>(), h.stride(0), lora_b, rank),
                              rows.data_ptr<int64_t>(), items.data_ptr<int64_t>(), items.size(0), path);
  });
}

void add_lora_linear(const at::Tensor& y, const at::Tensor& x, const at::Tensor& lora_a,
                     const std::vector<at::Tensor>& lora_b, const at::Tensor& rows, const at::Tensor& items,
                     const std::string& path_name, const std::vector<at::Tensor>& prefetch) {
  check_shrink(x, lora_a);
  const int64_t rank = check_expand(y, lora_b, lora_a.size(2));
  TORCH_CHECK(x.scalar_type() == y.scalar_type(), "x is ", x.scalar_type(), " but y is ", y.scalar_type());
  TORCH_CHECK(x.size(0) == y.size(0), "x has ", x.size(0), " rows, y ", y.size(0));
  check_plan(rows, items, y.size(0), std::min(lora_a.size(0), lora_b[0].size(0)));
  const Path path = parse_path(path_name);
  std::vector<std::pair<const char*, int64_t>> ahead;
  for (const at::Tensor& m : prefetch) {
    TORCH_CHECK(m.is_contiguous() && m.device().is_cpu() && m.dim() >= 1 && m.size(0) == lora_a.size(0),
                "prefetch: contiguous CPU tensors of ", lora_a.size(0), " slots; got ", m.sizes());
    ahead.emplace_back(static_cast<const char*>(m.data_ptr()), m.numel() / m.size(0) * m.element_size());
  }
  dispatch(y.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    // The h pointers are placeholders: each thread points the slices at its own buffer.
    run_fused<scalar_t>(shrink_slice<scalar_t>(x, lora_a, nullptr),
                        expand_slices<scalar_t>(y, nullptr, 0, lora_b, rank), rows.data_ptr<int64_t>(),
                        items.data_ptr<int64_t>(), items.size(0), ahead, path);
  });
}

}  // namespace

TORCH_LIBRARY(kvserve_cpu_lora, m) {
  m.def("paths() -> str[]", &paths);
  m.def("shrink(Tensor x, Tensor lora_a, Tensor rows, Tensor items, str path) -> Tensor");
  m.def("expand(Tensor(a!) y, Tensor h, Tensor[] lora_b, Tensor rows, Tensor items, str path) -> ()");
  m.def(
      "add_lora_linear(Tensor(a!) y, Tensor x, Tensor lora_a, Tensor[] lora_b, Tensor rows, Tensor items, str path, "
      "Tensor[] prefetch) -> ()");
}

TORCH_LIBRARY_IMPL(kvserve_cpu_lora, CPU, m) {
  m.impl("shrink", &shrink);
  m.impl("expand", &expand);
  m.impl("add_lora_linear", &add_lora_linear);
}
