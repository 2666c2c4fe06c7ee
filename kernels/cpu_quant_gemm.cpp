// Small-batch GEMM over a GGUF file's Q4_0 / Q4_1 / Q8_0 weights, decoded in registers as they are read.
//
//   x: [M, K] float32, contiguous
//   codes: 4-bit [N / 16 blocks, K, 8] uint8 (byte j: column j in the low nibble, column j + 8 in the high)
//          or 8-bit [N / 16 blocks, K, 16] int8
//   scales, offsets: [N / 16 blocks, K / 32, 16] float16 (offsets: 4-bit only); w = code * scale + offset
//   bias: [N] or none; residual: [M, N] or none
//   -> out [M, N] = x @ W^T (+ bias) (+ residual)
//
// A weight is decoded to float32 exactly (a float16 scale times a code of at most 8 bits needs at most 19
// of float32's 24 significant bits, and the offset is added in one rounding, as the file's dequantization
// adds it), then every output is one FMA chain over k = 0 .. K-1 in order, as `blocked_linear` runs it over
// the decoded weights: the two compute the same bits, and a row computes alike alone or in any batch.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "block_epilogue.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

typedef float vec8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
constexpr int64_t kBlock = 16;  // output columns per block: two vectors
constexpr int64_t kGroup = 32;  // input features per scale (GGUF's block size)
constexpr int64_t kTile = 6;    // rows per tile
constexpr int64_t kMaxSide = 4;  // blocks side by side in a tile, at most

inline vec8 load8(const float* p) {
  vec8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store8(float* p, vec8 v) { std::memcpy(p, &v, sizeof v); }

inline vec8 halves8(const c10::Half* p) {
#if defined(__F16C__)
  const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  vec8 out;
  std::memcpy(&out, &v, sizeof out);
  return out;
#else
  alignas(32) float tmp[8];
  for (int i = 0; i < 8; ++i) tmp[i] = static_cast<float>(p[i]);
  return load8(tmp);
#endif
}

// 8 bytes -> 8 int32, zero-extended (Signed false) or sign-extended; GCC's generic conversion of an
// 8-byte vector goes element by element, so AVX2's widening loads are named where the CPU has them
template <bool Signed>
inline i32x8 widen(const uint8_t* p) {
#if defined(__AVX2__)
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m256i wide = Signed ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes);
  i32x8 out;
  std::memcpy(&out, &wide, sizeof out);
  return out;
#else
  i32x8 out;
  for (int i = 0; i < 8; ++i) out[i] = Signed ? static_cast<int8_t>(p[i]) : p[i];
  return out;
#endif
}

inline vec8 to_float(i32x8 v) { return __builtin_convertvector(v, vec8); }

// acc [R, B * 16] = x[0:R, :] . B consecutive blocks' decoded weights; Bits 4 (codes [K, 8] a block) or 8
// ([K, 16]). Each output is its own FMA chain; B blocks side by side keep 2 * R * B chains in flight, which
// one row needs to hide the FMA latency (one block's two chains leave a decode waiting on it).
template <int R, int B, int Bits>
inline void tile(const float* x, int64_t k_size, const uint8_t* codes, int64_t block_bytes, const c10::Half* scales,
                 const c10::Half* offsets, int64_t block_params, float* acc) {
  constexpr int64_t row_bytes = Bits == 4 ? 8 : 16;
  vec8 lo[R][B], hi[R][B];
  for (int r = 0; r < R; ++r) {
    for (int b = 0; b < B; ++b) {
      lo[r][b] = vec8{};
      hi[r][b] = vec8{};
    }
  }
  for (int64_t g = 0; g < k_size / kGroup; ++g) {
    vec8 s_lo[B], s_hi[B], o_lo[B], o_hi[B];
    const uint8_t* group[B];
    for (int b = 0; b < B; ++b) {
      const int64_t p = b * block_params + g * kBlock;
      s_lo[b] = halves8(scales + p);
      s_hi[b] = halves8(scales + p + 8);
      o_lo[b] = Bits == 4 ? halves8(offsets + p) : vec8{};
      o_hi[b] = Bits == 4 ? halves8(offsets + p + 8) : vec8{};
      group[b] = codes + b * block_bytes + g * kGroup * row_bytes;
      __builtin_prefetch(group[b] + 4 * kGroup * row_bytes);
      if (Bits == 8) __builtin_prefetch(group[b] + 4 * kGroup * row_bytes + 64);
    }
    for (int64_t kk = 0; kk < kGroup; ++kk) {
      vec8 w_lo[B], w_hi[B];
      for (int b = 0; b < B; ++b) {
        vec8 q_lo, q_hi;
        if constexpr (Bits == 4) {
          const i32x8 bytes = widen<false>(group[b] + kk * 8);
          q_lo = to_float(bytes & 15);
          q_hi = to_float(bytes >> 4);
        } else {
          q_lo = to_float(widen<true>(group[b] + kk * 16));
          q_hi = to_float(widen<true>(group[b] + kk * 16 + 8));
        }
        w_lo[b] = q_lo * s_lo[b] + o_lo[b];
        w_hi[b] = q_hi * s_hi[b] + o_hi[b];
      }
      const int64_t k = g * kGroup + kk;
      for (int r = 0; r < R; ++r) {
        const float s = x[r * k_size + k];
        for (int b = 0; b < B; ++b) {
          lo[r][b] += s * w_lo[b];
          hi[r][b] += s * w_hi[b];
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int b = 0; b < B; ++b) {
      store8(acc + (r * B + b) * kBlock, lo[r][b]);
      store8(acc + (r * B + b) * kBlock + 8, hi[r][b]);
    }
  }
}

template <int B, int Bits>
void run_rows(int rows, const float* x, int64_t k_size, const uint8_t* codes, int64_t block_bytes,
              const c10::Half* scales, const c10::Half* offsets, int64_t block_params, float* acc) {
  switch (rows) {
    case 6: return tile<6, B, Bits>(x, k_size, codes, block_bytes, scales, offsets, block_params, acc);
    case 5: return tile<5, B, Bits>(x, k_size, codes, block_bytes, scales, offsets, block_params, acc);
    case 4: return tile<4, B, Bits>(x, k_size, codes, block_bytes, scales, offsets, block_params, acc);
    case 3: return tile<3, B, Bits>(x, k_size, codes, block_bytes, scales, offsets, block_params, acc);
    case 2: return tile<2, B, Bits>(x, k_size, codes, block_bytes, scales, offsets, block_params, acc);
    default: return tile<1, B, Bits>(x, k_size, codes, block_bytes, scales, offsets, block_params, acc);
  }
}

// blocks side by side for a tile of `rows` rows: 2 * rows * blocks accumulators, at most 12 but at least 8
inline int blocks_per_tile(int rows) { return rows <= 1 ? 4 : (rows <= 3 ? 2 : 1); }

template <int Bits>
void run_tile(int rows, int blocks, const float* x, int64_t k_size, const uint8_t* codes, int64_t block_bytes,
              const c10::Half* scales, const c10::Half* offsets, int64_t block_params, float* acc) {
  switch (blocks) {
    case 4: return run_rows<4, Bits>(rows, x, k_size, codes, block_bytes, scales, offsets, block_params, acc);
    case 3: return run_rows<3, Bits>(rows, x, k_size, codes, block_bytes, scales, offsets, block_params, acc);
    case 2: return run_rows<2, Bits>(rows, x, k_size, codes, block_bytes, scales, offsets, block_params, acc);
    default: return run_rows<1, Bits>(rows, x, k_size, codes, block_bytes, scales, offsets, block_params, acc);
  }
}

at::Tensor quant_block_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                              const std::optional<at::Tensor>& offsets, int64_t out_features,
                              const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& residual) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(),
              "quant_block_linear: x must be a contiguous float32 CPU matrix [M, K]");
  const int64_t m_size = x.size(0), k_size = x.size(1), n = out_features, blocks = (n + kBlock - 1) / kBlock;
  TORCH_CHECK(k_size % kGroup == 0, "quant_block_linear: K must be a multiple of 32, got ", k_size);
  TORCH_CHECK(codes.dim() == 3 && codes.is_contiguous() && codes.size(0) == blocks && codes.size(1) == k_size &&
                  ((codes.scalar_type() == at::kByte && codes.size(2) == 8) ||
                   (codes.scalar_type() == at::kChar && codes.size(2) == 16)),
              "quant_block_linear: codes must be contiguous [ceil(N / 16), K, 8] uint8 or [ceil(N / 16), K, 16] int8");
  const int bits = codes.scalar_type() == at::kByte ? 4 : 8;
  auto check_params = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.scalar_type() == at::kHalf && t.is_contiguous() && t.dim() == 3 && t.size(0) == blocks &&
                    t.size(1) == k_size / kGroup && t.size(2) == kBlock,
                "quant_block_linear: ", name, " must be contiguous float16 [ceil(N / 16), K / 32, 16]");
  };
  check_params(scales, "scales");
  TORCH_CHECK(offsets.has_value() == (bits == 4), "quant_block_linear: 4-bit codes take offsets, 8-bit codes none");
  if (offsets.has_value()) check_params(*offsets, "offsets");
  const eyas_block::Epilogue added = eyas_block::epilogue("quant_block_linear", m_size, n, bias, residual);
  at::Tensor out = at::empty({m_size, n}, x.options());
  if (m_size == 0 || n == 0) return out;
  const float* x_data = x.data_ptr<float>();
  const uint8_t* code_data = static_cast<const uint8_t*>(codes.data_ptr());
  const c10::Half* scale_data = scales.data_ptr<c10::Half>();
  const c10::Half* offset_data = offsets.has_value() ? offsets->data_ptr<c10::Half>() : nullptr;
  const int64_t block_bytes = k_size * codes.size(2), block_params = (k_size / kGroup) * kBlock;
  float* out_data = out.data_ptr<float>();
  eyas_block::for_each_tile(blocks, m_size, kTile, blocks_per_tile,
                            [&](int rows, int64_t m, int64_t b, int width) {
    alignas(64) float acc[kTile * kMaxSide * kBlock];
    const uint8_t* block = code_data + b * block_bytes;
    const c10::Half* block_scales = scale_data + b * block_params;
    const c10::Half* block_offsets = offset_data == nullptr ? nullptr : offset_data + b * block_params;
    if (bits == 4) {
      run_tile<4>(rows, width, x_data + m * k_size, k_size, block, block_bytes, block_scales, block_offsets,
                  block_params, acc);
    } else {
      run_tile<8>(rows, width, x_data + m * k_size, k_size, block, block_bytes, block_scales, block_offsets,
                  block_params, acc);
    }
    const int64_t col = b * kBlock;
    eyas_block::store_tile(acc, width * kBlock, rows, std::min(width * kBlock, n - col), m, col, n, added, out_data);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(eyas_cpu, m) {
  m.def("quant_block_linear(Tensor x, Tensor codes, Tensor scales, Tensor? offsets, int out_features, "
        "Tensor? bias=None, Tensor? residual=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(eyas_cpu, CPU, m) { m.impl("quant_block_linear", &quant_block_linear); }
