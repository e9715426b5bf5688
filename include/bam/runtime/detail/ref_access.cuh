// SPDX-License-Identifier: MIT
//! `bam::detail::ref_access`: the library's way into the private parts of
//! its device handles, for its own code around them (row gathers and
//! scatters, look-ahead holds, the kernels of the cache's host operations)
//! and for tests that look inside the cache. Not for user code: what users
//! need, the handles offer themselves.
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/runtime/detail/cache_slots.cuh>

#include <cstdint>
#include <utility>

namespace bam {

template <class T>
class array_ref;

namespace detail {

struct ref_access {
  // page_cache_ref

  //! The pages' memory (slot s at `s * page_size()`).
  BAM_HD static std::uint8_t* data(const page_cache_ref& c) { return c.data_; }
  BAM_HD static std::uint64_t* slots(const page_cache_ref& c) { return c.slots_; }
  BAM_HD static cache_set* sets(const page_cache_ref& c) { return c.sets_; }
  BAM_HD static std::uint64_t set_count(const page_cache_ref& c) { return c.nsets_; }
  BAM_HD static const space_ref* spaces(const page_cache_ref& c) { return c.spaces_; }
  BAM_HD static std::uint32_t page_shift(const page_cache_ref& c) { return c.page_shift_; }
  BAM_HD static std::uint64_t timeout_ns(const page_cache_ref& c) { return c.timeout_ns_; }
  //! 0, unknown to the compiler (see `dependency_token`).
  BAM_HD static unsigned zero(const page_cache_ref& c) { return c.zero_; }
  BAM_DEVICE static bool try_pin(const page_cache_ref& c, page_request& r) { return c.try_pin(r); }
  BAM_DEVICE static void resolve(const page_cache_ref& c, page_request& r, unsigned mask, bool until_any) {
    c.resolve(r, mask, until_any);
  }
  //! Count a miss (`which` 0) or a write-back (1).
  BAM_DEVICE static void count(const page_cache_ref& c, unsigned which) { c.count(which); }

  // array_ref<T>

  template <class T>
  BAM_HD static const page_cache_ref& cache(const array_ref<T>& a) {
    return a.cache_;
  }
  //! log2 of the elements per page.
  template <class T>
  BAM_HD static std::uint32_t elem_shift(const array_ref<T>& a) {
    return a.elem_shift_;
  }
  //! The key of element `i`'s page.
  template <class T>
  BAM_HD static std::uint64_t key_of(const array_ref<T>& a, std::uint64_t i) {
    return page_key(a.space_, a.first_page_ + (i >> a.elem_shift_));
  }
  //! The key of the array's page `page`.
  template <class T>
  BAM_HD static std::uint64_t key_of_page(const array_ref<T>& a, std::uint64_t page) {
    return page_key(a.space_, a.first_page_ + page);
  }
  //! Element `i` in the slot that holds its page.
  template <class T>
  BAM_DEVICE static T* element(const array_ref<T>& a, std::uint32_t slot, std::uint64_t i) {
    return a.element(slot, i);
  }
  //! The array's error record (nullptr: failures go unrecorded).
  template <class T>
  BAM_HD static device_error_record* error_record(const array_ref<T>& a) {
    return a.err_;
  }
  //! Record a failure of element `i` (with its page's controller and LBA).
  template <class T>
  BAM_DEVICE static void fail(const array_ref<T>& a, nvme::status st, std::uint64_t i) {
    a.fail(st, i);
  }
  //! The page walker of `copy_to` (see `array_ref::walk_pages`).
  template <bool ForWrite, class T, class OnPage, class OnFailed>
  BAM_DEVICE static bool walk_pages(const array_ref<T>& a, std::uint64_t begin, std::uint64_t count, OnPage&& on_page,
                                    OnFailed&& on_failed) {
    return a.template walk_pages<ForWrite>(begin, count, pin_result{0, pin_state::miss}, false,
                                           std::forward<OnPage>(on_page), std::forward<OnFailed>(on_failed));
  }
};

} // namespace detail

} // namespace bam
