// Attention over a KV pool read by slot, for the few queries per request of a decode, verify or draft step.
//
//   q: [B, w, Hq, D] float32            the new tokens' queries
//   k_cache, v_cache: [S, Hkv, D] float32 the pool (every slot a row of Hkv heads)
//   context_slots: [B, C] int64         the slot of each request's columns 0..C-1 (all in [0, S))
//   mask: [B, w, C] float32             additive: 0 where query i sees column c, -inf where it does not
//   -> out [B, w, Hq, D] = softmax(q . k * scale + mask) . v, query head h reading KV head h / (Hq / Hkv)
//
// One task per (request, KV head) reads that head's keys and values once for every query and head of its
// group, straight from the pool (no gathered copy). Each query row's scores, softmax and sum over the
// columns run in a fixed order whatever w, B and the batch's context length (masked columns weigh exactly
// 0 and add nothing), so a query computes to the same bits in any batch.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

typedef float vec8 __attribute__((vector_size(32)));
typedef int32_t ivec8 __attribute__((vector_size(32)));

inline vec8 load8(const float* p) {
  vec8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store8(float* p, vec8 v) { std::memcpy(p, &v, sizeof v); }

inline float lane_sum(vec8 v) {  // a fixed order: ((0+4) + (2+6)) + ((1+5) + (3+7))
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

inline float dot(const float* a, const float* b, int64_t d) {
  int64_t j = 0;
  vec8 acc{};
  for (; j + 8 <= d; j += 8) acc += load8(a + j) * load8(b + j);
  float sum = lane_sum(acc);
  for (; j < d; ++j) sum += a[j] * b[j];
  return sum;
}

// e^x for x <= 0, eight at a time (Cody-Waite reduction, degree-6 polynomial: about 1 ulp); 0 below
// -87.3 (float's smallest normal is e^-87.3), so a masked column weighs exactly nothing
inline vec8 exp8(vec8 input) {
  const vec8 lo = vec8{} - 87.3f;
  const vec8 x = input < lo ? lo : input;
  const vec8 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 * 2^23)
  vec8 r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  vec8 p = vec8{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const ivec8 bits = (__builtin_convertvector(n, ivec8) + 127) << 23;
  vec8 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  const vec8 e = p * scale;
  return input < lo ? vec8{} : e;
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& context_slots, const at::Tensor& mask, double scale) {
  TORCH_CHECK(q.dim() == 4 && q.scalar_type() == at::kFloat && q.is_contiguous() && q.device().is_cpu(),
              "paged_attention: q must be a contiguous float32 CPU tensor [B, w, Hq, D]");
  TORCH_CHECK(k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes() && k_cache.scalar_type() == at::kFloat &&
                  v_cache.scalar_type() == at::kFloat && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  k_cache.size(2) == q.size(3) && k_cache.size(1) > 0 && q.size(2) % k_cache.size(1) == 0,
              "paged_attention: k_cache and v_cache must be contiguous float32 [S, Hkv, D] with Hq a multiple of Hkv");
  const int64_t batch = q.size(0), width = q.size(1), num_heads = q.size(2), head_dim = q.size(3);
  const int64_t num_slots = k_cache.size(0), kv_heads = k_cache.size(1), group = num_heads / kv_heads;
  TORCH_CHECK(context_slots.dim() == 2 && context_slots.size(0) == batch && context_slots.scalar_type() == at::kLong &&
                  context_slots.is_contiguous(),
              "paged_attention: context_slots must be a contiguous int64 [B, C]");
  const int64_t context = context_slots.size(1);
  const bool mask_shaped = (mask.dim() == 3 && mask.size(0) == batch && mask.size(1) == width && mask.size(2) == context) ||
                           (mask.dim() == 4 && mask.size(0) == batch && mask.size(1) == 1 && mask.size(2) == width &&
                            mask.size(3) == context);
  TORCH_CHECK(mask.scalar_type() == at::kFloat && mask.is_contiguous() && mask_shaped,
              "paged_attention: mask must be a contiguous float32 [B, w, C] (or [B, 1, w, C])");
  at::Tensor out = at::empty(q.sizes(), q.options());
  if (batch == 0 || width == 0) return out;
  const float* q_data = q.data_ptr<float>();
  const float* k_data = k_cache.data_ptr<float>();
  const float* v_data = v_cache.data_ptr<float>();
  const int64_t* slot_data = context_slots.data_ptr<int64_t>();
  const float* mask_data = mask.data_ptr<float>();
  float* out_data = out.data_ptr<float>();
  const int64_t rows = width * group;  // the queries of one task: (query i, head of the group)
  const float scale_f = static_cast<float>(scale);
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

  for (int64_t i = 0; i < batch * context; ++i) {
    TORCH_CHECK(slot_data[i] >= 0 && slot_data[i] < num_slots, "paged_attention: a context slot is outside the pool");
  }
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t first, int64_t last) {
    std::vector<float> scores(rows * context), acc(rows * head_dim), denominators(rows);
    std::vector<int64_t> query_offsets(rows), mask_offsets(rows);
    for (int64_t task = first; task < last; ++task) {
      const int64_t b = task / kv_heads, g = task % kv_heads;
      const int64_t* slots = slot_data + b * context;
      for (int64_t r = 0; r < rows; ++r) {  // row r = (query i = r / group, head g * group + r % group)
        query_offsets[r] = ((b * width + r / group) * num_heads + g * group + r % group) * head_dim;
        mask_offsets[r] = (b * width + r / group) * context;
      }
      for (int64_t c = 0; c < context; ++c) {
        const float* key = k_data + (slots[c] * kv_heads + g) * head_dim;
        for (int64_t r = 0; r < rows; ++r) {
          const float bias = mask_data[mask_offsets[r] + c];
          scores[r * context + c] =
              bias == kMinusInf ? kMinusInf : dot(q_data + query_offsets[r], key, head_dim) * scale_f + bias;
        }
      }
      for (int64_t r = 0; r < rows; ++r) {  // scores -> e^(s - max), and their sum
        float* row = scores.data() + r * context;
        float top = kMinusInf;
        for (int64_t c = 0; c < context; ++c) top = row[c] > top ? row[c] : top;
        if (top == kMinusInf) {  // a query that sees nothing: zero weights, a zero output
          std::fill(row, row + context, 0.0f);
          denominators[r] = 1.0f;
          continue;
        }
        // eight columns at a time, a last partial group padded with -inf (weight 0): a column's weight and
        // its place in the sum are the same whatever the batch's context length past the request's own
        vec8 total{};
        for (int64_t c = 0; c < context; c += 8) {
          const int64_t columns = std::min<int64_t>(8, context - c);
          alignas(32) float group[8];
          for (int64_t j = 0; j < 8; ++j) group[j] = j < columns ? row[c + j] : kMinusInf;
          const vec8 e = exp8(load8(group) - top);
          store8(group, e);
          std::memcpy(row + c, group, columns * sizeof(float));
          total += e;
        }
        denominators[r] = lane_sum(total);
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t c = 0; c < context; ++c) {
        const float* value = v_data + (slots[c] * kv_heads + g) * head_dim;
        for (int64_t r = 0; r < rows; ++r) {
          const float weight = scores[r * context + c];
          if (weight == 0.0f) continue;
          float* a = acc.data() + r * head_dim;
          int64_t j = 0;
          for (; j + 8 <= head_dim; j += 8) store8(a + j, load8(a + j) + weight * load8(value + j));
          for (; j < head_dim; ++j) a[j] += weight * value[j];
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        float* dst = out_data + query_offsets[r];
        const float inverse = 1.0f / denominators[r];
        for (int64_t j = 0; j < head_dim; ++j) dst[j] = acc[r * head_dim + j] * inverse;
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(eyas_cpu, m) {
  m.def("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor context_slots, Tensor mask, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(eyas_cpu, CPU, m) { m.impl("paged_attention", &paged_attention); }
