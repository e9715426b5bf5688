// SPDX-License-Identifier: MIT
//! The device handles of a `bam::array<T>` (<bam/runtime/array.cuh>):
//! `bam::array_ref<T>` (element access, range copies, prefetch), the reader
//! it makes (`bam::array_reader<T>`: remembers each lane's last page), page
//! handles (`bam::array_page<T>`: keep a page pinned) and their spans
//! (`bam::page_span<T>`: unchecked reads of a pinned page).
//!
//! Calling conventions. The comment of each call says which one it follows:
//!  - *Warp-collective*: the lanes of a warp that reach the call make it
//!    together (the active mask; other lanes may be inactive), each with
//!    arguments of its own. Lanes on the same page form a group whose leader
//!    holds the page's pin: the common case, the whole warp on one page that
//!    is in the cache, costs one vote, one lookup and one pin/unpin pair.
//!  - *Whole-warp*: every lane of the warp calls it, converged (all 32
//!    active), with the same arguments.
//!
//! Misses and waits go through `page_cache_ref`'s miss path; a group whose
//! page is ready is served and lets its pin go before the warp waits for the
//! others, so a warp never waits while it holds a page. A bad index or a
//! failed read never corrupts anything: the first failure (index, LBA,
//! controller, NVMe status) is recorded, the access yields `T{}`, and
//! `bam::array::check` turns the record into a `bam::error` on the host.
//!
//! @code
//!   __global__ void sum_pages(bam::array_ref<float> a, float* out) {
//!     const std::uint64_t warp = (blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x) / 32;
//!     const unsigned lane = threadIdx.x % 32;
//!     const std::uint64_t first = warp * a.elements_per_page();
//!     if (first >= a.size()) return;                 // the whole warp leaves together
//!     float s = 0;
//!     auto pg = a.page(first);                        // warp-collective: the warp's page, pinned
//!     if (const auto sp = pg.span(); sp.size() != 0)
//!       for (std::uint64_t k = lane; k < sp.size(); k += 32) s += sp[k];
//!     atomicAdd(out, s);
//!   }
//! @endcode
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/nvme/spec.hpp>
#include <bam/runtime/detail/page_memory.cuh>
#include <bam/runtime/error_record.cuh>
#include <bam/runtime/page_cache_ref.cuh>

#include <cstdint>
#include <type_traits>

namespace bam {

template <class T>
class array;
template <class T>
class array_reader;
template <class T>
class array_page;

//! A lane's pinned page, from `array_page::span()`: element k of the page
//! (k < `size()`) is `s[k]`, one load that skips L1 and no check, so a loop
//! over it keeps many loads in flight. Valid while its `array_page` lives.
//! A default-made span is empty.
template <class T>
class page_span {
public:
  //! An empty span (`size()` 0).
  page_span() = default;

  //! Element `first() + k` of the page, unchecked.
  //! @param k below `size()`
  BAM_DEVICE T operator[](std::uint64_t k) const;
  //! @return the array index of the page's element 0
  BAM_HD std::uint64_t first() const;
  //! @return the elements on the page (0: nothing is pinned)
  BAM_HD std::uint64_t size() const;

private:
  friend class array_page<T>;
  BAM_DEVICE page_span(const T* data, std::uint64_t first, std::uint64_t size);

  const T* data_ = nullptr;
  std::uint64_t first_ = 0;
  std::uint64_t size_ = 0;
};

//! Trivially copyable handle to a `bam::array<T>`; pass it to kernels by
//! value. `bam::array<T>::ref()` makes it; a default-made one holds no
//! elements. It stays valid while its array lives.
template <class T>
class array_ref {
public:
  static_assert(std::is_trivially_copyable_v<T>, "array elements must be trivially copyable");
  static_assert((sizeof(T) & (sizeof(T) - 1)) == 0, "array element sizes must be powers of two");

  //! A handle that holds no elements.
  array_ref() = default;

  //! @return the number of elements
  BAM_HD std::uint64_t size() const;
  //! @return the elements per cache page (a power of two): element `i` is
  //! on the array's page `i / elements_per_page()`
  BAM_HD std::uint64_t elements_per_page() const;

  //! Element `i`, read through the cache (a value: the array is written
  //! with `write`; `a[i] = v` does not compile).
  //! @note Warp-collective.
  //! @param i element index; past the end: recorded as Out of Range
  //! @return the element, or `T{}` when it could not be read (recorded)
  BAM_DEVICE const T operator[](std::uint64_t i) const;
  //! The same as `operator[]`.
  //! @note Warp-collective.
  BAM_DEVICE T read(std::uint64_t i) const;
  //! Write `v` into element `i` through the cache (its page is marked dirty:
  //! on the storage after a write-back).
  //! @note Warp-collective.
  //! @param i element index; past the end: recorded as Out of Range, nothing written
  //! @param v the value
  BAM_DEVICE void write(std::uint64_t i, const T& v) const;

  //! Copy elements [begin, begin + count) into `out[0..count)`, up to 32
  //! pages in flight at once.
  //! @note Whole-warp.
  //! @param begin first element
  //! @param count elements (a range past the end is recorded as Out of
  //! Range and `out` is set to `T{}`)
  //! @param out GPU-accessible memory for `count` elements
  //! @return false (the failure recorded) if a page could not be read; the
  //! elements of such a page are set to `T{}`
  BAM_DEVICE bool copy_to(std::uint64_t begin, std::uint64_t count, T* out) const;

  //! Bring the page of element `i` into the cache, for each lane that passes
  //! `want`. The warp's misses are read at once, and nothing is held
  //! afterwards: a later access finds the page unless it was evicted in
  //! between. Records nothing: the access that meets a failure reports it.
  //! @note Warp-collective.
  //! @param i element index
  //! @param want whether this lane wants its page
  //! @param[out] slot if given, the slot the page arrived in (a hint for
  //! `page_cache_ref::pin_slot`)
  //! @return whether the page arrived
  BAM_DEVICE bool prefetch(std::uint64_t i, bool want = true, std::uint32_t* slot = nullptr) const;

  //! A reader that remembers the cache slot of each lane's last page (see
  //! `array_reader`). It refers to this handle, which must outlive it.
  BAM_DEVICE array_reader<T> reader() const;

  //! The page of element `i` of each lane, pinned while the returned object
  //! lives: its elements are read with plain loads (see `array_page`). It
  //! refers to this handle, which must outlive it.
  //! @note Warp-collective (at its making and at its end of scope).
  BAM_DEVICE array_page<T> page(std::uint64_t i) const;

  //! Record a failure in the array's error record, as the library's own
  //! accesses do: the next `bam::array::check` throws it as a `bam::error`
  //! (the first failure recorded wins; every one is counted).
  //! @param st the NVMe or bam status to report
  //! @param where what failed: an element index, a page's LBA, or both
  BAM_DEVICE void record_failure(nvme::status st, const failure_site& where) const;

private:
  friend class array<T>;
  friend class array_reader<T>;
  friend class array_page<T>;
  friend struct detail::ref_access;

  //! Made by `bam::array<T>`.
  array_ref(const page_cache_ref& cache, std::uint64_t n, std::uint64_t first_page, std::uint32_t space,
            std::uint32_t elem_shift, device_error_record* err);

  //! The key of element `i`'s page.
  BAM_DEVICE std::uint64_t key_of(std::uint64_t i) const;
  //! Element `i` in the slot that holds its page.
  BAM_DEVICE T* element(std::uint32_t slot, std::uint64_t i) const;
  //! Record a failure of element `i` (with its page's controller and LBA).
  BAM_DEVICE void fail(nvme::status st, std::uint64_t i) const;

  //! What an element access does: reads return the element; writes store `*value`.
  enum class element_op { read, write };
  //! Element `i` read, or `*value` written to it (`Op` says which: `value` is null for a read).
  template <element_op Op>
  BAM_DEVICE T access(std::uint64_t i, const T* value) const;
  //! The miss and wait path of an access; `*slot_of_page` (if given) is set
  //! to the slot the page was read from (a hint: the page is let go).
  BAM_DEVICE T access_slow(std::uint64_t i, const T* value, unsigned mask, unsigned peers, unsigned leader,
                           pin_result p, std::uint32_t* slot_of_page = nullptr) const;
  //! `copy_to` past its fast path: `pinned` is this lane's pin of page
  //! `first + lane` when `have_pins`.
  BAM_DEVICE bool copy_slow(std::uint64_t begin, std::uint64_t count, T* out, pin_result pinned, bool have_pins) const;
  //! The page walker of range copies and row scatters (whole-warp): each
  //! lane asks for one page of elements [begin, begin + count) (in range,
  //! count > 0), up to 32 in flight, pinned for writing when `ForWrite`. As
  //! each page arrives, the whole warp calls `on_page(slot, lo, hi)` for its
  //! elements [lo, hi), which returns a dependency token (0) of the values
  //! it read, and the page is let go after every lane's reads (or,
  //! `ForWrite`, stores); a page that could not be had is recorded and the
  //! warp calls `on_failed(lo, hi)`. `pinned` is this lane's pin of page
  //! `first + lane` when `have_pins`.
  //! @return false if a page could not be had
  template <bool ForWrite, class OnPage, class OnFailed>
  BAM_DEVICE bool walk_pages(std::uint64_t begin, std::uint64_t count, pin_result pinned, bool have_pins,
                             OnPage&& on_page, OnFailed&& on_failed) const;

  page_cache_ref cache_{};
  std::uint64_t n_ = 0;
  std::uint64_t first_page_ = 0; //!< the array's page 0 within its key space
  std::uint32_t space_ = 0;
  std::uint32_t elem_shift_ = 0; //!< log2(elements per page)
  device_error_record* err_ = nullptr;
};

//! Remembers the cache slot of each lane's last page, so that an access to
//! the same page skips the lookup: one atomic pin of the known slot, one
//! load, one release. It holds nothing between accesses: lanes of a warp may
//! diverge, leave a loop early or stop using it at any point (a pin kept
//! across accesses would stay with lanes parked at a divergent loop's exit
//! while the rest of their warp waits for a slot). It refers to the
//! `array_ref` it was made from, which must outlive it.
template <class T>
class array_reader {
public:
  //! A reader of `a` that remembers no page yet (also `a.reader()`).
  BAM_DEVICE explicit array_reader(const array_ref<T>& a);
  array_reader(const array_reader&) = delete;
  array_reader& operator=(const array_reader&) = delete;

  //! Element `i`, as `array_ref::operator[]` reads it.
  //! @note Warp-collective.
  //! @return the element, or `T{}` when it could not be read (recorded)
  BAM_DEVICE const T operator[](std::uint64_t i);
  //! Forget the remembered slots: the next access looks its page up.
  //! Nothing is held between accesses, so a reader never needs it.
  BAM_DEVICE void forget();

private:
  const array_ref<T>* a_;     //!< the handle it was made from (not a copy: kernels make readers often)
  std::uint64_t key_ = ~0ull; //!< this lane's last page ...
  std::uint32_t slot_ = 0;    //!< ... and the slot it was read from
};

//! The page that holds element `i` of each lane, pinned in the cache for as
//! long as the object lives (BaM's `bam_ptr` keeps a page the same way).
//! Reading an element of that page is one plain load: no atomic, no lookup.
//! Lanes on the same page share one pin.
//!
//! Warp-collective at both ends: the lanes that make it (the active mask)
//! must all reach its end of scope, where the pins are let go once every
//! lane's reads have arrived. In between, lanes may diverge freely: nothing
//! in `operator[]` waits while a page is held, except a read outside the
//! lane's page (see below).
//!
//! If a page is not in the cache, making the object brings it in (a miss
//! waits as `a[i]` does, holding nothing) and pins it then. If the warp's
//! pages cannot all be pinned at once (another warp evicted one meanwhile,
//! a failed read, a bad index), none is held and every read goes through
//! `a[i]` (slower, and failures are recorded the same way).
//!
//! `operator[](j)` for a `j` outside the lane's page is served as `a[j]`,
//! which may wait for the cache while this page stays pinned (so may
//! another access to the cache inside the handle's scope). If that page
//! needs the pinned page's slot (a set whose every way is pinned), the wait
//! ends at the cache's deadline with a recorded timeout: keep a handle to
//! the elements of its own page, and do not make a second one in a warp
//! that holds one. It refers to the `array_ref` it was made from,
//! which must outlive it.
//!
//! @code
//!   auto pg = a.page(first);                      // the whole warp, one page
//!   for (std::uint32_t k = lane; k < per_page; k += 32) sum += pg[first + k];
//!   // or, many loads in flight at once:
//!   if (const auto s = pg.span(); s.size() != 0)
//!     for (std::uint32_t k = lane; k < s.size(); k += 32) sum += s[k];
//! @endcode
template <class T>
class array_page {
public:
  //! Pin the page of element `i` of each lane (also `a.page(i)`).
  //! @note Warp-collective.
  BAM_DEVICE array_page(const array_ref<T>& a, std::uint64_t i);
  array_page(const array_page&) = delete;
  array_page& operator=(const array_page&) = delete;
  //! Let the pins go, once every lane's reads arrived.
  //! @note Warp-collective: every lane that made it reaches its end of scope.
  BAM_DEVICE ~array_page();

  //! Element `j`: a plain load if it is on this lane's pinned page, else `a[j]`.
  //! @return the element, or `T{}` when it could not be read (recorded)
  BAM_DEVICE const T operator[](std::uint64_t j);
  //! @return whether this lane's page is pinned (else every read goes through `a[j]`)
  BAM_DEVICE bool pinned() const;
  //! This lane's page as a span of unchecked reads (`span()[k]` is element
  //! `span().first() + k`), for loops that read many of its elements: no
  //! branch between the loads lets them all be in flight at once. Empty
  //! (size 0) when the page is not pinned: then read through `operator[]`.
  //! Ends with the handle; its pin is then let go after a warp barrier.
  BAM_DEVICE page_span<T> span();

private:
  const array_ref<T>* a_;   //!< the handle it was made from (must outlive it)
  const T* data_ = nullptr; //!< element `first_` in the cache
  std::uint64_t first_ = 0; //!< the pinned page's first element ...
  std::uint64_t count_ = 0; //!< ... and how many it holds (0: none pinned)
  std::uint32_t pin_ = 0;   //!< the pinned slot as the pin returned it (carries its dependency)
  unsigned mask_ = 0;       //!< the lanes that made it
  unsigned read_ = 0;       //!< the first words of the values read (their arrival orders the unpin)
  bool holds_pin_ = false;  //!< this lane lets go of the pin at the end
  bool spanned_ = false;    //!< a span was handed out: its reads are untracked
};

} // namespace bam

#include <bam/runtime/detail/array_ref.inl>
