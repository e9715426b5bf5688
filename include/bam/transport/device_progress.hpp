// SPDX-License-Identifier: MIT
//! The one thing the GPU runtime learns about a transport besides its
//! queues: what GPU threads waiting on those queues must do so that the
//! controller behind them makes progress. For a real controller (or one
//! served by host threads) the answer is "nothing"; for the software
//! controller's GPU engine it is "serve the queue yourself". The runtime
//! calls `bam::make_progress(hook, qid)` (device_progress.cuh) in its wait
//! loops and never needs to know which it is.
#pragma once

#include <cstdint>

namespace bam {

//! A trivially copyable descriptor of a transport's progress hook.
struct device_progress {
  enum class kind : std::uint32_t {
    none = 0,           //!< nothing to do: the controller runs on its own
    emu_gpu_engine = 1, //!< the software controller's GPU engine: `state` is its handle in GPU memory
  };
  kind what = kind::none;
  std::uint32_t reserved = 0;
  const void* state = nullptr; //!< transport-private, in GPU memory
};

} // namespace bam
