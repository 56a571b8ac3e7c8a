// The row loop for CPUs with AVX-512 F, BW, VL and DQ (Skylake-SP, Zen 4 and later): 16 float
// lanes and the hand-written loads and stores of avx512.inc, bfloat16 rounded as integer work.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "rope.h"

#if defined(__x86_64__) || defined(_M_X64)
#if defined(__clang__)
#pragma clang attribute push(                                                              \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"))), \
    apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512")
#endif

#define POSEMB_NS avx512
#include "avx512.inc"

#define POSEMB_F16C 1
#define POSEMB_ROW_SIMD row_simd
#define POSEMB_VARIANT kAvx512
#define POSEMB_NAME "avx512"
#include "rows.inc"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
