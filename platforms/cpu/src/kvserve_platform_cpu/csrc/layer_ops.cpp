// Fused layer ops for the CPU platform: RMSNorm (with the residual add), SiLU-and-mul, rotary.
//
// One pass per row instead of several ATen ops each: the rows of a decode step are small
// ([32, 576] on SmolLM2), so dispatch, not arithmetic, dominates the unfused ops. Math is float32
// in the order of kvserve.layers.TorchLayerOps (HF's); bfloat16/float16 are widened, and rounded
// wherever the unfused ops round, a vector at a time in registers (vec_math.h), not a pass over the
// row for each conversion. Vectorized through ATen's at::vec (its exp is the Sleef
// routine PyTorch's own silu calls), so float32 results match the unfused ops up to the order
// of the sum of squares.

#include "vec_math.h"  // first: it picks at::vec's width

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

namespace {

using kvserve_vec::load_float;
using kvserve_vec::rounded;
using kvserve_vec::store_as;
using kvserve_vec::Vec;

// Rows below this many elements of work run on the calling thread: waking the pool costs more.
constexpr int64_t kParallelElements = 1 << 15;

int64_t row_grain(int64_t row_elements) { return std::max<int64_t>(1, kParallelElements / std::max<int64_t>(row_elements, 1)); }

// A tensor seen as [rows, n] with a row stride (the last dimension contiguous): 2-D tensors as they
// are, 3-D ones whose two leading dimensions flatten, anything else made contiguous first.
struct Rows {
  at::Tensor tensor;
  int64_t rows;
  int64_t n;
  int64_t stride;
};

Rows as_rows(const at::Tensor& x, const char* what) {
  TORCH_CHECK(x.dim() >= 1, what, ": needs at least one dimension, got a scalar");
  TORCH_CHECK(x.device().is_cpu(), what, ": CPU tensors only, got one on ", x.device());
  const int64_t n = x.size(-1);
  at::Tensor t = x.stride(-1) == 1 ? x : x.contiguous();
  if (t.dim() == 1) t = t.unsqueeze(0);
  if (t.dim() == 3 && t.stride(0) == t.size(1) * t.stride(1)) t = t.as_strided({t.size(0) * t.size(1), n}, {t.stride(1), 1});
  if (t.dim() != 2) t = t.contiguous().view({-1, n});
  return {t, t.size(0), n, t.size(0) > 1 ? t.stride(0) : n};
}

void check_weight(const at::Tensor& x, const at::Tensor& weight, const char* op) {
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), op, ": weight must be [", x.size(-1), "], got ",
              weight.sizes());
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), op, ": weight dtype ", weight.scalar_type(),
              " differs from the input's ", x.scalar_type());
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), op, ": CPU tensors only");
}

// The per-element gain in float32: weight (Llama) or weight_offset + weight (Gemma).
template <typename T>
std::vector<float> gain_of(const at::Tensor& weight, double weight_offset) {
  const at::Tensor w = weight.contiguous();
  const T* data = w.data_ptr<T>();
  std::vector<float> gain(w.numel());
  for (int64_t i = 0; i < w.numel(); ++i) gain[i] = static_cast<float>(data[i]) + static_cast<float>(weight_offset);
  return gain;
}

// One row of RMSNorm in two passes over registers (each value widened, rounded and narrowed there, not
// by a pass of its own over the row). The first pass gives `row` (n float32) the values to normalize,
// `values(i, count)` of them at a time, each as the unfused ops' input holds it (the residual sum
// rounded to T), and sums their squares; the second writes the normed row to `out` in T. Two passes,
// not the ten of converting, adding, rounding and multiplying a row at a time: 32 rows of 768
// bfloat16 took 27.5 us that way on a Zen 5 core, mostly in those passes.
template <typename T, typename Values>
inline void norm_row(float* row, T* out, const float* gain, int64_t n, float eps, bool offset, const Values& values) {
  Vec acc(0.0f);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    const Vec v = values(i, Vec::size());
    v.store(row + i);
    acc = acc + v * v;
  }
  float sum = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, acc);
  if (i < n) values(i, n - i).store(row + i, n - i);
  for (int64_t t = i; t < n; ++t) sum += row[t] * row[t];  // the tail added after the vectors' sum
  const Vec inv(1.0f / std::sqrt(sum / static_cast<float>(n) + eps));
  for (i = 0; i < n; i += Vec::size()) {
    const int64_t count = std::min<int64_t>(Vec::size(), n - i);
    const Vec x = Vec::loadu(row + i, count), g = Vec::loadu(gain + i, count);
    // Gemma: (x * inv) * (offset + w) in float32, one cast; Llama: w * cast(x * inv), rounded again.
    store_as(out + i, offset ? (x * inv) * g : g * rounded<T>(x * inv), count);
  }
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, double weight_offset) {
  check_weight(x, weight, "rms_norm");
  const Rows in = as_rows(x, "rms_norm x");
  at::Tensor out = at::empty(x.sizes(), x.options());
  const int64_t n = in.n;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    const std::vector<float> gain = gain_of<scalar_t>(weight, weight_offset);
    const scalar_t* src = in.tensor.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    at::parallel_for(0, in.rows, row_grain(n), [&](int64_t begin, int64_t end) {
      std::vector<float> row(n);
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* x = src + r * in.stride;
        norm_row(row.data(), dst + r * n, gain.data(), n, static_cast<float>(eps), weight_offset != 0.0,
                 [&](int64_t i, int64_t count) { return load_float(x + i, count); });
      }
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                      const at::Tensor& weight, double eps, double weight_offset) {
  check_weight(x, weight, "fused_add_rms_norm");
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type(),
              "fused_add_rms_norm: residual must match x (", x.sizes(), ", ", x.scalar_type(), "), got ",
              residual.sizes(), ", ", residual.scalar_type());
  const Rows in = as_rows(x, "fused_add_rms_norm x");
  const Rows res = as_rows(residual, "fused_add_rms_norm residual");
  at::Tensor out = at::empty(x.sizes(), x.options());
  at::Tensor sum_out = at::empty(x.sizes(), x.options());
  const int64_t n = in.n;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fused_add_rms_norm", [&] {
    const std::vector<float> gain = gain_of<scalar_t>(weight, weight_offset);
    const scalar_t* xs = in.tensor.data_ptr<scalar_t>();
    const scalar_t* rs = res.tensor.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    scalar_t* sums = sum_out.data_ptr<scalar_t>();
    at::parallel_for(0, in.rows, row_grain(n), [&](int64_t begin, int64_t end) {
      std::vector<float> row(n);
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* x = xs + r * in.stride;
        const scalar_t* residual = rs + r * res.stride;
        scalar_t* sum = sums + r * n;
        // The sum goes out in T, and the norm reads it rounded, as unfused.
        norm_row(row.data(), dst + r * n, gain.data(), n, static_cast<float>(eps), weight_offset != 0.0,
                 [&](int64_t i, int64_t count) {
                   const Vec v = rounded<scalar_t>(load_float(residual + i, count) + load_float(x + i, count));
                   store_as(sum + i, v, count);
                   return v;
                 });
      }
    });
  });
  return {out, sum_out};
}

at::Tensor silu_and_mul(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type(),
              "silu_and_mul: gate and up must have one shape and dtype, got ", gate.sizes(), " ", gate.scalar_type(),
              " and ", up.sizes(), " ", up.scalar_type());
  TORCH_CHECK(gate.device().is_cpu() && up.device().is_cpu(), "silu_and_mul: CPU tensors only");
  const Rows g = as_rows(gate, "silu_and_mul gate");
  const Rows u = as_rows(up, "silu_and_mul up");
  at::Tensor out = at::empty(gate.sizes(), gate.options());
  const int64_t n = g.n;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate.scalar_type(), "silu_and_mul", [&] {
    const scalar_t* gs = g.tensor.data_ptr<scalar_t>();
    const scalar_t* us = u.tensor.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    at::parallel_for(0, g.rows, row_grain(n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        kvserve_vec::silu_and_mul_row(gs + r * g.stride, us + r * u.stride, n, dst + r * n);
    });
  });
  return out;
}

// Rotates every head of `x` ([tokens, heads, head_dim], last dimension contiguous) into `out`.
template <typename T>
void rotate(const at::Tensor& x, at::Tensor& out, const int64_t* positions, const float* cos, const float* sin) {
  const int64_t tokens = x.size(0), heads = x.size(1), dim = x.size(2), half = dim / 2;
  const int64_t token_stride = x.stride(0), head_stride = x.stride(1);
  const T* src = x.data_ptr<T>();
  T* dst = out.data_ptr<T>();
  at::parallel_for(0, tokens * heads, row_grain(dim), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t t = row / heads, h = row % heads;
      const int64_t p = positions[t];
      const T* v = src + t * token_stride + h * head_stride;
      T* o = dst + row * dim;
      const float* c = cos + p * half;
      const float* s = sin + p * half;
      for (int64_t i = 0; i < half; i += Vec::size()) {  // both halves widened and rounded in registers
        const int64_t k = std::min<int64_t>(Vec::size(), half - i);
        const Vec a = load_float(v + i, k), b = load_float(v + half + i, k);
        const Vec cv = Vec::loadu(c + i, k), sv = Vec::loadu(s + i, k);
        store_as(o + i, a * cv - b * sv, k);
        store_as(o + half + i, b * cv + a * sv, k);
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor> rotary_embedding(const at::Tensor& positions, const at::Tensor& query,
                                                    const at::Tensor& key, const at::Tensor& cos,
                                                    const at::Tensor& sin) {
  TORCH_CHECK(query.dim() == 3 && key.dim() == 3, "rotary_embedding: query and key must be [tokens, heads, head_dim], got ",
              query.sizes(), " and ", key.sizes());
  TORCH_CHECK(query.size(0) == key.size(0) && query.size(2) == key.size(2) && query.scalar_type() == key.scalar_type(),
              "rotary_embedding: query ", query.sizes(), " and key ", key.sizes(), " disagree");
  TORCH_CHECK(query.device().is_cpu() && key.device().is_cpu() && positions.device().is_cpu() && cos.device().is_cpu() &&
                  sin.device().is_cpu(),
              "rotary_embedding: CPU tensors only");
  TORCH_CHECK(query.size(2) % 2 == 0, "rotary_embedding: head_dim must be even, got ", query.size(2));
  TORCH_CHECK(positions.dim() == 1 && positions.size(0) == query.size(0) && positions.scalar_type() == at::kLong,
              "rotary_embedding: positions must be int64 [", query.size(0), "], got ", positions.scalar_type(), " ",
              positions.sizes());
  const int64_t half = query.size(2) / 2;
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.dim() == 2 &&
                  cos.size(1) == half && sin.sizes() == cos.sizes(),
              "rotary_embedding: cos and sin must be float32 [max_position, ", half, "], got ", cos.sizes(), " ",
              cos.scalar_type(), " and ", sin.sizes(), " ", sin.scalar_type());
  const at::Tensor q = query.stride(2) == 1 ? query : query.contiguous();
  const at::Tensor k = key.stride(2) == 1 ? key : key.contiguous();
  const at::Tensor pos = positions.contiguous(), c = cos.contiguous(), s = sin.contiguous();
  const int64_t* p = pos.data_ptr<int64_t>();
  const auto [lowest, highest] = std::minmax_element(p, p + pos.numel());
  TORCH_CHECK(pos.numel() == 0 || (*lowest >= 0 && *highest < c.size(0)), "rotary_embedding: positions must lie in [0, ",
              c.size(0), "), got ", pos.numel() ? *lowest : 0, "..", pos.numel() ? *highest : 0);
  at::Tensor q_out = at::empty(query.sizes(), query.options());
  at::Tensor k_out = at::empty(key.sizes(), key.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "rotary_embedding", [&] {
    rotate<scalar_t>(q, q_out, pos.data_ptr<int64_t>(), c.data_ptr<float>(), s.data_ptr<float>());
    rotate<scalar_t>(k, k_out, pos.data_ptr<int64_t>(), c.data_ptr<float>(), s.data_ptr<float>());
  });
  return {q_out, k_out};
}

}  // namespace

TORCH_LIBRARY(kvserve_cpu_layer_ops, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps, float weight_offset) -> Tensor", &rms_norm);
  m.def("fused_add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps, float weight_offset) -> (Tensor, Tensor)",
        &fused_add_rms_norm);
  m.def("silu_and_mul(Tensor gate, Tensor up) -> Tensor", &silu_and_mul);
  m.def("rotary_embedding(Tensor positions, Tensor query, Tensor key, Tensor cos, Tensor sin) -> (Tensor, Tensor)",
        &rotary_embedding);
}
