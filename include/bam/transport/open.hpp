// SPDX-License-Identifier: MIT
//! Opening what a device string names: the transport registry, asked
//! of the transport that serves it (SPDK's model). Each transport registers
//! its openers from its own header, when that header is included (an inline
//! variable), and nothing above the transports names one: a program opens the
//! kinds of device whose transports it includes, and a device string of
//! another kind is refused with the header to include.
//!
//! Two openers per kind of device:
//!   - host: transports for a `bam::controller` driven by host threads
//!     (`open_host_transports`, transport/open.hpp);
//!   - GPU: transports whose I/O queues GPU threads drive, for `bam::storage`
//!     (`open_gpu_transports`), with where their queue rings must live.
//!
//! @code
//!   // in a transport's header:
//!   inline const bool my_transport_registered =
//!       bam::register_host_transport(bam::device_kind::pci, &open_my_host_transports);
//! @endcode
#pragma once

#include <bam/error.hpp>
#include <bam/transport/device_string.hpp>
#include <bam/transport/transport.hpp>

#include <array>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace bam {

//! Where the I/O queue rings of GPU submitters must be for the controller to
//! reach them.
enum class queue_ring_memory : std::uint8_t {
  gpu,         //!< GPU memory, mapped for the controller (a real controller, the GPU engine)
  pinned_host, //!< pinned host memory mapped into the GPU (a controller served by host threads)
};

//! What a transport gives `bam::storage`: one transport per controller,
//! ready for the driver, and how to place their queues.
struct gpu_transports {
  std::vector<std::shared_ptr<transport>> controllers;
  queue_ring_memory rings = queue_ring_memory::gpu;
  std::string description; //!< what serves the I/O, for reports
};

using host_transport_opener = std::vector<std::shared_ptr<transport>> (*)(const device_spec&);
using gpu_transport_opener = gpu_transports (*)(const device_spec&);

namespace detail {

inline constexpr std::size_t device_kinds = 3;
static_assert(static_cast<std::size_t>(device_kind::pci) + 1 == device_kinds,
              "a new device kind needs its entry in the transport table");

struct transport_table {
  std::mutex mutex;
  std::array<host_transport_opener, device_kinds> host{};
  std::array<gpu_transport_opener, device_kinds> gpu{};
};

//! One table per program (a function-local static: no order of initialization to get wrong).
inline transport_table& registered_transports() {
  static transport_table t;
  return t;
}

inline std::size_t kind_index(device_kind k) {
  const auto i = static_cast<std::size_t>(k);
  if (i >= device_kinds) throw error("unknown device kind " + std::to_string(i));
  return i;
}

[[noreturn]] inline void not_compiled_in(const device_spec& spec, bool gpu) {
  error_context c;
  c.controller = spec.text;
  c.errnum = ENOTSUP;
  throw error(std::string("the transport of ") + device_kind_name(spec.kind) + " devices" +
                  (gpu ? " for GPU threads" : " for host I/O") + " is not compiled into this program: include " +
                  device_kind_header(spec.kind, gpu),
              c);
}

} // namespace detail

namespace detail {

//! Set (`open` given) or read the opener of kind `k` in `table` (the host or the GPU column).
template <class Opener>
Opener opener_at(std::array<Opener, device_kinds> transport_table::*table, device_kind k,
                 const Opener* open = nullptr) {
  auto& t = registered_transports();
  std::lock_guard lock(t.mutex);
  Opener& slot = (t.*table)[kind_index(k)];
  if (open != nullptr) slot = *open;
  return slot;
}

} // namespace detail

//! Register how host threads open devices of kind `k` (replaces an earlier opener).
inline bool register_host_transport(device_kind k, host_transport_opener open) {
  detail::opener_at(&detail::transport_table::host, k, &open);
  return true;
}

//! Register how `bam::storage` opens devices of kind `k` for GPU submitters.
inline bool register_gpu_transport(device_kind k, gpu_transport_opener open) {
  detail::opener_at(&detail::transport_table::gpu, k, &open);
  return true;
}

//! Transports for GPU submitters of what `spec` names (throws `bam::error`
//! naming the header to include when its transport is not compiled in).
inline gpu_transports open_gpu_transports(const device_spec& spec) {
  const gpu_transport_opener open = detail::opener_at(&detail::transport_table::gpu, spec.kind);
  if (open == nullptr) detail::not_compiled_in(spec, true);
  return open(spec);
}

//! One transport per controller `spec` names, for host-driven I/O.
inline std::vector<std::shared_ptr<transport>> open_host_transports(const device_spec& spec) {
  const host_transport_opener open = detail::opener_at(&detail::transport_table::host, spec.kind);
  if (open == nullptr) detail::not_compiled_in(spec, false);
  return open(spec);
}

} // namespace bam
