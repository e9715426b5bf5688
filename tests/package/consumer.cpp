// SPDX-License-Identifier: MIT
// Built by the package test against an installed bam (or bam's tree through
// add_subdirectory): brings up the software controller and round-trips one
// block; with CUDA, also writes and sums a bam::array in a kernel
// (consumer_kernel.cu) when a GPU is present.
#include <bam/host.hpp>
#include <bam/emu.hpp>

#include <cstdio>
#include <cstring>

#if BAM_CONSUMER_CUDA
// consumer_kernel.cu: -1 without a GPU, 0 if the kernel summed the array right.
int sum_array_on_gpu(unsigned n);
#endif

int main() {
  auto t = bam::emu::make_ram_emulated_controller(1 << 20);
  bam::controller ctrl(t, {});
  auto buf = ctrl.transport().alloc(4096);
  std::memset(buf->data(), 0x42, 512);
  ctrl.write(1, 7, 1, *buf);
  std::memset(buf->data(), 0, 512);
  ctrl.read(1, 7, 1, *buf);
  const bool ok = buf->as<unsigned char>()[511] == 0x42;
  std::printf("%s: %s\n", ctrl.model().c_str(), ok ? "round trip ok" : "round trip FAILED");
#if BAM_CONSUMER_CUDA
  const int bad = sum_array_on_gpu(1 << 20);
  if (bad < 0)
    std::printf("kernel built; no GPU here to run it\n");
  else
    std::printf("kernel summed a bam::array of 2^20 elements: %s\n", bad == 0 ? "ok" : "WRONG");
  if (bad > 0) return 1;
#endif
  return ok ? 0 : 1;
}
