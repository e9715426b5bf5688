// SPDX-License-Identifier: MIT
//! Host-side bam in one include: the controller driver, device strings, the
//! transports (kernel module, and the software controller unless
//! `BAM_WITHOUT_SOFTWARE_CONTROLLER` is defined), loading and dumping data sets.
//!
//! @code
//!   #include <bam/host.hpp>
//!   auto spec = bam::parse_device("emu:ram=64M");
//!   bam::controller ctrl(bam::open_host_transports(spec).at(0));
//! @endcode
#pragma once

#include <bam/driver/controller.hpp>
#include <bam/transport/device_string.hpp>
#include <bam/transport/open.hpp>
#include <bam/transport/pci.hpp>
#ifndef BAM_WITHOUT_SOFTWARE_CONTROLLER
#include <bam/emu.hpp>
#endif
