// SPDX-License-Identifier: MIT
//! Loads and stores of cache memory past L1 (the page data of a slot may
//! have been filled by another SM or by a storage engine), the warp's copies
//! out of it, and the grouping of a warp's lanes by page.
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/detail/memory_ops.cuh>

#include <cstdint>
#include <cstring>

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

//! The warp copies `n` 16-byte words from `s` to `d`, lane by lane, eight
//! loads in flight per lane: `load(p)` reads a word, `store(p, v)` writes
//! it. Returns the OR of the first 32 bits of the words read (for a
//! dependency token).
template <class Load, class Store>
BAM_DEVICE unsigned warp_copy_words(uint4* d, const uint4* s, std::uint64_t n, unsigned lane, Load load, Store store) {
  unsigned token = 0;
  constexpr unsigned in_flight = 8;
  std::uint64_t k = lane;
  for (; k + (in_flight - 1) * 32 < n; k += in_flight * 32) {
    uint4 v[in_flight];
#pragma unroll
    for (unsigned j = 0; j < in_flight; ++j)
      v[j] = load(s + k + j * 32);
#pragma unroll
    for (unsigned j = 0; j < in_flight; ++j) {
      store(d + k + j * 32, v[j]);
      token |= v[j].x;
    }
  }
  for (; k < n; k += 32) {
    const uint4 v = load(s + k);
    store(d + k, v);
    token |= v.x;
  }
  return token;
}

//! The warp copies `len` bytes from cache memory `src` to `dst`. Returns a
//! dependency token (0) computed from every value read.
BAM_DEVICE inline unsigned warp_copy_out(unsigned char* dst, const unsigned char* src, std::uint64_t len, unsigned lane,
                                         unsigned zero) {
  unsigned token = 0;
  if (((reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src) | len) & 15u) == 0) {
    token = warp_copy_words(
        reinterpret_cast<uint4*>(dst), reinterpret_cast<const uint4*>(src), len / 16, lane,
        [](const uint4* p) { return ld_cg(p); }, [](uint4* p, const uint4& v) { *p = v; });
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

//! The warp copies `count` elements from `src` (GPU-accessible memory) into
//! cache memory `dst`, with the stores of `array_ref::write` (past L1):
//! 16 bytes a lane at a time where both sides allow it, else element by
//! element (an element of up to 16 bytes is then one store, never split).
template <class T>
BAM_DEVICE void warp_copy_in(T* dst, const T* src, std::uint64_t count, unsigned lane) {
  const std::uint64_t len = count * sizeof(T);
  if (((reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src) | len) & 15u) == 0) {
    (void)warp_copy_words(
        reinterpret_cast<uint4*>(dst), reinterpret_cast<const uint4*>(src), len / 16, lane,
        [](const uint4* p) { return *p; }, [](uint4* p, const uint4& v) { st_cg(p, v); });
  } else {
    for (std::uint64_t k = lane; k < count; k += 32)
      store_uncached(dst + k, src[k]);
  }
}

} // namespace detail

} // namespace bam
