// SPDX-License-Identifier: MIT
//! Host-side bam in one include: the controller driver, the transports
//! (kernel module, software controller), device strings.
//!
//! @code
//!   #include <bam/controller.hpp>
//!   auto spec = bam::parse_device("emu:ram=64M");
//!   bam::controller ctrl(bam::open_host_transports(spec).at(0));
//! @endcode
#pragma once

#include <bam/device_string.hpp>
#include <bam/driver/controller.hpp>
#include <bam/transport/open.hpp>
