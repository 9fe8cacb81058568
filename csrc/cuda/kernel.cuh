// The executor kernel: one launch runs one call of a plan for `launch_ranks` ranks (docs/cuda.md). Every lane of
// every rank is `blocks_per_lane` thread blocks that walk the lane's steps together, each moving its share of
// every data step; they meet only where a step depends on elements another block of the lane wrote. A semaphore
// is B monotonic counters in the receiving rank's slot, one per block of the signalling lane (release on
// signal, acquire on wait): block b of the signaller, after its own share of the step, adds 1 to counter b, and
// a wait for the j-th signal of call e waits until every counter reaches e*S + j + 1, S being the signals the
// semaphore receives per call. (One shared counter waiting for B*(e*S + j + 1) is wrong: the blocks of a lane
// drift apart, and a fast block's signal of step j+1 can stand in for a slow block's of step j, whose share is
// not written yet; seen on an H100 at 32 blocks per lane.) Every spin is bounded: a timeout claims the error
// record (host-mapped) and every block of the group stops, so a broken plan never hangs the GPU.
//
// Included by the kernels_*.cu files only, each instantiating plan_kernel for some element types.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cuda/atomic>
#include <cstdint>
#include <type_traits>

#include "csrc/abi.hpp"
#include "csrc/cuda/kernel_params.hpp"
#include "csrc/dtype.hpp"

namespace jaxcoll::cuda {

// ---- element types: stored as D, reduced as A -------------------------------------------------------------
template <class T>
struct Plain {
  using D = T;
  using A = T;
  static __device__ __forceinline__ A load(D x) { return x; }
  static __device__ __forceinline__ D store(A x) { return x; }
};
struct Half {
  using D = __half;
  using A = float;
  static __device__ __forceinline__ A load(D x) { return __half2float(x); }
  static __device__ __forceinline__ D store(A x) { return __float2half_rn(x); }  // nearest even
};
struct BFloat16 {
  using D = __nv_bfloat16;
  using A = float;
  static __device__ __forceinline__ A load(D x) { return __bfloat162float(x); }
  static __device__ __forceinline__ D store(A x) { return __float2bfloat16_rn(x); }  // nearest even
};

// ---- reductions: floating max/min propagate NaN, integer sums wrap (as csrc/reduce.cc) ----------------------
struct Sum {
  template <class A>
  static __device__ __forceinline__ A apply(A a, A b) {
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
  static __device__ __forceinline__ A apply(A a, A b) { return (a > b || a != a) ? a : b; }
};
struct Min {
  template <class A>
  static __device__ __forceinline__ A apply(A a, A b) { return (a < b || a != a) ? a : b; }
};

// ---- memory ordering ----------------------------------------------------------------------------------------
// A word's scope is the narrowest that holds every thread touching it (KernelParams::peer_scope, own_scope):
// system where peers may be other GPUs (NVLink/PCIe peer memory), device where only this GPU's blocks touch it,
// which costs about half as much per access (tools/gpu_floor.cu measures both). The error record, host memory,
// is always system scope.
template <::cuda::thread_scope S>
using Word = ::cuda::atomic_ref<unsigned long long, S>;

__device__ __forceinline__ unsigned long long& word(uint64_t* p) { return *reinterpret_cast<unsigned long long*>(p); }

__device__ __forceinline__ uint64_t load_acquire(uint64_t* p, int32_t device) {
  return device ? Word<::cuda::thread_scope_device>(word(p)).load(::cuda::memory_order_acquire)
                : Word<::cuda::thread_scope_system>(word(p)).load(::cuda::memory_order_acquire);
}
__device__ __forceinline__ void store_release(uint64_t* p, uint64_t v, int32_t device) {
  if (device) Word<::cuda::thread_scope_device>(word(p)).store(v, ::cuda::memory_order_release);
  else Word<::cuda::thread_scope_system>(word(p)).store(v, ::cuda::memory_order_release);
}
__device__ __forceinline__ uint64_t add_release(uint64_t* p, uint64_t v, int32_t device) {
  return device ? Word<::cuda::thread_scope_device>(word(p)).fetch_add(v, ::cuda::memory_order_release)
                : Word<::cuda::thread_scope_system>(word(p)).fetch_add(v, ::cuda::memory_order_release);
}
__device__ __forceinline__ uint64_t add_acq_rel(uint64_t* p, uint64_t v, int32_t device) {
  return device ? Word<::cuda::thread_scope_device>(word(p)).fetch_add(v, ::cuda::memory_order_acq_rel)
                : Word<::cuda::thread_scope_system>(word(p)).fetch_add(v, ::cuda::memory_order_acq_rel);
}

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---- failure ------------------------------------------------------------------------------------------------
struct Where {
  int32_t rank, lane, step, sem, peer, buffer;
};

__device__ __forceinline__ bool aborted(const ErrorRecord* rec) {
  return *reinterpret_cast<const volatile uint32_t*>(&rec->claim) != 0;
}

__device__ inline void fail(ErrorRecord* rec, Failure why, const Where& w, uint64_t have, uint64_t need, uint64_t epoch) {
  ::cuda::atomic_ref<uint32_t, ::cuda::thread_scope_system> claim(rec->claim);
  uint32_t expected = 0;
  if (!claim.compare_exchange_strong(expected, 1u, ::cuda::memory_order_relaxed)) return;
  rec->rank = w.rank, rec->lane = w.lane, rec->step = w.step, rec->sem = w.sem, rec->peer = w.peer;
  rec->buffer = w.buffer, rec->have = have, rec->need = need, rec->epoch = epoch;
  ::cuda::atomic_ref<uint32_t, ::cuda::thread_scope_system>(rec->code).store(static_cast<uint32_t>(why),
                                                                          ::cuda::memory_order_release);
}

// A bounded spin: true once `done()` holds; false (after claiming the record, unless another block already did)
// when the timeout passes or another block of the group has failed. The clock and the record are read every
// 256 rounds: the record is host memory, a PCIe round trip away.
// Waits that only follow another (a peer finishing its steps, a lane reaching a barrier, a block of the lane
// reaching a meeting, a peer finishing the call before last) give up after twice the timeout, so the wait that
// caused them claims the record first and the message names the cause, not its echo.
__device__ __forceinline__ bool follows_another_wait(Failure why) {
  return why == Failure::kExit || why == Failure::kBarrier || why == Failure::kMeeting || why == Failure::kPrevious;
}

template <class Done>
__device__ bool spin(const KernelParams& p, Done done, Failure why, const Where& w, uint64_t need, uint64_t epoch,
                     uint64_t* counter, int32_t scope = 0) {
  const uint64_t timeout_ns = follows_another_wait(why) ? 2 * p.timeout_ns : p.timeout_ns;
  uint64_t start = 0;
  for (uint32_t round = 0;; ++round) {
    if (done()) return true;
    if ((round & 255) == 255) {
      if (aborted(p.error)) return false;
      const uint64_t now = global_ns();
      if (start == 0) start = now;
      else if (now - start > timeout_ns) {
        fail(p.error, why, w, counter ? load_acquire(counter, scope) : 0, need, epoch);
        return false;
      }
      __nanosleep(64);
    }
  }
}

__device__ __forceinline__ bool wait_at_least(const KernelParams& p, uint64_t* counter, uint64_t need, Failure why,
                                              const Where& w, uint64_t epoch, int32_t scope) {
  return spin(p, [&] { return load_acquire(counter, scope) >= need; }, why, w, need, epoch, counter, scope);
}

// ---- the packet protocol ------------------------------------------------------------------------------------
// A packet carries one element with its call's flag in a single store: 8 bytes {data, flag} for elements of up
// to 4 bytes, 16 bytes {lo, flag, hi, flag} for 8-byte ones (both flags checked, so a torn read is never
// accepted). Volatile accesses bypass L1, so a poll sees a peer's store as soon as it lands.
template <class V>
__device__ __forceinline__ void put_packet(char* base, int64_t i, V v, uint32_t flag) {
  if constexpr (sizeof(V) <= 4) {
    uint32_t bits = 0;
    memcpy(&bits, &v, sizeof(V));
    asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(base + i * 8), "r"(bits), "r"(flag) : "memory");
  } else {
    uint64_t bits;
    memcpy(&bits, &v, 8);
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(base + i * 16),
                 "r"(static_cast<uint32_t>(bits)), "r"(flag), "r"(static_cast<uint32_t>(bits >> 32)), "r"(flag)
                 : "memory");
  }
}

template <class V>
__device__ __forceinline__ bool try_packet(const char* base, int64_t i, uint32_t flag, V& out) {
  if constexpr (sizeof(V) <= 4) {
    uint32_t bits, f;
    asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(bits), "=r"(f) : "l"(base + i * 8) : "memory");
    if (f != flag) return false;
    memcpy(&out, &bits, sizeof(V));
  } else {
    uint32_t lo, f0, hi, f1;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(lo), "=r"(f0), "=r"(hi), "=r"(f1)
                 : "l"(base + i * 16)
                 : "memory");
    if (f0 != flag || f1 != flag) return false;
    const uint64_t bits = (uint64_t{hi} << 32) | lo;
    memcpy(&out, &bits, 8);
  }
  return true;
}

template <class V>
__device__ __forceinline__ constexpr int64_t packet_size() { return sizeof(V) <= 4 ? 8 : 16; }

// A packet as loaded, before its flag is checked: {bits, flag} in x, y, or {lo, flag, hi, flag}.
template <int64_t P>
__device__ __forceinline__ uint4 load_packet(const char* at) {
  uint4 r = make_uint4(0, 0, 0, 0);
  if constexpr (P == 8)
    asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(at) : "memory");
  else
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(at)
                 : "memory");
  return r;
}

template <int64_t P>
__device__ __forceinline__ bool packet_current(const uint4& r, uint32_t flag) {
  return P == 8 ? r.y == flag : (r.y == flag && r.w == flag);
}

template <class V>
__device__ __forceinline__ V packet_value(const uint4& r) {
  V v;
  if constexpr (sizeof(V) <= 4) {
    memcpy(&v, &r.x, sizeof(V));
  } else {
    const uint64_t bits = (uint64_t{r.z} << 32) | r.x;
    memcpy(&v, &bits, 8);
  }
  return v;
}

// ---- operands of a data step --------------------------------------------------------------------------------
enum OperandKind : int32_t { kData = 0, kAccum = 1, kDataPackets = 2, kAccumPackets = 3 };

struct Operand {
  char* ptr;  // the first element (or packet) of the step's range
  int32_t kind;
};

// Everything a block knows about the call it is running.
struct Call {
  int32_t rank, local, lane, part;
  uint64_t epoch;
  uint32_t flag;    // packet flag of this call: epoch + 1 (mirrors start zeroed)
  int32_t parity;   // which of the two packet mirrors this call uses
  bool packets;     // packet protocol
};

template <class T>
__device__ __forceinline__ typename T::A load_elem(const KernelParams& p, const Call& c, const Operand& o,
                                                    int64_t i, bool& ok, const Where& w) {
  using D = typename T::D;
  using A = typename T::A;
  switch (o.kind) {
    case kData: return T::load(reinterpret_cast<const D*>(o.ptr)[i]);
    case kAccum: return reinterpret_cast<const A*>(o.ptr)[i];
    case kDataPackets: {
      D v{};
      if (!spin(p, [&] { return try_packet(o.ptr, i, c.flag, v); }, Failure::kPacket, w, c.flag, c.epoch, nullptr))
        ok = false;
      return T::load(v);
    }
    default: {
      A v{};
      if (!spin(p, [&] { return try_packet(o.ptr, i, c.flag, v); }, Failure::kPacket, w, c.flag, c.epoch, nullptr))
        ok = false;
      return v;
    }
  }
}

template <class T>
__device__ __forceinline__ void store_elem(const Call& c, const Operand& o, int64_t i, typename T::A v) {
  using D = typename T::D;
  using A = typename T::A;
  switch (o.kind) {
    case kData: reinterpret_cast<D*>(o.ptr)[i] = T::store(v); break;
    case kAccum: reinterpret_cast<A*>(o.ptr)[i] = v; break;
    case kDataPackets: put_packet<D>(o.ptr, i, T::store(v), c.flag); break;
    default: put_packet<A>(o.ptr, i, v, c.flag); break;
  }
}

// 16 bytes of D: V elements. An operand in the accumulation type spans V*sizeof(A) bytes (16 or 32).
template <class T>
struct Vec {
  static constexpr int V = 16 / sizeof(typename T::D);
  static constexpr int kAccumWords = V * sizeof(typename T::A) / 16;  // 1 or 2 uint4
};

template <class T>
__device__ __forceinline__ void load_vec(const Operand& o, int64_t i, typename T::A (&out)[Vec<T>::V]) {
  using D = typename T::D;
  using A = typename T::A;
  constexpr int V = Vec<T>::V;
  if (o.kind == kData) {
    const uint4 raw = *reinterpret_cast<const uint4*>(o.ptr + i * int64_t(sizeof(D)));
    D d[V];
    memcpy(d, &raw, 16);
#pragma unroll
    for (int u = 0; u < V; ++u) out[u] = T::load(d[u]);
  } else {
    uint4 raw[Vec<T>::kAccumWords];
#pragma unroll
    for (int w = 0; w < Vec<T>::kAccumWords; ++w)
      raw[w] = reinterpret_cast<const uint4*>(o.ptr + i * int64_t(sizeof(A)))[w];
    memcpy(out, raw, sizeof(raw));
  }
}

template <class T>
__device__ __forceinline__ void store_vec(const Operand& o, int64_t i, const typename T::A (&in)[Vec<T>::V]) {
  using D = typename T::D;
  using A = typename T::A;
  constexpr int V = Vec<T>::V;
  if (o.kind == kData) {
    D d[V];
#pragma unroll
    for (int u = 0; u < V; ++u) d[u] = T::store(in[u]);
    uint4 raw;
    memcpy(&raw, d, 16);
    *reinterpret_cast<uint4*>(o.ptr + i * int64_t(sizeof(D))) = raw;
  } else {
    uint4 raw[Vec<T>::kAccumWords];
    memcpy(raw, in, sizeof(raw));
#pragma unroll
    for (int w = 0; w < Vec<T>::kAccumWords; ++w) reinterpret_cast<uint4*>(o.ptr + i * int64_t(sizeof(A)))[w] = raw[w];
  }
}

__device__ __forceinline__ int64_t operand_esize(int32_t kind, int64_t dsize, int64_t asize) {
  return kind == kData ? dsize : asize;
}

// ---- the block's shared state -------------------------------------------------------------------------------
// A lane's steps and chunk references held in shared memory (Shared::steps, refs): 6 KiB, enough for the built-in
// and synthesized plans' lanes at small sizes, where the per-step decoding is most of a call's time.
inline constexpr int32_t kCachedSteps = 64;
inline constexpr int32_t kCachedRefs = 256;

struct Shared {
  char* slots[kMaxRanks];
  const void* inputs[kMaxRanks];   // bulk: every rank's published buffers for this call
  void* outputs[kMaxRanks];
  Operand ops[kMaxStepRefs];
  // The block's lane, copied from the plan image at entry when it fits (cached): the steps are then read from
  // shared memory, not through a chain of dependent loads from global memory at every step.
  DeviceStep steps[kCachedSteps];
  Span spans[kCachedSteps];
  ChunkRef refs[kCachedRefs];
  int64_t starts[kCachedRefs];
  uint64_t epoch;
  int32_t stop;                    // a thread of this block failed or saw the group fail
  int32_t last;                    // this block is its rank's last to finish the call
};

__device__ __forceinline__ SlotHeader& header(char* slot) { return *reinterpret_cast<SlotHeader*>(slot); }
__device__ __forceinline__ uint64_t* semaphores(const KernelParams& p, char* slot) {
  return reinterpret_cast<uint64_t*>(slot + p.layout.semaphores);
}

// Elements [lo, hi) of a span that block `part` moves (Span: worked out by the launcher).
__device__ __forceinline__ void share(const Span& span, int32_t part, int64_t& lo, int64_t& hi) {
  lo = min(span.n, span.per * part);
  hi = min(span.n, lo + span.per);
}

// Sources a packet step polls at once: each poll round issues the loads of every packet of the batch still
// missing before it checks any flag, so an element waits about one load latency rather than one per source
// (tools/gpu_floor.cu: 6.0 -> 4.5 us for the 8-rank 8 KiB all_reduce). 8 covers a direct plan's sources at 8
// ranks in one batch; 16-byte packets (8-byte elements) take 4, so the loads stay in the 64 registers the
// launch bounds allow.
template <int64_t P>
inline constexpr int kPollBatch = P == 8 ? 8 : 4;

// Element i of a step's reduction over its sources, some of them packets, with the polls of each batch in
// flight together; reduced in source order, as the ordered path does. False once a spin gave up.
template <class T, class R>
__device__ __forceinline__ bool reduce_in_flight(const KernelParams& p, const Call& c, const Operand* ops,
                                                 int32_t nsrc, int64_t i, typename T::A& acc, const Where& w) {
  using D = typename T::D;
  using A = typename T::A;
  constexpr int64_t P = packet_size<D>();
  static_assert(packet_size<D>() == packet_size<A>(), "a step's data and accumulation packets share one size");
  constexpr int kBatch = kPollBatch<P>;
  for (int32_t j0 = 0; j0 < nsrc; j0 += kBatch) {
    const int32_t m = min(kBatch, nsrc - j0);
    A v[kBatch];
    uint32_t missing = 0;
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (u >= m) continue;
      const Operand& o = ops[j0 + u];
      if (o.kind == kData) v[u] = T::load(reinterpret_cast<const D*>(o.ptr)[i]);
      else if (o.kind == kAccum) v[u] = reinterpret_cast<const A*>(o.ptr)[i];
      else missing |= 1u << u;
    }
    if (missing) {
      const bool arrived = spin(p, [&] {
        const uint32_t want = missing;  // this round's loads must not wait for its own flags
        uint4 raw[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u)
          raw[u] = (want >> u & 1u) ? load_packet<P>(ops[j0 + u].ptr + i * P) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          if (!(want >> u & 1u) || !packet_current<P>(raw[u], c.flag)) continue;
          v[u] = ops[j0 + u].kind == kDataPackets ? T::load(packet_value<D>(raw[u])) : packet_value<A>(raw[u]);
          missing &= ~(1u << u);
        }
        return missing == 0;
      }, Failure::kPacket, w, c.flag, c.epoch, nullptr);
      if (!arrived) return false;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (u < m) acc = j0 + u == 0 ? v[u] : R::apply(acc, v[u]);
  }
  return true;
}

// One data step, this block's share: reduce the sources in order in the accumulation type, write every
// destination. Vectorised (16-byte accesses) where every operand is plain memory and can be aligned together.
template <class T, class R>
__device__ void data_step(const KernelParams& p, const Call& c, Shared& sh, const DeviceStep& s, const Span& span,
                          const ChunkRef* refs, const int64_t* starts, Where w) {
  using D = typename T::D;
  using A = typename T::A;
  constexpr int V = Vec<T>::V;
  const int32_t nref = s.nsrc + s.ndst;
  for (int32_t j = threadIdx.x; j < nref; j += blockDim.x) {
    const ChunkRef r = refs[j];
    const bool accum = r.buffer == BufferKind::kScratch;
    const int b = static_cast<int>(r.buffer);
    const bool packets = c.packets && (p.ranks[r.rank].shared >> b & 1u);
    char* base;
    int32_t kind;
    if (packets) {
      base = sh.slots[r.rank] + p.layout.packets[b] + c.parity * p.layout.packet_bytes[b];
      kind = accum ? kAccumPackets : kDataPackets;
    } else {
      kind = accum ? kAccum : kData;
      if (accum) base = sh.slots[r.rank] + p.layout.scratch;
      else if (r.buffer == BufferKind::kInput) base = static_cast<char*>(const_cast<void*>(sh.inputs[r.rank]));
      else base = static_cast<char*>(sh.outputs[r.rank]);
    }
    const int64_t esize = packets ? (accum ? packet_size<A>() : packet_size<D>()) : (accum ? sizeof(A) : sizeof(D));
    sh.ops[j] = {base + starts[j] * esize, kind};
  }
  __syncthreads();
  int64_t lo, hi;
  share(span, c.part, lo, hi);
  if (lo >= hi) return;
  const Operand* ops = sh.ops;

  // Vector path: peel `head` elements so that every operand is 16-byte aligned, if one head fits all.
  bool vec = true;
  int64_t head = 0;
  for (int32_t j = 0; j < nref && vec; ++j) {
    const Operand& o = ops[j];
    if (o.kind >= kDataPackets) { vec = false; break; }
    const int64_t es = operand_esize(o.kind, sizeof(D), sizeof(A));
    const uintptr_t addr = reinterpret_cast<uintptr_t>(o.ptr) + uintptr_t(lo * es);
    if (j == 0) {
      const int64_t rem = int64_t((16 - (addr & 15)) & 15);
      if (rem % es) vec = false;
      else head = rem / es;
    } else if ((addr + uintptr_t(head * es)) & 15) {
      vec = false;
    }
  }
  int64_t nvec = vec ? (hi - lo - head) / V : 0;
  if (nvec <= 0) nvec = 0, head = hi - lo;  // all scalar
  const int64_t vstart = lo + head, vstop = vstart + nvec * V;

  bool ok = true;
  bool in_flight = false;  // packet sources, polled together
  if (c.packets && p.polls_in_flight)
    for (int32_t j = 0; j < s.nsrc && !in_flight; ++j) in_flight = ops[j].kind >= kDataPackets;
  auto scalar = [&](int64_t i) {
    A acc = A(0);
    if (in_flight) {
      ok = reduce_in_flight<T, R>(p, c, ops, s.nsrc, i, acc, w);
    } else if (s.nsrc) {
      acc = load_elem<T>(p, c, ops[0], i, ok, w);
      for (int32_t j = 1; j < s.nsrc; ++j) acc = R::apply(acc, load_elem<T>(p, c, ops[j], i, ok, w));
    }
    if (!ok) return;
    for (int32_t j = s.nsrc; j < nref; ++j) store_elem<T>(c, ops[j], i, acc);
  };
  for (int64_t i = lo + threadIdx.x; i < vstart && ok; i += blockDim.x) scalar(i);
  for (int64_t i = vstop + threadIdx.x; i < hi && ok; i += blockDim.x) scalar(i);
  // Two vectors per thread per round: twice the loads in flight.
  for (int64_t v = threadIdx.x; v < nvec; v += 2 * blockDim.x) {
    const int64_t i0 = vstart + v * V, i1 = i0 + int64_t(blockDim.x) * V;
    const bool two = v + blockDim.x < nvec;
    A a0[V], a1[V];
    if (s.nsrc) {
      load_vec<T>(ops[0], i0, a0);
      if (two) load_vec<T>(ops[0], i1, a1);
      for (int32_t j = 1; j < s.nsrc; ++j) {
        A b0[V], b1[V];
        load_vec<T>(ops[j], i0, b0);
        if (two) load_vec<T>(ops[j], i1, b1);
#pragma unroll
        for (int u = 0; u < V; ++u) a0[u] = R::apply(a0[u], b0[u]);
        if (two) {
#pragma unroll
          for (int u = 0; u < V; ++u) a1[u] = R::apply(a1[u], b1[u]);
        }
      }
    } else {
#pragma unroll
      for (int u = 0; u < V; ++u) a0[u] = a1[u] = A(0);
    }
    for (int32_t j = s.nsrc; j < nref; ++j) {
      store_vec<T>(ops[j], i0, a0);
      if (two) store_vec<T>(ops[j], i1, a1);
    }
  }
  if (!ok) sh.stop = 1;
}

// The packet protocol's first and last moves of a call, spread over all of a rank's blocks: publish the input
// as packets (when peers read it), and copy the output chunks written in packets into the output.
template <class T>
__device__ void pack_input(const KernelParams& p, const Call& c, Shared& sh, int32_t rank_block) {
  using D = typename T::D;
  char* mirror = sh.slots[c.rank] + p.layout.packets[0] + c.parity * p.layout.packet_bytes[0];
  const D* in = static_cast<const D*>(p.calls[c.local].input);
  int64_t lo, hi;
  share(p.pack[c.local], rank_block, lo, hi);
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) put_packet<D>(mirror, i, in[i], c.flag);
}

template <class T>
__device__ void unpack_output(const KernelParams& p, const Call& c, Shared& sh, const DeviceRank& dr,
                              int32_t rank_block) {
  using D = typename T::D;
  const char* mirror = sh.slots[c.rank] + p.layout.packets[1] + c.parity * p.layout.packet_bytes[1];
  D* out = static_cast<D*>(p.calls[c.local].output);
  bool ok = true;
  const Where w{c.rank, -1, -1, -1, c.rank, static_cast<int32_t>(BufferKind::kOutput)};
  for (int32_t u = 0; u < dr.nunpack && ok; ++u) {
    const Span run = p.unpack_span[dr.first_unpack + u];
    const int64_t start = run.start;
    int64_t lo, hi;
    share(run, rank_block, lo, hi);
    for (int64_t i = start + lo + threadIdx.x; i < start + hi && ok; i += blockDim.x) {
      D v{};
      ok = spin(p, [&] { return try_packet(mirror, i, c.flag, v); }, Failure::kPacket, w, c.flag, c.epoch, nullptr);
      if (ok) out[i] = v;
    }
  }
  if (!ok) sh.stop = 1;
}

// ---- the kernel ---------------------------------------------------------------------------------------------
template <class T, class R>
__global__ void __launch_bounds__(kThreads, kResidentBlocksPerSM) plan_kernel(const KernelParams p) {
  __shared__ Shared sh;
  const int32_t B = p.blocks_per_lane;
  const int32_t per_rank = p.max_lanes * B;
  Call c;
  c.local = blockIdx.x / per_rank;
  c.rank = p.first_rank + c.local;
  c.lane = (blockIdx.x % per_rank) / B;
  c.part = blockIdx.x % B;
  const DeviceRank dr = p.ranks[c.rank];
  if (c.lane >= dr.nlanes) return;  // ranks with fewer lanes than the widest leave these blocks idle
  const int32_t rank_block = c.lane * B + c.part, rank_blocks = dr.nlanes * B;
  c.packets = p.protocol == static_cast<int32_t>(Protocol::kLL);
  const int32_t peer = p.peer_scope, own = p.own_scope;

  // Entry loads, all in flight together: the slot table, this rank's epoch, and the lane's steps and refs.
  const DeviceLane ln = p.lanes[p.first_lane[c.local] + c.lane];
  const bool cached = ln.nsteps <= kCachedSteps && ln.nrefs <= kCachedRefs;
  for (int32_t t = threadIdx.x; t < p.nranks; t += blockDim.x) sh.slots[t] = p.slots[t];
  if (cached) {
    for (int32_t t = threadIdx.x; t < ln.nsteps; t += blockDim.x) {
      sh.steps[t] = p.steps[ln.first_step + t];
      sh.spans[t] = p.step_span[ln.first_step + t];
    }
    for (int32_t t = threadIdx.x; t < ln.nrefs; t += blockDim.x) {
      sh.refs[t] = p.refs[ln.first_ref + t];
      sh.starts[t] = p.ref_start[ln.first_ref + t];
    }
  }
  if (threadIdx.x == 0) {
    sh.stop = 0;
    sh.last = 0;
    sh.epoch = load_acquire(&header(p.slots[c.rank]).epoch, peer);
  }
  __syncthreads();
  char* const me = sh.slots[c.rank];
  SlotHeader& hdr = header(me);
  c.epoch = sh.epoch;
  c.flag = static_cast<uint32_t>(c.epoch + 1);
  c.parity = static_cast<int32_t>(c.epoch & 1);
  const uint64_t e = c.epoch;

  // Entry. Bulk: publish this call's buffers, then read every peer's once it has published its own.
  // Packets: no rendezvous; only make sure no peer still reads the mirrors of the call before last, which
  // this call overwrites (almost always long finished).
  if (!c.packets) {
    if (rank_block == 0 && threadIdx.x == 0) {
      // Staged (a group spanning processes): the buffers are in this rank's slot, and a peer process maps the
      // slot at another address, so publish offsets from the slot's start rather than pointers.
      const char* in = static_cast<const char*>(p.calls[c.local].input);
      char* out = static_cast<char*>(p.calls[c.local].output);
      hdr.input = p.staged ? reinterpret_cast<const void*>(static_cast<uintptr_t>(in - me)) : in;
      hdr.output = p.staged ? reinterpret_cast<void*>(static_cast<uintptr_t>(out - me)) : out;
      store_release(&hdr.arrived, e + 1, peer);
    }
    for (int32_t t = threadIdx.x; t < p.nranks; t += blockDim.x) {
      SlotHeader& other = header(sh.slots[t]);
      const Where w{c.rank, c.lane, -1, -1, t, -1};
      if (!wait_at_least(p, &other.arrived, e + 1, Failure::kEntry, w, e, peer)) sh.stop = 1;
      if (p.staged) {  // offsets into the peer's slot, which this process reaches through its own mapping
        sh.inputs[t] = sh.slots[t] + reinterpret_cast<uintptr_t>(other.input);
        sh.outputs[t] = sh.slots[t] + reinterpret_cast<uintptr_t>(other.output);
      } else {
        sh.inputs[t] = other.input;
        sh.outputs[t] = other.output;
      }
    }
  } else {
    for (int32_t t = threadIdx.x; t < p.nranks; t += blockDim.x) {
      sh.inputs[t] = t == c.rank ? p.calls[c.local].input : nullptr;  // peers' buffers are never touched
      sh.outputs[t] = t == c.rank ? p.calls[c.local].output : nullptr;
      const Where w{c.rank, c.lane, -1, -1, t, -1};
      if (e >= 2 && t != c.rank &&
          !wait_at_least(p, &header(sh.slots[t]).epoch, e - 1, Failure::kPrevious, w, e, peer))
        sh.stop = 1;
    }
    if (dr.shared & kSharedInput) pack_input<T>(p, c, sh, rank_block);
  }
  __syncthreads();

  // The lane's steps.
  int32_t barriers = 0;
  const bool timed = p.step_times && c.part == 0 && threadIdx.x == 0;  // a traced call's timer (step_times)
  for (int32_t i = 0; i < ln.nsteps && !sh.stop; ++i) {
    if (timed) p.step_times[2 * (ln.first_step + i)] = global_ns();
    const DeviceStep s = cached ? sh.steps[i] : p.steps[ln.first_step + i];
    const Where w{c.rank, c.lane, i, s.sem, s.peer, -1};
    if (s.sync_before && B > 1) {  // this step depends on elements another block of the lane wrote
      __syncthreads();
      if (threadIdx.x == 0) {
        uint64_t* m = &hdr.lane_meetings[c.lane];
        add_release(m, 1, own);
        if (!wait_at_least(p, m, uint64_t(B) * (e * ln.nsyncs + s.sync_before), Failure::kMeeting, w, e, own))
          sh.stop = 1;
      }
      __syncthreads();
      if (sh.stop) break;
    }
    switch (static_cast<Op>(s.op)) {
      case Op::kWait:
        if (threadIdx.x < B) {  // thread t waits for block t of the signalling lane
          const uint64_t per_call = p.signals_per_call[c.rank * p.max_semaphores + s.sem];
          const uint64_t need = e * per_call + s.ordinal + 1;
          Where wt = w;
          wt.buffer = threadIdx.x;
          uint64_t* counter = &semaphores(p, me)[s.sem * kMaxBlocksPerLane + threadIdx.x];
          if (!wait_at_least(p, counter, need, Failure::kWait, wt, e, peer)) sh.stop = 1;
        }
        __syncthreads();
        break;
      case Op::kSignal:
        __syncthreads();  // the block's writes before the signal ...
        if (threadIdx.x == 0)  // ... released with it, on this block's counter
          add_release(&semaphores(p, sh.slots[s.peer])[s.sem * kMaxBlocksPerLane + c.part], 1, peer);
        break;
      case Op::kBarrier:
        __syncthreads();
        ++barriers;
        if (threadIdx.x == 0) {
          add_release(&hdr.lane_arrivals[c.lane], 1, own);
          for (int32_t o = 0; o < dr.nlanes && !sh.stop; ++o) {
            const int32_t nb = p.lanes[dr.first_lane + o].nbarriers + 1;  // + 1: the lane's end
            const uint64_t need = uint64_t(B) * (e * nb + min(barriers, nb));
            const Where wo{c.rank, o, i, -1, -1, -1};
            if (!wait_at_least(p, &hdr.lane_arrivals[o], need, Failure::kBarrier, wo, e, own)) sh.stop = 1;
          }
        }
        __syncthreads();
        break;
      default:
        if (cached) {
          const int32_t r = s.first_ref - ln.first_ref;
          data_step<T, R>(p, c, sh, s, sh.spans[i], sh.refs + r, sh.starts + r, w);
        } else {
          data_step<T, R>(p, c, sh, s, p.step_span[ln.first_step + i], p.refs + s.first_ref,
                          p.ref_start + s.first_ref, w);
        }
        __syncthreads();
        break;
    }
    // A signal's end is after its release, so a wait that consumed it may end first, by less than the timer's step.
    if (timed && !sh.stop) p.step_times[2 * (ln.first_step + i) + 1] = global_ns();
  }
  if (dr.has_barriers && threadIdx.x == 0)  // a finished lane counts as arrived at every later barrier
    add_release(&hdr.lane_arrivals[c.lane], uint64_t(ln.nbarriers + 1 - barriers), own);

  if (c.packets && (dr.shared & kSharedOutput) && !sh.stop) unpack_output<T>(p, c, sh, dr, rank_block);
  __syncthreads();

  // Exit: the rank's last block to finish waits until every peer has finished this call's steps (bulk: peers
  // read and write this rank's buffers), then opens the next call by advancing the epoch.
  if (threadIdx.x == 0 && !sh.stop) {
    const uint64_t before = add_acq_rel(&hdr.blocks_done, 1, own);
    sh.last = before == (e + 1) * uint64_t(rank_blocks) - 1;
  }
  __syncthreads();
  if (!sh.last) return;
  if (!c.packets) {
    for (int32_t t = threadIdx.x; t < p.nranks; t += blockDim.x)
      if (t != c.rank) store_release(&header(sh.slots[t]).exit_from[c.rank], e + 1, peer);
    for (int32_t t = threadIdx.x; t < p.nranks; t += blockDim.x) {
      const Where w{c.rank, -1, -1, -1, t, -1};
      if (t != c.rank && !wait_at_least(p, &hdr.exit_from[t], e + 1, Failure::kExit, w, e, peer)) sh.stop = 1;
    }
    __syncthreads();
  }
  // Peers read the epoch (the packet protocol's check of the call before last), hence its scope.
  if (threadIdx.x == 0 && !sh.stop) store_release(&hdr.epoch, e + 1, peer);
}

// The kernel of element type T for a reduction, as an untyped pointer for cudaLaunchKernelExC.
template <class T>
const void* plan_kernel_by_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return reinterpret_cast<const void*>(&plan_kernel<T, Sum>);
    case ReduceOp::kMax: return reinterpret_cast<const void*>(&plan_kernel<T, Max>);
    case ReduceOp::kMin: return reinterpret_cast<const void*>(&plan_kernel<T, Min>);
  }
  return nullptr;
}

}  // namespace jaxcoll::cuda
