// SPDX-License-Identifier: MIT
//! GPU threads driving NVMe queues: the device-side I/O path and the host
//! object that sets it up.
//!
//! `bam::gpu::storage` takes one or more brought-up controllers (their I/O
//! queues placed for GPU submitters, see `gpu_queue_options`) and one
//! namespace on each, and gives kernels `controller_ref`s: the queue pairs in
//! GPU memory, per-command-id PRP-list pages, and, for the software
//! controller's GPU engine, the engine handle whose work the waiting threads
//! do. A thread picks its queue pair by SM and warp (`%smid`, `%warpid`).
//!
//! @code
//!   __global__ void k(bam::gpu::controller_ref c, const std::uint64_t* bus) {
//!     bam::nvme::status st = c.read(/*lba=*/threadIdx.x * 8, 8, bus, threadIdx.x * 4096);
//!   }
//! @endcode
#pragma once

#include <bam/controller.hpp>
#include <bam/detail/macros.hpp>
#include <bam/emu/gpu_engine_ref.cuh>
#include <bam/gpu/cuda.cuh>
#include <bam/nvme/prp.hpp>
#include <bam/nvme/queue.hpp>
#include <bam/transport.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace bam::gpu {

//! The bytes a PRP list of one command id may hold (entries beyond PRP1).
inline constexpr std::uint32_t default_max_io_bytes = 64 * 1024;

//! One controller (one namespace on it) as GPU threads see it. Trivially copyable.
struct controller_ref {
  nvme::queue_pair_ref* queues = nullptr; //!< GPU memory, `nqueues` entries
  std::uint32_t nqueues = 0;
  std::uint32_t nsid = 1;
  std::uint32_t lba_size = 512;
  std::uint32_t num_sms = 1;
  std::uint64_t nblocks = 0;
  std::uint64_t* prp_lists = nullptr;         //!< per queue, per command id: `list_entries` entries
  const std::uint64_t* prp_list_bus = nullptr; //!< bus address of every 4 KiB page of the list area
  std::uint32_t list_entries = 0;             //!< entries per command id (power of two)
  std::uint32_t cids_per_queue = 0;
  std::uint32_t max_transfer_bytes = 0;
  bool has_engine = false;
  emu::gpu_engine_ref engine{};               //!< valid if `has_engine`

  //! The queue pair for the calling thread: spread over SMs and warps.
  BAM_DEVICE std::uint32_t pick_queue() const {
#if BAM_DEVICE_CODE
    unsigned smid, warpid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    asm volatile("mov.u32 %0, %%warpid;" : "=r"(warpid));
    return (smid + warpid * num_sms) % nqueues;
#else
    return 0;
#endif
  }

  //! Read or write `nblocks` blocks at `lba` to/from the memory described by
  //! `page_bus` (bus address of every 4 KiB page of a mapped region) at byte
  //! `offset`. Returns the completion status, or a bam status (timeout,
  //! queue broken, out of range).
  BAM_DEVICE nvme::status io(nvme::nvm_opcode op, std::uint64_t lba, std::uint32_t nblocks,
                             const std::uint64_t* page_bus, std::uint64_t offset,
                             std::uint32_t queue) const {
    const std::uint64_t bytes = static_cast<std::uint64_t>(nblocks) * lba_size;
    if (nblocks == 0 || lba >= nblocks_total() || nblocks > nblocks_total() - lba || bytes > max_transfer_bytes)
      return nvme::status_out_of_range;
    const nvme::queue_pair_ref& q = queues[queue];
    nvme::command cmd = nvme::make_rw(op, nsid, lba, nblocks, 0, 0);
    bool prp_ok = true;
    auto prepare = [&](nvme::command& c, std::uint32_t cid) {
      const std::uint64_t list_index = static_cast<std::uint64_t>(queue) * cids_per_queue + cid;
      std::uint64_t* list = prp_lists + list_index * list_entries;
      const std::uint64_t list_off = list_index * list_entries * sizeof(std::uint64_t);
      const std::uint64_t list_bus = prp_list_bus[list_off / dma_page_size] + list_off % dma_page_size;
      std::uint64_t* const virt[1] = {list};
      const std::uint64_t bus[1] = {list_bus};
      nvme::prp_pair p;
      prp_ok = nvme::build_prp(page_bus, offset, bytes, dma_page_size, virt, bus, 1, p);
      c.prp1 = p.prp1;
      c.prp2 = p.prp2;
    };
    auto idle = [&] {
      if (has_engine) engine.serve(q.qid, [&] { q.poll(); });
    };
    if (nvme::prp_pages_spanned(offset, bytes, dma_page_size) > list_entries + 1ull)
      return nvme::status_out_of_range;
    std::uint64_t ticket = 0;
    nvme::status st = q.submit(cmd, ticket, prepare, idle);
    if (!st.ok()) return st;
    st = q.wait(ticket, nullptr, idle);
    if (!prp_ok && st.ok()) return nvme::status_out_of_range;
    return st;
  }
  BAM_DEVICE nvme::status read(std::uint64_t lba, std::uint32_t nblocks, const std::uint64_t* page_bus,
                               std::uint64_t offset) const {
    return io(nvme::nvm_opcode::read, lba, nblocks, page_bus, offset, pick_queue());
  }
  BAM_DEVICE nvme::status write(std::uint64_t lba, std::uint32_t nblocks, const std::uint64_t* page_bus,
                                std::uint64_t offset) const {
    return io(nvme::nvm_opcode::write, lba, nblocks, page_bus, offset, pick_queue());
  }
  //! NVMe Flush of the namespace.
  BAM_DEVICE nvme::status flush() const {
    const std::uint32_t qi = pick_queue();
    const nvme::queue_pair_ref& q = queues[qi];
    auto idle = [&] {
      if (has_engine) engine.serve(q.qid, [&] { q.poll(); });
    };
    std::uint64_t ticket = 0;
    nvme::status st = q.submit(nvme::make_flush(nsid), ticket, [](nvme::command&, std::uint32_t) {}, idle);
    if (!st.ok()) return st;
    return q.wait(ticket, nullptr, idle);
  }
  BAM_HD std::uint64_t nblocks_total() const { return nblocks; }
};
static_assert(std::is_trivially_copyable_v<controller_ref>);

//! GPU memory reachable by a controller: cudaMalloc'ed, 4 KiB aligned, zeroed, mapped.
class device_region final : public dma_region {
public:
  static std::unique_ptr<dma_region> make(transport& t, std::size_t bytes) {
    const std::size_t size = transport::round_up(bytes);
    void* raw = nullptr;
    BAM_CUDA_TRY(cudaMalloc(&raw, size + dma_page_size));
    const auto aligned = (reinterpret_cast<std::uintptr_t>(raw) + dma_page_size - 1) / dma_page_size * dma_page_size;
    void* p = reinterpret_cast<void*>(aligned);
    if (cudaMemset(p, 0, size) != cudaSuccess) {
      cudaFree(raw);
      throw error("clearing " + std::to_string(size) + " bytes of GPU memory failed");
    }
    std::unique_ptr<dma_region> m;
    try {
      m = t.map(p, size, memory_kind::device);
    } catch (...) {
      cudaFree(raw);
      throw;
    }
    return std::unique_ptr<dma_region>(new device_region(std::move(m), raw));
  }
  ~device_region() override {
    mapping_.reset();
    BAM_CUDA_LOG(cudaFree(raw_));
  }

private:
  device_region(std::unique_ptr<dma_region> m, void* raw)
      : dma_region(m->data(), m->size(), m->kind(), m->page_bus()), mapping_(std::move(m)), raw_(raw) {}
  std::unique_ptr<dma_region> mapping_;
  void* raw_;
};

//! Zeroed submitter state for GPU submitters, in GPU memory (every atomic on
//! it happens on the GPU; the host driver never reads it).
inline void* alloc_queue_state(std::size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
  if (cudaMemset(p, 0, bytes) != cudaSuccess || cudaStreamSynchronize(nullptr) != cudaSuccess) {
    cudaFree(p);
    return nullptr;
  }
  return p;
}

//! Controller options that put I/O queue rings and submitter state in GPU
//! memory and hand GPU threads the doorbells (for the GPU engine or a real
//! controller reached through the kernel module).
inline controller_options gpu_queue_options(controller_options o = {}) {
  o.ring_alloc = [](transport& t, std::size_t bytes) { return device_region::make(t, bytes); };
  o.state_alloc = [](std::size_t bytes) { return alloc_queue_state(bytes); };
  o.state_free = [](void* p) { BAM_CUDA_LOG(cudaFree(p)); };
  o.device_doorbells = true;
  return o;
}

struct storage_options {
  std::uint32_t nsid = 1;
  std::uint32_t max_io_bytes = default_max_io_bytes; //!< largest single transfer (PRP list size)
};

//! A GPU memory range mapped for every controller of a storage: the bus
//! address of each 4 KiB page, per controller, in GPU memory.
class storage_mapping {
public:
  //! Device array of `controllers` pointers, each to that controller's page bus addresses.
  const std::uint64_t* const* bus_tables() const { return tables_.get(); }

private:
  friend class storage;
  std::vector<std::unique_ptr<dma_region>> regions_;
  std::vector<device_buffer<std::uint64_t>> bus_;
  device_buffer<const std::uint64_t*> tables_;
};

//! One namespace on each of several controllers, reached by GPU threads. Pages
//! are striped over the controllers by the layers above (page p on controller p % n).
class storage {
public:
  //! `engines[i]` (may be empty or shorter) is the GPU engine serving controller i's I/O queues.
  storage(std::vector<std::shared_ptr<controller>> ctrls,
          std::vector<emu::gpu_engine_ref> engines = {}, storage_options opts = {})
      : ctrls_(std::move(ctrls)), opts_(opts) {
    if (ctrls_.empty()) throw error("a storage needs at least one controller");
    if (opts_.max_io_bytes < dma_page_size || (opts_.max_io_bytes & (opts_.max_io_bytes - 1)) != 0)
      throw error("storage: max_io_bytes must be a power of two >= 4096 (got " +
                  std::to_string(opts_.max_io_bytes) + ")");
    int dev = 0, sms = 1;
    BAM_CUDA_TRY(cudaGetDevice(&dev));
    BAM_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    std::vector<controller_ref> refs;
    for (std::size_t i = 0; i < ctrls_.size(); ++i) {
      controller& c = *ctrls_[i];
      const namespace_info& ns = c.ns(opts_.nsid);
      if (i == 0) lba_size_ = ns.lba_size;
      if (ns.lba_size != lba_size_)
        throw error("storage: controllers differ in LBA size (" + std::to_string(lba_size_) + " vs " +
                    std::to_string(ns.lba_size) + " on " + c.name() + ")");
      blocks_ = i == 0 ? ns.blocks : std::min(blocks_, ns.blocks);
      if (c.io_queue_count() == 0) throw error("storage: controller " + c.name() + " has no I/O queues");
      per_ctrl pc;
      std::vector<nvme::queue_pair_ref> qs;
      for (std::uint32_t q = 0; q < c.io_queue_count(); ++q) qs.push_back(c.io_queue(q));
      pc.queues = device_buffer<nvme::queue_pair_ref>(qs.size());
      copy_to_device(pc.queues.get(), qs.data(), qs.size());
      controller_ref r;
      r.queues = pc.queues.get();
      r.nqueues = static_cast<std::uint32_t>(qs.size());
      r.nsid = opts_.nsid;
      r.lba_size = ns.lba_size;
      r.nblocks = ns.blocks;
      r.num_sms = static_cast<std::uint32_t>(sms);
      const std::uint32_t max_bytes =
          static_cast<std::uint32_t>(std::min<std::size_t>(opts_.max_io_bytes, c.max_transfer_bytes()));
      // Entries per command id: a power of two, so that no list crosses a 4 KiB page.
      std::uint32_t entries = 1;
      while (entries * 2 <= std::min<std::uint32_t>(max_bytes / dma_page_size, 512)) entries *= 2;
      r.list_entries = entries;
      r.max_transfer_bytes = std::min<std::uint32_t>(max_bytes, entries * static_cast<std::uint32_t>(dma_page_size));
      r.cids_per_queue = c.io_queue_depth() - 1;
      const std::size_t list_bytes =
          static_cast<std::size_t>(r.nqueues) * r.cids_per_queue * r.list_entries * sizeof(std::uint64_t);
      pc.lists = device_region::make(c.transport_ref(), list_bytes);
      pc.list_bus = device_buffer<std::uint64_t>(pc.lists->page_bus().size());
      copy_to_device(pc.list_bus.get(), pc.lists->page_bus().data(), pc.lists->page_bus().size());
      r.prp_lists = pc.lists->as<std::uint64_t>();
      r.prp_list_bus = pc.list_bus.get();
      if (i < engines.size() && engines[i].queues != nullptr) {
        r.has_engine = true;
        r.engine = engines[i];
      }
      refs.push_back(r);
      per_.push_back(std::move(pc));
    }
    host_refs_ = refs;
    refs_ = device_buffer<controller_ref>(refs.size());
    copy_to_device(refs_.get(), refs.data(), refs.size());
  }

  storage(const storage&) = delete;
  storage& operator=(const storage&) = delete;

  std::uint32_t controller_count() const { return static_cast<std::uint32_t>(ctrls_.size()); }
  controller& controller_at(std::uint32_t i) const { return *ctrls_.at(i); }
  //! Device array of `controller_count()` handles.
  const controller_ref* device_refs() const { return refs_.get(); }
  //! Host copy of handle i (pass by value to a kernel).
  controller_ref ref(std::uint32_t i) const { return host_refs_.at(i); }
  std::uint32_t lba_size() const { return lba_size_; }
  //! Blocks usable on every controller (the smallest namespace).
  std::uint64_t blocks_per_controller() const { return blocks_; }
  std::uint32_t nsid() const { return opts_.nsid; }
  std::string name() const {
    std::string n;
    for (const auto& c : ctrls_) n += (n.empty() ? "" : "+") + c->name();
    return n;
  }

  //! Map GPU memory `[ptr, ptr + bytes)` (4 KiB aligned) for every controller.
  std::unique_ptr<storage_mapping> map(void* ptr, std::size_t bytes) const {
    auto m = std::make_unique<storage_mapping>();
    std::vector<const std::uint64_t*> tables;
    for (const auto& c : ctrls_) {
      auto r = c->transport_ref().map(ptr, bytes, memory_kind::device);
      device_buffer<std::uint64_t> bus(r->page_bus().size());
      copy_to_device(bus.get(), r->page_bus().data(), r->page_bus().size());
      tables.push_back(bus.get());
      m->regions_.push_back(std::move(r));
      m->bus_.push_back(std::move(bus));
    }
    m->tables_ = device_buffer<const std::uint64_t*>(tables.size());
    copy_to_device(m->tables_.get(), tables.data(), tables.size());
    return m;
  }

private:
  struct per_ctrl {
    device_buffer<nvme::queue_pair_ref> queues;
    std::unique_ptr<dma_region> lists;
    device_buffer<std::uint64_t> list_bus;
  };
  std::vector<std::shared_ptr<controller>> ctrls_;
  storage_options opts_;
  std::vector<per_ctrl> per_;
  std::vector<controller_ref> host_refs_;
  device_buffer<controller_ref> refs_;
  std::uint32_t lba_size_ = 0;
  std::uint64_t blocks_ = 0;
};

} // namespace bam::gpu
