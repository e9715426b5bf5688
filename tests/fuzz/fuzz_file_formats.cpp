// SPDX-License-Identifier: MIT
// libFuzzer target: what bam reads from users' files and file systems.
// The first byte chooses:
//   even: a .npy header (bam-gnn reads features and graphs from them): any
//         bytes either parse into a header that keeps the parser's promises
//         or throw bam::error with EINVAL; nothing else;
//   odd:  an extent map built from made-up FIEMAP extents, partition start,
//         logical block size and file size: either refused with bam::error
//         (EINVAL or EAGAIN) or every block of the file looks up to the
//         block a model computed here from the extents says.
#include "npy.hpp"

#include <bam/file/extent_map.hpp>

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "file formats fuzz: %s\n", what);
  std::abort();
}

void npy_case(std::string_view bytes) {
  bam::gnn::npy_header h;
  try {
    h = bam::gnn::npy_parse_header(bytes, "input");
  } catch (const bam::error& e) {
    if (e.errnum() != EINVAL) fail("npy: a refusal with another errno than EINVAL");
    return;
  }
  if (h.data_offset > bytes.size()) fail("npy: the data starts past the bytes given");
  if (h.item_bytes() == 0 || h.item_bytes() > 8) fail("npy: an element size outside 1..8");
  std::uint64_t n = 1;
  for (const auto d : h.shape) {
    if (d != 0 && n > UINT64_MAX / d) fail("npy: accepted a shape whose size overflows");
    n *= d;
  }
  if (n != h.elements() || n > UINT64_MAX / h.item_bytes()) fail("npy: elements() disagrees with the shape");
}

void extent_case(FuzzedDataProvider& f) {
  static constexpr std::uint32_t sizes[] = {512, 1024, 4096, 65536, 300, 0};
  bam::block_device_info dev;
  dev.disk = "fuzz0n1";
  dev.partition = "fuzz0n1p1";
  dev.lba_size = sizes[f.ConsumeIntegralInRange<std::size_t>(0, std::size(sizes) - 1)];
  const std::uint32_t unit = f.ConsumeBool() ? 4096 : 512; // the file system's block, as offsets come
  dev.partition_start = f.ConsumeBool() ? 0 : f.ConsumeIntegralInRange<std::uint64_t>(0, 4096) * 512;
  dev.disk_bytes = f.ConsumeBool() ? 0 : f.ConsumeIntegralInRange<std::uint64_t>(1, 1u << 16) * 4096;
  const std::uint64_t file_size = f.ConsumeIntegralInRange<std::uint64_t>(0, 256 * 4096 + 7);
  bam::extent_map_options o;
  o.allow_holes = f.ConsumeBool();
  o.for_writing = f.ConsumeBool();
  std::vector<bam::raw_extent> raw;
  const std::size_t n = f.ConsumeIntegralInRange<std::size_t>(0, 24);
  std::uint64_t logical = 0;
  for (std::size_t i = 0; i < n; ++i) {
    bam::raw_extent e;
    // Mostly in order and in whole units; sometimes anywhere.
    const bool wild = f.ConsumeIntegralInRange<int>(0, 15) == 0;
    logical += f.ConsumeIntegralInRange<std::uint64_t>(0, 3) * unit;
    e.logical = wild ? f.ConsumeIntegralInRange<std::uint64_t>(0, 300 * 4096) : logical;
    e.length = wild ? f.ConsumeIntegralInRange<std::uint64_t>(0, 64 * 4096)
                    : f.ConsumeIntegralInRange<std::uint64_t>(1, 16) * unit;
    e.physical = f.ConsumeIntegralInRange<std::uint64_t>(0, 1u << 14) * (wild ? 1 : unit);
    e.flags = f.ConsumeIntegralInRange<int>(0, 3) == 0 ? f.ConsumeIntegral<std::uint32_t>() & 0xfff : 0;
    logical = e.logical + e.length;
    raw.push_back(e);
  }
  bam::extent_map m;
  try {
    m = bam::extent_map::from_extents("fuzz", raw, file_size, dev, o);
  } catch (const bam::error& e) {
    if (e.errnum() != EINVAL && e.errnum() != EAGAIN) fail("extent: a refusal with an unexpected errno");
    return;
  }
  const std::uint64_t lbs = dev.lba_size;
  const bam::extent_map_ref r = m.ref();
  const std::uint64_t blocks = (file_size + lbs - 1) / lbs;
  if (r.blocks() != blocks) fail("extent: the map does not cover the file exactly");
  if (m.has_holes() && (!o.allow_holes || o.for_writing)) fail("extent: holes in a map that refuses them");
  for (std::uint64_t i = 0; i < r.runs; ++i)
    if (r.start[i] >= r.start[i + 1]) fail("extent: runs not in order or empty");
  // Model: block b is in the written piece covering it, else a hole.
  std::sort(raw.begin(), raw.end(), [](const auto& a, const auto& b) { return a.logical < b.logical; });
  for (std::uint64_t b = 0; b < blocks; ++b) {
    std::uint64_t want = bam::extent_hole;
    for (const auto& e : raw)
      if (b * lbs >= e.logical && b * lbs < e.logical + e.length) {
        if (!(e.flags & FIEMAP_EXTENT_UNWRITTEN)) want = (dev.partition_start + e.physical + b * lbs - e.logical) / lbs;
        break;
      }
    const auto w = r.find(b);
    if (w.lba != want) fail("extent: a block looks up elsewhere than the extents put it");
    if (w.blocks == 0 || b + w.blocks > blocks) fail("extent: a run's length is off");
    const auto end = r.find(b + w.blocks - 1);
    if (want != bam::extent_hole && end.lba != want + w.blocks - 1) fail("extent: a run is not contiguous on the disk");
  }
  // Pages of max_page_size never straddle two runs.
  const std::uint64_t p = m.max_page_size(1u << 20);
  for (std::uint64_t i = 1; i < r.runs; ++i)
    if ((r.start[i] * lbs) % p != 0) fail("extent: max_page_size straddles a run boundary");
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  if (data[0] % 2 == 0) {
    npy_case(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  } else {
    FuzzedDataProvider f(data + 1, size - 1);
    extent_case(f);
  }
  return 0;
}
