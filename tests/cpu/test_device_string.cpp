// SPDX-License-Identifier: MIT
#include <bam/transport/device_string.hpp>

#include <catch2/catch_test_macros.hpp>

TEST_CASE("device strings choose the transport", "[device]") {
  auto s = bam::parse_device("emu-gpu:ram=16G,ssds=4");
  CHECK(s.kind == bam::device_kind::emu_gpu);
  CHECK(s.media == bam::media_kind::ram);
  CHECK(s.bytes == 16ull << 30);
  CHECK(s.ssds == 4);

  s = bam::parse_device("emu-gpu:hbm=4G");
  CHECK(s.media == bam::media_kind::hbm);
  CHECK(s.ssds == 1);
  s = bam::parse_device("emu-gpu:null=1T,iops=1M,latency=80us,queues=128,depth=512,lba=4096");
  CHECK(s.media == bam::media_kind::null);
  CHECK(s.bytes == 1ull << 40);
  CHECK(s.iops == 1000000);
  CHECK(s.latency_ns == 80000);
  CHECK(s.io_queues == 128);
  CHECK(s.queue_depth == 512);
  CHECK(s.lba_size == 4096);

  s = bam::parse_device("emu:file=/tmp/disk.img,size=64M");
  CHECK(s.kind == bam::device_kind::emu_cpu);
  CHECK(s.media == bam::media_kind::file);
  CHECK(s.path == "/tmp/disk.img");
  CHECK(s.bytes == 64ull << 20);
  CHECK(!s.read_only);
  s = bam::parse_device("emu:file=/dev/nvme0n1,ro,lba=4096");
  CHECK(s.read_only);
  CHECK(s.path == "/dev/nvme0n1");
  CHECK(s.lba_size == 4096);
  s = bam::parse_device("emu:extents=/data/f.bin,holes");
  CHECK(s.extents);
  CHECK(s.holes);
  CHECK(s.read_only);
  CHECK(s.media == bam::media_kind::file);
  CHECK(s.path == "/data/f.bin");
  s = bam::parse_device("emu:ram=64M");
  CHECK(s.kind == bam::device_kind::emu_cpu);
  CHECK(s.bytes == 64ull << 20);

  s = bam::parse_device("/dev/bam-nvme0");
  CHECK(s.kind == bam::device_kind::pci);
  REQUIRE(s.devices.size() == 1);
  CHECK(s.devices[0] == "/dev/bam-nvme0");
  s = bam::parse_device("/dev/bam-nvme0+/dev/bam-nvme1");
  CHECK(s.ssds == 2);
}

TEST_CASE("bad device strings say what is wrong", "[device]") {
  auto fails_with = [](const char* text, const char* part) {
    try {
      bam::parse_device(text);
      FAIL("no error for " << text);
    } catch (const bam::error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(part) != std::string::npos);
      CHECK(e.errnum() == EINVAL);
    }
  };
  fails_with("", "empty");
  fails_with("tcp:foo", "unknown transport 'tcp'");
  fails_with("emu-gpu:", "no media");
  fails_with("emu-gpu:ssds=2", "no media");
  fails_with("emu-gpu:ram=1Q", "unknown unit");
  fails_with("emu-gpu:ram=abc", "not a number");
  fails_with("emu-gpu:ram=1G,hbm=1G", "more than one media");
  fails_with("emu:hbm=1G", "needs the GPU engine");
  fails_with("emu-gpu:file=/x", "needs the CPU engine");
  fails_with("emu-gpu:ram=1G,ssds=0", "outside");
  fails_with("emu-gpu:ram=1G,frobnicate=3", "unknown option 'frobnicate'");
  fails_with("emu-gpu:ram=1G,lba=1000", "power of two");
  fails_with("emu-gpu:ram=1000", "multiple of the LBA size");
  fails_with("emu:ram=1G,iops=5", "GPU-engine model option");
  fails_with("emu-gpu:ram=99999999999999999999", "overflows");
  fails_with("emu:ram=64M,ro", "ro applies to file media only");
  fails_with("emu-gpu:ram=64M,ro", "ro applies to file media");
  fails_with("emu:file=/x,rw", "'rw' is not key=value");
  fails_with("emu:file=/x,holes", "holes applies to extents= media only");
  fails_with("emu:extents=/x,size=1G", "size= does not apply to extents= media");
  fails_with("emu-gpu:extents=/x", "needs the CPU engine");
}
