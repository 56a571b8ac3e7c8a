// posemb's fused CPU rotation as PyTorch ops, on the stable ABI (torch >= 2.10): built once,
// the library loads into any later torch without a rebuild, and it needs no Python headers.
//
//   posemb::rotate_cpu(q, k, cos, sin, k_cos?, k_sin?, interleaved, conjugate) -> (q', k')
//   posemb::rotate_cpu_(q!, k!, ...) -> ()            the same, in q's and k's own memory
//   posemb::_rotate_cpu_into(q, k, q_out!, k_out!, ...) -> ()   into given outputs (eager)
//
// Fake implementations and autograd are registered from Python (posemb/kernels/ops.py).
//
// The row loop is compiled once per instruction set (rows_*.cpp); the variant is picked at the
// first call from what this CPU can execute, never from the machine that compiled it, and can
// be set from Python through the extern "C" functions at the end.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>
#include <torch/headeronly/version.h>

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <utility>
#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>

#include "rope.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

#if defined(__GLIBC__) && __has_include(<sys/single_threaded.h>)
// libstdc++ reads glibc's __libc_single_threaded (GLIBC_2.32) to skip atomic reference counts
// in a process that has no threads. That one symbol alone lifted the wheel's manylinux tag from
// 2_24 to 2_34, above torch's own 2_28. A hidden definition here answers the library's own
// references with "threads may exist", so it always counts atomically: always correct, and what
// glibc says anyway once torch has started its thread pool. The counts are the shared handles
// inside torch::stable::Tensor, a few per call, never per row.
extern "C" __attribute__((visibility("hidden"))) char __libc_single_threaded = 0;
#endif

// Set by the build (posemb/kernels/build.py): what the library was compiled from and for.
// Numbers, not strings: the JIT build passes flags through a shell, setuptools does not.
#ifndef POSEMB_SOURCE_HASH
#define POSEMB_SOURCE_HASH 0
#endif

namespace posemb {
namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

#ifdef POSEMB_X86
const Variant* const kVariants[] = {&kBaseline, &kAvx2, &kAvx512};
#else
const Variant* const kVariants[] = {&kBaseline};
#endif
constexpr int kCount = sizeof(kVariants) / sizeof(kVariants[0]);

// Can this CPU (and its operating system, which must save the wider registers) run variant i?
// __builtin_cpu_supports checks both.
bool can_run(int i) {
#ifdef POSEMB_X86
  __builtin_cpu_init();
  switch (i) {
    case 1:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case 2:
      return can_run(1) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq");
    default:
      return i == 0;
  }
#else
  return i == 0;
#endif
}

int best() {
  for (int i = kCount - 1; i > 0; --i) {
    if (can_run(i)) return i;
  }
  return 0;
}

std::atomic<int> g_active{-1};  // -1: not chosen yet

const Variant& active() {
  int i = g_active.load(std::memory_order_relaxed);
  if (i < 0) {
    i = best();
    g_active.store(i, std::memory_order_relaxed);
  }
  return *kVariants[i];
}

Dtype dtype_of(const Tensor& x, const char* name) {
  switch (x.scalar_type()) {
    case ScalarType::Float:
      return kF32;
    case ScalarType::BFloat16:
      return kBF16;
    case ScalarType::Half:
      return kF16;
    default:
      STD_TORCH_CHECK(false, "posemb::rotate_cpu: ", name,
                      " must be float32, bfloat16 or float16");
  }
  return kF32;
}

void check_table(const Tensor& t, const Tensor& x, const char* name) {
  STD_TORCH_CHECK(t.is_cpu() && t.scalar_type() == ScalarType::Float && t.is_contiguous() &&
                      t.dim() == 3,
                  "posemb::rotate_cpu: ", name, " must be a contiguous float32 CPU tensor of "
                  "shape (1 or batch, seq, rotary_dim/2)");
  STD_TORCH_CHECK((t.size(0) == 1 || t.size(0) == x.size(0)) && t.size(1) == x.size(2) &&
                      2 * t.size(2) <= x.size(3),
                  "posemb::rotate_cpu: ", name, " has shape (", t.size(0), ", ", t.size(1), ", ",
                  t.size(2), "), which does not fit a tensor of shape (", x.size(0), ", ",
                  x.size(1), ", ", x.size(2), ", ", x.size(3), ")");
}

void check_x(const Tensor& x, const char* name) {
  STD_TORCH_CHECK(x.is_cpu() && x.dim() == 4, "posemb::rotate_cpu: ", name,
                  " must be a CPU tensor of shape (batch, heads, seq, head_dim)");
  STD_TORCH_CHECK(x.numel() == 0 || x.stride(3) == 1, "posemb::rotate_cpu: ", name,
                  " must have unit stride in head_dim");
  dtype_of(x, name);
}

// The bytes a tensor's elements span: [first, last + 1) of its memory.
struct Span {
  uintptr_t begin, end;
};
Span span_of(const Tensor& x) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(x.const_data_ptr());
  int64_t last = 0;
  for (int64_t d = 0; d < x.dim(); ++d) last += (x.size(d) - 1) * x.stride(d);
  return {base, base + static_cast<uintptr_t>((last + 1) * static_cast<int64_t>(x.element_size()))};
}
bool overlap(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const Span x = span_of(a), y = span_of(b);
  return x.begin < y.end && y.begin < x.end;
}

// A tensor that is written must not reach one element twice (an expanded k, stride 0): the
// threads would race on it. Sufficient test: with its dimensions sorted by stride, each
// stride is at least the extent of the ones below it.
void check_writable(const Tensor& x, const char* name) {
  int64_t stride[4], size[4], m = 0;
  for (int64_t d = 0; d < 4; ++d) {
    if (x.size(d) > 1) {
      stride[m] = x.stride(d);
      size[m++] = x.size(d);
    }
  }
  for (int64_t i = 1; i < m; ++i) {  // insertion sort of at most 4
    for (int64_t j = i; j > 0 && stride[j] < stride[j - 1]; --j) {
      std::swap(stride[j], stride[j - 1]);
      std::swap(size[j], size[j - 1]);
    }
  }
  int64_t extent = 1;
  for (int64_t i = 0; i < m; ++i) {
    STD_TORCH_CHECK(stride[i] >= extent, "posemb::rotate_cpu: ", name,
                    " is written, so its elements must not overlap (got an expanded or "
                    "overlapping view; pass .contiguous())");
    extent = stride[i] * size[i];
  }
}

// Rotate x into out (out may be x) by (cos, sin); both checked.
void rotate_into(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& out,
                 bool interleaved, bool conjugate, bool inplace) {
  RotateArgs a{};
  a.B = x.size(0);
  a.H = x.size(1);
  a.S = x.size(2);
  a.D = x.size(3);
  a.n = cos.size(2);
  const int64_t rows = a.B * a.H * a.S;
  if (rows == 0 || a.n == 0) {
    // Nothing to rotate; out of place, the channels are still copied.
    if (!inplace && x.numel() > 0) torch::stable::copy_(const_cast<Tensor&>(out), x);
    return;
  }
  a.x = x.const_data_ptr();
  a.out = out.mutable_data_ptr();
  a.cos = static_cast<const float*>(cos.const_data_ptr());
  a.sin = static_cast<const float*>(sin.const_data_ptr());
  for (int d = 0; d < 3; ++d) {
    a.xs[d] = x.stride(d);
    a.os[d] = out.stride(d);
  }
  a.cos_batch_stride = cos.size(0) == 1 ? 0 : cos.stride(0);
  a.sign = conjugate ? -1.0f : 1.0f;
  a.copy_tail = !inplace;
  const RowsFn fn = active().rows[dtype_of(x, "x")][interleaved ? 1 : 0];
  // A tile's cos and sin rows take <= 64 KB (L2), re-read from there by every head. Measured
  // in place on (4, 32, 2048, 128), 2 threads: rows in (b, t, h) order (tile 1) took 1.6-2.1x
  // the time of x.mul_ in fp32 and 4.1-5.0x in bf16; tiles of 128 tokens 1.0-1.2x and 1.3x.
  a.tile = std::max<int64_t>(1, std::min<int64_t>(a.S, 8192 / a.n));
  const int64_t units = a.B * ((a.S + a.tile - 1) / a.tile) * a.H;
  // ~16k elements per task keeps threads busy without oversubscribing small decode calls.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(a.D * a.tile, 1));
  torch::stable::parallel_for(0, units, grain,
                              [&](int64_t begin, int64_t end) { fn(a, begin, end); });
}

// A fresh output's pages are first touched by the kernel's own writes, and on Linux each 4 KB
// page then costs a fault and a zeroing: for a (4, 32, 2048, 128) fp32 output, 2 threads, that
// was 41 ms of a 54 ms call (11 ms into a preallocated one). Asking for transparent huge pages
// before the first write (what torch's own THP_MEM_ALLOC_ENABLE=1 does for every allocation)
// brought the call to 21 ms. Only the 2 MB-aligned interior of outputs of at least 4 MB is
// advised; the advice changes no data, and where THP is off or refused it is a no-op.
// POSEMB_HUGEPAGES=0 turns it off.
void advise_huge_pages(const Tensor& t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  static const bool enabled = [] {
    const char* v = std::getenv("POSEMB_HUGEPAGES");
    return !(v != nullptr && std::strcmp(v, "0") == 0);
  }();
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t bytes = static_cast<uintptr_t>(t.numel()) * t.element_size();
  if (!enabled || bytes < 2 * kHuge) return;
  const uintptr_t p = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t begin = (p + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (p + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)t;
#endif
}

Tensor fresh_like(const Tensor& x) {
  Tensor out = torch::stable::empty_like(x);
  advise_huge_pages(out);
  return out;
}

bool same_shape(const Tensor& a, const Tensor& b) {
  return a.size(0) == b.size(0) && a.size(1) == b.size(1) && a.size(2) == b.size(2);
}

void check_all(const Tensor& q, const Tensor& k, const Tensor& cos, const Tensor& sin,
               const std::optional<Tensor>& k_cos, const std::optional<Tensor>& k_sin) {
  check_x(q, "q");
  check_x(k, "k");
  STD_TORCH_CHECK(q.scalar_type() == k.scalar_type(), "posemb::rotate_cpu: q and k must "
                  "have one dtype");
  check_table(cos, q, "cos");
  check_table(sin, q, "sin");
  STD_TORCH_CHECK(k_cos.has_value() == k_sin.has_value(),
                  "posemb::rotate_cpu: k_cos and k_sin go together");
  const Tensor& kc = k_cos.has_value() ? *k_cos : cos;
  const Tensor& ks = k_sin.has_value() ? *k_sin : sin;
  check_table(kc, k, "k_cos");
  check_table(ks, k, "k_sin");
  // cos's batch stride indexes sin too: the two must have one shape (and k's tables too).
  STD_TORCH_CHECK(same_shape(sin, cos) && same_shape(ks, kc) && kc.size(2) == cos.size(2),
                  "posemb::rotate_cpu: sin must have cos's shape, k_sin k_cos's, and every "
                  "table one rotary_dim/2");
}

std::tuple<Tensor, Tensor> rotate_cpu(Tensor q, Tensor k, Tensor cos, Tensor sin,
                                      std::optional<Tensor> k_cos, std::optional<Tensor> k_sin,
                                      bool interleaved, bool conjugate) {
  check_all(q, k, cos, sin, k_cos, k_sin);
  Tensor q_out = fresh_like(q);
  Tensor k_out = fresh_like(k);
  rotate_into(q, cos, sin, q_out, interleaved, conjugate, false);
  rotate_into(k, k_cos.has_value() ? *k_cos : cos, k_sin.has_value() ? *k_sin : sin, k_out,
              interleaved, conjugate, false);
  return {q_out, k_out};
}

void rotate_cpu_(Tensor q, Tensor k, Tensor cos, Tensor sin, std::optional<Tensor> k_cos,
                 std::optional<Tensor> k_sin, bool interleaved, bool conjugate) {
  check_all(q, k, cos, sin, k_cos, k_sin);
  // q and k may be views of one fused qkv buffer (their spans interleave), so only each
  // one's own elements are checked.
  check_writable(q, "q");
  check_writable(k, "k");
  rotate_into(q, cos, sin, q, interleaved, conjugate, true);
  rotate_into(k, k_cos.has_value() ? *k_cos : cos, k_sin.has_value() ? *k_sin : sin, k,
              interleaved, conjugate, true);
}

void check_out(const Tensor& out, const Tensor& x, const char* name) {
  check_x(out, name);
  STD_TORCH_CHECK(out.scalar_type() == x.scalar_type() && out.dim() == x.dim() &&
                      out.size(0) == x.size(0) && out.size(1) == x.size(1) &&
                      out.size(2) == x.size(2) && out.size(3) == x.size(3),
                  "posemb::_rotate_cpu_into: ", name, " must have the shape and dtype of its input");
  check_writable(out, name);
}

// Out of place into outputs the caller allocated: the eager path that needs no autograd
// (allocating in Python, then this call, took 9 us where the functional op with its autograd
// wrapper took 17-19 us for a decode step's q and k; a decode step calls it once per layer).
// The outputs share no memory with each other or the inputs.
void rotate_cpu_into(Tensor q, Tensor k, Tensor q_out, Tensor k_out, Tensor cos, Tensor sin,
                     std::optional<Tensor> k_cos, std::optional<Tensor> k_sin, bool interleaved,
                     bool conjugate) {
  check_all(q, k, cos, sin, k_cos, k_sin);
  check_out(q_out, q, "q_out");
  check_out(k_out, k, "k_out");
  STD_TORCH_CHECK(!overlap(q_out, k_out) && !overlap(q_out, q) && !overlap(q_out, k) &&
                      !overlap(k_out, q) && !overlap(k_out, k),
                  "posemb::_rotate_cpu_into: the outputs must not share memory with each other "
                  "or with the inputs (rotate_cpu_ rotates in place)");
  // The caller allocated them just now (posemb's eager path): advised as rotate_cpu's are.
  advise_huge_pages(q_out);
  advise_huge_pages(k_out);
  rotate_into(q, cos, sin, q_out, interleaved, conjugate, false);
  rotate_into(k, k_cos.has_value() ? *k_cos : cos, k_sin.has_value() ? *k_sin : sin, k_out,
              interleaved, conjugate, false);
}

}  // namespace
}  // namespace posemb

STABLE_TORCH_LIBRARY(posemb, m) {
  m.def(
      "rotate_cpu(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor? k_cos, Tensor? k_sin, "
      "bool interleaved, bool conjugate) -> (Tensor, Tensor)");
  m.def(
      "rotate_cpu_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin, Tensor? k_cos, "
      "Tensor? k_sin, bool interleaved, bool conjugate) -> ()");
  m.def(
      "_rotate_cpu_into(Tensor q, Tensor k, Tensor(a!) q_out, Tensor(b!) k_out, Tensor cos, "
      "Tensor sin, Tensor? k_cos, Tensor? k_sin, bool interleaved, bool conjugate) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(posemb, CPU, m) {
  m.impl("rotate_cpu", TORCH_BOX(&posemb::rotate_cpu));
  m.impl("rotate_cpu_", TORCH_BOX(&posemb::rotate_cpu_));
  m.impl("_rotate_cpu_into", TORCH_BOX(&posemb::rotate_cpu_into));
}

// Plain C, read through ctypes: which variants exist and may run here, which one runs, and
// what this library was built from.
extern "C" {

__attribute__((visibility("default"))) int posemb_variant_count() { return posemb::kCount; }

__attribute__((visibility("default"))) const char* posemb_variant_name(int i) {
  return (i >= 0 && i < posemb::kCount) ? posemb::kVariants[i]->name : "";
}

__attribute__((visibility("default"))) int posemb_variant_can_run(int i) {
  return (i >= 0 && i < posemb::kCount && posemb::can_run(i)) ? 1 : 0;
}

// The running variant's index (choosing the best one if none is chosen yet).
__attribute__((visibility("default"))) int posemb_variant_active() {
  posemb::active();
  return posemb::g_active.load();
}

// Run variant i from now on; -1 (and no change) if it does not exist or cannot run here.
__attribute__((visibility("default"))) int posemb_variant_use(int i) {
  if (i < 0 || i >= posemb::kCount || !posemb::can_run(i)) return -1;
  posemb::g_active.store(i);
  return i;
}

// The sources it was compiled from (a hash), and the torch it was compiled against and for.
__attribute__((visibility("default"))) uint64_t posemb_source_hash() {
  return POSEMB_SOURCE_HASH;
}

__attribute__((visibility("default"))) uint64_t posemb_torch_headers() {
  return TORCH_ABI_VERSION;
}

__attribute__((visibility("default"))) uint64_t posemb_torch_target() {
  return TORCH_TARGET_VERSION;
}

}  // extern "C"
