// SPDX-License-Identifier: MIT
//! One device string chooses the transport; it is parsed here and nowhere else.
//!
//!   emu-gpu:ram=16G,ssds=4       software controller(s), GPU engine, media in pinned host RAM
//!   emu-gpu:hbm=4G               ... media in GPU memory
//!   emu-gpu:null=1T              ... no media: completes without moving data
//!   emu-gpu:ram=1G,iops=1M,latency=80us   ... with a model of a real SSD
//!   emu:file=/path/disk.img[,size=8G]     software controller, CPU engine, a file (or block device)
//!   emu:file=/dev/nvme0n1,ro     ... read-only: writes answered Namespace is Write Protected
//!   emu:extents=/data/f.bin[,holes]       ... the file read from the raw disk under it through
//!                                its extent map (read-only; holes as zeroes with `holes`)
//!   emu:ram=64M                  software controller, CPU engine, RAM
//!   /dev/bam-nvme0[+/dev/bam-nvme1...]    real controllers through the kernel module
//!
//! Common options: `ssds=N` (N controllers, pages striped over them; emu only),
//! `lba=512|4096`, `queues=N` (I/O queue pairs per controller), `depth=N`
//! (entries per queue), `threads=N` (CPU engine threads), `timeout=10s`.
//! Sizes take K, M, G, T (binary); rates K, M (decimal); times ns, us, ms, s.
//!
//! @code
//!   bam::device_spec s = bam::parse_device("emu-gpu:hbm=4G,ssds=2");
//!   // s.kind == bam::device_kind::emu_gpu, s.media == bam::media_kind::hbm,
//!   // s.bytes == 4 << 30, s.ssds == 2
//! @endcode
#pragma once

#include <bam/error.hpp>
#include <bam/transport/media_kind.hpp>

#include <cerrno>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bam {

enum class device_kind {
  emu_gpu, //!< software controller, GPU engine
  emu_cpu, //!< software controller, CPU engine (GPU clients through pinned queues)
  pci,     //!< kernel-module transport
};

//! The kind's scheme as written in device strings.
inline const char* device_kind_name(device_kind k) {
  switch (k) {
  case device_kind::emu_gpu: return "emu-gpu:";
  case device_kind::emu_cpu: return "emu:";
  case device_kind::pci: return "/dev/bam-nvme";
  }
  return "unknown";
}

//! The header that registers the transport of kind `k` (for host I/O, or
//! for GPU submitters), for messages.
inline const char* device_kind_header(device_kind k, bool gpu) {
  switch (k) {
  case device_kind::emu_gpu: return "bam/bam.cuh (or bam/emu/gpu.cuh)";
  case device_kind::emu_cpu: return gpu ? "bam/bam.cuh (or bam/emu/gpu.cuh)" : "bam/host.hpp (or bam/emu.hpp)";
  case device_kind::pci:
    return gpu ? "bam/bam.cuh (or bam/transport/pci.hpp)" : "bam/host.hpp (or bam/transport/pci.hpp)";
  }
  return "bam/bam.cuh";
}

struct device_spec {
  std::string text; //!< the string as given
  device_kind kind = device_kind::emu_gpu;
  media_kind media = media_kind::ram;
  std::uint64_t bytes = 0;          //!< media size per controller (0 for a file: its size)
  std::string path;                 //!< emu file path
  std::vector<std::string> devices; //!< pci device nodes
  std::uint32_t ssds = 1;
  std::uint32_t lba_size = 512;
  std::uint32_t io_queues = 128;
  std::uint32_t queue_depth = 256;
  std::uint32_t threads = 4;
  std::uint64_t iops = 0;
  std::uint64_t latency_ns = 0;
  std::uint64_t timeout_ns = 10'000'000'000ull;
  bool read_only = false; //!< `ro`: file media opened read-only
  bool extents = false;   //!< `extents=PATH`: the file through its extents on the raw disk
  bool holes = false;     //!< with extents: holes and unwritten extents read as zeroes
};

namespace detail {

[[noreturn]] inline void bad_device(const std::string& text, const std::string& why) {
  error_context c;
  c.errnum = EINVAL;
  throw error("device string '" + text + "': " + why +
                  " (expected e.g. emu-gpu:ram=16G,ssds=4 | emu-gpu:hbm=4G | emu-gpu:null=1T | "
                  "emu:file=/path[,size=8G] | emu:ram=64M | /dev/bam-nvme0)",
              c);
}

//! A number with an optional suffix: `units` lists (suffix, multiplier) pairs.
inline std::uint64_t parse_number(const std::string& text, std::string_view key, std::string_view v,
                                  std::initializer_list<std::pair<std::string_view, std::uint64_t>> units) {
  std::size_t i = 0;
  std::uint64_t n = 0;
  while (i < v.size() && v[i] >= '0' && v[i] <= '9') {
    const std::uint64_t d = static_cast<std::uint64_t>(v[i] - '0');
    if (n > (UINT64_MAX - d) / 10) bad_device(text, std::string(key) + "=" + std::string(v) + " overflows");
    n = n * 10 + d;
    ++i;
  }
  if (i == 0) bad_device(text, std::string(key) + "=" + std::string(v) + " is not a number");
  std::string suffix(v.substr(i));
  for (auto& ch : suffix)
    if (ch >= 'a' && ch <= 'z') ch = static_cast<char>(ch - 'a' + 'A');
  for (const auto& [s, mult] : units) {
    std::string su(s);
    for (auto& ch : su)
      if (ch >= 'a' && ch <= 'z') ch = static_cast<char>(ch - 'a' + 'A');
    if (suffix == su) {
      if (mult != 0 && n > UINT64_MAX / mult) bad_device(text, std::string(key) + "=" + std::string(v) + " overflows");
      return n * mult;
    }
  }
  bad_device(text, "unknown unit in " + std::string(key) + "=" + std::string(v));
}

inline std::uint64_t parse_size(const std::string& t, std::string_view k, std::string_view v) {
  constexpr std::uint64_t K = 1024;
  return parse_number(t, k, v,
                      {{"", 1},
                       {"B", 1},
                       {"K", K},
                       {"KB", K},
                       {"KIB", K},
                       {"M", K * K},
                       {"MB", K * K},
                       {"MIB", K * K},
                       {"G", K * K * K},
                       {"GB", K * K * K},
                       {"GIB", K * K * K},
                       {"T", K * K * K * K},
                       {"TB", K * K * K * K},
                       {"TIB", K * K * K * K}});
}
inline std::uint64_t parse_rate(const std::string& t, std::string_view k, std::string_view v) {
  return parse_number(t, k, v, {{"", 1}, {"K", 1000}, {"M", 1000000}, {"G", 1000000000}});
}
inline std::uint64_t parse_time(const std::string& t, std::string_view k, std::string_view v) {
  return parse_number(t, k, v, {{"NS", 1}, {"US", 1000}, {"MS", 1000000}, {"S", 1000000000}});
}
inline std::uint32_t parse_count(const std::string& t, std::string_view k, std::string_view v, std::uint64_t lo,
                                 std::uint64_t hi) {
  const std::uint64_t n = parse_number(t, k, v, {{"", 1}});
  if (n < lo || n > hi)
    bad_device(t, std::string(k) + "=" + std::string(v) + " outside [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "]");
  return static_cast<std::uint32_t>(n);
}

} // namespace detail

//! Parse a device string; throws `bam::error` (EINVAL) saying what is wrong.
inline device_spec parse_device(const std::string& text) {
  using namespace detail;
  device_spec s;
  s.text = text;
  if (text.empty()) bad_device(text, "empty");
  if (text.front() == '/') {
    s.kind = device_kind::pci;
    std::string_view rest(text);
    while (!rest.empty()) {
      const auto plus = rest.find('+');
      const std::string_view dev = rest.substr(0, plus);
      if (dev.empty() || dev.front() != '/') bad_device(text, "a device node must be an absolute path");
      s.devices.emplace_back(dev);
      if (plus == std::string_view::npos) break;
      rest.remove_prefix(plus + 1);
    }
    s.ssds = static_cast<std::uint32_t>(s.devices.size());
    return s;
  }
  const auto colon = text.find(':');
  const std::string scheme = text.substr(0, colon);
  if (scheme == "emu-gpu")
    s.kind = device_kind::emu_gpu;
  else if (scheme == "emu")
    s.kind = device_kind::emu_cpu;
  else
    bad_device(text, "unknown transport '" + scheme + "'");
  if (colon == std::string::npos || colon + 1 == text.size()) bad_device(text, "no media given");
  std::string_view opts(text);
  opts.remove_prefix(colon + 1);
  bool have_media = false, have_size = false;
  while (!opts.empty()) {
    const auto comma = opts.find(',');
    const std::string_view item = opts.substr(0, comma);
    if (item == "ro" || item == "holes") {
      if (s.kind != device_kind::emu_cpu)
        bad_device(text, std::string(item) + " applies to file media (emu:file=...,ro)");
      (item == "ro" ? s.read_only : s.holes) = true;
      if (comma == std::string_view::npos) break;
      opts.remove_prefix(comma + 1);
      continue;
    }
    const auto eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0) bad_device(text, "'" + std::string(item) + "' is not key=value");
    const std::string_view k = item.substr(0, eq), v = item.substr(eq + 1);
    if (v.empty()) bad_device(text, std::string(k) + " has no value");
    auto media = [&](media_kind m) {
      if (have_media) bad_device(text, "more than one media given");
      have_media = true;
      s.media = m;
    };
    if (k == "ram" || k == "hbm" || k == "null") {
      if (k != "ram" && s.kind != device_kind::emu_gpu)
        bad_device(text, std::string(k) + " media needs the GPU engine (emu-gpu:)");
      media(k == "ram" ? media_kind::ram : k == "hbm" ? media_kind::hbm : media_kind::null);
      s.bytes = parse_size(text, k, v);
      if (s.bytes == 0) bad_device(text, std::string(k) + " size is zero");
    } else if (k == "file" || k == "extents") {
      if (s.kind != device_kind::emu_cpu) bad_device(text, std::string(k) + " media needs the CPU engine (emu:)");
      media(media_kind::file);
      s.path = std::string(v);
      if (k == "extents") s.extents = s.read_only = true;
    } else if (k == "size") {
      s.bytes = parse_size(text, k, v);
      have_size = true;
    } else if (k == "ssds") {
      s.ssds = parse_count(text, k, v, 1, 64);
    } else if (k == "lba") {
      s.lba_size = parse_count(text, k, v, 512, 65536);
      if (s.lba_size & (s.lba_size - 1)) bad_device(text, "lba must be a power of two");
    } else if (k == "queues") {
      s.io_queues = parse_count(text, k, v, 1, 65535);
    } else if (k == "depth") {
      s.queue_depth = parse_count(text, k, v, 2, 65536);
    } else if (k == "threads") {
      s.threads = parse_count(text, k, v, 1, 1024);
    } else if (k == "iops") {
      if (s.kind != device_kind::emu_gpu) bad_device(text, "iops= is a GPU-engine model option");
      s.iops = parse_rate(text, k, v);
    } else if (k == "latency") {
      if (s.kind != device_kind::emu_gpu) bad_device(text, "latency= is a GPU-engine model option");
      s.latency_ns = parse_time(text, k, v);
    } else if (k == "timeout") {
      s.timeout_ns = parse_time(text, k, v);
    } else {
      bad_device(text, "unknown option '" + std::string(k) + "'");
    }
    if (comma == std::string_view::npos) break;
    opts.remove_prefix(comma + 1);
  }
  if (!have_media) bad_device(text, "no media given (ram=, hbm=, null= or file=)");
  if (have_size && s.media != media_kind::file) bad_device(text, "size= applies to file media only");
  if (s.read_only && s.media != media_kind::file) bad_device(text, "ro applies to file media only");
  if (s.holes && !s.extents) bad_device(text, "holes applies to extents= media only");
  if (s.extents && have_size) bad_device(text, "size= does not apply to extents= media: the file's size is used");
  if (s.extents && s.ssds != 1) bad_device(text, "extents= media is one file: ssds=1");
  if (s.bytes % s.lba_size != 0) bad_device(text, "media size is not a multiple of the LBA size");
  return s;
}

} // namespace bam
