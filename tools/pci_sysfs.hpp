// SPDX-License-Identifier: MIT
// What `bam list`, `bam bind` and `bam unbind` do with sysfs: find NVMe
// controllers and the bam_nvme device nodes bound to them, and hand a
// controller to bam_nvme or back to the kernel's nvme driver with the same
// refusals as scripts/bind-nvme and scripts/unbind-nvme (a mounted, swapped or
// held namespace; a process holding /dev/bam-nvmeN). Every path is taken
// relative to a root directory, so tests can run it over a made-up tree.
#pragma once

#include <bam/error.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace bam::tools {

namespace fs = std::filesystem;

//! PCI class code of an NVM Express controller (mass storage, NVM, NVMe).
inline constexpr const char* nvme_class_code = "0x010802";
inline constexpr const char* bam_driver = "bam_nvme";
inline constexpr const char* nvme_driver = "nvme";

[[noreturn]] inline void tool_fail(const std::string& what, int errnum = EINVAL) {
  error_context c;
  c.errnum = errnum;
  throw error(what, c);
}

//! The system as the commands see it: "/" normally, a test tree otherwise.
struct system_root {
  fs::path root = "/";
  fs::path sys(const std::string& rel) const { return root / "sys" / rel; }
  fs::path proc(const std::string& rel) const { return root / "proc" / rel; }
  bool real() const { return root == "/"; }
};

inline std::optional<std::string> read_line(const fs::path& p) {
  std::ifstream f(p);
  std::string s;
  if (!f || !std::getline(f, s)) return std::nullopt;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
    s.pop_back();
  return s;
}

inline std::optional<std::int64_t> read_int(const fs::path& p) {
  auto s = read_line(p);
  if (!s || s->empty()) return std::nullopt;
  char* end = nullptr;
  const long long v = std::strtoll(s->c_str(), &end, 0);
  if (end == s->c_str()) return std::nullopt;
  return v;
}

inline void write_attr(const fs::path& p, const std::string& value) {
  std::ofstream f(p);
  f << value;
  f.flush();
  if (!f) tool_fail("writing '" + value + "' to " + p.string(), errno != 0 ? errno : EIO);
}

//! "0000:01:00.0" from "0000:01:00.0" or "01:00.0"; throws on anything else.
inline std::string normalize_pci_address(const std::string& a) {
  auto hex = [](const std::string& s, std::size_t n) {
    return s.size() == n &&
           std::all_of(s.begin(), s.end(), [](char ch) { return std::isxdigit(static_cast<unsigned char>(ch)); });
  };
  std::string full = std::count(a.begin(), a.end(), ':') == 1 ? "0000:" + a : a;
  // dddd:bb:dd.f
  if (full.size() == 12 && full[4] == ':' && full[7] == ':' && full[10] == '.' && hex(full.substr(0, 4), 4) &&
      hex(full.substr(5, 2), 2) && hex(full.substr(8, 2), 2) && hex(full.substr(11, 1), 1)) {
    std::transform(full.begin(), full.end(), full.begin(),
                   [](char ch) { return static_cast<char>(std::tolower(static_cast<unsigned char>(ch))); });
    return full;
  }
  throw error::invalid_input("'" + a + "' is not a PCI address (write e.g. 0000:01:00.0 or 01:00.0; see lspci -D)");
}

inline std::string driver_of(const system_root& r, const std::string& addr) {
  std::error_code ec;
  const fs::path link = fs::read_symlink(r.sys("bus/pci/devices/" + addr + "/driver"), ec);
  return ec ? std::string() : link.filename().string();
}

//! One open file of a bam_nvme device: a process and its I/O queue pairs.
struct bam_client {
  std::int64_t pid = 0;
  std::string mode;                  //!< shared or exclusive
  std::vector<std::uint32_t> queues; //!< queue ids it holds
  std::string comm;
};

//! The controller's I/O queue pairs as the module hands them out.
struct bam_queue_counts {
  std::uint32_t total = 0, free = 0, per_process = 0;
};

struct bam_node {
  std::string name; //!< bam-nvme0
  std::int64_t owner_pid = 0;
  std::string owner_name; //!< /proc/PID/comm
  std::optional<std::int64_t> pinned_pages,
      mappings;                           //!< per controller, if the module reports them
  std::vector<bam_client> clients;        //!< every open file, oldest first
  std::optional<bam_queue_counts> queues; //!< if the module reports them
};

//! The module's clients attribute: "PID MODE QUEUES COMM" per line, QUEUES "1,2" or "-".
inline std::vector<bam_client> read_clients(const fs::path& p) {
  std::vector<bam_client> out;
  std::ifstream f(p);
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    bam_client c;
    std::string queues;
    if (!(in >> c.pid >> c.mode >> queues)) continue;
    std::getline(in >> std::ws, c.comm);
    if (queues != "-") {
      std::istringstream q(queues);
      std::string id;
      while (std::getline(q, id, ','))
        if (!id.empty()) c.queues.push_back(static_cast<std::uint32_t>(std::strtoul(id.c_str(), nullptr, 10)));
    }
    out.push_back(c);
  }
  return out;
}

inline std::optional<bam_queue_counts> read_queue_counts(const fs::path& p) {
  std::ifstream f(p);
  bam_queue_counts q;
  if (!(f >> q.total >> q.free >> q.per_process)) return std::nullopt;
  return q;
}

struct nvme_function {
  std::string address;
  std::string vendor, device; //!< "0x1b36"
  std::string driver;         //!< bam_nvme, nvme, or empty
  std::vector<bam_node> bam_nodes;
  std::vector<std::string> kernel_controllers; //!< nvme0 ... (kernel nvme driver)
  std::vector<std::string> block_devices;      //!< nvme0n1 ...
};

inline std::vector<std::string> sorted_entries(const fs::path& dir, const std::string& prefix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.rfind(prefix, 0) == 0) out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

inline std::vector<nvme_function> list_nvme(const system_root& r) {
  std::vector<nvme_function> out;
  for (const auto& addr : sorted_entries(r.sys("bus/pci/devices"), "")) {
    const fs::path dev = r.sys("bus/pci/devices/" + addr);
    if (read_line(dev / "class").value_or("") != nvme_class_code) continue;
    nvme_function f;
    f.address = addr;
    f.vendor = read_line(dev / "vendor").value_or("?");
    f.device = read_line(dev / "device").value_or("?");
    f.driver = driver_of(r, addr);
    for (const auto& n : sorted_entries(dev / "bam-nvme", "bam-nvme")) {
      bam_node b;
      b.name = n;
      b.owner_pid = read_int(dev / "bam-nvme" / n / "owner_pid").value_or(0);
      if (b.owner_pid != 0) b.owner_name = read_line(r.proc(std::to_string(b.owner_pid) + "/comm")).value_or("?");
      b.pinned_pages = read_int(dev / "bam-nvme" / n / "pinned_pages");
      b.mappings = read_int(dev / "bam-nvme" / n / "mappings");
      b.clients = read_clients(dev / "bam-nvme" / n / "clients");
      b.queues = read_queue_counts(dev / "bam-nvme" / n / "io_queues");
      f.bam_nodes.push_back(b);
    }
    for (const auto& c : sorted_entries(dev / "nvme", "nvme")) {
      f.kernel_controllers.push_back(c);
      for (const auto& ns : sorted_entries(dev / "nvme" / c, c + "n"))
        f.block_devices.push_back(ns);
    }
    out.push_back(f);
  }
  return out;
}

//! Totals over every controller (/sys/class/bam-nvme), when the module is loaded.
struct module_totals {
  bool loaded = false;
  std::int64_t pinned_pages = 0, mappings = 0;
};
inline module_totals bam_module_totals(const system_root& r) {
  module_totals t;
  t.loaded = fs::exists(r.sys("bus/pci/drivers/bam_nvme")) || fs::exists(r.sys("class/bam-nvme"));
  t.pinned_pages = read_int(r.sys("class/bam-nvme/pinned_pages")).value_or(0);
  t.mappings = read_int(r.sys("class/bam-nvme/mappings")).value_or(0);
  return t;
}

inline bool listed_in(const fs::path& table, const std::string& dev) {
  std::ifstream f(table);
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(dev, 0) == 0 && line.size() > dev.size() &&
        std::isspace(static_cast<unsigned char>(line[dev.size()])))
      return true;
  return false;
}

//! Why the namespaces of `addr` are in use: mounted, swap, or held (dm/md).
inline std::vector<std::string> namespaces_in_use(const system_root& r, const std::string& addr) {
  std::vector<std::string> why;
  const fs::path dev = r.sys("bus/pci/devices/" + addr);
  for (const auto& c : sorted_entries(dev / "nvme", "nvme")) {
    for (const auto& path : sorted_entries(dev / "nvme" / c, "nvme")) {
      if (path.find('n', 4) == std::string::npos || path == c) continue; // nvme*n* only
      // Per-path nodes nvmeXcZnY have the multipath head nvmeXnY.
      std::string head = path;
      const auto cpos = head.find('c', 4);
      if (cpos != std::string::npos) {
        const auto npos = head.find('n', cpos);
        if (npos != std::string::npos) head = head.substr(0, cpos) + head.substr(npos);
      }
      for (const std::string& blk : {path, head}) {
        const fs::path block = r.sys("block/" + blk);
        if (!fs::exists(block)) continue;
        std::vector<std::pair<std::string, fs::path>> parts{{blk, block}};
        for (const auto& p : sorted_entries(block, blk + "p"))
          parts.emplace_back(p, block / p);
        for (const auto& [name, dir] : parts) {
          const std::string node = "/dev/" + name;
          if (listed_in(r.proc("mounts"), node)) why.push_back(node + "(mounted)");
          if (listed_in(r.proc("swaps"), node)) why.push_back(node + "(swap)");
          const auto holders = sorted_entries(dir / "holders", "");
          if (!holders.empty()) {
            std::string h;
            for (const auto& x : holders)
              h += (h.empty() ? "" : " ") + x;
            why.push_back(node + "(held by " + h + ")");
          }
        }
      }
    }
  }
  std::sort(why.begin(), why.end());
  why.erase(std::unique(why.begin(), why.end()), why.end());
  return why;
}

struct bind_result {
  std::string address;
  std::string driver_before, driver_after;
  std::string node;                //!< /dev/bam-nvmeN after bind
  bool changed = false;            //!< false: nothing to do
  std::vector<std::string> forced; //!< uses overridden with --force
};

inline void check_nvme(const system_root& r, const std::string& addr) {
  const fs::path dev = r.sys("bus/pci/devices/" + addr);
  if (!fs::exists(dev)) tool_fail("no PCI device " + addr + " (see lspci -D)", ENODEV);
  const std::string cls = read_line(dev / "class").value_or("?");
  if (cls != nvme_class_code) tool_fail(addr + " is not an NVMe controller (class " + cls + ")", ENODEV);
}

inline void probe(const system_root& r, const std::string& addr) {
  std::ofstream(r.sys("bus/pci/drivers_probe")) << addr; // the kernel may refuse: checked afterwards
}

//! Hand `address` to bam_nvme (what scripts/bind-nvme does).
inline bind_result bind_controller(const system_root& r, const std::string& address, bool force) {
  bind_result b;
  b.address = normalize_pci_address(address);
  check_nvme(r, b.address);
  const fs::path dev = r.sys("bus/pci/devices/" + b.address);
  b.driver_before = driver_of(r, b.address);
  if (b.driver_before == bam_driver) {
    b.driver_after = b.driver_before;
    const auto nodes = sorted_entries(dev / "bam-nvme", "bam-nvme");
    b.node = nodes.empty() ? std::string() : "/dev/" + nodes.front();
    return b;
  }
  const auto busy = namespaces_in_use(r, b.address);
  if (!busy.empty()) {
    std::string list;
    for (const auto& x : busy)
      list += " " + x;
    if (!force)
      tool_fail("refusing: " + b.address + " is in use:" + list +
                    ". Unmount first, or pass --force (data loss likely).",
                EBUSY);
    b.forced = busy;
  }
  if (!fs::exists(r.sys("bus/pci/drivers/bam_nvme"))) {
    if (r.real()) (void)std::system("modprobe bam_nvme >/dev/null 2>&1");
    if (!fs::exists(r.sys("bus/pci/drivers/bam_nvme")))
      tool_fail("the bam_nvme module is not loaded: modprobe bam_nvme (packages: bam-dkms), or insmod "
                "kernel_module/bam_nvme.ko",
                ENOENT);
  }
  write_attr(dev / "driver_override", bam_driver);
  if (!b.driver_before.empty()) write_attr(dev / "driver" / "unbind", b.address);
  probe(r, b.address);
  b.driver_after = driver_of(r, b.address);
  if (b.driver_after != bam_driver)
    tool_fail("bam_nvme did not bind " + b.address +
                  " (driver now: " + (b.driver_after.empty() ? std::string("none") : b.driver_after) + "); see dmesg",
              EIO);
  const auto nodes = sorted_entries(dev / "bam-nvme", "bam-nvme");
  b.node = nodes.empty() ? std::string() : "/dev/" + nodes.front();
  b.changed = true;
  return b;
}

//! Give `address` back to the kernel's nvme driver (what scripts/unbind-nvme does).
inline bind_result unbind_controller(const system_root& r, const std::string& address, bool force) {
  bind_result b;
  b.address = normalize_pci_address(address);
  const fs::path dev = r.sys("bus/pci/devices/" + b.address);
  if (!fs::exists(dev)) tool_fail("no PCI device " + b.address, ENODEV);
  b.driver_before = driver_of(r, b.address);
  if (b.driver_before == bam_driver) {
    for (const auto& n : sorted_entries(dev / "bam-nvme", "bam-nvme")) {
      const auto pid = read_int(dev / "bam-nvme" / n / "owner_pid").value_or(0);
      if (pid == 0) continue;
      const std::string who = "pid " + std::to_string(pid) + " (" +
                              read_line(r.proc(std::to_string(pid) + "/comm")).value_or("?") + ") has /dev/" + n +
                              " open";
      if (!force) tool_fail("refusing: " + who + ". Stop it, or pass --force.", EBUSY);
      b.forced.push_back(who);
    }
    write_attr(dev / "driver" / "unbind", b.address);
  }
  write_attr(dev / "driver_override", "\n"); // an empty line clears it
  if (!fs::exists(r.sys("bus/pci/drivers/nvme")) && r.real()) (void)std::system("modprobe nvme >/dev/null 2>&1");
  if (driver_of(r, b.address).empty()) probe(r, b.address);
  b.driver_after = driver_of(r, b.address);
  b.changed = b.driver_before != b.driver_after;
  if (b.driver_after != nvme_driver)
    tool_fail("the nvme driver did not take " + b.address + " (driver now: " +
                  (b.driver_after.empty() ? std::string("none") : b.driver_after) + "; is nvme.ko available?)",
              EIO);
  return b;
}

} // namespace bam::tools
