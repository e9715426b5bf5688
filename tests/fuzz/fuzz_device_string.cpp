// SPDX-License-Identifier: MIT
// libFuzzer target: the device-string parser. Any input either parses into a
// spec that keeps the parser's promises or throws bam::error with EINVAL;
// nothing else (no crash, no other exception, no overflow).
#include <bam/transport/device_string.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  bam::device_spec s;
  try {
    s = bam::parse_device(text);
  } catch (const bam::error& e) {
    if (e.errnum() != EINVAL) {
      std::fprintf(stderr, "parse_device('%s') threw errno %d: %s\n", text.c_str(), e.errnum(), e.what());
      std::abort();
    }
    return 0;
  }
  auto expect = [&](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "parse_device('%s') accepted it but %s\n", text.c_str(), what);
      std::abort();
    }
  };
  expect(s.text == text, "the spec does not carry the text");
  if (s.kind == bam::device_kind::pci) {
    expect(!s.devices.empty() && s.ssds == s.devices.size(), "device nodes and count disagree");
    for (const auto& d : s.devices)
      expect(!d.empty() && d.front() == '/', "a device node is not absolute");
    return 0;
  }
  expect(s.ssds >= 1 && s.ssds <= 64, "ssds out of range");
  expect(s.lba_size >= 512 && s.lba_size <= 65536 && (s.lba_size & (s.lba_size - 1)) == 0, "bad LBA size");
  expect(s.bytes % s.lba_size == 0, "media size not a multiple of the LBA size");
  expect(s.io_queues >= 1 && s.queue_depth >= 2 && s.threads >= 1, "queue or thread count out of range");
  if (s.media == bam::media_kind::file)
    expect(!s.path.empty(), "file media without a path");
  else if (s.media == bam::media_kind::shm)
    expect(!s.shm_name.empty(), "shared memory without a name"); // no size: it attaches to one that exists
  else
    expect(s.bytes != 0, "media of zero bytes");
  if (s.media != bam::media_kind::shm) expect(!s.shm_unlink, "unlink without shared memory");
  if (s.kind == bam::device_kind::emu_cpu)
    expect(s.media == bam::media_kind::ram || s.media == bam::media_kind::file || s.media == bam::media_kind::shm,
           "GPU-only media on the CPU engine");
  if (s.read_only) expect(s.media == bam::media_kind::file, "read-only media that is not a file");
  if (s.extents) expect(s.read_only && s.ssds == 1 && s.bytes == 0, "extents media writable, striped or sized");
  if (s.holes) expect(s.extents, "holes without extents media");
  // The same text parses the same way again.
  const bam::device_spec again = bam::parse_device(text);
  expect(again.bytes == s.bytes && again.media == s.media && again.path == s.path, "parsing is not repeatable");
  return 0;
}
