// Writes a step's new K and V rows into the paged cache, one op per layer.
//
// kvserve_attention_cpu::write_kv(kv_cache, key, value, slot_mapping)
//
// kv_cache is (2, num_blocks, block_size, kv_heads, head_dim), K then V; key and value are
// [tokens, kv_heads, head_dim] in the cache's dtype (any token stride: they are usually views of a
// fused qkv projection), slot_mapping int64 [tokens]: token t goes to flat slot slot_mapping[t]
// (block * block_size + offset), and a slot of -1 (padding) is skipped. Replaces two index_copy_
// calls and the gather of the non-padding rows that came before them.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

void write_kv(at::Tensor& kv_cache, const at::Tensor& key, const at::Tensor& value, const at::Tensor& slot_mapping) {
  TORCH_CHECK(kv_cache.device().is_cpu() && kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(),
              "write_kv: kv_cache must be a contiguous CPU (2, num_blocks, block_size, kv_heads, head_dim) tensor");
  const int64_t kv_heads = kv_cache.size(3), head_dim = kv_cache.size(4);
  const int64_t slots = kv_cache.size(1) * kv_cache.size(2);
  const int64_t tokens = slot_mapping.numel();
  for (const at::Tensor* t : {&key, &value}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == kv_cache.scalar_type(),
                "write_kv: key and value must be CPU tensors of the cache's dtype ", kv_cache.scalar_type());
    TORCH_CHECK(t->dim() == 3 && t->size(0) == tokens && t->size(1) == kv_heads && t->size(2) == head_dim,
                "write_kv: key and value must be [", tokens, ", ", kv_heads, ", ", head_dim, "], got ", t->sizes());
    TORCH_CHECK(t->stride(2) == 1 && t->stride(1) == head_dim,
                "write_kv: each token's heads must be contiguous (stride ", head_dim, ", 1)");
  }
  TORCH_CHECK(slot_mapping.device().is_cpu() && slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous(),
              "write_kv: slot_mapping must be a contiguous int64 CPU tensor");
  const int64_t* slot = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(slot[t] >= -1 && slot[t] < slots, "write_kv: token ", t, "'s slot ", slot[t], " is outside the cache's ",
                slots, " slots");
  const int64_t row_bytes = kv_heads * head_dim * kv_cache.element_size();
  char* k_cache = static_cast<char*>(kv_cache.data_ptr());
  char* v_cache = k_cache + slots * row_bytes;
  const char* k = static_cast<const char*>(key.data_ptr());
  const char* v = static_cast<const char*>(value.data_ptr());
  const int64_t k_stride = key.stride(0) * key.element_size(), v_stride = value.stride(0) * value.element_size();
  // a decode step's rows are a few KiB: one thread; long prefill chunks split across the pool
  at::parallel_for(0, tokens, std::max<int64_t>(1, (64 << 10) / row_bytes), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (slot[t] < 0) continue;
      std::memcpy(k_cache + slot[t] * row_bytes, k + t * k_stride, row_bytes);
      std::memcpy(v_cache + slot[t] * row_bytes, v + t * v_stride, row_bytes);
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvserve_attention_cpu, m) {
  m.def("write_kv(Tensor(a!) kv_cache, Tensor key, Tensor value, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(kvserve_attention_cpu, CPU, m) { m.impl("write_kv", &write_kv); }
