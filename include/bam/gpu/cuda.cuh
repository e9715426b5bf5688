// SPDX-License-Identifier: MIT
//! CUDA helpers of the GPU runtime: `BAM_CUDA_TRY` (throws `bam::error` with
//! file and line), and RAII owners of device memory and pinned host memory.
//!
//! @code
//!   bam::gpu::device_buffer<float> d(1 << 20);           // cudaMalloc, zeroed
//!   bam::gpu::pinned_buffer<std::uint8_t> h(1 << 20);    // cudaHostAlloc, mapped
//!   BAM_CUDA_TRY(cudaDeviceSynchronize());
//! @endcode
#pragma once

#include <bam/error.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

namespace bam::gpu {

//! Throw `bam::error` for a failed CUDA call.
[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
  throw error(std::string("CUDA call failed: ") + what + " at " + file + ":" + std::to_string(line) +
              ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

} // namespace bam::gpu

#define BAM_CUDA_TRY(call)                                                                         \
  do {                                                                                             \
    const cudaError_t bam_cuda_err_ = (call);                                                      \
    if (bam_cuda_err_ != cudaSuccess) ::bam::gpu::throw_cuda(bam_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

//! For destructors: report, never throw.
#define BAM_CUDA_LOG(call)                                                                         \
  do {                                                                                             \
    const cudaError_t bam_cuda_err_ = (call);                                                      \
    if (bam_cuda_err_ != cudaSuccess)                                                              \
      std::fprintf(stderr, "bam: %s failed at %s:%d: %s\n", #call, __FILE__, __LINE__,            \
                   cudaGetErrorString(bam_cuda_err_));                                             \
  } while (0)

namespace bam::gpu {

//! Zeroed device memory of `count` elements of T (cudaMalloc).
template <class T>
class device_buffer {
public:
  device_buffer() = default;
  explicit device_buffer(std::size_t count) : count_(count) {
    if (count == 0) return;
    BAM_CUDA_TRY(cudaMalloc(&ptr_, bytes()));
    BAM_CUDA_TRY(cudaMemset(ptr_, 0, bytes()));
  }
  ~device_buffer() { reset(); }
  device_buffer(device_buffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  void reset() {
    if (ptr_ != nullptr) BAM_CUDA_LOG(cudaFree(ptr_));
    ptr_ = nullptr;
    count_ = 0;
  }
  T* get() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return count_; }
  std::size_t bytes() const noexcept { return count_ * sizeof(T); }

private:
  T* ptr_ = nullptr;
  std::size_t count_ = 0;
};

//! Zeroed pinned host memory, mapped into the GPU's address space (UVA: the
//! same pointer works on host and device).
template <class T>
class pinned_buffer {
public:
  pinned_buffer() = default;
  explicit pinned_buffer(std::size_t count) : count_(count) {
    if (count == 0) return;
    BAM_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&ptr_), bytes(),
                               cudaHostAllocMapped | cudaHostAllocPortable));
    std::memset(static_cast<void*>(ptr_), 0, bytes());
  }
  ~pinned_buffer() { reset(); }
  pinned_buffer(pinned_buffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  pinned_buffer& operator=(pinned_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  void reset() {
    if (ptr_ != nullptr) BAM_CUDA_LOG(cudaFreeHost(ptr_));
    ptr_ = nullptr;
    count_ = 0;
  }
  T* get() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return count_; }
  std::size_t bytes() const noexcept { return count_ * sizeof(T); }

private:
  T* ptr_ = nullptr;
  std::size_t count_ = 0;
};

//! Copy `n` objects to the device (synchronous).
template <class T>
void copy_to_device(T* dst, const T* src, std::size_t n) {
  if (n != 0) BAM_CUDA_TRY(cudaMemcpy(dst, src, n * sizeof(T), cudaMemcpyHostToDevice));
}
template <class T>
void copy_to_host(T* dst, const T* src, std::size_t n) {
  if (n != 0) BAM_CUDA_TRY(cudaMemcpy(dst, src, n * sizeof(T), cudaMemcpyDeviceToHost));
}

} // namespace bam::gpu
