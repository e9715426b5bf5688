// SPDX-License-Identifier: MIT
//! `bam::array_ref<T>`, `bam::array_reader<T>` and `bam::array_page<T>`:
//! element access, range copies, readers that remember their pages' slots
//! and page handles that keep a page pinned, over the page cache (device side).
//!
//! Every access is warp-collective over the lanes that make it (the active
//! mask): lanes on the same page form a group whose leader holds the cache
//! reference. The common case — the whole warp on one page, the page in the
//! cache — costs one vote, one lookup and one pin/unpin pair per warp. Misses
//! and waits go through `page_cache_ref::resolve`; a group whose page is
//! ready is served and lets its pin go before the warp waits for the others,
//! so a warp never waits while it holds a page.
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/detail/memory_ops.cuh>
#include <bam/runtime/detail/page_cache_ref.cuh>
#include <bam/runtime/error_record.cuh>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace bam {

namespace detail {

//! One word of cache memory, not through L1. `Ordered`: a volatile load the
//! compiler keeps in program order (`ld_cg`); otherwise `__ldcg`, which it
//! may batch with its neighbours.
template <bool Ordered, class W>
BAM_DEVICE W load_cg_word(const W* p) {
  if constexpr (Ordered)
    return ld_cg(p);
  else
    return __ldcg(p);
}

//! Load a T from cache memory without L1 (another SM or the engine may have filled it).
template <class T, bool Ordered = true>
BAM_DEVICE T load_uncached(const T* p) {
  T t;
  if constexpr (sizeof(T) == 1) {
    const unsigned char v = load_cg_word<Ordered>(reinterpret_cast<const unsigned char*>(p));
    std::memcpy(&t, &v, 1);
  } else if constexpr (sizeof(T) == 2) {
    const unsigned short v = load_cg_word<Ordered>(reinterpret_cast<const unsigned short*>(p));
    std::memcpy(&t, &v, 2);
  } else if constexpr (sizeof(T) == 4) {
    const unsigned v = load_cg_word<Ordered>(reinterpret_cast<const unsigned*>(p));
    std::memcpy(&t, &v, 4);
  } else if constexpr (sizeof(T) == 8) {
    const unsigned long long v = load_cg_word<Ordered>(reinterpret_cast<const unsigned long long*>(p));
    std::memcpy(&t, &v, 8);
  } else {
    static_assert(sizeof(T) % 16 == 0, "element sizes are powers of two");
    const auto* s = reinterpret_cast<const uint4*>(p);
    uint4 v[sizeof(T) / 16];
#pragma unroll
    for (std::size_t k = 0; k < sizeof(T) / 16; ++k)
      v[k] = load_cg_word<Ordered>(s + k);
    std::memcpy(&t, v, sizeof(T));
  }
  return t;
}

template <class T>
BAM_DEVICE void store_uncached(T* p, const T& value) {
  if constexpr (sizeof(T) == 1) {
    unsigned char v;
    std::memcpy(&v, &value, 1);
    st_cg(reinterpret_cast<unsigned char*>(p), v);
  } else if constexpr (sizeof(T) == 2) {
    unsigned short v;
    std::memcpy(&v, &value, 2);
    st_cg(reinterpret_cast<unsigned short*>(p), v);
  } else if constexpr (sizeof(T) == 4) {
    unsigned v;
    std::memcpy(&v, &value, 4);
    st_cg(reinterpret_cast<unsigned*>(p), v);
  } else if constexpr (sizeof(T) == 8) {
    unsigned long long v;
    std::memcpy(&v, &value, 8);
    st_cg(reinterpret_cast<unsigned long long*>(p), v);
  } else {
    uint4 v[sizeof(T) / 16];
    std::memcpy(v, &value, sizeof(T));
    auto* d = reinterpret_cast<uint4*>(p);
#pragma unroll
    for (std::size_t k = 0; k < sizeof(T) / 16; ++k)
      st_cg(d + k, v[k]);
  }
}

//! Load a T of a pinned page (L2, not L1: the slot's earlier pages may be
//! in this SM's L1). Not volatile: the compiler may batch such loads; their
//! addresses depend on the pin, so none is issued before it.
template <class T>
BAM_DEVICE T load_page(const T* p) {
  return load_uncached<T, false>(p);
}

//! 32 bits that depend on every load of a value (to derive a dependency
//! token from it): its first word, and for values of 32 bytes or more
//! (several 16-byte loads) the first word of each 16 bytes.
template <class T>
BAM_DEVICE unsigned first_word(const T& v) {
  unsigned w = 0;
  std::memcpy(&w, &v, sizeof(T) < 4 ? sizeof(T) : 4);
  if constexpr (sizeof(T) >= 32) {
#pragma unroll
    for (std::size_t k = 16; k < sizeof(T); k += 16) {
      unsigned x;
      std::memcpy(&x, reinterpret_cast<const unsigned char*>(&v) + k, 4);
      w |= x;
    }
  }
  return w;
}

//! The lanes of `mask` whose value equals this lane's: without
//! `__match_any_sync` when the whole mask agrees (the common case).
BAM_DEVICE inline unsigned same_value_lanes(unsigned mask, std::uint64_t v) {
  const std::uint64_t first = __shfl_sync(mask, static_cast<unsigned long long>(v), __ffs(mask) - 1);
  if (__all_sync(mask, v == first)) return mask;
  return __match_any_sync(mask, static_cast<unsigned long long>(v));
}

} // namespace detail

template <class T>
class array_reader;
template <class T>
class array_page;

//! A lane's pinned page, from `array_page::span()`: element k of the page
//! (k < `size`) is `s[k]`, one load that skips L1 and no check, so a loop
//! over it keeps many loads in flight. Valid while its `array_page` lives.
template <class T>
struct page_span {
  const T* data = nullptr;
  std::uint64_t first = 0; //!< array index of the page's element 0
  std::uint64_t size = 0;  //!< elements on the page (0: not pinned)
  BAM_DEVICE T operator[](std::uint64_t k) const { return detail::load_page(data + k); }
};

//! Trivially copyable handle to a `bam::array<T>`; pass it to kernels by value.
template <class T>
class array_ref {
public:
  static_assert(std::is_trivially_copyable_v<T>, "array elements must be trivially copyable");
  static_assert((sizeof(T) & (sizeof(T) - 1)) == 0, "array element sizes must be powers of two");

  BAM_HD std::uint64_t size() const { return n; }

  //! Element `i` (a value: the array is written with `write`).
  BAM_DEVICE const T operator[](std::uint64_t i) const { return access<element_op::read>(i, nullptr); }
  BAM_DEVICE T read(std::uint64_t i) const { return access<element_op::read>(i, nullptr); }
  BAM_DEVICE void write(std::uint64_t i, const T& v) const { access<element_op::write>(i, &v); }

  //! Copy elements [begin, begin + count) into `out[0..count)`. Every lane of
  //! the warp calls it with the same arguments (the full warp, converged).
  //! Returns false (and records the failure) if a page could not be read;
  //! the elements of such a page are set to T{}.
  BAM_DEVICE bool copy_to(std::uint64_t begin, std::uint64_t count, T* out) const;

  //! Bring the page of element `i` into the cache, for each lane that passes
  //! `want` (the lanes call it together, as any access). The warp's misses
  //! are read at once, and nothing is held afterwards: a later access finds
  //! the page unless it was evicted in between. True when the page arrived,
  //! with its slot in `*slot` (if given; a hint for
  //! `page_cache_ref::pin_slot`). Records nothing: the access that meets a
  //! failure reports it.
  BAM_DEVICE bool prefetch(std::uint64_t i, bool want = true, std::uint32_t* slot = nullptr) const;

  //! A reader that remembers the cache slot of each lane's last page.
  BAM_DEVICE array_reader<T> reader() const { return array_reader<T>(*this); }

  //! The page of element `i` of each lane, pinned while the returned object
  //! lives: its elements are read with plain loads (see `array_page`).
  BAM_DEVICE array_page<T> page(std::uint64_t i) const { return array_page<T>(*this, i); }

  // The handle's fields are set by `bam::array` only.
  page_cache_ref cache{};
  std::uint64_t n = 0;
  std::uint64_t first_page = 0; //!< the array's page 0 within its key space
  std::uint32_t space = 0;
  std::uint32_t elem_shift = 0; //!< log2(elements per page)
  device_error_record* err = nullptr;

  BAM_DEVICE std::uint64_t key_of(std::uint64_t i) const {
    return page_cache_ref::make_key(space, first_page + (i >> elem_shift));
  }
  BAM_DEVICE T* element(std::uint32_t slot, std::uint64_t i) const {
    return reinterpret_cast<T*>(cache.page_data(slot)) + (i & ((1ull << elem_shift) - 1));
  }
  //! Record a failure of element `i` (with its page's controller and LBA).
  BAM_DEVICE void fail(nvme::status st, std::uint64_t i) const {
    if (err == nullptr) return;
    if (i < n) {
      const space_ref& sp = cache.spaces[space];
      const std::uint64_t p = first_page + (i >> elem_shift);
      err->record(st, failure_site::element_on_page(i, sp.lba_of(p), sp.controller_of(p)));
    } else {
      err->record(st, failure_site::element(i));
    }
  }

private:
  //! What an element access does: reads return the element; writes store `*value`.
  enum class element_op { read, write };
  //! Element `i` read, or `*value` written to it (`Op` says which: `value` is null for a read).
  template <element_op Op>
  BAM_DEVICE T access(std::uint64_t i, const T* value) const;
  //! The miss and wait path of an access; `*slot_of_page` (if given) is set
  //! to the slot the page was read from (a hint: the page is let go).
  BAM_DEVICE T access_slow(std::uint64_t i, const T* value, unsigned mask, unsigned peers, unsigned leader,
                           pin_result p, std::uint32_t* slot_of_page = nullptr) const;
  friend class array_reader<T>;
  friend class array_page<T>;
  //! `copy_to` past its fast path: `pinned` is this lane's pin of page
  //! `first + lane` when `have_pins`.
  BAM_DEVICE bool copy_slow(std::uint64_t begin, std::uint64_t count, T* out, pin_result pinned, bool have_pins) const;
};

template <class T>
template <typename array_ref<T>::element_op Op>
BAM_DEVICE T array_ref<T>::access(std::uint64_t i, const T* value) const {
  constexpr bool writing = Op == element_op::write;
  using namespace detail;
  const unsigned mask = __activemask();
  const unsigned lane = lane_id();
  const bool in_range = i < n;
  const std::uint64_t key = in_range ? key_of(i) : ~0ull; // one group for bad indices
  const unsigned peers = same_value_lanes(mask, key);
  const unsigned leader = __ffs(peers) - 1;
  pin_result p{0, pin_state::miss};
  if (!writing && in_range && mask == 0xffffffffu && peers == mask) {
    // The whole warp on one page (consecutive elements): every lane reads a
    // way of the set, and on a hit the read needs no call.
    p = cache.pin_warp(key, 0, 0);
    if (p.state == pin_state::hit) {
      const T v = load_uncached(element(p.slot, i));
      const unsigned token = __reduce_or_sync(mask, dependency_token(first_word(v), cache.zero));
      if (lane == leader) cache.release_read(p.slot, token);
      return v;
    }
    if (lane != leader) p = pin_result{0, pin_state::miss};
  } else if (lane == leader && in_range) {
    p = cache.pin(key, writing);
  }
  return access_slow(i, value, mask, peers, leader, p);
}

template <class T>
BAM_DEVICE BAM_NOINLINE T array_ref<T>::access_slow(std::uint64_t i, const T* value, unsigned mask, unsigned peers,
                                                    unsigned leader, pin_result p, std::uint32_t* slot_of_page) const {
  using namespace detail;
  (void)peers;
  const unsigned lane = lane_id();
  const bool in_range = i < n;
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
    if (__any_sync(mask, !r.settled())) cache.resolve(r, mask, true);
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
        token = dependency_token(first_word(result), cache.zero);
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
          cache.release(r.slot);
        else
          cache.release_read(r.slot, token);
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
  const bool go = want && i < n;
  const std::uint64_t key = go ? key_of(i) : ~0ull; // one group for the lanes that want nothing
  const unsigned peers = same_value_lanes(mask, key);
  const unsigned leader = __ffs(peers) - 1;
  page_request r;
  if (lane == leader && go) {
    const pin_result p = cache.pin(key, false);
    r.key = key;
    r.slot = p.slot;
    r.phase = phase_after(p.state);
  }
  // As in an access, a page that arrived is let go before the warp waits
  // for the others: it never waits while it holds a page.
  bool arrived = false;
  std::uint32_t arrived_in = 0;
  while (__any_sync(mask, r.phase != page_phase::idle)) {
    if (__any_sync(mask, !r.settled())) cache.resolve(r, mask, true);
    if (r.phase == page_phase::hit) {
      arrived = true;
      arrived_in = r.slot;
      cache.release(r.slot);
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

namespace detail {

//! The warp copies `len` bytes from cache memory `src` to `dst`. Returns a
//! dependency token (0) computed from every value read.
BAM_DEVICE inline unsigned warp_copy_out(unsigned char* dst, const unsigned char* src, std::uint64_t len, unsigned lane,
                                         unsigned zero) {
  unsigned token = 0;
  if (((reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src) | len) & 15u) == 0) {
    auto* d = reinterpret_cast<uint4*>(dst);
    const auto* s = reinterpret_cast<const uint4*>(src);
    const std::uint64_t n = len / 16;
    constexpr unsigned in_flight = 8;
    std::uint64_t k = lane;
    for (; k + (in_flight - 1) * 32 < n; k += in_flight * 32) {
      uint4 v[in_flight];
#pragma unroll
      for (unsigned j = 0; j < in_flight; ++j)
        v[j] = ld_cg(s + k + j * 32);
#pragma unroll
      for (unsigned j = 0; j < in_flight; ++j) {
        d[k + j * 32] = v[j];
        token |= v[j].x;
      }
    }
    for (; k < n; k += 32) {
      const uint4 v = ld_cg(s + k);
      d[k] = v;
      token |= v.x;
    }
  } else if (((reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src) | len) & 3u) == 0) {
    auto* d = reinterpret_cast<unsigned*>(dst);
    const auto* s = reinterpret_cast<const unsigned*>(src);
    for (std::uint64_t k = lane; k < len / 4; k += 32) {
      const unsigned v = ld_cg(s + k);
      d[k] = v;
      token |= v;
    }
  } else {
    for (std::uint64_t k = lane; k < len; k += 32) {
      const unsigned char v = ld_cg(src + k);
      dst[k] = v;
      token |= v;
    }
  }
  return dependency_token(token, zero);
}

} // namespace detail

template <class T>
BAM_DEVICE bool array_ref<T>::copy_to(std::uint64_t begin, std::uint64_t count, T* out) const {
  using namespace detail;
  constexpr unsigned full = 0xffffffffu;
  const unsigned lane = lane_id();
  if (begin > n || count > n - begin) {
    if (lane == 0) fail(nvme::status_out_of_range, begin > n ? begin : n);
    for (std::uint64_t k = lane; k < count; k += 32)
      out[k] = T{};
    return false;
  }
  if (count == 0) return true;
  const std::uint64_t first = begin >> elem_shift;
  const std::uint64_t last = (begin + count - 1) >> elem_shift;
  if (last - first >= 32) return copy_slow(begin, count, out, pin_result{0, pin_state::miss}, false);
  // Up to 32 pages: each lane pins one; if every page is in the cache, the
  // warp copies them out here, with no call.
  const std::uint64_t my_page = first + lane;
  const std::uint64_t per_page = 1ull << elem_shift;
  pin_result p{0, pin_state::miss};
  if (first == last) {
    // One page: the whole warp looks it up (a way per lane), lane 0 keeps the pin.
    const std::uint32_t from = static_cast<std::uint32_t>(((begin & (per_page - 1)) * sizeof(T)) & ~std::uint64_t{15});
    const std::uint64_t hi = (((begin + count - 1) & (per_page - 1)) + 1) * sizeof(T);
    const std::uint32_t bytes = static_cast<std::uint32_t>(((hi + 15) & ~std::uint64_t{15}) - from);
    const pin_result w = cache.pin_warp(page_cache_ref::make_key(space, first_page + first), from, bytes);
    if (lane == 0) p = w;
  } else if (my_page <= last) {
    // The bytes of this page the range covers, in 16-byte units, asked into
    // L2 while the pin is in flight.
    const std::uint64_t lo = my_page == first ? (begin & (per_page - 1)) * sizeof(T) : 0;
    const std::uint64_t hi =
        my_page == last ? (((begin + count - 1) & (per_page - 1)) + 1) * sizeof(T) : per_page * sizeof(T);
    const std::uint32_t from = static_cast<std::uint32_t>(lo & ~std::uint64_t{15});
    const std::uint32_t bytes = static_cast<std::uint32_t>(((hi + 15) & ~std::uint64_t{15}) - from);
    p = cache.pin(page_cache_ref::make_key(space, first_page + my_page), false, from, bytes);
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
                                   lane, cache.zero);
    token = __reduce_or_sync(full, token); // every lane's reads of the page arrived
    if (lane == k) cache.release_read(p.slot, token);
  }
  return true;
}

template <class T>
BAM_DEVICE BAM_NOINLINE bool array_ref<T>::copy_slow(std::uint64_t begin, std::uint64_t count, T* out,
                                                     pin_result pinned, bool have_pins) const {
  using namespace detail;
  constexpr unsigned full = 0xffffffffu;
  const unsigned lane = lane_id();
  const std::uint64_t per_page = 1ull << elem_shift;
  const std::uint64_t first = begin >> elem_shift;
  const std::uint64_t last = (begin + count - 1) >> elem_shift;
  bool ok = true;
  for (std::uint64_t p0 = first; p0 <= last; p0 += 32) {
    // Each lane brings in one page: up to 32 loads in flight per warp. Pages
    // are copied out (and let go) as they arrive.
    page_request r;
    const std::uint64_t my_page = p0 + lane;
    if (my_page <= last) {
      r.key = page_cache_ref::make_key(space, first_page + my_page);
      if (have_pins && p0 == first) {
        // The caller's pin (hit, loading, or nothing).
        r.slot = pinned.slot;
        r.phase = phase_after(pinned.state);
      } else {
        r.phase = page_phase::lookup;
        cache.try_pin(r);
      }
    }
    for (;;) {
      if (__any_sync(full, !r.settled())) cache.resolve(r, full, true);
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
          const auto* src = reinterpret_cast<const unsigned char*>(element(slot, lo));
          token = warp_copy_out(reinterpret_cast<unsigned char*>(out + (lo - begin)), src, (hi - lo) * sizeof(T), lane,
                                cache.zero);
        } else {
          ok = false;
          if (lane == k) fail(nvme::status(st), lo);
          for (std::uint64_t e = lo + lane; e < hi; e += 32)
            out[e - begin] = T{};
        }
        token = __reduce_or_sync(full, token); // every lane's reads of the page arrived
        if (lane == k) {
          if (good) cache.release_read(r.slot, token);
          r.phase = page_phase::idle;
        }
      }
    }
  }
  return ok;
}

//! Remembers the cache slot of each lane's last page, so that an access to
//! the same page skips the lookup: one atomic pin of the known slot, one
//! load, one release. It holds nothing between accesses: lanes of a warp may
//! diverge, leave a loop early or stop using it at any point (a pin kept
//! across accesses would stay with lanes parked at a divergent loop's exit
//! while the rest of their warp waits for a slot). Warp-collective like
//! `array_ref::operator[]`. It refers to the `array_ref` it was made from,
//! which must outlive it.
template <class T>
class array_reader {
public:
  BAM_DEVICE explicit array_reader(const array_ref<T>& a) : a_(&a) {}
  array_reader(const array_reader&) = delete;
  array_reader& operator=(const array_reader&) = delete;

  BAM_DEVICE const T operator[](std::uint64_t i) {
    using namespace detail;
    const unsigned mask = __activemask();
    const unsigned lane = lane_id();
    const bool in_range = i < a_->n;
    const std::uint64_t key = in_range ? a_->key_of(i) : ~0ull;
    const unsigned peers = same_value_lanes(mask, key);
    const unsigned leader = __ffs(peers) - 1;
    // The group's leader pins the page: at the slot it remembers for it, else by lookup.
    pin_result p{0, pin_state::miss};
    if (lane == leader && in_range) p = key == key_ ? a_->cache.pin_slot(slot_, key) : a_->cache.pin(key, false);
    const unsigned state = __shfl_sync(mask, static_cast<unsigned>(p.state), leader);
    if (__all_sync(mask, in_range && state == static_cast<unsigned>(pin_state::hit))) {
      const std::uint32_t slot = __shfl_sync(mask, p.slot, leader);
      const T v = load_page(a_->element(slot, i));
      const unsigned token = __reduce_or_sync(mask, dependency_token(first_word(v), a_->cache.zero));
      if (lane == leader) a_->cache.release_read(p.slot, token);
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
  //! Forget the remembered slots (nothing is held; kept for symmetry).
  BAM_DEVICE void release() { key_ = ~0ull; }

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
//!   if (const auto s = pg.span(); s.size != 0)
//!     for (std::uint32_t k = lane; k < s.size; k += 32) sum += s[k];
//! @endcode
template <class T>
class array_page {
public:
  BAM_DEVICE array_page(const array_ref<T>& a, std::uint64_t i) : a_(&a) {
    using namespace detail;
    mask_ = __activemask();
    const unsigned lane = lane_id();
    const bool in_range = i < a.n;
    const std::uint64_t key = in_range ? a.key_of(i) : ~0ull;
    const unsigned peers = same_value_lanes(mask_, key);
    const unsigned leader = __ffs(peers) - 1;
    pin_result p{0, pin_state::miss};
    if (in_range && mask_ == 0xffffffffu && peers == mask_) {
      // The whole warp on one page: every lane reads a way of the set.
      p = a.cache.pin_warp(key, 0, 0);
      if (lane != leader) p.slot = 0;
    } else if (lane == leader && in_range) {
      p = a.cache.pin(key, false);
    }
    unsigned state = __shfl_sync(mask_, static_cast<unsigned>(p.state), leader);
    if (!__all_sync(mask_, in_range && state == static_cast<unsigned>(pin_state::hit))) {
      // Bring every page in (pins let go), then pin them all at the slots
      // they arrived in, without waiting: all or none.
      std::uint32_t slot = ~0u;
      (void)a.access_slow(i, nullptr, mask_, peers, leader, p, &slot);
      p = pin_result{0, pin_state::miss};
      if (lane == leader && in_range && slot != ~0u) p = a.cache.pin_slot(slot, key);
      state = __shfl_sync(mask_, static_cast<unsigned>(p.state), leader);
      if (!__all_sync(mask_, in_range && state == static_cast<unsigned>(pin_state::hit))) {
        if (lane == leader && p.state == pin_state::hit) a.cache.release_read(p.slot, 0);
        return;
      }
    }
    const std::uint64_t per_page = 1ull << a.elem_shift;
    first_ = i & ~(per_page - 1);
    count_ = a.n - first_ < per_page ? a.n - first_ : per_page;
    data_ = a.element(__shfl_sync(mask_, p.slot, leader), first_);
    pin_ = p.slot;
    holds_pin_ = lane == leader;
  }
  array_page(const array_page&) = delete;
  array_page& operator=(const array_page&) = delete;

  //! Let the pins go (the lanes that made it, each reaching its end of scope).
  BAM_DEVICE ~array_page() {
    if (__any_sync(mask_, spanned_)) {
      // Reads through a span are not tracked: the warp's barrier orders them
      // before the release.
      __syncwarp(mask_);
      if (holds_pin_) a_->cache.release(pin_);
      return;
    }
    // Every lane's reads of its page arrived before the pin is dropped.
    const unsigned token = detail::dependency_token(__reduce_or_sync(mask_, read_), a_->cache.zero);
    if (holds_pin_) a_->cache.release_read(pin_, token);
  }

  //! Element `j`: a plain load if it is on this lane's pinned page, else `a[j]`.
  BAM_DEVICE const T operator[](std::uint64_t j) {
    if (j - first_ < count_) {
      const T v = detail::load_page(data_ + (j - first_));
      read_ |= detail::first_word(v);
      return v;
    }
    return (*a_)[j];
  }
  //! Whether this lane's page is pinned (else every read goes through `a[j]`).
  BAM_DEVICE bool pinned() const { return count_ != 0; }

  //! This lane's page as a span of unchecked reads (`span()[k]` is element
  //! `span().first + k`), for loops that read many of its elements: no
  //! branch between the loads lets them all be in flight at once. Empty
  //! (size 0) when the page is not pinned: then read through `operator[]`.
  //! Ends with the handle; its pin is then let go after a warp barrier.
  BAM_DEVICE page_span<T> span() {
    spanned_ = true;
    return {data_, first_, count_};
  }

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
