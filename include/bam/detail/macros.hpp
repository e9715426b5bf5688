// SPDX-License-Identifier: MIT
//! Host/device portability macros. Under a plain C++ compiler they expand to
//! nothing, so the headers that use them serve g++ tests and nvcc kernels alike.
#pragma once

#if __cplusplus < 202002L
#error                                                                                                                 \
    "bam needs C++20: g++/clang++/nvcc -std=c++20; in CMake link bam::bam (or set CXX_STANDARD and CUDA_STANDARD to 20)"
#endif

#include <cstdint>

#if defined(__CUDACC__)
#define BAM_HD __host__ __device__
#define BAM_DEVICE __device__
#define BAM_HOST __host__
//! Slow paths (misses, waits, the software controller's work) stay out of
//! line, so the hit path that inlines into user kernels keeps few registers.
#define BAM_NOINLINE __noinline__
//! Unroll the next loop (code that g++ compiles too).
#define BAM_UNROLL _Pragma("unroll")
#else
#define BAM_HD
#define BAM_DEVICE
#define BAM_HOST
#define BAM_NOINLINE
#define BAM_UNROLL
#endif

// Before a host/device function template that host code instantiates with
// host-only callables (lambdas): their device instantiation is never used, so
// nvcc's host/device call check is off for it.
#if defined(__CUDACC__)
#define BAM_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
#else
#define BAM_EXEC_CHECK_DISABLE
#endif

// True while compiling device code (the nvcc device pass).
#if defined(__CUDA_ARCH__)
#define BAM_DEVICE_CODE 1
#else
#define BAM_DEVICE_CODE 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define BAM_LIKELY(x) __builtin_expect(!!(x), 1)
#define BAM_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define BAM_LIKELY(x) (x)
#define BAM_UNLIKELY(x) (x)
#endif

namespace bam::detail {

//! Monotonic nanoseconds: the GPU's global timer in device code,
//! steady_clock on the host. Used for every bounded wait.
BAM_HD inline std::uint64_t now_ns();

//! A polite spin: `nanosleep` on the GPU, a pause instruction on the CPU.
BAM_HD inline void relax(unsigned ns_hint = 64);

} // namespace bam::detail

#include <chrono>
#include <thread>
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace bam::detail {

BAM_HD inline std::uint64_t now_ns() {
#if BAM_DEVICE_CODE
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
#endif
}

//! `now + timeout_ns`, saturated: a timeout too large to add is "never".
BAM_HD inline std::uint64_t deadline_after(std::uint64_t now, std::uint64_t timeout_ns) {
  return timeout_ns > ~std::uint64_t{0} - now ? ~std::uint64_t{0} : now + timeout_ns;
}

BAM_HD inline void relax(unsigned ns_hint) {
#if BAM_DEVICE_CODE
  __nanosleep(ns_hint);
#else
  (void)ns_hint;
#if defined(__x86_64__) || defined(_M_X64)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
#endif
}

//! Host-only backoff for long waits: spins briefly, then yields the core so
//! that oversubscribed CPU tests (more threads than cores) make progress.
struct backoff {
  unsigned spins = 0;
  BAM_HD void operator()() {
#if BAM_DEVICE_CODE
    relax(spins < 64 ? 32 : 256);
    ++spins;
#else
    if (spins < 64) {
      relax();
    } else {
      std::this_thread::yield();
    }
    ++spins;
#endif
  }
};

} // namespace bam::detail
