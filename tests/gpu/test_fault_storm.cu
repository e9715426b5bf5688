// SPDX-License-Identifier: MIT
// A fault storm: 100,000+ GPU threads read and write a bam::array through a
// cache smaller than the data while a host thread keeps changing the
// software controllers' fault rules: error statuses on random queues, LBAs
// and opcodes, delayed completions, latency spikes, pauses. What must hold:
//  - every kernel ends (bounded wall time);
//  - every failure a kernel meets is counted by the record `check()`
//    reports, exactly where the kernel can tell (a read yields T{}), within
//    bounds where it cannot (a write whose read-back failed);
//  - every failed write command is reported as a failed write-back;
//  - every read that succeeds returns a value written for that element, no
//    older than the last write the element is known to have taken;
//  - once the faults are gone, a flush succeeds, the media holds what the
//    cache holds, and a full write + flush + read-back round is exact.
// Element i holds value_of(i, v): the version v (a round number) in the high
// word and a hash of (i, v) in the low one; a device-side shadow keeps, per
// element, the range of versions it may hold.
//
// BAM_STORM_SECONDS sets the duration of the default runs (20 s over the GPU
// engine, a third of it over the CPU engine); the [long] case runs 300 s and
// 100 s unless BAM_STORM_SECONDS says otherwise. BAM_STORM_SEED repeats a run;
// BAM_STORM_ROUND_BOUND_S sets how long a round may take before it counts as
// a hang (the cache's state is then printed).
#include "test_util.cuh"

#include <catch2/catch_test_macros.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using elem = std::uint64_t;

// ---- values, versions and the shadow ----------------------------------------

__host__ __device__ std::uint32_t elem_hash(std::uint64_t i, std::uint32_t version) {
  return static_cast<std::uint32_t>(bam_test::rnd(i * 0x100000001b3ull ^ (std::uint64_t{version} << 40)));
}
//! What element i holds after the write of round `version` (never 0: versions start at 1).
__host__ __device__ elem value_of(std::uint64_t i, std::uint32_t version) {
  return (elem{version} << 32) | elem_hash(i, version);
}
__host__ __device__ std::uint32_t version_of(elem x) { return static_cast<std::uint32_t>(x >> 32); }
//! x is a value some round wrote for element i.
__host__ __device__ bool is_value_of(elem x, std::uint64_t i) {
  const std::uint32_t v = version_of(x);
  return v != 0 && static_cast<std::uint32_t>(x) == elem_hash(i, v);
}

//! Per element: versions [lo, hi] it may hold, packed as lo | hi << 16.
__host__ __device__ std::uint32_t shadow_of(std::uint32_t lo, std::uint32_t hi) { return lo | (hi << 16); }
__host__ __device__ std::uint32_t shadow_lo(std::uint32_t s) { return s & 0xffffu; }
__host__ __device__ std::uint32_t shadow_hi(std::uint32_t s) { return s >> 16; }
constexpr std::uint32_t max_rounds = 0xfff0; // versions fit the shadow's 16 bits

//! Thread slot j's element in a write round: a bijection of [0, n) (n a power of two).
constexpr std::uint64_t scatter_mul = 0x9e3779b97f4a7c15ull; // odd
constexpr std::uint64_t scatter_add = 0x5bd1e995ull;
constexpr std::uint64_t inverse_mod_2_64(std::uint64_t a) {
  std::uint64_t x = a; // Newton's iteration doubles the correct low bits each step
  for (int k = 0; k < 6; ++k)
    x *= 2 - a * x;
  return x;
}
constexpr std::uint64_t scatter_inv = inverse_mod_2_64(scatter_mul);
static_assert(scatter_mul * scatter_inv == 1);
__host__ __device__ std::uint64_t scatter(std::uint64_t j, std::uint64_t n) {
  return (j * scatter_mul + scatter_add) & (n - 1);
}
__host__ __device__ std::uint64_t unscatter(std::uint64_t i, std::uint64_t n) {
  return ((i - scatter_add) * scatter_inv) & (n - 1);
}

// ---- the round kernel -------------------------------------------------------

//! What one round does. In a write round (version != 0) each writer thread
//! writes `per_thread` elements (thread t's k-th: scatter(write_base + t *
//! per_thread + k)) and reads each back; one warp in `reader_one_in` reads
//! instead. In a read round every warp reads.
struct round_plan {
  std::uint32_t version = 0;
  std::uint32_t per_thread = 4;
  std::uint32_t reader_one_in = 4;
  std::uint32_t elem_shift = 9; //!< log2(elements per page)
  std::uint64_t write_base = 0;
  std::uint64_t threads = 0;     //!< threads of the round, on every GPU together
  std::uint64_t thread_base = 0; //!< this GPU's first thread among them
  std::uint64_t seed = 0;
  std::uint32_t copy_len = 1200; //!< elements of a reader warp's range copy
};

struct storm_counters {
  unsigned long long reads;          //!< element reads (read-backs included)
  unsigned long long writes;         //!< element writes
  unsigned long long copied_pages;   //!< pages of range copies
  unsigned long long read_failures;  //!< element reads that failed, one per group of lanes on a page
  unsigned long long copy_failures;  //!< pages of range copies that failed
  unsigned long long lost_writes;    //!< groups whose write failed (the read-back shows the earlier value)
  unsigned long long unknown_writes; //!< groups whose read-back failed (the write may have failed too)
  unsigned long long bad;            //!< values no write produced, or older than allowed
  unsigned long long first_bad_index;
  unsigned long long first_bad_value;
  unsigned long long first_bad_shadow;
};

__device__ bool reader_warp(const round_plan& p, std::uint64_t warp) {
  return p.version == 0 || bam_test::rnd(p.seed ^ (warp * 0x2545f4914f6cdd1dull)) % p.reader_one_in == 0;
}

//! Element i is written in this round (by a writer warp).
__device__ bool written_now(const round_plan& p, std::uint64_t i, std::uint64_t n) {
  if (p.version == 0) return false;
  const std::uint64_t d = (unscatter(i, n) - p.write_base) & (n - 1);
  if (d >= p.threads * p.per_thread) return false;
  return !reader_warp(p, d / p.per_thread / 32);
}

__device__ void note_bad(storm_counters* c, unsigned long long& bad, std::uint64_t i, elem x, std::uint32_t s) {
  if (bad++ == 0 && atomicCAS(&c->first_bad_index, ~0ull, static_cast<unsigned long long>(i)) == ~0ull) {
    c->first_bad_value = x;
    c->first_bad_shadow = s;
  }
}

//! A value read from element i is one it may hold now.
__device__ bool allowed(const round_plan& p, const std::uint32_t* shadow, std::uint64_t i, elem x, std::uint64_t n,
                        std::uint32_t& s) {
  s = shadow[i];
  if (!is_value_of(x, i)) return false;
  const std::uint32_t v = version_of(x);
  if (v >= shadow_lo(s) && v <= shadow_hi(s)) return true;
  return v == p.version && written_now(p, i, n);
}

// Every lane of every warp runs the same number of accesses, the warp
// converged at each (__syncwarp): the lanes on one page form the same groups
// here as in the runtime, which groups the lanes active at the call.
__global__ void storm_round_kernel(bam::array_ref<elem> a, round_plan p, const std::uint32_t* shadow,
                                   std::uint32_t* next_shadow, elem* scratch, storm_counters* c) {
  constexpr unsigned full = 0xffffffffu;
  const std::uint64_t local = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  const std::uint64_t t = p.thread_base + local; // numbered across the GPUs of the round
  const std::uint64_t warp = t / 32;
  const unsigned lane = threadIdx.x % 32;
  const std::uint64_t n = a.size();
  unsigned long long reads = 0, writes = 0, pages = 0, read_failures = 0, copy_failures = 0, lost = 0, unknown = 0,
                     bad = 0;
  if (!reader_warp(p, warp)) {
    for (std::uint32_t k = 0; k < p.per_thread; ++k) {
      const std::uint64_t i = scatter(p.write_base + t * p.per_thread + k, n);
      __syncwarp();
      a.write(i, value_of(i, p.version));
      __syncwarp();
      const elem x = a[i];
      ++writes;
      ++reads;
      const unsigned peers = __match_any_sync(full, i >> p.elem_shift);
      const unsigned leader = __ffs(peers) - 1;
      const std::uint32_t s = shadow[i];
      bool lost_here = false;
      if (x == 0) {
        // The read-back failed: the write may or may not have happened.
        next_shadow[i] = shadow_of(shadow_lo(s), p.version);
      } else if (is_value_of(x, i) && version_of(x) == p.version) {
        next_shadow[i] = shadow_of(p.version, p.version);
      } else if (is_value_of(x, i) && version_of(x) >= shadow_lo(s) && version_of(x) <= shadow_hi(s)) {
        lost_here = true; // the write failed; the element kept an earlier value
        next_shadow[i] = shadow_of(version_of(x), version_of(x));
      } else {
        note_bad(c, bad, i, x, s);
      }
      // A group shares one cache reference: its lanes fail or succeed together.
      const bool failed_here = x == 0;
      if (__shfl_sync(full, failed_here, leader) != failed_here || __shfl_sync(full, lost_here, leader) != lost_here)
        note_bad(c, bad, i, x, s);
      if (lane == leader) {
        read_failures += failed_here;
        unknown += failed_here;
        lost += lost_here;
      }
    }
  } else {
    for (std::uint32_t k = 0; k < p.per_thread; ++k) {
      const std::uint64_t i = bam_test::rnd(p.seed ^ (t * 0x9e3779b1ull + k)) & (n - 1);
      __syncwarp();
      const elem x = a[i];
      ++reads;
      const unsigned peers = __match_any_sync(full, i >> p.elem_shift);
      const unsigned leader = __ffs(peers) - 1;
      std::uint32_t s = 0;
      if (x != 0 && !allowed(p, shadow, i, x, n, s)) note_bad(c, bad, i, x, s);
      if (__shfl_sync(full, x == 0, leader) != (x == 0)) note_bad(c, bad, i, x, s);
      if (lane == leader) read_failures += x == 0;
    }
    // A range copy across pages, every other reader warp.
    if (bam_test::rnd(p.seed + warp) & 1) {
      const std::uint64_t begin = bam_test::rnd(p.seed ^ (warp << 20)) % (n - p.copy_len);
      elem* out = scratch + local / 32 * p.copy_len;
      __syncwarp();
      a.copy_to(begin, p.copy_len, out);
      __syncwarp();
      const std::uint64_t per_page = 1ull << p.elem_shift;
      for (std::uint64_t pg = begin >> p.elem_shift; pg <= (begin + p.copy_len - 1) >> p.elem_shift; ++pg) {
        const std::uint64_t lo = pg * per_page > begin ? pg * per_page : begin;
        const std::uint64_t hi = (pg + 1) * per_page < begin + p.copy_len ? (pg + 1) * per_page : begin + p.copy_len;
        unsigned zeros = 0;
        for (std::uint64_t i = lo + lane; i < hi; i += 32) {
          const elem x = out[i - begin];
          std::uint32_t s = 0;
          if (x == 0)
            ++zeros;
          else if (!allowed(p, shadow, i, x, n, s))
            note_bad(c, bad, i, x, s);
        }
        zeros = __reduce_add_sync(full, zeros);
        // A page is copied whole or not at all.
        if (zeros != 0 && zeros != hi - lo && lane == 0) note_bad(c, bad, lo, 0, 0);
        if (lane == 0) {
          ++pages;
          copy_failures += zeros == hi - lo;
        }
      }
      __syncwarp();
    }
  }
  atomicAdd(&c->reads, reads);
  atomicAdd(&c->writes, writes);
  if (pages) atomicAdd(&c->copied_pages, pages);
  if (read_failures) atomicAdd(&c->read_failures, read_failures);
  if (copy_failures) atomicAdd(&c->copy_failures, copy_failures);
  if (lost) atomicAdd(&c->lost_writes, lost);
  if (unknown) atomicAdd(&c->unknown_writes, unknown);
  if (bad) atomicAdd(&c->bad, bad);
}

//! The pages a whole-array kernel visits: every `stride`-th one (1: all).
struct page_sample {
  std::uint32_t elem_shift = 0; //!< log2(elements per page)
  std::uint64_t stride = 1;
  //! How many elements of an n-element array the sample holds.
  __host__ __device__ std::uint64_t count(std::uint64_t n) const {
    const std::uint64_t per_page = 1ull << elem_shift;
    return ((n / per_page + stride - 1) / stride) * per_page;
  }
  //! Its k-th element.
  __host__ __device__ std::uint64_t element(std::uint64_t k) const {
    return ((k >> elem_shift) * stride << elem_shift) | (k & ((1ull << elem_shift) - 1));
  }
  __host__ __device__ bool holds(std::uint64_t i) const { return (i >> elem_shift) % stride == 0; }
};

//! Every sampled element i with (i / 8) % parts == part: with several parts
//! (GPUs) every page is written by all of them.
__global__ void write_all_kernel(bam::array_ref<elem> a, std::uint32_t version, unsigned part = 0, unsigned parts = 1,
                                 page_sample sample = {}) {
  const std::uint64_t count = sample.count(a.size());
  for (std::uint64_t k = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; k < count;
       k += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    const std::uint64_t i = sample.element(k);
    if ((i / 8) % parts == part) a.write(i, value_of(i, version));
  }
}

//! Every sampled element through the cache equals `want[i]`.
__global__ void compare_all_kernel(bam::array_ref<elem> a, const elem* want, storm_counters* c,
                                   page_sample sample = {}) {
  unsigned long long bad = 0, reads = 0;
  const std::uint64_t count = sample.count(a.size());
  for (std::uint64_t k = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; k < count;
       k += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    const std::uint64_t i = sample.element(k);
    const elem x = a[i];
    ++reads;
    if (x != want[i]) note_bad(c, bad, i, x, 0);
  }
  atomicAdd(&c->reads, reads);
  if (bad) atomicAdd(&c->bad, bad);
}

// ---- host side ---------------------------------------------------------------

//! Adds the counts of `c` (not the first bad value) to `to`.
void add_counts(storm_counters& to, const storm_counters& c) {
  to.reads += c.reads;
  to.writes += c.writes;
  to.copied_pages += c.copied_pages;
  to.read_failures += c.read_failures;
  to.copy_failures += c.copy_failures;
  to.lost_writes += c.lost_writes;
  to.unknown_writes += c.unknown_writes;
  to.bad += c.bad;
}

struct device_storm_counters {
  bam::device_buffer<storm_counters> buf{1};
  device_storm_counters() { reset(); }
  void reset() {
    storm_counters c{};
    c.first_bad_index = ~0ull;
    bam::copy_to_device(buf.get(), &c, 1);
  }
  storm_counters get() const {
    storm_counters c{};
    bam::copy_to_host(&c, buf.get(), 1);
    return c;
  }
};

//! The cache of the storm that runs now, for the state dump of a hang.
const bam::page_cache* storm_cache = nullptr;

//! What the cache's sets and slots look like while a kernel hangs (copied on
//! a stream of its own while the kernel runs): the sets with misses waiting
//! for their turn, and what their slots hold.
void dump_cache_state(const bam::page_cache& cache) {
  using namespace bam::detail;
  const bam::page_cache_ref r = cache.ref();
  const std::uint64_t nslots = r.slot_count(), nsets = ref_access::set_count(r);
  const std::uint32_t ways = r.ways();
  std::vector<std::uint64_t> words(nslots), words0(nslots);
  std::vector<cache_set> sets(nsets), sets0(nsets);
  cudaStream_t s = nullptr;
  // Two snapshots a second apart: what still moves (a slow set) and what does not (a stuck one).
  auto snapshot = [&](std::vector<std::uint64_t>& w, std::vector<cache_set>& c) {
    return cudaMemcpyAsync(w.data(), ref_access::slots(r), w.size() * 8, cudaMemcpyDeviceToHost, s) == cudaSuccess &&
           cudaMemcpyAsync(c.data(), ref_access::sets(r), c.size() * sizeof(cache_set), cudaMemcpyDeviceToHost, s) ==
               cudaSuccess &&
           cudaStreamSynchronize(s) == cudaSuccess;
  };
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess || !snapshot(words0, sets0) ||
      (std::this_thread::sleep_for(std::chrono::seconds(1)), !snapshot(words, sets))) {
    std::fprintf(stderr, "  (the cache's state could not be read)\n");
    return;
  }
  unsigned long long sets_moved = 0, slots_moved = 0, doomed = 0;
  for (std::uint64_t set = 0; set < nsets; ++set) {
    sets_moved += sets[set].serving != sets0[set].serving;
    doomed += sets[set].doomed;
  }
  for (std::uint64_t k = 0; k < nslots; ++k)
    slots_moved += slot_progress_bits(words[k]) != slot_progress_bits(words0[k]);
  std::fprintf(stderr, "  in one second: %llu sets passed a turn, %llu slots changed state; %llu turns still doomed\n",
               sets_moved, slots_moved, doomed);
  unsigned long long waiting_sets = 0, waiters = 0, max_queue = 0;
  unsigned long long pinned = 0, busy = 0, lost = 0, valid = 0, dirty = 0, wb_failed = 0, error = 0, empty = 0;
  unsigned shown = 0;
  for (std::uint64_t set = 0; set < nsets; ++set) {
    const std::uint32_t q = sets[set].next - sets[set].serving;
    if (q == 0) continue;
    ++waiting_sets;
    waiters += q;
    max_queue = std::max<unsigned long long>(max_queue, q);
    for (std::uint32_t w = 0; w < ways; ++w) {
      const std::uint64_t x = words[set * ways + w];
      pinned += (x & slot_pin_mask) != 0;
      busy += (x & slot_busy) != 0;
      lost += slot_lost(x);
      valid += (x & slot_valid) != 0;
      dirty += (x & slot_dirty) != 0;
      wb_failed += (x & slot_wb_failed) != 0;
      error += (x & slot_error) != 0;
      empty += (x >> slot_tag_shift) == 0;
    }
    if (shown++ < 4) {
      std::fprintf(stderr, "  set %llu: %u waiting (next %u, serving %u, a second ago %u), hand %u; slots:",
                   static_cast<unsigned long long>(set), q, sets[set].next, sets[set].serving, sets0[set].serving,
                   sets[set].hand);
      for (std::uint32_t w = 0; w < ways; ++w) {
        const std::uint64_t x = words[set * ways + w];
        std::fprintf(stderr, " [pins %llu%s%s%s%s%s%s]", static_cast<unsigned long long>(x & slot_pin_mask),
                     x & slot_valid ? " valid" : "", x & slot_busy ? " busy" : "", x & slot_dirty ? " dirty" : "",
                     x & slot_error ? " error" : "", x & slot_wb_failed ? " wb_failed" : "",
                     x >> slot_tag_shift ? "" : " empty");
      }
      std::fprintf(stderr, "\n");
    }
  }
  std::fprintf(stderr,
               "  cache: %llu slots in %llu sets; %llu sets with %llu misses waiting for their turn (longest %llu); "
               "their slots: %llu pinned, %llu busy, %llu lost, %llu valid, %llu dirty, %llu write-back failed, "
               "%llu error, %llu empty\n",
               static_cast<unsigned long long>(nslots), static_cast<unsigned long long>(nsets), waiting_sets, waiters,
               max_queue, pinned, busy, lost, valid, dirty, wb_failed, error, empty);
  cudaStreamDestroy(s);
}

//! A kernel (or flush) that does not end within `seconds` is a hang: the
//! process cannot go on (its resources are in use), so it stops here, loudly.
void require_finishes(cudaStream_t stream, double seconds, const std::string& what) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) BAM_CUDA_TRY(e);
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) {
      std::fprintf(stderr, "FAILED: %s did not finish within %.0f s: the GPU runtime hangs\n", what.c_str(), seconds);
      if (storm_cache != nullptr) dump_cache_state(*storm_cache);
      std::fflush(stderr);
      std::abort();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

//! The count in "(N failures recorded on the device; ...", or 0 if absent.
unsigned long long recorded_count(const std::string& what) {
  const auto pos = what.find(" recorded on the device");
  if (pos == std::string::npos) return 0;
  auto open = what.rfind('(', pos);
  if (open == std::string::npos) return 0;
  return std::strtoull(what.c_str() + open + 1, nullptr, 10);
}

//! What check() and flush() reported.
struct reports {
  unsigned long long access = 0;    //!< failures of element accesses and range copies
  unsigned long long writeback = 0; //!< failed write-backs
  unsigned long long flush = 0;     //!< failed NVMe Flush commands (when flush() threw that one)
  unsigned long long throws = 0;
  std::vector<bam::nvme::status> statuses; //!< status of each reported first failure
};

//! Call check() until it stops throwing; sort what it threw into `r`.
//! Returns the access failures reported by this call.
unsigned long long drain_check(bam::array<elem>& a, cudaStream_t stream, reports& r) {
  unsigned long long access = 0;
  for (int k = 0; k < 3; ++k) {
    try {
      a.check(stream);
      return access;
    } catch (const bam::error& e) {
      const std::string w = e.what();
      INFO(w);
      const unsigned long long n = recorded_count(w);
      REQUIRE(n > 0);
      ++r.throws;
      if (e.status()) r.statuses.push_back(*e.status());
      if (w.find("bam::array access failed") != std::string::npos) {
        access += n;
        r.access += n;
      } else if (w.find("page cache write-back failed") != std::string::npos) {
        r.writeback += n;
      } else {
        FAIL("check() threw something else: " << w);
      }
    }
  }
  FAIL("check() kept throwing after the array's and the cache's records were reported");
  return access;
}

//! Host view of the array on the media: element i of page p lives on
//! controller p % nctrl at byte (p / nctrl) * page_size + (i % per_page) * 8.
std::vector<elem> read_array_from_media(const bam::storage& s, std::uint64_t n, std::size_t page) {
  const std::uint32_t nctrl = s.controller_count();
  const std::uint64_t per_page = page / sizeof(elem);
  const std::uint64_t pages = n / per_page;
  std::vector<elem> out(n);
  std::vector<elem> buf((pages + nctrl - 1) / nctrl * per_page);
  for (std::uint32_t c = 0; c < nctrl; ++c) {
    bam::emu::read_media(s, c, 0, buf.data(), buf.size() * sizeof(elem));
    for (std::uint64_t p = c; p < pages; p += nctrl)
      std::memcpy(&out[p * per_page], &buf[(p / nctrl) * per_page], page);
  }
  return out;
}
void write_array_to_media(const bam::storage& s, const std::vector<elem>& v, std::size_t page) {
  const std::uint32_t nctrl = s.controller_count();
  const std::uint64_t per_page = page / sizeof(elem);
  const std::uint64_t pages = v.size() / per_page;
  std::vector<elem> buf((pages + nctrl - 1) / nctrl * per_page);
  for (std::uint32_t c = 0; c < nctrl; ++c) {
    for (std::uint64_t p = c; p < pages; p += nctrl)
      std::memcpy(&buf[(p / nctrl) * per_page], &v[p * per_page], page);
    bam::emu::write_media(s, c, 0, buf.data(), buf.size() * sizeof(elem));
  }
}

// ---- the host thread that changes the fault rules ----------------------------

enum class fault_kind : int { read_error, write_error, flush_error, delay, drop, kinds };
const char* const kind_names[] = {"read errors", "write errors", "flush errors", "delays", "drops"};

//! Statuses the rules complete commands with.
const bam::nvme::status injected_statuses[] = {
    {bam::nvme::status_type::media_error, bam::nvme::media_status::unrecovered_read_error},
    {bam::nvme::status_type::media_error, bam::nvme::media_status::write_fault},
    {bam::nvme::status_type::media_error, bam::nvme::media_status::access_denied, true},
    {bam::nvme::status_type::generic, bam::nvme::generic_status::internal_error},
    {bam::nvme::status_type::generic, bam::nvme::generic_status::data_transfer_error},
    {bam::nvme::status_type::generic, bam::nvme::generic_status::namespace_not_ready},
    {bam::nvme::status_type::generic, bam::nvme::generic_status::aborted_power_loss, true},
};
bool injected(bam::nvme::status st) {
  for (const auto& x : injected_statuses)
    if (x == st) return true;
  return false;
}
bool deadline_status(bam::nvme::status st) {
  return st == bam::nvme::status_timeout || st == bam::nvme::status_queue_broken || st == bam::nvme::status_queue_full;
}

//! What the storm may do.
struct storm_profile {
  std::uint64_t timeout_ns = 0;      //!< the deadline of the storage and the cache
  std::uint64_t max_delay_ns = 0;    //!< delayed completions: up to this late
  std::uint64_t max_spike_ns = 0;    //!< latency added to every completion for a while (0: none)
  std::uint64_t max_pause_ns = 0;    //!< the controller stops answering for up to this long (0: never)
  bool drops = false;                //!< commands fetched and never completed
  std::uint64_t max_slow_count = 40; //!< a delay or drop rule acts at most this often
  //! Shares (percent) of the changes: error rules, delay/drop rules, latency
  //! spikes, pauses; the rest retires rules that have fired their count.
  unsigned error_share = 45, slow_share = 30, spike_share = 10, pause_share = 7;
  std::chrono::milliseconds pauses_after{0}; //!< no pause before this much of the storm
  std::chrono::milliseconds max_gap{8};      //!< between two changes
};

class fault_storm {
public:
  //! A storm on every controller of `storages` (one per GPU on a shared medium, or one).
  fault_storm(const std::vector<const bam::storage*>& storages, storm_profile p, std::uint64_t seed,
              std::uint64_t lba_span)
      : io_queues_(storages.front()->spec().io_queues), p_(p), rng_(seed), lba_span_(lba_span) {
    for (const bam::storage* s : storages)
      for (std::uint32_t c = 0; c < s->controller_count(); ++c)
        ctrls_.push_back(&bam::emu::software_controller(*s, c));
  }
  ~fault_storm() { stop(); }

  void start() {
    th_ = std::thread([this] { run(); });
  }
  //! Stop changing rules; remove every rule, pause and spike (counts kept).
  void stop() {
    stop_ = true;
    if (th_.joinable()) th_.join();
    harvest();
    for (auto* c : ctrls_) {
      c->faults().set_paused(false);
      c->faults().set_global_latency_ns(0);
    }
  }
  //! Remove every rule, adding what each fired to the counts. Exact when no
  //! command is in flight (between kernels).
  void harvest() {
    std::lock_guard lock(m_);
    for (const auto& r : live_) {
      fired_[static_cast<int>(r.kind)] += ctrls_[r.ctrl]->faults().fired(r.id);
      ctrls_[r.ctrl]->faults().remove(r.id);
    }
    live_.clear();
  }
  std::uint64_t fired(fault_kind k) const {
    std::lock_guard lock(m_);
    return fired_[static_cast<int>(k)];
  }
  std::string summary() const {
    std::lock_guard lock(m_);
    std::string out = std::to_string(rules_added_) + " rules; fired:";
    for (int k = 0; k < static_cast<int>(fault_kind::kinds); ++k)
      out += std::string(k ? "," : "") + " " + kind_names[k] + " " + std::to_string(fired_[k]);
    out += "; " + std::to_string(spikes_) + " latency spikes, " + std::to_string(pauses_) + " pauses (" +
           std::to_string(paused_ns_ / 1'000'000) + " ms)";
    return out;
  }

private:
  struct live_rule {
    std::uint32_t ctrl;
    bam::emu::fault_injector::rule_id id;
    fault_kind kind;
    std::uint64_t count;
  };

  std::uint64_t pick(std::uint64_t lo, std::uint64_t hi) { return lo + rng_() % (hi - lo + 1); }

  void run() {
    const auto t0 = std::chrono::steady_clock::now();
    while (!stop_) {
      const auto action = pick(0, 99);
      const unsigned slow = p_.error_share + p_.slow_share, spikes = slow + p_.spike_share,
                     pauses = spikes + p_.pause_share;
      if (action < p_.error_share)
        add_rule(false);
      else if (action < slow)
        add_rule(true);
      else if (action < spikes)
        spike();
      else if (action < pauses) {
        if (std::chrono::steady_clock::now() - t0 >= p_.pauses_after) pause();
      } else
        retire_exhausted();
      std::this_thread::sleep_for(std::chrono::microseconds(pick(500, 1000 * p_.max_gap.count())));
    }
  }

  void add_rule(bool slow) {
    std::lock_guard lock(m_);
    const auto c = static_cast<std::uint32_t>(pick(0, ctrls_.size() - 1));
    std::size_t on_ctrl = 0;
    for (const auto& r : live_)
      on_ctrl += r.ctrl == c;
    if (on_ctrl >= bam::emu::max_fault_rules - 4) return;
    bam::emu::fault_rule r;
    fault_kind kind;
    const auto op = pick(0, 9);
    using bam::nvme::nvm_opcode;
    if (op < 5)
      r.opcode = static_cast<std::uint8_t>(nvm_opcode::read);
    else if (op < 9)
      r.opcode = static_cast<std::uint8_t>(nvm_opcode::write);
    else
      r.opcode = static_cast<std::uint8_t>(nvm_opcode::flush);
    if (pick(0, 1)) r.qid = static_cast<std::uint16_t>(pick(1, io_queues_));
    if (r.opcode != static_cast<std::uint8_t>(nvm_opcode::flush) && pick(0, 2) != 0) {
      // Commands that carry no LBA never match a narrowed range.
      static constexpr std::uint64_t spans[] = {8, 64, 512, 4096};
      r.lba_first = pick(0, lba_span_ - 1);
      r.lba_last = r.lba_first + spans[pick(0, 3)] - 1;
    }
    r.skip = pick(0, 3);
    // Now and then a rule that stays until the round ends: on a narrow LBA range only.
    r.count = r.lba_last - r.lba_first < 4096 && pick(0, 4) == 0 ? 0 : pick(1, 40);
    if (!slow) {
      r.action = bam::emu::fault_action::fail;
      r.status = injected_statuses[pick(0, std::size(injected_statuses) - 1)];
      kind = r.opcode == static_cast<std::uint8_t>(nvm_opcode::read)    ? fault_kind::read_error
             : r.opcode == static_cast<std::uint8_t>(nvm_opcode::write) ? fault_kind::write_error
                                                                        : fault_kind::flush_error;
    } else if (p_.drops && pick(0, 3) == 0) {
      r.action = bam::emu::fault_action::drop;
      r.count = pick(1, p_.max_slow_count);
      kind = fault_kind::drop;
    } else {
      r.action = bam::emu::fault_action::delay;
      r.latency_ns = pick(50'000, p_.max_delay_ns);
      if (r.count == 0 || r.count > p_.max_slow_count) r.count = pick(1, p_.max_slow_count);
      kind = fault_kind::delay;
    }
    live_.push_back({c, ctrls_[c]->faults().add(r), kind, r.count});
    ++rules_added_;
  }

  //! Rules that fired `count` times never fire again: their count is final.
  void retire_exhausted() {
    std::lock_guard lock(m_);
    for (auto it = live_.begin(); it != live_.end();) {
      const std::uint64_t f = it->count != 0 ? ctrls_[it->ctrl]->faults().fired(it->id) : 0;
      if (it->count != 0 && f >= it->count) {
        fired_[static_cast<int>(it->kind)] += f;
        ctrls_[it->ctrl]->faults().remove(it->id);
        it = live_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void spike() {
    if (p_.max_spike_ns == 0) return;
    auto* c = ctrls_[pick(0, ctrls_.size() - 1)];
    const std::uint64_t ns = pick(10'000, p_.max_spike_ns);
    c->faults().set_global_latency_ns(ns);
    std::this_thread::sleep_for(std::chrono::milliseconds(pick(2, 40)));
    c->faults().set_global_latency_ns(0);
    std::lock_guard lock(m_);
    ++spikes_;
  }

  void pause() {
    if (p_.max_pause_ns == 0) return;
    auto* c = ctrls_[pick(0, ctrls_.size() - 1)];
    const std::uint64_t ns = pick(p_.max_pause_ns / 10, p_.max_pause_ns);
    c->faults().set_paused(true);
    std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
    c->faults().set_paused(false);
    std::lock_guard lock(m_);
    ++pauses_;
    paused_ns_ += ns;
  }

  std::uint32_t io_queues_;
  storm_profile p_;
  std::vector<bam::emu::emulated_controller*> ctrls_;
  std::mt19937_64 rng_;
  std::uint64_t lba_span_;
  mutable std::mutex m_;
  std::vector<live_rule> live_;
  std::uint64_t fired_[static_cast<int>(fault_kind::kinds)] = {};
  std::uint64_t rules_added_ = 0, spikes_ = 0, pauses_ = 0, paused_ns_ = 0;
  std::atomic<bool> stop_{false};
  std::thread th_;
};

// ---- one storm ----------------------------------------------------------------

struct storm_config {
  std::string device; //!< device string (ssds, queues, depth, timeout)
  std::size_t page = 4096;
  std::size_t cache_bytes = 8 << 20;
  std::uint64_t n = 4ull << 20; //!< elements (a power of two)
  unsigned blocks = 1024, threads_per_block = 128;
  std::uint32_t per_thread = 4;
  std::uint32_t copy_len = 1200;
  double seconds = 20;
  int gpus = 1; //!< > 1: a storage per GPU on one shared medium (`device` names it), one cache over all
  //! After the storm, the whole-array read-backs and writes visit every
  //! this-many-th page (> 1 keeps them short under a sanitizer).
  std::uint64_t sample_stride = 1;
  storm_profile profile;
  bool past_deadline = false; //!< faults outlast the deadline: queues break, recovery is not promised
};

double seconds_from_env(double fallback) {
  const char* e = std::getenv("BAM_STORM_SECONDS");
  if (e == nullptr || *e == 0) return fallback;
  const double s = std::atof(e);
  return s > 0 ? s : fallback;
}
std::uint64_t seed_from_env() {
  const char* e = std::getenv("BAM_STORM_SEED");
  if (e != nullptr && *e != 0) return std::strtoull(e, nullptr, 0);
  return std::random_device{}() * 0x100000001ull ^
         static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}

class stream_owner {
public:
  stream_owner() { BAM_CUDA_TRY(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~stream_owner() { BAM_CUDA_LOG(cudaStreamDestroy(s_)); }
  operator cudaStream_t() const { return s_; }
  operator cuda::stream_ref() const { return s_; }

private:
  cudaStream_t s_ = nullptr;
};

//! Launch a kernel's worth of work and wait for it within the bound.
template <class Launch>
void run_bounded(cudaStream_t stream, double bound_s, const std::string& what, Launch&& launch) {
  launch();
  BAM_CUDA_TRY(cudaGetLastError());
  require_finishes(stream, bound_s, what);
  BAM_CUDA_TRY(cudaStreamSynchronize(stream));
}

void run_storm(const storm_config& k) {
  const std::uint64_t seed = seed_from_env();
  const int gpus = k.gpus;
  INFO(k.device << " on " << gpus << " GPU(s), seed " << seed << " (BAM_STORM_SEED repeats it)");
  // A storage per GPU on one medium; one cache over all of them (slots on
  // each GPU, one copy of a page) when there are several.
  std::vector<std::optional<bam::storage>> storages(static_cast<std::size_t>(gpus));
  std::vector<const bam::storage*> all;
  for (int g = 0; g < gpus; ++g) {
    storages[static_cast<std::size_t>(g)].emplace(k.device, bam::storage_options{.device = g});
    all.push_back(&*storages[static_cast<std::size_t>(g)]);
  }
  const bam::storage& s = *storages[0];
  REQUIRE(s.controller_count() >= 1);
  REQUIRE((k.n & (k.n - 1)) == 0);
  const std::uint64_t per_page = k.page / sizeof(elem);
  std::uint32_t elem_shift = 0;
  while ((1ull << elem_shift) < per_page)
    ++elem_shift;
  const std::uint64_t threads = std::uint64_t{k.blocks} * k.threads_per_block; // on each GPU
  const std::uint64_t all_threads = threads * static_cast<std::uint64_t>(gpus);
  // The kernels' write set is a part of the array; rounds move it along.
  REQUIRE(all_threads * k.per_thread <= k.n);

  // Version 1 everywhere, through the media.
  std::vector<elem> initial(k.n);
  for (std::uint64_t i = 0; i < k.n; ++i)
    initial[i] = value_of(i, 1);
  write_array_to_media(s, initial, k.page);

  std::vector<std::unique_ptr<stream_owner>> streams;
  for (int g = 0; g < gpus; ++g) {
    const bam::device_scope on(g);
    streams.push_back(std::make_unique<stream_owner>());
  }
  bam::page_cache_config cc{.page_size = k.page, .capacity = k.cache_bytes, .timeout_ns = k.profile.timeout_ns};
  if (gpus > 1)
    for (int g = 0; g < gpus; ++g)
      cc.devices.push_back(g);
  bam::page_cache cache(cc);
  if (gpus > 1) { // slots on every GPU
    REQUIRE(cache.run_slots() * static_cast<std::uint64_t>(gpus - 1) < cache.slot_count());
    for (int g = 0; g < gpus; ++g)
      REQUIRE(cache.slot_device(static_cast<std::uint64_t>(g) * cache.run_slots()) == g);
  }
  std::vector<std::optional<bam::array<elem>>> arrays(static_cast<std::size_t>(gpus));
  for (int g = 0; g < gpus; ++g)
    arrays[static_cast<std::size_t>(g)].emplace(cache, *storages[static_cast<std::size_t>(g)], k.n, 0,
                                                *streams[static_cast<std::size_t>(g)]);
  auto array_on = [&](int g) -> bam::array<elem>& { return *arrays[static_cast<std::size_t>(g)]; };
  auto stream_on = [&](int g) -> cudaStream_t { return *streams[static_cast<std::size_t>(g)]; };
  REQUIRE(k.cache_bytes < k.n * sizeof(elem)); // evictions and write-backs all along
  // The shadow lives on GPU 0; the other GPUs reach it as peers.
  std::optional<bam::device_buffer<std::uint32_t>> shadow_, next_shadow_;
  {
    const bam::device_scope on(0);
    shadow_.emplace(k.n);
    next_shadow_.emplace(k.n);
    std::vector<std::uint32_t> init(k.n, shadow_of(1, 1));
    bam::copy_to_device(shadow_->get(), init.data(), k.n);
    bam::copy_to_device(next_shadow_->get(), init.data(), k.n);
  }
  bam::device_buffer<std::uint32_t>& shadow = *shadow_;
  bam::device_buffer<std::uint32_t>& next_shadow = *next_shadow_;
  std::vector<std::unique_ptr<bam::device_buffer<elem>>> scratch;
  std::vector<std::unique_ptr<device_storm_counters>> dcs;
  for (int g = 0; g < gpus; ++g) {
    const bam::device_scope on(g);
    scratch.push_back(std::make_unique<bam::device_buffer<elem>>(threads / 32 * k.copy_len));
    dcs.push_back(std::make_unique<device_storm_counters>());
  }
  auto reset_counters = [&] {
    for (auto& d : dcs)
      d->reset();
  };
  //! What the kernels of every GPU counted.
  auto counted = [&] {
    storm_counters sum{};
    sum.first_bad_index = ~0ull;
    for (auto& d : dcs) {
      const storm_counters c = d->get();
      if (c.bad != 0 && sum.bad == 0) {
        sum.first_bad_index = c.first_bad_index;
        sum.first_bad_value = c.first_bad_value;
        sum.first_bad_shadow = c.first_bad_shadow;
      }
      add_counts(sum, c);
    }
    return sum;
  };

  // A warp may wait for a deadline several times over (a miss, a
  // write-back, its turn, for each of its accesses), and the warps that are
  // not resident wait for those that are; past this bound the kernel hangs.
  const char* bound_env = std::getenv("BAM_STORM_ROUND_BOUND_S");
  const double kernel_bound_s = bound_env != nullptr && std::atof(bound_env) > 0
                                    ? std::atof(bound_env)
                                    : std::max(120.0, 30 * static_cast<double>(k.profile.timeout_ns) * 1e-9);
  //! Launch on every GPU at once, then wait for each within the bound.
  auto on_gpus = [&](const std::string& what, auto&& launch) {
    for (int g = 0; g < gpus; ++g) {
      const bam::device_scope on(g);
      launch(g, stream_on(g));
      BAM_CUDA_TRY(cudaGetLastError());
    }
    for (int g = 0; g < gpus; ++g) {
      const bam::device_scope on(g);
      require_finishes(stream_on(g), kernel_bound_s, gpus > 1 ? what + " on GPU " + std::to_string(g) : what);
      BAM_CUDA_TRY(cudaStreamSynchronize(stream_on(g)));
    }
  };
  // Wide enough for the whole-array kernels to be quick under a sanitizer too.
  const unsigned all_blocks = std::max(k.blocks, 1024u);
  const page_sample sample{elem_shift, k.sample_stride};
  const std::uint64_t sampled = sample.count(k.n);
  storm_cache = &cache;
  struct forget_cache {
    ~forget_cache() { storm_cache = nullptr; }
  } forget;
  const std::uint64_t lba_span =
      (k.n / per_page + s.controller_count() - 1) / s.controller_count() * (k.page / s.lba_size());
  fault_storm storm(all, k.profile, seed, lba_span);

  storm_counters total{};
  reports rep;
  unsigned long long seen_failures = 0;    // failures the kernels saw for sure
  unsigned long long unknown_failures = 0; // writes that may have failed unseen
  std::uint64_t rounds = 0, write_rounds = 0, flushes = 0, failed_flushes = 0;
  std::uint64_t fired_flush_before = 0;
  std::uint32_t version = 1;
  std::mt19937_64 rng(seed ^ 0x5eed);
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  auto read_plan = [&] {
    round_plan p;
    p.per_thread = k.per_thread;
    p.elem_shift = elem_shift;
    p.threads = all_threads;
    p.seed = rng();
    p.copy_len = k.copy_len;
    return p;
  };
  auto run_round = [&](const round_plan& p, const std::string& what) {
    reset_counters();
    on_gpus(what, [&](int g, cudaStream_t stream) {
      round_plan here = p;
      here.thread_base = threads * static_cast<std::uint64_t>(g);
      storm_round_kernel<<<k.blocks, k.threads_per_block, 0, stream>>>(
          array_on(g).ref(), here, shadow.get(), next_shadow.get(), scratch[static_cast<std::size_t>(g)]->get(),
          dcs[static_cast<std::size_t>(g)]->buf.get());
    });
    return counted();
  };
  auto drain_all = [&](reports& r) {
    unsigned long long n = 0;
    for (int g = 0; g < gpus; ++g)
      n += drain_check(array_on(g), stream_on(g), r);
    return n;
  };

  storm.start();
  while ((elapsed() < k.seconds || rounds < 2) && version < max_rounds) {
    round_plan p = read_plan();
    p.write_base = rng() & (k.n - 1);
    const bool writing = (rng() & 1) != 0;
    if (writing) p.version = ++version;
    const storm_counters c = run_round(p, "storm round " + std::to_string(rounds));
    INFO("round " << rounds << (writing ? " (writing version " + std::to_string(p.version) + ")" : " (reading)"));
    INFO("first bad index " << c.first_bad_index << ": value " << c.first_bad_value << " (version "
                            << (c.first_bad_value >> 32) << "), allowed versions " << shadow_lo(c.first_bad_shadow)
                            << ".." << shadow_hi(c.first_bad_shadow));
    REQUIRE(c.bad == 0);
    CHECK(c.reads == all_threads * k.per_thread);
    if (writing) {
      // Every writer's read-back settled the range of versions its element may hold.
      const bam::device_scope on(0);
      BAM_CUDA_TRY(cudaMemcpyAsync(shadow.get(), next_shadow.get(), k.n * sizeof(std::uint32_t),
                                   cudaMemcpyDeviceToDevice, stream_on(0)));
      BAM_CUDA_TRY(cudaStreamSynchronize(stream_on(0)));
      ++write_rounds;
    }

    // What the kernels saw against what check() reports.
    const unsigned long long seen = c.read_failures + c.copy_failures + c.lost_writes;
    const unsigned long long reported = drain_all(rep);
    INFO("failures seen by the kernels: " << c.read_failures << " reads, " << c.copy_failures << " copied pages, "
                                          << c.lost_writes << " writes; read-backs that failed " << c.unknown_writes
                                          << "; reported " << reported);
    // Each failure the kernel saw is one record (one per group of lanes on a
    // page); a write whose read-back failed as well may be one more. In a
    // round that only reads, the two are equal.
    CHECK(reported >= seen);
    CHECK(reported <= seen + c.unknown_writes);
    seen_failures += seen;
    unknown_failures += c.unknown_writes;
    add_counts(total, c);

    // A flush now and then, with the storm going on (from each GPU in turn).
    bool flush_threw = false;
    if (rounds % 3 == 2) {
      ++flushes;
      const auto f0 = std::chrono::steady_clock::now();
      try {
        cache.flush(stream_on(static_cast<int>(flushes % static_cast<std::uint64_t>(gpus))));
      } catch (const bam::error& e) {
        const std::string w = e.what();
        INFO(w);
        const unsigned long long n = recorded_count(w);
        CHECK(n > 0);
        ++failed_flushes;
        flush_threw = true;
        if (e.status()) rep.statuses.push_back(*e.status());
        if (w.find("write-back failed") != std::string::npos)
          rep.writeback += n;
        else if (w.find("NVMe Flush failed") != std::string::npos)
          rep.flush += n;
        else
          FAIL("flush() threw something else: " << w);
      }
      CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - f0).count() < kernel_bound_s);
    }

    // No command is in flight now: the rules' counts are exact.
    storm.harvest();
    INFO("write-backs reported failed " << rep.writeback << ", write errors injected "
                                        << storm.fired(fault_kind::write_error));
    if (!k.past_deadline) {
      // Write commands come from write-backs only, and each failed one is
      // reported (by check() or flush()) exactly once.
      CHECK(rep.writeback == storm.fired(fault_kind::write_error));
    } else {
      // Past the deadline a write-back may also time out.
      CHECK(rep.writeback >= storm.fired(fault_kind::write_error));
    }
    // Flush commands come from flush() only: one that a rule failed in this
    // round made this round's flush() throw (the NVMe Flush failure itself,
    // unless a failed write-back came first).
    if (storm.fired(fault_kind::flush_error) != fired_flush_before) CHECK(flush_threw);
    CHECK(rep.flush <= storm.fired(fault_kind::flush_error));
    fired_flush_before = storm.fired(fault_kind::flush_error);
    // Each read error a rule injected fails the access that asked for the
    // page (and every access that waited for the same load).
    CHECK(rep.access >= storm.fired(fault_kind::read_error));
    ++rounds;
  }
  storm.stop();
  const double storm_s = elapsed();

  // Which failures were reported: the rules' statuses, a refusal of a set
  // whose every page failed to be written back (Write Fault), and past the
  // deadline the runtime's own timeouts.
  for (const auto st : rep.statuses) {
    INFO("reported status " << bam::nvme::status_name(st) << " (0x" << std::hex << st.code() << ")");
    if (k.past_deadline)
      CHECK((injected(st) || deadline_status(st)));
    else
      CHECK(injected(st));
  }
  if (!k.past_deadline) {
    CHECK(rep.access >= seen_failures);
    CHECK(rep.access <= seen_failures + unknown_failures);
  }

  std::printf("fault storm over %s on %d GPU(s) (seed %llu):\n"
              "  %llu rounds (%llu writing) in %.1f s; %llu element reads, %llu element writes, "
              "%llu pages copied\n"
              "  failures seen by kernels: %llu reads, %llu copied pages, %llu writes (+%llu "
              "read-backs failed);\n"
              "  reported by check(): %llu access failures, %llu failed write-backs; flush(): %llu "
              "of %llu threw "
              "(%llu NVMe Flush failures)\n"
              "  storm: %s\n",
              k.device.c_str(), gpus, static_cast<unsigned long long>(seed), static_cast<unsigned long long>(rounds),
              static_cast<unsigned long long>(write_rounds), storm_s, total.reads, total.writes, total.copied_pages,
              total.read_failures, total.copy_failures, total.lost_writes, total.unknown_writes, rep.access,
              rep.writeback, static_cast<unsigned long long>(failed_flushes), static_cast<unsigned long long>(flushes),
              rep.flush, storm.summary().c_str());
  std::fflush(stdout);

  if (k.past_deadline) {
    // Queues that timed out stay broken (their command ids may still
    // complete): the cache keeps failing there, but fast, and whatever
    // reached the media is a value some write produced for that element.
    reports after;
    const auto f0 = std::chrono::steady_clock::now();
    try {
      cache.flush(stream_on(0));
    } catch (const bam::error& e) {
      INFO(e.what());
      CHECK(recorded_count(e.what()) > 0);
    }
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - f0).count() < kernel_bound_s);
    const std::vector<elem> media = read_array_from_media(s, k.n, k.page);
    std::uint64_t bad = 0;
    for (std::uint64_t i = 0; i < k.n; ++i)
      if (!is_value_of(media[i], i) || version_of(media[i]) > version) ++bad;
    CHECK(bad == 0);
    const storm_counters c = run_round(read_plan(), "read round after the storm");
    CHECK(c.bad == 0);
    CHECK(drain_all(after) == c.read_failures + c.copy_failures);
    return;
  }

  // Every GPU reads every element through the cache and finds `want`.
  auto compare_all = [&](const std::vector<elem>& want_host, const std::string& what) {
    std::vector<std::unique_ptr<bam::device_buffer<elem>>> want;
    for (int g = 0; g < gpus; ++g) {
      const bam::device_scope on(g);
      want.push_back(std::make_unique<bam::device_buffer<elem>>(k.n));
      bam::copy_to_device(want.back()->get(), want_host.data(), k.n);
    }
    reset_counters();
    on_gpus(what, [&](int g, cudaStream_t stream) {
      compare_all_kernel<<<all_blocks, k.threads_per_block, 0, stream>>>(
          array_on(g).ref(), want[static_cast<std::size_t>(g)]->get(), dcs[static_cast<std::size_t>(g)]->buf.get(),
          sample);
    });
    for (int g = 0; g < gpus; ++g)
      REQUIRE_NOTHROW(array_on(g).check(stream_on(g)));
    const storm_counters c = counted();
    INFO(what << ": first element read wrong " << c.first_bad_index);
    CHECK(c.reads == sampled * static_cast<std::uint64_t>(gpus));
    CHECK(c.bad == 0);
  };

  // The faults are gone: the cache works again. A flush writes back every
  // page whose write-back failed, after which the media holds what the
  // cache holds, and each element a version its shadow allows.
  for (int g = 0; g < gpus; ++g)
    REQUIRE_NOTHROW(array_on(g).check(stream_on(g)));
  REQUIRE_NOTHROW(cache.flush(stream_on(0)));
  std::vector<elem> media = read_array_from_media(s, k.n, k.page);
  std::vector<std::uint32_t> sh(k.n);
  bam::copy_to_host(sh.data(), shadow.get(), k.n);
  std::uint64_t bad = 0, first_bad = ~0ull;
  for (std::uint64_t i = 0; i < k.n; ++i) {
    const std::uint32_t v = version_of(media[i]);
    if (!is_value_of(media[i], i) || v < shadow_lo(sh[i]) || v > shadow_hi(sh[i])) {
      if (bad++ == 0) first_bad = i;
    }
  }
  INFO("first bad element on the media " << first_bad);
  CHECK(bad == 0);
  compare_all(media, "read-back of every element after the storm");

  // A full round: every element written (the GPUs' elements interleaved
  // within each page), flushed once, read back through the cache by every
  // GPU and from the media.
  const std::uint32_t last = ++version;
  on_gpus("writing every element after the storm", [&](int g, cudaStream_t stream) {
    write_all_kernel<<<all_blocks, k.threads_per_block, 0, stream>>>(array_on(g).ref(), last, static_cast<unsigned>(g),
                                                                     static_cast<unsigned>(gpus), sample);
  });
  for (int g = 0; g < gpus; ++g)
    REQUIRE_NOTHROW(array_on(g).check(stream_on(g)));
  const std::uint64_t writebacks_before = cache.counters().writebacks;
  REQUIRE_NOTHROW(cache.flush(stream_on(gpus - 1)));
  // Every written page reaches the media (by an eviction or the flush): the
  // flush writes those the cache still holds, once, and leaves nothing dirty.
  const std::uint64_t written_pages = sampled / per_page;
  const std::uint64_t written_back = cache.counters().writebacks - writebacks_before;
  INFO("pages written " << written_pages << ", written back since " << written_back);
  CHECK(written_back >= std::min(written_pages, k.cache_bytes / k.page) / 2);
  // A sample that fills a sixteenth of the cache stays in it: each page once.
  if (written_pages <= k.cache_bytes / k.page / 16) CHECK(written_back == written_pages);
  REQUIRE_NOTHROW(cache.flush(stream_on(0)));
  CHECK(cache.counters().writebacks == writebacks_before + written_back);
  for (std::uint64_t i = 0; i < k.n; ++i)
    if (sample.holds(i)) media[i] = value_of(i, last);
  compare_all(media, "reading every element after the storm");
  const std::vector<elem> flushed = read_array_from_media(s, k.n, k.page);
  bad = 0;
  for (std::uint64_t i = 0; i < k.n; ++i)
    bad += flushed[i] != media[i];
  CHECK(bad == 0);
}

//! The storm the runtime promises to come out of: errors, and delays and
//! pauses well inside the deadline.
storm_profile recoverable(std::uint64_t timeout_ns) {
  storm_profile p;
  p.timeout_ns = timeout_ns;
  p.max_delay_ns = 20'000'000;
  p.max_spike_ns = 5'000'000;
  p.max_pause_ns = 50'000'000;
  return p;
}

storm_config gpu_engine_storm(double seconds) {
  storm_config k;
  k.device = "emu-gpu:hbm=64M,ssds=2,queues=64,depth=128,timeout=5s";
  k.seconds = seconds;
  k.profile = recoverable(5'000'000'000ull);
  return k; // 131,072 threads, 32 MiB of data through an 8 MiB cache
}
storm_config cpu_engine_storm(double seconds) {
  storm_config k;
  k.device = "emu:ram=64M,ssds=2,queues=32,depth=64,threads=4,timeout=5s";
  k.seconds = seconds;
  k.profile = recoverable(5'000'000'000ull);
  k.n = 2ull << 20; // 16 MiB of data through a 4 MiB cache
  k.cache_bytes = 4 << 20;
  k.blocks = 512;
  k.per_thread = 2;
  return k;
}

} // namespace

TEST_CASE("fault storm over the GPU engine: every failure reported, every read right, the cache recovers",
          "[gpu][storm]") {
  run_storm(gpu_engine_storm(seconds_from_env(20)));
}

TEST_CASE("fault storm over the CPU engine for GPU clients", "[gpu][storm]") {
  run_storm(cpu_engine_storm(seconds_from_env(20) / 3));
}

TEST_CASE("fault storm past the deadline: dropped commands, late completions, a controller that "
          "stops answering",
          "[gpu][storm]") {
  storm_config k;
  k.device = "emu-gpu:hbm=64M,ssds=2,queues=64,depth=128,timeout=300ms";
  k.seconds = 8;
  k.past_deadline = true;
  k.profile.timeout_ns = 300'000'000ull;
  k.profile.max_delay_ns = 900'000'000ull; // some complete well after the deadline
  k.profile.max_spike_ns = 5'000'000;
  k.profile.max_pause_ns = 700'000'000ull; // some pauses outlast it
  k.profile.drops = true;
  k.profile.max_slow_count = 2;
  // Each late or dropped command breaks its queue for good (its command id
  // may still complete): few of them, and the controller stops answering
  // only in the last part, so that much of the storm still gets through.
  k.profile.error_share = 60;
  k.profile.slow_share = 10;
  k.profile.pause_share = 2;
  k.profile.pauses_after = std::chrono::milliseconds(5000);
  k.profile.max_gap = std::chrono::milliseconds(40);
  // The runtime's teardown reports the pages it could not write back
  // (their queues broke): expected here, counted instead of printed.
  std::atomic<unsigned> warnings{0};
  bam::set_warning_handler([&](const std::string&) { ++warnings; });
  try {
    run_storm(k);
  } catch (...) {
    bam::set_warning_handler(nullptr);
    throw;
  }
  bam::set_warning_handler(nullptr);
  std::printf("  teardown warnings (pages left unwritten on broken queues): %u\n", warnings.load());
  // The process goes on: a new storage works.
  bam::storage s("emu-gpu:hbm=16M,queues=8,depth=32");
  bam::page_cache cache({.page_size = 4096, .capacity = 1 << 20});
  bam::array<elem> a(cache, s, (4ull << 20) / sizeof(elem));
  stream_owner stream;
  run_bounded(stream, 60, "writing after the storm", [&] { write_all_kernel<<<64, 128, 0, stream>>>(a.ref(), 7); });
  REQUIRE_NOTHROW(a.check(stream));
  REQUIRE_NOTHROW(cache.flush(stream));
  std::vector<elem> want(a.size());
  for (std::uint64_t i = 0; i < a.size(); ++i)
    want[i] = value_of(i, 7);
  bam::device_buffer<elem> w(a.size());
  bam::copy_to_device(w.get(), want.data(), a.size());
  device_storm_counters dc;
  run_bounded(stream, 60, "reading after the storm",
              [&] { compare_all_kernel<<<64, 128, 0, stream>>>(a.ref(), w.get(), dc.buf.get()); });
  REQUIRE_NOTHROW(a.check(stream));
  CHECK(dc.get().reads == a.size());
  CHECK(dc.get().bad == 0);
}

TEST_CASE("fault storm, small, for the sanitizers", "[gpu][storm][sanitize]") {
  storm_config k;
  k.device = "emu-gpu:hbm=4M,ssds=2,queues=8,depth=32,timeout=20s";
  k.page = 4096;
  k.cache_bytes = 64 << 10; // 16 pages for 256
  k.n = 128ull << 10;       // 1 MiB
  k.blocks = 4;
  k.threads_per_block = 64;
  k.per_thread = 2;
  k.copy_len = 700;
  k.seconds = 2;
  // Errors and short delays only: under a sanitizer the host's changes may
  // wait for the kernel, and a pause would then outlast the deadline.
  k.profile.timeout_ns = 20'000'000'000ull;
  k.profile.max_delay_ns = 2'000'000;
  k.profile.max_gap = std::chrono::milliseconds(20);
  run_storm(k);
}

namespace {

//! Two GPUs, each with a storage of its own on one shared medium, reading
//! and writing one array through one cache over both, the storm on all four
//! controllers. 512-byte pages, a 256 MiB cache (64 runs of 2 MiB on each
//! GPU), the array twice that.
storm_config two_gpu_storm(double seconds, const std::string& shm_name) {
  storm_config k;
  k.gpus = 2;
  k.device = "emu-gpu:shm=" + shm_name + ",size=256M,ssds=2,queues=64,depth=128,timeout=5s,unlink";
  k.page = 512;
  k.cache_bytes = 256ull << 20;
  k.n = 64ull << 20; // 512 MiB
  k.seconds = seconds;
  k.profile = recoverable(5'000'000'000ull);
  return k; // 131,072 threads on each GPU
}

//! A shared-memory name of this process's own (`unlink`: gone with its last user).
std::string storm_shm_name() {
  static int serial = 0;
  return "test-storm-" + std::to_string(::getpid()) + "-" + std::to_string(serial++);
}

bool two_peer_gpus() {
  int n = 0;
  BAM_CUDA_TRY(cudaGetDeviceCount(&n));
  if (n < 2) return false;
  int ab = 0, ba = 0;
  BAM_CUDA_TRY(cudaDeviceCanAccessPeer(&ab, 0, 1));
  BAM_CUDA_TRY(cudaDeviceCanAccessPeer(&ba, 1, 0));
  return ab != 0 && ba != 0;
}

} // namespace

TEST_CASE("fault storm over two GPUs writing and reading one array through one cache over both",
          "[gpu][storm][node-cache]") {
  if (!two_peer_gpus()) SKIP("this test needs 2 GPUs with peer access");
  run_storm(two_gpu_storm(seconds_from_env(20) / 2, storm_shm_name()));
}

TEST_CASE("fault storm over two GPUs, small, for the sanitizers", "[gpu][storm][node-cache][sanitize]") {
  if (!two_peer_gpus()) SKIP("this test needs 2 GPUs with peer access");
  const std::string name = storm_shm_name();
  storm_config k = two_gpu_storm(2, name);
  k.device = "emu-gpu:shm=" + name + ",size=256M,ssds=2,queues=8,depth=32,timeout=20s,unlink";
  k.blocks = 4;
  k.threads_per_block = 64;
  k.per_thread = 2;
  k.copy_len = 700;
  k.sample_stride = 64; // whole-array passes over 16,384 pages, not a million
  k.profile = storm_profile{};
  k.profile.timeout_ns = 20'000'000'000ull;
  k.profile.max_delay_ns = 2'000'000;
  k.profile.max_gap = std::chrono::milliseconds(20);
  run_storm(k);
}

TEST_CASE("fault storm, several minutes", "[.long][storm]") {
  run_storm(gpu_engine_storm(seconds_from_env(300)));
  run_storm(cpu_engine_storm(seconds_from_env(300) / 3));
}
