#include "csrc/workers.hpp"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace jaxcoll {

namespace {

struct Pool {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> tasks;
  int idle = 0;

  void loop() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      ++idle;
      cv.wait(lock, [&] { return !tasks.empty(); });
      --idle;
      std::function<void()> task = std::move(tasks.front());
      tasks.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  }
};

Pool& pool() {
  static Pool* p = new Pool();  // leaked on purpose: its threads outlive static destruction
  return *p;
}

}  // namespace

void run_on_worker(std::function<void()> task) {
  Pool& p = pool();
  bool spawn;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    p.tasks.push_back(std::move(task));
    spawn = p.idle < static_cast<int>(p.tasks.size());
  }
  if (spawn)
    std::thread([&p] { p.loop(); }).detach();
  else
    p.cv.notify_one();
}

}  // namespace jaxcoll
