// RMSNorm of float32 rows in one pass over each row: weight * (x / sqrt(mean(x^2) + eps)).
//
//   x: [N, H] float32, contiguous; weight: [H] float32 -> out [N, H]
//
// Why: the norm is six small tensor ops in PyTorch (square, sum, scale, rsqrt, two products), each a
// dispatch that costs more than its arithmetic at decode sizes. Each row's sum of squares runs in eight
// lanes in a fixed order and is then reduced in a fixed order, so a row gets the same bits alone or in any
// batch.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

typedef float vec8 __attribute__((vector_size(32)));

inline vec8 load8(const float* p) {
  vec8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store8(float* p, vec8 v) { std::memcpy(p, &v, sizeof v); }

void norm_row(const float* x, const float* w, float eps, int64_t h, float* out) {
  vec8 lanes{};
  int64_t j = 0;
  for (; j + 8 <= h; j += 8) {
    const vec8 v = load8(x + j);
    lanes += v * v;
  }
  float sum = 0.0f;
  for (int i = 0; i < 8; ++i) sum += lanes[i];
  for (; j < h; ++j) sum += x[j] * x[j];
  const float inverse = 1.0f / std::sqrt(sum / static_cast<float>(h) + eps);
  j = 0;
  for (; j + 8 <= h; j += 8) store8(out + j, load8(w + j) * (load8(x + j) * inverse));
  for (; j < h; ++j) out[j] = w[j] * (x[j] * inverse);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(),
              "rms_norm: x must be a contiguous float32 CPU matrix [N, H]");
  TORCH_CHECK(weight.dim() == 1 && weight.scalar_type() == at::kFloat && weight.is_contiguous() &&
                  weight.size(0) == x.size(1),
              "rms_norm: weight must be a contiguous float32 [H]");
  const int64_t n = x.size(0), h = x.size(1);
  at::Tensor out = at::empty({n, h}, x.options());
  const float* x_data = x.data_ptr<float>();
  const float* w_data = weight.data_ptr<float>();
  float* out_data = out.data_ptr<float>();
  const float e = static_cast<float>(eps);
  at::parallel_for(0, n, 64, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) norm_row(x_data + r * h, w_data, e, h, out_data + r * h);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(eyas_cpu, m) { m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor"); }

TORCH_LIBRARY_IMPL(eyas_cpu, CPU, m) { m.impl("rms_norm", &rms_norm); }
