// SPDX-License-Identifier: MIT
//! The software NVMe controller ("emu" transport): an in-process controller
//! that speaks the real NVMe register and queue protocol over RAM, a file or a
//! block device, with fault injection for tests.
//!
//! @code
//!   #include <bam/emu.hpp>
//!   auto ctrl = bam::emu::make_ram_emulated_controller(64 << 20);        // 64 MiB, 512 B blocks
//!   std::shared_ptr<bam::transport> t = ctrl;                    // what the driver takes
//!   ctrl->faults().add({.opcode = 0x02, .action = bam::emu::fault_action::drop});
//! @endcode
#pragma once

#include <bam/emu/cpu_engine.hpp>
#include <bam/emu/emulated_controller.hpp>
#include <bam/emu/engine.hpp>
#include <bam/emu/fault_table.hpp>
#include <bam/emu/media.hpp>
#include <bam/emu/nvm_executor.hpp>
#include <bam/emu/open.hpp>
