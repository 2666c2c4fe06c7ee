// Small-batch GEMM over a GGUF file's Q4_0 / Q4_1 / Q8_0 blocks with int8 activations: integer dot products
// per group of 32 input features, as llama.cpp multiplies these types.
//
//   x: [M, K] float32, contiguous (K a multiple of 32)
//   codes: [N / 16 blocks, K / 32 groups, 256 or 512] uint8: a group's codes of the block's 16 columns in
//          64-byte rows of [16 columns, 4 inputs]; 4-bit: row p holds inputs 8p .. 8p+3 in the low nibbles and
//          8p+4 .. 8p+7 in the high ones; 8-bit: row p holds inputs 4p .. 4p+3 (a Q8_0 code plus 128)
//   scales, offsets: [N / 16 blocks, K / 32, 16] float16; a weight is code * scale + offset
//   bias: [N] or none; residual: [M, N] or none
//   -> out [M, N] = x @ W^T (+ bias) (+ residual)
//
// Each row of x is quantized per group to int8 (scale dx = max |x| / 127, codes rounded to nearest even),
// as llama.cpp's Q8 activations are; a group then adds exactly  dx * scale * sum(code * xq) + offset * dx *
// sum(xq)  to the output, the integer sums exact and the two float steps fused multiply-adds in group order.
// A row's result does not depend on the other rows of the call, and the AVX2 and portable loops compute
// the same bits as the AVX-512 VNNI one (the integer sums are exact in any order; the float steps alike).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "block_epilogue.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define EYAS_DOT_VNNI 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define EYAS_DOT_AVX2 1
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kBlock = 16;  // output columns per block
constexpr int64_t kGroup = 32;  // input features per scale
constexpr int64_t kTile = 4;    // rows per tile
constexpr int64_t kMaxSide = 4;  // blocks side by side in a tile, at most

// x's rows quantized per group: xq [M, K] int8, dx [M, G] (the group's scale), sx [M, G] (sum(xq)), dxs [M, G]
// (dx * sum(xq))
struct QuantizedRows {
  std::vector<int8_t> xq;
  std::vector<float> dx, dxs;
  std::vector<int32_t> sx;
};

QuantizedRows quantize_rows(const float* x, int64_t m_size, int64_t k_size) {
  const int64_t groups = k_size / kGroup;
  QuantizedRows q{std::vector<int8_t>(m_size * k_size), std::vector<float>(m_size * groups),
                  std::vector<float>(m_size * groups), std::vector<int32_t>(m_size * groups)};
  for (int64_t i = 0; i < m_size * groups; ++i) {
    const float* v = x + i * kGroup;
    float amax = 0.0f;
    for (int64_t k = 0; k < kGroup; ++k) amax = std::max(amax, std::fabs(v[k]));
    const float d = amax / 127.0f, inverse = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (int64_t k = 0; k < kGroup; ++k) {
      const int32_t c = static_cast<int32_t>(std::nearbyint(v[k] * inverse));
      q.xq[i * kGroup + k] = static_cast<int8_t>(c);
      sum += c;
    }
    q.dx[i] = d;
    q.sx[i] = sum;
    q.dxs[i] = d * static_cast<float>(sum);
  }
  return q;
}

// the integer dot product of one column's group codes with a row's 32 xq (portable path)
template <int Bits>
inline int32_t group_dot(const uint8_t* group, int column, const int8_t* xq) {
  int32_t sum = 0;
  for (int p = 0; p < (Bits == 4 ? 4 : 8); ++p) {
    const uint8_t* row = group + p * 64 + column * 4;
    for (int t = 0; t < 4; ++t) {
      if (Bits == 4) {
        sum += static_cast<int32_t>(row[t] & 15) * xq[8 * p + t];
        sum += static_cast<int32_t>(row[t] >> 4) * xq[8 * p + 4 + t];
      } else {
        sum += static_cast<int32_t>(row[t]) * xq[4 * p + t];
      }
    }
  }
  return sum;
}

template <int Bits>
void tile_portable(int rows, int blocks, const QuantizedRows& q, int64_t row0, int64_t k_size, const uint8_t* codes,
                   int64_t block_bytes, const c10::Half* scales, const c10::Half* offsets, int64_t block_params,
                   float* acc) {
  const int64_t groups = k_size / kGroup, group_bytes = Bits == 4 ? 256 : 512;
  for (int r = 0; r < rows; ++r) {
    for (int b = 0; b < blocks; ++b) {
      for (int j = 0; j < kBlock; ++j) {
        float a = 0.0f;
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t i = (row0 + r) * groups + g, p = b * block_params + g * kBlock + j;
          const int32_t dot = group_dot<Bits>(codes + b * block_bytes + g * group_bytes, j,
                                              q.xq.data() + (row0 + r) * k_size + g * kGroup);
          a = std::fma(static_cast<float>(dot), static_cast<float>(scales[p]) * q.dx[i], a);
          a = std::fma(static_cast<float>(offsets[p]), q.dxs[i], a);
        }
        acc[(r * blocks + b) * kBlock + j] = a;
      }
    }
  }
}

#if defined(EYAS_DOT_VNNI)
inline __m512 halves16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

inline __m512i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// acc [R, B * 16]: two integer sums per row and block (low and high input quads) keep 2 * R * B
// dot-product chains in flight; integer sums are exact in any order
template <int R, int B, int Bits>
void tile_vnni(const QuantizedRows& q, int64_t row0, int64_t k_size, const uint8_t* codes, int64_t block_bytes,
               const c10::Half* scales, const c10::Half* offsets, int64_t block_params, float* acc_out) {
  const int64_t groups = k_size / kGroup, group_bytes = Bits == 4 ? 256 : 512;
  const __m512i nibble = _mm512_set1_epi8(15);
  __m512 acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512i lo_sum[R][B], hi_sum[R][B];
    for (int r = 0; r < R; ++r)
      for (int b = 0; b < B; ++b) lo_sum[r][b] = hi_sum[r][b] = _mm512_setzero_si512();
    const int8_t* xq[R];
    for (int r = 0; r < R; ++r) xq[r] = q.xq.data() + (row0 + r) * k_size + g * kGroup;
    const uint8_t* group[B];
    for (int b = 0; b < B; ++b) {
      group[b] = codes + b * block_bytes + g * group_bytes;
      _mm_prefetch(reinterpret_cast<const char*>(group[b] + 4 * group_bytes), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(group[b] + 4 * group_bytes + 128), _MM_HINT_T0);
    }
    if constexpr (Bits == 4) {
      for (int p = 0; p < 4; ++p) {
        __m512i lo[B], hi[B];
        for (int b = 0; b < B; ++b) {
          const __m512i v = _mm512_loadu_si512(group[b] + p * 64);
          lo[b] = _mm512_and_si512(v, nibble);
          hi[b] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
        }
        for (int r = 0; r < R; ++r) {
          const __m512i xa = broadcast4(xq[r] + 8 * p), xb = broadcast4(xq[r] + 8 * p + 4);
          for (int b = 0; b < B; ++b) {
            lo_sum[r][b] = _mm512_dpbusd_epi32(lo_sum[r][b], lo[b], xa);
            hi_sum[r][b] = _mm512_dpbusd_epi32(hi_sum[r][b], hi[b], xb);
          }
        }
      }
    } else {
      for (int p = 0; p < 8; p += 2) {
        __m512i even[B], odd[B];
        for (int b = 0; b < B; ++b) {
          even[b] = _mm512_loadu_si512(group[b] + p * 64);
          odd[b] = _mm512_loadu_si512(group[b] + p * 64 + 64);
        }
        for (int r = 0; r < R; ++r) {
          const __m512i xa = broadcast4(xq[r] + 4 * p), xb = broadcast4(xq[r] + 4 * p + 4);
          for (int b = 0; b < B; ++b) {
            lo_sum[r][b] = _mm512_dpbusd_epi32(lo_sum[r][b], even[b], xa);
            hi_sum[r][b] = _mm512_dpbusd_epi32(hi_sum[r][b], odd[b], xb);
          }
        }
      }
    }
    for (int b = 0; b < B; ++b) {
      const __m512 scale = halves16(scales + b * block_params + g * kBlock);
      const __m512 offset = halves16(offsets + b * block_params + g * kBlock);
      for (int r = 0; r < R; ++r) {
        const int64_t i = (row0 + r) * groups + g;
        const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(lo_sum[r][b], hi_sum[r][b]));
        acc[r][b] = _mm512_fmadd_ps(dot, _mm512_mul_ps(scale, _mm512_set1_ps(q.dx[i])), acc[r][b]);
        acc[r][b] = _mm512_fmadd_ps(offset, _mm512_set1_ps(q.dxs[i]), acc[r][b]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) _mm512_storeu_ps(acc_out + (r * B + b) * kBlock, acc[r][b]);
}

template <int B, int Bits>
void vnni_rows(int rows, const QuantizedRows& q, int64_t row0, int64_t k_size, const uint8_t* codes,
               int64_t block_bytes, const c10::Half* scales, const c10::Half* offsets, int64_t block_params,
               float* acc) {
  switch (rows) {
    case 4: return tile_vnni<4, B, Bits>(q, row0, k_size, codes, block_bytes, scales, offsets, block_params, acc);
    case 3: return tile_vnni<3, B, Bits>(q, row0, k_size, codes, block_bytes, scales, offsets, block_params, acc);
    case 2: return tile_vnni<2, B, Bits>(q, row0, k_size, codes, block_bytes, scales, offsets, block_params, acc);
    default: return tile_vnni<1, B, Bits>(q, row0, k_size, codes, block_bytes, scales, offsets, block_params, acc);
  }
}
#endif

#if defined(EYAS_DOT_AVX2)
// AVX2 has no 4-byte dot product: maddubs sums byte pairs into int16 (exact while a pair stays within
// 32767: 4-bit codes times int8 do; 8-bit codes are taken as |w| against sign(w) * xq, at most 2 * 128 * 127)
// and madd sums int16 pairs into int32. A block's 16 columns are two 8-lane halves.
inline __m256i dot4(__m256i sum, __m256i a, __m256i b) {
  return _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)));
}

inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// A group's exact int32 dot products [R][B][2] (8 lanes each) into the float32 sums: scaled by the block's
// scale times the row's activation scale, plus the block's offset times the row's scaled activation sum.
template <int R, int B>
inline void add_group(__m256 (&acc)[R][B][2], const __m256i (&dot)[R][B][2], const QuantizedRows& q, int64_t row0,
                      int64_t groups, int64_t g, const c10::Half* scales, const c10::Half* offsets,
                      int64_t block_params) {
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < 2; ++h) {
      const int64_t p = b * block_params + g * kBlock + 8 * h;
      const __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + p)));
      const __m256 offset = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(offsets + p)));
      for (int r = 0; r < R; ++r) {
        const int64_t i = (row0 + r) * groups + g;
        acc[r][b][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][b][h]),
                                       _mm256_mul_ps(scale, _mm256_set1_ps(q.dx[i])), acc[r][b][h]);
        acc[r][b][h] = _mm256_fmadd_ps(offset, _mm256_set1_ps(q.dxs[i]), acc[r][b][h]);
      }
    }
  }
}

template <int R, int B>
inline void store_tile(const __m256 (&acc)[R][B][2], float* acc_out) {
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < 2; ++h) _mm256_storeu_ps(acc_out + (r * B + b) * kBlock + 8 * h, acc[r][b][h]);
}

// 4-bit codes: a byte pair's products stay within 2 * 15 * 127 = 3810, so a group's 8 maddubs results are summed
// in int16 (at most 30480, exact) and widened once per group: one add a step instead of madd and add, and the
// row broadcasts are taken once per step for every block. 4 rows x 1 block keeps its 8 sums, 4 broadcasts,
// the codes and the mask in 14 of AVX2's 16 registers.
template <int R, int B>
void tile_avx2_q4(const QuantizedRows& q, int64_t row0, int64_t k_size, const uint8_t* codes, int64_t block_bytes,
                  const c10::Half* scales, const c10::Half* offsets, int64_t block_params, float* acc_out) {
  const int64_t groups = k_size / kGroup;
  const __m256i nibble = _mm256_set1_epi8(15);
  __m256 acc[R][B][2];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b][0] = acc[r][b][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m256i sum[R][B][2];
    for (int r = 0; r < R; ++r)
      for (int b = 0; b < B; ++b) sum[r][b][0] = sum[r][b][1] = _mm256_setzero_si256();
    const int8_t* xq[R];
    for (int r = 0; r < R; ++r) xq[r] = q.xq.data() + (row0 + r) * k_size + g * kGroup;
    for (int p = 0; p < 8; ++p) {  // the low nibbles of row p / 2 for even p, the high ones for odd
      __m256i x[R];
      for (int r = 0; r < R; ++r) x[r] = broadcast4(xq[r] + 4 * p);
      for (int b = 0; b < B; ++b) {
        const uint8_t* row = codes + b * block_bytes + g * 256 + (p / 2) * 64;
        for (int h = 0; h < 2; ++h) {
          __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 32 * h));
          w = _mm256_and_si256(p % 2 ? _mm256_srli_epi16(w, 4) : w, nibble);
          for (int r = 0; r < R; ++r) sum[r][b][h] = _mm256_add_epi16(sum[r][b][h], _mm256_maddubs_epi16(w, x[r]));
        }
      }
    }
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r = 0; r < R; ++r)
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < 2; ++h) sum[r][b][h] = _mm256_madd_epi16(sum[r][b][h], ones);  // int16 -> int32
    add_group<R, B>(acc, sum, q, row0, groups, g, scales, offsets, block_params);
  }
  store_tile<R, B>(acc, acc_out);
}

template <int R, int B, int Bits>
void tile_avx2(const QuantizedRows& q, int64_t row0, int64_t k_size, const uint8_t* codes, int64_t block_bytes,
               const c10::Half* scales, const c10::Half* offsets, int64_t block_params, float* acc_out) {
  if constexpr (Bits == 4) {
    return tile_avx2_q4<R, B>(q, row0, k_size, codes, block_bytes, scales, offsets, block_params, acc_out);
  }
  // 8-bit codes: taken as |w| against sign(w) * xq (at most 2 * 128 * 127 a byte pair), widened every step
  const int64_t groups = k_size / kGroup, group_bytes = 512;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 acc[R][B][2];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b][0] = acc[r][b][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m256i sum[R][B][2];
    for (int r = 0; r < R; ++r)
      for (int b = 0; b < B; ++b) sum[r][b][0] = sum[r][b][1] = _mm256_setzero_si256();
    const int8_t* xq[R];
    for (int r = 0; r < R; ++r) xq[r] = q.xq.data() + (row0 + r) * k_size + g * kGroup;
    for (int p = 0; p < 8; ++p) {
      __m256i x[R];  // taken once per step for every block
      for (int r = 0; r < R; ++r) x[r] = broadcast4(xq[r] + 4 * p);
      for (int b = 0; b < B; ++b) {
        const uint8_t* row = codes + b * block_bytes + g * group_bytes + p * 64;
        for (int h = 0; h < 2; ++h) {
          const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 32 * h));
          const __m256i signed_w = _mm256_xor_si256(w, flip);  // code - 128, the file's value
          const __m256i magnitude = _mm256_abs_epi8(signed_w);
          for (int r = 0; r < R; ++r) sum[r][b][h] = dot4(sum[r][b][h], magnitude, _mm256_sign_epi8(x[r], signed_w));
        }
      }
    }
    if (Bits == 8) {
      for (int r = 0; r < R; ++r) {
        const __m256i codes_offset = _mm256_set1_epi32(128 * q.sx[(row0 + r) * groups + g]);  // the codes' + 128
        for (int b = 0; b < B; ++b)
          for (int h = 0; h < 2; ++h) sum[r][b][h] = _mm256_add_epi32(sum[r][b][h], codes_offset);
      }
    }
    add_group<R, B>(acc, sum, q, row0, groups, g, scales, offsets, block_params);
  }
  store_tile<R, B>(acc, acc_out);
}

template <int B, int Bits>
void avx2_rows(int rows, const QuantizedRows& q, int64_t row0, int64_t k_size, const uint8_t* codes,
               int64_t block_bytes, const c10::Half* scales, const c10::Half* offsets, int64_t block_params,
               float* acc) {
  switch (rows) {
    case 4: return tile_avx2<4, B, Bits>(q, row0, k_size, codes, block_bytes, scales, offsets, block_params, acc);
    case 3: return tile_avx2<3, B, Bits>(q, row0, k_size, codes, block_bytes, scales, offsets, block_params, acc);
    case 2: return tile_avx2<2, B, Bits>(q, row0, k_size, codes, block_bytes, scales, offsets, block_params, acc);
    default: return tile_avx2<1, B, Bits>(q, row0, k_size, codes, block_bytes, scales, offsets, block_params, acc);
  }
}
#endif

// blocks side by side for a tile of `rows` rows
inline int blocks_per_tile(int rows) { return rows <= 1 ? 4 : (rows <= 2 ? 2 : 1); }

template <int Bits>
void run_tile(int rows, int blocks, const QuantizedRows& q, int64_t row0, int64_t k_size, const uint8_t* codes,
              int64_t block_bytes, const c10::Half* scales, const c10::Half* offsets, int64_t block_params,
              float* acc) {
#if defined(EYAS_DOT_VNNI)
  switch (blocks) {
    case 4: return vnni_rows<4, Bits>(rows, q, row0, k_size, codes, block_bytes, scales, offsets, block_params, acc);
    case 3: return vnni_rows<3, Bits>(rows, q, row0, k_size, codes, block_bytes, scales, offsets, block_params, acc);
    case 2: return vnni_rows<2, Bits>(rows, q, row0, k_size, codes, block_bytes, scales, offsets, block_params, acc);
    default: return vnni_rows<1, Bits>(rows, q, row0, k_size, codes, block_bytes, scales, offsets, block_params, acc);
  }
#elif defined(EYAS_DOT_AVX2)
  switch (blocks) {
    case 4: return avx2_rows<4, Bits>(rows, q, row0, k_size, codes, block_bytes, scales, offsets, block_params, acc);
    case 3: return avx2_rows<3, Bits>(rows, q, row0, k_size, codes, block_bytes, scales, offsets, block_params, acc);
    case 2: return avx2_rows<2, Bits>(rows, q, row0, k_size, codes, block_bytes, scales, offsets, block_params, acc);
    default: return avx2_rows<1, Bits>(rows, q, row0, k_size, codes, block_bytes, scales, offsets, block_params, acc);
  }
#else
  tile_portable<Bits>(rows, blocks, q, row0, k_size, codes, block_bytes, scales, offsets, block_params, acc);
#endif
}

at::Tensor int8_dot_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                           const at::Tensor& offsets, int64_t bits, int64_t out_features,
                           const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& residual) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(),
              "int8_dot_linear: x must be a contiguous float32 CPU matrix [M, K]");
  TORCH_CHECK(bits == 4 || bits == 8, "int8_dot_linear: bits must be 4 or 8, got ", bits);
  const int64_t m_size = x.size(0), k_size = x.size(1), n = out_features, blocks = (n + kBlock - 1) / kBlock;
  TORCH_CHECK(k_size % kGroup == 0, "int8_dot_linear: K must be a multiple of 32, got ", k_size);
  const int64_t groups = k_size / kGroup, group_bytes = bits == 4 ? 256 : 512;
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.dim() == 3 &&
                  codes.size(0) == blocks && codes.size(1) == groups && codes.size(2) == group_bytes,
              "int8_dot_linear: codes must be contiguous uint8 [ceil(N / 16), K / 32, ", group_bytes, "]");
  for (const at::Tensor* t : {&scales, &offsets}) {
    TORCH_CHECK(t->scalar_type() == at::kHalf && t->is_contiguous() && t->dim() == 3 && t->size(0) == blocks &&
                    t->size(1) == groups && t->size(2) == kBlock,
                "int8_dot_linear: scales and offsets must be contiguous float16 [ceil(N / 16), K / 32, 16]");
  }
  const eyas_block::Epilogue added = eyas_block::epilogue("int8_dot_linear", m_size, n, bias, residual);
  at::Tensor out = at::empty({m_size, n}, x.options());
  if (m_size == 0 || n == 0) return out;
  const QuantizedRows q = quantize_rows(x.data_ptr<float>(), m_size, k_size);
  const uint8_t* code_data = codes.data_ptr<uint8_t>();
  const c10::Half* scale_data = scales.data_ptr<c10::Half>();
  const c10::Half* offset_data = offsets.data_ptr<c10::Half>();
  const int64_t block_bytes = groups * group_bytes, block_params = groups * kBlock;
  float* out_data = out.data_ptr<float>();
  eyas_block::for_each_tile(blocks, m_size, kTile, blocks_per_tile,
                            [&](int rows, int64_t m, int64_t b, int width) {
    alignas(64) float acc[kTile * kMaxSide * kBlock];
    const uint8_t* block = code_data + b * block_bytes;
    const c10::Half* block_scales = scale_data + b * block_params;
    const c10::Half* block_offsets = offset_data + b * block_params;
    if (bits == 4) {
      run_tile<4>(rows, width, q, m, k_size, block, block_bytes, block_scales, block_offsets, block_params, acc);
    } else {
      run_tile<8>(rows, width, q, m, k_size, block, block_bytes, block_scales, block_offsets, block_params, acc);
    }
    const int64_t col = b * kBlock;
    eyas_block::store_tile(acc, width * kBlock, rows, std::min(width * kBlock, n - col), m, col, n, added, out_data);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(eyas_cpu, m) {
  m.def("int8_dot_linear(Tensor x, Tensor codes, Tensor scales, Tensor offsets, int bits, int out_features, "
        "Tensor? bias=None, Tensor? residual=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(eyas_cpu, CPU, m) { m.impl("int8_dot_linear", &int8_dot_linear); }
