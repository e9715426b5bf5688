// SPDX-License-Identifier: MIT
//! bam for CUDA programs in one include: storage opened from a device
//! string, the page cache, `bam::array<T>` and its kernel-side handles, row
//! gathers; the kernel-module transport, and the software controller unless
//! `BAM_WITHOUT_SOFTWARE_CONTROLLER` is defined (then kernels contain none of
//! its code, and only real controllers open).
//!
//! @code
//!   #include <bam/bam.cuh>
//!   bam::storage s("emu-gpu:hbm=1G");                 // or "/dev/bam-nvme0", "emu:file=..."
//!   bam::page_cache cache({.page_size = 4096, .capacity = 256 << 20});
//!   bam::array<float> a(cache, s, 100'000'000);
//!   my_kernel<<<1024, 256>>>(a.ref());
//!   a.check();
//! @endcode
#pragma once

#ifndef BAM_WITHOUT_SOFTWARE_CONTROLLER
#include <bam/emu/gpu.cuh> // first: its device hook goes into the runtime's wait loops
#endif

#include <bam/cuda.cuh>
#include <bam/host.hpp>
#include <bam/runtime/array.cuh>
#include <bam/runtime/file_array.cuh>
#include <bam/runtime/hot_set.cuh>
#include <bam/runtime/page_cache.cuh>
#include <bam/runtime/queue_set.cuh>
#include <bam/runtime/row_gather.cuh>
#include <bam/runtime/row_holds.cuh>
#include <bam/runtime/storage.cuh>
