// What one launch of a kernel like the executor's costs before it moves any data, on the GPU at hand: the
// parts of the packet protocol's per-call floor (docs/benchmarks.md, "CUDA executor on one GPU": a one-rank 8 KiB
// copy takes 7.4 us per call on an H100). Each row times `kIters` launches of one block of 512 threads, back to
// back on one stream and replayed from a CUDA graph, with CUDA events; the median of 5 repetitions.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/gpu_floor tools/gpu_floor.cu && /tmp/gpu_floor
//
// Rows: an empty kernel (plain and cooperative launch); the executor's entry and exit atomics at system scope and
// at device scope (thread 0: an acquire load, a release store, an acq_rel add, a release store); 8 block barriers;
// a read of a host-mapped word (the error record's poll).
#include <cuda/atomic>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
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

using Kernel = void (*)(unsigned long long*, const volatile unsigned*);

float launch_all(Kernel k, bool cooperative, unsigned long long* words, const unsigned* host, cudaStream_t s) {
  void* args[] = {&words, &host};
  for (int i = 0; i < kIters; ++i) {
    if (cooperative)
      CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(k), 1, kThreads, args, 0, s));
    else
      k<<<1, kThreads, 0, s>>>(words, host);
  }
  return 0;
}

// Microseconds per launch: back to back (graph = false) or one graph holding kIters launches, replayed.
float time_us(Kernel k, bool cooperative, bool graph, unsigned long long* words, const unsigned* host,
              cudaStream_t s) {
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    launch_all(k, cooperative, words, host, s);
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
    else launch_all(k, cooperative, words, host, s);
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaGetLastError());
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r > 0) reps.push_back(ms * 1000.0f / kIters);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  if (exec) CHECK(cudaGraphExecDestroy(exec));
  std::sort(reps.begin(), reps.end());
  return reps[reps.size() / 2];
}

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  unsigned long long* words;
  CHECK(cudaMalloc(&words, 64));
  CHECK(cudaMemset(words, 0, 64));
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
              {"a host-mapped word read", host_word_kernel}};
  std::printf("%s; one block of %d threads, %d launches, median of %d\n\n", prop.name, kThreads, kIters, kReps);
  std::printf("| kernel | launch | back to back (us) | graph replay (us) |\n|---|---|---|---|\n");
  for (const Row& row : rows)
    for (bool coop : {false, true})
      std::printf("| %s | %s | %.2f | %.2f |\n", row.what, coop ? "cooperative" : "plain",
                  time_us(row.kernel, coop, false, words, host_dev, s),
                  time_us(row.kernel, coop, true, words, host_dev, s));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFreeHost(host));
  CHECK(cudaFree(words));
  return 0;
}
