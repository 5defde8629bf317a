// A small fork-join pool for the CPU backend: ParallelFor splits [0, n) into contiguous chunks
// run by the workers and the calling thread, and returns when all are done.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace glm::engine {

class ThreadPool {
 public:
  // num_threads counts the caller: num_threads - 1 workers are started. 0 = hardware concurrency.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) on disjoint chunks covering [0, n), chunks of at least `min_chunk`
  // items. Blocks until every chunk is done. Not reentrant: fn must not call ParallelFor.
  void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop(int worker_index);
  void RunChunks();

  int num_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;  // bumped per ParallelFor
  int active_workers_ = 0;   // workers still inside the current generation
  bool stop_ = false;
  // Current job (valid while a ParallelFor runs).
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 1;
  std::atomic<int64_t> next_{0};
};

}  // namespace glm::engine
