// SPDX-License-Identifier: MIT
//! Internals of the page cache's device side: a slot's state word, the sets,
//! the table of key spaces, and the per-lane page request that the miss path
//! drives (`page_cache_ref::resolve`).
//!
//! A slot's state word (64 bits): pin count (16), valid, busy (loading or
//! being written back), dirty, error (the load failed), referenced (clock
//! bit), write-back failed, and the tag (page key + 1; 0: empty).
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/file/extent_map_ref.hpp>
#include <bam/runtime/detail/warp_io.cuh>
#include <bam/runtime/error_record.cuh>
#include <bam/runtime/queue_set.cuh>

#include <cuda/atomic>

#include <cstdint>

namespace bam {

namespace detail {

inline constexpr std::uint64_t slot_pin_mask = 0xffffull;
//! A pin is refused (its add taken back at once) when the page holds this
//! many already. Adds past the limit are only those in flight before being
//! taken back. The library's paths make them per warp, not per lane (lanes
//! on one page share its pin; a row gather pins a page twice at most), and a
//! GPU holds far fewer than (0xffff - limit) / 2 warps (an H100: 8448), so
//! the count never carries into the state bits above it.
inline constexpr std::uint64_t slot_pin_limit = 0x8000ull;
inline constexpr std::uint64_t slot_valid = 1ull << 16;
inline constexpr std::uint64_t slot_busy = 1ull << 17; //!< loading, or being written back
inline constexpr std::uint64_t slot_dirty = 1ull << 18;
inline constexpr std::uint64_t slot_error = 1ull << 19;      //!< load failed (with busy: quarantined for good)
inline constexpr std::uint64_t slot_referenced = 1ull << 20; //!< clock bit
inline constexpr std::uint64_t slot_wb_failed = 1ull << 21;  //!< write-back failed: kept until a flush succeeds
inline constexpr unsigned slot_tag_shift = 22;
//! Page keys: space id (7 bits) above a 34-bit page number; tag = key + 1.
inline constexpr unsigned key_page_bits = 34;
inline constexpr std::uint64_t key_page_mask = (1ull << key_page_bits) - 1;
inline constexpr std::uint32_t max_spaces = 127;
//! Counter stripes (by SM) for misses and write-backs.
inline constexpr std::uint32_t counter_stripes = 32;

BAM_HD inline std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

template <class T>
using dev_atomic = cuda::atomic_ref<T, cuda::thread_scope_device>;

//! Per set: the ticket lock that orders misses, and the clock hand.
struct cache_set {
  std::uint32_t next;    //!< next ticket
  std::uint32_t serving; //!< ticket allowed to claim a victim
  std::uint32_t hand;    //!< clock hand (touched by the turn holder only)
  //! The next this many turns fail when they come, while the set's slots
  //! are still as `doom_marker` says: a turn holder saw the set change in
  //! nothing for a whole deadline while they queued behind it. Read and
  //! written by the turn holder only (ordered by the turn).
  std::uint32_t doomed;
  std::uint32_t doom_marker;
  //! Look-ahead holds on the set's pages (`page_cache_ref::hold`): never
  //! more than `hold_limit(ways)`, so that misses on the set always find
  //! ways that no hold keeps.
  std::uint32_t held;
};

//! Look-ahead holds a set of `ways` ways may have at once: half its ways.
BAM_HD inline std::uint32_t hold_limit(std::uint32_t ways) { return ways / 2; }

//! A slot out of use for good: busy with nothing that will end it (a load or
//! write-back that timed out and may still land or read it). Pins do not
//! change that: a page lost to a write-back stays readable, and readers that
//! keep pinning it never make the slot free.
BAM_HD inline bool slot_lost(std::uint64_t word) {
  return (word & slot_busy) != 0 && (word & (slot_error | slot_wb_failed)) != 0;
}

//! What of a slot's state word says whether the slot can be taken, or is
//! being filled: the tag and state bits, and whether it is pinned at all
//! (not for a lost slot, whose pins free nothing). Pin counts and the clock
//! bit move with every hit and say nothing about progress, so waits do not
//! watch them.
BAM_HD inline std::uint64_t slot_progress_bits(std::uint64_t word) {
  const bool pinned = (word & slot_pin_mask) != 0 && !slot_lost(word);
  return (word & ~(slot_pin_mask | slot_referenced)) | (pinned ? 1u : 0u);
}

//! A load or write-back of the slot is in flight: its owner will end it.
BAM_HD inline bool slot_io_in_flight(std::uint64_t word) {
  return (word & slot_busy) != 0 && (word & (slot_error | slot_wb_failed)) == 0;
}

//! A wait on a command in flight gives up after this many deadlines
//! without change, in case its owner never comes back.
inline constexpr std::uint64_t io_wait_backstop = 8;

//! What a waiting lane watches: a value that changes with progress, and
//! whether the wait is for a command in flight (see `io_wait_backstop`).
struct wait_marker {
  std::uint32_t value = 0;
  bool on_io = false;
};

//! Ask bytes [p, p + bytes) into L2 (16-byte aligned, a multiple of 16): a
//! hint that loads nothing; one bulk request on sm_90 and later.
BAM_DEVICE inline void prefetch_l2(const void* p, std::uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes));
#elif defined(__CUDA_ARCH__)
  for (std::uint32_t o = 0; o < bytes; o += 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(static_cast<const char*>(p) + o));
#else
  (void)p;
  (void)bytes;
#endif
}

//! A write-back of the slot failed: dirty again, not a victim until a flush
//! succeeds, and busy no more unless `keep_busy` (a write that timed out may
//! still read the slot). One atomic step, so that no one sees the slot
//! half-marked (lost, or clean and free).
BAM_DEVICE inline void mark_writeback_failed(std::uint64_t* slot_word, bool keep_busy) {
  dev_atomic<std::uint64_t> st(*slot_word);
  std::uint64_t w = st.load(cuda::memory_order_relaxed);
  std::uint64_t n;
  do {
    n = (w | slot_dirty | slot_wb_failed) & (keep_busy ? ~0ull : ~slot_busy);
  } while (!st.compare_exchange_weak(w, n, cuda::memory_order_release, cuda::memory_order_relaxed));
}

enum class page_phase : std::uint8_t {
  idle,         //!< nothing to do (or done and consumed)
  lookup,       //!< look the page up; pin it if present
  wait_turn,    //!< a miss waiting for its set's turn
  have_turn,    //!< holds the turn, looks for a victim
  pinned_wait,  //!< pinned a page another lane is loading
  loading,      //!< loads the page into the slot it claimed
  writing_back, //!< writes a dirty victim back before claiming it
  hit,          //!< pinned, valid: use the data, then release
  failed,       //!< `status` says why; nothing held
};

//! One lane's page request (registers).
struct page_request {
  std::uint64_t key = ~0ull;
  std::uint32_t slot = 0;
  std::uint32_t turn = 0;
  //! writing_back: the victim's slot; loading a page of a file space: the
  //! blocks of the page already in place (a page over several runs of the
  //! file is loaded run by run).
  std::uint32_t wb_slot = 0;
  std::uint16_t status = 0;
  page_phase phase = page_phase::idle;
  bool for_write = false;
  bool doomed = false; //!< timed out while waiting for its turn: pass it, then fail
  io_slot io;
  lane_wait wait; //!< this lane's deadline (see `page_cache_ref::resolve`)

  BAM_HD bool settled() const {
    return phase == page_phase::idle || phase == page_phase::hit || phase == page_phase::failed;
  }
};

//! A page's key: space id (7 bits) above its page number within the space.
BAM_HD inline std::uint64_t page_key(std::uint32_t space, std::uint64_t page) {
  return (static_cast<std::uint64_t>(space) << key_page_bits) | page;
}

//! Where the pages of one key space live: a storage's controllers and the
//! striping of pages over them (page p on controller p % nctrl, at
//! `base_lba + (p / nctrl) * blocks_per_page`), or, for a file space, the
//! file's extent map on the storage's one controller (page p holds the
//! file's blocks from `p * blocks_per_page`; read-only). Device-side.
struct space_ref {
  const queue_set_ref* ctrls = nullptr;           //!< the storage's controllers (device array)
  const std::uint64_t* const* data_bus = nullptr; //!< per controller: bus address of each 4 KiB of the cache's pages
  device_error_record* err = nullptr;             //!< write-back failures of this space's pages
  const extent_map_ref* file = nullptr;           //!< a file space's extent map (device memory), else null
  std::uint64_t base_lba = 0;
  std::uint64_t npages = 0;
  std::uint32_t nctrl = 0;
  std::uint32_t blocks_per_page = 0;

  BAM_HD std::uint32_t controller_of(std::uint64_t p) const { return static_cast<std::uint32_t>(p % nctrl); }
  //! The LBA of page p's first block (`extent_hole` for a page of a file that starts in a hole or past its end).
  BAM_HD std::uint64_t lba_of(std::uint64_t p) const {
    if (file != nullptr) return file->find(p * blocks_per_page).lba;
    return base_lba + (p / nctrl) * blocks_per_page;
  }
};

//! Describe the write-back of page `p` of `sp` from byte `offset` of the
//! cache's pages. A file space is read-only: its write-back completes at
//! once with Namespace is Write Protected (the page stays dirty and the
//! failure is reported like any failed write-back).
BAM_DEVICE inline void start_writeback(io_slot& io, const space_ref& sp, std::uint64_t p, std::uint64_t offset) {
  if (sp.file != nullptr) {
    io.qs = sp.ctrls;
    io.state = io_state::done;
    io.status = nvme::status(nvme::status_type::generic, nvme::generic_status::namespace_write_protected).raw;
    return;
  }
  const std::uint32_t c = sp.controller_of(p);
  io.start_rw(sp.ctrls[c], nvme::nvm_opcode::write, sp.lba_of(p), sp.blocks_per_page, sp.data_bus[c], offset);
}

//! The library's way into the private parts of its device handles (row
//! gathers, look-ahead holds, the cache's kernels, tests that look inside
//! the cache); defined in <bam/runtime/detail/ref_access.cuh>.
struct ref_access;

//! The host side of a page cache (<bam/runtime/page_cache.cuh>): it makes
//! the cache's handles.
class cache_state;

} // namespace detail

} // namespace bam
