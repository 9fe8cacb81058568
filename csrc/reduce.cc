#include "csrc/reduce.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "csrc/clones.hpp"
#include "csrc/env.hpp"

namespace jaxcoll {
namespace {

// How a data type is stored (D) and accumulated (A).
template <class T>
struct Plain {
  using D = T;
  using A = T;
  static JAXCOLL_INLINE A load(D x) { return x; }
  static JAXCOLL_INLINE D store(A x) { return x; }
};

struct Half {
  using D = _Float16;
  using A = float;
  static JAXCOLL_INLINE A load(D x) { return static_cast<float>(x); }
  static JAXCOLL_INLINE D store(A x) { return static_cast<_Float16>(x); }  // IEEE conversion: nearest even
};

struct BFloat16 {
  using D = uint16_t;
  using A = float;
  static JAXCOLL_INLINE A load(D x) { return std::bit_cast<float>(static_cast<uint32_t>(x) << 16); }
  static JAXCOLL_INLINE D store(A x) {
    const uint32_t u = std::bit_cast<uint32_t>(x);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // round to nearest, ties to even
    const uint32_t quiet_nan = (u >> 16) | 0x40u;
    return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
};

// Reductions. Floating max/min propagate NaN, as jnp.maximum / lax.pmax do; integer sums wrap.
struct Sum {
  template <class A>
  static JAXCOLL_INLINE A apply(A a, A b) {
    if constexpr (std::is_integral_v<A>) {
      using U = std::make_unsigned_t<A>;
      return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};
struct Max {
  template <class A>
  static JAXCOLL_INLINE A apply(A a, A b) { return (a > b || a != a) ? a : b; }
};
struct Min {
  template <class A>
  static JAXCOLL_INLINE A apply(A a, A b) { return (a < b || a != a) ? a : b; }
};

// In a call that streams (`stream_call`), destinations of at least this many bytes per step are written with
// non-temporal stores: they skip the read for ownership of every line and do not evict the sources still to be
// read. JAXCOLL_NT_BYTES overrides. Measured (direct all_reduce, 8 ranks on 2 cores, run_plan): 16 MiB/rank
// 16.4 ms with, 23.8 ms without; 64 MiB/rank 60 ms with, 90 ms without; 4 MiB/rank 3.3 ms at a 256 KiB
// threshold, 5 ms at 1 MiB.
size_t nt_threshold() {
  static const size_t t = env_settings().nt_bytes.value_or(size_t{256} << 10);
  return t;
}

// Copy with streaming stores where the CPU has them (SSE2 is part of x86-64, so no dispatch is needed).
JAXCOLL_INLINE void stream_bytes(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  if (head > bytes) head = bytes;
  std::memcpy(d, s, head);
  d += head, s += head, bytes -= head;
  for (; bytes >= 64; d += 64, s += 64, bytes -= 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  std::memcpy(d, s, bytes);
#else
  std::memcpy(dst, src, bytes);
#endif
}

// Make streaming stores visible before a later release (signal, barrier) publishes them.
inline void stream_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

// The accumulator tile stays in L1 while the sources stream through it.
constexpr int64_t kTileBytes = 8192;

// Sources folded into the tile per pass. A pass that adds one source loads and stores the whole tile for it, and
// those tile accesses, not the source's, bound it; folding four per pass reads four streams at once and touches
// the tile once (eight per pass measured no faster). `jaxcoll bench`, 8 ranks on 2 cores, two runs each: the
// direct reduce_scatter of 4 MiB a rank 0.94-0.95 ms one source a pass, 0.65-0.68 ms four; 16 MiB 3.8-4.1 ms,
// 2.7-3.4 ms.
constexpr int kFold = 4;

// Element i of a source held in the accumulation type (scratch, `kAccum`) or in the data type.
template <class Tr, bool kAccum>
struct Source {
  using T = std::conditional_t<kAccum, typename Tr::A, typename Tr::D>;
  static JAXCOLL_INLINE typename Tr::A at(const T* __restrict p, int64_t i) {
    if constexpr (kAccum)
      return p[i];
    else
      return Tr::load(p[i]);
  }
};

// Fold `M` sources of one representation into the tile, in order (the same sums, bit for bit, as one at a time):
// acc = ((acc (+) s0) (+) s1) ..., or s0 (+) s1 ... for the first pass.
template <class Tr, class R, int M, bool kAccum>
JAXCOLL_INLINE void fold(typename Tr::A* __restrict acc, const Operand* srcs, int64_t t0, int64_t len, bool first) {
  using S = Source<Tr, kAccum>;
  using T = typename S::T;
  using A = typename Tr::A;
  const T* __restrict p0 = static_cast<const T*>(srcs[0].ptr) + t0;
  const T* __restrict p1 = static_cast<const T*>(srcs[M > 1 ? 1 : 0].ptr) + t0;
  const T* __restrict p2 = static_cast<const T*>(srcs[M > 2 ? 2 : 0].ptr) + t0;
  const T* __restrict p3 = static_cast<const T*>(srcs[M > 3 ? 3 : 0].ptr) + t0;
  for (int64_t i = 0; i < len; ++i) {
    A v = first ? S::at(p0, i) : R::apply(acc[i], S::at(p0, i));
    if constexpr (M > 1) v = R::apply(v, S::at(p1, i));
    if constexpr (M > 2) v = R::apply(v, S::at(p2, i));
    if constexpr (M > 3) v = R::apply(v, S::at(p3, i));
    acc[i] = v;
  }
}

// `fold` names four source pointers and `fold_n` has a case for each count up to four: a larger `kFold` would
// drop sources.
static_assert(kFold >= 1 && kFold <= 4, "fold and fold_n handle one to four sources a pass");

template <class Tr, class R, bool kAccum>
JAXCOLL_INLINE void fold_n(typename Tr::A* __restrict acc, const Operand* srcs, int m, int64_t t0, int64_t len,
                           bool first) {
  switch (m) {
    case 1: return fold<Tr, R, 1, kAccum>(acc, srcs, t0, len, first);
    case 2: return fold<Tr, R, 2, kAccum>(acc, srcs, t0, len, first);
    case 3: return fold<Tr, R, 3, kAccum>(acc, srcs, t0, len, first);
    default: return fold<Tr, R, kFold, kAccum>(acc, srcs, t0, len, first);
  }
}

// Every source into the tile, in order, up to `kFold` of one representation per pass.
template <class Tr, class R>
JAXCOLL_INLINE void combine(typename Tr::A* __restrict acc, const Operand* srcs, int nsrc, int64_t t0, int64_t len) {
  for (int s = 0; s < nsrc;) {
    int m = 1;
    while (m < kFold && s + m < nsrc && srcs[s + m].accum == srcs[s].accum) ++m;
    if (srcs[s].accum)
      fold_n<Tr, R, true>(acc, srcs + s, m, t0, len, s == 0);
    else
      fold_n<Tr, R, false>(acc, srcs + s, m, t0, len, s == 0);
    s += m;
  }
}

template <class Tr>
JAXCOLL_INLINE void store_from(const typename Tr::A* __restrict acc, typename Tr::D* __restrict conv,
                               const Operand& dst, int64_t t0, int64_t len, bool stream) {
  using A = typename Tr::A;
  using D = typename Tr::D;
  if (dst.accum || std::is_same_v<D, A>) {
    A* __restrict p = static_cast<A*>(dst.ptr) + t0;
    if (stream)
      stream_bytes(p, acc, size_t(len) * sizeof(A));
    else
      for (int64_t i = 0; i < len; ++i) p[i] = acc[i];
  } else {
    D* __restrict p = static_cast<D*>(dst.ptr) + t0;
    if (stream) {
      for (int64_t i = 0; i < len; ++i) conv[i] = Tr::store(acc[i]);
      stream_bytes(p, conv, size_t(len) * sizeof(D));
    } else {
      for (int64_t i = 0; i < len; ++i) p[i] = Tr::store(acc[i]);
    }
  }
}

template <class Tr, class R>
JAXCOLL_INLINE void reduce_typed(const Operand* srcs, int nsrc, const Operand* dsts, int ndst, int64_t n,
                                 bool stream) {
  using A = typename Tr::A;
  if constexpr (std::is_same_v<typename Tr::D, A>) {
    // Two sources, one destination, no conversion, cache-resident: one pass, no accumulator round trip.
    if (nsrc == 2 && ndst == 1 && !stream) {
      const A* __restrict a = static_cast<const A*>(srcs[0].ptr);
      const A* __restrict b = static_cast<const A*>(srcs[1].ptr);
      A* d = static_cast<A*>(dsts[0].ptr);  // may alias a or b element for element
      for (int64_t i = 0; i < n; ++i) d[i] = R::apply(a[i], b[i]);
      return;
    }
  }
  constexpr int64_t kTile = kTileBytes / sizeof(A);
  alignas(64) A acc[kTile];
  alignas(64) typename Tr::D conv[kTile];
  for (int64_t t0 = 0; t0 < n; t0 += kTile) {
    const int64_t len = std::min(kTile, n - t0);
    combine<Tr, R>(acc, srcs, nsrc, t0, len);
    for (int d = 0; d < ndst; ++d) store_from<Tr>(acc, conv, dsts[d], t0, len, stream);
  }
  if (stream) stream_fence();
}

template <class Tr>
JAXCOLL_INLINE void reduce_dispatch(ReduceOp op, const Operand* srcs, int nsrc, const Operand* dsts, int ndst,
                                    int64_t n, bool stream) {
  switch (op) {
    case ReduceOp::kSum: return reduce_typed<Tr, Sum>(srcs, nsrc, dsts, ndst, n, stream);
    case ReduceOp::kMax: return reduce_typed<Tr, Max>(srcs, nsrc, dsts, ndst, n, stream);
    case ReduceOp::kMin: return reduce_typed<Tr, Min>(srcs, nsrc, dsts, ndst, n, stream);
  }
}

#define JAXCOLL_DEFINE_KERNEL(NAME, TRAITS)                                                                  \
  JAXCOLL_CLONES void NAME(ReduceOp op, const Operand* srcs, int nsrc, const Operand* dsts, int ndst,        \
                           int64_t n, bool stream) {                                                         \
    reduce_dispatch<TRAITS>(op, srcs, nsrc, dsts, ndst, n, stream);                                          \
  }

JAXCOLL_DEFINE_KERNEL(reduce_f16, Half)
JAXCOLL_DEFINE_KERNEL(reduce_bf16, BFloat16)
JAXCOLL_DEFINE_KERNEL(reduce_f32, Plain<float>)
JAXCOLL_DEFINE_KERNEL(reduce_f64, Plain<double>)
JAXCOLL_DEFINE_KERNEL(reduce_i8, Plain<int8_t>)
JAXCOLL_DEFINE_KERNEL(reduce_i32, Plain<int32_t>)
JAXCOLL_DEFINE_KERNEL(reduce_i64, Plain<int64_t>)
JAXCOLL_DEFINE_KERNEL(reduce_u8, Plain<uint8_t>)
JAXCOLL_DEFINE_KERNEL(reduce_u32, Plain<uint32_t>)

}  // namespace

// Calls whose buffers (every rank's inputs, outputs and scratch) hold at least this many bytes stream their large
// destinations; smaller calls leave their results in the caches, where the program's next op (or the next call
// of a loop, whose buffers are reused) finds them. Measured with `jaxcoll bench` (8 ranks, 2 cores; medians of
// 11-41 calls, several runs): all_gather of 256 KiB per rank (18 MiB held) 1.17-1.52 ms with ordinary stores,
// 1.54-1.78 ms streamed (three runs each); reduce_scatter of 4 MiB per rank (36 MiB) 1.7-2.1 ms streamed,
// 2.9-3.2 ms not; all_reduce of 16 MiB per rank (256 MiB) 17.6-24 ms streamed, 24-27 ms not.
// JAXCOLL_NT_CALL_BYTES overrides (0: stream at every size).
bool stream_call(int64_t footprint_bytes) {
  static const size_t t = env_settings().nt_call_bytes.value_or(size_t{32} << 20);
  return footprint_bytes >= 0 && size_t(footprint_bytes) >= t;
}

void reduce_chunks(DType dtype, ReduceOp op, const Operand* srcs, int nsrc, const Operand* dsts, int ndst,
                   int64_t n, bool stream) {
  if (n <= 0) return;
  const size_t dsize = dtype_size(dtype), asize = accum_size(dtype);
  stream = stream && size_t(n) * dsize >= nt_threshold();
  if (nsrc == 0) {  // zero is all-bits-zero in every supported type
    for (int d = 0; d < ndst; ++d) std::memset(dsts[d].ptr, 0, size_t(n) * (dsts[d].accum ? asize : dsize));
    return;
  }
  if (nsrc == 1) {  // a copy: memcpy wherever no conversion is needed
    bool all_plain = true;
    for (int d = 0; d < ndst; ++d) {
      if (dsize != asize && dsts[d].accum != srcs[0].accum) {
        all_plain = false;
        continue;
      }
      const size_t bytes = size_t(n) * (srcs[0].accum ? asize : dsize);
      if (dsts[d].ptr == srcs[0].ptr) continue;
      if (stream)
        stream_bytes(dsts[d].ptr, srcs[0].ptr, bytes);
      else
        std::memcpy(dsts[d].ptr, srcs[0].ptr, bytes);
    }
    if (stream) stream_fence();
    if (all_plain) return;
  }
  if (dtype == DType::kBool && op == ReduceOp::kSum) op = ReduceOp::kMax;  // logical or
  switch (dtype) {
    case DType::kF16: return reduce_f16(op, srcs, nsrc, dsts, ndst, n, stream);
    case DType::kBF16: return reduce_bf16(op, srcs, nsrc, dsts, ndst, n, stream);
    case DType::kF32: return reduce_f32(op, srcs, nsrc, dsts, ndst, n, stream);
    case DType::kF64: return reduce_f64(op, srcs, nsrc, dsts, ndst, n, stream);
    case DType::kI8: return reduce_i8(op, srcs, nsrc, dsts, ndst, n, stream);
    case DType::kI32: return reduce_i32(op, srcs, nsrc, dsts, ndst, n, stream);
    case DType::kI64: return reduce_i64(op, srcs, nsrc, dsts, ndst, n, stream);
    case DType::kU8: case DType::kBool: return reduce_u8(op, srcs, nsrc, dsts, ndst, n, stream);
    case DType::kU32: return reduce_u32(op, srcs, nsrc, dsts, ndst, n, stream);
  }
}

}  // namespace jaxcoll
