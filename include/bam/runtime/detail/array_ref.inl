// SPDX-License-Identifier: MIT
//! Code of the array handles (<bam/runtime/array_ref.cuh>): element access,
//! range copies and the page walker they share with row scatters, readers,
//! page handles.
#pragma once

namespace bam {

template <class T>
BAM_DEVICE inline page_span<T>::page_span(const T* data, std::uint64_t first, std::uint64_t size)
    : data_(data), first_(first), size_(size) {}

template <class T>
BAM_DEVICE T page_span<T>::operator[](std::uint64_t k) const {
  return detail::load_page(data_ + k);
}

template <class T>
BAM_HD std::uint64_t page_span<T>::first() const {
  return first_;
}

template <class T>
BAM_HD std::uint64_t page_span<T>::size() const {
  return size_;
}

template <class T>
array_ref<T>::array_ref(const page_cache_ref& cache, std::uint64_t n, std::uint64_t first_page, std::uint32_t space,
                        std::uint32_t elem_shift, device_error_record* err)
    : cache_(cache), n_(n), first_page_(first_page), space_(space), elem_shift_(elem_shift), err_(err) {}

template <class T>
BAM_HD std::uint64_t array_ref<T>::size() const {
  return n_;
}

template <class T>
BAM_HD std::uint64_t array_ref<T>::elements_per_page() const {
  return std::uint64_t{1} << elem_shift_;
}

template <class T>
BAM_DEVICE const T array_ref<T>::operator[](std::uint64_t i) const {
  return access<element_op::read>(i, nullptr);
}

template <class T>
BAM_DEVICE T array_ref<T>::read(std::uint64_t i) const {
  return access<element_op::read>(i, nullptr);
}

template <class T>
BAM_DEVICE void array_ref<T>::write(std::uint64_t i, const T& v) const {
  access<element_op::write>(i, &v);
}

template <class T>
BAM_DEVICE array_reader<T> array_ref<T>::reader() const {
  return array_reader<T>(*this);
}

template <class T>
BAM_DEVICE array_page<T> array_ref<T>::page(std::uint64_t i) const {
  return array_page<T>(*this, i);
}

template <class T>
BAM_DEVICE std::uint64_t array_ref<T>::key_of(std::uint64_t i) const {
  return detail::page_key(space_, first_page_ + (i >> elem_shift_));
}

template <class T>
BAM_DEVICE T* array_ref<T>::element(std::uint32_t slot, std::uint64_t i) const {
  return reinterpret_cast<T*>(cache_.page_data(slot)) + (i & ((1ull << elem_shift_) - 1));
}

template <class T>
BAM_DEVICE void array_ref<T>::record_failure(nvme::status st, const failure_site& where) const {
  if (err_ != nullptr) err_->record(st, where);
}

template <class T>
BAM_DEVICE void array_ref<T>::fail(nvme::status st, std::uint64_t i) const {
  if (err_ == nullptr) return;
  if (i < n_) {
    const detail::space_ref& sp = cache_.spaces_[space_];
    const std::uint64_t p = first_page_ + (i >> elem_shift_);
    err_->record(st, failure_site::element_on_page(i, sp.lba_of(p), sp.controller_of(p)));
  } else {
    err_->record(st, failure_site::element(i));
  }
}

template <class T>
template <typename array_ref<T>::element_op Op>
BAM_DEVICE T array_ref<T>::access(std::uint64_t i, const T* value) const {
  constexpr bool writing = Op == element_op::write;
  using namespace detail;
  const unsigned mask = __activemask();
  const unsigned lane = lane_id();
  const bool in_range = i < n_;
  const std::uint64_t key = in_range ? key_of(i) : ~0ull; // one group for bad indices
  const unsigned peers = same_value_lanes(mask, key);
  const unsigned leader = __ffs(peers) - 1;
  pin_result p{0, pin_state::miss};
  if (!writing && in_range && mask == 0xffffffffu && peers == mask) {
    // The whole warp on one page (consecutive elements): every lane reads a
    // way of the set, and on a hit the read needs no call.
    p = cache_.pin_warp(key, 0, 0);
    if (p.state == pin_state::hit) {
      const T v = load_uncached(element(p.slot, i));
      const unsigned token = __reduce_or_sync(mask, dependency_token(first_word(v), cache_.zero_));
      if (lane == leader) cache_.release_read(p.slot, token);
      return v;
    }
    if (lane != leader) p = pin_result{0, pin_state::miss};
  } else if (lane == leader && in_range) {
    p = cache_.pin(key, writing);
  }
  return access_slow(i, value, mask, peers, leader, p);
}

template <class T>
BAM_DEVICE BAM_NOINLINE T array_ref<T>::access_slow(std::uint64_t i, const T* value, unsigned mask, unsigned peers,
                                                    unsigned leader, pin_result p, std::uint32_t* slot_of_page) const {
  using namespace detail;
  (void)peers;
  const unsigned lane = lane_id();
  const bool in_range = i < n_;
  page_request r;
  if (lane == leader && in_range) {
    r.key = key_of(i);
    r.for_write = value != nullptr;
    r.slot = p.slot;
    r.phase = phase_after(p.state);
  }
  T result{};
  unsigned todo = mask;
  for (;;) {
    if (__any_sync(mask, !r.settled())) cache_.resolve(r, mask, true);
    const unsigned ph = __shfl_sync(mask, static_cast<unsigned>(r.phase), leader);
    const std::uint32_t slot = __shfl_sync(mask, r.slot, leader);
    const std::uint16_t st = static_cast<std::uint16_t>(__shfl_sync(mask, static_cast<unsigned>(r.status), leader));
    const bool hit = ph == static_cast<unsigned>(page_phase::hit);
    const bool now = ((todo >> lane) & 1u) && (!in_range || hit || ph == static_cast<unsigned>(page_phase::failed));
    unsigned token = 0;
    if (now) {
      if (!in_range)
        fail(nvme::status_out_of_range, i);
      else if (!hit) {
        if (lane == leader) fail(nvme::status(st), i);
      } else if (value != nullptr)
        store_uncached(element(slot, i), *value);
      else {
        result = load_uncached(element(slot, i));
        token = dependency_token(first_word(result), cache_.zero_);
        if (slot_of_page != nullptr) *slot_of_page = slot;
      }
    }
    todo &= ~__ballot_sync(mask, now);
    // The leader lets the page go once every peer is done with it: after the
    // peers' reads arrived (their tokens), or after their writes (release).
    if (value != nullptr) __syncwarp(mask);
    token = __reduce_or_sync(mask, token);
    if (now && lane == leader && in_range) {
      if (hit) {
        if (value != nullptr)
          cache_.release(r.slot);
        else
          cache_.release_read(r.slot, token);
      }
      r.phase = page_phase::idle;
    }
    if (todo == 0) return result;
  }
}

template <class T>
BAM_DEVICE bool array_ref<T>::prefetch(std::uint64_t i, bool want, std::uint32_t* slot) const {
  using namespace detail;
  const unsigned mask = __activemask();
  const unsigned lane = lane_id();
  const bool go = want && i < n_;
  const std::uint64_t key = go ? key_of(i) : ~0ull; // one group for the lanes that want nothing
  const unsigned peers = same_value_lanes(mask, key);
  const unsigned leader = __ffs(peers) - 1;
  page_request r;
  if (lane == leader && go) {
    const pin_result p = cache_.pin(key, false);
    r.key = key;
    r.slot = p.slot;
    r.phase = phase_after(p.state);
  }
  // As in an access, a page that arrived is let go before the warp waits
  // for the others: it never waits while it holds a page.
  bool arrived = false;
  std::uint32_t arrived_in = 0;
  while (__any_sync(mask, r.phase != page_phase::idle)) {
    if (__any_sync(mask, !r.settled())) cache_.resolve(r, mask, true);
    if (r.phase == page_phase::hit) {
      arrived = true;
      arrived_in = r.slot;
      cache_.release(r.slot);
      r.phase = page_phase::idle;
    } else if (r.phase == page_phase::failed) {
      r.phase = page_phase::idle;
    }
  }
  const bool got = __shfl_sync(mask, arrived ? 1u : 0u, leader) != 0;
  const std::uint32_t s = __shfl_sync(mask, arrived_in, leader);
  if (got && slot != nullptr) *slot = s;
  return got;
}

template <class T>
BAM_DEVICE bool array_ref<T>::copy_to(std::uint64_t begin, std::uint64_t count, T* out) const {
  using namespace detail;
  constexpr unsigned full = 0xffffffffu;
  const unsigned lane = lane_id();
  if (begin > n_ || count > n_ - begin) {
    if (lane == 0) fail(nvme::status_out_of_range, begin > n_ ? begin : n_);
    for (std::uint64_t k = lane; k < count; k += 32)
      out[k] = T{};
    return false;
  }
  if (count == 0) return true;
  const std::uint64_t first = begin >> elem_shift_;
  const std::uint64_t last = (begin + count - 1) >> elem_shift_;
  if (last - first >= 32) return copy_slow(begin, count, out, pin_result{0, pin_state::miss}, false);
  // Up to 32 pages: each lane pins one; if every page is in the cache, the
  // warp copies them out here, with no call.
  const std::uint64_t my_page = first + lane;
  const std::uint64_t per_page = 1ull << elem_shift_;
  pin_result p{0, pin_state::miss};
  if (first == last) {
    // One page: the whole warp looks it up (a way per lane), lane 0 keeps the pin.
    const std::uint32_t from = static_cast<std::uint32_t>(((begin & (per_page - 1)) * sizeof(T)) & ~std::uint64_t{15});
    const std::uint64_t hi = (((begin + count - 1) & (per_page - 1)) + 1) * sizeof(T);
    const std::uint32_t bytes = static_cast<std::uint32_t>(((hi + 15) & ~std::uint64_t{15}) - from);
    const pin_result w = cache_.pin_warp(page_key(space_, first_page_ + first), from, bytes);
    if (lane == 0) p = w;
  } else if (my_page <= last) {
    // The bytes of this page the range covers, in 16-byte units, asked into
    // L2 while the pin is in flight.
    const std::uint64_t lo = my_page == first ? (begin & (per_page - 1)) * sizeof(T) : 0;
    const std::uint64_t hi =
        my_page == last ? (((begin + count - 1) & (per_page - 1)) + 1) * sizeof(T) : per_page * sizeof(T);
    const std::uint32_t from = static_cast<std::uint32_t>(lo & ~std::uint64_t{15});
    const std::uint32_t bytes = static_cast<std::uint32_t>(((hi + 15) & ~std::uint64_t{15}) - from);
    p = cache_.pin(page_key(space_, first_page_ + my_page), false, from, bytes);
  }
  if (!__all_sync(full, my_page > last || p.state == pin_state::hit)) return copy_slow(begin, count, out, p, true);
  const unsigned npages = static_cast<unsigned>(last - first) + 1;
  for (unsigned k = 0; k < npages; ++k) {
    const std::uint32_t slot = __shfl_sync(full, p.slot, k);
    const std::uint64_t page = first + k;
    const std::uint64_t lo = k == 0 ? begin : page * per_page;
    const std::uint64_t hi = page == last ? begin + count : (page + 1) * per_page;
    const auto* src = reinterpret_cast<const unsigned char*>(element(slot, lo));
    unsigned token = warp_copy_out(reinterpret_cast<unsigned char*>(out + (lo - begin)), src, (hi - lo) * sizeof(T),
                                   lane, cache_.zero_);
    token = __reduce_or_sync(full, token); // every lane's reads of the page arrived
    if (lane == k) cache_.release_read(p.slot, token);
  }
  return true;
}

template <class T>
BAM_DEVICE BAM_NOINLINE bool array_ref<T>::copy_slow(std::uint64_t begin, std::uint64_t count, T* out,
                                                     pin_result pinned, bool have_pins) const {
  const unsigned lane = detail::lane_id();
  return walk_pages<false>(
      begin, count, pinned, have_pins,
      [&](std::uint32_t slot, std::uint64_t lo, std::uint64_t hi) {
        const auto* src = reinterpret_cast<const unsigned char*>(element(slot, lo));
        return detail::warp_copy_out(reinterpret_cast<unsigned char*>(out + (lo - begin)), src, (hi - lo) * sizeof(T),
                                     lane, cache_.zero_);
      },
      [&](std::uint64_t lo, std::uint64_t hi) {
        for (std::uint64_t e = lo + lane; e < hi; e += 32)
          out[e - begin] = T{};
      });
}

template <class T>
template <bool ForWrite, class OnPage, class OnFailed>
BAM_DEVICE bool array_ref<T>::walk_pages(std::uint64_t begin, std::uint64_t count, pin_result pinned, bool have_pins,
                                         OnPage&& on_page, OnFailed&& on_failed) const {
  using namespace detail;
  constexpr unsigned full = 0xffffffffu;
  const unsigned lane = lane_id();
  const std::uint64_t per_page = 1ull << elem_shift_;
  const std::uint64_t first = begin >> elem_shift_;
  const std::uint64_t last = (begin + count - 1) >> elem_shift_;
  bool ok = true;
  for (std::uint64_t p0 = first; p0 <= last; p0 += 32) {
    // Each lane brings in one page: up to 32 loads in flight per warp. Pages
    // are handed to `on_page` (and let go) as they arrive.
    page_request r;
    const std::uint64_t my_page = p0 + lane;
    if (my_page <= last) {
      r.key = page_key(space_, first_page_ + my_page);
      if constexpr (ForWrite) r.for_write = true;
      if (have_pins && p0 == first) {
        // The caller's pin (hit, loading, or nothing).
        r.slot = pinned.slot;
        r.phase = phase_after(pinned.state);
      } else {
        r.phase = page_phase::lookup;
        cache_.try_pin(r);
      }
    }
    for (;;) {
      if (__any_sync(full, !r.settled())) cache_.resolve(r, full, true);
      unsigned ready = __ballot_sync(full, r.phase == page_phase::hit || r.phase == page_phase::failed);
      if (ready == 0) break; // every page done
      while (ready != 0) {
        const unsigned k = __ffs(ready) - 1;
        ready &= ready - 1;
        const std::uint32_t slot = __shfl_sync(full, r.slot, k);
        const bool good = __shfl_sync(full, r.phase == page_phase::hit, k);
        const std::uint16_t st = static_cast<std::uint16_t>(__shfl_sync(full, static_cast<unsigned>(r.status), k));
        const std::uint64_t page = p0 + k;
        const std::uint64_t lo = page == first ? begin : page * per_page;
        const std::uint64_t hi = page == last ? begin + count : (page + 1) * per_page;
        unsigned token = 0;
        if (good) {
          token = on_page(slot, lo, hi);
        } else {
          ok = false;
          if (lane == k) fail(nvme::status(st), lo);
          on_failed(lo, hi);
        }
        if constexpr (ForWrite) {
          // Every lane's stores before the page is let go (release order).
          __syncwarp(full);
        } else {
          token = __reduce_or_sync(full, token); // every lane's reads of the page arrived
        }
        if (lane == k) {
          if (good) {
            if constexpr (ForWrite)
              cache_.release(r.slot);
            else
              cache_.release_read(r.slot, token);
          }
          r.phase = page_phase::idle;
        }
      }
    }
  }
  return ok;
}

template <class T>
BAM_DEVICE array_reader<T>::array_reader(const array_ref<T>& a) : a_(&a) {}

template <class T>
BAM_DEVICE const T array_reader<T>::operator[](std::uint64_t i) {
  using namespace detail;
  const unsigned mask = __activemask();
  const unsigned lane = lane_id();
  const bool in_range = i < a_->n_;
  const std::uint64_t key = in_range ? a_->key_of(i) : ~0ull;
  const unsigned peers = same_value_lanes(mask, key);
  const unsigned leader = __ffs(peers) - 1;
  // The group's leader pins the page: at the slot it remembers for it, else by lookup.
  pin_result p{0, pin_state::miss};
  if (lane == leader && in_range) p = key == key_ ? a_->cache_.pin_slot(slot_, key) : a_->cache_.pin(key, false);
  const unsigned state = __shfl_sync(mask, static_cast<unsigned>(p.state), leader);
  if (__all_sync(mask, in_range && state == static_cast<unsigned>(pin_state::hit))) {
    const std::uint32_t slot = __shfl_sync(mask, p.slot, leader);
    const T v = load_page(a_->element(slot, i));
    const unsigned token = __reduce_or_sync(mask, dependency_token(first_word(v), a_->cache_.zero_));
    if (lane == leader) a_->cache_.release_read(p.slot, token);
    key_ = key;
    slot_ = slot;
    return v;
  }
  std::uint32_t slot = ~0u;
  const T v = a_->access_slow(i, nullptr, mask, peers, leader, p, &slot);
  key_ = slot == ~0u ? ~0ull : key;
  slot_ = slot;
  return v;
}

template <class T>
BAM_DEVICE void array_reader<T>::forget() {
  key_ = ~0ull;
}

template <class T>
BAM_DEVICE array_page<T>::array_page(const array_ref<T>& a, std::uint64_t i) : a_(&a) {
  using namespace detail;
  mask_ = __activemask();
  const unsigned lane = lane_id();
  const bool in_range = i < a.n_;
  const std::uint64_t key = in_range ? a.key_of(i) : ~0ull;
  const unsigned peers = same_value_lanes(mask_, key);
  const unsigned leader = __ffs(peers) - 1;
  pin_result p{0, pin_state::miss};
  if (in_range && mask_ == 0xffffffffu && peers == mask_) {
    // The whole warp on one page: every lane reads a way of the set.
    p = a.cache_.pin_warp(key, 0, 0);
    if (lane != leader) p.slot = 0;
  } else if (lane == leader && in_range) {
    p = a.cache_.pin(key, false);
  }
  unsigned state = __shfl_sync(mask_, static_cast<unsigned>(p.state), leader);
  if (!__all_sync(mask_, in_range && state == static_cast<unsigned>(pin_state::hit))) {
    // Bring every page in (pins let go), then pin them all at the slots
    // they arrived in, without waiting: all or none.
    std::uint32_t slot = ~0u;
    (void)a.access_slow(i, nullptr, mask_, peers, leader, p, &slot);
    p = pin_result{0, pin_state::miss};
    if (lane == leader && in_range && slot != ~0u) p = a.cache_.pin_slot(slot, key);
    state = __shfl_sync(mask_, static_cast<unsigned>(p.state), leader);
    if (!__all_sync(mask_, in_range && state == static_cast<unsigned>(pin_state::hit))) {
      if (lane == leader && p.state == pin_state::hit) a.cache_.release_read(p.slot, 0);
      return;
    }
  }
  const std::uint64_t per_page = 1ull << a.elem_shift_;
  first_ = i & ~(per_page - 1);
  count_ = a.n_ - first_ < per_page ? a.n_ - first_ : per_page;
  data_ = a.element(__shfl_sync(mask_, p.slot, leader), first_);
  pin_ = p.slot;
  holds_pin_ = lane == leader;
}

template <class T>
BAM_DEVICE array_page<T>::~array_page() {
  if (__any_sync(mask_, spanned_)) {
    // Reads through a span are not tracked: the warp's barrier orders them
    // before the release.
    __syncwarp(mask_);
    if (holds_pin_) a_->cache_.release(pin_);
    return;
  }
  // Every lane's reads of its page arrived before the pin is dropped.
  const unsigned token = detail::dependency_token(__reduce_or_sync(mask_, read_), a_->cache_.zero_);
  if (holds_pin_) a_->cache_.release_read(pin_, token);
}

template <class T>
BAM_DEVICE const T array_page<T>::operator[](std::uint64_t j) {
  if (j - first_ < count_) {
    const T v = detail::load_page(data_ + (j - first_));
    read_ |= detail::first_word(v);
    return v;
  }
  return (*a_)[j];
}

template <class T>
BAM_DEVICE bool array_page<T>::pinned() const {
  return count_ != 0;
}

template <class T>
BAM_DEVICE page_span<T> array_page<T>::span() {
  spanned_ = true;
  return page_span<T>(data_, first_, count_);
}

static_assert(std::is_trivially_copyable_v<array_ref<float>>, "array_ref is passed to kernels by value");
static_assert(std::is_trivially_copyable_v<page_span<float>>);

} // namespace bam
