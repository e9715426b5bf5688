// SPDX-License-Identifier: MIT
//! The GPU engine's device-side progress hook, for the runtime's wait loops
//! (transport/device_progress.cuh): a warp waiting on a queue of the GPU
//! engine serves that queue (`detail/gpu_serve.cuh`). Kernels of a
//! translation unit include the hook only when this header comes before the
//! runtime's headers; `<bam/bam.cuh>` and `<bam/emu/gpu.cuh>` include it
//! first. A program over real controllers leaves it out and compiles none of
//! the software controller's device code.
#pragma once

#ifdef BAM_DEVICE_PROGRESS_DISPATCH
#error                                                                                                                 \
    "include <bam/emu/gpu_engine_progress.cuh> (or <bam/bam.cuh>, <bam/emu/gpu.cuh>) before the GPU runtime's headers: their wait loops are compiled with the progress hooks declared before them"
#endif
#ifdef BAM_DEVICE_PROGRESS_HOOK
#error "a device progress hook is already defined: one transport with a device-side hook per translation unit"
#endif

#include <bam/emu/detail/gpu_serve.cuh>
#include <bam/emu/gpu_engine_ref.hpp>
#include <bam/transport/device_progress.hpp>

#include <cstdint>

namespace bam::emu {

//! The lanes of `mask` (converged) serve queue `qid` of the GPU engine behind `p`.
BAM_DEVICE inline bool serve_gpu_engine(const device_progress& p, std::uint16_t qid, unsigned mask) {
  return detail::serve_warp(*static_cast<const gpu_engine_ref*>(p.state), qid, mask) != 0;
}

} // namespace bam::emu

#define BAM_DEVICE_PROGRESS_HOOK ::bam::emu::serve_gpu_engine
#define BAM_DEVICE_PROGRESS_HOOK_ID ::bam::emu::gpu_engine_progress_id
