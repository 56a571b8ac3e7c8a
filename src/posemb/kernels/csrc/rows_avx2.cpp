// The row loop for CPUs with AVX2, FMA and F16C (Haswell, Zen 1 and later): 8 float lanes,
// fused multiply-adds, hardware float16 conversions, and hand-written vector code for whole
// vectors of pairs. GCC's own vectorisation of the generic loop left bfloat16 at ~5x the
// time of x.mul_ (the rounding and the 32->16 bit narrowing came out as scalar shuffles);
// these loads and stores are what it should have been.
#include <immintrin.h>

#include <algorithm>

#include <cstdint>

#include "rope.h"

#if defined(__x86_64__) || defined(_M_X64)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

namespace posemb {
namespace avx2 {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load8(const f16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }

// Each lane of v rounded to bfloat16 (nearest even, as the scalar store), left in the lane's
// high 16 bits with the low ones zero. A NaN keeps its top bits and is made quiet; lanes are
// checked for NaN first, so finite data skips the blend.
inline __m256i round_bf16_high(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m256i bits = _mm256_and_si256(
      _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), high);
  const __m256 unordered = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  if (__builtin_expect(_mm256_movemask_ps(unordered) != 0, 0)) {
    const __m256i nan = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x400000)), high);
    bits = _mm256_blendv_epi8(bits, nan, _mm256_castps_si256(unordered));
  }
  return bits;
}

inline void store8(bf16* p, __m256 v) {
  const __m256i bits = _mm256_srli_epi32(round_bf16_high(v), 16);
  // Every lane is < 2^16, so unsigned saturation narrows exactly.
  const __m128i packed =
      _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
inline void store8(f16* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

// Pairs (j, j + n): a and b are 8 pairs' first and second coordinates.
template <typename T>
int64_t rows_half(const T* src, T* dst, const float* c, const float* s, int64_t n, float sign) {
  const __m256 sg = _mm256_set1_ps(sign);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 a = load8(src + j), b = load8(src + n + j);
    const __m256 cj = _mm256_loadu_ps(c + j), sj = _mm256_mul_ps(sg, _mm256_loadu_ps(s + j));
    store8(dst + j, _mm256_fmsub_ps(a, cj, _mm256_mul_ps(b, sj)));
    store8(dst + n + j, _mm256_fmadd_ps(b, cj, _mm256_mul_ps(a, sj)));
  }
  return j;
}

// Pairs (2j, 2j + 1), 8 pairs at a time: two vectors are split into their first and second
// coordinates (the split mixes the pairs' order within 128-bit lanes, and the cos/sin
// vectors are permuted to match), rotated as in rows_half, and interleaved back.
template <typename T>
int64_t rows_interleaved(const T* src, T* dst, const float* c, const float* s, int64_t n,
                         float sign) {
  const __m256 sg = _mm256_set1_ps(sign);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 x0 = load8(src + 2 * j), x1 = load8(src + 2 * j + 8);
    // a = (a0 a1 a4 a5 | a2 a3 a6 a7), b likewise: pair order 0 1 4 5 2 3 6 7.
    const __m256 a = _mm256_shuffle_ps(x0, x1, 0x88), b = _mm256_shuffle_ps(x0, x1, 0xDD);
    const __m256 cj = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_loadu_ps(c + j)), 0xD8));
    const __m256 sj = _mm256_mul_ps(
        sg, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_loadu_ps(s + j)), 0xD8)));
    const __m256 ra = _mm256_fmsub_ps(a, cj, _mm256_mul_ps(b, sj));
    const __m256 rb = _mm256_fmadd_ps(b, cj, _mm256_mul_ps(a, sj));
    store8(dst + 2 * j, _mm256_unpacklo_ps(ra, rb));      // pairs 0 1 | 2 3
    store8(dst + 2 * j + 8, _mm256_unpackhi_ps(ra, rb));  // pairs 4 5 | 6 7
  }
  return j;
}

// bfloat16 pairs (2j, 2j + 1) are one 32-bit word each, b in the high half: a shift and a
// mask give both coordinates as floats, and the rounded results are put back the same way,
// with no shuffle at all (the generic split above cost 1.5-1.6x x.mul_, all on one port).
inline int64_t rows_interleaved(const bf16* src, bf16* dst, const float* c, const float* s,
                                int64_t n, float sign) {
  const __m256 sg = _mm256_set1_ps(sign);
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * j));
    const __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    const __m256 b = _mm256_castsi256_ps(_mm256_and_si256(x, high));
    const __m256 cj = _mm256_loadu_ps(c + j), sj = _mm256_mul_ps(sg, _mm256_loadu_ps(s + j));
    const __m256 ra = _mm256_fmsub_ps(a, cj, _mm256_mul_ps(b, sj));
    const __m256 rb = _mm256_fmadd_ps(b, cj, _mm256_mul_ps(a, sj));
    const __m256i bits =
        _mm256_or_si256(_mm256_srli_epi32(round_bf16_high(ra), 16), round_bf16_high(rb));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * j), bits);
  }
  return j;
}

template <typename T, bool Interleaved>
inline int64_t row_simd(const T* src, T* dst, const float* c, const float* s, int64_t n,
                        float sign) {
  if constexpr (Interleaved) {
    return rows_interleaved(src, dst, c, s, n, sign);
  } else {
    return rows_half(src, dst, c, s, n, sign);
  }
}

}  // namespace avx2
}  // namespace posemb

#define POSEMB_F16C 1
#define POSEMB_ROW_SIMD row_simd
#define POSEMB_NS avx2
#define POSEMB_VARIANT kAvx2
#define POSEMB_NAME "avx2"
#include "rows.inc"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
