// SPDX-License-Identifier: Apache-2.0
// A fixed set of worker threads that split a loop with the caller.
// Thread-safety: ParallelFor may be called from one thread at a time (the
// owner); it returns when every part is done.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kdn {

class ThreadPool {
 public:
  // `threads` counts the caller: 1 means no worker threads at all.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(begin, end) over [0, n) in contiguous parts, one per thread, when
  // n >= 2 * min_grain; otherwise runs it inline. Parts never split a unit,
  // so results do not depend on the number of threads.
  void ParallelFor(size_t n, size_t min_grain, const std::function<void(size_t, size_t)>& fn);

 private:
  void Work(size_t index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const std::function<void(size_t, size_t)>* fn_ = nullptr;  // guarded by mu_
  size_t n_ = 0;                                             // guarded by mu_
  size_t parts_ = 0;                                         // guarded by mu_
  size_t pending_ = 0;                                       // guarded by mu_
  unsigned long generation_ = 0;                             // guarded by mu_
  bool stop_ = false;                                        // guarded by mu_
};

}  // namespace kdn
