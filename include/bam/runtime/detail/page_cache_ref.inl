// SPDX-License-Identifier: MIT
//! Code of `bam::page_cache_ref` (<bam/runtime/page_cache_ref.cuh>): the hit
//! path, and the miss path as a per-lane state machine that a warp drives
//! together.
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

namespace bam {

namespace detail {
//! Where a request continues after `page_cache_ref::pin`.
BAM_HD constexpr page_phase phase_after(pin_state s) {
  return s == pin_state::hit ? page_phase::hit : s == pin_state::loading ? page_phase::pinned_wait : page_phase::lookup;
}
} // namespace detail

inline page_cache_ref::page_cache_ref(std::uint8_t* data, std::uint64_t* slots, std::uint16_t* slot_status,
                                      detail::cache_set* sets, const detail::space_ref* spaces,
                                      unsigned long long* counters, std::uint64_t nslots, std::uint64_t nsets,
                                      std::uint32_t ways, std::uint32_t page_shift, std::uint64_t timeout_ns,
                                      bool spread)
    : data_(data), slots_(slots), slot_status_(slot_status), sets_(sets), spaces_(spaces), counters_(counters),
      nslots_(nslots), nsets_(nsets), ways_(ways), page_shift_(page_shift), timeout_ns_(timeout_ns), spread_(spread) {}

BAM_HD inline std::uint64_t page_cache_ref::page_size() const { return std::uint64_t{1} << page_shift_; }
BAM_HD inline std::uint64_t page_cache_ref::slot_count() const { return nslots_; }
BAM_HD inline std::uint32_t page_cache_ref::ways() const { return ways_; }

BAM_DEVICE inline std::uint8_t* page_cache_ref::page_data(std::uint32_t slot) const {
  return data_ + (static_cast<std::uint64_t>(slot) << page_shift_);
}

BAM_DEVICE inline std::uint64_t page_cache_ref::set_of(std::uint64_t key) const {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(detail::mix64(key))) * nsets_) >> 32;
}

BAM_DEVICE inline void page_cache_ref::release(std::uint32_t slot) const {
  // Writes to a page at home on another GPU reach it before the unpin does
  // (a write-back from a third GPU may follow).
  if (spread_) cuda::atomic_thread_fence(cuda::memory_order_release, cuda::thread_scope_system);
  detail::dev_atomic<std::uint64_t>(slots_[slot]).fetch_sub(1, cuda::memory_order_release);
}

BAM_DEVICE inline void page_cache_ref::release_read(std::uint32_t slot, unsigned token) const {
  detail::dev_atomic<std::uint64_t>(slots_[slot]).fetch_sub(1ull + token, cuda::memory_order_relaxed);
}

BAM_DEVICE inline pin_result page_cache_ref::pin(std::uint64_t key, bool for_write) const {
  return pin(key, for_write, 0, 0);
}

BAM_DEVICE inline void page_cache_ref::count(unsigned which) const {
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  detail::dev_atomic<unsigned long long>(counters_[(smid % detail::counter_stripes) * 2 + which])
      .fetch_add(1, cuda::memory_order_relaxed);
}

BAM_DEVICE inline pin_result page_cache_ref::pin(std::uint64_t key, bool for_write, std::uint32_t prefetch_from,
                                                 std::uint32_t prefetch_bytes) const {
  using namespace detail;
  const std::uint64_t tag = key + 1;
  const std::uint64_t base = set_of(key) * ways_;
  // The set's state words are read together (one round trip), then scanned.
  constexpr std::uint32_t batch = 8;
  for (std::uint32_t w0 = 0; w0 < ways_; w0 += batch) {
    std::uint64_t words[batch];
#pragma unroll
    for (std::uint32_t k = 0; k < batch; ++k)
      words[k] = w0 + k < ways_ ? dev_atomic<std::uint64_t>(slots_[base + w0 + k]).load(cuda::memory_order_relaxed) : 0;
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
  // (Not for a cache over several GPUs: a bulk L2 prefetch of another GPU's
  // memory stalls the warp far longer than the reads it would speed up.)
  if (prefetch_bytes != 0 && !spread_) prefetch_l2(page_data(s) + prefetch_from, prefetch_bytes);
  // One atomic add pins it (never retried like a compare-and-swap); if the
  // slot changed since it was read, the add is taken back.
  dev_atomic<std::uint64_t> st(slots_[s]);
  const std::uint64_t old = st.fetch_add(1, cuda::memory_order_relaxed);
  if ((old >> slot_tag_shift) != tag || (old & slot_error) != 0 || (old & slot_pin_mask) >= slot_pin_limit) {
    st.fetch_sub(1, cuda::memory_order_relaxed);
    return {0, pin_state::retry};
  }
  if ((old & slot_referenced) == 0) st.fetch_or(slot_referenced, cuda::memory_order_relaxed);
  // Relaxed: the slot index carries a dependency on the pinned word, so the
  // data is read only after the pin is in place (and the page valid).
  const std::uint32_t slot = s + dependency_token(static_cast<unsigned>(old), zero_);
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
  const std::uint64_t base = set_of(key) * ways_;
  for (std::uint32_t w0 = 0; w0 < ways_; w0 += 32) {
    // Lane k reads way w0 + k: the set in one request.
    const std::uint32_t w = w0 + lane;
    const std::uint64_t word =
        w < ways_ ? dev_atomic<std::uint64_t>(slots_[base + w]).load(cuda::memory_order_relaxed) : 0;
    const unsigned found =
        __ballot_sync(full, w < ways_ && (word >> slot_tag_shift) == tag && (word & slot_error) == 0);
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
  dev_atomic<std::uint64_t> st(slots_[slot]);
  const std::uint64_t old = st.fetch_add(1, cuda::memory_order_relaxed);
  if ((old >> slot_tag_shift) != key + 1 || (old & (slot_valid | slot_error)) != slot_valid ||
      (old & slot_pin_mask) >= slot_pin_limit) {
    st.fetch_sub(1, cuda::memory_order_relaxed);
    return {0, pin_state::retry};
  }
  if ((old & slot_referenced) == 0) st.fetch_or(slot_referenced, cuda::memory_order_relaxed);
  // The data is read only after the pin is in place (see `pin`).
  return {slot + dependency_token(static_cast<unsigned>(old), zero_), pin_state::hit};
}

BAM_DEVICE inline bool page_cache_ref::hold(std::uint64_t key, std::uint32_t& slot) const {
  using namespace detail;
  const pin_result p = pin(key, false);
  if (p.state != pin_state::hit) {
    if (p.state == pin_state::loading) release(p.slot); // another lane's load: not waited for
    return false;
  }
  dev_atomic<std::uint32_t> held(sets_[p.slot / ways_].held);
  if (held.fetch_add(1, cuda::memory_order_relaxed) >= hold_limit(ways_)) {
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
  detail::dev_atomic<std::uint32_t>(sets_[slot / ways_].held).fetch_sub(1, cuda::memory_order_relaxed);
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
  detail::dev_atomic<std::uint32_t>(sets_[set_of(r.key)].serving).store(r.turn + 1, cuda::memory_order_release);
}

BAM_DEVICE inline void page_cache_ref::start_load(detail::page_request& r, std::uint32_t slot) const {
  const detail::space_ref& sp = spaces_[r.key >> detail::key_page_bits];
  const std::uint64_t p = r.key & detail::key_page_mask;
  r.slot = slot;
  r.phase = detail::page_phase::loading;
  count(0);
  if (sp.file != nullptr) {
    r.wb_slot = 0;
    load_file_part(r, sp);
    return;
  }
  const std::uint32_t c = sp.controller_of(p);
  r.io.start_rw(sp.ctrls[c], nvme::nvm_opcode::read, sp.lba_of(p), sp.blocks_per_page, sp.data_bus[c],
                static_cast<std::uint64_t>(slot) << page_shift_);
}

//! The next part of a file page's load, from block `r.wb_slot` of the page:
//! blocks in a hole or past the file's end are zeroed here, and the rest of
//! the run that holds the first block still missing is read with one
//! command. When no command is needed, the load is done (`r.io` done, no
//! blocks read).
BAM_DEVICE BAM_NOINLINE inline void page_cache_ref::load_file_part(detail::page_request& r,
                                                                   const detail::space_ref& sp) const {
  const std::uint64_t p = r.key & detail::key_page_mask;
  const std::uint32_t bpp = sp.blocks_per_page;
  const std::uint32_t lba_shift = sp.ctrls[0].lba_shift();
  const std::uint64_t page = static_cast<std::uint64_t>(r.slot) << page_shift_;
  while (r.wb_slot < bpp) {
    const extent_map_ref::where w = sp.file->find(p * bpp + r.wb_slot);
    const std::uint32_t left = bpp - r.wb_slot;
    const std::uint32_t n = w.blocks == 0 || w.blocks > left ? left : static_cast<std::uint32_t>(w.blocks);
    const std::uint64_t offset = page + (static_cast<std::uint64_t>(r.wb_slot) << lba_shift);
    if (w.blocks != 0 && w.lba != extent_hole) {
      r.io.start_rw(sp.ctrls[0], nvme::nvm_opcode::read, w.lba, n, sp.data_bus[0], offset);
      return;
    }
    auto* z = reinterpret_cast<uint4*>(data_ + offset); // blocks are >= 512 bytes: 16-byte aligned
    for (std::uint64_t k = 0; k < (static_cast<std::uint64_t>(n) << lba_shift) / sizeof(uint4); ++k)
      detail::st_cg(z + k, uint4{0, 0, 0, 0});
    r.wb_slot += n;
  }
  r.io.qs = sp.ctrls;
  r.io.nblocks = 0;
  r.io.status = 0;
  r.io.state = detail::io_state::done;
}

//! Under the set's turn: find a victim by the clock. A clean one is claimed
//! for `r.key` (pinned, busy); a dirty one is claimed for write-back.
//! Returns true if the request moved on.
BAM_DEVICE inline bool page_cache_ref::claim_victim(detail::page_request& r) const {
  using namespace detail;
  const std::uint64_t tag = r.key + 1;
  const std::uint64_t set = set_of(r.key);
  const std::uint64_t base = set * ways_;
  // Another lane may have loaded the page while this one waited for the turn.
  for (std::uint32_t w = 0; w < ways_; ++w) {
    const std::uint64_t word = dev_atomic<std::uint64_t>(slots_[base + w]).load(cuda::memory_order_relaxed);
    if ((word >> slot_tag_shift) == tag && (word & slot_error) == 0) {
      pass_turn(r);
      r.phase = page_phase::lookup;
      return true;
    }
  }
  // Only the holder of the set's turn moves the hand: one load, one store.
  dev_atomic<std::uint32_t> hand_ref(sets_[set].hand);
  std::uint32_t hand = hand_ref.load(cuda::memory_order_relaxed);
  struct store_hand {
    dev_atomic<std::uint32_t>& ref;
    std::uint32_t& value;
    BAM_DEVICE ~store_hand() { ref.store(value, cuda::memory_order_relaxed); }
  } keep_hand{hand_ref, hand};
  std::int64_t dirty = -1;
  bool waitable = false; // something will free up: pinned or busy slots
  bool lost = false;     // a slot a timed-out load may still land in: never reused
  for (std::uint32_t i = 0; i < 2 * ways_; ++i) {
    const std::uint64_t s = base + hand++ % ways_;
    dev_atomic<std::uint64_t> st(slots_[s]);
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
      // A page of a medium without queues on this GPU: its own GPU writes it back.
      if (spaces_[((word >> slot_tag_shift) - 1) >> key_page_bits].ctrls == nullptr)
        waitable = true;
      else if (dirty < 0)
        dirty = static_cast<std::int64_t>(s);
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
    dev_atomic<std::uint64_t> st(slots_[dirty]);
    std::uint64_t word = st.load(cuda::memory_order_relaxed);
    // Still no victim if a flush failed on it since (it waits for a flush).
    if ((word & (slot_pin_mask | slot_busy | slot_wb_failed)) == 0 && (word & slot_dirty) &&
        st.compare_exchange_strong(word, (word & ~slot_dirty) | slot_busy, cuda::memory_order_acq_rel)) {
      pass_turn(r);
      const std::uint64_t old_key = (word >> slot_tag_shift) - 1;
      r.wb_slot = static_cast<std::uint32_t>(dirty);
      r.phase = page_phase::writing_back;
      start_writeback(r.io, spaces_[old_key >> key_page_bits], old_key & key_page_mask,
                      static_cast<std::uint64_t>(dirty) << page_shift_);
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
    dev_atomic<std::uint64_t> word(slots_[r.slot]);
    if (st.ok() && spaces_[r.key >> key_page_bits].file != nullptr) {
      // A file page in parts: read the next one, if any.
      const space_ref& sp = spaces_[r.key >> key_page_bits];
      r.wb_slot += r.io.nblocks;
      if (r.wb_slot < sp.blocks_per_page) {
        load_file_part(r, sp);
        return;
      }
    }
    if (st.ok()) {
      // The page may be at home on another GPU, and its readers on a third.
      if (spread_) cuda::atomic_thread_fence(cuda::memory_order_release, cuda::thread_scope_system);
      word.fetch_add(slot_valid - slot_busy + (r.for_write ? slot_dirty : 0), cuda::memory_order_release);
      r.phase = page_phase::hit;
      return;
    }
    slot_status_[r.slot] = st.raw;
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
  dev_atomic<std::uint64_t> word(slots_[r.wb_slot]);
  if (st.ok()) {
    count(1);
    word.fetch_and(~slot_busy, cuda::memory_order_release);
  } else {
    const std::uint64_t w = word.load(cuda::memory_order_relaxed);
    const std::uint64_t old_key = (w >> slot_tag_shift) - 1;
    const space_ref& sp = spaces_[old_key >> key_page_bits];
    const std::uint64_t p = old_key & key_page_mask;
    if (sp.err != nullptr) sp.err->record(st, failure_site::page(sp.lba_of(p), sp.controller_of(p)));
    // The data is still only here: dirty again, and not a victim until a
    // flush succeeds. A write that timed out may still read the slot: it
    // stays busy, out of use for good (`slot_lost`).
    mark_writeback_failed(&slots_[r.wb_slot], st == nvme::status_timeout);
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
    r.turn = dev_atomic<std::uint32_t>(sets_[set_of(r.key)].next).fetch_add(1, cuda::memory_order_relaxed);
    r.phase = page_phase::wait_turn;
    [[fallthrough]];
  case page_phase::wait_turn:
    if (dev_atomic<std::uint32_t>(sets_[set_of(r.key)].serving).load(nvme::detail::poll_order()) != r.turn)
      return false;
    nvme::detail::acquire_fence();
    r.phase = page_phase::have_turn;
    if (dev_atomic<std::uint32_t> doomed(sets_[set_of(r.key)].doomed); doomed.load(cuda::memory_order_relaxed) != 0) {
      // Doomed while the set is as the turn holder that gave up left it;
      // once it moved, the queue behind waits as usual again.
      const std::uint32_t then =
          dev_atomic<std::uint32_t>(sets_[set_of(r.key)].doom_marker).load(cuda::memory_order_relaxed);
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
    const std::uint64_t word = dev_atomic<std::uint64_t>(slots_[r.slot]).load(nvme::detail::poll_order());
    if ((word & (slot_valid | slot_error)) == 0) return false;
    nvme::detail::acquire_fence(); // the page's data (or status) after its state
    if (word & slot_valid) {
      if (r.for_write && (word & slot_dirty) == 0)
        dev_atomic<std::uint64_t>(slots_[r.slot]).fetch_or(slot_dirty, cuda::memory_order_relaxed);
      r.phase = page_phase::hit;
      return true;
    }
    if (word & slot_error) {
      r.status = slot_status_[r.slot];
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
  for (std::uint32_t w = 0; w < ways_; ++w) {
    const std::uint64_t word = dev_atomic<std::uint64_t>(slots_[set * ways_ + w]).load(cuda::memory_order_relaxed);
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
    m.value = m.value * 31 + dev_atomic<std::uint32_t>(sets_[set].serving).load(cuda::memory_order_relaxed);
    return m;
  }
  case page_phase::pinned_wait: {
    const std::uint64_t word = dev_atomic<std::uint64_t>(slots_[r.slot]).load(cuda::memory_order_relaxed);
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
    cache_set& cs = sets_[set_of(r.key)];
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
      const std::uint64_t limit = !m.on_io                                 ? timeout_ns_
                                  : timeout_ns_ > ~0ull / io_wait_backstop ? ~0ull
                                                                           : timeout_ns_ * io_wait_backstop;
      // A lane's own command is given up only if the threads serving its
      // controller (if any) ran for the whole wait.
      const bool own_io = r.phase == page_phase::loading || r.phase == page_phase::writing_back;
      if (r.wait.expired(m.value, limit) && (!own_io || io_controller_ran_for(r.io, timeout_ns_))) abandon(r);
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
