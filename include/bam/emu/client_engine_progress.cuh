// SPDX-License-Identifier: MIT
//! The device-side progress hook of the CPU engine for GPU clients alone
//! (`emu:`): a warp waiting on one of its queues moves the data the engine's
//! threads staged (`detail/client_dma_serve.cuh`), and nothing of the GPU
//! engine or the command executor is compiled into the kernels. For programs
//! that want `emu:` files and real controllers only; `<bam/emu/progress.cuh>`
//! (what `<bam/bam.cuh>` includes) serves both engines. Include it before the
//! GPU runtime's headers.
#pragma once

#ifdef BAM_DEVICE_PROGRESS_DISPATCH
#error                                                                                                                 \
    "include <bam/emu/client_engine_progress.cuh> before the GPU runtime's headers: their wait loops are compiled with the progress hooks declared before them"
#endif
#ifdef BAM_DEVICE_PROGRESS_HOOK
#error "a device progress hook is already defined: one hook per translation unit"
#endif

#include <bam/emu/client_dma.hpp>
#include <bam/emu/detail/client_dma_serve.cuh>
#include <bam/transport/device_progress.hpp>

#include <cstdint>

namespace bam::emu {

BAM_HD constexpr bool client_engine_hook_serves(std::uint32_t id) { return id == client_engine_progress_id; }

//! The lanes of `mask` (converged) move the staged data of queue `qid` of the CPU engine behind `p`.
BAM_DEVICE inline bool serve_client_engine(const device_progress& p, std::uint16_t qid, unsigned mask) {
  return detail::serve_client_dma(*static_cast<const client_dma_ref*>(p.state), qid, mask) != 0;
}

} // namespace bam::emu

#define BAM_DEVICE_PROGRESS_HOOK ::bam::emu::serve_client_engine
#define BAM_DEVICE_PROGRESS_HOOK_SERVES ::bam::emu::client_engine_hook_serves
