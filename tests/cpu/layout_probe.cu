// SPDX-License-Identifier: MIT
// The layout of bam's host classes as a CUDA translation unit sees them;
// test_layout.cpp compares it with a plain C++ translation unit's view.
#include <bam/transport/pci.hpp>

#include <cstddef>

namespace bam_test {

std::size_t kmod_device_size_in_cuda() { return sizeof(bam::detail::kmod_device); }
std::size_t pci_transport_size_in_cuda() { return sizeof(bam::pci_transport); }
std::size_t kmod_region_size_in_cuda() { return sizeof(bam::detail::kmod_region); }

} // namespace bam_test
