// SPDX-License-Identifier: MIT
//! `bam::make_progress`: what GPU threads waiting on a transport's queues do
//! so that its controller makes progress (see device_progress.hpp).
//!
//! The GPU runtime calls it in its wait loops and names no transport. A
//! transport whose controller is served by the waiting GPU threads supplies
//! its device-side hook in a header of its own, which defines, before this
//! header is first included,
//!   - `BAM_DEVICE_PROGRESS_HOOK`: a device function
//!     `bool (const bam::device_progress&, std::uint16_t qid, unsigned mask)`
//!     called by the converged lanes of `mask`, true if it did some of the
//!     controller's work;
//!   - `BAM_DEVICE_PROGRESS_HOOK_SERVES`: a constexpr host/device function
//!     `bool (std::uint32_t hook)`, true for the `device_progress::hook`
//!     values it serves (one hook may serve several transports).
//! Kernels compiled without a transport's hook contain none of its code (a
//! program over real controllers compiles no software controller). A command
//! on a transport whose hook the kernel lacks is refused before submission
//! with `status_no_progress_hook`, never left to time out.
//! `<bam/bam.cuh>` includes the software controller's hook first.
#pragma once

#define BAM_DEVICE_PROGRESS_DISPATCH 1

#include <bam/detail/macros.hpp>
#include <bam/transport/device_progress.hpp>

#include <cstdint>

namespace bam {

//! Whether kernels of this translation unit can serve the transport behind `p`.
BAM_HD constexpr bool device_progress_compiled(const device_progress& p) {
#ifdef BAM_DEVICE_PROGRESS_HOOK_SERVES
  return p.hook == device_progress::none || BAM_DEVICE_PROGRESS_HOOK_SERVES(p.hook);
#else
  return p.hook == device_progress::none;
#endif
}

//! Called by the lanes of `mask` (the calling warp, converged) while they
//! wait on queue `qid` of the transport behind `p`. Returns true if it did
//! some of the controller's work.
BAM_DEVICE inline bool make_progress(const device_progress& p, std::uint16_t qid, unsigned mask) {
#ifdef BAM_DEVICE_PROGRESS_HOOK
  if (p.hook != device_progress::none && BAM_DEVICE_PROGRESS_HOOK_SERVES(p.hook))
    return BAM_DEVICE_PROGRESS_HOOK(p, qid, mask);
#else
  (void)p;
  (void)qid;
  (void)mask;
#endif
  return false;
}

} // namespace bam
