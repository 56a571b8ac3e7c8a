// FIRE's bias over one tile of the blocked attention core, and the tile's gradient into FIRE's
// learned function (posemb/attention/scores.py, class Fire, says the math):
//
//   posemb::_fire_tile_cpu(x, breaks, slope, intercept, out!) -> ()
//       out[b, h, j] = slope[p, h] * x[b, j] + intercept[p, h], p = #{breaks < x[b, j]}
//   posemb::_fire_grads_cpu(ds, x, breaks, slope) -> (d_x, sums)
//       d_x[b, j] = sum_h ds[b, h, j] * slope[p, h];  sums (2, pieces, heads) float64:
//       sums[0, p, h] = sum ds * x and sums[1, p, h] = sum ds over the pairs in piece p
//
// x (B, n), ds and out (B, heads, n), breaks (m,) increasing, slope and intercept (m + 1,
// heads): contiguous CPU tensors of one dtype, float32 or float64. The torch path it replaces
// made three tile-sized tensors (two gathers and their sum) and a float64 copy of ds; this
// writes the tile once and reads ds once, which is most of FIRE's cost beside the attention.
//
// Each pair's piece is the previous pair's where that still fits (x changes slowly along a
// row, so pieces come in runs), else a binary search: searchsorted's answer either way (a NaN
// takes the last piece, as searchsorted puts it). The sums are taken per task in float64, a
// fixed number of tasks, added in task order: the result does not depend on scheduling.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

namespace posemb {
namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// Pairs a task takes at once: their pieces are found first, then each head's row is written
// (one linear stream per head).
constexpr int64_t kBlock = 256;
constexpr int64_t kTasks = 64;

template <typename T>
int64_t piece_of(T x, const T* b, int64_t m, int64_t hint) {
  if (x != x) return m;
  if ((hint == 0 || b[hint - 1] < x) && (hint == m || !(b[hint] < x))) return hint;
  int64_t lo = 0, hi = m;  // the first breakpoint not below x
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (b[mid] < x) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

void check(const Tensor& t, ScalarType dt, int64_t dims, const char* name) {
  STD_TORCH_CHECK(t.is_cpu() && t.is_contiguous() && t.scalar_type() == dt && t.dim() == dims,
                  "posemb::_fire_*_cpu: ", name, " must be a contiguous CPU tensor of ", dims,
                  " dimensions in x's dtype");
}

// Checks the shared inputs; returns (B, n, heads, m).
std::tuple<int64_t, int64_t, int64_t, int64_t> check_all(const Tensor& x, const Tensor& breaks,
                                                         const Tensor& slope) {
  const ScalarType dt = x.scalar_type();
  STD_TORCH_CHECK(dt == ScalarType::Float || dt == ScalarType::Double,
                  "posemb::_fire_*_cpu: x must be float32 or float64");
  check(x, dt, 2, "x");
  check(breaks, dt, 1, "breaks");
  check(slope, dt, 2, "slope");
  STD_TORCH_CHECK(slope.size(0) == breaks.size(0) + 1,
                  "posemb::_fire_*_cpu: slope must have one row per piece (breaks + 1)");
  return {x.size(0), x.size(1), slope.size(1), breaks.size(0)};
}

template <typename T>
void tile(const T* x, const T* b, int64_t m, const T* slope, const T* intercept, int64_t heads,
          int64_t B, int64_t n, T* out) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  torch::stable::parallel_for(0, B * blocks, 1, [&](int64_t first, int64_t last) {
    int64_t piece[kBlock];
    for (int64_t u = first; u < last; ++u) {
      const int64_t batch = u / blocks, j0 = (u % blocks) * kBlock;
      const int64_t len = std::min(kBlock, n - j0);
      const T* xs = x + batch * n + j0;
      int64_t hint = 0;
      for (int64_t j = 0; j < len; ++j) hint = piece[j] = piece_of(xs[j], b, m, hint);
      for (int64_t h = 0; h < heads; ++h) {
        T* row = out + (batch * heads + h) * n + j0;
        for (int64_t j = 0; j < len; ++j) {
          const int64_t at = piece[j] * heads + h;
          row[j] = slope[at] * xs[j] + intercept[at];
        }
      }
    }
  });
}

template <typename T>
void grads(const T* ds, const T* x, const T* b, int64_t m, const T* slope, int64_t heads,
           int64_t B, int64_t n, T* d_x, double* sums) {
  const int64_t pieces = m + 1, units = B * n;
  const int64_t tasks = std::max<int64_t>(1, std::min(kTasks, units / kBlock));
  const size_t size = static_cast<size_t>(2 * pieces * heads);
  std::vector<double> partial(static_cast<size_t>(tasks) * size, 0.0);
  torch::stable::parallel_for(0, tasks, 1, [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) {
      double* acc = partial.data() + t * size;
      int64_t hint = 0;
      for (int64_t u = units * t / tasks; u < units * (t + 1) / tasks; ++u) {
        const int64_t batch = u / n, j = u % n;
        const T xv = x[u];
        const int64_t p = hint = piece_of(xv, b, m, hint);
        const T* g = ds + batch * heads * n + j;
        T dx = 0;
        for (int64_t h = 0; h < heads; ++h) {
          const T gh = g[h * n];
          dx += gh * slope[p * heads + h];
          acc[p * heads + h] += static_cast<double>(gh) * static_cast<double>(xv);
          acc[(pieces + p) * heads + h] += static_cast<double>(gh);
        }
        d_x[u] = dx;
      }
    }
  });
  for (int64_t t = 0; t < tasks; ++t) {
    const double* acc = partial.data() + t * size;
    for (size_t i = 0; i < size; ++i) sums[i] += acc[i];
  }
}

void fire_tile_cpu(Tensor x, Tensor breaks, Tensor slope, Tensor intercept, Tensor out) {
  const auto [B, n, heads, m] = check_all(x, breaks, slope);
  check(intercept, x.scalar_type(), 2, "intercept");
  check(out, x.scalar_type(), 3, "out");
  STD_TORCH_CHECK(intercept.size(0) == m + 1 && intercept.size(1) == heads && out.size(0) == B &&
                      out.size(1) == heads && out.size(2) == n,
                  "posemb::_fire_tile_cpu: intercept must be (pieces, heads) and out (B, heads, n)");
  if (B * n == 0 || heads == 0) return;
  if (x.scalar_type() == ScalarType::Float) {
    tile(static_cast<const float*>(x.const_data_ptr()),
         static_cast<const float*>(breaks.const_data_ptr()), m,
         static_cast<const float*>(slope.const_data_ptr()),
         static_cast<const float*>(intercept.const_data_ptr()), heads, B, n,
         static_cast<float*>(out.mutable_data_ptr()));
  } else {
    tile(static_cast<const double*>(x.const_data_ptr()),
         static_cast<const double*>(breaks.const_data_ptr()), m,
         static_cast<const double*>(slope.const_data_ptr()),
         static_cast<const double*>(intercept.const_data_ptr()), heads, B, n,
         static_cast<double*>(out.mutable_data_ptr()));
  }
}

std::tuple<Tensor, Tensor> fire_grads_cpu(Tensor ds, Tensor x, Tensor breaks, Tensor slope) {
  const auto [B, n, heads, m] = check_all(x, breaks, slope);
  check(ds, x.scalar_type(), 3, "ds");
  STD_TORCH_CHECK(ds.size(0) == B && ds.size(1) == heads && ds.size(2) == n,
                  "posemb::_fire_grads_cpu: ds must be (B, heads, n) for x (B, n)");
  Tensor d_x = torch::stable::new_empty(x, std::vector<int64_t>{B, n});
  Tensor sums =
      torch::stable::new_empty(x, std::vector<int64_t>{2, m + 1, heads}, ScalarType::Double);
  torch::stable::zero_(sums);
  if (B * n == 0 || heads == 0) {
    torch::stable::zero_(d_x);
    return {d_x, sums};
  }
  double* s = static_cast<double*>(sums.mutable_data_ptr());
  if (x.scalar_type() == ScalarType::Float) {
    grads(static_cast<const float*>(ds.const_data_ptr()),
          static_cast<const float*>(x.const_data_ptr()),
          static_cast<const float*>(breaks.const_data_ptr()), m,
          static_cast<const float*>(slope.const_data_ptr()), heads, B, n,
          static_cast<float*>(d_x.mutable_data_ptr()), s);
  } else {
    grads(static_cast<const double*>(ds.const_data_ptr()),
          static_cast<const double*>(x.const_data_ptr()),
          static_cast<const double*>(breaks.const_data_ptr()), m,
          static_cast<const double*>(slope.const_data_ptr()), heads, B, n,
          static_cast<double*>(d_x.mutable_data_ptr()), s);
  }
  return {d_x, sums};
}

}  // namespace
}  // namespace posemb

STABLE_TORCH_LIBRARY_FRAGMENT(posemb, m) {
  m.def(
      "_fire_tile_cpu(Tensor x, Tensor breaks, Tensor slope, Tensor intercept, "
      "Tensor(a!) out) -> ()");
  m.def("_fire_grads_cpu(Tensor ds, Tensor x, Tensor breaks, Tensor slope) -> (Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(posemb, CPU, m) {
  m.impl("_fire_tile_cpu", TORCH_BOX(&posemb::fire_tile_cpu));
  m.impl("_fire_grads_cpu", TORCH_BOX(&posemb::fire_grads_cpu));
}
