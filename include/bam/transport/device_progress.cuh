// SPDX-License-Identifier: MIT
//! `bam::make_progress`: what GPU threads waiting on a transport's queues do
//! so that its controller makes progress (see device_progress.hpp). The GPU
//! runtime calls it in its wait loops, knowing nothing of the transport.
#pragma once

#include <bam/emu/detail/gpu_serve.cuh>
#include <bam/transport/device_progress.hpp>

#include <cstdint>

namespace bam {

//! Called by the lanes of `mask` (the calling warp, converged) while they
//! wait on queue `qid` of the transport behind `p`. Returns true if it did
//! some of the controller's work.
BAM_DEVICE inline bool make_progress(const device_progress& p, std::uint16_t qid, unsigned mask) {
  switch (p.what) {
  case device_progress::kind::emu_gpu_engine:
    return emu::detail::serve_warp(*static_cast<const emu::gpu_engine_ref*>(p.state), qid, mask) != 0;
  case device_progress::kind::none:
  default: return false;
  }
}

} // namespace bam
