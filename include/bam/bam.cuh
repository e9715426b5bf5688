// SPDX-License-Identifier: MIT
//! bam for CUDA programs in one include: storage opened from a device
//! string, the page cache, `bam::array<T>` and its kernel-side handles.
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

#include <bam/controller.hpp>
#include <bam/cuda.cuh>
#include <bam/runtime/array.cuh>
#include <bam/runtime/page_cache.cuh>
#include <bam/runtime/queue_set.cuh>
#include <bam/runtime/row_gather.cuh>
#include <bam/runtime/storage.cuh>
