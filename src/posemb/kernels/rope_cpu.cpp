// Fused RoPE for CPU tensors: one read and one write of x, float32 arithmetic.
//
// Why this is fast: RoPE is memory-bound (4 flops per 2 elements), so the only cost that
// matters is traffic. The eager form x*cos + rotate_half(x)*sin reads x three times and writes
// four temporaries; this loop reads each element once, rotates the pair in registers and
// writes it back (in place: into the same cache line it just read). Rows are split over
// threads with at::parallel_for; the inner loop over pairs is written so the compiler
// vectorises it (contiguous, branch-free, conversions as bit operations).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>

namespace {

inline float load(const float* p) { return *p; }
inline void store(float* p, float v) { *p = v; }

// bfloat16 is the top half of a float32: widening is a shift. Bit casts (not memcpy) keep
// the loop vectorisable.
inline float load(const at::BFloat16* p) {
  return __builtin_bit_cast(float, static_cast<uint32_t>(p->x) << 16);
}
// Round to nearest even; a NaN stays a (quiet) NaN instead of rounding up into infinity.
inline void store(at::BFloat16* p, float v) {
  const uint32_t u = __builtin_bit_cast(uint32_t, v);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  p->x = static_cast<uint16_t>(((u & 0x7FFFFFFFu) > 0x7F800000u) ? nan : rounded);
}

// float16 through the compiler's _Float16 (F16C instructions when built for them).
inline float load(const at::Half* p) {
  _Float16 h;
  std::memcpy(&h, p, 2);
  return static_cast<float>(h);
}
inline void store(at::Half* p, float v) {
  _Float16 h = static_cast<_Float16>(v);
  std::memcpy(p, &h, 2);
}

// One row: a = first, b = second coordinate of each pair; written to out (may be src).
// `#pragma omp simd` states what the compiler cannot prove when out may alias src: pair j
// reads and writes only its own two elements, so the iterations are independent.
template <typename T, bool Interleaved>
inline void rotate_row(const T* src, T* dst, const float* __restrict__ c,
                       const float* __restrict__ s, int64_t n, float sign) {
  constexpr int64_t step = Interleaved ? 2 : 1;
  const int64_t second = Interleaved ? 1 : n;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float a = load(src + step * j), b = load(src + step * j + second);
    const float sj = sign * s[j];
    store(dst + step * j, a * c[j] - b * sj);
    store(dst + step * j + second, b * c[j] + a * sj);
  }
}

template <typename T, bool Interleaved>
void rotate_rows(const T* x, T* out, const float* cos, const float* sin, int64_t B, int64_t H,
                 int64_t S, int64_t D, int64_t n, const int64_t* xs, const int64_t* os,
                 int64_t cos_batch_stride, float sign, bool copy_tail) {
  const int64_t rows = B * H * S;
  // ~16k elements per task keeps threads busy without oversubscribing small decode calls.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(D, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    // Rows run in (b, t, h) order, heads fastest: the cos/sin row of token t is loaded once
    // and stays in L1 for all heads, instead of the whole table streaming past once per head.
    int64_t h = begin % H, t = (begin / H) % S, b = begin / (S * H);
    for (int64_t r = begin; r < end; ++r) {
      // int64 offsets: a (4, 32, 32768, 128) tensor already has 2^29 elements.
      const T* xr = x + b * xs[0] + h * xs[1] + t * xs[2];
      T* orow = out + b * os[0] + h * os[1] + t * os[2];
      const float* c = cos + b * cos_batch_stride + t * n;
      const float* s = sin + b * cos_batch_stride + t * n;
      rotate_row<T, Interleaved>(xr, orow, c, s, n, sign);
      if (copy_tail && D > 2 * n) {
        std::memcpy(orow + 2 * n, xr + 2 * n, sizeof(T) * (D - 2 * n));
      }
      if (++h == H) {
        h = 0;
        if (++t == S) {
          t = 0;
          ++b;
        }
      }
    }
  });
}

// x, out: (B, H, S, D) with unit stride in D (they may be the same tensor: in place).
// cos, sin: float32, contiguous, (Bc, S, n) with Bc in {1, B}. conjugate rotates by -theta.
void rope_apply(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                torch::Tensor& out, bool interleaved, bool conjugate) {
  const int64_t B = x.size(0), H = x.size(1), S = x.size(2), D = x.size(3);
  const int64_t n = cos.size(2);
  const int64_t xs[3] = {x.stride(0), x.stride(1), x.stride(2)};
  const int64_t os[3] = {out.stride(0), out.stride(1), out.stride(2)};
  const int64_t cbs = cos.size(0) == 1 ? 0 : cos.stride(0);
  const bool copy_tail = !out.is_same(x);
  const float sign = conjugate ? -1.0f : 1.0f;
  AT_DISPATCH_SWITCH(x.scalar_type(), "posemb_rope_apply",
    AT_DISPATCH_CASE(at::kFloat, [&] {
      (interleaved ? rotate_rows<scalar_t, true> : rotate_rows<scalar_t, false>)(
          x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), cos.data_ptr<float>(),
          sin.data_ptr<float>(), B, H, S, D, n, xs, os, cbs, sign, copy_tail);
    })
    AT_DISPATCH_CASE(at::kBFloat16, [&] {
      (interleaved ? rotate_rows<scalar_t, true> : rotate_rows<scalar_t, false>)(
          x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), cos.data_ptr<float>(),
          sin.data_ptr<float>(), B, H, S, D, n, xs, os, cbs, sign, copy_tail);
    })
    AT_DISPATCH_CASE(at::kHalf, [&] {
      (interleaved ? rotate_rows<scalar_t, true> : rotate_rows<scalar_t, false>)(
          x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), cos.data_ptr<float>(),
          sin.data_ptr<float>(), B, H, S, D, n, xs, os, cbs, sign, copy_tail);
    }));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rope_apply", &rope_apply, "Rotate x into out (may alias) by cos/sin tables");
}
