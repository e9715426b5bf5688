// SPDX-License-Identifier: MIT
//! Host memory of the software controller's media pinned for every GPU of
//! this process (`cudaHostRegister`, portable and mapped), so GPU threads
//! read and write the media's bytes where they are: shared memory under the
//! GPU engine (`emu-gpu:shm`), RAM and shared memory read in place by the
//! CPU engine's data tasks (`emu:ram`, `emu:shm`).
//!
//! One registration per mapping, whichever engines and GPUs use it. It
//! holds what owns the mapping and is undone before the mapping goes.
#pragma once

#include <bam/cuda.cuh>
#include <bam/error.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace bam::emu::detail {

class pinned_host_memory {
public:
  //! The registration of `[data, data + bytes)`, made on first use. `owner`
  //! keeps the mapping alive while it is registered; `what` names it in
  //! errors. Throws `bam::error` when CUDA refuses to pin it.
  static std::shared_ptr<pinned_host_memory> of(std::uint8_t* data, std::size_t bytes,
                                                std::shared_ptr<const void> owner, const std::string& what) {
    static std::mutex mutex;
    static std::map<const std::uint8_t*, std::weak_ptr<pinned_host_memory>> pinned;
    std::lock_guard lock(mutex);
    std::erase_if(pinned, [](const auto& e) { return e.second.expired(); });
    if (auto p = pinned[data].lock()) {
      if (p->bytes_ != bytes)
        throw error(what + ": already pinned for the GPU as " + std::to_string(p->bytes_) + " bytes, not " +
                    std::to_string(bytes));
      return p;
    }
    std::shared_ptr<pinned_host_memory> p(new pinned_host_memory(data, bytes, std::move(owner), what));
    pinned[data] = p;
    return p;
  }
  ~pinned_host_memory() { BAM_CUDA_LOG(cudaHostUnregister(data_)); }
  pinned_host_memory(const pinned_host_memory&) = delete;
  pinned_host_memory& operator=(const pinned_host_memory&) = delete;

  std::uint8_t* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  //! Where the current GPU sees the first byte.
  std::uint8_t* device_data() const {
    void* p = nullptr;
    BAM_CUDA_TRY(cudaHostGetDevicePointer(&p, data_, 0));
    return static_cast<std::uint8_t*>(p);
  }

private:
  pinned_host_memory(std::uint8_t* data, std::size_t bytes, std::shared_ptr<const void> owner, const std::string& what)
      : data_(data), bytes_(bytes), owner_(std::move(owner)) {
    const cudaError_t e = cudaHostRegister(data_, bytes_, cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (e != cudaSuccess) {
      (void)cudaGetLastError(); // not sticky: clear it for the caller's next check
      throw error("pinning " + what + " (" + std::to_string(bytes_) + " bytes) for the GPU failed: " +
                  cudaGetErrorString(e) + " (is the locked-memory limit, ulimit -l, large enough?)");
    }
  }
  std::uint8_t* data_;
  std::size_t bytes_;
  std::shared_ptr<const void> owner_; // unmapped after the registration is undone
};

} // namespace bam::emu::detail
