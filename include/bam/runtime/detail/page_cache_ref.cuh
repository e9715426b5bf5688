// SPDX-License-Identifier: MIT
//! Device side of `bam::page_cache`: slot states, the hit path, and the miss
//! path as a per-lane state machine that a warp drives together.
//!
//! A slot's state word (64 bits): pin count (16), valid, busy (loading or
//! being written back), dirty, error (the load failed), referenced (clock
//! bit), write-back failed, and the tag (page key + 1; 0: empty).
//!
//! Forward progress, by construction:
//!  - A pin is held only while its warp uses the page's data, or while it
//!    waits for that page's load; a warp never waits for a cache slot while
//!    it holds a pin (accesses release their pins before they wait again).
//!    Loads complete as the controller makes progress, so every pin ends.
//!    Look-ahead holds (`hold`) are the exception: pins that last until
//!    their owner drops them, at most half the ways of a set, so the
//!    other half is always there for misses.
//!  - Misses on a set take a ticket and claim victims in ticket order (one
//!    holder of the set's turn at a time; it keeps the turn until a slot is
//!    free). So a warp that needs a slot gets one: after the misses ahead of
//!    it, as soon as a slot of its set is unpinned.
//!  - A cache of N slots sustains N loads in flight (`ways` per set); past
//!    that, misses queue per set: throughput drops, nothing fails.
//!  - Deadlines measure lack of progress (a set whose slots all stay
//!    unchanged, a queue that completes nothing, a fetched command that does
//!    not complete), never time spent queued behind other threads. Each lane
//!    keeps its own (in its request, across calls); pin counts and clock
//!    bits, which every hit moves, do not count as progress.
//!  - A wait for a slot whose load or write-back is in flight lasts as long
//!    as that command: its owner has a deadline of its own and ends it
//!    (valid, error, or lost), also when the command waits long behind a
//!    busy queue. `io_wait_backstop` deadlines bound it all the same.
//!  - A turn holder whose set changed in nothing for a whole deadline fails,
//!    and so do the misses queued behind it when their turns come, as long
//!    as the set is still as it found it: they would otherwise wait out a
//!    deadline each, one after another.
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/detail/memory_ops.cuh>
#include <bam/runtime/detail/warp_io.cuh>
#include <bam/runtime/error_record.cuh>
#include <bam/runtime/queue_set.cuh>

#include <cuda/atomic>

#include <cstdint>
#include <type_traits>

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

} // namespace detail

//! Where the pages of one key space live: a storage's controllers and the
//! striping of pages over them (page p on controller p % nctrl, at
//! `base_lba + (p / nctrl) * blocks_per_page`). Device-side.
struct space_ref {
  const queue_set_ref* ctrls = nullptr;           //!< the storage's controllers (device array)
  const std::uint64_t* const* data_bus = nullptr; //!< per controller: bus address of each 4 KiB of the cache's pages
  device_error_record* err = nullptr;             //!< write-back failures of this space's pages
  std::uint64_t base_lba = 0;
  std::uint64_t npages = 0;
  std::uint32_t nctrl = 0;
  std::uint32_t blocks_per_page = 0;

  BAM_HD std::uint32_t controller_of(std::uint64_t p) const { return static_cast<std::uint32_t>(p % nctrl); }
  BAM_HD std::uint64_t lba_of(std::uint64_t p) const { return base_lba + (p / nctrl) * blocks_per_page; }
};

//! What the hit path found.
enum class pin_state : std::uint32_t {
  miss,    //!< not in the cache
  hit,     //!< pinned, valid
  loading, //!< pinned, another lane is loading it
  retry,   //!< it changed while being pinned: look again
};
struct pin_result {
  std::uint32_t slot;
  pin_state state;
};

namespace detail {
//! Where a request continues after `page_cache_ref::pin`.
BAM_HD constexpr page_phase phase_after(pin_state s) {
  return s == pin_state::hit ? page_phase::hit : s == pin_state::loading ? page_phase::pinned_wait : page_phase::lookup;
}
} // namespace detail

//! Trivially copyable device handle to a page cache.
struct page_cache_ref {
  std::uint8_t* data = nullptr;
  std::uint64_t* slots = nullptr;       //!< state word per slot
  std::uint16_t* slot_status = nullptr; //!< status of a failed load, per slot
  detail::cache_set* sets = nullptr;
  const space_ref* spaces = nullptr;      //!< by space id
  unsigned long long* counters = nullptr; //!< per stripe: misses, write-backs
  std::uint64_t nslots = 0;
  std::uint64_t nsets = 0;
  std::uint32_t ways = 0;
  std::uint32_t page_shift = 0;
  std::uint64_t timeout_ns = nvme::default_queue_timeout_ns;
  //! Always 0; the compiler cannot know it (see `detail::dependency_token`).
  std::uint32_t zero = 0;

  BAM_HD static std::uint64_t make_key(std::uint32_t space, std::uint64_t page) {
    return (static_cast<std::uint64_t>(space) << detail::key_page_bits) | page;
  }
  BAM_DEVICE std::uint8_t* page_data(std::uint32_t slot) const {
    return data + (static_cast<std::uint64_t>(slot) << page_shift);
  }
  //! The set of a page: a multiply instead of a 64-bit modulo (nsets < 2^32).
  BAM_DEVICE std::uint64_t set_of(std::uint64_t key) const {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(detail::mix64(key))) * nsets) >> 32;
  }

  //! Drop a pin after writing the page's data (release order: the data first).
  BAM_DEVICE void release(std::uint32_t slot) const {
    detail::dev_atomic<std::uint64_t>(slots[slot]).fetch_sub(1, cuda::memory_order_release);
  }
  //! Drop a pin after reading the page's data: `token` (0) was computed from
  //! the values read (`detail::dependency_token`), so the unpin is issued only
  //! after they arrived, and needs no fence.
  BAM_DEVICE void release_read(std::uint32_t slot, unsigned token) const {
    detail::dev_atomic<std::uint64_t>(slots[slot]).fetch_sub(1ull + token, cuda::memory_order_relaxed);
  }

  //! The hit path: pin the page of `key` if it is in the cache (one round
  //! trip to read its set, one atomic add). No page_request, no fence.
  BAM_DEVICE pin_result pin(std::uint64_t key, bool for_write) const { return pin(key, for_write, 0, 0); }
  //! The same; when the page is found, bytes [prefetch_from, prefetch_from +
  //! prefetch_bytes) of its slot are asked into L2 (a hint, no load) while
  //! the pin's atomic is in flight, so the reads after the pin find them there.
  BAM_DEVICE pin_result pin(std::uint64_t key, bool for_write, std::uint32_t prefetch_from,
                            std::uint32_t prefetch_bytes) const;
  //! `pin` for reading by the whole warp (converged, one `key`): each lane
  //! reads a way of the set, one lane pins what they found. Every lane gets
  //! the result; the pin is one, and the caller releases it once.
  BAM_DEVICE pin_result pin_warp(std::uint64_t key, std::uint32_t prefetch_from, std::uint32_t prefetch_bytes) const;
  //! Pin `slot` for reading if it still holds the valid page of `key` (one
  //! atomic, no lookup): hit, or retry (nothing held) when it does not.
  BAM_DEVICE pin_result pin_slot(std::uint32_t slot, std::uint64_t key) const;
  //! Look-ahead hold: pin the page of `key` for reading if it is in the
  //! cache and valid now, loading nothing and waiting for nothing, as long
  //! as its set holds fewer than `detail::hold_limit(ways)` such pins. A
  //! held page is never a victim until `release_hold`: unlike other pins, holds
  //! last across kernels, and the limit per set keeps the cache's forward
  //! progress (a miss always finds ways that no hold keeps). True with the
  //! slot in `slot` when it holds the page.
  BAM_DEVICE bool hold(std::uint64_t key, std::uint32_t& slot) const;
  //! Drop a hold taken by `hold` (nothing was read through it).
  BAM_DEVICE void release_hold(std::uint32_t slot) const;
  //! `pin` for a request: sets `r.phase` to hit, pinned_wait (another lane
  //! loads it) or lookup (retry, or a miss: returns false).
  BAM_DEVICE bool try_pin(detail::page_request& r) const;

  //! Drive the requests of the lanes of `mask` (converged) until every one
  //! is settled, or — with `until_any` — until at least one lane is settled.
  BAM_DEVICE void resolve(detail::page_request& r, unsigned mask, bool until_any) const;

  //! Count a miss (0) or a write-back (1).
  BAM_DEVICE void count(unsigned which) const;

private:
  BAM_DEVICE pin_result take_pin(std::uint32_t s, std::uint64_t tag, bool for_write, std::uint32_t prefetch_from,
                                 std::uint32_t prefetch_bytes) const;
  BAM_DEVICE bool step(detail::page_request& r) const;
  BAM_DEVICE void finish_io(detail::page_request& r) const;
  BAM_DEVICE void start_load(detail::page_request& r, std::uint32_t slot) const;
  BAM_DEVICE bool claim_victim(detail::page_request& r) const;
  BAM_DEVICE void pass_turn(const detail::page_request& r) const;
  BAM_DEVICE detail::wait_marker set_marker(std::uint64_t set) const;
  BAM_DEVICE detail::wait_marker marker(const detail::page_request& r) const;
  BAM_DEVICE void abandon(detail::page_request& r) const;
};
static_assert(std::is_trivially_copyable_v<page_cache_ref>);

// ---------------------------------------------------------------------------

BAM_DEVICE inline void page_cache_ref::count(unsigned which) const {
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  detail::dev_atomic<unsigned long long>(counters[(smid % detail::counter_stripes) * 2 + which])
      .fetch_add(1, cuda::memory_order_relaxed);
}

BAM_DEVICE inline pin_result page_cache_ref::pin(std::uint64_t key, bool for_write, std::uint32_t prefetch_from,
                                                 std::uint32_t prefetch_bytes) const {
  using namespace detail;
  const std::uint64_t tag = key + 1;
  const std::uint64_t base = set_of(key) * ways;
  // The set's state words are read together (one round trip), then scanned.
  constexpr std::uint32_t batch = 8;
  for (std::uint32_t w0 = 0; w0 < ways; w0 += batch) {
    std::uint64_t words[batch];
#pragma unroll
    for (std::uint32_t k = 0; k < batch; ++k)
      words[k] = w0 + k < ways ? dev_atomic<std::uint64_t>(slots[base + w0 + k]).load(cuda::memory_order_relaxed) : 0;
    std::uint32_t w = ~0u;
#pragma unroll
    for (std::uint32_t k = 0; k < batch; ++k)
      if (w == ~0u && (words[k] >> slot_tag_shift) == tag && (words[k] & slot_error) == 0) w = w0 + k;
    if (w == ~0u) continue;
    return take_pin(static_cast<std::uint32_t>(base + w), tag, for_write, prefetch_from, prefetch_bytes);
  }
  return {0, pin_state::miss};
}

BAM_DEVICE inline pin_result page_cache_ref::take_pin(std::uint32_t s, std::uint64_t tag, bool for_write,
                                                      std::uint32_t prefetch_from, std::uint32_t prefetch_bytes) const {
  using namespace detail;
  if (prefetch_bytes != 0) prefetch_l2(page_data(s) + prefetch_from, prefetch_bytes);
  // One atomic add pins it (never retried like a compare-and-swap); if the
  // slot changed since it was read, the add is taken back.
  dev_atomic<std::uint64_t> st(slots[s]);
  const std::uint64_t old = st.fetch_add(1, cuda::memory_order_relaxed);
  if ((old >> slot_tag_shift) != tag || (old & slot_error) != 0 || (old & slot_pin_mask) >= slot_pin_limit) {
    st.fetch_sub(1, cuda::memory_order_relaxed);
    return {0, pin_state::retry};
  }
  if ((old & slot_referenced) == 0) st.fetch_or(slot_referenced, cuda::memory_order_relaxed);
  // Relaxed: the slot index carries a dependency on the pinned word, so the
  // data is read only after the pin is in place (and the page valid).
  const std::uint32_t slot = s + dependency_token(static_cast<unsigned>(old), zero);
  if ((old & slot_valid) == 0) return {slot, pin_state::loading};
  if (for_write && (old & slot_dirty) == 0) st.fetch_or(slot_dirty, cuda::memory_order_relaxed);
  return {slot, pin_state::hit};
}

BAM_DEVICE inline pin_result page_cache_ref::pin_warp(std::uint64_t key, std::uint32_t prefetch_from,
                                                      std::uint32_t prefetch_bytes) const {
  using namespace detail;
  constexpr unsigned full = 0xffffffffu;
  const unsigned lane = lane_id();
  const std::uint64_t tag = key + 1;
  const std::uint64_t base = set_of(key) * ways;
  for (std::uint32_t w0 = 0; w0 < ways; w0 += 32) {
    // Lane k reads way w0 + k: the set in one request.
    const std::uint32_t w = w0 + lane;
    const std::uint64_t word =
        w < ways ? dev_atomic<std::uint64_t>(slots[base + w]).load(cuda::memory_order_relaxed) : 0;
    const unsigned found = __ballot_sync(full, w < ways && (word >> slot_tag_shift) == tag && (word & slot_error) == 0);
    if (found == 0) continue;
    const unsigned k = __ffs(found) - 1;
    pin_result r{0, pin_state::retry};
    if (lane == k) r = take_pin(static_cast<std::uint32_t>(base + w), tag, false, prefetch_from, prefetch_bytes);
    return {__shfl_sync(full, r.slot, k), static_cast<pin_state>(__shfl_sync(full, static_cast<unsigned>(r.state), k))};
  }
  return {0, pin_state::miss};
}

BAM_DEVICE inline pin_result page_cache_ref::pin_slot(std::uint32_t slot, std::uint64_t key) const {
  using namespace detail;
  dev_atomic<std::uint64_t> st(slots[slot]);
  const std::uint64_t old = st.fetch_add(1, cuda::memory_order_relaxed);
  if ((old >> slot_tag_shift) != key + 1 || (old & (slot_valid | slot_error)) != slot_valid ||
      (old & slot_pin_mask) >= slot_pin_limit) {
    st.fetch_sub(1, cuda::memory_order_relaxed);
    return {0, pin_state::retry};
  }
  if ((old & slot_referenced) == 0) st.fetch_or(slot_referenced, cuda::memory_order_relaxed);
  // The data is read only after the pin is in place (see `pin`).
  return {slot + dependency_token(static_cast<unsigned>(old), zero), pin_state::hit};
}

BAM_DEVICE inline bool page_cache_ref::hold(std::uint64_t key, std::uint32_t& slot) const {
  using namespace detail;
  const pin_result p = pin(key, false);
  if (p.state != pin_state::hit) {
    if (p.state == pin_state::loading) release(p.slot); // another lane's load: not waited for
    return false;
  }
  dev_atomic<std::uint32_t> held(sets[p.slot / ways].held);
  if (held.fetch_add(1, cuda::memory_order_relaxed) >= hold_limit(ways)) {
    held.fetch_sub(1, cuda::memory_order_relaxed);
    release(p.slot);
    return false;
  }
  slot = p.slot;
  return true;
}

BAM_DEVICE inline void page_cache_ref::release_hold(std::uint32_t slot) const {
  // The pin first: the set's count then never says fewer holds than pins kept.
  release(slot);
  detail::dev_atomic<std::uint32_t>(sets[slot / ways].held).fetch_sub(1, cuda::memory_order_relaxed);
}

BAM_DEVICE inline bool page_cache_ref::try_pin(detail::page_request& r) const {
  const pin_result p = pin(r.key, r.for_write);
  switch (p.state) {
  case pin_state::hit:
    r.slot = p.slot;
    r.phase = detail::page_phase::hit;
    return true;
  case pin_state::loading:
    r.slot = p.slot;
    r.phase = detail::page_phase::pinned_wait;
    return true;
  case pin_state::retry: r.phase = detail::page_phase::lookup; return true;
  default: return false;
  }
}

BAM_DEVICE inline void page_cache_ref::pass_turn(const detail::page_request& r) const {
  detail::dev_atomic<std::uint32_t>(sets[set_of(r.key)].serving).store(r.turn + 1, cuda::memory_order_release);
}

BAM_DEVICE inline void page_cache_ref::start_load(detail::page_request& r, std::uint32_t slot) const {
  const space_ref& sp = spaces[r.key >> detail::key_page_bits];
  const std::uint64_t p = r.key & detail::key_page_mask;
  const std::uint32_t c = sp.controller_of(p);
  r.slot = slot;
  r.phase = detail::page_phase::loading;
  r.io.start_rw(sp.ctrls[c], nvme::nvm_opcode::read, sp.lba_of(p), sp.blocks_per_page, sp.data_bus[c],
                static_cast<std::uint64_t>(slot) << page_shift);
  count(0);
}

//! Under the set's turn: find a victim by the clock. A clean one is claimed
//! for `r.key` (pinned, busy); a dirty one is claimed for write-back.
//! Returns true if the request moved on.
BAM_DEVICE inline bool page_cache_ref::claim_victim(detail::page_request& r) const {
  using namespace detail;
  const std::uint64_t tag = r.key + 1;
  const std::uint64_t set = set_of(r.key);
  const std::uint64_t base = set * ways;
  // Another lane may have loaded the page while this one waited for the turn.
  for (std::uint32_t w = 0; w < ways; ++w) {
    const std::uint64_t word = dev_atomic<std::uint64_t>(slots[base + w]).load(cuda::memory_order_relaxed);
    if ((word >> slot_tag_shift) == tag && (word & slot_error) == 0) {
      pass_turn(r);
      r.phase = page_phase::lookup;
      return true;
    }
  }
  // Only the holder of the set's turn moves the hand: one load, one store.
  dev_atomic<std::uint32_t> hand_ref(sets[set].hand);
  std::uint32_t hand = hand_ref.load(cuda::memory_order_relaxed);
  struct store_hand {
    dev_atomic<std::uint32_t>& ref;
    std::uint32_t& value;
    BAM_DEVICE ~store_hand() { ref.store(value, cuda::memory_order_relaxed); }
  } keep_hand{hand_ref, hand};
  std::int64_t dirty = -1;
  bool waitable = false; // something will free up: pinned or busy slots
  bool lost = false;     // a slot a timed-out load may still land in: never reused
  for (std::uint32_t i = 0; i < 2 * ways; ++i) {
    const std::uint64_t s = base + hand++ % ways;
    dev_atomic<std::uint64_t> st(slots[s]);
    std::uint64_t word = st.load(cuda::memory_order_relaxed);
    if (slot_lost(word)) {
      lost = true;
      continue;
    }
    if ((word & slot_pin_mask) != 0 || (word & slot_busy) != 0) {
      waitable = true;
      continue;
    }
    if (word & slot_wb_failed) continue;
    if (word & slot_referenced) {
      st.compare_exchange_strong(word, word & ~slot_referenced, cuda::memory_order_relaxed);
      waitable = true;
      continue;
    }
    if ((word & slot_valid) && (word & slot_dirty)) {
      if (dirty < 0) dirty = static_cast<std::int64_t>(s);
      continue;
    }
    if (st.compare_exchange_strong(word, (tag << slot_tag_shift) | slot_busy | 1ull, cuda::memory_order_acq_rel)) {
      pass_turn(r);
      start_load(r, static_cast<std::uint32_t>(s));
      return true;
    }
    waitable = true;
  }
  if (dirty >= 0) {
    // Write the dirty page back before its slot is reused; readers may still
    // hit it meanwhile (it stays valid), writers re-dirty it.
    dev_atomic<std::uint64_t> st(slots[dirty]);
    std::uint64_t word = st.load(cuda::memory_order_relaxed);
    // Still no victim if a flush failed on it since (it waits for a flush).
    if ((word & (slot_pin_mask | slot_busy | slot_wb_failed)) == 0 && (word & slot_dirty) &&
        st.compare_exchange_strong(word, (word & ~slot_dirty) | slot_busy, cuda::memory_order_acq_rel)) {
      pass_turn(r);
      const std::uint64_t old_key = (word >> slot_tag_shift) - 1;
      const space_ref& sp = spaces[old_key >> key_page_bits];
      const std::uint64_t p = old_key & key_page_mask;
      const std::uint32_t c = sp.controller_of(p);
      r.wb_slot = static_cast<std::uint32_t>(dirty);
      r.phase = page_phase::writing_back;
      r.io.start_rw(sp.ctrls[c], nvme::nvm_opcode::write, sp.lba_of(p), sp.blocks_per_page, sp.data_bus[c],
                    static_cast<std::uint64_t>(dirty) << page_shift);
      return true;
    }
    return false;
  }
  if (!waitable) {
    // Every way holds a page whose write-back failed (nothing frees up until
    // a flush succeeds), or a load or write-back that timed out may still
    // land in it or read it (never reused). Say so at once: waiting would cost every later miss on the
    // set a whole deadline, one after another.
    pass_turn(r);
    r.status = lost ? nvme::status_timeout.raw
                    : nvme::status(nvme::status_type::media_error, nvme::media_status::write_fault).raw;
    r.phase = page_phase::failed;
    return true;
  }
  return false;
}

//! After a load or write-back completed (or was refused).
BAM_DEVICE inline void page_cache_ref::finish_io(detail::page_request& r) const {
  using namespace detail;
  const nvme::status st(r.io.status);
  r.io.state = io_state::none;
  if (r.phase == page_phase::loading) {
    dev_atomic<std::uint64_t> word(slots[r.slot]);
    if (st.ok()) {
      word.fetch_add(slot_valid - slot_busy + (r.for_write ? slot_dirty : 0), cuda::memory_order_release);
      r.phase = page_phase::hit;
      return;
    }
    slot_status[r.slot] = st.raw;
    // A command that timed out after it was submitted may still land in the
    // slot: the slot stays busy (never reused) with the error set.
    const bool may_land = st == nvme::status_timeout;
    word.fetch_add(may_land ? slot_error : slot_error - slot_busy, cuda::memory_order_release);
    release(r.slot);
    r.status = st.raw;
    r.phase = page_phase::failed;
    return;
  }
  // writing_back
  dev_atomic<std::uint64_t> word(slots[r.wb_slot]);
  if (st.ok()) {
    count(1);
    word.fetch_and(~slot_busy, cuda::memory_order_release);
  } else {
    const std::uint64_t w = word.load(cuda::memory_order_relaxed);
    const std::uint64_t old_key = (w >> slot_tag_shift) - 1;
    const space_ref& sp = spaces[old_key >> key_page_bits];
    const std::uint64_t p = old_key & key_page_mask;
    if (sp.err != nullptr) sp.err->record(st, failure_site::page(sp.lba_of(p), sp.controller_of(p)));
    // The data is still only here: dirty again, and not a victim until a
    // flush succeeds. A write that timed out may still read the slot: it
    // stays busy, out of use for good (`slot_lost`).
    mark_writeback_failed(&slots[r.wb_slot], st == nvme::status_timeout);
  }
  // A neighbour's failed write-back does not fail this request: look again.
  r.phase = page_phase::lookup;
}

//! One non-blocking step of a lane's request. True if it moved.
BAM_DEVICE inline bool page_cache_ref::step(detail::page_request& r) const {
  using namespace detail;
  switch (r.phase) {
  case page_phase::lookup:
    if (try_pin(r)) return r.phase != page_phase::lookup;
    r.turn = dev_atomic<std::uint32_t>(sets[set_of(r.key)].next).fetch_add(1, cuda::memory_order_relaxed);
    r.phase = page_phase::wait_turn;
    [[fallthrough]];
  case page_phase::wait_turn:
    if (dev_atomic<std::uint32_t>(sets[set_of(r.key)].serving).load(nvme::detail::poll_order()) != r.turn) return false;
    nvme::detail::acquire_fence();
    r.phase = page_phase::have_turn;
    if (dev_atomic<std::uint32_t> doomed(sets[set_of(r.key)].doomed); doomed.load(cuda::memory_order_relaxed) != 0) {
      // Doomed while the set is as the turn holder that gave up left it;
      // once it moved, the queue behind waits as usual again.
      const std::uint32_t then =
          dev_atomic<std::uint32_t>(sets[set_of(r.key)].doom_marker).load(cuda::memory_order_relaxed);
      if (set_marker(set_of(r.key)).value == then) {
        doomed.fetch_sub(1, cuda::memory_order_relaxed);
        r.doomed = true;
      } else {
        doomed.store(0, cuda::memory_order_relaxed);
      }
    }
    if (r.doomed) {
      pass_turn(r);
      r.status = nvme::status_timeout.raw;
      r.phase = page_phase::failed;
      return true;
    }
    [[fallthrough]];
  case page_phase::have_turn: return claim_victim(r);
  case page_phase::pinned_wait: {
    const std::uint64_t word = dev_atomic<std::uint64_t>(slots[r.slot]).load(nvme::detail::poll_order());
    if ((word & (slot_valid | slot_error)) == 0) return false;
    nvme::detail::acquire_fence(); // the page's data (or status) after its state
    if (word & slot_valid) {
      if (r.for_write && (word & slot_dirty) == 0)
        dev_atomic<std::uint64_t>(slots[r.slot]).fetch_or(slot_dirty, cuda::memory_order_relaxed);
      r.phase = page_phase::hit;
      return true;
    }
    if (word & slot_error) {
      r.status = slot_status[r.slot];
      release(r.slot);
      r.phase = page_phase::failed;
      return true;
    }
    return false;
  }
  default: return false;
  }
}

//! The state of a set's slots as far as progress goes, and whether any of
//! them waits for a command in flight.
BAM_DEVICE inline detail::wait_marker page_cache_ref::set_marker(std::uint64_t set) const {
  using namespace detail;
  std::uint64_t h = 0;
  bool on_io = false;
  for (std::uint32_t w = 0; w < ways; ++w) {
    const std::uint64_t word = dev_atomic<std::uint64_t>(slots[set * ways + w]).load(cuda::memory_order_relaxed);
    h = h * 31 + slot_progress_bits(word);
    on_io |= slot_io_in_flight(word);
  }
  return {static_cast<std::uint32_t>(h ^ (h >> 32)), on_io};
}

BAM_DEVICE inline detail::wait_marker page_cache_ref::marker(const detail::page_request& r) const {
  using namespace detail;
  switch (r.phase) {
  case page_phase::wait_turn:
  case page_phase::have_turn: {
    const std::uint64_t set = set_of(r.key);
    wait_marker m = set_marker(set);
    m.value = m.value * 31 + dev_atomic<std::uint32_t>(sets[set].serving).load(cuda::memory_order_relaxed);
    return m;
  }
  case page_phase::pinned_wait: {
    const std::uint64_t word = dev_atomic<std::uint64_t>(slots[r.slot]).load(cuda::memory_order_relaxed);
    return {static_cast<std::uint32_t>(slot_progress_bits(word)), slot_io_in_flight(word)};
  }
  case page_phase::loading:
  case page_phase::writing_back: return {io_progress_marker(r.io) + 1, false};
  default: return {};
  }
}

//! The lane's wait ran out: give up what can be given up now.
BAM_DEVICE inline void page_cache_ref::abandon(detail::page_request& r) const {
  using namespace detail;
  switch (r.phase) {
  case page_phase::wait_turn: r.doomed = true; break; // passes its turn when it comes
  case page_phase::have_turn: {
    // The set changed in nothing for a whole deadline: the misses queued
    // behind this one would each wait a deadline of their own, one after
    // another. They fail when their turn comes; later ones wait again.
    cache_set& cs = sets[set_of(r.key)];
    const std::uint32_t behind = dev_atomic<std::uint32_t>(cs.next).load(cuda::memory_order_relaxed) - (r.turn + 1);
    dev_atomic<std::uint32_t>(cs.doom_marker).store(set_marker(set_of(r.key)).value, cuda::memory_order_relaxed);
    dev_atomic<std::uint32_t>(cs.doomed).store(behind, cuda::memory_order_relaxed);
    pass_turn(r);
    r.status = nvme::status_timeout.raw;
    r.phase = page_phase::failed;
    break;
  }
  case page_phase::pinned_wait:
    release(r.slot);
    r.status = nvme::status_timeout.raw;
    r.phase = page_phase::failed;
    break;
  case page_phase::loading:
  case page_phase::writing_back:
    io_abandon(r.io);
    finish_io(r);
    if (r.phase == page_phase::lookup) { // a write-back gave up: so does the request
      r.status = nvme::status_timeout.raw;
      r.phase = page_phase::failed;
    }
    break;
  case page_phase::lookup:
    r.status = nvme::status_timeout.raw;
    r.phase = page_phase::failed;
    break;
  default: break;
  }
}

BAM_DEVICE BAM_NOINLINE inline void page_cache_ref::resolve(detail::page_request& r, unsigned mask,
                                                            bool until_any) const {
  using namespace detail;
  unsigned idle = 0;
  for (;;) {
    const unsigned unsettled = __ballot_sync(mask, !r.settled());
    if (unsettled == 0) return;
    if (until_any && unsettled != (mask & __ballot_sync(mask, r.phase != page_phase::idle))) return;
    bool moved = step(r);
    // Loads and write-backs: the warp drives every lane's command together.
    const bool io_moved = warp_io_step(r.io, mask);
    if (r.io.state == io_state::done) {
      finish_io(r);
      moved = true;
    }
    // Each lane's deadline is its own: a lane that waits on a dead command
    // times out although its neighbours keep moving.
    if (moved) {
      r.wait.restart();
    } else if (!r.settled()) {
      const wait_marker m = marker(r);
      // (Saturated: a deadline of 2^61 ns or more is "never" all the same.)
      const std::uint64_t limit = !m.on_io                                ? timeout_ns
                                  : timeout_ns > ~0ull / io_wait_backstop ? ~0ull
                                                                          : timeout_ns * io_wait_backstop;
      // A lane's own command is given up only if the threads serving its
      // controller (if any) ran for the whole wait.
      const bool own_io = r.phase == page_phase::loading || r.phase == page_phase::writing_back;
      if (r.wait.expired(m.value, limit) && (!own_io || io_controller_ran_for(r.io, timeout_ns))) abandon(r);
    }
    if (__any_sync(mask, moved) || io_moved) {
      idle = 0;
    } else {
      ++idle;
      relax(idle < 16 ? 64 : 512);
    }
  }
}

} // namespace bam
