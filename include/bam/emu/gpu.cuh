// SPDX-License-Identifier: MIT
//! The software NVMe controller for CUDA programs: `emu-gpu:` (the GPU
//! engine, served by the GPU threads that wait on it) and `emu:` (the CPU
//! engine) registered for `bam::storage`, the device-side
//! progress hook of both compiled into this translation unit's kernels, and host
//! access to the controllers' media and fault tables.
//!
//! Include it before the GPU runtime's headers (`<bam/bam.cuh>` does).
//!
//! @code
//!   #include <bam/emu/gpu.cuh>
//!   #include <bam/runtime/array.cuh>
//!   bam::storage s("emu-gpu:hbm=1G");
//! @endcode
#pragma once

#include <bam/emu/progress.cuh> // first: before any wait loop of the runtime

#include <bam/emu.hpp>
#include <bam/emu/access.hpp>
#include <bam/emu/client_engine.cuh>
#include <bam/emu/gpu_engine.cuh>
