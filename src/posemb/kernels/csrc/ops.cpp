// posemb's fused CPU rotation as PyTorch ops, on the stable ABI (torch >= 2.10): built once,
// the library loads into any later torch without a rebuild, and it needs no Python headers.
//
//   posemb::rotate_cpu(q, k, cos, sin, k_cos?, k_sin?, interleaved, conjugate) -> (q', k')
//   posemb::rotate_cpu_(q!, k!, ...) -> ()            the same, in q's and k's own memory
//   posemb::_rotate_cpu_into(q, k, q_out!, k_out!, ..., table_form=0) -> ()   into given
//       outputs (eager), tables of any float dtype and strides, cut by table_form
//   posemb::norm_rotate_cpu(q, k, cos, sin, q_weight, k_weight, eps, interleaved) -> (q', k')
//       RMSNorm of each head (float32 weights, offset applied by the caller) and the rotation
//       in one pass; norm_rotate_cpu_ in place; norm_rotate_cpu_backward its gradients
//   posemb::_norm_rotate_cpu_into(q, k, q_out!, k_out!, cos, sin, q_weight, k_weight, eps,
//       weight_offset, interleaved, table_form=0) -> ()   into given outputs, weights and
//       tables of any float dtype
//       with their offset added here (the eager decode path inside transformers models)
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
#include <vector>

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
const Variant* const kVariants[] = {&kBaseline, &kAvx2, &kAvx512, &kAvx512Bf16};
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
    case 3:
      return can_run(2) && __builtin_cpu_supports("avx512bf16");
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

// cos and sin as the row loops read them: float32 rows of n, (Bc, S, n) contiguous, the
// batch stride 0 when one table serves every batch row.
struct Tables {
  const float* cos;
  const float* sin;
  int64_t n;
  int64_t batch_stride;
};

Tables tables_of(const Tensor& cos, const Tensor& sin) {
  return {static_cast<const float*>(cos.const_data_ptr()),
          static_cast<const float*>(sin.const_data_ptr()), cos.size(2),
          cos.size(0) == 1 ? 0 : cos.stride(0)};
}

float half_bits_to_float(uint16_t h);

// One element of a float32, bfloat16 or float16 tensor, widened.
float element_at(const void* base, Dtype dtype, int64_t offset) {
  switch (dtype) {
    case kF32:
      return static_cast<const float*>(base)[offset];
    case kBF16: {
      const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(base)[offset])
                            << 16;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return f;
    }
    case kF16:
      return half_bits_to_float(static_cast<const uint16_t*>(base)[offset]);
  }
  return 0.0f;
}

// Tables of any float dtype and strides for the _into ops, read in one of three forms: as
// given, (1 or B, S, n) (form 0); the first half of transformers' cat([c, c]) tables (form 1);
// every other entry of its repeat_interleave'd ones (form 2). Used in place where the rows are
// float32 with unit stride, packed into `own` otherwise (a decode step's are batch x n numbers).
// Transformers hands every layer its tables in the model's dtype and in the cat([c, c]) form:
// cut and packed in Python that cost a view and two small ops per table (~8 us a layer), and
// packed once per step and kept, it had to be keyed on the tensors' identity and version
// counters, which a write through .data does not bump.
Tables loose_tables(const Tensor& cos, const Tensor& sin, int64_t form, const Tensor& x,
                    std::vector<float>& own) {
  STD_TORCH_CHECK(form >= 0 && form <= 2, "posemb::rotate_cpu: table_form must be 0, 1 or 2");
  // Each stable-ABI accessor is a call through the C shim: each is read once.
  int64_t size[2][3], stride[2][3];
  const Tensor* src[2] = {&cos, &sin};
  for (int i = 0; i < 2; ++i) {
    const Tensor& t = *src[i];
    STD_TORCH_CHECK(t.is_cpu() && t.dim() == 3, "posemb::rotate_cpu: the tables must be CPU "
                    "tensors of shape (1 or batch, seq, rotary_dim/2)");
    for (int d = 0; d < 3; ++d) {
      size[i][d] = t.size(d);
      stride[i][d] = t.stride(d);
    }
    if (form != 0) size[i][2] /= 2;
    if (form == 2) stride[i][2] *= 2;
    STD_TORCH_CHECK((size[i][0] == 1 || size[i][0] == x.size(0)) && size[i][1] == x.size(2) &&
                        2 * size[i][2] <= x.size(3),
                    "posemb::rotate_cpu: a table has shape (", size[i][0], ", ", size[i][1],
                    ", ", size[i][2], "), which does not fit a tensor of shape (", x.size(0),
                    ", ", x.size(1), ", ", x.size(2), ", ", x.size(3), ")");
  }
  STD_TORCH_CHECK(size[0][0] == size[1][0] && size[0][1] == size[1][1] &&
                      size[0][2] == size[1][2],
                  "posemb::rotate_cpu: sin must have cos's shape");
  const int64_t Bc = size[0][0], S = size[0][1], n = size[0][2];
  const Dtype dtypes[2] = {dtype_of(cos, "cos"), dtype_of(sin, "sin")};
  bool ready = true;
  for (int i = 0; i < 2; ++i) {
    ready = ready && dtypes[i] == kF32 && (n <= 1 || stride[i][2] == 1) &&
            (S <= 1 || stride[i][1] == n) && stride[0][0] == stride[1][0];
  }
  if (ready) {
    return {static_cast<const float*>(cos.const_data_ptr()),
            static_cast<const float*>(sin.const_data_ptr()), n, Bc == 1 ? 0 : stride[0][0]};
  }
  const int64_t count = Bc * S * n;
  own.resize(static_cast<size_t>(2 * count));
  for (int i = 0; i < 2; ++i) {
    const void* base = src[i]->const_data_ptr();
    const int64_t s0 = stride[i][0], s1 = stride[i][1], s2 = stride[i][2];
    float* dst = own.data() + i * count;
    for (int64_t b = 0; b < Bc; ++b)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t j = 0; j < n; ++j)
          *dst++ = element_at(base, dtypes[i], b * s0 + s * s1 + j * s2);
  }
  return {own.data(), own.data() + count, n, Bc == 1 ? 0 : S * n};
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

// Tokens per work unit. A tile's cos and sin rows take <= 64 KB (L2), re-read from there by
// every head. Measured in place on (4, 32, 2048, 128), 2 threads, on an AVX2 machine: rows in
// (b, t, h) order (tile 1) took 1.6-2.1x the time of x.mul_ in fp32 and 4.1-5.0x in bf16;
// tiles of 128 tokens 1.0-1.2x and 1.3x.
int64_t tile_of(int64_t S, int64_t n) {
  return std::max<int64_t>(1, std::min<int64_t>(S, 8192 / std::max<int64_t>(n, 1)));
}

// Heads per work unit, walked row by row together (see rotate_rows). The table's bytes a row
// are 2x a bf16 row's, so one head a unit reads the table as much as x; four heads share each
// table row from L1 and are four linear streams, which the prefetchers follow. Paired against
// x.mul_ in the same process on (4, 32, 2048, 128), 2 threads, AMD EPYC Zen 4: 1, 2, 4, 8 heads
// took 1.49, 1.48, 1.50-1.60, 1.83-1.90x in bf16 before the AVX-512 stores were hand-written
// (the group did not matter while the rounding cost the time), 1.17-1.24, 1.04-1.28, 0.99-1.17,
// 1.09-1.24x in fp32; with them, bf16 1.35-1.49x with 1 head and 1.08-1.37x with 4.
int64_t group_of(int64_t H) { return std::min<int64_t>(H, 4); }

// Work units per task: ~16k elements keeps threads busy without oversubscribing small decode
// calls.
int64_t grain_of(int64_t D, int64_t tile) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(D * tile, 1));
}

// Rotate x into out (out may be x) by (cos, sin); both checked.
void rotate_into(const Tensor& x, const Tables& tab, const Tensor& out, bool interleaved,
                 bool conjugate, bool inplace) {
  RotateArgs a{};
  a.B = x.size(0);
  a.H = x.size(1);
  a.S = x.size(2);
  a.D = x.size(3);
  a.n = tab.n;
  const int64_t rows = a.B * a.H * a.S;
  if (rows == 0 || a.n == 0) {
    // Nothing to rotate; out of place, the channels are still copied.
    if (!inplace && x.numel() > 0) torch::stable::copy_(const_cast<Tensor&>(out), x);
    return;
  }
  a.x = x.const_data_ptr();
  a.out = out.mutable_data_ptr();
  a.cos = tab.cos;
  a.sin = tab.sin;
  for (int d = 0; d < 3; ++d) {
    a.xs[d] = x.stride(d);
    a.os[d] = out.stride(d);
  }
  a.cos_batch_stride = tab.batch_stride;
  a.sign = conjugate ? -1.0f : 1.0f;
  a.copy_tail = !inplace;
  const RowsFn fn = active().rows[dtype_of(x, "x")][interleaved ? 1 : 0];
  a.tile = tile_of(a.S, a.n);
  a.group = group_of(a.H);
  const int64_t units =
      a.B * ((a.H + a.group - 1) / a.group) * ((a.S + a.tile - 1) / a.tile);
  torch::stable::parallel_for(0, units, grain_of(a.D * a.group, a.tile),
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

Tables k_tables(const Tensor& cos, const Tensor& sin, const std::optional<Tensor>& k_cos,
                const std::optional<Tensor>& k_sin) {
  return k_cos.has_value() ? tables_of(*k_cos, *k_sin) : tables_of(cos, sin);
}

std::tuple<Tensor, Tensor> rotate_cpu(Tensor q, Tensor k, Tensor cos, Tensor sin,
                                      std::optional<Tensor> k_cos, std::optional<Tensor> k_sin,
                                      bool interleaved, bool conjugate) {
  check_all(q, k, cos, sin, k_cos, k_sin);
  Tensor q_out = fresh_like(q);
  Tensor k_out = fresh_like(k);
  rotate_into(q, tables_of(cos, sin), q_out, interleaved, conjugate, false);
  rotate_into(k, k_tables(cos, sin, k_cos, k_sin), k_out, interleaved, conjugate, false);
  return {q_out, k_out};
}

void rotate_cpu_(Tensor q, Tensor k, Tensor cos, Tensor sin, std::optional<Tensor> k_cos,
                 std::optional<Tensor> k_sin, bool interleaved, bool conjugate) {
  check_all(q, k, cos, sin, k_cos, k_sin);
  // q and k may be views of one fused qkv buffer (their spans interleave), so only each
  // one's own elements are checked.
  check_writable(q, "q");
  check_writable(k, "k");
  rotate_into(q, tables_of(cos, sin), q, interleaved, conjugate, true);
  rotate_into(k, k_tables(cos, sin, k_cos, k_sin), k, interleaved, conjugate, true);
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
// The outputs share no memory with each other or the inputs. The tables may be of any float
// dtype and strides (loose_tables): a model's own, as cut from its cat([c, c]) form.
void rotate_cpu_into(Tensor q, Tensor k, Tensor q_out, Tensor k_out, Tensor cos, Tensor sin,
                     std::optional<Tensor> k_cos, std::optional<Tensor> k_sin, bool interleaved,
                     bool conjugate, int64_t table_form) {
  check_x(q, "q");
  check_x(k, "k");
  STD_TORCH_CHECK(q.scalar_type() == k.scalar_type(), "posemb::rotate_cpu: q and k must "
                  "have one dtype");
  STD_TORCH_CHECK(k_cos.has_value() == k_sin.has_value(),
                  "posemb::rotate_cpu: k_cos and k_sin go together");
  std::vector<float> own, k_own;
  const Tables q_tab = loose_tables(cos, sin, table_form, q, own);
  const Tables k_tab = k_cos.has_value() ? loose_tables(*k_cos, *k_sin, table_form, k, k_own)
                                         : loose_tables(cos, sin, table_form, k, k_own);
  STD_TORCH_CHECK(k_tab.n == q_tab.n, "posemb::rotate_cpu: every table must have one "
                  "rotary_dim/2");
  check_out(q_out, q, "q_out");
  check_out(k_out, k, "k_out");
  STD_TORCH_CHECK(!overlap(q_out, k_out) && !overlap(q_out, q) && !overlap(q_out, k) &&
                      !overlap(k_out, q) && !overlap(k_out, k),
                  "posemb::_rotate_cpu_into: the outputs must not share memory with each other "
                  "or with the inputs (rotate_cpu_ rotates in place)");
  // The caller allocated them just now (posemb's eager path): advised as rotate_cpu's are.
  advise_huge_pages(q_out);
  advise_huge_pages(k_out);
  rotate_into(q, q_tab, q_out, interleaved, conjugate, false);
  rotate_into(k, k_tab, k_out, interleaved, conjugate, false);
}

// --- QK-norm + rotation (norm.inc) ----------------------------------------------------------

void check_weight(const Tensor& w, const Tensor& x, const char* name) {
  STD_TORCH_CHECK(w.is_cpu() && w.scalar_type() == ScalarType::Float && w.is_contiguous() &&
                      w.dim() == 1 && w.size(0) == x.size(3),
                  "posemb::norm_rotate_cpu: ", name, " must be a contiguous float32 CPU tensor "
                  "of shape (head_dim,) = (", x.size(3), ",)");
}

const float* f32(const Tensor& w) { return static_cast<const float*>(w.const_data_ptr()); }

// One IEEE half's bits as a float (subnormals, infinities and NaN included).
float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0x1fu) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise the mantissa
    exp = 113u;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// A norm weight (head_dim,) of float32, bfloat16 or float16 as float32 with offset added.
std::vector<float> offset_weight(const Tensor& w, const Tensor& x, double offset,
                                 const char* name) {
  STD_TORCH_CHECK(w.is_cpu() && w.is_contiguous() && w.dim() == 1 && w.size(0) == x.size(3),
                  "posemb::_norm_rotate_cpu_into: ", name, " must be a contiguous CPU tensor "
                  "of shape (head_dim,) = (", x.size(3), ",)");
  const Dtype dtype = dtype_of(w, name);
  const void* base = w.const_data_ptr();
  std::vector<float> out(static_cast<size_t>(w.size(0)));
  const float off = static_cast<float>(offset);
  for (int64_t j = 0; j < w.size(0); ++j) out[j] = element_at(base, dtype, j) + off;
  return out;
}

void check_norm(const Tensor& q, const Tensor& k, const Tensor& cos, const Tensor& sin,
                const Tensor& q_weight, const Tensor& k_weight, double eps) {
  check_all(q, k, cos, sin, std::nullopt, std::nullopt);
  check_weight(q_weight, q, "q_weight");
  check_weight(k_weight, k, "k_weight");
  STD_TORCH_CHECK(eps > 0.0, "posemb::norm_rotate_cpu: eps must be > 0");
}

void fill_common(const Tensor& x, const Tables& tab, int64_t& B, int64_t& H, int64_t& S,
                 int64_t& D, int64_t& n, int64_t xs[3], int64_t& cos_batch_stride) {
  B = x.size(0);
  H = x.size(1);
  S = x.size(2);
  D = x.size(3);
  n = tab.n;
  for (int d = 0; d < 3; ++d) xs[d] = x.stride(d);
  cos_batch_stride = tab.batch_stride;
}

// Normalise and rotate x into out (out may be x).
void norm_into(const Tensor& x, const Tables& tab, const float* w, double eps, const Tensor& out,
               bool interleaved) {
  NormArgs a{};
  fill_common(x, tab, a.B, a.H, a.S, a.D, a.n, a.xs, a.cos_batch_stride);
  if (x.numel() == 0) return;
  a.x = x.const_data_ptr();
  a.out = out.mutable_data_ptr();
  a.cos = tab.cos;
  a.sin = tab.sin;
  a.w = w;
  for (int d = 0; d < 3; ++d) a.os[d] = out.stride(d);
  a.eps = static_cast<float>(eps);
  a.tile = tile_of(a.S, a.n);
  const NormFn fn = active().norm[dtype_of(x, "x")][interleaved ? 1 : 0];
  const int64_t units = a.B * ((a.S + a.tile - 1) / a.tile) * a.H;
  torch::stable::parallel_for(0, units, grain_of(a.D, a.tile),
                              [&](int64_t begin, int64_t end) { fn(a, begin, end, nullptr); });
}

std::tuple<Tensor, Tensor> norm_rotate_cpu(Tensor q, Tensor k, Tensor cos, Tensor sin,
                                           Tensor q_weight, Tensor k_weight, double eps,
                                           bool interleaved) {
  check_norm(q, k, cos, sin, q_weight, k_weight, eps);
  Tensor q_out = fresh_like(q);
  Tensor k_out = fresh_like(k);
  norm_into(q, tables_of(cos, sin), f32(q_weight), eps, q_out, interleaved);
  norm_into(k, tables_of(cos, sin), f32(k_weight), eps, k_out, interleaved);
  return {q_out, k_out};
}

void norm_rotate_cpu_(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor q_weight,
                      Tensor k_weight, double eps, bool interleaved) {
  check_norm(q, k, cos, sin, q_weight, k_weight, eps);
  check_writable(q, "q");
  check_writable(k, "k");
  norm_into(q, tables_of(cos, sin), f32(q_weight), eps, q, interleaved);
  norm_into(k, tables_of(cos, sin), f32(k_weight), eps, k, interleaved);
}

// Into outputs the caller allocated (the eager path with no autograd, as _rotate_cpu_into):
// a decode step inside a model calls this once per layer, with the weights the norm modules
// hold at that call, in their own dtype, and the form's offset (Gemma's 1 + w). Forming
// w + offset in float32 here costs head_dim adds; formed in Python it cost two small ops per
// weight (~6 us each), and kept between calls it went stale under writes that bump no version
// counter (a fused optimizer step, a write through .data).
void norm_rotate_cpu_into(Tensor q, Tensor k, Tensor q_out, Tensor k_out, Tensor cos, Tensor sin,
                          Tensor q_weight, Tensor k_weight, double eps, double weight_offset,
                          bool interleaved, int64_t table_form) {
  check_x(q, "q");
  check_x(k, "k");
  STD_TORCH_CHECK(q.scalar_type() == k.scalar_type(), "posemb::rotate_cpu: q and k must "
                  "have one dtype");
  std::vector<float> own, k_own;
  const Tables q_tab = loose_tables(cos, sin, table_form, q, own);
  const Tables k_tab = loose_tables(cos, sin, table_form, k, k_own);
  STD_TORCH_CHECK(eps > 0.0, "posemb::_norm_rotate_cpu_into: eps must be > 0");
  check_out(q_out, q, "q_out");
  check_out(k_out, k, "k_out");
  STD_TORCH_CHECK(!overlap(q_out, k_out) && !overlap(q_out, q) && !overlap(q_out, k) &&
                      !overlap(k_out, q) && !overlap(k_out, k),
                  "posemb::_norm_rotate_cpu_into: the outputs must not share memory with each "
                  "other or with the inputs (norm_rotate_cpu_ works in place)");
  const std::vector<float> wq = offset_weight(q_weight, q, weight_offset, "q_weight");
  const std::vector<float> wk = offset_weight(k_weight, k, weight_offset, "k_weight");
  advise_huge_pages(q_out);
  advise_huge_pages(k_out);
  norm_into(q, q_tab, wq.data(), eps, q_out, interleaved);
  norm_into(k, k_tab, wk.data(), eps, k_out, interleaved);
}

// The gradients of one side: dx (when need_x) and the weight's dw (when need_w), from the
// incoming g. The weight's gradient sums over every row: each task keeps its own partial sum
// in float64 (a fixed number of tasks, so the result does not depend on scheduling), summed
// once at the end.
void norm_backward_into(const Tensor& g, const Tensor& x, const Tensor& cos, const Tensor& sin,
                        const Tensor& w, double eps, bool interleaved, Tensor* dx, Tensor* dw) {
  NormBackwardArgs a{};
  const Tables tab = tables_of(cos, sin);
  fill_common(x, tab, a.B, a.H, a.S, a.D, a.n, a.xs, a.cos_batch_stride);
  const int64_t D = a.D;
  if (dw != nullptr) torch::stable::zero_(*dw);
  if (x.numel() == 0) return;
  a.x = x.const_data_ptr();
  a.g = g.const_data_ptr();
  a.dx = dx != nullptr ? dx->mutable_data_ptr() : nullptr;
  a.cos = tab.cos;
  a.sin = tab.sin;
  a.w = static_cast<const float*>(w.const_data_ptr());
  for (int d = 0; d < 3; ++d) {
    a.gs[d] = g.stride(d);
    a.ds[d] = dx != nullptr ? dx->stride(d) : 0;
  }
  a.eps = static_cast<float>(eps);
  a.tile = tile_of(a.S, a.n);
  const NormBackwardFn fn = active().norm_backward[dtype_of(x, "x")][interleaved ? 1 : 0];
  const int64_t units = a.B * ((a.S + a.tile - 1) / a.tile) * a.H;
  const int64_t tasks = std::min<int64_t>(units, 64);
  std::vector<double> partial(dw != nullptr ? static_cast<size_t>(tasks * D) : 0, 0.0);
  torch::stable::parallel_for(0, tasks, 1, [&](int64_t first, int64_t last) {
    std::vector<float> buf(static_cast<size_t>(3 * D));
    for (int64_t c = first; c < last; ++c) {
      double* mine = dw != nullptr ? partial.data() + c * D : nullptr;
      fn(a, units * c / tasks, units * (c + 1) / tasks, buf.data(), mine);
    }
  });
  if (dw != nullptr) {
    float* out = static_cast<float*>(dw->mutable_data_ptr());
    for (int64_t j = 0; j < D; ++j) {
      double sum = 0.0;
      for (int64_t c = 0; c < tasks; ++c) sum += partial[c * D + j];
      out[j] = static_cast<float>(sum);
    }
  }
}

std::tuple<Tensor, Tensor, Tensor, Tensor> norm_rotate_cpu_backward(
    Tensor grad_q, Tensor grad_k, Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor q_weight,
    Tensor k_weight, double eps, bool interleaved, bool need_q, bool need_k, bool need_q_weight,
    bool need_k_weight) {
  check_norm(q, k, cos, sin, q_weight, k_weight, eps);
  check_x(grad_q, "grad_q");
  check_x(grad_k, "grad_k");
  STD_TORCH_CHECK(same_shape(grad_q, q) && grad_q.size(3) == q.size(3) && same_shape(grad_k, k) &&
                      grad_k.size(3) == k.size(3) && grad_q.scalar_type() == q.scalar_type() &&
                      grad_k.scalar_type() == k.scalar_type(),
                  "posemb::norm_rotate_cpu_backward: the gradients must have q's and k's shapes "
                  "and dtypes");
  // What is not needed comes back empty (the Python half returns None for it).
  const auto sized = [](bool need, int64_t n) { return std::vector<int64_t>{need ? n : 0}; };
  const std::vector<int64_t> none{0};
  Tensor dq = need_q ? fresh_like(q) : torch::stable::new_empty(q, none);
  Tensor dk = need_k ? fresh_like(k) : torch::stable::new_empty(k, none);
  Tensor dqw = torch::stable::new_empty(q_weight, sized(need_q_weight, q.size(3)));
  Tensor dkw = torch::stable::new_empty(k_weight, sized(need_k_weight, k.size(3)));
  if (need_q || need_q_weight) {
    norm_backward_into(grad_q, q, cos, sin, q_weight, eps, interleaved, need_q ? &dq : nullptr,
                       need_q_weight ? &dqw : nullptr);
  }
  if (need_k || need_k_weight) {
    norm_backward_into(grad_k, k, cos, sin, k_weight, eps, interleaved, need_k ? &dk : nullptr,
                       need_k_weight ? &dkw : nullptr);
  }
  return {dq, dk, dqw, dkw};
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
      "Tensor sin, Tensor? k_cos, Tensor? k_sin, bool interleaved, bool conjugate, "
      "int table_form=0) -> ()");
  m.def(
      "norm_rotate_cpu(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor q_weight, "
      "Tensor k_weight, float eps, bool interleaved) -> (Tensor, Tensor)");
  m.def(
      "norm_rotate_cpu_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin, Tensor q_weight, "
      "Tensor k_weight, float eps, bool interleaved) -> ()");
  m.def(
      "_norm_rotate_cpu_into(Tensor q, Tensor k, Tensor(a!) q_out, Tensor(b!) k_out, Tensor cos, "
      "Tensor sin, Tensor q_weight, Tensor k_weight, float eps, float weight_offset, "
      "bool interleaved, int table_form=0) -> ()");
  m.def(
      "norm_rotate_cpu_backward(Tensor grad_q, Tensor grad_k, Tensor q, Tensor k, Tensor cos, "
      "Tensor sin, Tensor q_weight, Tensor k_weight, float eps, bool interleaved, bool need_q, "
      "bool need_k, bool need_q_weight, bool need_k_weight) -> (Tensor, Tensor, Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(posemb, CPU, m) {
  m.impl("rotate_cpu", TORCH_BOX(&posemb::rotate_cpu));
  m.impl("rotate_cpu_", TORCH_BOX(&posemb::rotate_cpu_));
  m.impl("_rotate_cpu_into", TORCH_BOX(&posemb::rotate_cpu_into));
  m.impl("norm_rotate_cpu", TORCH_BOX(&posemb::norm_rotate_cpu));
  m.impl("norm_rotate_cpu_", TORCH_BOX(&posemb::norm_rotate_cpu_));
  m.impl("norm_rotate_cpu_backward", TORCH_BOX(&posemb::norm_rotate_cpu_backward));
  m.impl("_norm_rotate_cpu_into", TORCH_BOX(&posemb::norm_rotate_cpu_into));
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
