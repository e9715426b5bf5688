// SPDX-License-Identifier: MIT
// The transport registry on its own: this program includes no transport, so
// every device string is refused with the header that would open it, until a
// transport registers an opener of its own; the opener then gets the parsed
// device string.
#include <bam/transport/device_string.hpp>
#include <bam/transport/open.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <memory>
#include <string>
#include <vector>

#ifdef BAM_DEVICE_PROGRESS_HOOK
#error "this program must not include the software controller"
#endif

using Catch::Matchers::ContainsSubstring;

namespace {

std::string refusal(const std::string& device, bool gpu) {
  try {
    const auto spec = bam::parse_device(device);
    if (gpu)
      bam::open_gpu_transports(spec);
    else
      bam::open_host_transports(spec);
  } catch (const bam::error& e) {
    return e.what();
  }
  return "";
}

//! A transport that records what it was asked to open and opens nothing.
std::vector<std::string> opened;
std::vector<std::shared_ptr<bam::transport>> record_host(const bam::device_spec& spec) {
  opened.push_back("host " + spec.text);
  return {};
}
bam::gpu_transports record_gpu(const bam::device_spec& spec) {
  opened.push_back("gpu " + spec.text);
  bam::gpu_transports g;
  g.rings = bam::queue_ring_memory::pinned_host;
  g.description = "recorded";
  return g;
}

} // namespace

TEST_CASE("Registry: a device string whose transport is not compiled in is refused with the header to include",
          "[cpu][registry]") {
  CHECK_THAT(refusal("emu:ram=4M", false), ContainsSubstring("bam/emu.hpp"));
  CHECK_THAT(refusal("emu:ram=4M", false), ContainsSubstring("is not compiled into this program"));
  CHECK_THAT(refusal("emu:ram=4M", true), ContainsSubstring("bam/emu/gpu.cuh"));
  CHECK_THAT(refusal("emu-gpu:hbm=1G", true), ContainsSubstring("bam/emu/gpu.cuh"));
  CHECK_THAT(refusal("/dev/bam-nvme0", false), ContainsSubstring("bam/transport/pci.hpp"));
  CHECK_THAT(refusal("/dev/bam-nvme0", true), ContainsSubstring("bam/transport/pci.hpp"));
  CHECK_THAT(refusal("emu:ram=4M", false), ContainsSubstring("emu:ram=4M")); // the device named
}

TEST_CASE("Registry: a registered opener gets the parsed device string, per side", "[cpu][registry]") {
  opened.clear();
  REQUIRE(bam::register_host_transport(bam::device_kind::pci, &record_host));
  CHECK(bam::open_host_transports(bam::parse_device("/dev/bam-nvme3+/dev/bam-nvme4")).empty());
  // The GPU side is still not registered.
  CHECK_THAT(refusal("/dev/bam-nvme3", true), ContainsSubstring("for GPU threads"));
  REQUIRE(bam::register_gpu_transport(bam::device_kind::pci, &record_gpu));
  const bam::gpu_transports g = bam::open_gpu_transports(bam::parse_device("/dev/bam-nvme5"));
  CHECK(g.rings == bam::queue_ring_memory::pinned_host);
  CHECK(g.description == "recorded");
  REQUIRE(opened.size() == 2);
  CHECK(opened[0] == "host /dev/bam-nvme3+/dev/bam-nvme4");
  CHECK(opened[1] == "gpu /dev/bam-nvme5");
  // Other kinds are untouched.
  CHECK_THAT(refusal("emu:ram=4M", false), ContainsSubstring("bam/emu.hpp"));
}
