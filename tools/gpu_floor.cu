// What the packet protocol's per-call time is made of on the GPU at hand, and what an 8-rank 8 KiB packet
// all_reduce could cost (issue 14's goal: under 10 us; docs/gpu-rounds/2026-11-26/profile-packet.md has what the
// executor takes). Two tables, printed as markdown under the GPU's name:
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/gpu_floor tools/gpu_floor.cu && /tmp/gpu_floor
//
// 1. What one launch of a kernel like the executor's costs before it moves any data. Each row times `kIters`
//    launches of one block of 512 threads, back to back on one stream and replayed from a CUDA graph, with CUDA
//    events; the median of 5 repetitions. Rows: an empty kernel (plain and cooperative launch); the executor's
//    entry and exit atomics at system scope and at device scope (thread 0: an acquire load, a release store, an
//    acq_rel add, a release store); 8 block barriers; a read of a host-mapped word (the error record's poll);
//    the plan decoding chain: thread 0 follows K dependent loads (K = 4, 6, 8) before a block barrier, as the
//    executor's blocks find their step through p.ranks -> p.lanes -> p.steps -> p.refs -> a slot pointer.
// 2. The packet all_reduce floor: a hand-written kernel that does what the executor's direct all_reduce plan does
//    on packets for N emulated ranks in one launch (N = 2, 4, 8; 8 KiB of float32 per rank), and nothing else:
//    no plan to decode, no chunk pointers to work out. Each rank's blocks put their input as {data, flag}
//    packets into the rank's mirror, then read all N mirrors with flag polls, sum in rank order and write the
//    output; the flag is the call number + 1 and two mirrors alternate by parity, so launches need no reset. The
//    per-call words are the executor's (epoch read at entry, `arrived` stored, the call before last checked,
//    a finished-blocks counter, the epoch advanced by the rank's last block). Rows vary the blocks per rank (1,
//    2, 4), the scope of those words (system, as the executor; device, enough on one GPU) and how a thread polls
//    an element's N packets: one source at a time, each poll waiting for its load (as the executor's
//    read_reduce does), or all N loads in flight before any flag is checked. Every row is checked afterwards:
//    every rank finished every call, and every output element equals the closed-form sum of the inputs; a row
//    that fails says FAILED and why, and the program exits 1. If these rows are far under the executor's time,
//    the gap is the executor's fixed costs (table 1); if they are not, < 10 us needs another kernel design.
//
// Every spin is bounded (~1 s of %globaltimer): a late packet sets an error word, other blocks see it and stop,
// and later launches of the row return at once, so a broken row costs about a second, never a hang. About 600k
// launches in all: a few seconds on an H100, by estimate (the second table has not run on a GPU yet).
#include <cuda/atomic>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CHECK(call)                                                                                     \
  do {                                                                                                  \
    cudaError_t e_ = (call);                                                                            \
    if (e_ != cudaSuccess) {                                                                            \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));      \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)

constexpr int kThreads = 512, kIters = 2000, kReps = 5;

// ---- table 1: a launch's fixed costs ------------------------------------------------------------------------
// `words` is 64 KiB: the first 64 bytes are the atomics' counters, the plan decoding chain's nodes start at
// kChainStride (each node 4 KiB from the last, as the plan arrays are apart, so no two share a cache line).
constexpr size_t kWordsBytes = 64 << 10;
constexpr int kChainStride = 512;  // in 8-byte words: 4 KiB
constexpr int kChainNodes = 8;

__global__ void empty_kernel(unsigned long long*, const volatile unsigned*) {}

template <cuda::thread_scope S>
__global__ void atomics_kernel(unsigned long long* words, const volatile unsigned*) {
  if (threadIdx.x == 0) {
    cuda::atomic_ref<unsigned long long, S> epoch(words[0]), arrived(words[1]), done(words[2]);
    const unsigned long long e = epoch.load(cuda::memory_order_acquire);
    arrived.store(e + 1, cuda::memory_order_release);
    done.fetch_add(1, cuda::memory_order_acq_rel);
    epoch.store(e + 1, cuda::memory_order_release);
  }
}

__global__ void barriers_kernel(unsigned long long*, const volatile unsigned*) {
  for (int i = 0; i < 8; ++i) __syncthreads();
}

__global__ void host_word_kernel(unsigned long long* words, const volatile unsigned* host) {
  if (threadIdx.x == 0 && *host == 12345u) words[3] = 1;  // never true: the read is the point
}

// Each load's address is the value the last one returned, so the K loads are K round trips to L2 (L1 starts a
// launch cold), while the other threads wait at the barrier: the price of a plan the block reads step by step.
template <int K>
__global__ void chain_kernel(unsigned long long* words, const volatile unsigned*) {
  __shared__ unsigned long long end;
  if (threadIdx.x == 0) {
    const unsigned long long* node = words + kChainStride;
    unsigned long long v = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      v = *node;
      node = reinterpret_cast<const unsigned long long*>(v);
    }
    end = v;
  }
  __syncthreads();
  if (threadIdx.x == 0 && end == 12345u) words[3] = 1;  // never true: keeps the chain's loads
}

using Kernel = void (*)(unsigned long long*, const volatile unsigned*);

// Microseconds per call: `iters` calls of `launch` back to back (graph = false) or one graph holding them,
// replayed; the median of kReps repetitions after one that warms up.
template <class Launch>
float time_us(Launch launch, int iters, bool graph, cudaStream_t s) {
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < iters; ++i) launch(s);
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    CHECK(cudaGraphDestroy(g));
  }
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> reps;
  for (int r = 0; r <= kReps; ++r) {  // the first repetition warms up
    CHECK(cudaEventRecord(a, s));
    if (graph) CHECK(cudaGraphLaunch(exec, s));
    else
      for (int i = 0; i < iters; ++i) launch(s);
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaGetLastError());
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r > 0) reps.push_back(ms * 1000.0f / iters);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  if (exec) CHECK(cudaGraphExecDestroy(exec));
  std::sort(reps.begin(), reps.end());
  return reps[reps.size() / 2];
}

float time_launch_us(Kernel k, bool cooperative, bool graph, unsigned long long* words, const unsigned* host,
                     cudaStream_t s) {
  auto launch = [&](cudaStream_t st) {
    if (cooperative) {
      void* args[] = {&words, &host};
      CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(k), 1, kThreads, args, 0, st));
    } else {
      k<<<1, kThreads, 0, st>>>(words, host);
    }
  };
  return time_us(launch, kIters, graph, s);
}

// ---- table 2: the packet all_reduce floor -------------------------------------------------------------------
constexpr int kElements = 2048;              // 8 KiB of float32 per rank: issue 14's packet target
constexpr int kPacketIters = 500;            // calls a repetition (a few ms at ~10 us a call)
constexpr int kMaxRanks = 8;
constexpr unsigned long long kTimeoutNs = 1000000000ull;  // a spin gives up after ~1 s
enum : unsigned { kLatePacket = 1, kLatePrevious = 2 };   // what the error word says went wrong

// The words of the executor's SlotHeader a packet call touches; one header per rank, in lines of their own
// (the executor's are in separate slots).
struct RankHeader {
  unsigned long long epoch;        // calls this rank finished: read at entry, advanced by the rank's last block
  unsigned long long arrived;      // e + 1 once the rank entered call e
  unsigned long long blocks_done;  // this rank's blocks that finished, over all calls
  unsigned long long pad[13];
};

struct PacketArgs {
  const float* in;       // [rank][kElements]
  float* out;            // [rank][kElements]
  uint2* mirrors;        // [rank][parity][kElements] packets {data, flag}
  RankHeader* headers;   // [rank]
  unsigned* error;       // 0, or the first failure's kLate* code
  int blocks;            // per rank
};

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The executor's packet accesses for 4-byte elements (csrc/cuda/kernel.cuh): data and flag in one 8-byte
// volatile access, so a reader that sees the call's flag sees that call's data; volatile bypasses L1.
__device__ __forceinline__ void put_packet(uint2* p, float v, uint32_t flag) {
  asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(__float_as_uint(v)), "r"(flag) : "memory");
}

__device__ __forceinline__ void load_packet(const uint2* p, uint32_t& bits, uint32_t& flag) {
  asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(bits), "=r"(flag) : "l"(p) : "memory");
}

// A bounded spin, as the executor's: the clock and the error word are read every 256 rounds. False when this
// spin timed out (it sets the error word, unless another already did) or another spin of the launch did.
template <class Done>
__device__ __forceinline__ bool spin(Done done, unsigned* error, unsigned why) {
  unsigned long long start = 0;
  for (uint32_t round = 0;; ++round) {
    if (done()) return true;
    if ((round & 255) == 255) {
      if (*reinterpret_cast<volatile unsigned*>(error) != 0) return false;
      const unsigned long long now = global_ns();
      if (start == 0) start = now;
      else if (now - start > kTimeoutNs) {
        atomicCAS(error, 0u, why);
        return false;
      }
      __nanosleep(64);
    }
  }
}

// One element's sum over the N ranks' packets (`col` is rank 0's, rank j's is `stride` packets further), the
// executor's way: a spin per source, in rank order, so each poll waits for its load before the next is issued.
template <int N>
__device__ __forceinline__ bool reduce_in_order(const uint2* col, size_t stride, uint32_t flag, unsigned* error,
                                                float& acc) {
#pragma unroll 1  // a loop over the step's sources, as the executor's
  for (int j = 0; j < N; ++j) {
    float v = 0;
    const bool ok = spin(
        [&] {
          uint32_t bits, f;
          load_packet(col + j * stride, bits, f);
          if (f != flag) return false;
          v = __uint_as_float(bits);
          return true;
        },
        error, kLatePacket);
    if (!ok) return false;
    acc = j == 0 ? v : acc + v;
  }
  return true;
}

// The same sum with every source's load in flight at once: a round issues the loads of all packets still
// missing before it checks any flag, so an element costs about one load latency, not N. Summed in rank order.
template <int N>
__device__ __forceinline__ bool reduce_in_flight(const uint2* col, size_t stride, uint32_t flag, unsigned* error,
                                                 float& acc) {
  float v[N];
  unsigned missing = (1u << N) - 1;
  const bool ok = spin(
      [&] {
        const unsigned want = missing;  // the loads' guards must not wait for this round's flags
        uint32_t bits[N], f[N];
#pragma unroll
        for (int j = 0; j < N; ++j) {
          bits[j] = f[j] = 0;
          if (want >> j & 1u) load_packet(col + j * stride, bits[j], f[j]);
        }
#pragma unroll
        for (int j = 0; j < N; ++j)
          if ((want >> j & 1u) && f[j] == flag) {
            v[j] = __uint_as_float(bits[j]);
            missing &= ~(1u << j);
          }
        return missing == 0;
      },
      error, kLatePacket);
  if (!ok) return false;
  acc = v[0];
#pragma unroll
  for (int j = 1; j < N; ++j) acc += v[j];
  return true;
}

// Elements [lo, hi) of n that block `part` of `parts` moves: contiguous pieces (the executor's share()).
__device__ __forceinline__ void share(int n, int part, int parts, int& lo, int& hi) {
  const int per = (n + parts - 1) / parts;
  lo = min(n, per * part);
  hi = min(n, lo + per);
}

// One call of the direct all_reduce on packets for N ranks: block `rank * blocks + part`. S is the scope of
// the per-call words; kInFlight picks reduce_in_flight over reduce_in_order.
// (One block per SM in the launch bounds: ptxas otherwise spills the N = 8 in-flight loop to fit four.)
template <int N, cuda::thread_scope S, bool kInFlight>
__global__ void __launch_bounds__(kThreads, 1) packet_all_reduce(const PacketArgs a) {
  using Word = cuda::atomic_ref<unsigned long long, S>;
  __shared__ unsigned long long call;
  __shared__ int skip;  // the row failed already: later launches return at once
  __shared__ int stop;  // a spin of this block gave up
  const int rank = blockIdx.x / a.blocks, part = blockIdx.x % a.blocks;
  const int tid = static_cast<int>(threadIdx.x), nthreads = static_cast<int>(blockDim.x);
  RankHeader& hdr = a.headers[rank];
  if (tid == 0) {
    skip = *reinterpret_cast<volatile unsigned*>(a.error) != 0;
    stop = 0;
    call = Word(hdr.epoch).load(cuda::memory_order_acquire);
  }
  __syncthreads();
  if (skip) return;
  const unsigned long long e = call;
  const uint32_t flag = static_cast<uint32_t>(e + 1);  // mirrors start zeroed: no stale packet carries it
  const int parity = static_cast<int>(e & 1);

  // Entry, as the executor's on packets: no rendezvous. `arrived` is stored as the executor stores it (no peer
  // reads it on packets). This call overwrites the mirrors of the call before last: every peer must have
  // finished that one (on one stream it always has; the poll is the cost, never a wait).
  if (part == 0 && tid == 0) Word(hdr.arrived).store(e + 1, cuda::memory_order_release);
  if (e >= 2 && tid < N && tid != rank) {
    Word peer(a.headers[tid].epoch);
    if (!spin([&] { return peer.load(cuda::memory_order_acquire) >= e - 1; }, a.error, kLatePrevious)) stop = 1;
  }
  int lo, hi;
  share(kElements, part, a.blocks, lo, hi);
  // The call number rides on the data too, so the host's check tells the last call's packets from older ones.
  const float* in = a.in + static_cast<size_t>(rank) * kElements;
  uint2* mine = a.mirrors + (static_cast<size_t>(rank) * 2 + parity) * kElements;
  for (int i = lo + tid; i < hi; i += nthreads) put_packet(mine + i, in[i] + static_cast<float>(e), flag);
  __syncthreads();

  // The read_reduce step: this block's share of the output, from every rank's mirror of this parity.
  if (!stop) {
    const uint2* col = a.mirrors + static_cast<size_t>(parity) * kElements;
    const size_t stride = 2 * static_cast<size_t>(kElements);
    float* out = a.out + static_cast<size_t>(rank) * kElements;
    for (int i = lo + tid; i < hi; i += nthreads) {
      float acc = 0;
      const bool ok = kInFlight ? reduce_in_flight<N>(col + i, stride, flag, a.error, acc)
                                : reduce_in_order<N>(col + i, stride, flag, a.error, acc);
      if (!ok) {
        stop = 1;
        break;
      }
      out[i] = acc;
    }
  }
  __syncthreads();

  // Exit: the rank's last block to finish opens its next call.
  if (tid == 0 && !stop &&
      Word(hdr.blocks_done).fetch_add(1, cuda::memory_order_acq_rel) == (e + 1) * a.blocks - 1)
    Word(hdr.epoch).store(e + 1, cuda::memory_order_release);
}

using PacketKernel = void (*)(PacketArgs);

template <int N>
PacketKernel packet_kernel(bool system, bool in_flight) {
  if (system)
    return in_flight ? packet_all_reduce<N, cuda::thread_scope_system, true>
                     : packet_all_reduce<N, cuda::thread_scope_system, false>;
  return in_flight ? packet_all_reduce<N, cuda::thread_scope_device, true>
                   : packet_all_reduce<N, cuda::thread_scope_device, false>;
}

PacketKernel packet_kernel(int n, bool system, bool in_flight) {
  switch (n) {
    case 2: return packet_kernel<2>(system, in_flight);
    case 4: return packet_kernel<4>(system, in_flight);
    default: return packet_kernel<8>(system, in_flight);
  }
}

// Rank r's input element i: small integers, so every sum is exact in float32 whatever the order.
float input_value(int r, int i) { return static_cast<float>(i % 251 + 1000 * r); }

// Empty when the row's last call left what it must: every rank finished every call, nothing failed, every
// output element is the closed-form sum; else why not.
std::string check_row(const PacketArgs& a, int n, unsigned long long calls) {
  char why[200];
  unsigned error = 0;
  CHECK(cudaMemcpy(&error, a.error, sizeof error, cudaMemcpyDeviceToHost));
  if (error != 0) {
    std::snprintf(why, sizeof why, "%s", error == kLatePacket ? "a packet never arrived (1 s)"
                                                             : "a peer never finished the call before last (1 s)");
    return why;
  }
  std::vector<RankHeader> headers(n);
  CHECK(cudaMemcpy(headers.data(), a.headers, n * sizeof(RankHeader), cudaMemcpyDeviceToHost));
  for (int r = 0; r < n; ++r)
    if (headers[r].epoch != calls) {
      std::snprintf(why, sizeof why, "rank %d finished %llu calls of %llu", r, headers[r].epoch, calls);
      return why;
    }
  std::vector<float> out(static_cast<size_t>(n) * kElements);
  CHECK(cudaMemcpy(out.data(), a.out, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  const unsigned long long last = calls - 1;  // the call whose packets the output must come from
  int wrong = 0;
  std::string first;
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < kElements; ++i) {
      double want = static_cast<double>(n) * static_cast<double>(last);
      for (int q = 0; q < n; ++q) want += input_value(q, i);
      const float got = out[static_cast<size_t>(r) * kElements + i];
      if (got != static_cast<float>(want) && wrong++ == 0) {
        std::snprintf(why, sizeof why, "rank %d element %d: %g, want %g", r, i, got, want);
        first = why;
      }
    }
  if (wrong == 0) return "";
  std::snprintf(why, sizeof why, "%d of %d output elements wrong; first: ", wrong, n * kElements);
  return why + first;
}

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  unsigned long long* words;
  CHECK(cudaMalloc(&words, kWordsBytes));
  {  // node k (k = 1..kChainNodes) holds the address of node k + 1; the last holds 0
    std::vector<unsigned long long> image(kWordsBytes / 8, 0);
    for (int k = 1; k < kChainNodes; ++k)
      image[k * kChainStride] = reinterpret_cast<unsigned long long>(words + (k + 1) * kChainStride);
    CHECK(cudaMemcpy(words, image.data(), kWordsBytes, cudaMemcpyHostToDevice));
  }
  unsigned* host;
  CHECK(cudaHostAlloc(&host, 64, cudaHostAllocMapped));
  *host = 0;
  unsigned* host_dev;
  CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_dev), host, 0));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  struct Row {
    const char* what;
    Kernel kernel;
  } rows[] = {{"empty", empty_kernel},
              {"entry/exit atomics, system scope", atomics_kernel<cuda::thread_scope_system>},
              {"entry/exit atomics, device scope", atomics_kernel<cuda::thread_scope_device>},
              {"8 block barriers", barriers_kernel},
              {"a host-mapped word read", host_word_kernel},
              {"plan decoding chain, 4 dependent loads", chain_kernel<4>},
              {"plan decoding chain, 6 dependent loads", chain_kernel<6>},
              {"plan decoding chain, 8 dependent loads", chain_kernel<8>}};
  std::printf("%s; one block of %d threads, %d launches, median of %d\n\n", prop.name, kThreads, kIters, kReps);
  std::printf("| kernel | launch | back to back (us) | graph replay (us) |\n|---|---|---|---|\n");
  for (const Row& row : rows)
    for (bool coop : {false, true})
      std::printf("| %s | %s | %.2f | %.2f |\n", row.what, coop ? "cooperative" : "plain",
                  time_launch_us(row.kernel, coop, false, words, host_dev, s),
                  time_launch_us(row.kernel, coop, true, words, host_dev, s));

  // Table 2. Every row starts from zeroed mirrors and counters (a row's blocks per rank fix its finished-blocks
  // thresholds) and an output of NaN, so a row passes only on what its own kernel wrote.
  PacketArgs a{};
  float* in;
  CHECK(cudaMalloc(&in, kMaxRanks * kElements * sizeof(float)));
  CHECK(cudaMalloc(&a.out, kMaxRanks * kElements * sizeof(float)));
  CHECK(cudaMalloc(&a.mirrors, kMaxRanks * 2 * kElements * sizeof(uint2)));
  CHECK(cudaMalloc(&a.headers, kMaxRanks * sizeof(RankHeader)));
  CHECK(cudaMalloc(&a.error, sizeof(unsigned)));
  a.in = in;
  {
    std::vector<float> image(static_cast<size_t>(kMaxRanks) * kElements);
    for (int r = 0; r < kMaxRanks; ++r)
      for (int i = 0; i < kElements; ++i) image[static_cast<size_t>(r) * kElements + i] = input_value(r, i);
    CHECK(cudaMemcpy(in, image.data(), image.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  std::printf("\npacket all_reduce floor: N ranks in one launch, %d B of float32 per rank, blocks of %d threads "
              "(plain launch), %d calls, median of %d\n\n",
              kElements * 4, kThreads, kPacketIters, kReps);
  std::printf("| ranks | blocks per rank | counters | packet polls | back to back (us) | graph replay (us) | check |\n"
              "|---|---|---|---|---|---|---|\n");
  int failed = 0, total = 0;
  for (int n : {2, 4, 8})
    for (bool in_flight : {false, true})
      for (int blocks : {1, 2, 4})
        for (bool system : {true, false}) {
          CHECK(cudaMemset(a.out, 0xFF, kMaxRanks * kElements * sizeof(float)));
          CHECK(cudaMemset(a.mirrors, 0, kMaxRanks * 2 * kElements * sizeof(uint2)));
          CHECK(cudaMemset(a.headers, 0, kMaxRanks * sizeof(RankHeader)));
          CHECK(cudaMemset(a.error, 0, sizeof(unsigned)));
          CHECK(cudaDeviceSynchronize());
          a.blocks = blocks;
          const PacketKernel k = packet_kernel(n, system, in_flight);
          auto launch = [&](cudaStream_t st) { k<<<n * blocks, kThreads, 0, st>>>(a); };
          const float b2b = time_us(launch, kPacketIters, false, s);
          const float graph = time_us(launch, kPacketIters, true, s);
          const unsigned long long calls = 2ull * (kReps + 1) * kPacketIters;  // both ways, warm-ups included
          const std::string why = check_row(a, n, calls);
          ++total;
          failed += !why.empty();
          std::printf("| %d | %d | %s scope | %s | %.2f | %.2f | %s%s |\n", n, blocks, system ? "system" : "device",
                      in_flight ? "all N loads in flight" : "one source at a time (executor)", b2b, graph,
                      why.empty() ? "ok" : "**FAILED**: ", why.c_str());
          std::fflush(stdout);
        }
  if (failed) {
    std::printf("\n**FAILED: %d of %d packet all_reduce rows** (their times are not a floor)\n", failed, total);
    std::fprintf(stderr, "gpu_floor: FAILED: %d of %d packet all_reduce rows\n", failed, total);
  }

  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(a.error));
  CHECK(cudaFree(a.headers));
  CHECK(cudaFree(a.mirrors));
  CHECK(cudaFree(a.out));
  CHECK(cudaFree(in));
  CHECK(cudaFreeHost(host));
  CHECK(cudaFree(words));
  return failed ? 1 : 0;
}
