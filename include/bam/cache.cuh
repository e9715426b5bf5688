// SPDX-License-Identifier: MIT
//! `bam::page_cache`: a software page cache in GPU memory in front of NVMe
//! storage, filled and written back by GPU threads through their own queues.
//!
//!  - Page size 512 B – 64 KiB (power of two, at least the LBA size);
//!    capacity chosen by the user. Metadata exists for cache slots only: one
//!    64-bit state word per slot (tag, flags, reference count), one clock byte
//!    per slot, and a lock word and clock hand per set of `ways` slots. The
//!    cache is set-associative: a storage page maps to one set (hash of its
//!    key), and lives in any of the set's ways.
//!  - Clock eviction inside a set; a referenced, loading or written-back page
//!    is never evicted. Misses on one set are serialized by the set's lock
//!    (held only for the tag update, never across I/O), so exactly one I/O
//!    is issued per page however many threads miss on it at once; the others
//!    take a reference and wait for the loader.
//!  - Dirty pages are written back before their slot is reused, and on
//!    `flush()`, followed by an NVMe Flush of every controller involved.
//!  - Every wait has a deadline (`page_cache_config::timeout_ns`).
//!
//! Arrays (`bam::array<T>`, array.cuh) attach to a cache; many arrays share one.
//!
//! @code
//!   bam::page_cache cache({.page_size = 4096, .capacity = 1ull << 30});
//!   bam::array<float> a(cache, storage, n);      // see array.cuh
//!   my_kernel<<<g, b>>>(a.ref());
//!   a.check();                                   // throws bam::error on a device-side failure
//!   cache.flush();                               // write back dirty pages, NVMe Flush
//! @endcode
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/error.hpp>
#include <bam/gpu/cuda.cuh>
#include <bam/gpu/storage.cuh>
#include <bam/nvme/spec.hpp>

#include <cuda/atomic>

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace bam {

//! The first failure a kernel met, recorded in GPU memory (system-scope
//! atomics on pinned host memory are not available everywhere). Any thread
//! may record; the first one wins; `count` counts them all.
struct device_error_record {
  std::uint32_t state;      //!< 0: none, 1: being written, 2: complete
  std::uint16_t status;     //!< NVMe or bam status (sct << 8 | sc, with DNR/More bits)
  std::uint16_t has_index;  //!< 1 if `index` is an element index
  std::uint32_t controller; //!< index of the controller within its storage
  std::uint32_t has_lba;    //!< 1 if `lba` is meaningful
  std::uint64_t index;      //!< element index
  std::uint64_t lba;        //!< first LBA of the page involved
  unsigned long long count; //!< failures recorded, first included

  BAM_DEVICE void record(nvme::status st, bool with_index, std::uint64_t idx, bool with_lba,
                         std::uint64_t lba_, std::uint32_t ctrl) {
    cuda::atomic_ref<unsigned long long, cuda::thread_scope_device>(count).fetch_add(
        1, cuda::memory_order_relaxed);
    cuda::atomic_ref<std::uint32_t, cuda::thread_scope_device> s(state);
    std::uint32_t expected = 0;
    if (!s.compare_exchange_strong(expected, 1, cuda::memory_order_relaxed)) return;
    status = st.raw;
    has_index = with_index ? 1 : 0;
    index = idx;
    has_lba = with_lba ? 1 : 0;
    lba = lba_;
    controller = ctrl;
    s.store(2, cuda::memory_order_release);
  }
};

//! Throw `bam::error` for a failure recorded at `dev` (GPU memory; the record
//! is cleared), or do nothing. Call when no kernel that records is running.
inline void throw_if_recorded(device_error_record* dev, const std::string& what, const std::string& controller) {
  device_error_record r{};
  BAM_CUDA_TRY(cudaMemcpy(&r, dev, sizeof r, cudaMemcpyDeviceToHost));
  if (r.state == 0 && r.count == 0) return;
  BAM_CUDA_TRY(cudaMemset(dev, 0, sizeof r));
  error_context c;
  c.controller = controller;
  if (r.state == 2) {
    c.status = nvme::status(r.status);
    if (r.has_index) c.index = r.index;
    if (r.has_lba) c.lba = r.lba;
  }
  const unsigned long long n = r.count;
  throw error(what + " (" + std::to_string(n) + " failure" + (n == 1 ? "" : "s") +
                  " recorded on the device; the first one follows)",
              c);
}

namespace detail {

inline constexpr std::uint64_t slot_ref_mask = 0xffffull;
inline constexpr std::uint64_t slot_valid = 1ull << 16;
inline constexpr std::uint64_t slot_busy = 1ull << 17;  //!< loading, or being written back
inline constexpr std::uint64_t slot_dirty = 1ull << 18;
inline constexpr std::uint64_t slot_error = 1ull << 19; //!< load failed; status in the slot's first word
inline constexpr unsigned slot_tag_shift = 20;
//! Page keys: backing id (8 bits) above a 36-bit page number; tag = key + 1 (0: empty).
inline constexpr unsigned key_page_bits = 36;
inline constexpr std::uint64_t key_page_mask = (1ull << key_page_bits) - 1;
inline constexpr std::uint32_t max_backings = 255;

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

} // namespace detail

//! Where the pages of one array live: device-side, one per attached array.
struct backing_ref {
  const gpu::controller_ref* ctrls = nullptr; //!< storage's controllers (device array)
  const std::uint64_t* const* data_bus = nullptr; //!< per controller: bus addresses of the cache data
  std::uint64_t start_lba = 0;     //!< first LBA on every controller
  std::uint64_t npages = 0;
  std::uint32_t nctrl = 0;
  std::uint32_t blocks_per_page = 0;

  //! Controller and LBA of page `p`: pages are striped, page p on controller p % nctrl.
  BAM_HD std::uint32_t controller_of(std::uint64_t p) const { return static_cast<std::uint32_t>(p % nctrl); }
  BAM_HD std::uint64_t lba_of(std::uint64_t p) const { return start_lba + (p / nctrl) * blocks_per_page; }
};

//! Result of `page_cache_ref::acquire`.
struct page_acquire {
  nvme::status status;
  std::uint32_t slot = 0;
};

//! Trivially copyable device handle to a page cache.
struct page_cache_ref {
  std::uint8_t* data = nullptr;
  std::uint64_t* slots = nullptr;  //!< state word per slot
  std::uint8_t* clock = nullptr;   //!< reference bit per slot
  std::uint32_t* set_lock = nullptr;
  std::uint32_t* set_hand = nullptr;
  const backing_ref* backings = nullptr;
  unsigned long long* counters = nullptr; //!< [0] misses, [1] write-backs
  std::uint64_t nslots = 0;
  std::uint64_t nsets = 0;
  std::uint32_t ways = 0;
  std::uint32_t page_size = 0;
  std::uint32_t page_shift = 0;
  std::uint64_t timeout_ns = nvme::default_queue_timeout_ns;

  BAM_HD static std::uint64_t make_key(std::uint32_t backing, std::uint64_t page) {
    return (static_cast<std::uint64_t>(backing) << detail::key_page_bits) | page;
  }
  BAM_DEVICE std::uint8_t* page_data(std::uint32_t slot) const {
    return data + (static_cast<std::uint64_t>(slot) << page_shift);
  }

  //! Read (`write` false) or write the page of `key` from/to slot `slot`.
  BAM_DEVICE nvme::status page_io(std::uint64_t key, std::uint32_t slot, bool write,
                                  std::uint32_t* ctrl_out, std::uint64_t* lba_out) const {
    const backing_ref& b = backings[key >> detail::key_page_bits];
    const std::uint64_t p = key & detail::key_page_mask;
    const std::uint32_t c = b.controller_of(p);
    const std::uint64_t lba = b.lba_of(p);
    *ctrl_out = c;
    *lba_out = lba;
    const gpu::controller_ref& ctrl = b.ctrls[c];
    return ctrl.io(write ? nvme::nvm_opcode::write : nvme::nvm_opcode::read, lba, b.blocks_per_page,
                   b.data_bus[c], static_cast<std::uint64_t>(slot) << page_shift, ctrl.pick_queue());
  }

  //! While waiting on the cache, do the software controller's work for the
  //! queue this thread would use for `key` (GPU engine only): the loads being
  //! waited for are finished by waiting threads.
  BAM_DEVICE void help(std::uint64_t key) const {
    const backing_ref& b = backings[key >> detail::key_page_bits];
    const gpu::controller_ref& ctrl = b.ctrls[b.controller_of(key & detail::key_page_mask)];
    if (!ctrl.has_engine) return;
    const nvme::queue_pair_ref& q = ctrl.queues[ctrl.pick_queue()];
    ctrl.engine.serve(q.qid, [&] { q.poll(); });
  }

  BAM_DEVICE void release(std::uint32_t slot, std::uint32_t refs = 1) const {
    detail::dev_atomic<std::uint64_t>(slots[slot]).fetch_sub(refs, cuda::memory_order_release);
  }

  //! Take a reference on the page of `key`, loading it if needed. On success
  //! the page's data is at `page_data(slot)` until `release(slot)`. With
  //! `for_write` the page is marked dirty. A failure to get the page is
  //! returned (the caller records it, with the element index); a failed
  //! write-back of another page met on the way is recorded in `err`.
  BAM_DEVICE page_acquire acquire(std::uint64_t key, bool for_write, device_error_record* err) const;

private:
  BAM_DEVICE bool lock_set(std::uint64_t set, std::uint64_t deadline) const {
    detail::dev_atomic<std::uint32_t> l(set_lock[set]);
    for (;;) {
      std::uint32_t expected = 0;
      if (l.load(cuda::memory_order_relaxed) == 0 &&
          l.compare_exchange_strong(expected, 1, cuda::memory_order_acquire))
        return true;
      if (bam::detail::now_ns() > deadline) return false;
      bam::detail::relax(32);
    }
  }
  BAM_DEVICE void unlock_set(std::uint64_t set) const {
    detail::dev_atomic<std::uint32_t>(set_lock[set]).store(0, cuda::memory_order_release);
  }
  BAM_DEVICE static std::uint32_t slot_status_word(std::uint8_t* page) {
    return detail::dev_atomic<std::uint32_t>(*reinterpret_cast<std::uint32_t*>(page)).load(
        cuda::memory_order_relaxed);
  }
};
static_assert(std::is_trivially_copyable_v<page_cache_ref>);

BAM_DEVICE inline page_acquire page_cache_ref::acquire(std::uint64_t key, bool for_write,
                                                       device_error_record* err) const {
  using namespace detail;
  const std::uint64_t tag = key + 1;
  const std::uint64_t set = mix64(key) % nsets;
  const std::uint64_t base = set * ways;
  const std::uint64_t deadline = bam::detail::now_ns() + timeout_ns;
  page_acquire out;
  for (;;) {
    // 1. Look the page up and take a reference on it.
    std::int64_t found = -1;
    for (std::uint32_t w = 0; w < ways && found < 0; ++w) {
      dev_atomic<std::uint64_t> st(slots[base + w]);
      std::uint64_t word = st.load(cuda::memory_order_relaxed);
      while ((word >> slot_tag_shift) == tag) {
        if ((word & slot_ref_mask) == slot_ref_mask) { // saturated: wait for a release
          if (bam::detail::now_ns() > deadline) {
            out.status = nvme::status_timeout;
            return out;
          }
          bam::detail::relax(64);
          word = st.load(cuda::memory_order_relaxed);
          continue;
        }
        if (st.compare_exchange_weak(word, word + 1, cuda::memory_order_acquire)) {
          found = static_cast<std::int64_t>(base + w);
          break;
        }
      }
    }
    if (found >= 0) {
      const auto s = static_cast<std::uint32_t>(found);
      dev_atomic<std::uint64_t> st(slots[s]);
      std::uint64_t word = st.load(cuda::memory_order_acquire);
      while ((word & (slot_valid | slot_error)) == 0) { // another thread is loading it
        if (bam::detail::now_ns() > deadline) {
          release(s);
          out.status = nvme::status_timeout;
          return out;
        }
        help(key);
        bam::detail::relax(128);
        word = st.load(cuda::memory_order_acquire);
      }
      if (word & slot_error) {
        out.status = nvme::status(static_cast<std::uint16_t>(slot_status_word(page_data(s))));
        release(s);
        return out;
      }
      if (for_write && (word & slot_dirty) == 0) st.fetch_or(slot_dirty, cuda::memory_order_relaxed);
      if (reinterpret_cast<volatile std::uint8_t*>(clock)[s] == 0)
        reinterpret_cast<volatile std::uint8_t*>(clock)[s] = 1;
      out.slot = s;
      return out;
    }

    // 2. A miss: under the set's lock, look again, then claim a victim.
    if (!lock_set(set, deadline)) {
      out.status = nvme::status_timeout;
      return out;
    }
    bool present = false;
    for (std::uint32_t w = 0; w < ways; ++w)
      if ((dev_atomic<std::uint64_t>(slots[base + w]).load(cuda::memory_order_relaxed) >> slot_tag_shift) == tag)
        present = true;
    std::int64_t victim = -1, writeback = -1;
    if (!present) {
      dev_atomic<std::uint32_t> hand(set_hand[set]);
      std::int64_t dirty = -1;
      for (std::uint32_t i = 0; i < 2 * ways && victim < 0; ++i) {
        const std::uint64_t s = base + hand.fetch_add(1, cuda::memory_order_relaxed) % ways;
        dev_atomic<std::uint64_t> st(slots[s]);
        std::uint64_t word = st.load(cuda::memory_order_relaxed);
        if ((word & slot_ref_mask) != 0 || (word & slot_busy) != 0) continue;
        volatile std::uint8_t& ref_bit = reinterpret_cast<volatile std::uint8_t*>(clock)[s];
        if (ref_bit != 0) {
          ref_bit = 0;
          continue;
        }
        if ((word & slot_valid) && (word & slot_dirty)) {
          if (dirty < 0) dirty = static_cast<std::int64_t>(s);
          continue;
        }
        if (st.compare_exchange_strong(word, (tag << slot_tag_shift) | slot_busy | 1ull,
                                       cuda::memory_order_acq_rel))
          victim = static_cast<std::int64_t>(s);
      }
      if (victim < 0 && dirty >= 0) {
        // Write the dirty page back before its slot is reused; readers may
        // still hit it meanwhile (it stays valid), writers re-dirty it.
        dev_atomic<std::uint64_t> st(slots[dirty]);
        std::uint64_t word = st.load(cuda::memory_order_relaxed);
        if ((word & slot_ref_mask) == 0 && (word & slot_busy) == 0 && (word & slot_dirty) &&
            st.compare_exchange_strong(word, (word & ~slot_dirty) | slot_busy, cuda::memory_order_acq_rel))
          writeback = dirty;
      }
    }
    unlock_set(set);
    if (present) continue;

    if (victim >= 0) {
      const auto s = static_cast<std::uint32_t>(victim);
      dev_atomic<std::uint64_t> st(slots[s]);
      std::uint32_t ctrl = 0;
      std::uint64_t lba = 0;
      const nvme::status ios = page_io(key, s, false, &ctrl, &lba);
      if (counters != nullptr)
        dev_atomic<unsigned long long>(counters[0]).fetch_add(1, cuda::memory_order_relaxed);
      if (!ios.ok()) {
        detail::dev_atomic<std::uint32_t>(*reinterpret_cast<std::uint32_t*>(page_data(s)))
            .store(ios.raw, cuda::memory_order_relaxed);
        st.fetch_add(slot_error - slot_busy, cuda::memory_order_release);
        release(s);
        out.status = ios;
        return out;
      }
      st.fetch_add(slot_valid - slot_busy + (for_write ? slot_dirty : 0), cuda::memory_order_release);
      reinterpret_cast<volatile std::uint8_t*>(clock)[s] = 1;
      out.slot = s;
      return out;
    }
    if (writeback >= 0) {
      const auto s = static_cast<std::uint32_t>(writeback);
      dev_atomic<std::uint64_t> st(slots[s]);
      const std::uint64_t old_key = (st.load(cuda::memory_order_relaxed) >> slot_tag_shift) - 1;
      std::uint32_t ctrl = 0;
      std::uint64_t lba = 0;
      const nvme::status ios = page_io(old_key, s, true, &ctrl, &lba);
      if (counters != nullptr)
        dev_atomic<unsigned long long>(counters[1]).fetch_add(1, cuda::memory_order_relaxed);
      if (!ios.ok()) {
        if (err != nullptr) err->record(ios, false, 0, true, lba, ctrl);
        st.fetch_or(slot_dirty, cuda::memory_order_relaxed); // the data is still only here
      }
      st.fetch_and(~slot_busy, cuda::memory_order_release);
      if (!ios.ok()) {
        out.status = ios;
        return out;
      }
      continue;
    }
    // Every way is referenced or busy: help the loads along, then look again.
    help(key);
    if (bam::detail::now_ns() > deadline) {
      out.status = nvme::status_timeout;
      return out;
    }
    bam::detail::relax(256);
  }
}

namespace detail {

//! Write back every dirty page (of backing `only`, or of all if `only` is ~0u);
//! with `invalidate`, also forget the pages of that backing.
template <int = 0>
__global__ void cache_writeback_kernel(page_cache_ref c, std::uint32_t only, bool invalidate,
                                       device_error_record* err) {
  for (std::uint64_t s = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; s < c.nslots;
       s += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    dev_atomic<std::uint64_t> st(c.slots[s]);
    std::uint64_t word = st.load(cuda::memory_order_acquire);
    const std::uint64_t tag = word >> slot_tag_shift;
    if (tag == 0) continue;
    const std::uint64_t key = tag - 1;
    if (only != ~0u && (key >> key_page_bits) != only) continue;
    if ((word & slot_valid) && (word & slot_dirty) && (word & slot_busy) == 0) {
      if (st.compare_exchange_strong(word, (word & ~slot_dirty) | slot_busy, cuda::memory_order_acq_rel)) {
        std::uint32_t ctrl = 0;
        std::uint64_t lba = 0;
        const nvme::status ios = c.page_io(key, static_cast<std::uint32_t>(s), true, &ctrl, &lba);
        if (!ios.ok()) {
          err->record(ios, false, 0, true, lba, ctrl);
          st.fetch_or(slot_dirty, cuda::memory_order_relaxed);
        }
        st.fetch_and(~slot_busy, cuda::memory_order_release);
        if (c.counters != nullptr)
          dev_atomic<unsigned long long>(c.counters[1]).fetch_add(1, cuda::memory_order_relaxed);
      }
    }
    if (invalidate) {
      word = st.load(cuda::memory_order_acquire);
      if ((word & (slot_ref_mask | slot_busy | slot_dirty)) == 0) st.compare_exchange_strong(word, 0);
    }
  }
}

//! NVMe Flush of each controller in `ctrls`.
template <int = 0>
__global__ void flush_controllers_kernel(const gpu::controller_ref* ctrls, std::uint32_t n,
                                         device_error_record* err) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const nvme::status st = ctrls[i].flush();
  if (!st.ok()) err->record(st, false, 0, false, 0, i);
}

} // namespace detail

struct page_cache_config {
  std::size_t page_size = 4096;            //!< 512 B .. 64 KiB, power of two
  std::size_t capacity = 64ull << 20;      //!< bytes of GPU memory for page data
  std::uint32_t ways = 8;                  //!< slots per set
  std::uint64_t timeout_ns = nvme::default_queue_timeout_ns; //!< bound of every cache wait
};

//! Owning host object of a page cache in GPU memory.
class page_cache {
public:
  static constexpr std::size_t min_page_size = 512;
  static constexpr std::size_t max_page_size = 64 * 1024;

  explicit page_cache(const page_cache_config& cfg) : cfg_(cfg) {
    if (cfg.page_size < min_page_size || cfg.page_size > max_page_size || (cfg.page_size & (cfg.page_size - 1)))
      throw error("page_cache: page size must be a power of two in [512, 65536] (got " +
                  std::to_string(cfg.page_size) + ")");
    if (cfg.ways == 0) throw error("page_cache: ways must be at least 1");
    std::uint64_t nslots = cfg.capacity / cfg.page_size;
    nslots = nslots / cfg.ways * cfg.ways;
    if (nslots == 0)
      throw error("page_cache: capacity " + std::to_string(cfg.capacity) + " holds no set of " +
                  std::to_string(cfg.ways) + " pages of " + std::to_string(cfg.page_size) + " bytes");
    nslots_ = nslots;
    data_bytes_ = transport::round_up(nslots * cfg.page_size);
    BAM_CUDA_TRY(cudaMalloc(&data_raw_, data_bytes_ + dma_page_size));
    data_ = reinterpret_cast<std::uint8_t*>(
        (reinterpret_cast<std::uintptr_t>(data_raw_) + dma_page_size - 1) / dma_page_size * dma_page_size);
    BAM_CUDA_TRY(cudaMemset(data_, 0, data_bytes_));
    slots_ = gpu::device_buffer<std::uint64_t>(nslots);
    clock_ = gpu::device_buffer<std::uint8_t>(nslots);
    set_lock_ = gpu::device_buffer<std::uint32_t>(nslots / cfg.ways);
    set_hand_ = gpu::device_buffer<std::uint32_t>(nslots / cfg.ways);
    backings_ = gpu::device_buffer<backing_ref>(detail::max_backings);
    counters_ = gpu::device_buffer<unsigned long long>(2);
    host_backings_.resize(detail::max_backings);
    err_ = gpu::device_buffer<device_error_record>(1);
    unsigned p = 0;
    while ((std::size_t{1} << p) < cfg.page_size) ++p;
    page_shift_ = p;
  }

  ~page_cache() {
    if (data_raw_ != nullptr) BAM_CUDA_LOG(cudaFree(data_raw_));
  }
  page_cache(const page_cache&) = delete;
  page_cache& operator=(const page_cache&) = delete;

  page_cache_ref ref() const {
    page_cache_ref r;
    r.data = data_;
    r.slots = slots_.get();
    r.clock = clock_.get();
    r.set_lock = set_lock_.get();
    r.set_hand = set_hand_.get();
    r.backings = backings_.get();
    r.counters = counters_.get();
    r.nslots = nslots_;
    r.ways = cfg_.ways;
    r.nsets = nslots_ / cfg_.ways;
    r.page_size = static_cast<std::uint32_t>(cfg_.page_size);
    r.page_shift = page_shift_;
    r.timeout_ns = cfg_.timeout_ns;
    return r;
  }
  std::size_t page_size() const { return cfg_.page_size; }
  std::uint64_t slot_count() const { return nslots_; }
  //! GPU memory held by metadata (state words, clock bits, set locks and hands, backing table).
  std::size_t metadata_bytes() const {
    return nslots_ * (sizeof(std::uint64_t) + 1) + 2 * (nslots_ / cfg_.ways) * sizeof(std::uint32_t) +
           detail::max_backings * sizeof(backing_ref);
  }
  //! Misses (page loads) and write-backs so far.
  std::pair<std::uint64_t, std::uint64_t> counters() const {
    unsigned long long c[2] = {0, 0};
    gpu::copy_to_host(c, counters_.get(), 2);
    return {c[0], c[1]};
  }

  //! Attach `npages` pages starting at `start_lba` on every controller of `s`;
  //! returns the backing id used in page keys. Used by `bam::array`.
  std::uint32_t attach(const gpu::storage& s, std::uint64_t start_lba, std::uint64_t npages) {
    std::lock_guard lock(mutex_);
    if (cfg_.page_size % s.lba_size() != 0)
      throw error("page_cache: page size " + std::to_string(cfg_.page_size) + " is not a multiple of the LBA size " +
                  std::to_string(s.lba_size()) + " of " + s.name());
    const std::uint32_t bpp = static_cast<std::uint32_t>(cfg_.page_size / s.lba_size());
    const std::uint64_t per_ctrl_pages = (npages + s.controller_count() - 1) / s.controller_count();
    if (npages > detail::key_page_mask || start_lba > s.blocks_per_controller() ||
        per_ctrl_pages * bpp > s.blocks_per_controller() - start_lba) {
      error_context c;
      c.controller = s.name();
      c.lba = start_lba;
      c.status = nvme::status_out_of_range;
      throw error("page_cache: " + std::to_string(npages) + " pages of " + std::to_string(cfg_.page_size) +
                      " bytes from LBA " + std::to_string(start_lba) + " do not fit on " +
                      std::to_string(s.controller_count()) + " controller(s) of " +
                      std::to_string(s.blocks_per_controller()) + " blocks",
                  c);
    }
    std::uint32_t id = 0;
    while (id < detail::max_backings && host_backings_[id].nctrl != 0) ++id;
    if (id == detail::max_backings) throw error("page_cache: too many arrays attached (255)");
    auto it = mappings_.find(&s);
    if (it == mappings_.end()) it = mappings_.emplace(&s, mapping_entry{s.map(data_, data_bytes_), 0}).first;
    ++it->second.users;
    backing_ref b;
    b.ctrls = s.device_refs();
    b.data_bus = it->second.map->bus_tables();
    b.start_lba = start_lba;
    b.npages = npages;
    b.nctrl = s.controller_count();
    b.blocks_per_page = bpp;
    host_backings_[id] = b;
    owners_[id] = &s;
    gpu::copy_to_device(backings_.get() + id, &b, 1);
    return id;
  }

  //! Write back and forget the pages of backing `id`, then free the id.
  //! No kernel may use the backing meanwhile.
  void detach(std::uint32_t id) {
    std::lock_guard lock(mutex_);
    if (id >= detail::max_backings || host_backings_[id].nctrl == 0) return;
    run_writeback(id, true);
    const gpu::storage* s = owners_[id];
    host_backings_[id] = backing_ref{};
    owners_.erase(id);
    gpu::copy_to_device(backings_.get() + id, &host_backings_[id], 1);
    auto it = mappings_.find(s);
    if (it != mappings_.end() && --it->second.users == 0) mappings_.erase(it);
    throw_if_recorded(err_.get(), "page cache write-back on detach failed", s->name());
  }

  //! Write back every dirty page, then NVMe Flush every controller involved.
  //! Call between kernels. Throws `bam::error` on a failure.
  void flush() {
    std::lock_guard lock(mutex_);
    run_writeback(~0u, false);
    for (auto& [s, m] : mappings_) {
      detail::flush_controllers_kernel<><<<1, 32>>>(s->device_refs(), s->controller_count(), err_.get());
      BAM_CUDA_TRY(cudaGetLastError());
      BAM_CUDA_TRY(cudaDeviceSynchronize());
    }
    throw_if_recorded(err_.get(), "page cache flush failed", "");
  }

private:
  void run_writeback(std::uint32_t only, bool invalidate) {
    const unsigned threads = 256;
    const unsigned blocks = static_cast<unsigned>(std::min<std::uint64_t>((nslots_ + threads - 1) / threads, 4096));
    detail::cache_writeback_kernel<><<<blocks, threads>>>(ref(), only, invalidate, err_.get());
    BAM_CUDA_TRY(cudaGetLastError());
    BAM_CUDA_TRY(cudaDeviceSynchronize());
  }

  struct mapping_entry {
    std::unique_ptr<gpu::storage_mapping> map;
    std::uint32_t users = 0;
  };
  page_cache_config cfg_;
  std::uint64_t nslots_ = 0;
  std::size_t data_bytes_ = 0;
  void* data_raw_ = nullptr;
  std::uint8_t* data_ = nullptr;
  unsigned page_shift_ = 0;
  gpu::device_buffer<std::uint64_t> slots_;
  gpu::device_buffer<std::uint8_t> clock_;
  gpu::device_buffer<std::uint32_t> set_lock_;
  gpu::device_buffer<std::uint32_t> set_hand_;
  gpu::device_buffer<backing_ref> backings_;
  gpu::device_buffer<unsigned long long> counters_;
  gpu::device_buffer<device_error_record> err_;
  std::vector<backing_ref> host_backings_;
  std::map<std::uint32_t, const gpu::storage*> owners_;
  std::map<const gpu::storage*, mapping_entry> mappings_;
  std::mutex mutex_;
};

} // namespace bam
