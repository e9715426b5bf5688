// SPDX-License-Identifier: MIT
//! The GPU runtime's error story: device code never throws and never spins
//! forever; it records the first failure (status, element index, controller,
//! LBA) in GPU memory, counts the rest, and the host turns the record into a
//! `bam::error` after the kernel (`array::check`, `page_cache::flush`).
#pragma once

#include <bam/cuda.cuh>
#include <bam/detail/macros.hpp>
#include <bam/error.hpp>
#include <bam/nvme/spec.hpp>

#include <cuda/atomic>

#include <cstdint>
#include <functional>
#include <string>

namespace bam {

//! Where a failure happened, as far as the recording code knows: an element
//! index, a page's first LBA on a controller, or both.
struct failure_site {
  bool has_index = false;
  bool has_lba = false;
  std::uint32_t controller = 0; //!< index of the controller within its storage (with an LBA)
  std::uint64_t index = 0;      //!< element index
  std::uint64_t lba = 0;        //!< first LBA of the page involved

  //! At element `i` (no I/O named: the request itself was refused).
  BAM_HD static failure_site element(std::uint64_t i) { return {true, false, 0, i, 0}; }
  //! At the page starting at `lba` on controller `ctrl`.
  BAM_HD static failure_site page(std::uint64_t lba, std::uint32_t ctrl) { return {false, true, ctrl, 0, lba}; }
  //! At element `i`, whose page starts at `lba` on controller `ctrl`.
  BAM_HD static failure_site element_on_page(std::uint64_t i, std::uint64_t lba, std::uint32_t ctrl) {
    return {true, true, ctrl, i, lba};
  }
};

//! The first failure kernels met, recorded in GPU memory. Any thread may
//! record; the first one wins; `count` counts them all.
struct device_error_record {
  std::uint32_t state;      //!< 0: none, 1: being written, 2: complete
  std::uint16_t status;     //!< NVMe or bam status (sct << 8 | sc, with DNR/More bits)
  std::uint16_t has_index;  //!< 1 if `index` is an element index
  std::uint32_t controller; //!< index of the controller within its storage
  std::uint32_t has_lba;    //!< 1 if `lba` and `controller` are meaningful
  std::uint64_t index;      //!< element index
  std::uint64_t lba;        //!< first LBA of the page involved
  unsigned long long count; //!< failures recorded, first included

  //! Record `st` at `where` (first failure wins; every failure counts).
  BAM_DEVICE void record(nvme::status st, const failure_site& where) {
    cuda::atomic_ref<unsigned long long, cuda::thread_scope_device>(count).fetch_add(1, cuda::memory_order_relaxed);
    cuda::atomic_ref<std::uint32_t, cuda::thread_scope_device> s(state);
    std::uint32_t expected = 0;
    if (!s.compare_exchange_strong(expected, 1, cuda::memory_order_relaxed)) return;
    status = st.raw;
    has_index = where.has_index ? 1 : 0;
    index = where.index;
    has_lba = where.has_lba ? 1 : 0;
    lba = where.lba;
    controller = where.controller;
    s.store(2, cuda::memory_order_release);
  }
};

//! Throw `bam::error` for a failure recorded at `dev` (GPU memory; the record
//! is cleared), or do nothing. Waits for `stream` only: call it with the
//! stream the recording kernels ran on. `controller_name(i)` names controller i.
inline void throw_if_recorded(device_error_record* dev, const std::string& what,
                              const std::function<std::string(std::uint32_t)>& controller_name, cudaStream_t stream) {
  device_error_record r{};
  BAM_CUDA_TRY(cudaMemcpyAsync(&r, dev, sizeof r, cudaMemcpyDeviceToHost, stream));
  BAM_CUDA_TRY(cudaStreamSynchronize(stream));
  if (r.state == 0 && r.count == 0) return;
  BAM_CUDA_TRY(cudaMemsetAsync(dev, 0, sizeof r, stream));
  BAM_CUDA_TRY(cudaStreamSynchronize(stream));
  error_context c;
  if (r.state == 2) {
    c.status = nvme::status(r.status);
    if (r.has_index) c.index = r.index;
    if (r.has_lba) {
      c.lba = r.lba;
      c.controller = controller_name(r.controller);
    }
  }
  if (c.controller.empty()) c.controller = controller_name(~0u);
  const unsigned long long n = r.count;
  throw error(what + " (" + std::to_string(n) + " failure" + (n == 1 ? "" : "s") +
                  " recorded on the device; the first one follows)",
              c);
}

} // namespace bam
