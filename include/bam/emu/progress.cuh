// SPDX-License-Identifier: MIT
//! The software controller's device-side progress hook, for the runtime's
//! wait loops (transport/device_progress.cuh). A warp waiting on a queue
//!  - of the GPU engine serves that queue (`detail/gpu_serve.cuh`);
//!  - of the CPU engine for GPU clients moves the data the engine's threads
//!    staged for it (`detail/client_dma_serve.cuh`).
//! Kernels of a translation unit include the hook only when this header
//! comes before the runtime's headers; `<bam/bam.cuh>` and `<bam/emu/gpu.cuh>`
//! include it first. A program over real controllers leaves it out and
//! compiles none of the software controller's device code.
#pragma once

#ifdef BAM_DEVICE_PROGRESS_DISPATCH
#error                                                                                                                 \
    "include <bam/emu/progress.cuh> (or <bam/bam.cuh>, <bam/emu/gpu.cuh>) before the GPU runtime's headers: their wait loops are compiled with the progress hooks declared before them"
#endif
#ifdef BAM_DEVICE_PROGRESS_HOOK
#error "a device progress hook is already defined: one hook per translation unit"
#endif

#include <bam/emu/client_dma.hpp>
#include <bam/emu/detail/client_dma_serve.cuh>
#include <bam/emu/detail/gpu_serve.cuh>
#include <bam/emu/gpu_engine_ref.hpp>
#include <bam/transport/device_progress.hpp>

#include <cstdint>

namespace bam::emu {

//! Whether the hook serves transports whose `device_progress::hook` is `id`.
BAM_HD constexpr bool software_controller_hook_serves(std::uint32_t id) {
  return id == gpu_engine_progress_id || id == client_engine_progress_id;
}

//! The lanes of `mask` (converged) serve queue `qid` of the engine behind `p`.
BAM_DEVICE inline bool serve_software_controller(const device_progress& p, std::uint16_t qid, unsigned mask) {
  if (p.hook == client_engine_progress_id)
    return detail::serve_client_dma(*static_cast<const client_dma_ref*>(p.state), qid, mask) != 0;
  return detail::serve_warp(*static_cast<const gpu_engine_ref*>(p.state), qid, mask) != 0;
}

} // namespace bam::emu

#define BAM_DEVICE_PROGRESS_HOOK ::bam::emu::serve_software_controller
#define BAM_DEVICE_PROGRESS_HOOK_SERVES ::bam::emu::software_controller_hook_serves
