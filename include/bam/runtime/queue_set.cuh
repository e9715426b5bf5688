// SPDX-License-Identifier: MIT
//! `bam::queue_set_ref`: one controller (one namespace on it) as GPU threads
//! see it — its I/O queue pairs in GPU memory, a PRP list area per command
//! id, and the transport's progress hook. Trivially copyable; a
//! `bam::storage` holds one per controller.
//!
//! Direct block I/O from a kernel (no cache): every thread of the warp may
//! read or write its own blocks; the call returns when all of the warp's
//! commands completed.
//!
//! @code
//!   __global__ void k(bam::queue_set_ref q, const std::uint64_t* bus, std::uint64_t* lbas) {
//!     const unsigned t = threadIdx.x;
//!     bam::nvme::status st = q.read(lbas[t], 8, bus, t * 4096);   // 8 blocks into a mapped buffer
//!   }
//! @endcode
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/nvme/prp.hpp>
#include <bam/nvme/queue.hpp>
#include <bam/nvme/spec.hpp>
#include <bam/transport/device_progress.hpp>

#include <cstdint>
#include <type_traits>

namespace bam {

//! What a storage puts in place for one controller: where its queues and PRP
//! lists are and what the namespace is. A `queue_set_ref` is made from it
//! and is read-only from then on.
struct queue_set_layout {
  nvme::queue_pair_ref* queues = nullptr; //!< `nqueues` entries (GPU memory)
  std::uint32_t nqueues = 0;
  std::uint32_t nsid = 1;
  std::uint32_t lba_size = 512;
  std::uint32_t lba_shift = 9;
  std::uint64_t nblocks = 0;
  std::uint64_t* prp_lists = nullptr;          //!< per queue, per command id: `list_entries` entries
  const std::uint64_t* prp_list_bus = nullptr; //!< bus address of every 4 KiB page of the list area
  std::uint32_t list_entries = 0;              //!< entries per command id (a power of two)
  std::uint32_t cids_per_queue = 0;
  std::uint32_t max_transfer_bytes = 0;
  std::uint32_t num_sms = 1;
  std::uint32_t index = 0;  //!< this controller's index within its storage
  device_progress progress; //!< what waiting GPU threads do for the transport
};
static_assert(std::is_trivially_copyable_v<queue_set_layout>);

class queue_set_ref {
public:
  queue_set_ref() = default;
  BAM_HD explicit queue_set_ref(const queue_set_layout& layout) : l_(layout) {}

  //! I/O queue pairs of this controller.
  BAM_HD std::uint32_t queue_count() const { return l_.nqueues; }
  //! Queue pair `i` (< `queue_count()`).
  BAM_HD const nvme::queue_pair_ref& queue(std::uint32_t i) const { return l_.queues[i]; }
  //! The namespace this set reads and writes.
  BAM_HD std::uint32_t nsid() const { return l_.nsid; }
  //! Bytes per logical block, and its base-2 logarithm.
  BAM_HD std::uint32_t lba_size() const { return l_.lba_size; }
  BAM_HD std::uint32_t lba_shift() const { return l_.lba_shift; }
  //! Logical blocks of the namespace.
  BAM_HD std::uint64_t blocks() const { return l_.nblocks; }
  //! The largest read or write one command moves, in bytes.
  BAM_HD std::uint32_t max_transfer_bytes() const { return l_.max_transfer_bytes; }
  //! This controller's index within its storage.
  BAM_HD std::uint32_t index() const { return l_.index; }
  //! What waiting GPU threads do for the transport.
  BAM_HD const device_progress& progress() const { return l_.progress; }
  //! How long a command may wait for its completion (the queues' setting).
  BAM_HD std::uint64_t timeout_ns() const { return l_.queues[0].timeout_ns; }

  //! The queue pair for the calling warp: spread over SMs and warps.
  BAM_DEVICE std::uint32_t pick_queue() const;

  //! Can a read/write of `nblocks` at `lba` to/from byte `offset` of a
  //! mapped region be described? Checked before any ticket is taken, so a
  //! bad request never becomes a command (never a DMA to bus address 0).
  BAM_HD nvme::status check_rw(std::uint64_t lba, std::uint32_t nblocks, std::uint64_t offset) const {
    const std::uint64_t bytes = static_cast<std::uint64_t>(nblocks) << l_.lba_shift;
    if (nblocks == 0 || lba >= blocks() || nblocks > blocks() - lba) return nvme::status_out_of_range;
    if (bytes > l_.max_transfer_bytes) return nvme::status_out_of_range;
    if (!nvme::prp_offset_valid(offset)) return nvme::status_out_of_range;
    if (nvme::prp_pages_spanned(offset, bytes, prp_page) > l_.list_entries + 1ull) return nvme::status_out_of_range;
    return nvme::status_success;
  }

  //! Read/Write command for `lba`, PRPs built in the list of (`queue`, `cid`).
  //! The request passed `check_rw`.
  BAM_HD nvme::command build_rw(nvme::nvm_opcode op, std::uint64_t lba, std::uint32_t nblocks,
                                const std::uint64_t* page_bus, std::uint64_t offset, std::uint32_t queue,
                                std::uint16_t cid) const {
    nvme::command cmd = nvme::make_rw(op, l_.nsid, lba, nblocks, 0, 0);
    const std::uint64_t list_index = static_cast<std::uint64_t>(queue) * l_.cids_per_queue + cid;
    std::uint64_t* list = l_.prp_lists + list_index * l_.list_entries;
    const std::uint64_t list_off = list_index * l_.list_entries * sizeof(std::uint64_t);
    const std::uint64_t list_bus = l_.prp_list_bus[list_off / prp_page] + list_off % prp_page;
    std::uint64_t* const virt[1] = {list};
    const std::uint64_t bus[1] = {list_bus};
    nvme::prp_pair p;
    nvme::build_prp(page_bus, offset, static_cast<std::uint64_t>(nblocks) << l_.lba_shift, prp_page, virt, bus, 1, p);
    cmd.prp1 = p.prp1;
    cmd.prp2 = p.prp2;
    return cmd;
  }

  //! Direct I/O (warp-collective: every active lane of the warp calls it,
  //! each with its own request — its own controller, opcode and blocks;
  //! returns each lane's status).
  BAM_DEVICE nvme::status io(nvme::nvm_opcode op, std::uint64_t lba, std::uint32_t nblocks,
                             const std::uint64_t* page_bus, std::uint64_t offset) const;
  BAM_DEVICE nvme::status read(std::uint64_t lba, std::uint32_t nblocks, const std::uint64_t* page_bus,
                               std::uint64_t offset) const {
    return io(nvme::nvm_opcode::read, lba, nblocks, page_bus, offset);
  }
  BAM_DEVICE nvme::status write(std::uint64_t lba, std::uint32_t nblocks, const std::uint64_t* page_bus,
                                std::uint64_t offset) const {
    return io(nvme::nvm_opcode::write, lba, nblocks, page_bus, offset);
  }
  //! NVMe Flush of the namespace (warp-collective like `read`).
  BAM_DEVICE nvme::status flush() const;

  //! PRPs describe memory in pages of this size (CC.MPS = 0).
  static constexpr std::uint64_t prp_page = 4096;

private:
  queue_set_layout l_;
};
static_assert(std::is_trivially_copyable_v<queue_set_ref>);

} // namespace bam

#include <bam/runtime/detail/warp_io.cuh>
