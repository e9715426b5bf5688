// SPDX-License-Identifier: MIT
// The small CUDA helpers of `bam-gnn aggregate`: launch sizes, streams and
// events owned like any other C++ resource, and the clocks that time a run.
#pragma once

#include <bam/cuda.cuh>

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace bam::gnn {

inline constexpr unsigned block_threads = 256;

//! Blocks of `block_threads` for `threads` threads. The kernels loop over
//! their work with a grid stride, so the grid is capped (2^20 blocks) rather
//! than sized for a huge batch.
inline unsigned grid_for(std::uint64_t threads) {
  return static_cast<unsigned>(std::clamp<std::uint64_t>((threads + block_threads - 1) / block_threads, 1, 1u << 20));
}

struct cuda_event {
  cudaEvent_t e{};
  cuda_event() { BAM_CUDA_TRY(cudaEventCreate(&e)); }
  ~cuda_event() { BAM_CUDA_LOG(cudaEventDestroy(e)); }
  cuda_event(const cuda_event&) = delete;
  cuda_event& operator=(const cuda_event&) = delete;
};

//! A non-blocking stream: work on it does not wait for the legacy default
//! stream, so the mini-batches in flight on their own streams overlap.
//! `urgent`: the device's highest priority, whose blocks the GPU starts
//! before those of streams of the default priority waiting for room.
struct cuda_stream {
  cudaStream_t s{};
  explicit cuda_stream(bool urgent = false) {
    int least = 0, greatest = 0;
    if (urgent) BAM_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    BAM_CUDA_TRY(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, urgent ? greatest : least));
  }
  ~cuda_stream() { BAM_CUDA_LOG(cudaStreamDestroy(s)); }
  cuda_stream(const cuda_stream&) = delete;
  cuda_stream& operator=(const cuda_stream&) = delete;
};

//! Seconds from event `a` to event `b` (both recorded and complete).
inline double elapsed_s(const cuda_event& a, const cuda_event& b) {
  float ms = 0;
  BAM_CUDA_TRY(cudaEventElapsedTime(&ms, a.e, b.e));
  return ms / 1000.0;
}

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

} // namespace bam::gnn
