// SPDX-License-Identifier: MIT
//! `bam::page_cache_ref`: the trivially copyable device handle of a
//! `bam::page_cache` (<bam/runtime/page_cache.cuh>), and the page-level
//! interface that the array handles (<bam/runtime/array_ref.cuh>) are built
//! on: pin a page of the cache, read or write its data, let it go.
//!
//! Most kernels never touch it: `bam::array_ref<T>` carries one and its
//! accesses pin and release pages themselves. A page is named by its key,
//! which the array handles make; a pin keeps the page in its slot (never
//! evicted, never reloaded) until it is released.
//!
//! Calls are made by single lanes unless a call's comment says
//! *whole-warp* (defined in <bam/runtime/array_ref.cuh>).
//!
//! @code
//!   const bam::pin_result p = cache.pin(key, false);
//!   if (p.state == bam::pin_state::hit) {
//!     use(cache.page_data(p.slot));
//!     cache.release(p.slot);
//!   } else if (p.state == bam::pin_state::loading) {
//!     cache.release(p.slot); // another lane is loading it: not waited for here
//!   }
//! @endcode
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/detail/memory_ops.cuh>
#include <bam/nvme/queue.hpp>
#include <bam/runtime/detail/cache_slots.cuh>

#include <cstdint>
#include <type_traits>

namespace bam {

template <class T>
class array_ref;
template <class T>
class array_reader;
template <class T>
class array_page;

//! What a pin found.
enum class pin_state : std::uint32_t {
  miss,    //!< not in the cache: nothing held
  hit,     //!< pinned, valid: the data may be used
  loading, //!< pinned, another lane is loading it: its data is not there yet
  retry,   //!< it changed while being pinned: nothing held, look again
};

//! The outcome of a pin: the slot (with `hit` and `loading`, where the pin
//! is held), and what was found.
struct pin_result {
  std::uint32_t slot; //!< the page's slot (meaningful with `hit` and `loading`)
  pin_state state;    //!< what the pin found
};

//! Trivially copyable device handle to a `bam::page_cache`; pass it to
//! kernels by value. `bam::page_cache::ref()` makes it; a default-made one
//! refers to no cache. It stays valid while the cache lives.
class page_cache_ref {
public:
  //! A handle that refers to no cache.
  page_cache_ref() = default;

  //! @return the size of a page in bytes (a power of two)
  BAM_HD std::uint64_t page_size() const;
  //! @return the number of slots: pages the cache holds at once
  BAM_HD std::uint64_t slot_count() const;
  //! @return the slots per set (a page may live in any of its set's ways)
  BAM_HD std::uint32_t ways() const;

  //! @param slot a slot the caller holds a pin on
  //! @return the first byte of the page in `slot` (GPU memory)
  BAM_DEVICE std::uint8_t* page_data(std::uint32_t slot) const;

  //! The hit path: pin the page of `key` if it is in the cache (one round
  //! trip to read its set, one atomic add). Loads nothing, waits for nothing.
  //! @param key the page's key
  //! @param for_write mark the page dirty (written back before eviction)
  //! @return `hit` or `loading` with the pinned slot (release it), or
  //! `miss` / `retry` with nothing held
  BAM_DEVICE pin_result pin(std::uint64_t key, bool for_write) const;
  //! `pin`; when the page is found, its bytes [prefetch_from, prefetch_from
  //! + prefetch_bytes) are asked into L2 (a hint, no load) while the pin's
  //! atomic is in flight, so that the reads after the pin find them there.
  //! @param key the page's key
  //! @param for_write mark the page dirty
  //! @param prefetch_from first byte of the page to ask for (a multiple of 16)
  //! @param prefetch_bytes bytes to ask for (a multiple of 16; 0: none)
  //! @return as `pin(key, for_write)`
  BAM_DEVICE pin_result pin(std::uint64_t key, bool for_write, std::uint32_t prefetch_from,
                            std::uint32_t prefetch_bytes) const;
  //! `pin` for reading by the whole warp: each lane reads a way of the set,
  //! one lane pins what they found. Every lane gets the result; the pin is
  //! one, and one lane releases it.
  //! @note Whole-warp.
  //! @param key the page's key
  //! @param prefetch_from first byte of the page to ask into L2
  //! @param prefetch_bytes bytes to ask for (0: none)
  //! @return as `pin`, the same in every lane
  BAM_DEVICE pin_result pin_warp(std::uint64_t key, std::uint32_t prefetch_from, std::uint32_t prefetch_bytes) const;
  //! Pin `slot` for reading if it still holds the valid page of `key`: one
  //! atomic, no lookup (`slot` comes from an earlier pin of that page).
  //! @return `hit` with the pinned slot, or `retry` with nothing held
  BAM_DEVICE pin_result pin_slot(std::uint32_t slot, std::uint64_t key) const;

  //! Drop a pin after writing the page's data (release order: the data
  //! first). Also right after reading it, at the cost of a fence.
  //! @param slot the slot a pin returned
  BAM_DEVICE void release(std::uint32_t slot) const;
  //! Drop a pin after reading the page's data, with no fence: `token` (0)
  //! is computed from the values read (`detail::dependency_token`), so the
  //! unpin is issued only after they arrived.
  //! @param slot the slot a pin returned
  //! @param token 0, computed from every value read through the pin
  BAM_DEVICE void release_read(std::uint32_t slot, unsigned token) const;

  //! Look-ahead hold: pin the page of `key` for reading if it is in the
  //! cache and valid now, loading nothing and waiting for nothing, as long
  //! as its set holds fewer than `detail::hold_limit(ways())` holds. A held
  //! page is never a victim until `release_hold`: unlike other pins, holds
  //! last across kernels, and the limit per set keeps the cache's forward
  //! progress (a miss always finds ways that no hold keeps).
  //! @param key the page's key
  //! @param[out] slot the held slot, when it returns true
  //! @return whether the page is held now
  BAM_DEVICE bool hold(std::uint64_t key, std::uint32_t& slot) const;
  //! Drop a hold taken by `hold` (not a pin of `pin`: use `release`).
  //! @param slot the slot `hold` returned
  BAM_DEVICE void release_hold(std::uint32_t slot) const;

private:
  template <class T>
  friend class array_ref;
  template <class T>
  friend class array_reader;
  template <class T>
  friend class array_page;
  friend class detail::cache_state;
  friend struct detail::ref_access;

  //! Made by `detail::cache_state::ref()`.
  page_cache_ref(std::uint8_t* data, std::uint64_t* slots, std::uint16_t* slot_status, detail::cache_set* sets,
                 const detail::space_ref* spaces, unsigned long long* counters, std::uint64_t nslots,
                 std::uint64_t nsets, std::uint32_t ways, std::uint32_t page_shift, std::uint64_t timeout_ns,
                 bool spread);

  //! The set of a page: a multiply instead of a 64-bit modulo (nsets < 2^32).
  BAM_DEVICE std::uint64_t set_of(std::uint64_t key) const;
  //! `pin` for a request: sets `r.phase` to hit, pinned_wait (another lane
  //! loads it) or lookup (retry; or a miss: returns false).
  BAM_DEVICE bool try_pin(detail::page_request& r) const;
  //! Drive the requests of the lanes of `mask` (converged) until every one
  //! is settled, or, with `until_any`, until at least one lane is settled.
  BAM_DEVICE void resolve(detail::page_request& r, unsigned mask, bool until_any) const;
  //! Count a miss (`which` 0) or a write-back (1), in this SM's stripe.
  BAM_DEVICE void count(unsigned which) const;

  BAM_DEVICE pin_result take_pin(std::uint32_t s, std::uint64_t tag, bool for_write, std::uint32_t prefetch_from,
                                 std::uint32_t prefetch_bytes) const;
  BAM_DEVICE bool step(detail::page_request& r) const;
  BAM_DEVICE void finish_io(detail::page_request& r) const;
  BAM_DEVICE void start_load(detail::page_request& r, std::uint32_t slot) const;
  BAM_DEVICE void load_file_part(detail::page_request& r, const detail::space_ref& sp) const;
  BAM_DEVICE bool claim_victim(detail::page_request& r) const;
  BAM_DEVICE void pass_turn(const detail::page_request& r) const;
  BAM_DEVICE detail::wait_marker set_marker(std::uint64_t set) const;
  BAM_DEVICE detail::wait_marker marker(const detail::page_request& r) const;
  BAM_DEVICE void abandon(detail::page_request& r) const;

  std::uint8_t* data_ = nullptr;
  std::uint64_t* slots_ = nullptr;       //!< state word per slot
  std::uint16_t* slot_status_ = nullptr; //!< status of a failed load, per slot
  detail::cache_set* sets_ = nullptr;
  const detail::space_ref* spaces_ = nullptr; //!< by space id
  unsigned long long* counters_ = nullptr;    //!< per stripe: misses, write-backs
  std::uint64_t nslots_ = 0;
  std::uint64_t nsets_ = 0;
  std::uint32_t ways_ = 0;
  std::uint32_t page_shift_ = 0;
  std::uint64_t timeout_ns_ = nvme::default_queue_timeout_ns;
  //! Always 0; the compiler cannot know it (see `detail::dependency_token`).
  std::uint32_t zero_ = 0;
  //! The pages are spread over several GPUs: data written here is made
  //! visible to the other GPUs (a system-scope fence) before the state word
  //! that publishes it.
  bool spread_ = false;
};
static_assert(std::is_trivially_copyable_v<page_cache_ref>, "page_cache_ref is passed to kernels by value");

} // namespace bam

#include <bam/runtime/detail/page_cache_ref.inl>
#include <bam/runtime/detail/ref_access.cuh>
