#include "csrc/local_group.hpp"

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "csrc/communicator.hpp"
#include "csrc/executor.hpp"

namespace jaxcoll {

Status run_local_group(const Plan& plan, const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                       int64_t input_elements, int64_t output_elements, DType dtype, ReduceOp op, double timeout_s) {
  const int32_t n = plan.nranks;
  if (static_cast<int32_t>(inputs.size()) != n || static_cast<int32_t>(outputs.size()) != n)
    return Status::Error("run_plan: the plan has " + std::to_string(n) + " ranks but got " +
                         std::to_string(inputs.size()) + " inputs and " + std::to_string(outputs.size()) +
                         " outputs (one per rank)");
  auto comm = std::make_unique<Communicator>(n);
  CallSite site{collective_name(plan.collective), -1, 0};
  // A rank that arrives before the last is completed later by the leader; its thread waits for that here, as
  // XLA waits on the future the FFI handler returns.
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Status status;
  };
  std::vector<Done> done(n);
  // Helpers and completions on threads of their own, as XLA's intra-op pool would run them.
  const Helpers helpers{[](std::function<void()> task) { std::thread(std::move(task)).detach(); },
                        static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) - 1};
  std::vector<Status> results(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int32_t r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      CallBuffers b{inputs[r], outputs[r], input_elements, output_elements, dtype, op};
      bool pending = false;
      Completion complete = [&d = done[r]](const Status& st) {
        std::lock_guard<std::mutex> lock(d.mu);
        d.status = st;
        d.done = true;
        d.cv.notify_all();
      };
      results[r] = execute_rank(*comm, /*run_id=*/0, plan, r, b, site, timeout_s, helpers, std::move(complete),
                                pending);
      if (pending) {
        std::unique_lock<std::mutex> lock(done[r].mu);
        done[r].cv.wait(lock, [&] { return done[r].done; });
        results[r] = done[r].status;
      }
    });
  }
  for (auto& t : threads) t.join();
  if (comm->failed()) return Status::Error(comm->failure());
  for (const Status& s : results)
    if (!s.ok()) return s;
  return {};
}

}  // namespace jaxcoll
