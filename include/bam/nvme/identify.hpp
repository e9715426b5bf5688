// SPDX-License-Identifier: MIT
//! Identify data structures, host side: libnvme's `struct nvme_id_ctrl` and
//! `struct nvme_id_ns` (header-only use; nothing is linked). Their sizes are
//! checked against the spec here so that a libnvme that drifts fails to build.
#pragma once

#include <bam/nvme/spec.hpp>

#include <nvme/types.h>

#include <cstddef>

static_assert(sizeof(nvme_id_ctrl) == bam::nvme::identify_data_size,
              "libnvme's nvme_id_ctrl must be the 4096-byte Identify Controller structure");
static_assert(sizeof(nvme_id_ns) == bam::nvme::identify_data_size,
              "libnvme's nvme_id_ns must be the 4096-byte Identify Namespace structure");
static_assert(offsetof(nvme_id_ctrl, mdts) == 77, "Identify Controller MDTS is byte 77");
static_assert(offsetof(nvme_id_ctrl, sqes) == 512, "Identify Controller SQES is byte 512");
static_assert(offsetof(nvme_id_ctrl, nn) == 516, "Identify Controller NN is byte 516");
static_assert(offsetof(nvme_id_ns, flbas) == 26, "Identify Namespace FLBAS is byte 26");
static_assert(offsetof(nvme_id_ns, lbaf) == 128, "Identify Namespace LBAF0 is byte 128");
