// SPDX-License-Identifier: MIT
// GPU time of a launch on the default stream, by CUDA events.
#pragma once

#include <bam/cuda.cuh>

namespace bench {

//! Milliseconds between events recorded before and after `launch()` (which
//! launches on the default stream); a launch error throws.
template <class Launch>
float time_launch_ms(Launch&& launch) {
  cudaEvent_t a, b;
  BAM_CUDA_TRY(cudaEventCreate(&a));
  BAM_CUDA_TRY(cudaEventCreate(&b));
  BAM_CUDA_TRY(cudaEventRecord(a));
  launch();
  BAM_CUDA_TRY(cudaGetLastError());
  BAM_CUDA_TRY(cudaEventRecord(b));
  BAM_CUDA_TRY(cudaEventSynchronize(b));
  float ms = 0;
  BAM_CUDA_TRY(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms;
}

} // namespace bench
