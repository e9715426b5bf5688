// SPDX-License-Identifier: MIT
//! The transport interface: how the controller driver reaches a controller's
//! registers and makes memory reachable by its DMA engine. The kernel-module
//! PCI transport and the software controller implement it the same way, so
//! the driver above them is the same code.
//!
//! @code
//!   std::shared_ptr<bam::transport> t = bam::emu::make_ram_emulated_controller(...);
//!   auto buf = t->alloc(1 << 20);                 // DMA-able, zeroed
//!   std::uint64_t bus = buf->bus_address(4096);   // what goes into a PRP
//! @endcode
#pragma once

#include <bam/error.hpp>
#include <bam/nvme/queue.hpp>
#include <bam/transport/device_progress.hpp>

#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace bam {

//! Where a buffer lives.
enum class memory_kind : std::uint8_t {
  host,   //!< host memory (pinned while mapped)
  device, //!< GPU memory
};

//! Granularity of bus address lists and of the controller memory page (CC.MPS = 0).
inline constexpr std::size_t dma_page_size = 4096;
//! The GPU's own page: the unit in which NVIDIA's peer-to-peer interface
//! (nvidia_p2p_get_pages) pins GPU memory. GPU memory that a controller must
//! reach is allocated aligned and sized to it (see `transport::device_map_alignment`).
inline constexpr std::size_t gpu_page_size = 64 * 1024;

//! A region of memory the controller can reach, with the bus address of every
//! `dma_page_size` page. Unmapped (and freed, if it owns the memory) when destroyed.
class dma_region {
public:
  dma_region(void* vaddr, std::size_t size, memory_kind kind, std::vector<std::uint64_t> bus)
      : vaddr_(vaddr), size_(size), kind_(kind), bus_(std::move(bus)) {}
  virtual ~dma_region() = default;
  dma_region(const dma_region&) = delete;
  dma_region& operator=(const dma_region&) = delete;

  void* data() const noexcept { return vaddr_; }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(vaddr_);
  }
  std::size_t size() const noexcept { return size_; }
  memory_kind kind() const noexcept { return kind_; }
  //! Bus addresses of the region's pages, one per `dma_page_size`.
  const std::vector<std::uint64_t>& page_bus() const noexcept { return bus_; }
  //! Bus address of byte `offset` of the region.
  std::uint64_t bus_address(std::size_t offset) const {
    if (offset >= size_) {
      error_context c;
      c.errnum = ERANGE;
      throw error("DMA offset " + std::to_string(offset) + " outside a region of " + std::to_string(size_) + " bytes",
                  c);
    }
    return bus_[offset / dma_page_size] + offset % dma_page_size;
  }

private:
  void* vaddr_;
  std::size_t size_;
  memory_kind kind_;
  std::vector<std::uint64_t> bus_;
};

//! Register access and DMA mapping for one controller.
class transport {
public:
  virtual ~transport() = default;

  //! A name for messages: the device string, e.g. "emu:ram=64M" or "/dev/bam-nvme0".
  virtual std::string name() const = 0;

  virtual std::uint32_t read32(std::uint32_t offset) = 0;
  virtual void write32(std::uint32_t offset, std::uint32_t value) = 0;
  //! 64-bit registers are accessed as two 32-bit halves, low first (as the
  //! spec allows and as every controller accepts).
  virtual std::uint64_t read64(std::uint32_t offset) {
    const std::uint64_t lo = read32(offset);
    const std::uint64_t hi = read32(offset + 4);
    return lo | (hi << 32);
  }
  virtual void write64(std::uint32_t offset, std::uint64_t value) {
    write32(offset, static_cast<std::uint32_t>(value));
    write32(offset + 4, static_cast<std::uint32_t>(value >> 32));
  }

  //! A CPU pointer to the 32-bit doorbell register at `offset` (mapped BAR0, or
  //! the software controller's register file). Writes through it need no call.
  virtual volatile std::uint32_t* doorbell(std::uint32_t offset) = 0;

  //! A GPU pointer to the same doorbell, or nullptr if GPU threads cannot
  //! ring this controller.
  virtual volatile std::uint32_t* device_doorbell(std::uint32_t /*offset*/) { return nullptr; }
  //! Who reads the doorbells behind `device_doorbell`: MMIO and host memory
  //! need a system-scope write; a doorbell in GPU memory read by GPU threads
  //! only a device-scope one.
  virtual nvme::memory_scope device_doorbell_scope() const { return nvme::memory_scope::system; }
  //! What GPU threads waiting on this controller's queues must do to make it
  //! progress (nothing for a device or for host threads serving it).
  virtual device_progress device_progress_hook() const { return {}; }
  //! Whether the controller reports its fetch position as each completion's
  //! SQ head (see `nvme::queue_pair_ref::sq_head_exact`).
  virtual bool exact_sq_head() const { return true; }
  //! For a controller served by host threads: a word that says for how many
  //! nanoseconds the thread serving queue `qid` has run without being kept
  //! off the CPU (see `nvme::queue_pair_ref::controller_run_ns`), readable
  //! where the queue's waiters run; nullptr for a device.
  virtual const std::uint64_t* controller_run_ns(std::uint16_t /*qid*/) const { return nullptr; }

  // ---- a controller whose admin queue someone else owns ---------------------
  //
  // The kernel module brings a controller up once and owns its admin queue,
  // so that several processes share it: each asks for I/O queue pairs in its
  // own memory and sends admin commands through the module. The driver then
  // does no bring-up of its own (see `bam::controller`).

  //! Whether the controller is already up and its admin queue belongs to
  //! someone else (then the calls below serve the driver).
  virtual bool admin_queue_owned_elsewhere() const { return false; }
  //! I/O queue pairs this process may still get (the controller's free ones,
  //! bounded by its share).
  virtual std::uint32_t io_queue_pairs_available() { return 0; }
  //! Create an I/O queue pair of `depth` entries whose SQ is at `sq_offset`
  //! and CQ at `cq_offset` of `rings` (memory this transport mapped, each ring
  //! contiguous in bus address space). Returns its queue id; throws
  //! `bam::error` (errno ENOSPC or EDQUOT when none is left, with the numbers).
  virtual std::uint16_t create_io_queue_pair(const dma_region& /*rings*/, std::size_t /*sq_offset*/,
                                             std::size_t /*cq_offset*/, std::uint32_t /*depth*/) {
    throw error("this transport creates no I/O queue pairs for the driver (it owns no admin queue)");
  }
  //! Delete a pair from `create_io_queue_pair` (SQ, then CQ); after it returns
  //! the controller no longer touches its rings. Throws on failure.
  virtual void delete_io_queue_pair(std::uint16_t /*qid*/) {}
  //! Run one admin command through the admin queue's owner. `data` (host
  //! memory, `bytes` long, or null) is written to or read by the controller
  //! as the opcode says. Returns the completion status; `dw0` gets dword 0.
  virtual nvme::status admin_passthrough(const nvme::command& /*cmd*/, void* /*data*/, std::size_t /*bytes*/,
                                         std::uint32_t& /*dw0*/) {
    throw error("this transport has no admin passthrough (it owns no admin queue)");
  }

  //! Make `[ptr, ptr + size)` reachable by the controller. `ptr` and `size`
  //! must be multiples of `dma_page_size` (GPU memory: of
  //! `device_map_alignment()`). The memory stays the caller's.
  virtual std::unique_ptr<dma_region> map(void* ptr, std::size_t size, memory_kind kind) = 0;
  //! Alignment and size granularity of GPU memory passed to `map`.
  virtual std::size_t device_map_alignment() const { return dma_page_size; }

  //! Allocate zeroed, page-aligned host memory and map it.
  virtual std::unique_ptr<dma_region> alloc(std::size_t size) {
    const std::size_t bytes = round_up(size);
    void* p = std::aligned_alloc(dma_page_size, bytes);
    if (p == nullptr) throw_errno("allocating " + std::to_string(bytes) + " bytes of DMA memory", ENOMEM, name());
    std::memset(p, 0, bytes);
    try {
      auto mapping = map(p, bytes, memory_kind::host);
      return std::make_unique<owned_region>(std::move(mapping), p);
    } catch (...) {
      std::free(p);
      throw;
    }
  }

  static std::size_t round_up(std::size_t size, std::size_t unit = dma_page_size) {
    return (size + unit - 1) / unit * unit;
  }

protected:
  //! Validate a map request the same way for every transport.
  void check_map_args(const void* ptr, std::size_t size, memory_kind kind = memory_kind::host) const {
    const auto a = reinterpret_cast<std::uintptr_t>(ptr);
    const std::size_t unit = kind == memory_kind::device ? device_map_alignment() : dma_page_size;
    if (size == 0 || a % unit != 0 || size % unit != 0) {
      error_context c;
      c.controller = name();
      c.errnum = EINVAL;
      throw error(
          std::string("DMA mapping of ") + (kind == memory_kind::device ? "GPU" : "host") +
              " memory needs a non-empty, " + std::to_string(unit) + "-byte aligned buffer and length (got " +
              std::to_string(size) + " bytes at 0x" +
              [&] {
                char b[32];
                std::snprintf(b, sizeof b, "%llx", static_cast<unsigned long long>(a));
                return std::string(b);
              }() +
              ")",
          c);
    }
  }

private:
  //! A mapping plus the memory it owns; the mapping goes first.
  class owned_region : public dma_region {
  public:
    owned_region(std::unique_ptr<dma_region> m, void* mem)
        : dma_region(m->data(), m->size(), m->kind(), m->page_bus()), mapping_(std::move(m)), mem_(mem) {}
    ~owned_region() override {
      mapping_.reset();
      std::free(mem_);
    }

  private:
    std::unique_ptr<dma_region> mapping_;
    void* mem_;
  };
};

} // namespace bam
