// Waiting without burning the cores the other ranks need: eight device threads share two cores here, so a waiter
// spins briefly (pause), then yields a few times, then sleeps on a futex word with a timeout. The notifier bumps
// the word and issues a wake only when someone sleeps on it, so the common, uncontended path makes no syscall.
#pragma once

#include <atomic>
#include <algorithm>
#include <chrono>
#include <cstdint>

namespace jaxcoll {

using Clock = std::chrono::steady_clock;

// Sleep while *word == expected, at most `timeout` (spurious returns are allowed). `shared`: the word lives in
// memory mapped by several processes (the futex must then not be process-private).
void futex_wait(std::atomic<uint32_t>& word, uint32_t expected, std::chrono::nanoseconds timeout, bool shared);
void futex_wake_all(std::atomic<uint32_t>& word, bool shared);
void yield_cpu();

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// A futex word with a count of sleepers: the pair a waiter sleeps on and a notifier rings. A doorbell placed in
// shared memory (cross_process_call.hpp) is constructed with process_shared, so waiters in other processes are woken.
struct Doorbell {
  alignas(64) std::atomic<uint32_t> word{0};
  std::atomic<uint32_t> sleepers{0};
  uint32_t process_shared = 0;

  Doorbell() = default;
  explicit Doorbell(bool shared) : process_shared(shared) {}

  void ring() {
    word.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers.load(std::memory_order_seq_cst)) futex_wake_all(word, process_shared != 0);
  }
};

// Spin and yield budget before sleeping; JAXCOLL_SPIN overrides the spin count (read once).
int spin_iterations();
int yield_iterations();

enum class WaitResult { kReady, kTimeout, kAborted };

// Wait until ready() holds, the deadline passes or aborted() holds. ready() must become true only through
// changes that are followed by bell.ring().
template <class Ready, class Aborted>
WaitResult wait_for(Doorbell& bell, Ready&& ready, Aborted&& aborted, Clock::time_point deadline) {
  const int spins = spin_iterations();
  for (int i = 0; i < spins; ++i) {
    if (ready()) return WaitResult::kReady;
    cpu_relax();
  }
  const int yields = yield_iterations();
  for (int i = 0; i < yields; ++i) {
    if (ready()) return WaitResult::kReady;
    yield_cpu();
  }
  for (;;) {
    const uint32_t seen = bell.word.load(std::memory_order_seq_cst);
    if (ready()) return WaitResult::kReady;
    if (aborted()) return WaitResult::kAborted;
    const auto now = Clock::now();
    if (now >= deadline) return ready() ? WaitResult::kReady : WaitResult::kTimeout;
    bell.sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (!ready()) {
      // Wake at least every 50 ms to notice an abort whose ring we might have raced with.
      const auto slice = std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(50));
      futex_wait(bell.word, seen, slice, bell.process_shared != 0);
    }
    bell.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

}  // namespace jaxcoll
