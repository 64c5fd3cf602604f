// Paged attention on the CPU that reads K/V in place through block tables.
//
// kvserve_attention_cpu::paged_attention_out(out, query, kv_cache, block_tables, seq_lens, query_start_loc,
//                                  seq_ids, scale, sliding_window, soft_cap)
//
// Writes, for every sequence in seq_ids, the attention of its query rows
// query[query_start_loc[s] : query_start_loc[s+1]] (the last rows of the sequence: causal within
// the chunk, over all cached keys before it) into the same rows of out; other rows are untouched.
// kv_cache is (2, num_blocks, block_size, kv_heads, head_dim), K then V, read where it lies: no
// gather, no padding to the longest sequence. Scores, softmax and the output accumulate in float32
// for float32, bfloat16 and float16 inputs (two passes: the scores of a query row's visible keys are
// kept in a per-thread buffer). The query heads of one GQA group share each K/V row they read (it
// is converted to float32 once). Work is one (sequence, KV head, query rows) item, or, for a long
// decode, a slice of its keys merged afterwards (flash-decoding), so that two threads get even
// shares; items are handed out largest first from a shared counter on torch's intra-op pool.

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
#include <type_traits>
#include <vector>

#if defined(__F16C__) || defined(__AVX512F__)
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

// ---- exp and tanh that vectorize (std::exp and std::tanh are calls GCC does not vectorize) ----

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

// q · k of two bfloat16 rows of HEAD_DIM (a multiple of 32) in float32, without converting them:
// AVX512-BF16's vdpbf16ps multiplies bf16 pairs exactly in float32 and accumulates.
#if defined(__AVX512BF16__)
constexpr bool kHaveBf16Dot = true;
template <int HEAD_DIM>
inline float dot_bf16(const c10::BFloat16* q, const c10::BFloat16* k) {
  __m512 acc = _mm512_setzero_ps();
  for (int d = 0; d < HEAD_DIM; d += 32)
    acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(q + d), (__m512bh)_mm512_loadu_si512(k + d));
  return _mm512_reduce_add_ps(acc);
}
#else
constexpr bool kHaveBf16Dot = false;
template <int HEAD_DIM>
inline float dot_bf16(const c10::BFloat16*, const c10::BFloat16*) { return 0.f; }  // never called
#endif

// ---- one unit of work ----

struct Item {
  int64_t seq;      // row of block_tables / seq_lens
  int64_t kv_head;
  int64_t q_begin;  // query rows of the sequence, relative to its first new token
  int64_t q_end;
  int64_t key_begin;  // a decode's key slice [key_begin, key_end); -1: all visible keys
  int64_t key_end;
  int64_t partial;  // where a slice's (max, sum, acc) go in the partials buffer; -1: write out directly
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
  std::vector<float> q, row, scores, acc;
};

// Attention of query rows [q_begin, q_end) of one item for the `group` heads of its KV head.
// Keys [lo, hi) of each row, scores into scratch; writes either out (normalized) or a partial.
// HEAD_DIM: the head size as a constant (the loops over it unroll), or 0 to read it from p.
template <typename T, int HEAD_DIM>
void run_item(const Problem& p, const Item& item, const T* query, const T* kv, T* out, float* partials,
              Scratch& s) {
  const int64_t D = HEAD_DIM ? HEAD_DIM : p.head_dim, G = p.group;
  constexpr bool kDotsInInputDtype =
      kHaveBf16Dot && std::is_same_v<T, c10::BFloat16> && HEAD_DIM % 32 == 0 && HEAD_DIM > 0;
  const int32_t* table = p.block_tables + item.seq * p.max_blocks;
  const int64_t seq_len = p.seq_lens[item.seq];
  const int64_t q_start = p.query_start[item.seq];
  const int64_t q_len = p.query_start[item.seq + 1] - q_start;
  const int64_t context = seq_len - q_len;
  const int64_t first_head = item.kv_head * G;
  s.q.resize(G * D);
  s.row.resize(D);
  s.acc.resize(G * D);

  for (int64_t i = item.q_begin; i < item.q_end; ++i) {
    const int64_t pos = context + i;
    int64_t lo = p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1) : 0;
    int64_t hi = pos + 1;
    if (item.key_begin >= 0) {
      lo = std::max(lo, item.key_begin);
      hi = std::min(hi, item.key_end);
    }
    const int64_t n = std::max<int64_t>(hi - lo, 0);
    s.scores.resize(G * std::max<int64_t>(n, 1));
    const T* q_row = query + (q_start + i) * p.q_stride_token + first_head * p.q_stride_head;
    for (int64_t g = 0; g < G; ++g) {
      float* qg = s.q.data() + g * D;
      to_float(q_row + g * p.q_stride_head, qg, D);
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) qg[d] *= p.scale;
    }

    // pass 1: scores of keys lo..hi-1, block by block (a block's rows are kv_stride_token apart)
    float* row = s.row.data();
    std::vector<float>& sc = s.scores;
    for (int64_t j = lo; j < hi;) {
      const int64_t block = table[j / p.block_size];
      const int64_t off = j % p.block_size;
      const int64_t stop = std::min(hi, j + (p.block_size - off));
      const T* k = kv + block * p.kv_stride_block + off * p.kv_stride_token + item.kv_head * D;
      for (; j < stop; ++j, k += p.kv_stride_token) {
        if constexpr (kDotsInInputDtype) {  // unscaled bf16 queries; the scale goes on the score
          for (int64_t g = 0; g < G; ++g)
            sc[g * n + (j - lo)] = p.scale * dot_bf16<HEAD_DIM>(reinterpret_cast<const c10::BFloat16*>(q_row + g * p.q_stride_head),
                                                               reinterpret_cast<const c10::BFloat16*>(k));
        } else {
          const float* kf = as_float(k, row, D);  // converted once for the whole group
          for (int64_t g = 0; g < G; ++g) {
            const float* qg = s.q.data() + g * D;
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < D; ++d) dot += qg[d] * kf[d];
            sc[g * n + (j - lo)] = dot;
          }
        }
      }
    }

    // softmax (unnormalized: exp(score - max)); max and sum per head
    float maxes[64], sums[64];  // group <= 64 is checked by the caller
    for (int64_t g = 0; g < G; ++g) {
      float* sg = sc.data() + g * n;
      if (p.soft_cap > 0.f) {
        const float cap = p.soft_cap;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) sg[j] = soft_capped(sg[j], cap);
      }
      float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
      for (int64_t j = 0; j < n; ++j) m = std::max(m, sg[j]);
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < n; ++j) {
        sg[j] = exp_nonpositive(sg[j] - m);
        sum += sg[j];
      }
      maxes[g] = m;
      sums[g] = sum;
    }

    // pass 2: acc = sum_j p_j * v_j
    std::fill(s.acc.begin(), s.acc.end(), 0.f);
    for (int64_t j = lo; j < hi;) {
      const int64_t block = table[j / p.block_size];
      const int64_t off = j % p.block_size;
      const int64_t stop = std::min(hi, j + (p.block_size - off));
      const T* v = kv + p.kv_half + block * p.kv_stride_block + off * p.kv_stride_token + item.kv_head * D;
      for (; j < stop; ++j, v += p.kv_stride_token) {
        const float* vf = as_float(v, row, D);
        for (int64_t g = 0; g < G; ++g) {
          const float w = sc[g * n + (j - lo)];
          float* ag = s.acc.data() + g * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) ag[d] += w * vf[d];
        }
      }
    }

    if (item.partial >= 0) {  // a key slice of a decode: (max, sum, acc) per head, merged later
      float* part = partials + item.partial * G * (D + 2);
      for (int64_t g = 0; g < G; ++g) {
        float* pg = part + g * (D + 2);
        pg[0] = maxes[g];
        pg[1] = sums[g];
        std::memcpy(pg + 2, s.acc.data() + g * D, D * sizeof(float));
      }
    } else {
      T* o = out + (q_start + i) * p.out_stride_token + first_head * p.out_stride_head;
      for (int64_t g = 0; g < G; ++g)
        from_float(s.acc.data() + g * D, o + g * p.out_stride_head, D, sums[g] > 0.f ? 1.f / sums[g] : 0.f);
    }
  }
}

// Combines a decode's key slices: out = sum_k exp(m_k - M) acc_k / sum_k exp(m_k - M) sum_k.
template <typename T>
void merge_slices(const Problem& p, int64_t seq, int64_t kv_head, int64_t first, int64_t count,
                  const float* partials, T* out, std::vector<float>& acc) {
  const int64_t D = p.head_dim, G = p.group;
  acc.resize(D);
  const int64_t token = p.query_start[seq];
  for (int64_t g = 0; g < G; ++g) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t k = 0; k < count; ++k) m = std::max(m, partials[((first + k) * G + g) * (D + 2)]);
    float sum = 0.f;
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t k = 0; k < count; ++k) {
      const float* pg = partials + ((first + k) * G + g) * (D + 2);
      if (pg[1] == 0.f) continue;  // an empty slice
      const float w = std::exp(pg[0] - m);
      sum += w * pg[1];
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) acc[d] += w * pg[2 + d];
    }
    T* o = out + token * p.out_stride_token + (kv_head * G + g) * p.out_stride_head;
    from_float(acc.data(), o, D, sum > 0.f ? 1.f / sum : 0.f);
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

constexpr int64_t kQueryTile = 16;     // query rows per prefill item
constexpr int64_t kMinSliceKeys = 256;  // a decode's key slice is at least this long

void paged_attention_out(at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache,
                         const at::Tensor& block_tables, const at::Tensor& seq_lens,
                         const at::Tensor& query_start_loc, const at::Tensor& seq_ids, double scale,
                         int64_t sliding_window, double soft_cap) {
  TORCH_CHECK(query.device().is_cpu() && kv_cache.device().is_cpu(), "paged_attention_out: CPU tensors only");
  TORCH_CHECK(query.dim() == 3 && out.sizes() == query.sizes(), "query and out must be [tokens, heads, head_dim]");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(),
              "kv_cache must be a contiguous (2, num_blocks, block_size, kv_heads, head_dim) tensor");
  TORCH_CHECK(query.scalar_type() == kv_cache.scalar_type() && out.scalar_type() == query.scalar_type(),
              "query, out and kv_cache must share a dtype");
  TORCH_CHECK(query.stride(2) == 1 && out.stride(2) == 1, "query and out need a contiguous last dimension");
  for (const at::Tensor* t : {&block_tables, &seq_lens, &query_start_loc, &seq_ids})
    TORCH_CHECK(t->scalar_type() == at::kInt && t->is_contiguous() && t->device().is_cpu(),
                "block_tables, seq_lens, query_start_loc and seq_ids must be contiguous int32 CPU tensors");
  Problem p;
  p.heads = query.size(1);
  p.kv_heads = kv_cache.size(3);
  p.head_dim = query.size(2);
  TORCH_CHECK(kv_cache.size(4) == p.head_dim && p.heads % p.kv_heads == 0, "head sizes or head counts disagree");
  p.group = p.heads / p.kv_heads;
  TORCH_CHECK(p.group <= 64, "at most 64 query heads per KV head");
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

  // plan: query tiles for prefills; decodes whole, or in key slices when there are too few items
  const int32_t* ids = seq_ids.data_ptr<int32_t>();
  const int64_t num = seq_ids.numel();
  const int64_t threads = at::get_num_threads();
  int64_t decode_items = 0;
  for (int64_t k = 0; k < num; ++k)
    decode_items += (p.query_start[ids[k] + 1] - p.query_start[ids[k]] == 1) ? p.kv_heads : 0;
  std::vector<Item> items;
  struct Merge { int64_t seq, kv_head, first, count; };
  std::vector<Merge> merges;
  int64_t num_partials = 0;
  for (int64_t k = 0; k < num; ++k) {
    const int64_t seq = ids[k];
    const int64_t q_len = p.query_start[seq + 1] - p.query_start[seq];
    const int64_t seq_len = p.seq_lens[seq];
    TORCH_CHECK(seq_len >= q_len && (seq_len + p.block_size - 1) / p.block_size <= p.max_blocks,
                "sequence ", seq, ": seq_len ", seq_len, " does not fit its query or block table");
    if (q_len == 0) continue;
    const int64_t visible = p.window > 0 ? std::min(seq_len, p.window) : seq_len;
    for (int64_t h = 0; h < p.kv_heads; ++h) {
      if (q_len > 1) {
        for (int64_t q0 = 0; q0 < q_len; q0 += kQueryTile) {
          const int64_t q1 = std::min(q_len, q0 + kQueryTile);
          items.push_back({seq, h, q0, q1, -1, -1, -1, visible * (q1 - q0)});
        }
        continue;
      }
      // split a decode's keys when the decodes alone cannot keep every thread busy for long
      const int64_t lo = seq_len - visible;
      int64_t slices = 1;
      if (threads > 1 && decode_items < 4 * threads)
        slices = std::min<int64_t>((4 * threads + decode_items - 1) / decode_items, visible / kMinSliceKeys);
      if (slices <= 1) {
        items.push_back({seq, h, 0, 1, -1, -1, -1, visible});
        continue;
      }
      merges.push_back({seq, h, num_partials, slices});
      for (int64_t s = 0; s < slices; ++s) {
        const int64_t b = lo + visible * s / slices, e = lo + visible * (s + 1) / slices;
        items.push_back({seq, h, 0, 1, b, e, num_partials++, e - b});
      }
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
  std::vector<float> partials(num_partials * p.group * (p.head_dim + 2));

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
        thread_local std::vector<float> acc;
        const Merge& m = merges[i];
        merge_slices<scalar_t>(p, m.seq, m.kv_head, m.first, m.count, parts, o, acc);
      });
  };
  switch (query.scalar_type()) {
    case at::kFloat: run(static_cast<float*>(nullptr)); break;
    case at::kBFloat16: run(static_cast<c10::BFloat16*>(nullptr)); break;
    case at::kHalf: run(static_cast<c10::Half*>(nullptr)); break;
    default: TORCH_CHECK(false, "paged_attention_out: dtype ", query.scalar_type(), " not supported (float32, bfloat16, float16)");
  }
}

}  // namespace

TORCH_LIBRARY(kvserve_attention_cpu, m) {
  m.def(
      "paged_attention_out(Tensor(a!) out, Tensor query, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, "
      "Tensor query_start_loc, Tensor seq_ids, float scale, int sliding_window, float soft_cap) -> ()");
}

TORCH_LIBRARY_IMPL(kvserve_attention_cpu, CPU, m) { m.impl("paged_attention_out", &paged_attention_out); }
