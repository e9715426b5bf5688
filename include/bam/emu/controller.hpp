// SPDX-License-Identifier: MIT
//! `bam::emu::controller`: a software NVMe controller inside the process. It
//! implements the NVMe 2.0 register and queue protocol — CAP/VS/CC/CSTS/AQA/
//! ASQ/ACQ, doorbells, admin and NVM command sets, PRPs — over RAM, a file or
//! a block device, so the whole library runs and is tested with no SSD.
//!
//! DMA is modelled: `map` hands out fake bus addresses (far from any virtual
//! address) and every PRP the controller follows is translated; an address
//! that was never mapped completes the command with Data Transfer Error, which
//! catches drivers that pass virtual addresses. With `identity_dma` the bus
//! address is the virtual address (for engines that run on the GPU).
//!
//! @code
//!   bam::emu::controller_config cfg;
//!   cfg.namespaces.push_back({.blocks = 1 << 20, .lba_size = 512});   // 512 MiB of RAM
//!   auto ctrl = bam::emu::make_controller(cfg);
//!   ctrl->write32(bam::nvme::reg::aqa, ...);            // bring-up as on hardware
//!   auto* db = ctrl->doorbell(bam::nvme::sq_doorbell_offset(0, 0));
//!   ctrl->faults().set_global_latency_ns(80'000);       // an SSD-like 80 us
//! @endcode
#pragma once

#include <bam/emu/cpu_engine.hpp>
#include <bam/emu/engine.hpp>
#include <bam/emu/faults.hpp>
#include <bam/emu/media.hpp>
#include <bam/error.hpp>
#include <bam/nvme/prp.hpp>
#include <bam/nvme/spec.hpp>
#include <bam/transport.hpp>

#include <nvme/types.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

namespace bam::emu {

//! One namespace (NSIDs are 1, 2, ... in order).
struct namespace_config {
  std::uint64_t blocks = 0;       //!< logical blocks
  std::uint32_t lba_size = 512;   //!< bytes per block: a power of two, 512 to 65536
  std::shared_ptr<media> backing; //!< null: RAM of blocks * lba_size bytes
};

struct controller_config {
  std::vector<namespace_config> namespaces;
  std::uint32_t max_queue_entries = 4096; //!< CAP.MQES + 1 (2..65536)
  std::uint32_t max_io_queues = 256;      //!< I/O SQs (and CQs) the controller offers
  std::uint8_t mdts = 5;                  //!< max transfer 2^mdts * 4 KiB; 0: no limit
  std::uint32_t engine_threads = 2;       //!< CPU engine threads for I/O queues
  std::uint8_t dstrd = 0;                 //!< CAP.DSTRD: doorbell stride 4 << dstrd bytes
  std::uint8_t cap_to = 4;                //!< CAP.TO, 500 ms units
  std::uint64_t ready_delay_ns = 0;       //!< CSTS.RDY rises this long after CC.EN
  bool identity_dma = false;              //!< bus address == virtual address
  std::string name = "emu";               //!< for messages and thread names
  //! Engine serving the I/O queues; null: a CPU engine with `engine_threads`.
  //! The admin queue is always served by a CPU thread of the controller.
  std::shared_ptr<bam::emu::io_engine> io_engine;
};

//! Host-visible counters, as in the SMART / Health log.
struct controller_counters {
  std::uint64_t data_units_read;    //!< 512-byte units read
  std::uint64_t data_units_written; //!< 512-byte units written
  std::uint64_t host_reads;         //!< read commands completed
  std::uint64_t host_writes;        //!< write commands completed
  std::uint64_t media_errors;
  std::uint64_t error_log_entries;
};

namespace detail {

//! First fake bus address handed out: above every user-space virtual address.
inline constexpr std::uint64_t fake_bus_base = 0x0000'b000'0000'0000ull;
//! VS register value: NVMe 1.4.0.
inline constexpr std::uint32_t emu_version = 0x00010400u;
//! PCI vendor id reported (0xffff would read as "no device"; this one is
//! not a PCI-SIG assignment of any real vendor we know of).
inline constexpr std::uint16_t emu_vendor_id = 0x1b4d;
inline constexpr const char* emu_model = "bam software NVMe controller";
inline constexpr const char* emu_firmware = "0.1.0";
//! Error Information log entries kept (Identify ELPE + 1).
inline constexpr std::uint32_t error_log_entries = 64;
//! Size of the SMART/Health and Firmware Slot log pages.
inline constexpr std::size_t health_log_size = 512;
//! Outstanding Asynchronous Event Requests accepted (Identify AERL + 1).
inline constexpr std::uint32_t max_async_events = 4;
//! Command specific status: Asynchronous Event Request Limit Exceeded.
inline constexpr std::uint8_t async_event_limit_exceeded = 0x05;
//! Concurrent Abort commands (Identify ACL + 1).
inline constexpr std::uint8_t abort_limit = 4;
//! NSID that addresses every namespace.
inline constexpr std::uint32_t nsid_broadcast = 0xffffffffu;
//! Active namespace IDs per Identify CNS 2 page.
inline constexpr std::size_t ns_list_entries = nvme::identify_data_size / sizeof(std::uint32_t);
//! CQE sq_id/sq_head, Identify SQES/CQES: required (low nibble) and maximum (high nibble).
inline constexpr std::uint8_t sqes_value = (nvme::sq_entry_log2 << 4) | nvme::sq_entry_log2;
inline constexpr std::uint8_t cqes_value = (nvme::cq_entry_log2 << 4) | nvme::cq_entry_log2;
//! Identify VWC: present, and Flush with NSID FFFFFFFFh supported (bits 2:1 = 11b).
inline constexpr std::uint8_t vwc_value = 0x07;
//! Identify FRMW: one firmware slot, slot 1 read-only.
inline constexpr std::uint8_t frmw_value = 0x03;
//! Identify DLFEAT: deallocated blocks read as zeroes; Write Zeroes may deallocate.
inline constexpr std::uint8_t dlfeat_value = 0x09;
//! Identify CNTRLTYPE: I/O controller.
inline constexpr std::uint8_t cntrltype_io = 1;
//! Temperature reported in the health log, Kelvin.
inline constexpr std::uint16_t reported_temperature_k = 313;
//! Command dword 12 bit of Write Zeroes: deallocate.
inline constexpr std::uint32_t write_zeroes_deac = 1u << 25;
//! Command flags: FUSE bits 1:0 and PSDT bits 7:6.
inline constexpr std::uint8_t flags_fuse_mask = 0x03;
inline constexpr std::uint8_t flags_psdt_mask = 0xc0;
//! Get Features: select field (cdw10 bits 10:8), "supported capabilities".
inline constexpr std::uint32_t features_select_shift = 8;
inline constexpr std::uint32_t features_select_mask = 0x7;
//! Largest number of a 0-based queue count field in Number of Queues.
inline constexpr std::uint32_t num_queues_field_max = 0xfffe;

inline nvme::status generic(std::uint8_t sc) { return {nvme::status_type::generic, sc, true}; }
inline nvme::status specific(std::uint8_t sc) {
  return {nvme::status_type::command_specific, sc, true};
}
inline nvme::status media_error(std::uint8_t sc) { return {nvme::status_type::media_error, sc}; }

//! Copy `text` into a fixed, space-padded ASCII field.
inline void set_ascii(char* field, std::size_t n, const std::string& text) {
  std::memset(field, ' ', n);
  std::memcpy(field, text.data(), std::min(n, text.size()));
}
//! Store a count in a 128-bit little-endian log field.
inline void set_u128(std::uint8_t* field, std::uint64_t v) {
  std::memset(field, 0, 16);
  std::memcpy(field, &v, sizeof v);
}

//! Bus address -> virtual address translation for every mapped region.
class dma_table {
public:
  explicit dma_table(bool identity) : identity_(identity) {}

  //! Record `[ptr, ptr + size)`; returns its bus base and a key to remove it.
  std::uint64_t add(void* ptr, std::size_t size, std::uint64_t& key) {
    std::unique_lock lock(mutex_);
    const std::uint64_t bus = identity_ ? reinterpret_cast<std::uint64_t>(ptr) : next_bus_;
    if (!identity_) next_bus_ += size + dma_page_size; // a guard page between regions
    key = next_key_++;
    regions_.emplace(bus, region{bus, size, static_cast<unsigned char*>(ptr), key});
    return bus;
  }
  void remove(std::uint64_t bus, std::uint64_t key) {
    std::unique_lock lock(mutex_);
    auto [lo, hi] = regions_.equal_range(bus);
    for (auto it = lo; it != hi; ++it) {
      if (it->second.key == key) {
        regions_.erase(it);
        return;
      }
    }
  }
  //! Virtual address of `[bus, bus + len)` if one mapping holds all of it, else nullptr.
  void* translate(std::uint64_t bus, std::uint64_t len) const {
    std::shared_lock lock(mutex_);
    auto it = regions_.upper_bound(bus);
    while (it != regions_.begin()) {
      --it;
      const region& r = it->second;
      if (bus - r.bus < r.size && len <= r.size - (bus - r.bus)) return r.vaddr + (bus - r.bus);
      if (!identity_) break; // regions never overlap: only the nearest one can hold it
    }
    return nullptr;
  }
  bool identity() const { return identity_; }

private:
  struct region {
    std::uint64_t bus;
    std::uint64_t size;
    unsigned char* vaddr;
    std::uint64_t key;
  };
  const bool identity_;
  mutable std::shared_mutex mutex_;
  std::multimap<std::uint64_t, region> regions_;
  std::uint64_t next_bus_ = fake_bus_base;
  std::uint64_t next_key_ = 1;
};

//! A mapping in a `dma_table`; removes itself when destroyed (even after the controller).
class emu_dma_region final : public dma_region {
public:
  emu_dma_region(std::shared_ptr<dma_table> table, void* ptr, std::size_t size, memory_kind kind,
                 std::uint64_t bus, std::uint64_t key)
      : dma_region(ptr, size, kind, page_list(bus, size)), table_(std::move(table)), bus_(bus),
        key_(key) {}
  ~emu_dma_region() override { table_->remove(bus_, key_); }

private:
  static std::vector<std::uint64_t> page_list(std::uint64_t bus, std::size_t size) {
    std::vector<std::uint64_t> pages(size / dma_page_size);
    for (std::size_t i = 0; i < pages.size(); ++i)
      pages[i] = bus + i * dma_page_size;
    return pages;
  }
  std::shared_ptr<dma_table> table_;
  std::uint64_t bus_;
  std::uint64_t key_;
};

} // namespace detail

//! The software NVMe controller. Create it with `make_controller`.
class controller : public transport {
public:
  explicit controller(controller_config cfg)
      : cfg_(std::move(cfg)), dma_(std::make_shared<detail::dma_table>(cfg_.identity_dma)),
        started_ns_(bam::detail::now_ns()) {
    validate_config();
    for (const auto& n : cfg_.namespaces) {
      ns_.push_back({n.blocks, n.lba_size, static_cast<std::uint32_t>(std::countr_zero(n.lba_size)),
                     n.backing ? n.backing : make_ram_media(n.blocks * n.lba_size)});
    }
    doorbell_stride_ = 4u << cfg_.dstrd;
    const std::size_t db_bytes =
        static_cast<std::size_t>(2) * (cfg_.max_io_queues + 1) * doorbell_stride_;
    regs_bytes_ = transport::round_up(nvme::reg::doorbell_base + db_bytes);
    regs_.reset(static_cast<std::uint32_t*>(std::aligned_alloc(dma_page_size, regs_bytes_)));
    if (!regs_) throw_errno("allocating the register file", ENOMEM, cfg_.name);
    std::memset(regs_.get(), 0, regs_bytes_);

    nvme::cap_register cap{};
    cap.bits.mqes = cfg_.max_queue_entries - 1;
    cap.bits.cqr = 1;
    cap.bits.to = cfg_.cap_to;
    cap.bits.dstrd = cfg_.dstrd;
    cap.bits.css = 1; // NVM command set
    cap.bits.mpsmin = 0;
    cap.bits.mpsmax = 0;
    cap_ = cap.raw;

    sqs_.resize(cfg_.max_io_queues + 1);
    cqs_.resize(cfg_.max_io_queues + 1);
    processed_ = std::make_unique<std::atomic<std::uint64_t>[]>(cfg_.max_io_queues + 1);
    for (std::uint32_t i = 0; i <= cfg_.max_io_queues; ++i)
      processed_[i].store(0);

    admin_engine_ = std::make_unique<cpu_engine>(1, cfg_.name + "-a");
    if (cfg_.io_engine) {
      io_engine_ = cfg_.io_engine;
    } else {
      io_engine_ = std::make_shared<cpu_engine>(cfg_.engine_threads, cfg_.name);
    }
  }

  ~controller() override {
    admin_engine_.reset(); // joins the admin thread
    io_engine_->reset();
    io_engine_.reset();
  }
  controller(const controller&) = delete;
  controller& operator=(const controller&) = delete;

  // -------------------------------------------------------------------------
  // transport
  // -------------------------------------------------------------------------

  std::string name() const override { return cfg_.name; }

  std::uint32_t read32(std::uint32_t offset) override {
    check_register(offset);
    if (offset >= nvme::reg::doorbell_base) return detail::load_doorbell(reg_word(offset));
    std::lock_guard lock(reg_mutex_);
    switch (offset) {
    case nvme::reg::cap: return static_cast<std::uint32_t>(cap_);
    case nvme::reg::cap + 4: return static_cast<std::uint32_t>(cap_ >> 32);
    case nvme::reg::vs: return detail::emu_version;
    case nvme::reg::intms:
    case nvme::reg::intmc: return intm_;
    case nvme::reg::cc: return cc_.raw;
    case nvme::reg::csts: return csts_locked().raw;
    case nvme::reg::aqa: return aqa_.raw;
    case nvme::reg::asq: return static_cast<std::uint32_t>(asq_);
    case nvme::reg::asq + 4: return static_cast<std::uint32_t>(asq_ >> 32);
    case nvme::reg::acq: return static_cast<std::uint32_t>(acq_);
    case nvme::reg::acq + 4: return static_cast<std::uint32_t>(acq_ >> 32);
    default: return 0;
    }
  }

  void write32(std::uint32_t offset, std::uint32_t value) override {
    check_register(offset);
    if (offset >= nvme::reg::doorbell_base) {
      std::atomic_ref<std::uint32_t>(*reg_word(offset)).store(value, std::memory_order_release);
      return;
    }
    std::lock_guard lock(reg_mutex_);
    switch (offset) {
    case nvme::reg::intms: intm_ |= value; break;
    case nvme::reg::intmc: intm_ &= ~value; break;
    case nvme::reg::cc: write_cc(value); break;
    case nvme::reg::aqa: aqa_.raw = value; break;
    case nvme::reg::asq: asq_ = (asq_ & ~0xffffffffull) | value; break;
    case nvme::reg::asq + 4: asq_ = (asq_ & 0xffffffffull) | (std::uint64_t{value} << 32); break;
    case nvme::reg::acq: acq_ = (acq_ & ~0xffffffffull) | value; break;
    case nvme::reg::acq + 4: acq_ = (acq_ & 0xffffffffull) | (std::uint64_t{value} << 32); break;
    default: break; // read-only or reserved: ignored
    }
  }

  volatile std::uint32_t* doorbell(std::uint32_t offset) override {
    check_register(offset);
    if (offset < nvme::reg::doorbell_base) {
      error_context c;
      c.controller = cfg_.name;
      c.errnum = EINVAL;
      throw error("register offset " + std::to_string(offset) + " is not a doorbell", c);
    }
    return reg_word(offset);
  }

  volatile std::uint32_t* device_doorbell(std::uint32_t offset) override {
    return io_engine_->device_doorbell(offset);
  }

  std::unique_ptr<dma_region> map(void* ptr, std::size_t size, memory_kind kind) override {
    check_map_args(ptr, size);
    if (kind == memory_kind::device && !dma_->identity()) {
      error_context c;
      c.controller = cfg_.name;
      c.errnum = ENOTSUP;
      throw error("the software controller's CPU engine cannot reach GPU memory "
                  "(map it with identity_dma and a GPU engine)",
                  c);
    }
    std::uint64_t key = 0;
    const std::uint64_t bus = dma_->add(ptr, size, key);
    return std::make_unique<detail::emu_dma_region>(dma_, ptr, size, kind, bus, key);
  }

  // -------------------------------------------------------------------------
  // Emulation controls and introspection
  // -------------------------------------------------------------------------

  const controller_config& config() const noexcept { return cfg_; }
  //! Fault rules and the global added latency.
  fault_injector& faults() noexcept { return faults_; }
  //! Stop (true) or resume fetching and completing commands; registers keep working.
  void stop_answering(bool stop) {
    answering_.store(!stop, std::memory_order_release);
    admin_engine_->pause(stop);
    io_engine_->pause(stop);
  }
  bool answering() const { return answering_.load(std::memory_order_acquire); }
  //! Commands fetched from all queues / from SQ `qid` (dropped ones included).
  std::uint64_t commands_processed() const {
    std::uint64_t n = 0;
    for (std::uint32_t i = 0; i <= cfg_.max_io_queues; ++i)
      n += processed_[i].load();
    return n;
  }
  std::uint64_t commands_processed(std::uint16_t qid) const {
    return qid <= cfg_.max_io_queues ? processed_[qid].load() : 0;
  }
  controller_counters counters() const {
    return {units_read_.load(),  units_written_.load(), host_reads_.load(),
            host_writes_.load(), media_errors_.load(),  error_count_.load()};
  }
  std::uint32_t namespace_count() const { return static_cast<std::uint32_t>(ns_.size()); }
  //! The media of namespace `nsid` (1-based), e.g. to preload or inspect data.
  media& namespace_media(std::uint32_t nsid) {
    if (nsid == 0 || nsid > ns_.size()) {
      error_context c;
      c.controller = cfg_.name;
      c.errnum = EINVAL;
      throw error("no namespace " + std::to_string(nsid), c);
    }
    return *ns_[nsid - 1].backing;
  }
  //! Virtual address of bus range `[bus, bus + len)`, nullptr if not mapped as a whole.
  void* translate(std::uint64_t bus, std::uint64_t len) const { return dma_->translate(bus, len); }

  //! Execute one NVM command: namespace and LBA checks, PRPs, media. No fault
  //! rules, no counting of fetched commands. Safe from any thread.
  command_outcome execute_nvm(const nvme::command& cmd) {
    command_outcome out;
    out.status = run_nvm(cmd);
    return out;
  }

  //! What an engine calls for each command it fetches from SQ `qid`:
  //! statistics, fault rules, execution, error log.
  command_outcome process(const nvme::command& cmd, std::uint16_t qid) {
    if (qid <= cfg_.max_io_queues) processed_[qid].fetch_add(1, std::memory_order_relaxed);
    const fault_decision f = faults_.check(cmd, qid);
    command_outcome out;
    if (f.matched && f.action == fault_action::drop) {
      out.drop = true;
      return out;
    }
    if (f.matched && f.action == fault_action::fail) {
      out.status = f.status;
    } else {
      out = qid == 0 ? run_admin(cmd) : execute_nvm(cmd);
      if (f.matched && f.action == fault_action::delay) out.delay_ns += f.latency_ns;
    }
    if (!out.drop) out.delay_ns += faults_.global_latency_ns();
    if (!out.status.ok()) log_error(cmd, qid, out.status);
    return out;
  }

private:
  struct ns_info {
    std::uint64_t blocks;
    std::uint32_t lba_size;
    std::uint32_t lba_shift;
    std::shared_ptr<media> backing;
  };
  struct io_sq {
    std::uint16_t cqid;
    std::uint32_t depth;
  };
  struct io_cq {
    std::unique_ptr<cq_state> state;
    std::uint64_t bus;
    std::uint32_t sq_users = 0;
  };
  struct free_deleter {
    void operator()(void* p) const { std::free(p); }
  };

  [[noreturn]] void config_error(const std::string& what) const {
    error_context c;
    c.controller = cfg_.name;
    c.errnum = EINVAL;
    throw error("invalid software controller configuration: " + what, c);
  }

  void validate_config() const {
    if (cfg_.max_queue_entries < 2 || cfg_.max_queue_entries > nvme::max_io_queue_entries)
      config_error("max_queue_entries must be 2.." + std::to_string(nvme::max_io_queue_entries));
    if (cfg_.max_io_queues < 1 || cfg_.max_io_queues > detail::num_queues_field_max + 1)
      config_error("max_io_queues must be 1.." + std::to_string(detail::num_queues_field_max + 1));
    if (cfg_.dstrd > 7) config_error("dstrd must be 0..7");
    if (cfg_.mdts > 16) config_error("mdts must be 0..16");
    std::uint32_t nsid = 1;
    for (const auto& n : cfg_.namespaces) {
      const std::string which = "namespace " + std::to_string(nsid++);
      if (n.blocks == 0) config_error(which + " has no blocks");
      if (n.lba_size < 512 || n.lba_size > 65536 || !std::has_single_bit(n.lba_size))
        config_error(which + ": lba_size must be a power of two, 512..65536");
      if (n.backing && n.backing->size() / n.lba_size < n.blocks)
        config_error(which + ": media " + n.backing->describe() + " is smaller than " +
                     std::to_string(n.blocks) + " blocks of " + std::to_string(n.lba_size));
    }
  }

  void check_register(std::uint32_t offset) const {
    if (offset % 4 != 0 || offset >= regs_bytes_) {
      error_context c;
      c.controller = cfg_.name;
      c.errnum = EINVAL;
      throw error("register offset " + std::to_string(offset) + " outside the register file", c);
    }
  }
  std::uint32_t* reg_word(std::uint32_t offset) const { return regs_.get() + offset / 4; }
  std::uint32_t* sq_doorbell_word(std::uint16_t qid) const {
    return reg_word(nvme::sq_doorbell_offset(qid, cfg_.dstrd));
  }
  std::uint32_t* cq_doorbell_word(std::uint16_t qid) const {
    return reg_word(nvme::cq_doorbell_offset(qid, cfg_.dstrd));
  }

  // ---- CC / CSTS (reg_mutex_ held) ---------------------------------------

  nvme::csts_register csts_locked() const {
    nvme::csts_register c = csts_;
    if (enabled_ && !c.bits.cfs && bam::detail::now_ns() >= ready_at_ns_) c.bits.rdy = 1;
    return c;
  }

  void write_cc(std::uint32_t value) {
    nvme::cc_register next{};
    next.raw = value;
    const nvme::cc_register prev = cc_;
    cc_ = next;
    if (!prev.bits.en && next.bits.en) {
      enable();
    } else if (prev.bits.en && !next.bits.en) {
      reset_controller();
    }
    if (next.bits.en && next.bits.shn != prev.bits.shn &&
        next.bits.shn != static_cast<std::uint32_t>(nvme::shutdown_notification::none)) {
      shutdown(next.bits.shn == static_cast<std::uint32_t>(nvme::shutdown_notification::normal));
    }
  }

  void enable() {
    const nvme::cc_register cc = cc_;
    const std::uint32_t asq_entries = aqa_.bits.asqs + 1;
    const std::uint32_t acq_entries = aqa_.bits.acqs + 1;
    void* sq = nullptr;
    void* cq = nullptr;
    const bool ok = cc.bits.iosqes == nvme::sq_entry_log2 &&
                    cc.bits.iocqes == nvme::cq_entry_log2 && cc.bits.mps == 0 && cc.bits.css == 0 &&
                    cc.bits.ams == 0 && asq_entries >= 2 && acq_entries >= 2 &&
                    asq_ % dma_page_size == 0 && acq_ % dma_page_size == 0 &&
                    (sq = dma_->translate(asq_, asq_entries * sizeof(nvme::command))) != nullptr &&
                    (cq = dma_->translate(acq_, acq_entries * sizeof(nvme::completion))) != nullptr;
    if (!ok) {
      csts_.bits.cfs = 1; // a configuration the controller cannot run: fatal until reset
      return;
    }
    admin_cq_ = std::make_unique<cq_state>();
    admin_cq_->ring = static_cast<nvme::completion*>(cq);
    admin_cq_->depth = acq_entries;
    admin_cq_->head_doorbell = cq_doorbell_word(0);
    admin_cq_->cqid = 0;
    ready_at_ns_ = bam::detail::now_ns() + cfg_.ready_delay_ns;
    enabled_ = true;
    queue_info q;
    q.qid = 0;
    q.sq = static_cast<nvme::command*>(sq);
    q.sq_depth = asq_entries;
    q.sq_tail_doorbell = sq_doorbell_word(0);
    q.cq = admin_cq_.get();
    q.sq_bus = asq_;
    q.cq_bus = acq_;
    q.ready_at_ns = ready_at_ns_;
    q.process = [this](const nvme::command& c) { return process(c, 0); };
    admin_engine_->queue_created(q);
  }

  //! Controller reset (CC.EN 1 -> 0): every queue is gone, doorbells read 0.
  void reset_controller() {
    admin_engine_->reset();
    io_engine_->reset();
    {
      std::lock_guard lock(queues_mutex_);
      for (auto& s : sqs_)
        s.reset();
      for (auto& c : cqs_)
        c.reset();
      allocated_queues_.reset();
      async_events_ = 0;
    }
    admin_cq_.reset();
    for (std::uint32_t off = nvme::reg::doorbell_base; off < regs_bytes_; off += 4)
      std::atomic_ref<std::uint32_t>(*reg_word(off)).store(0, std::memory_order_release);
    csts_.raw = 0;
    enabled_ = false;
    ready_at_ns_ = 0;
  }

  void shutdown(bool normal) {
    if (normal) {
      for (auto& n : ns_)
        n.backing->flush();
    }
    csts_.bits.shst = static_cast<std::uint32_t>(nvme::shutdown_status::complete);
  }

  // ---- DMA --------------------------------------------------------------

  //! The host memory pieces the PRPs of a `bytes` transfer describe.
  nvme::status prp_segments(std::uint64_t prp1, std::uint64_t prp2, std::uint64_t bytes,
                            std::vector<iovec>& segs) const {
    segs.clear();
    auto read_list = [&](std::uint64_t bus, std::uint64_t* dst, std::size_t n) {
      const void* p = dma_->translate(bus, n * sizeof(std::uint64_t));
      if (p == nullptr) return false;
      std::memcpy(dst, p, n * sizeof(std::uint64_t));
      return true;
    };
    auto segment = [&](std::uint64_t bus, std::uint64_t len) {
      void* p = dma_->translate(bus, len);
      if (p == nullptr) return false;
      if (!segs.empty() &&
          static_cast<unsigned char*>(segs.back().iov_base) + segs.back().iov_len == p)
        segs.back().iov_len += len; // contiguous in virtual memory too: merge
      else
        segs.push_back({p, len});
      return true;
    };
    return nvme::walk_prp(prp1, prp2, bytes, dma_page_size, read_list, segment);
  }

  static std::vector<iovec>& scratch_segments() {
    thread_local std::vector<iovec> segs;
    return segs;
  }

  nvme::status copy_to_host(const nvme::command& cmd, const void* src, std::size_t len) const {
    auto& segs = scratch_segments();
    const nvme::status st = prp_segments(cmd.prp1, cmd.prp2, len, segs);
    if (!st.ok()) return st;
    detail::scatter(static_cast<const unsigned char*>(src), segs);
    return nvme::status_success;
  }
  nvme::status copy_from_host(const nvme::command& cmd, void* dst, std::size_t len) const {
    auto& segs = scratch_segments();
    const nvme::status st = prp_segments(cmd.prp1, cmd.prp2, len, segs);
    if (!st.ok()) return st;
    detail::gather(static_cast<unsigned char*>(dst), segs);
    return nvme::status_success;
  }

  // ---- NVM command set ----------------------------------------------------

  nvme::status run_nvm(const nvme::command& cmd) {
    namespace generic_status = nvme::generic_status;
    using op = nvme::nvm_opcode;
    switch (static_cast<op>(cmd.opcode)) {
    case op::read:
    case op::write:
    case op::flush:
    case op::write_zeroes:
    case op::dataset_management: break;
    default: return detail::generic(generic_status::invalid_opcode);
    }
    if ((cmd.flags & (detail::flags_fuse_mask | detail::flags_psdt_mask)) != 0)
      return detail::generic(generic_status::invalid_field); // no fused commands, no SGLs
    if (static_cast<op>(cmd.opcode) == op::flush && cmd.nsid == detail::nsid_broadcast) {
      for (auto& n : ns_)
        if (n.backing->flush() != 0) return media_failure(false);
      return nvme::status_success;
    }
    if (cmd.nsid == 0 || cmd.nsid > ns_.size())
      return detail::generic(generic_status::invalid_namespace);
    ns_info& ns = ns_[cmd.nsid - 1];
    switch (static_cast<op>(cmd.opcode)) {
    case op::flush: return ns.backing->flush() == 0 ? nvme::status_success : media_failure(false);
    case op::read:
    case op::write: return read_write(ns, cmd, static_cast<op>(cmd.opcode) == op::write);
    case op::write_zeroes: {
      const std::uint64_t slba = nvme::command_slba(cmd);
      const std::uint64_t nlb = nvme::command_nblocks(cmd);
      if (!lba_range_ok(ns, slba, nlb)) return detail::generic(generic_status::lba_out_of_range);
      const std::uint64_t off = slba << ns.lba_shift, len = nlb << ns.lba_shift;
      const int err = (cmd.cdw12 & detail::write_zeroes_deac) ? ns.backing->deallocate(off, len)
                                                              : ns.backing->write_zeroes(off, len);
      return err == 0 ? nvme::status_success : media_failure(false);
    }
    case op::dataset_management: return dataset_management(ns, cmd);
    default: return detail::generic(generic_status::invalid_opcode);
    }
  }

  static bool lba_range_ok(const ns_info& ns, std::uint64_t slba, std::uint64_t nlb) {
    return slba < ns.blocks && nlb <= ns.blocks - slba;
  }

  nvme::status media_failure(bool reading) {
    media_errors_.fetch_add(1, std::memory_order_relaxed);
    return detail::media_error(reading ? nvme::media_status::unrecovered_read_error
                                       : nvme::media_status::write_fault);
  }

  nvme::status read_write(ns_info& ns, const nvme::command& cmd, bool is_write) {
    namespace generic_status = nvme::generic_status;
    const std::uint64_t slba = nvme::command_slba(cmd);
    const std::uint64_t nlb = nvme::command_nblocks(cmd);
    const std::uint64_t bytes = nlb << ns.lba_shift;
    if (cfg_.mdts != 0 && bytes > (dma_page_size << cfg_.mdts))
      return detail::generic(generic_status::invalid_field);
    if (!lba_range_ok(ns, slba, nlb)) return detail::generic(generic_status::lba_out_of_range);
    auto& segs = scratch_segments();
    const nvme::status st = prp_segments(cmd.prp1, cmd.prp2, bytes, segs);
    if (!st.ok()) return st;
    const std::uint64_t off = slba << ns.lba_shift;
    const int err = is_write ? ns.backing->write(off, segs) : ns.backing->read(off, segs);
    if (err != 0) return media_failure(!is_write);
    // SMART data units count thousands of 512-byte units; keep 512-byte units here.
    const std::uint64_t units = bytes / 512;
    if (is_write) {
      units_written_.fetch_add(units, std::memory_order_relaxed);
      host_writes_.fetch_add(1, std::memory_order_relaxed);
    } else {
      units_read_.fetch_add(units, std::memory_order_relaxed);
      host_reads_.fetch_add(1, std::memory_order_relaxed);
    }
    return nvme::status_success;
  }

  nvme::status dataset_management(ns_info& ns, const nvme::command& cmd) {
    const std::uint32_t nranges = (cmd.cdw10 & 0xffu) + 1;
    std::vector<nvme::dsm_range> ranges(nranges);
    const nvme::status st = copy_from_host(cmd, ranges.data(), nranges * sizeof(nvme::dsm_range));
    if (!st.ok()) return st;
    if ((cmd.cdw11 & nvme::dsm_deallocate) == 0) return nvme::status_success; // hints only
    for (const auto& r : ranges)
      if (!lba_range_ok(ns, r.slba, r.nblocks) && r.nblocks != 0)
        return detail::generic(nvme::generic_status::lba_out_of_range);
    for (const auto& r : ranges) {
      if (r.nblocks == 0) continue;
      if (ns.backing->deallocate(r.slba << ns.lba_shift, static_cast<std::uint64_t>(r.nblocks)
                                                             << ns.lba_shift) != 0)
        return media_failure(false);
    }
    return nvme::status_success;
  }

  // ---- Admin command set --------------------------------------------------

  command_outcome run_admin(const nvme::command& cmd) {
    using op = nvme::admin_opcode;
    command_outcome out;
    if ((cmd.flags & (detail::flags_fuse_mask | detail::flags_psdt_mask)) != 0) {
      out.status = detail::generic(nvme::generic_status::invalid_field);
      return out;
    }
    switch (static_cast<op>(cmd.opcode)) {
    case op::identify: out.status = identify(cmd); break;
    case op::set_features:
    case op::get_features:
      out.status = features(cmd, static_cast<op>(cmd.opcode) == op::set_features, out.dw0);
      break;
    case op::create_io_cq: out.status = create_cq(cmd); break;
    case op::create_io_sq: out.status = create_sq(cmd); break;
    case op::delete_io_sq: out.status = delete_sq(cmd); break;
    case op::delete_io_cq: out.status = delete_cq(cmd); break;
    case op::get_log_page: out.status = get_log_page(cmd); break;
    case op::abort: out.dw0 = 1; break; // bit 0 set: the command was not aborted
    case op::async_event_request: {
      // Held until an event occurs; this controller raises none.
      std::lock_guard lock(queues_mutex_);
      if (async_events_ >= detail::max_async_events) {
        out.status = detail::specific(detail::async_event_limit_exceeded);
      } else {
        ++async_events_;
        out.drop = true;
      }
      break;
    }
    default: out.status = detail::generic(nvme::generic_status::invalid_opcode); break;
    }
    return out;
  }

  nvme::status identify(const nvme::command& cmd) {
    namespace generic_status = nvme::generic_status;
    alignas(8) unsigned char page[nvme::identify_data_size] = {};
    switch (static_cast<nvme::identify_cns>(cmd.cdw10 & 0xffu)) {
    case nvme::identify_cns::ns: {
      if (cmd.nsid == 0 || (cmd.nsid > ns_.size() && cmd.nsid != detail::nsid_broadcast))
        return detail::generic(generic_status::invalid_namespace);
      auto* id = reinterpret_cast<nvme_id_ns*>(page);
      if (cmd.nsid != detail::nsid_broadcast) {
        const ns_info& ns = ns_[cmd.nsid - 1];
        id->nsze = ns.blocks;
        id->ncap = ns.blocks;
        id->nuse = ns.blocks;
        id->lbaf[0].ds = static_cast<std::uint8_t>(ns.lba_shift);
      } else {
        id->lbaf[0].ds = 9; // capabilities common to all namespaces
      }
      id->nlbaf = 0;
      id->flbas = 0;
      id->dlfeat = detail::dlfeat_value;
      break;
    }
    case nvme::identify_cns::controller: {
      auto* id = reinterpret_cast<nvme_id_ctrl*>(page);
      id->vid = detail::emu_vendor_id;
      id->ssvid = detail::emu_vendor_id;
      detail::set_ascii(id->sn, sizeof id->sn, "BAMEMU-" + cfg_.name);
      detail::set_ascii(id->mn, sizeof id->mn, detail::emu_model);
      detail::set_ascii(id->fr, sizeof id->fr, detail::emu_firmware);
      id->mdts = cfg_.mdts;
      id->cntlid = 1;
      id->ver = detail::emu_version;
      id->cntrltype = detail::cntrltype_io;
      id->acl = detail::abort_limit - 1;
      id->aerl = detail::max_async_events - 1;
      id->frmw = detail::frmw_value;
      id->lpa = 0;
      id->elpe = detail::error_log_entries - 1;
      id->sqes = detail::sqes_value;
      id->cqes = detail::cqes_value;
      id->nn = static_cast<std::uint32_t>(ns_.size());
      id->oncs = NVME_CTRL_ONCS_DSM | NVME_CTRL_ONCS_WRITE_ZEROES;
      id->vwc = detail::vwc_value;
      const std::string nqn = "nqn.2024-01.org.bam:emu:" + cfg_.name;
      std::strncpy(id->subnqn, nqn.c_str(), sizeof id->subnqn - 1);
      break;
    }
    case nvme::identify_cns::active_ns_list: {
      if (cmd.nsid >= detail::nsid_broadcast - 1)
        return detail::generic(generic_status::invalid_namespace);
      auto* list = reinterpret_cast<std::uint32_t*>(page);
      std::size_t n = 0;
      for (std::uint32_t id = cmd.nsid + 1; id <= ns_.size() && n < detail::ns_list_entries; ++id)
        list[n++] = id;
      break;
    }
    default: return detail::generic(generic_status::invalid_field);
    }
    return copy_to_host(cmd, page, sizeof page);
  }

  nvme::status features(const nvme::command& cmd, bool set, std::uint32_t& dw0) {
    using nvme::feature_id;
    const std::uint32_t select =
        (cmd.cdw10 >> detail::features_select_shift) & detail::features_select_mask;
    if (!set && select > 1)
      return detail::generic(nvme::generic_status::invalid_field); // current/default only
    switch (static_cast<feature_id>(cmd.cdw10 & 0xffu)) {
    case feature_id::number_of_queues: {
      std::lock_guard lock(queues_mutex_);
      if (set) {
        const std::uint32_t nsqr = cmd.cdw11 & 0xffffu, ncqr = cmd.cdw11 >> 16;
        if (nsqr > detail::num_queues_field_max || ncqr > detail::num_queues_field_max)
          return detail::generic(nvme::generic_status::invalid_field);
        const std::uint32_t cap = cfg_.max_io_queues - 1;
        allocated_queues_ = std::pair{std::min(nsqr, cap), std::min(ncqr, cap)};
      }
      const auto [nsqa, ncqa] =
          allocated_queues_.value_or(std::pair{cfg_.max_io_queues - 1, cfg_.max_io_queues - 1});
      dw0 = nsqa | (ncqa << 16);
      return nvme::status_success;
    }
    case feature_id::volatile_write_cache:
      if (set) write_cache_.store((cmd.cdw11 & 1u) != 0, std::memory_order_relaxed);
      dw0 = write_cache_.load(std::memory_order_relaxed) ? 1u : 0u;
      return nvme::status_success;
    default: return detail::generic(nvme::generic_status::invalid_field);
    }
  }

  //! Highest I/O queue id the host may create now (queues_mutex_ held).
  std::uint32_t queue_id_limit() const {
    return allocated_queues_ ? allocated_queues_->first + 1 : cfg_.max_io_queues;
  }

  nvme::status create_cq(const nvme::command& cmd) {
    namespace css = nvme::command_specific_status;
    const std::uint32_t qid = cmd.cdw10 & 0xffffu;
    const std::uint32_t entries = (cmd.cdw10 >> 16) + 1;
    std::lock_guard lock(queues_mutex_);
    const std::uint32_t limit =
        allocated_queues_ ? allocated_queues_->second + 1 : cfg_.max_io_queues;
    if (qid == 0 || qid > limit || cqs_[qid])
      return detail::specific(css::invalid_queue_identifier);
    if (entries < 2 || entries > cfg_.max_queue_entries)
      return detail::specific(css::invalid_queue_size);
    if ((cmd.cdw11 & 1u) == 0)
      return detail::generic(nvme::generic_status::invalid_field); // CAP.CQR
    if (cmd.prp1 % dma_page_size != 0)
      return detail::generic(nvme::generic_status::invalid_prp_offset);
    void* ring = dma_->translate(cmd.prp1, std::uint64_t{entries} * sizeof(nvme::completion));
    if (ring == nullptr) return detail::generic(nvme::generic_status::data_transfer_error);
    auto st = std::make_unique<cq_state>();
    st->ring = static_cast<nvme::completion*>(ring);
    st->depth = entries;
    st->head_doorbell = cq_doorbell_word(static_cast<std::uint16_t>(qid));
    st->cqid = static_cast<std::uint16_t>(qid);
    // A fresh queue: its doorbell starts at 0 whatever was written there before.
    std::atomic_ref<std::uint32_t>(*st->head_doorbell).store(0, std::memory_order_release);
    cqs_[qid] = io_cq{std::move(st), cmd.prp1, 0};
    return nvme::status_success;
  }

  nvme::status create_sq(const nvme::command& cmd) {
    namespace css = nvme::command_specific_status;
    const std::uint32_t qid = cmd.cdw10 & 0xffffu;
    const std::uint32_t entries = (cmd.cdw10 >> 16) + 1;
    const std::uint32_t cqid = cmd.cdw11 >> 16;
    queue_info q;
    {
      std::lock_guard lock(queues_mutex_);
      if (qid == 0 || qid > queue_id_limit() || sqs_[qid])
        return detail::specific(css::invalid_queue_identifier);
      if (entries < 2 || entries > cfg_.max_queue_entries)
        return detail::specific(css::invalid_queue_size);
      if ((cmd.cdw11 & 1u) == 0) return detail::generic(nvme::generic_status::invalid_field);
      if (cqid == 0 || cqid > cfg_.max_io_queues || !cqs_[cqid])
        return detail::specific(css::invalid_completion_queue);
      if (cmd.prp1 % dma_page_size != 0)
        return detail::generic(nvme::generic_status::invalid_prp_offset);
      void* ring = dma_->translate(cmd.prp1, std::uint64_t{entries} * sizeof(nvme::command));
      if (ring == nullptr) return detail::generic(nvme::generic_status::data_transfer_error);
      sqs_[qid] = io_sq{static_cast<std::uint16_t>(cqid), entries};
      ++cqs_[cqid]->sq_users;
      q.qid = static_cast<std::uint16_t>(qid);
      q.sq = static_cast<nvme::command*>(ring);
      q.sq_depth = entries;
      q.sq_tail_doorbell = sq_doorbell_word(q.qid);
      q.cq = cqs_[cqid]->state.get();
      q.sq_bus = cmd.prp1;
      q.cq_bus = cqs_[cqid]->bus;
      std::atomic_ref<std::uint32_t>(*q.sq_tail_doorbell).store(0, std::memory_order_release);
    }
    q.process = [this, id = q.qid](const nvme::command& c) { return process(c, id); };
    io_engine_->queue_created(q);
    return nvme::status_success;
  }

  nvme::status delete_sq(const nvme::command& cmd) {
    const std::uint32_t qid = cmd.cdw10 & 0xffffu;
    {
      std::lock_guard lock(queues_mutex_);
      if (qid == 0 || qid > cfg_.max_io_queues || !sqs_[qid])
        return detail::specific(nvme::command_specific_status::invalid_queue_identifier);
    }
    io_engine_->queue_deleted(static_cast<std::uint16_t>(qid));
    std::lock_guard lock(queues_mutex_);
    --cqs_[sqs_[qid]->cqid]->sq_users;
    sqs_[qid].reset();
    return nvme::status_success;
  }

  nvme::status delete_cq(const nvme::command& cmd) {
    namespace css = nvme::command_specific_status;
    const std::uint32_t qid = cmd.cdw10 & 0xffffu;
    std::lock_guard lock(queues_mutex_);
    if (qid == 0 || qid > cfg_.max_io_queues || !cqs_[qid])
      return detail::specific(css::invalid_queue_identifier);
    if (cqs_[qid]->sq_users != 0) return detail::specific(css::invalid_queue_deletion);
    cqs_[qid].reset();
    return nvme::status_success;
  }

  nvme::status get_log_page(const nvme::command& cmd) {
    const std::uint8_t lid = cmd.cdw10 & 0xffu;
    const std::uint64_t numd = ((cmd.cdw10 >> 16) | (std::uint64_t{cmd.cdw11 & 0xffffu} << 16)) + 1;
    const std::uint64_t bytes = numd * 4;
    const std::uint64_t offset = cmd.cdw12 | (std::uint64_t{cmd.cdw13} << 32);
    std::vector<unsigned char> log;
    switch (static_cast<nvme::log_page_id>(lid)) {
    case nvme::log_page_id::error_information: {
      log.assign(detail::error_log_entries * sizeof(nvme_error_log_page), 0);
      std::lock_guard lock(error_mutex_);
      std::size_t i = 0;
      for (auto it = error_log_.rbegin(); it != error_log_.rend(); ++it, ++i) // newest first
        std::memcpy(log.data() + i * sizeof(nvme_error_log_page), &*it,
                    sizeof(nvme_error_log_page));
      break;
    }
    case nvme::log_page_id::smart_health: {
      log.assign(detail::health_log_size, 0);
      auto* s = reinterpret_cast<nvme_smart_log*>(log.data());
      const std::uint16_t t = detail::reported_temperature_k;
      std::memcpy(s->temperature, &t, sizeof t);
      s->avail_spare = 100;
      s->spare_thresh = 10;
      const controller_counters c = counters();
      constexpr std::uint64_t units_per_data_unit = 1000; // "thousands of 512 bytes", rounded up
      detail::set_u128(s->data_units_read,
                       (c.data_units_read + units_per_data_unit - 1) / units_per_data_unit);
      detail::set_u128(s->data_units_written,
                       (c.data_units_written + units_per_data_unit - 1) / units_per_data_unit);
      detail::set_u128(s->host_reads, c.host_reads);
      detail::set_u128(s->host_writes, c.host_writes);
      detail::set_u128(s->power_cycles, 1);
      constexpr std::uint64_t ns_per_hour = 3'600'000'000'000ull;
      detail::set_u128(s->power_on_hours, (bam::detail::now_ns() - started_ns_) / ns_per_hour);
      detail::set_u128(s->media_errors, c.media_errors);
      detail::set_u128(s->num_err_log_entries, c.error_log_entries);
      break;
    }
    case nvme::log_page_id::firmware_slot: {
      log.assign(detail::health_log_size, 0);
      auto* f = reinterpret_cast<nvme_firmware_slot*>(log.data());
      f->afi = 1; // slot 1 active
      detail::set_ascii(f->frs[0], sizeof f->frs[0], detail::emu_firmware);
      break;
    }
    default: return detail::specific(nvme::command_specific_status::invalid_log_page);
    }
    if (offset % 4 != 0 || offset >= log.size())
      return detail::generic(nvme::generic_status::invalid_field);
    std::vector<unsigned char> out(bytes, 0); // past the end of the log: zeroes
    std::memcpy(out.data(), log.data() + offset,
                std::min<std::uint64_t>(bytes, log.size() - offset));
    return copy_to_host(cmd, out.data(), out.size());
  }

  void log_error(const nvme::command& cmd, std::uint16_t qid, nvme::status st) {
    nvme_error_log_page e{};
    const std::uint64_t count = error_count_.fetch_add(1, std::memory_order_relaxed) + 1;
    e.error_count = count;
    e.sqid = qid;
    e.cmdid = cmd.cid;
    e.status_field = static_cast<std::uint16_t>(st.raw << 1);
    e.parm_error_location = 0xffff; // not reported
    e.lba = qid != 0 ? nvme::command_slba(cmd) : 0;
    e.nsid = cmd.nsid;
    std::lock_guard lock(error_mutex_);
    error_log_.push_back(e);
    if (error_log_.size() > detail::error_log_entries) error_log_.pop_front();
  }

  controller_config cfg_;
  std::shared_ptr<detail::dma_table> dma_;
  std::uint64_t started_ns_;
  std::vector<ns_info> ns_;
  std::uint32_t doorbell_stride_ = 4;
  std::size_t regs_bytes_ = 0;
  std::unique_ptr<std::uint32_t, free_deleter> regs_; //!< the register file (doorbells live here)

  // Registers other than doorbells; reg_mutex_ guards them and every CC transition.
  std::mutex reg_mutex_;
  std::uint64_t cap_ = 0;
  nvme::cc_register cc_{};
  nvme::csts_register csts_{};
  nvme::aqa_register aqa_{};
  std::uint64_t asq_ = 0;
  std::uint64_t acq_ = 0;
  std::uint32_t intm_ = 0;
  bool enabled_ = false;
  std::uint64_t ready_at_ns_ = 0;
  std::unique_ptr<cq_state> admin_cq_;

  // Queue tables: written by admin commands (admin thread) and by reset.
  std::mutex queues_mutex_;
  std::vector<std::optional<io_sq>> sqs_;
  std::vector<std::optional<io_cq>> cqs_;
  std::optional<std::pair<std::uint32_t, std::uint32_t>> allocated_queues_; //!< 0-based NSQA, NCQA
  std::uint32_t async_events_ = 0;
  std::atomic<bool> write_cache_{true};

  fault_injector faults_;
  std::atomic<bool> answering_{true};
  std::unique_ptr<std::atomic<std::uint64_t>[]> processed_;
  std::atomic<std::uint64_t> units_read_{0}, units_written_{0}, host_reads_{0}, host_writes_{0},
      media_errors_{0}, error_count_{0};
  std::mutex error_mutex_;
  std::deque<nvme_error_log_page> error_log_;

  // Engines last: destroyed first, while everything they call into still exists.
  std::shared_ptr<io_engine> io_engine_;
  std::unique_ptr<cpu_engine> admin_engine_;
};

//! Create a software controller.
inline std::shared_ptr<controller> make_controller(controller_config cfg) {
  return std::make_shared<controller>(std::move(cfg));
}

//! A controller with one RAM namespace of `bytes` bytes (rounded down to whole blocks).
inline std::shared_ptr<controller>
make_ram_controller(std::uint64_t bytes, std::uint32_t lba_size = 512, controller_config cfg = {}) {
  cfg.namespaces.push_back({bytes / lba_size, lba_size, nullptr});
  return make_controller(std::move(cfg));
}

} // namespace bam::emu
