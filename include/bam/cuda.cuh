// SPDX-License-Identifier: MIT
//! CUDA helpers of the GPU runtime: `BAM_CUDA_TRY` (throws `bam::error` with
//! file and line), and RAII owners of device memory and pinned host memory.
//!
//! @code
//!   bam::device_buffer<float> d(1 << 20);           // cudaMalloc, zeroed
//!   bam::pinned_buffer<std::uint8_t> h(1 << 20);    // cudaHostAlloc, mapped
//!   BAM_CUDA_TRY(cudaStreamSynchronize(stream));
//! @endcode
#pragma once

#include <bam/error.hpp>

#include <cuda/stream_ref>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

namespace bam::detail {

//! Throw `bam::error` for a failed CUDA call.
[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
  throw error(std::string("CUDA call failed: ") + what + " at " + file + ":" + std::to_string(line) + ": " +
              cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

} // namespace bam::detail

#define BAM_CUDA_TRY(call)                                                                                             \
  do {                                                                                                                 \
    const cudaError_t bam_cuda_err_ = (call);                                                                          \
    if (bam_cuda_err_ != cudaSuccess) ::bam::detail::throw_cuda(bam_cuda_err_, #call, __FILE__, __LINE__);             \
  } while (0)

//! For destructors: report, never throw.
#define BAM_CUDA_LOG(call)                                                                                             \
  do {                                                                                                                 \
    const cudaError_t bam_cuda_err_ = (call);                                                                          \
    if (bam_cuda_err_ != cudaSuccess)                                                                                  \
      std::fprintf(stderr, "bam: %s failed at %s:%d: %s\n", #call, __FILE__, __LINE__,                                 \
                   cudaGetErrorString(bam_cuda_err_));                                                                 \
  } while (0)

namespace bam {

//! The CUDA device current in the calling thread.
inline int current_device() {
  int d = 0;
  BAM_CUDA_TRY(cudaGetDevice(&d));
  return d;
}

//! Makes a CUDA device current for a scope and gives the caller's back at
//! its end (RAII). Objects whose GPU resources belong to one device (a
//! storage, a page cache, the GPU engine) hold one around every host
//! operation, so that they work whatever device the calling thread has.
//!
//! @code
//!   bam::device_scope on(1);   // cudaSetDevice(1) unless it is current
//!   ...                        // allocations, streams, launches on GPU 1
//! @endcode                     // the caller's device is current again
//!
//! As an object's first member, `enter_quietly` in its destructor keeps the
//! device current while the other members are destroyed.
class device_scope {
public:
  device_scope() = default;
  explicit device_scope(int device) { enter(device); }
  ~device_scope() {
    if (entered_ && previous_ != device_) BAM_CUDA_LOG(cudaSetDevice(previous_));
  }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;

  //! Make `device` current (once per scope).
  void enter(int device) {
    if (entered_) return;
    BAM_CUDA_TRY(cudaGetDevice(&previous_));
    if (device != previous_) BAM_CUDA_TRY(cudaSetDevice(device));
    device_ = device;
    entered_ = true;
  }
  //! `enter` for destructors: a failure is reported, never thrown.
  void enter_quietly(int device) noexcept {
    if (entered_ || cudaGetDevice(&previous_) != cudaSuccess) return;
    if (device != previous_) BAM_CUDA_LOG(cudaSetDevice(device));
    device_ = device;
    entered_ = true;
  }

private:
  int previous_ = 0;
  int device_ = 0;
  bool entered_ = false;
};

namespace detail {

//! Devices with a side stream of their own (CUDA numbers them from 0).
inline constexpr int max_side_stream_devices = 64;

//! A non-blocking stream of the current device for bam's own set-up work
//! (zeroing new memory, copying tables): waiting for it never waits for a
//! kernel of the caller's, on whatever stream (the default one included).
//! Created on first use and kept for the life of the process.
inline cudaStream_t side_stream() {
  static std::array<cudaStream_t, max_side_stream_devices> streams{};
  static std::array<std::once_flag, max_side_stream_devices> once;
  int dev = 0;
  BAM_CUDA_TRY(cudaGetDevice(&dev));
  if (dev < 0 || dev >= max_side_stream_devices)
    throw error("CUDA device " + std::to_string(dev) + " is beyond the " + std::to_string(max_side_stream_devices) +
                " devices bam supports");
  std::call_once(once[static_cast<std::size_t>(dev)], [&] {
    BAM_CUDA_TRY(cudaStreamCreateWithFlags(&streams[static_cast<std::size_t>(dev)], cudaStreamNonBlocking));
  });
  return streams[static_cast<std::size_t>(dev)];
}

} // namespace detail

//! cudaMalloc'ed memory, zeroed on the device (on bam's side stream: no
//! kernel of the caller's is waited for).
struct device_allocation {
  static void* allocate(std::size_t bytes) {
    void* p = nullptr;
    BAM_CUDA_TRY(cudaMalloc(&p, bytes));
    try {
      const cudaStream_t side = detail::side_stream();
      BAM_CUDA_TRY(cudaMemsetAsync(p, 0, bytes, side));
      // Zeroed before any stream can use it.
      BAM_CUDA_TRY(cudaStreamSynchronize(side));
    } catch (...) {
      BAM_CUDA_LOG(cudaFree(p));
      throw;
    }
    return p;
  }
  static void release(void* p) { BAM_CUDA_LOG(cudaFree(p)); }
};

//! Pinned host memory mapped into the GPU's address space (UVA), zeroed.
struct pinned_allocation {
  static void* allocate(std::size_t bytes) {
    void* p = nullptr;
    BAM_CUDA_TRY(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    std::memset(p, 0, bytes);
    return p;
  }
  static void release(void* p) { BAM_CUDA_LOG(cudaFreeHost(p)); }
};

//! `count` zeroed elements of T owned by this object; `Allocation` says where.
template <class T, class Allocation>
class cuda_buffer {
public:
  cuda_buffer() = default;
  explicit cuda_buffer(std::size_t count) : count_(count) {
    if (count != 0) ptr_ = static_cast<T*>(Allocation::allocate(bytes()));
  }
  ~cuda_buffer() { reset(); }
  cuda_buffer(cuda_buffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  cuda_buffer& operator=(cuda_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  void reset() {
    if (ptr_ != nullptr) Allocation::release(ptr_);
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

//! Zeroed device memory of `count` elements of T (cudaMalloc).
template <class T>
using device_buffer = cuda_buffer<T, device_allocation>;

//! Zeroed pinned host memory, mapped into the GPU's address space (UVA: the
//! same pointer works on host and device).
template <class T>
using pinned_buffer = cuda_buffer<T, pinned_allocation>;

//! Copy `n` objects to the device and wait for the copy, on bam's side
//! stream (no kernel of the caller's is waited for).
template <class T>
void copy_to_device(T* dst, const T* src, std::size_t n) {
  if (n == 0) return;
  const cudaStream_t side = detail::side_stream();
  BAM_CUDA_TRY(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyHostToDevice, side));
  BAM_CUDA_TRY(cudaStreamSynchronize(side));
}
//! Copy `n` objects to the host and wait for the copy, on bam's side stream.
template <class T>
void copy_to_host(T* dst, const T* src, std::size_t n) {
  if (n == 0) return;
  const cudaStream_t side = detail::side_stream();
  BAM_CUDA_TRY(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToHost, side));
  BAM_CUDA_TRY(cudaStreamSynchronize(side));
}
//! Copy `n` objects to the device, ordered on `stream`.
template <class T>
void copy_to_device(T* dst, const T* src, std::size_t n, cudaStream_t stream) {
  if (n != 0) BAM_CUDA_TRY(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyHostToDevice, stream));
}
//! Copy `n` objects to the host on `stream` and wait for that stream.
template <class T>
void copy_to_host(T* dst, const T* src, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  BAM_CUDA_TRY(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToHost, stream));
  BAM_CUDA_TRY(cudaStreamSynchronize(stream));
}

} // namespace bam
