#include "reduce.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <type_traits>

// The kernels are compiled for several instruction sets and picked at load time (GCC/Clang function
// multiversioning), so the shipped build runs anywhere and still uses AVX-512/AVX2 (and F16C for float16
// conversions) where the CPU has them. Never -march=native in a wheel.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(JAXCOLL_NO_CLONES)
#define JAXCOLL_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define JAXCOLL_CLONES
#endif
#define JAXCOLL_INLINE inline __attribute__((always_inline))

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

// The accumulator tile stays in L1 while every source streams through it once.
constexpr int64_t kTileBytes = 8192;

template <class Tr, class R>
JAXCOLL_INLINE void combine_into(typename Tr::A* __restrict acc, const Operand& src, int64_t t0, int64_t len,
                                 bool first) {
  using A = typename Tr::A;
  using D = typename Tr::D;
  if (src.accum) {
    const A* __restrict p = static_cast<const A*>(src.ptr) + t0;
    if (first)
      for (int64_t i = 0; i < len; ++i) acc[i] = p[i];
    else
      for (int64_t i = 0; i < len; ++i) acc[i] = R::apply(acc[i], p[i]);
  } else {
    const D* __restrict p = static_cast<const D*>(src.ptr) + t0;
    if (first)
      for (int64_t i = 0; i < len; ++i) acc[i] = Tr::load(p[i]);
    else
      for (int64_t i = 0; i < len; ++i) acc[i] = R::apply(acc[i], Tr::load(p[i]));
  }
}

template <class Tr>
JAXCOLL_INLINE void store_from(const typename Tr::A* __restrict acc, const Operand& dst, int64_t t0, int64_t len) {
  using A = typename Tr::A;
  using D = typename Tr::D;
  if (dst.accum) {
    A* __restrict p = static_cast<A*>(dst.ptr) + t0;
    for (int64_t i = 0; i < len; ++i) p[i] = acc[i];
  } else {
    D* __restrict p = static_cast<D*>(dst.ptr) + t0;
    for (int64_t i = 0; i < len; ++i) p[i] = Tr::store(acc[i]);
  }
}

template <class Tr, class R>
JAXCOLL_INLINE void reduce_typed(const Operand* srcs, int nsrc, const Operand* dsts, int ndst, int64_t n) {
  using A = typename Tr::A;
  if constexpr (std::is_same_v<typename Tr::D, A>) {
    // Two sources, one destination, no conversion: one streaming pass, no accumulator round trip.
    if (nsrc == 2 && ndst == 1) {
      const A* __restrict a = static_cast<const A*>(srcs[0].ptr);
      const A* __restrict b = static_cast<const A*>(srcs[1].ptr);
      A* d = static_cast<A*>(dsts[0].ptr);  // may alias a or b element for element
      for (int64_t i = 0; i < n; ++i) d[i] = R::apply(a[i], b[i]);
      return;
    }
  }
  constexpr int64_t kTile = kTileBytes / sizeof(A);
  alignas(64) A acc[kTile];
  for (int64_t t0 = 0; t0 < n; t0 += kTile) {
    const int64_t len = std::min(kTile, n - t0);
    combine_into<Tr, R>(acc, srcs[0], t0, len, true);
    for (int s = 1; s < nsrc; ++s) combine_into<Tr, R>(acc, srcs[s], t0, len, false);
    for (int d = 0; d < ndst; ++d) store_from<Tr>(acc, dsts[d], t0, len);
  }
}

template <class Tr>
JAXCOLL_INLINE void reduce_dispatch(ReduceOp op, const Operand* srcs, int nsrc, const Operand* dsts, int ndst,
                                    int64_t n) {
  switch (op) {
    case ReduceOp::kSum: return reduce_typed<Tr, Sum>(srcs, nsrc, dsts, ndst, n);
    case ReduceOp::kMax: return reduce_typed<Tr, Max>(srcs, nsrc, dsts, ndst, n);
    case ReduceOp::kMin: return reduce_typed<Tr, Min>(srcs, nsrc, dsts, ndst, n);
  }
}

#define JAXCOLL_DEFINE_KERNEL(NAME, TRAITS)                                                                  \
  JAXCOLL_CLONES void NAME(ReduceOp op, const Operand* srcs, int nsrc, const Operand* dsts, int ndst,        \
                           int64_t n) {                                                                      \
    reduce_dispatch<TRAITS>(op, srcs, nsrc, dsts, ndst, n);                                                  \
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

void reduce_chunks(DType dtype, ReduceOp op, const Operand* srcs, int nsrc, const Operand* dsts, int ndst,
                   int64_t n) {
  if (n <= 0) return;
  const size_t dsize = dtype_size(dtype), asize = accum_size(dtype);
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
      if (dsts[d].ptr != srcs[0].ptr) std::memcpy(dsts[d].ptr, srcs[0].ptr, size_t(n) * (srcs[0].accum ? asize : dsize));
    }
    if (all_plain) return;
  }
  if (dtype == DType::kBool && op == ReduceOp::kSum) op = ReduceOp::kMax;  // logical or
  switch (dtype) {
    case DType::kF16: return reduce_f16(op, srcs, nsrc, dsts, ndst, n);
    case DType::kBF16: return reduce_bf16(op, srcs, nsrc, dsts, ndst, n);
    case DType::kF32: return reduce_f32(op, srcs, nsrc, dsts, ndst, n);
    case DType::kF64: return reduce_f64(op, srcs, nsrc, dsts, ndst, n);
    case DType::kI8: return reduce_i8(op, srcs, nsrc, dsts, ndst, n);
    case DType::kI32: return reduce_i32(op, srcs, nsrc, dsts, ndst, n);
    case DType::kI64: return reduce_i64(op, srcs, nsrc, dsts, ndst, n);
    case DType::kU8: case DType::kBool: return reduce_u8(op, srcs, nsrc, dsts, ndst, n);
    case DType::kU32: return reduce_u32(op, srcs, nsrc, dsts, ndst, n);
  }
}

}  // namespace jaxcoll
