// SPDX-License-Identifier: MIT
// Kernels of the block benchmark: bam's paths (raw queues, array element
// access, readers, range copies) and the ceilings measured next to them
// (zero-copy gather from pinned host memory, gather inside HBM). Every kernel
// checks the data it reads against a pattern derived from the address alone.
#pragma once

#include "pattern.hpp"

#ifdef BAM_BENCH_WITHOUT_GPU_ENGINE_HOOK
// The cache kernels as a program over real controllers compiles them: none
// of the software controller's device code (block_bench_real_controller:
// its kernels' registers and code size against the full build's). The
// software controller's engines are registered on the host, but their
// commands need the device hook and are refused in these kernels.
#define BAM_WITHOUT_SOFTWARE_CONTROLLER
#include <bam/bam.cuh>

#include <bam/emu.hpp>
#include <bam/emu/client_engine.cuh>
#include <bam/emu/gpu_engine.cuh>
#else
#include <bam/bam.cuh>
#endif

#include <cstdint>

namespace bench {

__device__ inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

//! Log-scale latency histogram: 4 buckets per power of two from 64 ns.
constexpr int latency_buckets = 128;
__host__ __device__ inline int latency_bucket(std::uint64_t ns) {
  if (ns < 64) return 0;
  int b = 63 - __builtin_clzll(ns); // floor(log2)
  const int sub = static_cast<int>((ns >> (b - 2)) & 3);
  const int idx = (b - 6) * 4 + sub;
  return idx < latency_buckets - 1 ? idx : latency_buckets - 1;
}
//! Lower bound of bucket `i` in ns.
inline double latency_bucket_ns(int i) {
  const int b = i / 4 + 6, sub = i % 4;
  return static_cast<double>(1ull << b) * (1.0 + sub / 4.0);
}

struct stats {
  unsigned long long ops;    //!< commands (raw) or page visits (array modes)
  unsigned long long bad;    //!< words that differed from the pattern
  unsigned long long errors; //!< failed commands / accesses
  unsigned long long hist[latency_buckets];
  unsigned long long unpinned; //!< page mode: handles that held no page (their reads went through a[i])
};

struct workload {
  std::uint64_t span_units = 0; //!< units (commands / pages) the accesses range over
  std::uint32_t unit_bytes = 0; //!< command size (raw) or page size (array)
  std::uint32_t ops_per_thread = 0;
  std::uint32_t read_percent = 100;
  std::uint32_t sequential = 0;
  std::uint32_t sample_shift = 3; //!< one latency sample per 2^shift operations
  std::uint64_t seed = 1;
  std::uint32_t verify = 1;
  std::uint32_t verify_all = 0; //!< range mode: check every word copied (default: the first of every 512 bytes)
};

//! The op is a read: from the low 32 bits of its hash (the unit comes from
//! the high ones).
__device__ inline bool is_read(const workload& w, std::uint64_t h) {
  return w.read_percent >= 100 || static_cast<std::uint32_t>(h) % 100u < w.read_percent;
}
//! The unit (command or page) of an op. Random: the high bits of its hash
//! scaled to [0, span_units) with one multiply. A 64-bit modulo is a call of
//! about a hundred instructions on a GPU, which a warp that handles one page
//! at a time would wait through on every op.
__device__ inline std::uint64_t unit_of(const workload& w, std::uint64_t id, std::uint64_t op, std::uint64_t total_ids,
                                        std::uint64_t h) {
  if (w.sequential) return (op * total_ids + id) % w.span_units;
  return __umul64hi(h, w.span_units);
}

// ---- raw queues ---------------------------------------------------------------

//! Every thread issues `ops_per_thread` commands of `unit_bytes` through the
//! queues of the controllers (a controller per command, by hash), into its own
//! slot of a mapped buffer. Writes write the pattern back, so reads stay checkable.
__global__ void raw_kernel(const bam::queue_set_ref* ctrls, std::uint32_t nctrl, const std::uint64_t* const* bus,
                           std::uint8_t* buf, std::uint64_t slots, workload w, bool data, stats* st) {
  const std::uint64_t tid = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  const std::uint64_t nthreads = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint64_t slot = tid % slots;
  std::uint8_t* mine = buf + slot * w.unit_bytes;
  unsigned long long ops = 0, bad = 0, errors = 0;
  for (std::uint32_t op = 0; op < w.ops_per_thread; ++op) {
    const std::uint64_t h = mix(w.seed ^ (tid * 0x100000001b3ull + op));
    const std::uint32_t c = static_cast<std::uint32_t>((h >> 20) % nctrl);
    const bam::queue_set_ref& q = ctrls[c];
    const std::uint64_t unit = unit_of(w, tid, op, nthreads, h) % (q.blocks() * q.lba_size() / w.unit_bytes);
    const std::uint32_t nblocks = w.unit_bytes / q.lba_size();
    const std::uint64_t lba = unit * nblocks;
    const bool rd = is_read(w, h);
    if (!rd && data)
      for (std::uint32_t k = 0; k < w.unit_bytes / 4; ++k)
        reinterpret_cast<std::uint32_t*>(mine)[k] = pattern_word(c, unit * w.unit_bytes + 4ull * k);
    const std::uint64_t t0 = bam::detail::now_ns();
    const bam::nvme::status s = q.io(rd ? bam::nvme::nvm_opcode::read : bam::nvme::nvm_opcode::write, lba, nblocks,
                                     bus[c], slot * w.unit_bytes);
    const std::uint64_t t1 = bam::detail::now_ns();
    if (!s.ok()) {
      ++errors;
      continue;
    }
    ++ops;
    if ((op & ((1u << w.sample_shift) - 1)) == 0) atomicAdd(&st->hist[latency_bucket(t1 - t0)], 1ull);
    if (rd && data && w.verify) {
      // The first word of every 512-byte piece names its controller and place.
      for (std::uint32_t k = 0; k < w.unit_bytes; k += 512)
        bad +=
            bam::detail::ld_cg(reinterpret_cast<const unsigned*>(mine + k)) != pattern_word(c, unit * w.unit_bytes + k);
    }
  }
  atomicAdd(&st->ops, ops);
  if (bad) atomicAdd(&st->bad, bad);
  if (errors) atomicAdd(&st->errors, errors);
}

// ---- through bam::array -------------------------------------------------------

enum class array_mode : int { element = 0, reader = 1, range = 2, page = 3, span = 4 };
//! The benchmark's array: 32-bit words, pages of 2^page_shift words striped
//! over `nctrl` controllers. Word k of array page p holds
//! pattern_word(p % nctrl, ((p / nctrl) << page_shift | k) * 4): one value
//! per page (`page_base`) and an add per word.
__device__ inline std::uint32_t page_base(std::uint64_t p, std::uint32_t page_shift, std::uint32_t nctrl) {
  // 32-bit division where the page number fits (see unit_of).
  const std::uint64_t q = nctrl == 1 ? p : p <= 0xffffffffu ? static_cast<std::uint32_t>(p) / nctrl : p / nctrl;
  return pattern_word(static_cast<std::uint32_t>(p - q * nctrl), (q << page_shift) * 4);
}

//! Every warp visits `ops_per_thread` pages: reads (or writes) every element
//! of the page, element by element, through a reader or a pinned page
//! handle, or as one range copy.
template <array_mode Mode>
__device__ __forceinline__ void array_body(bam::array_ref<std::uint32_t> a, std::uint32_t nctrl, workload w,
                                           std::uint32_t* scratch, stats* st) {
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t nwarps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  const unsigned lane = threadIdx.x % 32;
  const std::uint32_t per_page = w.unit_bytes / 4;
  const std::uint32_t page_shift = 31 - __clz(per_page);
  std::uint32_t* out = scratch + warp * per_page;
  unsigned long long bad = 0;
  std::uint32_t acc = 0;
  for (std::uint32_t op = 0; op < w.ops_per_thread; ++op) {
    const std::uint64_t h = mix(w.seed ^ (warp * 0x100000001b3ull + op));
    const std::uint64_t page = unit_of(w, warp, op, nwarps, h);
    const std::uint64_t base = page << page_shift;
    // pattern_word(c, x) is (c << 28) ^ (x / 4): word k of the page is base_value ^ k (k < 2^28).
    const std::uint32_t want = page_base(page, page_shift, nctrl);
    const bool rd = is_read(w, h);
    const std::uint64_t t0 = bam::detail::now_ns();
    if (!rd) {
      for (std::uint32_t k = lane; k < per_page; k += 32)
        a.write(base + k, want ^ k);
    } else if constexpr (Mode == array_mode::element) {
#pragma unroll 4
      for (std::uint32_t k = lane; k < per_page; k += 32) {
        const std::uint32_t v = a[base + k];
        acc ^= v;
        bad += w.verify && v != (want ^ k);
      }
    } else if constexpr (Mode == array_mode::page) {
      auto pg = a.page(base + lane);
      if (lane == 0 && !pg.pinned()) atomicAdd(&st->unpinned, 1ull);
#pragma unroll 4
      for (std::uint32_t k = lane; k < per_page; k += 32) {
        const std::uint32_t v = pg[base + k];
        acc ^= v;
        bad += w.verify && v != (want ^ k);
      }
    } else if constexpr (Mode == array_mode::span) {
      auto pg = a.page(base + lane);
      const auto sp = pg.span();
      if (sp.size() == per_page) {
        // Unchecked loads, no branch between them: 32 in flight per lane at 4 KiB.
#pragma unroll 32
        for (std::uint32_t k = lane; k < per_page; k += 32) {
          const std::uint32_t v = sp[k];
          acc ^= v;
          bad += w.verify && v != (want ^ k);
        }
      } else {
        if (lane == 0) atomicAdd(&st->unpinned, 1ull);
        for (std::uint32_t k = lane; k < per_page; k += 32) {
          const std::uint32_t v = pg[base + k];
          acc ^= v;
          bad += w.verify && v != (want ^ k);
        }
      }
    } else if constexpr (Mode == array_mode::reader) {
      auto r = a.reader();
#pragma unroll 4
      for (std::uint32_t k = lane; k < per_page; k += 32) {
        const std::uint32_t v = r[base + k];
        acc ^= v;
        bad += w.verify && v != (want ^ k);
      }
    } else {
      a.copy_to(base, per_page, out);
      __syncwarp();
      // The first word of every 512 bytes, as the raw mode and the gather
      // ceilings check theirs (--verify-all: every word).
      const std::uint32_t stride = w.verify_all ? 1 : 128;
      for (std::uint32_t k = lane * stride; k < per_page; k += 32 * stride) {
        acc ^= out[k];
        bad += w.verify && out[k] != (want ^ k);
      }
      __syncwarp();
    }
    const std::uint64_t t1 = bam::detail::now_ns();
    if (lane == 0 && (op & ((1u << w.sample_shift) - 1)) == 0) atomicAdd(&st->hist[latency_bucket(t1 - t0)], 1ull);
  }
  if (lane == 0) atomicAdd(&st->ops, static_cast<unsigned long long>(w.ops_per_thread));
  if (bad) atomicAdd(&st->bad, bad);
  if (acc == 0x9e3779b9u && bad == ~0ull) st->errors = acc;
}

// Register caps per kernel, to measure what occupancy buys each mode:
// `-DBENCH_ARRAY_MAXNREG=N` (a[i], copy_to; none by default),
// `-DBENCH_READER_MAXNREG=N` (64), `-DBENCH_PAGE_MAXNREG=N` (128).
#ifdef BENCH_ARRAY_MAXNREG
#define BENCH_ARRAY_REGS __maxnreg__(BENCH_ARRAY_MAXNREG)
#else
#define BENCH_ARRAY_REGS
#endif
#ifndef BENCH_PAGE_MAXNREG
#define BENCH_PAGE_MAXNREG 128
#endif
#ifndef BENCH_READER_MAXNREG
#define BENCH_READER_MAXNREG 64
#endif

template <array_mode Mode>
__global__ void BENCH_ARRAY_REGS array_kernel(bam::array_ref<std::uint32_t> a, std::uint32_t nctrl, workload w,
                                              std::uint32_t* scratch, stats* st) {
  array_body<Mode>(a, nctrl, w, scratch, st);
}
//! Page handles: the reads of a pinned page wait on memory only, so more
//! warps per SM hide more of it. Capped at 128 registers (the cache's miss
//! machinery would take 255): in one H100 run, 91.5 M pages/s against 60.7 M
//! uncapped (`a[i]` and `copy_to` lost with any cap).
__global__ void __maxnreg__(BENCH_PAGE_MAXNREG) array_page_kernel(bam::array_ref<std::uint32_t> a, std::uint32_t nctrl,
                                                                  workload w, std::uint32_t* scratch, stats* st) {
  array_body<array_mode::page>(a, nctrl, w, scratch, st);
}

//! Page spans: capped as page handles are.
__global__ void __maxnreg__(BENCH_PAGE_MAXNREG) array_span_kernel(bam::array_ref<std::uint32_t> a, std::uint32_t nctrl,
                                                                  workload w, std::uint32_t* scratch, stats* st) {
  array_body<array_mode::span>(a, nctrl, w, scratch, st);
}

//! Readers: capped at 64 registers (in one H100 run, 54.7 M pages/s against
//! 27.4 M uncapped; `a[i]` and `copy_to` only lost with any cap, page
//! handles did best at 128: results/page-handle-h100/register-caps).
__global__ void __maxnreg__(BENCH_READER_MAXNREG)
    array_reader_kernel(bam::array_ref<std::uint32_t> a, std::uint32_t nctrl, workload w, std::uint32_t* scratch,
                        stats* st) {
  array_body<array_mode::reader>(a, nctrl, w, scratch, st);
}

//! Every lane reads one word of a page of its own per operation with a[i]:
//! the embedding-lookup and graph pattern, where a warp has up to 32 pages
//! (and misses) in flight at once. One op is one lane's page visit.
__global__ void array_gather_kernel(bam::array_ref<std::uint32_t> a, std::uint32_t nctrl, workload w, stats* st) {
  const std::uint64_t tid = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  const std::uint64_t nthreads = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint32_t per_page = w.unit_bytes / 4;
  const std::uint32_t page_shift = 31 - __clz(per_page);
  unsigned long long bad = 0;
  std::uint32_t acc = 0;
  for (std::uint32_t op = 0; op < w.ops_per_thread; ++op) {
    const std::uint64_t h = mix(w.seed ^ (tid * 0x100000001b3ull + op));
    const std::uint64_t page = unit_of(w, tid, op, nthreads, h);
    const std::uint32_t k = static_cast<std::uint32_t>(h >> 40) & (per_page - 1);
    const std::uint32_t want = page_base(page, page_shift, nctrl) ^ k;
    const std::uint64_t t0 = bam::detail::now_ns();
    if (is_read(w, h)) {
      const std::uint32_t v = a[(page << page_shift) + k];
      acc ^= v;
      bad += w.verify && v != want;
    } else {
      a.write((page << page_shift) + k, want);
    }
    const std::uint64_t t1 = bam::detail::now_ns();
    if (threadIdx.x % 32 == 0 && (op & ((1u << w.sample_shift) - 1)) == 0)
      atomicAdd(&st->hist[latency_bucket(t1 - t0)], 1ull);
  }
  atomicAdd(&st->ops, static_cast<unsigned long long>(w.ops_per_thread));
  if (bad) atomicAdd(&st->bad, bad);
  if (acc == 0x9e3779b9u && bad == ~0ull) st->errors = acc;
}

// ---- ceilings -----------------------------------------------------------------

//! Memory a gather ceiling reads: `count` parts of `units_per_part` blocks
//! each, part p holding the blocks first_unit + p * units_per_part on (one
//! part: a buffer in host or GPU memory; several: parts on several GPUs).
struct gather_source {
  static constexpr std::uint32_t max_parts = 16;
  const std::uint8_t* part[max_parts] = {};
  std::uint32_t count = 1;
  std::uint64_t units_per_part = 0;
  std::uint64_t first_unit = 0; //!< the pattern's block number of part 0's first block
};

//! Every warp gathers `ops_per_thread` random blocks of `unit_bytes` from
//! `src` (pinned host memory mapped into the GPU, GPU memory, or parts on
//! several GPUs) into registers, with 8 loads of 16 bytes in flight per
//! lane, and checks the first word of every 512 bytes.
__global__ void gather_kernel(gather_source src, workload w, stats* st) {
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t nwarps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  const unsigned lane = threadIdx.x % 32;
  const std::uint64_t units = src.units_per_part * src.count;
  unsigned long long bad = 0;
  unsigned acc = 0;
  for (std::uint32_t op = 0; op < w.ops_per_thread; ++op) {
    const std::uint64_t h = mix(w.seed ^ (warp * 0x100000001b3ull + op));
    const std::uint64_t unit = (w.sequential ? (op * nwarps + warp) : h) % units;
    const std::uint64_t part = unit / src.units_per_part;
    const uint4* p = reinterpret_cast<const uint4*>(src.part[part] + (unit - part * src.units_per_part) * w.unit_bytes);
    const std::uint64_t first_byte = (src.first_unit + unit) * w.unit_bytes;
    const std::uint32_t n16 = w.unit_bytes / 16;
    for (std::uint32_t base = 0; base < n16; base += 8 * 32) {
      uint4 v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (base + k * 32 + lane < n16) v[k] = __ldcg(p + base + k * 32 + lane);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const std::uint32_t i = base + k * 32 + lane;
        if (i >= n16) continue;
        acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
        if (w.verify && (i * 16) % 512 == 0) bad += v[k].x != pattern_word(0, first_byte + i * 16);
      }
    }
  }
  if (lane == 0) atomicAdd(&st->ops, static_cast<unsigned long long>(w.ops_per_thread));
  if (bad) atomicAdd(&st->bad, bad);
  if (acc == 0x12345678u && bad == ~0ull) st->errors = acc;
}

//! Fill `bytes` of (GPU-reachable) memory with controller `c`'s pattern from byte `first` on.
__global__ void fill_kernel(std::uint32_t* dst, std::uint64_t words, std::uint32_t c, std::uint64_t first) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    dst[i] = pattern_word(c, first + i * 4);
}

} // namespace bench
