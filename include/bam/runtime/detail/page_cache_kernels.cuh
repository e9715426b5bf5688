// SPDX-License-Identifier: MIT
//! Kernels of `bam::page_cache`'s host operations: writing dirty pages back
//! (on flush, on detach), forgetting a key space's pages, and NVMe Flush of
//! every controller involved.
#pragma once

#include <bam/runtime/page_cache_ref.cuh>
#include <bam/runtime/detail/warp_io.cuh>

#include <cstdint>

namespace bam::detail {

//! Write back every dirty, unpinned page (of space `only`, or of all if
//! `only` is ~0u), also those whose write-back failed before, and report
//! those a timed-out write may still read (lost for good); with
//! `invalidate`, then forget the clean pages of that space. One lane per
//! slot, whole warps (the warp drives its lanes' writes together). Only
//! pages of spaces with queues on this kernel's GPU are written back.
template <int = 0>
__global__ void cache_writeback_kernel(page_cache_ref c, std::uint32_t only, bool invalidate) {
  constexpr unsigned full = 0xffffffffu;
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  const unsigned lane = lane_id();
  const std::uint64_t nslots = c.slot_count();
  std::uint64_t* const slots = ref_access::slots(c);
  const space_ref* const spaces = ref_access::spaces(c);
  for (std::uint64_t first = warp * 32; first < nslots; first += warps * 32) {
    const std::uint64_t s = first + lane;
    io_slot io;
    bool mine = false;
    std::uint64_t key = 0;
    if (s < nslots) {
      dev_atomic<std::uint64_t> st(slots[s]);
      std::uint64_t word = st.load(cuda::memory_order_acquire);
      const std::uint64_t tag = word >> slot_tag_shift;
      key = tag - 1;
      // Pages of spaces this GPU has no queues for are another GPU's to write
      // back (a cache over several GPUs).
      const bool in_scope =
          tag != 0 && (only == ~0u || (key >> key_page_bits) == only) && spaces[key >> key_page_bits].ctrls != nullptr;
      if (in_scope && (word & slot_valid) && (word & slot_dirty) && (word & (slot_busy | slot_pin_mask)) == 0 &&
          st.compare_exchange_strong(word, (word & ~(slot_dirty | slot_wb_failed)) | slot_busy,
                                     cuda::memory_order_acq_rel)) {
        start_writeback(io, spaces[key >> key_page_bits], key & key_page_mask, s << ref_access::page_shift(c));
        mine = true;
      } else if (in_scope && (word & slot_valid) && (word & slot_dirty) && (word & slot_busy) &&
                 (word & slot_wb_failed)) {
        // A write of this page timed out and may still read it: the page can
        // be written back no more, and no flush can say it reached the
        // storage. Each flush reports it.
        const space_ref& sp = spaces[key >> key_page_bits];
        const std::uint64_t p = key & key_page_mask;
        if (sp.err != nullptr)
          sp.err->record(nvme::status_timeout, failure_site::page(sp.lba_of(p), sp.controller_of(p)));
      }
    }
    warp_io_run(io, full, ref_access::timeout_ns(c));
    if (mine) {
      dev_atomic<std::uint64_t> st(slots[s]);
      const nvme::status result(io.status);
      if (result.ok()) {
        ref_access::count(c, 1);
        st.fetch_and(~slot_busy, cuda::memory_order_release);
      } else {
        const space_ref& sp = spaces[key >> key_page_bits];
        const std::uint64_t p = key & key_page_mask;
        if (sp.err != nullptr) sp.err->record(result, failure_site::page(sp.lba_of(p), sp.controller_of(p)));
        // A write that timed out may still read the slot: it stays busy, out
        // of use for good (`slot_lost`); misses on its set do not wait for it.
        mark_writeback_failed(&slots[s], result == nvme::status_timeout);
      }
    }
    if (invalidate && s < nslots) {
      dev_atomic<std::uint64_t> st(slots[s]);
      std::uint64_t word = st.load(cuda::memory_order_acquire);
      const std::uint64_t tag = word >> slot_tag_shift;
      if (tag != 0 && ((tag - 1) >> key_page_bits) == only && (word & (slot_pin_mask | slot_busy | slot_dirty)) == 0)
        st.compare_exchange_strong(word, 0, cuda::memory_order_acq_rel);
    }
  }
}

//! NVMe Flush of each of a storage's `n` controllers (device array), one lane each.
template <int = 0>
__global__ void flush_controllers_kernel(const queue_set_ref* ctrls, std::uint32_t n, device_error_record* err) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned mask = __ballot_sync(0xffffffffu, i < n);
  if (i >= n) return;
  io_slot io;
  io.start_flush(ctrls[i]);
  warp_io_run(io, mask, ctrls[i].timeout_ns());
  const nvme::status st(io.status);
  if (!st.ok()) err->record(st, failure_site::page(0, i));
}

//! Threads per block of the flush kernel: enough blocks for any number of controllers.
inline constexpr unsigned flush_threads_per_block = 32;

} // namespace bam::detail
