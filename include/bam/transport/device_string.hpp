// SPDX-License-Identifier: MIT
//! One device string chooses the transport; it is parsed here and nowhere else.
//!
//!   emu-gpu:ram=16G,ssds=4       software controller(s), GPU engine, media in pinned host RAM
//!   emu-gpu:hbm=4G               ... media in GPU memory
//!   emu-gpu:null=1T              ... no media: completes without moving data
//!   emu-gpu:ram=1G,iops=1M,latency=80us   ... with a model of a real SSD
//!   emu-gpu:shm=feat,size=64G    ... media in POSIX shared memory (/dev/shm/bam-feat): one copy
//!                                served by every process and GPU that opens the name
//!   emu:file=/path/disk.img[,size=8G]     software controller, CPU engine, a file (or block device)
//!   emu:file=/dev/nvme0n1,ro     ... read-only: writes answered Namespace is Write Protected
//!   emu:extents=/data/f.bin[,holes]       ... the file read from the raw disk under it through
//!                                its extent map (read-only; holes as zeroes with `holes`)
//!   emu:ram=64M                  software controller, CPU engine, RAM
//!   emu:shm=feat                 ... the shared memory named feat (attached; size= creates it)
//!   /dev/bam-nvme0[+/dev/bam-nvme1...]    real controllers through the kernel module
//!
//! Common options: `ssds=N` (N controllers, pages striped over them; emu only),
//! `lba=512|4096`, `queues=N` (I/O queue pairs per controller), `depth=N`
//! (entries per queue), `threads=N` (CPU engine threads), `timeout=10s`;
//! every option is in `device_options` below.
//! Sizes take K, M, G, T (binary; `parse_size`, which the bam command's sizes
//! use too); rates K, M, G (decimal); times ns, us, ms, s.
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
#include <optional>
#include <span>
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
  std::string shm_name;             //!< `shm=NAME`: the shared memory's name (the object /dev/shm/bam-NAME)
  std::vector<std::string> devices; //!< pci device nodes
  std::uint32_t ssds = 1;
  std::uint32_t lba_size = 512;
  std::uint32_t io_queues = 128;
  std::uint32_t queue_depth = 256;
  std::uint32_t threads = 4;
  std::uint64_t iops = 0;
  std::uint64_t latency_ns = 0;
  std::uint64_t timeout_ns = 10'000'000'000ull;
  bool read_only = false;  //!< `ro`: file media opened read-only
  bool extents = false;    //!< `extents=PATH`: the file through its extents on the raw disk
  bool holes = false;      //!< with extents: holes and unwritten extents read as zeroes
  bool shm_unlink = false; //!< `unlink`: the shared memory's name is removed when its last user closes it
};

//! Prefix of the POSIX shared-memory objects that `shm=NAME` names (`/dev/shm/bam-NAME`).
inline constexpr std::string_view shm_object_prefix = "bam-";
//! Longest NAME of `shm=NAME` (the object's name, prefix included, fits NAME_MAX).
inline constexpr std::size_t shm_name_max = 200;

//! Why `name` cannot name shared memory (`shm=NAME`), or "" when it can: one
//! path component of letters, digits, '.', '_' and '-', not "." or "..", at
//! most `shm_name_max` characters.
inline std::string shm_name_problem(std::string_view name) {
  if (name.empty()) return "the shared memory name is empty";
  if (name.size() > shm_name_max)
    return "the shared memory name is longer than " + std::to_string(shm_name_max) + " characters";
  if (name == "." || name == "..") return "the shared memory name '" + std::string(name) + "' is not a name";
  for (const char c : name) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok)
      return "the shared memory name '" + std::string(name) + "' has '" + std::string(1, c) +
             "' (one path component: letters, digits, '.', '_', '-')";
  }
  return {};
}

namespace detail {

//! A unit suffix (matched without regard to case) and what it multiplies by.
struct unit {
  std::string_view suffix;
  std::uint64_t multiplier;
};

//! A kind of number that device strings and the bam command read: its
//! units, and how messages name them.
struct quantity {
  std::string_view name;       //!< "size", "rate", "time", "count"
  std::span<const unit> units; //!< "" among them: the unit may be left out
  std::string_view unit_list;  //!< for messages: "K, M, G or T"
  std::string_view unit_hint;  //!< the unit an example adds to bare digits
  std::string_view example;    //!< a whole value, for messages
};

inline constexpr std::uint64_t kib = 1024;
inline constexpr unit size_units[] = {
    {"", 1},
    {"B", 1},
    {"K", kib},
    {"KB", kib},
    {"KiB", kib},
    {"M", kib* kib},
    {"MB", kib* kib},
    {"MiB", kib* kib},
    {"G", kib* kib* kib},
    {"GB", kib* kib* kib},
    {"GiB", kib* kib* kib},
    {"T", kib* kib* kib* kib},
    {"TB", kib* kib* kib* kib},
    {"TiB", kib* kib* kib* kib},
};
inline constexpr unit rate_units[] = {{"", 1}, {"K", 1000}, {"M", 1000000}, {"G", 1000000000}};
inline constexpr unit time_units[] = {{"ns", 1}, {"us", 1000}, {"ms", 1000000}, {"s", 1000000000}};
inline constexpr unit count_units[] = {{"", 1}};

inline constexpr quantity size_quantity{"size", size_units, "K, M, G or T", "G", "64M"};
inline constexpr quantity rate_quantity{"rate", rate_units, "K, M or G", "K", "1M"};
inline constexpr quantity time_quantity{"time", time_units, "ns, us, ms or s", "us", "10s"};
inline constexpr quantity count_quantity{"count", count_units, "", "", "4"};

inline bool same_letters(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto up = [](char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c; };
    if (up(a[i]) != up(b[i])) return false;
  }
  return true;
}

//! Why a value was refused: what is wrong with it, and what to write
//! instead (ending in an example).
struct value_problem {
  std::string problem;
  std::string hint;
};

//! `v` read as quantity `q`, or the problem with it. `shown` names the value
//! in messages ("ram=12Q", "--offset 12Q"); `rewrite(w)` is what the person
//! would write with `w` in place of `v` (the whole device string, or
//! "--offset w").
template <class Rewrite>
std::optional<std::uint64_t> read_quantity(std::string_view v, const quantity& q, std::string_view shown,
                                           const Rewrite& rewrite, value_problem& why) {
  const std::string in = " in " + std::string(shown);
  if (!v.empty() && v.front() == '-') {
    why = {std::string(shown) + " is negative",
           "a " + std::string(q.name) + " counts up from 0, e.g. " + rewrite(q.example)};
    return std::nullopt;
  }
  std::size_t i = 0;
  std::uint64_t n = 0;
  for (; i < v.size() && v[i] >= '0' && v[i] <= '9'; ++i) {
    const std::uint64_t d = static_cast<std::uint64_t>(v[i] - '0');
    if (n > (UINT64_MAX - d) / 10) {
      why = {std::string(shown) + " overflows 64 bits", "e.g. " + rewrite(q.example)};
      return std::nullopt;
    }
    n = n * 10 + d;
  }
  if (i == 0) {
    why = {std::string(shown) + " is not a number", "e.g. " + rewrite(q.example)};
    return std::nullopt;
  }
  const std::string_view digits = v.substr(0, i), suffix = v.substr(i);
  for (const unit& u : q.units) {
    if (!same_letters(suffix, u.suffix)) continue;
    if (u.multiplier != 0 && n > UINT64_MAX / u.multiplier) {
      why = {std::string(shown) + " overflows 64 bits", "e.g. " + rewrite(q.example)};
      return std::nullopt;
    }
    return n * u.multiplier;
  }
  const std::string fixed = std::string(digits) + std::string(q.unit_hint);
  if (q.unit_list.empty())
    why = {"unit '" + std::string(suffix) + "'" + in,
           "a " + std::string(q.name) + " takes none, e.g. " + rewrite(digits)};
  else if (suffix.empty())
    why = {"no " + std::string(q.name) + " unit" + in, "use " + std::string(q.unit_list) + ", e.g. " + rewrite(fixed)};
  else
    why = {"unknown " + std::string(q.name) + " unit '" + std::string(suffix) + "'" + in,
           "use " + std::string(q.unit_list) + ", e.g. " + rewrite(fixed)};
  return std::nullopt;
}

[[noreturn]] inline void bad_device(const std::string& text, const std::string& problem, const std::string& hint) {
  throw error::invalid_input("device string '" + text + "': " + problem + " (" + hint + ")");
}

} // namespace detail

//! A byte count written as device strings write sizes: 4096, 64K, 1G, 2T
//! (binary units; B, KB, KiB forms and lower case too). Every size bam reads
//! goes through here. `option` names the value in messages ("--offset");
//! throws `bam::error` (EINVAL) saying what to write instead.
inline std::uint64_t parse_size(std::string_view v, std::string_view option = {}) {
  const std::string prefix = option.empty() ? std::string() : std::string(option) + " ";
  detail::value_problem why;
  const auto n = detail::read_quantity(
      v, detail::size_quantity, prefix + std::string(v), [&](std::string_view w) { return prefix + std::string(w); },
      why);
  if (!n) throw error::invalid_input(why.problem + " (" + why.hint + ")");
  return *n;
}

//! One option of device strings, for references (`bam help devices`).
struct device_option {
  std::string_view form;    //!< "ram=SIZE"
  std::string_view applies; //!< which device strings take it
  std::string_view meaning;
  std::string_view example; //!< a device string that uses it
};

//! Every option `parse_device` takes, media first.
inline constexpr device_option device_options[] = {
    {"ram=SIZE", "emu:, emu-gpu:", "media in host RAM (pinned for emu-gpu:), SIZE per controller", "emu:ram=64M"},
    {"hbm=SIZE", "emu-gpu:", "media in GPU memory", "emu-gpu:hbm=4G"},
    {"null=SIZE", "emu-gpu:", "no media: commands complete without moving data", "emu-gpu:null=1T"},
    {"shm=NAME", "emu:, emu-gpu:",
     "POSIX shared memory /dev/shm/bam-NAME (pinned for emu-gpu:), one copy for every process and GPU that opens "
     "it; size= creates it zero-filled or attaches to it (sizes must agree), without size= it must exist",
     "emu-gpu:shm=feat,size=64G"},
    {"file=PATH", "emu:", "a file or block device, O_DIRECT (io_uring with liburing)",
     "emu:file=/data/disk.img,size=8G"},
    {"extents=PATH", "emu:", "a file read from the raw disk under it through its extent map; read-only",
     "emu:extents=/data/features.bin"},
    {"size=SIZE", "file=, shm=",
     "file: create or extend the file to SIZE; shm: create it of SIZE or attach to it (same size); without it the "
     "file or shared memory must exist",
     "emu:file=disk.img,size=1G"},
    {"unlink", "shm=",
     "remove the shared memory's name when its last user closes it (default: it stays until "
     "removed, as a file would)",
     "emu-gpu:shm=feat,size=1G,unlink"},
    {"ro", "file=", "read-only: writes are answered Namespace is Write Protected", "emu:file=/dev/nvme0n1,ro"},
    {"holes", "extents=", "holes and unwritten extents read as zeroes instead of being refused",
     "emu:extents=/data/features.bin,holes"},
    {"ssds=N", "emu:, emu-gpu:", "N controllers (1-64), pages striped over them; file= uses PATH.0, PATH.1, ...",
     "emu-gpu:ram=16G,ssds=4"},
    {"lba=BYTES", "emu:, emu-gpu:", "LBA size: a power of two, 512 (default) to 65536", "emu:ram=64M,lba=4096"},
    {"queues=N", "emu:, emu-gpu:", "I/O queue pairs per controller (1-65535, default 128)", "emu:ram=64M,queues=8"},
    {"depth=N", "emu:, emu-gpu:", "entries per queue (2-65536, default 256)", "emu:ram=64M,depth=1024"},
    {"threads=N", "emu:", "CPU engine threads per controller (1-1024, default 4)", "emu:ram=64M,threads=2"},
    {"iops=RATE", "emu-gpu:", "SSD model: commands per second per controller (K, M, G: decimal)",
     "emu-gpu:ram=1G,iops=1M"},
    {"latency=TIME", "emu-gpu:", "SSD model: latency of each command (ns, us, ms, s)", "emu-gpu:ram=1G,latency=80us"},
    {"timeout=TIME", "emu:, emu-gpu:", "command timeout (ns, us, ms, s; default 10s)", "emu:ram=64M,timeout=30s"},
};

//! Parse a device string; throws `bam::error` (EINVAL) whose one line says
//! what is wrong and what to write instead.
inline device_spec parse_device(const std::string& text) {
  using namespace detail;
  device_spec s;
  s.text = text;
  if (text.empty())
    bad_device(text, "empty", "write e.g. emu:ram=64M, emu:file=/path/disk.img,size=8G or /dev/bam-nvme0");
  if (text.front() == '/') {
    s.kind = device_kind::pci;
    std::string_view rest(text);
    while (!rest.empty()) {
      const auto plus = rest.find('+');
      const std::string_view dev = rest.substr(0, plus);
      if (dev.empty() || dev.front() != '/')
        bad_device(text, "a device node must be an absolute path", "e.g. /dev/bam-nvme0+/dev/bam-nvme1");
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
    bad_device(text, "unknown transport '" + scheme + "'",
               "use emu:, emu-gpu: or a device node such as /dev/bam-nvme0, e.g. emu:ram=64M");
  const std::string scheme_colon = scheme + ":";
  const char* media_hint = s.kind == device_kind::emu_gpu ? "add ram=, hbm= or null= and a size, e.g. emu-gpu:ram=1G"
                                                          : "add ram=SIZE or file=PATH, e.g. emu:ram=64M";
  if (colon == std::string::npos || colon + 1 == text.size()) bad_device(text, "no media given", media_hint);
  std::string_view opts(text);
  opts.remove_prefix(colon + 1);
  bool have_media = false, have_size = false;
  std::string media_key;
  while (!opts.empty()) {
    const auto comma = opts.find(',');
    const std::string_view item = opts.substr(0, comma);
    const std::size_t item_at = static_cast<std::size_t>(item.data() - text.data());
    // The device string with this item replaced (for examples in messages).
    auto with_item = [&](std::string_view replacement) {
      std::string t = text.substr(0, item_at);
      t += replacement;
      t += text.substr(item_at + item.size());
      return t;
    };
    auto next = [&] {
      if (comma == std::string_view::npos) return false;
      opts.remove_prefix(comma + 1);
      return true;
    };
    if (item == "unlink") {
      s.shm_unlink = true;
      if (!next()) break;
      continue;
    }
    if (item == "ro" || item == "holes") {
      if (s.kind != device_kind::emu_cpu)
        bad_device(text, std::string(item) + " applies to file media",
                   item == "ro" ? "e.g. emu:file=/path/disk.img,ro" : "e.g. emu:extents=/path/file,holes");
      (item == "ro" ? s.read_only : s.holes) = true;
      if (!next()) break;
      continue;
    }
    auto keys = [] {
      std::string list;
      for (const auto& o : device_options)
        list += (list.empty() ? "" : ", ") + std::string(o.form.substr(0, o.form.find('=')));
      return list;
    };
    const auto eq = item.find('=');
    if (item.empty()) bad_device(text, "an empty option", "remove the extra comma");
    if (eq == std::string_view::npos || eq == 0)
      bad_device(text, "'" + std::string(item) + "' is not an option", "options: " + keys());
    const std::string_view k = item.substr(0, eq), v = item.substr(eq + 1);
    const std::string key(k);
    auto rewrite = [&](std::string_view w) { return with_item(key + "=" + std::string(w)); };
    auto number = [&](const quantity& q) {
      value_problem why;
      const auto n = read_quantity(v, q, item, rewrite, why);
      if (!n) bad_device(text, why.problem, why.hint);
      return *n;
    };
    auto count = [&](std::uint64_t lo, std::uint64_t hi) {
      const std::uint64_t n = number(count_quantity);
      if (n < lo || n > hi)
        bad_device(text, std::string(item) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]",
                   "e.g. " + rewrite(std::to_string(n < lo ? lo : hi)));
      return static_cast<std::uint32_t>(n);
    };
    if (v.empty()) {
      std::string example = "e.g. " + std::string(device_options[0].example);
      for (const auto& o : device_options)
        if (o.form.substr(0, o.form.find('=')) == k) example = "e.g. " + std::string(o.example);
      bad_device(text, key + " has no value", example);
    }
    auto media = [&](media_kind m) {
      if (have_media)
        bad_device(text, "more than one media given (" + media_key + "= and " + key + "=)",
                   "a device string names one medium; ssds=N makes N controllers of it");
      have_media = true;
      media_key = key;
      s.media = m;
    };
    if (k == "ram" || k == "hbm" || k == "null") {
      if (k != "ram" && s.kind != device_kind::emu_gpu)
        bad_device(text, key + " media needs the GPU engine", "write emu-gpu:" + std::string(item));
      media(k == "ram" ? media_kind::ram : k == "hbm" ? media_kind::hbm : media_kind::null);
      s.bytes = number(size_quantity);
      if (s.bytes == 0) bad_device(text, key + " size is zero", "e.g. " + rewrite("64M"));
    } else if (k == "shm") {
      media(media_kind::shm);
      s.shm_name = std::string(v);
      if (const std::string why = shm_name_problem(v); !why.empty())
        bad_device(text, why, "e.g. " + rewrite("features"));
    } else if (k == "file" || k == "extents") {
      if (s.kind != device_kind::emu_cpu)
        bad_device(text, key + " media needs the CPU engine", "write emu:" + std::string(item));
      media(media_kind::file);
      s.path = std::string(v);
      if (k == "extents") s.extents = s.read_only = true;
    } else if (k == "size") {
      s.bytes = number(size_quantity);
      have_size = true;
    } else if (k == "ssds") {
      s.ssds = count(1, 64);
    } else if (k == "lba") {
      s.lba_size = count(512, 65536);
      if (s.lba_size & (s.lba_size - 1))
        bad_device(text, "lba must be a power of two", "e.g. " + rewrite("512") + " or " + rewrite("4096"));
    } else if (k == "queues") {
      s.io_queues = count(1, 65535);
    } else if (k == "depth") {
      s.queue_depth = count(2, 65536);
    } else if (k == "threads") {
      s.threads = count(1, 1024);
    } else if (k == "iops" || k == "latency") {
      if (s.kind != device_kind::emu_gpu)
        bad_device(text, key + "= is a GPU-engine model option",
                   "the CPU engine has no SSD model; e.g. emu-gpu:ram=1G," + std::string(item));
      if (k == "iops")
        s.iops = number(rate_quantity);
      else
        s.latency_ns = number(time_quantity);
    } else if (k == "timeout") {
      s.timeout_ns = number(time_quantity);
    } else {
      bad_device(text, "unknown option '" + key + "'", "options: " + keys());
    }
    if (!next()) break;
  }
  if (!have_media) bad_device(text, "no media given", media_hint);
  if (s.media == media_kind::shm && have_size && s.bytes == 0)
    bad_device(text, "size is zero", "e.g. " + scheme_colon + "shm=" + s.shm_name + ",size=1G");
  if (s.shm_unlink && s.media != media_kind::shm)
    bad_device(text, "unlink applies to shm= media only", "e.g. emu-gpu:shm=features,size=1G,unlink");
  if (have_size && s.media != media_kind::file && s.media != media_kind::shm)
    bad_device(text, "size= applies to file and shm= media only",
               "give the size to " + media_key + "=, e.g. " + scheme_colon + media_key + "=64M");
  if (s.read_only && s.media != media_kind::file)
    bad_device(text, "ro applies to file media only", "e.g. emu:file=/path/disk.img,ro");
  if (s.holes && !s.extents) bad_device(text, "holes applies to extents= media only", "e.g. emu:extents=/path,holes");
  if (s.extents && have_size)
    bad_device(text, "size= does not apply to extents= media", "the file's own size is used: remove size=");
  if (s.extents && s.ssds != 1) bad_device(text, "extents= media is one file", "remove ssds= (or write ssds=1)");
  if (s.bytes % s.lba_size != 0)
    bad_device(text,
               "media size " + std::to_string(s.bytes) + " is not a multiple of the LBA size " +
                   std::to_string(s.lba_size),
               "round it to a multiple of " + std::to_string(s.lba_size) + ", e.g. " +
                   std::to_string((s.bytes / s.lba_size + 1) * s.lba_size));
  return s;
}

} // namespace bam
