// SPDX-License-Identifier: MIT
//! The one thing the GPU runtime learns about a transport besides its
//! queues: what GPU threads waiting on those queues must do so that the
//! controller behind them makes progress. For a real controller (or one
//! served by host threads) the answer is "nothing"; for a controller served
//! by GPU threads (the software controller's GPU engine) it is "serve the
//! queue yourself". The runtime calls `bam::make_progress(hook, qid, mask)`
//! (device_progress.cuh) in its wait loops and never needs to know which
//! transport it waits on.
#pragma once

#include <cstdint>
#include <type_traits>

namespace bam {

//! A trivially copyable descriptor of a transport's progress hook.
struct device_progress {
  //! No hook: the controller runs on its own.
  static constexpr std::uint32_t none = 0;
  //! Which device-side hook serves this transport (`none`, or an id that
  //! the transport's own header defines with the hook itself).
  std::uint32_t hook = none;
  std::uint32_t reserved = 0;
  const void* state = nullptr; //!< the hook's state, in GPU memory (transport-private)
};
static_assert(std::is_trivially_copyable_v<device_progress>);

} // namespace bam
