// SPDX-License-Identifier: MIT
// One program may mix .cpp and .cu files that include bam's headers: every
// class must have the same layout in both (one definition rule).
#include <bam/transport/pci.hpp>

#include <catch2/catch_test_macros.hpp>

#include <cstddef>

namespace bam_test {
std::size_t kmod_device_size_in_cuda();
std::size_t pci_transport_size_in_cuda();
std::size_t kmod_region_size_in_cuda();
} // namespace bam_test

TEST_CASE("host classes have one layout under nvcc and a plain C++ compiler", "[layout]") {
  CHECK(sizeof(bam::detail::kmod_device) == bam_test::kmod_device_size_in_cuda());
  CHECK(sizeof(bam::pci_transport) == bam_test::pci_transport_size_in_cuda());
  CHECK(sizeof(bam::detail::kmod_region) == bam_test::kmod_region_size_in_cuda());
}
