// SPDX-License-Identifier: Apache-2.0
#include "core/util/thread_pool.h"

#include <algorithm>

namespace kdn {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { Work(static_cast<size_t>(i)); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::Work(size_t index) {
  unsigned long seen = 0;
  for (;;) {
    const std::function<void(size_t, size_t)>* fn;
    size_t n, parts;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      n = n_;
      parts = parts_;
    }
    if (index < parts) {
      const size_t begin = n * index / parts, end = n * (index + 1) / parts;
      if (begin < end) (*fn)(begin, end);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(size_t n, size_t min_grain, const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  const size_t parts = std::min<size_t>(static_cast<size_t>(threads()), n / std::max<size_t>(min_grain, 1));
  if (workers_.empty() || parts < 2) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    parts_ = parts;
    pending_ = workers_.size();
    ++generation_;
  }
  start_cv_.notify_all();
  fn(0, n / parts);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
}

}  // namespace kdn
