// SPDX-License-Identifier: MIT
// Built by the package test against an installed bam: brings up the software
// controller and round-trips one block.
#include <bam/controller.hpp>
#include <bam/emu.hpp>

#include <cstdio>
#include <cstring>

int main() {
  auto t = bam::emu::make_ram_controller(1 << 20);
  bam::controller ctrl(t, {});
  auto buf = ctrl.transport_ref().alloc(4096);
  std::memset(buf->data(), 0x42, 512);
  ctrl.write(1, 7, 1, *buf);
  std::memset(buf->data(), 0, 512);
  ctrl.read(1, 7, 1, *buf);
  const bool ok = buf->as<unsigned char>()[511] == 0x42;
  std::printf("%s: %s\n", ctrl.model().c_str(), ok ? "round trip ok" : "round trip FAILED");
  return ok ? 0 : 1;
}
