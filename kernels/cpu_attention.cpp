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

constexpr int64_t kMinWork = 1024;

inline vec8 load8(const float* p) {
  vec8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store8(float* p, vec8 v) { std::memcpy(p, &v, sizeof v); }

inline float lane_sum(vec8 v) {  // a fixed order: ((0+4) + (2+6)) + ((1+5) + (3+7))
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

// [x0+x1, y0+y1, x2+x3, y2+y3, x4+x5, y4+y5, x6+x7, y6+y7]
inline vec8 pair_sums(vec8 x, vec8 y) {
  return __builtin_shufflevector(x, y, 0, 8, 2, 10, 4, 12, 6, 14) + __builtin_shufflevector(x, y, 1, 9, 3, 11, 5, 13, 7, 15);
}

// lane i = a[i]'s lanes summed in a fixed order: ((0+1) + (2+3)) + ((4+5) + (6+7))
inline vec8 lane_sums(const vec8* a) {
  const vec8 x01 = pair_sums(a[0], a[1]), x23 = pair_sums(a[2], a[3]), x45 = pair_sums(a[4], a[5]),
             x67 = pair_sums(a[6], a[7]);
  const vec8 y0 = __builtin_shufflevector(x01, x23, 0, 1, 8, 9, 4, 5, 12, 13) +
                  __builtin_shufflevector(x01, x23, 2, 3, 10, 11, 6, 7, 14, 15);
  const vec8 y4 = __builtin_shufflevector(x45, x67, 0, 1, 8, 9, 4, 5, 12, 13) +
                  __builtin_shufflevector(x45, x67, 2, 3, 10, 11, 6, 7, 14, 15);
  return __builtin_shufflevector(y0, y4, 0, 1, 2, 3, 8, 9, 10, 11) +
         __builtin_shufflevector(y0, y4, 4, 5, 6, 7, 12, 13, 14, 15);
}

// lane i = q . keys[i] over d: eight columns at once, one FMA chain per column over q's 8-float chunks in
// order, the lanes summed by `lane_sums`, then the last d % 8 products
inline vec8 dot8(const float* q, const float* const* keys, int64_t d) {
  vec8 a[8] = {};
  int64_t j = 0;
  for (; j + 8 <= d; j += 8) {
    const vec8 qv = load8(q + j);
    for (int i = 0; i < 8; ++i) a[i] += qv * load8(keys[i] + j);
  }
  vec8 sums = lane_sums(a);
  if (j < d) {
    alignas(32) float tail[8];
    for (int i = 0; i < 8; ++i) {
      float t = 0.0f;
      for (int64_t jj = j; jj < d; ++jj) t += q[jj] * keys[i][jj];
      tail[i] = t;
    }
    sums += load8(tail);
  }
  return sums;
}

// out[0 : 8 NV] = sum over columns c in order of weights[c] * value_c (columns of weight 0 skipped: a masked
// column's slot may hold anything); value_c = values + slots[c] * stride
template <int NV>
inline void weighted_sum(const float* weights, const int64_t* slots, int64_t context, const float* values,
                         int64_t stride, float* out) {
  vec8 s[NV] = {};
  for (int64_t c = 0; c < context; ++c) {
    const float w = weights[c];
    if (w == 0.0f) continue;
    const float* v = values + slots[c] * stride;
    for (int i = 0; i < NV; ++i) s[i] += w * load8(v + 8 * i);
  }
  for (int i = 0; i < NV; ++i) store8(out + 8 * i, s[i]);
}

void run_weighted_sum(int vectors, const float* weights, const int64_t* slots, int64_t context, const float* values,
                      int64_t stride, float* out) {
  switch (vectors) {
    case 8: return weighted_sum<8>(weights, slots, context, values, stride, out);
    case 7: return weighted_sum<7>(weights, slots, context, values, stride, out);
    case 6: return weighted_sum<6>(weights, slots, context, values, stride, out);
    case 5: return weighted_sum<5>(weights, slots, context, values, stride, out);
    case 4: return weighted_sum<4>(weights, slots, context, values, stride, out);
    case 3: return weighted_sum<3>(weights, slots, context, values, stride, out);
    case 2: return weighted_sum<2>(weights, slots, context, values, stride, out);
    default: return weighted_sum<1>(weights, slots, context, values, stride, out);
  }
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
  const int64_t padded = (context + 7) / 8 * 8;  // a row of scores: its columns, then -inf up to a multiple of 8
  const int64_t stride = kv_heads * head_dim;  // floats from one slot's row to the next
  // a thread takes tasks of at least kMinWork (query row, column) pairs: a smaller call runs on one thread,
  // which measured faster than waking another (one request at one token)
  const int64_t grain = std::max<int64_t>(1, (kMinWork + rows * padded - 1) / std::max<int64_t>(rows * padded, 1));
  at::parallel_for(0, batch * kv_heads, grain, [&](int64_t first, int64_t last) {
    std::vector<float> scores(rows * padded);
    std::vector<int64_t> query_offsets(rows), mask_offsets(rows);
    for (int64_t task = first; task < last; ++task) {
      const int64_t b = task / kv_heads, g = task % kv_heads;
      const int64_t* slots = slot_data + b * context;
      for (int64_t r = 0; r < rows; ++r) {  // row r = (query i = r / group, head g * group + r % group)
        query_offsets[r] = ((b * width + r / group) * num_heads + g * group + r % group) * head_dim;
        mask_offsets[r] = (b * width + r / group) * context;
      }
      for (int64_t c = 0; c < padded; c += 8) {  // eight columns at a time (past the last: the last again, unused)
        const int64_t columns = std::min<int64_t>(8, context - c);
        const float* keys[8];
        for (int i = 0; i < 8; ++i) keys[i] = k_data + slots[c + std::min<int64_t>(i, columns - 1)] * stride + g * head_dim;
        for (int64_t r = 0; r < rows; ++r) {
          alignas(32) float bias[8];
          for (int i = 0; i < 8; ++i) bias[i] = i < columns ? mask_data[mask_offsets[r] + c + i] : kMinusInf;
          const vec8 biases = load8(bias);
          // a masked column scores -inf without its dot product (its slot may hold inf or nan)
          const vec8 s = dot8(q_data + query_offsets[r], keys, head_dim) * scale_f + biases;
          store8(scores.data() + r * padded + c, biases == kMinusInf ? biases : s);
        }
      }
      for (int64_t r = 0; r < rows; ++r) {  // scores -> e^(s - max), their sum, then the weighted values
        float* row = scores.data() + r * padded;
        float* dst = out_data + query_offsets[r];
        float top = kMinusInf;
        for (int64_t c = 0; c < context; ++c) top = row[c] > top ? row[c] : top;
        if (top == kMinusInf) {  // a query that sees nothing: a zero output
          std::fill(dst, dst + head_dim, 0.0f);
          continue;
        }
        // eight columns at a time, the padding weighing 0: a column's weight and its place in the sum are
        // the same whatever the batch's context length past the request's own
        vec8 total{};
        for (int64_t c = 0; c < padded; c += 8) {
          const vec8 e = exp8(load8(row + c) - top);
          store8(row + c, e);
          total += e;
        }
        const float inverse = 1.0f / lane_sum(total);
        const float* values = v_data + g * head_dim;
        const int64_t vectorised = head_dim / 8 * 8;
        for (int64_t j = 0; j < vectorised; j += 64) {  // up to 8 vectors of the output at a time, in registers
          const int vectors = static_cast<int>(std::min<int64_t>(8, (vectorised - j) / 8));
          run_weighted_sum(vectors, row, slots, context, values + j, stride, dst + j);
        }
        for (int64_t jj = vectorised; jj < head_dim; ++jj) {  // the last head_dim % 8
          float sum = 0.0f;
          for (int64_t c = 0; c < context; ++c) {
            if (row[c] != 0.0f) sum += row[c] * values[slots[c] * stride + jj];
          }
          dst[jj] = sum;
        }
        for (int64_t jj = 0; jj < head_dim; ++jj) dst[jj] *= inverse;
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
