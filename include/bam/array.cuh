// SPDX-License-Identifier: MIT
//! `bam::array<T>`: an array of T on NVMe storage that GPU kernels index as if
//! it were memory, through a `bam::page_cache`. `bam::array_ref<T>` is its
//! trivially copyable handle, passed to kernels by value.
//!
//!  - `a[i]` / `a.read(i)`, `a.write(i, v)`: element access. Threads of a warp
//!    that touch the same page are grouped (`__match_any_sync`); one leader
//!    per page takes the cache reference and broadcasts the slot (`__shfl_sync`).
//!  - `a.copy_to(begin, count, out)`: the whole warp copies a contiguous range
//!    into a user buffer, up to 32 pages in flight at once.
//!  - Pages are striped over the storage's controllers; many arrays share one cache.
//!  - A bad index or a device error never corrupts anything: the first failure
//!    (index, LBA, NVMe status) is recorded, the access yields `T{}`, and the host
//!    side turns it into a `bam::error` in `check()` (or logs it in the destructor).
//!
//! @code
//!   __global__ void sum(bam::array_ref<float> a, float* out) {
//!     const std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x;
//!     if (i < a.size()) atomicAdd(out, a[i]);
//!   }
//!   bam::array<float> a(cache, storage, n);
//!   sum<<<(n + 255) / 256, 256>>>(a.ref(), out);
//!   cudaDeviceSynchronize();
//!   a.check();
//! @endcode
#pragma once

#include <bam/cache.cuh>
#include <bam/gpu/cuda.cuh>
#include <bam/gpu/memory_ops.cuh>
#include <bam/gpu/storage.cuh>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <type_traits>

namespace bam {

namespace detail {

//! Load a T from cache memory without L1 (another SM or the engine may have filled it).
template <class T>
BAM_DEVICE T load_uncached(const T* p) {
  if constexpr (sizeof(T) == 4 && alignof(T) >= 4) {
    const unsigned v = gpu::ld_cg(reinterpret_cast<const unsigned*>(p));
    T t;
    std::memcpy(&t, &v, 4);
    return t;
  } else if constexpr (sizeof(T) == 8 && alignof(T) >= 8) {
    const unsigned long long v = gpu::ld_cg(reinterpret_cast<const unsigned long long*>(p));
    T t;
    std::memcpy(&t, &v, 8);
    return t;
  } else if constexpr (sizeof(T) == 16 && alignof(T) >= 16) {
    const uint4 v = gpu::ld_cg(reinterpret_cast<const uint4*>(p));
    T t;
    std::memcpy(&t, &v, 16);
    return t;
  } else {
    T t;
    auto* d = reinterpret_cast<unsigned char*>(&t);
    const auto* s = reinterpret_cast<const unsigned char*>(p);
    for (std::size_t k = 0; k < sizeof(T); ++k) d[k] = gpu::ld_cg(s + k);
    return t;
  }
}

template <class T>
BAM_DEVICE void store_uncached(T* p, const T& v) {
  if constexpr (sizeof(T) == 4 && alignof(T) >= 4) {
    unsigned w;
    std::memcpy(&w, &v, 4);
    gpu::st_cg(reinterpret_cast<unsigned*>(p), w);
  } else if constexpr (sizeof(T) == 8 && alignof(T) >= 8) {
    unsigned long long w;
    std::memcpy(&w, &v, 8);
    gpu::st_cg(reinterpret_cast<unsigned long long*>(p), w);
  } else {
    auto* d = reinterpret_cast<unsigned char*>(p);
    const auto* s = reinterpret_cast<const unsigned char*>(&v);
    for (std::size_t k = 0; k < sizeof(T); ++k) gpu::st_cg(d + k, s[k]);
  }
}

BAM_DEVICE inline unsigned lane_id() {
  unsigned l;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));
  return l;
}

} // namespace detail

//! Trivially copyable handle to a `bam::array<T>`; pass it to kernels by value.
template <class T>
struct array_ref {
  static_assert(std::is_trivially_copyable_v<T>, "array elements must be trivially copyable");

  page_cache_ref cache{};
  std::uint64_t n = 0;              //!< elements
  std::uint32_t backing = 0;        //!< id within the cache
  std::uint32_t elem_shift = 0;     //!< log2(elements per page)
  device_error_record* err = nullptr;
  const backing_ref* backing_info = nullptr;

  BAM_HD std::uint64_t size() const { return n; }

  BAM_DEVICE T read(std::uint64_t i) const { return access(i, nullptr); }
  BAM_DEVICE T operator[](std::uint64_t i) const { return access(i, nullptr); }
  BAM_DEVICE void write(std::uint64_t i, const T& v) const { access(i, &v); }

  //! Copy elements [begin, begin + count) into `out[0..count)`. Every lane of
  //! the warp must call it with the same arguments (the full warp, converged).
  //! Returns false (and records the failure) if a page could not be read;
  //! the elements of such a page are set to T{}.
  BAM_DEVICE bool copy_to(std::uint64_t begin, std::uint64_t count, T* out) const;

private:
  BAM_DEVICE void fail(nvme::status st, std::uint64_t i) const {
    if (err != nullptr) {
      std::uint64_t lba = 0;
      std::uint32_t ctrl = 0;
      const bool have_lba = i < n && backing_info != nullptr;
      if (have_lba) {
        const std::uint64_t p = i >> elem_shift;
        ctrl = backing_info[0].controller_of(p);
        lba = backing_info[0].lba_of(p);
      }
      err->record(st, true, i, have_lba, lba, ctrl);
    }
  }

  //! Read (value == nullptr) or write element i, coalesced across the warp.
  BAM_DEVICE T access(std::uint64_t i, const T* value) const {
    const unsigned active = __activemask();
    const bool in_range = i < n;
    const std::uint64_t key =
        in_range ? page_cache_ref::make_key(backing, i >> elem_shift) : ~0ull; // one group for bad indices
    const unsigned peers = __match_any_sync(active, key);
    const unsigned leader = __ffs(peers) - 1;
    const bool is_leader = detail::lane_id() == leader;
    std::uint32_t slot = 0;
    std::uint16_t status = 0;
    if (is_leader && in_range) {
      const page_acquire r = cache.acquire(key, value != nullptr, err);
      slot = r.slot;
      status = r.status.raw;
    }
    slot = __shfl_sync(peers, slot, leader);
    status = static_cast<std::uint16_t>(__shfl_sync(peers, static_cast<unsigned>(status), leader));
    T result{};
    if (!in_range) {
      fail(nvme::status_out_of_range, i);
      return result;
    }
    if (!nvme::status(status).ok()) {
      if (is_leader) fail(nvme::status(status), i);
      return result;
    }
    T* elem = reinterpret_cast<T*>(cache.page_data(slot)) + (i & ((1ull << elem_shift) - 1));
    if (value != nullptr) detail::store_uncached(elem, *value);
    else result = detail::load_uncached(elem);
    __syncwarp(peers); // every peer is done with the page before the leader lets it go
    if (is_leader) {
      if (value != nullptr) __threadfence(); // the data before the reference drop
      cache.release(slot);
    }
    return result;
  }
};

template <class T>
BAM_DEVICE bool array_ref<T>::copy_to(std::uint64_t begin, std::uint64_t count, T* out) const {
  constexpr unsigned full = 0xffffffffu;
  const unsigned lane = detail::lane_id();
  if (begin > n || count > n - begin) {
    if (lane == 0) fail(nvme::status_out_of_range, begin > n ? begin : n);
    for (std::uint64_t k = lane; k < count; k += 32) out[k] = T{};
    return false;
  }
  if (count == 0) return true;
  const std::uint64_t per_page = 1ull << elem_shift;
  const std::uint64_t first_page = begin >> elem_shift;
  const std::uint64_t last_page = (begin + count - 1) >> elem_shift;
  bool ok = true;
  for (std::uint64_t p0 = first_page; p0 <= last_page; p0 += 32) {
    // Each lane brings in one page: up to 32 loads in flight per warp.
    const std::uint64_t my_page = p0 + lane;
    const bool mine = my_page <= last_page;
    page_acquire r;
    if (mine) r = cache.acquire(page_cache_ref::make_key(backing, my_page), false, err);
    __syncwarp(full);
    const unsigned pages = static_cast<unsigned>(last_page - p0 + 1 < 32 ? last_page - p0 + 1 : 32);
    for (unsigned k = 0; k < pages; ++k) {
      const std::uint32_t slot = __shfl_sync(full, r.slot, k);
      const std::uint16_t st = static_cast<std::uint16_t>(__shfl_sync(full, static_cast<unsigned>(r.status.raw), k));
      const std::uint64_t page = p0 + k;
      const std::uint64_t lo = page == first_page ? begin : page * per_page;
      const std::uint64_t hi = page == last_page ? begin + count : (page + 1) * per_page;
      const T* src = reinterpret_cast<const T*>(cache.page_data(slot));
      const bool good = nvme::status(st).ok();
      if (!good) {
        ok = false;
        if (lane == k) fail(nvme::status(st), lo);
      }
      for (std::uint64_t e = lo + lane; e < hi; e += 32)
        out[e - begin] = good ? detail::load_uncached(src + (e & (per_page - 1))) : T{};
    }
    __syncwarp(full);
    if (mine && r.status.ok()) cache.release(r.slot);
  }
  return ok;
}

//! Owning host object: attaches `n` elements at `start_lba` of a storage to a cache.
template <class T>
class array {
public:
  static_assert(std::is_trivially_copyable_v<array_ref<T>>, "array_ref must be trivially copyable");

  //! `start_lba`: where the array begins on every controller of `s` (pages striped over them).
  array(page_cache& cache, const gpu::storage& s, std::uint64_t n, std::uint64_t start_lba = 0)
      : cache_(&cache), storage_(&s), n_(n) {
    if (cache.page_size() % sizeof(T) != 0 || (sizeof(T) & (sizeof(T) - 1)) != 0)
      throw error("bam::array: element size " + std::to_string(sizeof(T)) +
                  " must be a power of two dividing the page size " + std::to_string(cache.page_size()));
    if (n == 0) throw error("bam::array: an array needs at least one element");
    const std::uint64_t per_page = cache.page_size() / sizeof(T);
    npages_ = (n + per_page - 1) / per_page;
    backing_ = cache.attach(s, start_lba, npages_);
    err_ = gpu::device_buffer<device_error_record>(1);
    unsigned shift = 0;
    while ((1ull << shift) < per_page) ++shift;
    ref_.cache = cache.ref();
    ref_.n = n;
    ref_.backing = backing_;
    ref_.elem_shift = shift;
    ref_.err = err_.get();
    ref_.backing_info = cache.ref().backings + backing_;
  }

  //! Writes dirty pages back and detaches from the cache. A recorded failure
  //! not collected by `check()` is logged (never thrown from here).
  ~array() {
    if (cache_ == nullptr) return;
    try {
      try {
        check();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s (reported by ~array)\n", e.what());
      }
      cache_->detach(backing_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bam: ~array: %s\n", e.what());
    }
  }
  array(const array&) = delete;
  array& operator=(const array&) = delete;

  array_ref<T> ref() const { return ref_; }
  operator array_ref<T>() const { return ref_; }
  std::uint64_t size() const { return n_; }
  std::uint64_t pages() const { return npages_; }

  //! Throw `bam::error` if a kernel recorded a failure since the last check
  //! (bad index, NVMe error status, timeout). Call after the kernel finished.
  void check() {
    BAM_CUDA_TRY(cudaDeviceSynchronize());
    throw_if_recorded(err_.get(), "bam::array access failed", storage_->name());
  }
  //! Write back the cache's dirty pages and NVMe Flush (for every array on the cache).
  void flush() { cache_->flush(); }

private:
  page_cache* cache_;
  const gpu::storage* storage_;
  std::uint64_t n_;
  std::uint64_t npages_ = 0;
  std::uint32_t backing_ = 0;
  gpu::device_buffer<device_error_record> err_;
  array_ref<T> ref_{};
};

} // namespace bam
