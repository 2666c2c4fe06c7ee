// What the small-batch block GEMMs share: how threads split the output into tiles, checking the bias and
// residual they add, and storing a tile's sums into the output with them.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <optional>

namespace eyas_block {

struct Epilogue {
  const float* bias;      // [N] or null
  const float* residual;  // [M, N] or null
};

inline Epilogue epilogue(const char* op, int64_t m_size, int64_t n, const std::optional<at::Tensor>& bias,
                         const std::optional<at::Tensor>& residual) {
  Epilogue e{nullptr, nullptr};
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n, op,
                ": bias must be a contiguous float32 [N]");
    e.bias = bias->data_ptr<float>();
  }
  if (residual.has_value()) {
    TORCH_CHECK(residual->scalar_type() == at::kFloat && residual->is_contiguous() && residual->dim() == 2 &&
                    residual->size(0) == m_size && residual->size(1) == n,
                op, ": residual must be a contiguous float32 [M, N]");
    e.residual = residual->data_ptr<float>();
  }
  return e;
}

// out[row0 + r, col + j] = acc[r * stride + j] (+ bias[col + j]) (+ residual[row0 + r, col + j]), r < rows, j < cols
inline void store_tile(const float* acc, int64_t stride, int rows, int64_t cols, int64_t row0, int64_t col, int64_t n,
                       const Epilogue& e, float* out) {
  for (int r = 0; r < rows; ++r) {
    float* dst = out + (row0 + r) * n + col;
    const float* res = e.residual == nullptr ? nullptr : e.residual + (row0 + r) * n + col;
    for (int64_t j = 0; j < cols; ++j) {
      float v = acc[r * stride + j];
      if (e.bias != nullptr) v += e.bias[col + j];
      if (res != nullptr) v += res[j];
      dst[j] = v;
    }
  }
}

// Threads take equal runs of the blocks of 16 columns; a thread's run goes in tiles of up to `tile` rows
// and `per_tile(rows)` blocks side by side: fn(rows, row0, first block, blocks).
template <typename PerTile, typename Fn>
inline void for_each_tile(int64_t blocks, int64_t m_size, int64_t tile, PerTile per_tile, Fn fn) {
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t m = 0; m < m_size; m += tile) {
      const int rows = static_cast<int>(std::min(tile, m_size - m));
      for (int64_t b = first; b < last;) {
        const int width = static_cast<int>(std::min<int64_t>(per_tile(rows), last - b));
        fn(rows, m, b, width);
        b += width;
      }
    }
  });
}

}  // namespace eyas_block
