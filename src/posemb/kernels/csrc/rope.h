// The fused CPU rotation, split in two so that the kernel can be compiled once per instruction
// set and chosen at run time:
//
//   rows.inc       the row loop (templates over dtype and pairing), compiled by rows_*.cpp
//                  once per instruction set; raw pointers only, no torch header
//   ops.cpp        the ops on PyTorch's stable ABI: argument checks, threads, registration,
//                  and the choice of variant
//
// This header is what the two halves agree on.
#pragma once

#include <cmath>
#include <cstdint>

namespace posemb {

// x and out are (B, H, S, D) with unit stride in D (out may be x: in place); cos and sin are
// float32, contiguous (Bc, S, n) with Bc in {1, B}; pairs are (j, j + n) or (2j, 2j + 1).
struct RotateArgs {
  const void* x;
  void* out;
  const float* cos;
  const float* sin;
  int64_t B, H, S, D, n;
  int64_t xs[3];            // strides of x in (B, H, S)
  int64_t os[3];            // strides of out
  int64_t cos_batch_stride;  // 0 when one table serves every batch row
  int64_t tile;              // tokens per work unit (see rotate_rows)
  int64_t group;             // heads per work unit (see rotate_rows)
  float sign;               // -1 rotates by -theta (the backward pass)
  bool copy_tail;           // out of place with partial rotary: copy channels past 2n
};

// Rotate work units [begin, end) of B * ceil(H / group) * ceil(S / tile) (see rows.inc).
using RowsFn = void (*)(const RotateArgs&, int64_t begin, int64_t end);

enum Dtype : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

// The half types as their bits: the row loops convert them themselves.
struct bf16 {
  uint16_t x;
};
struct f16 {
  uint16_t x;
};

// QK-norm + rotation (norm.inc): x and out (B, H, S, D) with unit stride in D, out may be x;
// w the float32 weight (D,) with any offset applied; the tables as in RotateArgs.
struct NormArgs {
  const void* x;
  void* out;
  const float* cos;
  const float* sin;
  const float* w;
  int64_t B, H, S, D, n;
  int64_t xs[3];
  int64_t os[3];
  int64_t cos_batch_stride;
  int64_t tile;
  float eps;
};

// Its backward: x the forward's input, g the incoming gradient, dx the input's (null: none).
struct NormBackwardArgs {
  const void* x;
  const void* g;
  void* dx;
  const float* cos;
  const float* sin;
  const float* w;
  int64_t B, H, S, D, n;
  int64_t xs[3];
  int64_t gs[3];
  int64_t ds[3];
  int64_t cos_batch_stride;
  int64_t tile;
  float eps;
};

// buf: scratch, none forward (null), 3 D floats backward; dw: D doubles of this task's weight
// gradient, accumulated into (null: none).
using NormFn = void (*)(const NormArgs&, int64_t begin, int64_t end, float* buf);
using NormBackwardFn = void (*)(const NormBackwardArgs&, int64_t begin, int64_t end, float* buf,
                                double* dw);

// One compiled variant: a row loop per dtype and pairing (index [dtype][interleaved]).
struct Variant {
  const char* name;
  RowsFn rows[3][2];
  NormFn norm[3][2];
  NormBackwardFn norm_backward[3][2];
};

// Defined in rows_<name>.cpp; only those compiled for this architecture exist.
extern const Variant kBaseline;
#if defined(__x86_64__) || defined(_M_X64)
extern const Variant kAvx2;
extern const Variant kAvx512;
extern const Variant kAvx512Bf16;
#define POSEMB_X86 1
#endif

}  // namespace posemb
