// SPDX-License-Identifier: MIT
// GPU time of a launch on the default stream, by CUDA events.
#pragma once

#include <bam/cuda.cuh>

namespace bench {

//! Milliseconds between events recorded before and after `launch()` (which
//! launches on the default stream); a launch error throws.
template <class Launch>
float time_launch_ms(Launch&& launch) {
  struct events {
    cudaEvent_t a = nullptr, b = nullptr;
    ~events() {
      if (a != nullptr) cudaEventDestroy(a);
      if (b != nullptr) cudaEventDestroy(b);
    }
  } e;
  BAM_CUDA_TRY(cudaEventCreate(&e.a));
  BAM_CUDA_TRY(cudaEventCreate(&e.b));
  BAM_CUDA_TRY(cudaEventRecord(e.a));
  launch();
  BAM_CUDA_TRY(cudaGetLastError());
  BAM_CUDA_TRY(cudaEventRecord(e.b));
  BAM_CUDA_TRY(cudaEventSynchronize(e.b));
  float ms = 0;
  BAM_CUDA_TRY(cudaEventElapsedTime(&ms, e.a, e.b));
  return ms;
}

} // namespace bench
