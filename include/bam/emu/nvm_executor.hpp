// SPDX-License-Identifier: MIT
//! The one NVM command executor of the software controller, host and device
//! code: every engine (CPU engine, GPU engine, CPU engine for GPU clients)
//! runs each fetched I/O command through `process_nvm`, so the checks (opcode,
//! fused bits, SGL, namespace, LBA range, MDTS), the fault rules and the
//! statistics are the same whoever serves the queue. What differs is only
//! where the blocks and the host buffers are, which the engine's *backend*
//! provides:
//!
//! @code
//!   struct my_backend {
//!     // Move `bytes` between the namespace (byte offset) and the memory the
//!     // command's PRPs describe; a PRP or media failure as a status.
//!     BAM_HD nvme::status move(std::uint32_t nsid, std::uint64_t offset, std::uint64_t bytes,
//!                              const nvme::command& cmd, bool write);
//!     BAM_HD nvme::status flush(std::uint32_t nsid);            // nsid 0: every namespace
//!     BAM_HD nvme::status zero(std::uint32_t nsid, std::uint64_t offset, std::uint64_t len, bool deallocate);
//!     // Copy bytes [offset, offset + len) of the command's data buffer (DSM ranges) to `dst`.
//!     BAM_HD nvme::status fetch(const nvme::command& cmd, std::uint64_t offset, void* dst, std::uint64_t len);
//!   };
//!   bam::emu::command_outcome out = bam::emu::process_nvm(cmd, qid, target, backend);
//! @endcode
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/emu/engine.hpp>
#include <bam/emu/fault_table.hpp>
#include <bam/nvme/spec.hpp>

#include <cuda/atomic>

#include <cstdint>

namespace bam::emu {

//! A namespace as the executor sees it.
struct nvm_namespace {
  std::uint64_t blocks = 0;
  std::uint32_t lba_shift = 9;
  std::uint32_t reserved = 0;
};

//! What commands execute against: the namespaces, the transfer limit, where
//! statistics go and which fault rules apply. Plain data, host or device.
struct nvm_target {
  const nvm_namespace* ns = nullptr; //!< `ns_count` namespaces, NSID 1.. in order
  std::uint32_t ns_count = 0;
  std::uint32_t reserved = 0;
  std::uint64_t max_transfer_bytes = 0; //!< MDTS in bytes (0: no limit)
  nvm_counters* counters = nullptr;     //!< may be null
  fault_table* faults = nullptr;        //!< may be null
};

namespace detail {

//! NSID that addresses every namespace.
inline constexpr std::uint32_t nsid_broadcast = 0xffffffffu;
//! DSM ranges read per step (a range is 16 bytes).
inline constexpr std::uint32_t dsm_ranges_per_step = 16;

BAM_HD constexpr nvme::status generic(std::uint8_t sc) { return {nvme::status_type::generic, sc, true}; }
BAM_HD constexpr nvme::status specific(std::uint8_t sc) { return {nvme::status_type::command_specific, sc, true}; }
BAM_HD constexpr nvme::status media_error(std::uint8_t sc) { return {nvme::status_type::media_error, sc}; }
BAM_HD constexpr nvme::status read_error() { return media_error(nvme::media_status::unrecovered_read_error); }
BAM_HD constexpr nvme::status write_fault() { return media_error(nvme::media_status::write_fault); }
//! The status of a write the media refused with `err` (an errno): read-only media is a write-protected namespace.
BAM_HD constexpr nvme::status write_status(int err) {
  return err == 0                ? nvme::status{}
         : err == 30 /* EROFS */ ? generic(nvme::generic_status::namespace_write_protected)
                                 : write_fault();
}

BAM_HD inline void count(nvm_counters* c, std::uint64_t nvm_counters::*field, std::uint64_t n) {
  if (c == nullptr) return;
#if BAM_DEVICE_CODE
  // The GPU engine's counters are GPU memory, read by the host between kernels.
  cuda::atomic_ref<std::uint64_t, cuda::thread_scope_device>(c->*field).fetch_add(n, cuda::memory_order_relaxed);
#else
  cuda::atomic_ref<std::uint64_t, cuda::thread_scope_system>(c->*field).fetch_add(n, cuda::memory_order_relaxed);
#endif
}

BAM_HD inline bool lba_range_ok(const nvm_namespace& ns, std::uint64_t slba, std::uint64_t nlb) {
  return slba < ns.blocks && nlb <= ns.blocks - slba;
}

} // namespace detail

//! Execute one NVM command against `t` through `be`. No fault rules here.
BAM_EXEC_CHECK_DISABLE
template <class Backend>
BAM_HD nvme::status execute_nvm(const nvme::command& cmd, const nvm_target& t, Backend& be) {
  namespace gs = nvme::generic_status;
  using op = nvme::nvm_opcode;
  using detail::generic;
  switch (static_cast<op>(cmd.opcode)) {
  case op::read:
  case op::write:
  case op::flush:
  case op::write_zeroes:
  case op::dataset_management: break;
  default: return generic(gs::invalid_opcode);
  }
  const nvme::command_flags flags{cmd.flags};
  if (flags.bits.fuse != 0 || flags.bits.psdt != 0) return generic(gs::invalid_field); // no fused commands, no SGLs
  if (static_cast<op>(cmd.opcode) == op::flush && cmd.nsid == detail::nsid_broadcast) {
    const nvme::status st = be.flush(0);
    if (st.ok())
      detail::count(t.counters, &nvm_counters::flushes, 1);
    else
      detail::count(t.counters, &nvm_counters::media_errors, 1);
    return st;
  }
  if (cmd.nsid == 0 || cmd.nsid > t.ns_count) return generic(gs::invalid_namespace);
  const nvm_namespace& ns = t.ns[cmd.nsid - 1];
  switch (static_cast<op>(cmd.opcode)) {
  case op::flush: {
    const nvme::status st = be.flush(cmd.nsid);
    if (st.ok())
      detail::count(t.counters, &nvm_counters::flushes, 1);
    else
      detail::count(t.counters, &nvm_counters::media_errors, 1);
    return st;
  }
  case op::read:
  case op::write: {
    const bool write = static_cast<op>(cmd.opcode) == op::write;
    const std::uint64_t slba = nvme::command_slba(cmd);
    const std::uint64_t nlb = nvme::command_nblocks(cmd);
    const std::uint64_t bytes = nlb << ns.lba_shift;
    if (t.max_transfer_bytes != 0 && bytes > t.max_transfer_bytes) return generic(gs::invalid_field);
    if (!detail::lba_range_ok(ns, slba, nlb)) return generic(gs::lba_out_of_range);
    const nvme::status st = be.move(cmd.nsid, slba << ns.lba_shift, bytes, cmd, write);
    if (!st.ok()) {
      if (st.sct() == nvme::status_type::media_error) detail::count(t.counters, &nvm_counters::media_errors, 1);
      return st;
    }
    // SMART data units count thousands of 512-byte units; keep 512-byte units here.
    if (write) {
      detail::count(t.counters, &nvm_counters::units_written, bytes / 512);
      detail::count(t.counters, &nvm_counters::host_writes, 1);
    } else {
      detail::count(t.counters, &nvm_counters::units_read, bytes / 512);
      detail::count(t.counters, &nvm_counters::host_reads, 1);
    }
    return st;
  }
  case op::write_zeroes: {
    const std::uint64_t slba = nvme::command_slba(cmd);
    const std::uint64_t nlb = nvme::command_nblocks(cmd);
    if (!detail::lba_range_ok(ns, slba, nlb)) return generic(gs::lba_out_of_range);
    const nvme::rw_cdw12 d12{cmd.cdw12};
    const nvme::status st = be.zero(cmd.nsid, slba << ns.lba_shift, nlb << ns.lba_shift, d12.bits.deac != 0);
    if (!st.ok() && st.sct() == nvme::status_type::media_error)
      detail::count(t.counters, &nvm_counters::media_errors, 1);
    return st;
  }
  case op::dataset_management: {
    const nvme::dsm_cdw10 d10{cmd.cdw10};
    const nvme::dsm_cdw11 d11{cmd.cdw11};
    const std::uint32_t nranges = d10.bits.nr + 1u;
    if (d11.bits.ad == 0) return nvme::status_success; // hints only
    nvme::dsm_range r[detail::dsm_ranges_per_step];
    // Check every range first, then deallocate: a bad range changes nothing.
    for (int pass = 0; pass < 2; ++pass) {
      for (std::uint32_t first = 0; first < nranges; first += detail::dsm_ranges_per_step) {
        const std::uint32_t n =
            nranges - first < detail::dsm_ranges_per_step ? nranges - first : detail::dsm_ranges_per_step;
        const nvme::status st = be.fetch(cmd, std::uint64_t{first} * sizeof(nvme::dsm_range), r,
                                         std::uint64_t{n} * sizeof(nvme::dsm_range));
        if (!st.ok()) return st;
        for (std::uint32_t k = 0; k < n; ++k) {
          if (r[k].nblocks == 0) continue;
          if (pass == 0) {
            if (!detail::lba_range_ok(ns, r[k].slba, r[k].nblocks)) return generic(gs::lba_out_of_range);
          } else {
            const nvme::status zs =
                be.zero(cmd.nsid, r[k].slba << ns.lba_shift, std::uint64_t{r[k].nblocks} << ns.lba_shift, true);
            if (!zs.ok()) {
              detail::count(t.counters, &nvm_counters::media_errors, 1);
              return zs;
            }
          }
        }
      }
    }
    return nvme::status_success;
  }
  default: return generic(gs::invalid_opcode);
  }
}

//! What an engine calls for each I/O command it fetches from SQ `qid`:
//! fault rules, then execution, then the latency the rules add.
BAM_EXEC_CHECK_DISABLE
template <class Backend>
BAM_HD command_outcome process_nvm(const nvme::command& cmd, std::uint16_t qid, const nvm_target& t, Backend& be) {
  command_outcome out;
  fault_decision f;
  if (t.faults != nullptr) f = t.faults->check(cmd, qid);
  if (f.matched && f.action == fault_action::drop) {
    out.drop = true;
    return out;
  }
  if (f.matched && f.action == fault_action::fail) {
    out.status = f.status;
  } else {
    out.status = execute_nvm(cmd, t, be);
    if (f.matched && f.action == fault_action::delay) out.delay_ns += f.latency_ns;
  }
  if (t.faults != nullptr) out.delay_ns += t.faults->added_latency_ns();
  return out;
}

} // namespace bam::emu
