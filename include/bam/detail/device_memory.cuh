// SPDX-License-Identifier: MIT
//! Memory a controller must reach, for the GPU runtime and the software
//! controller alike: GPU memory (queue rings, PRP lists, the page cache's
//! pages) allocated aligned and sized to the transport's GPU-memory
//! granularity (64 KiB for NVIDIA's peer-to-peer interface), and pinned host
//! memory mapped into the GPU; zeroed and mapped. Mappings are undone before
//! the memory is freed.
#pragma once

#include <bam/cuda.cuh>
#include <bam/nvme/queue.hpp>
#include <bam/transport/transport.hpp>

#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

namespace bam::detail {

//! cudaMalloc'ed memory aligned to `align` (a power of two), `bytes` rounded up to it, zeroed.
class aligned_device_memory {
public:
  aligned_device_memory() = default;
  aligned_device_memory(std::size_t bytes, std::size_t align) {
    size_ = transport::round_up(bytes, align);
    BAM_CUDA_TRY(cudaMalloc(&raw_, size_ + align));
    const auto a = (reinterpret_cast<std::uintptr_t>(raw_) + align - 1) / align * align;
    data_ = reinterpret_cast<std::uint8_t*>(a);
    const cudaStream_t side = side_stream();
    if (cudaMemsetAsync(data_, 0, size_, side) != cudaSuccess || cudaStreamSynchronize(side) != cudaSuccess) {
      cudaFree(raw_);
      throw error("clearing " + std::to_string(size_) + " bytes of GPU memory failed");
    }
  }
  ~aligned_device_memory() {
    if (raw_ != nullptr) BAM_CUDA_LOG(cudaFree(raw_));
  }
  aligned_device_memory(aligned_device_memory&& o) noexcept
      : raw_(std::exchange(o.raw_, nullptr)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {
  }
  aligned_device_memory& operator=(aligned_device_memory&& o) noexcept {
    if (this != &o) {
      if (raw_ != nullptr) BAM_CUDA_LOG(cudaFree(raw_));
      raw_ = std::exchange(o.raw_, nullptr);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }

private:
  void* raw_ = nullptr;
  std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

//! GPU memory mapped for one controller. The mapping goes first, then the memory.
class device_region final : public dma_region {
public:
  static std::unique_ptr<dma_region> make(transport& t, std::size_t bytes) {
    aligned_device_memory mem(bytes, t.device_map_alignment());
    std::unique_ptr<dma_region> m = t.map(mem.data(), mem.size(), memory_kind::device);
    return std::unique_ptr<dma_region>(new device_region(std::move(m), std::move(mem)));
  }
  ~device_region() override { mapping_.reset(); }

private:
  device_region(std::unique_ptr<dma_region> m, aligned_device_memory mem)
      : dma_region(m->data(), m->size(), m->kind(), m->page_bus()), mem_(std::move(mem)), mapping_(std::move(m)) {}
  aligned_device_memory mem_; // destroyed after the mapping (reverse order of declaration)
  std::unique_ptr<dma_region> mapping_;
};

//! Zeroed submitter state for GPU submitters, in GPU memory (every atomic on
//! it happens on the GPU; the host driver never reads it).
inline void* alloc_queue_state(std::size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr; // 256-byte aligned
  try {
    const cudaStream_t side = side_stream();
    if (cudaMemsetAsync(p, 0, bytes, side) == cudaSuccess && cudaStreamSynchronize(side) == cudaSuccess) return p;
  } catch (const error&) {
  }
  cudaFree(p);
  return nullptr;
}

//! Pinned host memory mapped into the GPU and for a controller (queue rings
//! that host threads serve and GPU threads fill). The mapping goes first.
class pinned_region final : public dma_region {
public:
  static std::unique_ptr<dma_region> make(transport& t, std::size_t bytes) {
    const std::size_t size = transport::round_up(bytes);
    void* raw = nullptr; // cudaHostAlloc does not promise 4 KiB alignment for small sizes
    BAM_CUDA_TRY(cudaHostAlloc(&raw, size + dma_page_size, cudaHostAllocMapped | cudaHostAllocPortable));
    void* p = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(raw) + dma_page_size - 1) / dma_page_size *
                                      dma_page_size);
    std::memset(p, 0, size);
    try {
      return std::unique_ptr<dma_region>(new pinned_region(t.map(p, size, memory_kind::host), raw));
    } catch (...) {
      cudaFreeHost(raw);
      throw;
    }
  }
  ~pinned_region() override {
    mapping_.reset();
    BAM_CUDA_LOG(cudaFreeHost(raw_));
  }

private:
  pinned_region(std::unique_ptr<dma_region> m, void* raw)
      : dma_region(m->data(), m->size(), m->kind(), m->page_bus()), mapping_(std::move(m)), raw_(raw) {}
  std::unique_ptr<dma_region> mapping_;
  void* raw_;
};

} // namespace bam::detail
