// SPDX-License-Identifier: MIT
//! Host access to the software controllers behind a `bam::controller` or a
//! `bam::storage`: their fault tables and counters, and their media read and
//! written directly (to load a data set, or to check what GPU threads wrote).
//! None of this exists for a real controller; each call throws `bam::error`
//! when the controller is not a software one.
//!
//! @code
//!   bam::storage s("emu-gpu:ram=1G");
//!   bam::emu::write_media(s, 0, /*offset=*/0, data, bytes);
//!   bam::emu::software_controller(s, 0).faults().add({.opcode = 0x02, .action = bam::emu::fault_action::fail});
//! @endcode
#pragma once

#include <bam/driver/controller.hpp>
#include <bam/emu/emulated_controller.hpp>
#include <bam/error.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace bam::emu {

//! The software controller `c` drives (throws if it drives a real one).
inline emulated_controller& software_controller(const controller& c) {
  if (auto* e = dynamic_cast<emulated_controller*>(&c.transport())) return *e;
  error_context ctx;
  ctx.controller = c.name();
  throw error("this needs a software controller (emu: or emu-gpu:), not a real one", ctx);
}

//! The software controller of controller `i` of `s` (a `bam::storage`).
template <class Storage>
emulated_controller& software_controller(const Storage& s, std::uint32_t i) {
  return software_controller(s.controller_at(i));
}

//! Host write of `bytes` at byte `offset` of the namespace of controller `i`
//! of `s`, straight into its media.
template <class Storage>
void write_media(const Storage& s, std::uint32_t i, std::uint64_t offset, const void* src, std::size_t bytes) {
  if (int e = software_controller(s, i).namespace_media(s.nsid()).write(offset, src, bytes))
    throw_errno("writing media of controller " + s.controller_name(i), e);
}

//! Host read of `bytes` at byte `offset` of the namespace of controller `i` of `s`.
template <class Storage>
void read_media(const Storage& s, std::uint32_t i, std::uint64_t offset, void* dst, std::size_t bytes) {
  if (int e = software_controller(s, i).namespace_media(s.nsid()).read(offset, dst, bytes))
    throw_errno("reading media of controller " + s.controller_name(i), e);
}

} // namespace bam::emu
