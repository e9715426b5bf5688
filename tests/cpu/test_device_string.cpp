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
  fails_with("emu-gpu:ram=1Q", "unknown size unit 'Q'");
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
  fails_with("emu:file=/x,rw", "'rw' is not an option");
  fails_with("emu:file=/x,holes", "holes applies to extents= media only");
  fails_with("emu:extents=/x,size=1G", "size= does not apply to extents= media");
  fails_with("emu-gpu:extents=/x", "needs the CPU engine");
}

TEST_CASE("a bad device string gets one line: what is wrong and what to write instead", "[device]") {
  auto message = [](const std::string& text) {
    try {
      bam::parse_device(text);
    } catch (const bam::error& e) {
      CHECK(e.errnum() == EINVAL);
      return std::string(e.what());
    }
    FAIL("no error for " << text);
    return std::string();
  };
  CHECK(message("emu:ram=12Q") ==
        "bam: device string 'emu:ram=12Q': unknown size unit 'Q' in ram=12Q (use K, M, G or T, e.g. emu:ram=12G)");
  CHECK(message("emu-gpu:ram=1G,latency=80") == "bam: device string 'emu-gpu:ram=1G,latency=80': no time unit in "
                                                "latency=80 (use ns, us, ms or s, e.g. emu-gpu:ram=1G,latency=80us)");
  CHECK(message("emu:ram=64M,queues=4K") ==
        "bam: device string 'emu:ram=64M,queues=4K': unit 'K' in queues=4K (a count takes none, e.g. "
        "emu:ram=64M,queues=4)");
  CHECK(message("emu:hbm=1G") ==
        "bam: device string 'emu:hbm=1G': hbm media needs the GPU engine (write emu-gpu:hbm=1G)");
  CHECK(message("emu:ram=-64M") ==
        "bam: device string 'emu:ram=-64M': ram=-64M is negative (a size counts up from 0, e.g. emu:ram=64M)");
  CHECK(message("emu:ram=64M,lba=4096,ssds=99") ==
        "bam: device string 'emu:ram=64M,lba=4096,ssds=99': ssds=99 is outside [1, 64] (e.g. "
        "emu:ram=64M,lba=4096,ssds=64)");
  // None repeats a list of examples or ends in errno text.
  for (const char* bad : {"", "tcp:foo", "emu-gpu:", "emu:ram=1G,hbm=1G", "emu:file=/x,rw", "emu:ram=64M,ro",
                          "emu:ram=64M,size=1G", "emu-gpu:ram=1000", "emu:ram=64M,,lba=512", "emu:ram=64M,timeout="}) {
    const std::string m = message(bad);
    INFO(m);
    CHECK(m.find("errno") == std::string::npos);
    CHECK(m.find("Invalid argument") == std::string::npos);
    CHECK(m.find(" | ") == std::string::npos);
    CHECK(m.find('\n') == std::string::npos);
    CHECK(m.back() == ')'); // ends in what to write instead
  }
}

TEST_CASE("sizes: one parser for device strings and the bam command", "[device][size]") {
  CHECK(bam::parse_size("4096") == 4096);
  CHECK(bam::parse_size("64k") == 64 << 10);
  CHECK(bam::parse_size("4KiB") == 4096);
  CHECK(bam::parse_size("1G") == 1ull << 30);
  CHECK(bam::parse_size("2T") == 2ull << 40);
  // The device string takes exactly the same units.
  for (const char* v : {"512", "64k", "4KiB", "1G", "2T", "8MB"})
    CHECK(bam::parse_device(std::string("emu:file=/x,size=") + v).bytes == bam::parse_size(v));
  auto refused = [](const char* v) {
    try {
      bam::parse_size(v, "--offset");
    } catch (const bam::error& e) {
      CHECK(e.errnum() == EINVAL);
      return std::string(e.what());
    }
    FAIL("no error for " << v);
    return std::string();
  };
  CHECK(refused("-1") == "bam: --offset -1 is negative (a size counts up from 0, e.g. --offset 64M)");
  CHECK(refused("1P") == "bam: unknown size unit 'P' in --offset 1P (use K, M, G or T, e.g. --offset 1G)");
  CHECK(refused("abc") == "bam: --offset abc is not a number (e.g. --offset 64M)");
  CHECK(refused("").find("is not a number") != std::string::npos);
  CHECK(refused("99999999999999999999") == "bam: --offset 99999999999999999999 overflows 64 bits (e.g. --offset 64M)");
  CHECK(refused("17179869184T").find("overflows") != std::string::npos);
  CHECK_THROWS_AS(bam::parse_device("emu:file=/x,size=1P"), bam::error);
}

TEST_CASE("every device-string option in the reference table parses as its example shows", "[device]") {
  for (const auto& o : bam::device_options) {
    INFO(o.form << ": " << o.example);
    const bam::device_spec s = bam::parse_device(std::string(o.example));
    const std::string key(o.form.substr(0, o.form.find('=')));
    CHECK(std::string(o.example).find(key) != std::string::npos);
    CHECK(s.text == o.example);
  }
}
