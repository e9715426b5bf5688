// SPDX-License-Identifier: MIT
// The bam command: controllers bound to bam's kernel module, binding them,
// identify and health of any device string, and loading data sets onto a
// device and reading them back. Every subcommand takes --json.
//
//   bam list                          NVMe controllers, bam device nodes, owners, pins
//   bam bind 0000:01:00.0 [--force]   hand a controller to bam_nvme
//   bam unbind 0000:01:00.0 [--force] give it back to the kernel's nvme driver
//   bam identify DEVICE               controller, namespaces, queues, limits
//   bam smart DEVICE                  SMART / health log
//   bam load FILE DEVICE [--offset 1G] [--verify]     resumable
//   bam dump DEVICE FILE --length 4G [--offset 1G]
//   bam checksum FILE                 XXH3-128, as load and dump print it
//   bam map FILE [--device DEVICE] [--verify]
//   bam map PATH --image IMAGE | --fs-device DEVICE [--verify]
//                                     where a file's blocks are on its disk, which
//                                     path reads it, and (--verify) reading it that way
//   bam shm list | remove NAME...     shared memory of shm=NAME device strings
//
// DEVICE is a device string: /dev/bam-nvme0, emu:file=/path/disk.img[,size=8G], emu:ram=64M.
#include "pci_sysfs.hpp"
#include "progress.hpp"

#include <bam/host.hpp>
#include <bam/host/dataset.hpp>
#include <bam/file/mapped_file.hpp>
#if defined(BAM_HAVE_LIBEXT2FS)
#include <bam/file/fs_image.hpp>
#endif

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <nvme/types.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#ifndef BAM_VERSION // CMake defines it (the project's version); a build by hand may not
#define BAM_VERSION "unknown"
#endif

namespace {

using json = nlohmann::ordered_json;

std::atomic<bool> interrupted{false};
extern "C" void on_interrupt(int) { interrupted.store(true); }

//! Options every subcommand shares.
struct common_options {
  bool json = false;
  bool quiet = false;
  std::string root = "/"; // system root for sysfs and /proc (tests use a made-up tree)
};

// Exit status (bam --help says the same).
constexpr int exit_ok = 0;
constexpr int exit_failure = 1;       //!< the device, a file or the system failed or refused
constexpr int exit_usage = 2;         //!< the command line is wrong; nothing was touched
constexpr int exit_interrupted = 130; //!< Ctrl-C or SIGTERM (128 + SIGINT, as shells report it)

constexpr const char* exit_status_help =
    "Sizes (--offset, --length, ...) are bytes or take K, M, G, T (binary), as in device strings.\n"
    "\n"
    "Exit status:\n"
    "  0    done\n"
    "  1    failed: the device, a file or the system refused or reported an error\n"
    "       (an NVMe status, a short read, a --verify mismatch, a controller in use)\n"
    "  2    the command line is wrong: an unknown command or option, a missing argument,\n"
    "       a bad size, device string or PCI address; nothing was read or written\n"
    "  130  interrupted (Ctrl-C); a load resumes when run again\n"
    "With --json, reports and errors are JSON on standard output; when dump writes its\n"
    "data there ('-'), reports and errors go to standard error.";

//! Where reports (text or JSON) go: standard output, unless data goes there.
std::FILE* report = stdout;

void print_json(const json& j) {
  const std::string text = j.dump(2) + "\n";
  std::fputs(text.c_str(), report);
  std::fflush(report);
}

std::string hex(std::uint64_t v, int width = 4) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%0*llx", width, static_cast<unsigned long long>(v));
  return b;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (b >= 1024 && u < 5) {
    b /= 1024;
    ++u;
  }
  char out[32];
  std::snprintf(out, sizeof out, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return out;
}

//! A 128-bit little-endian log counter as a decimal string.
std::string u128(const std::uint8_t* p) {
  unsigned __int128 v = 0;
  for (int i = 15; i >= 0; --i)
    v = (v << 8) | p[i];
  if (v == 0) return "0";
  std::string s;
  while (v != 0) {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  }
  return s;
}

std::string version_string(std::uint32_t ver) {
  return std::to_string(ver >> 16) + "." + std::to_string((ver >> 8) & 0xff) + "." + std::to_string(ver & 0xff);
}

//! The controllers behind a device string, brought up by the driver.
std::vector<std::unique_ptr<bam::controller>> open_device(const std::string& device, std::uint32_t queues,
                                                          std::uint32_t depth) {
  const bam::device_spec spec = bam::parse_device(device);
  std::vector<std::unique_ptr<bam::controller>> out;
  for (auto& t : bam::open_host_transports(spec)) {
    bam::controller_options o;
    o.io_queues = queues;
    o.queue_depth = depth != 0 ? depth : spec.queue_depth;
    o.io_timeout_ns = spec.timeout_ns;
    o.admin_timeout_ns = spec.timeout_ns;
    out.push_back(std::make_unique<bam::controller>(t, o));
  }
  return out;
}

bam::controller& single(std::vector<std::unique_ptr<bam::controller>>& cs, const std::string& device) {
  if (cs.size() != 1)
    bam::tools::tool_fail("'" + device + "' names " + std::to_string(cs.size()) +
                          " controllers; loading and dumping work on one controller at a time");
  return *cs.front();
}

// ---- list, bind, unbind -------------------------------------------------------

//! The processes that have a bam_nvme device open and their I/O queue pairs.
void print_clients(const bam::tools::bam_node& b) {
  if (b.queues && b.queues->total != 0)
    std::printf("  I/O queue pairs: %u, %u free, at most %u per process\n", b.queues->total, b.queues->free,
                b.queues->per_process);
  if (b.clients.empty()) return;
  std::printf("  %-8s %-10s %-16s %s\n", "PID", "MODE", "QUEUE PAIRS", "COMMAND");
  for (const auto& c : b.clients) {
    std::string q;
    for (const auto id : c.queues)
      q += (q.empty() ? "" : ",") + std::to_string(id);
    std::printf("  %-8lld %-10s %-16s %s\n", static_cast<long long>(c.pid), c.mode.c_str(), q.empty() ? "-" : q.c_str(),
                c.comm.c_str());
  }
}

int cmd_list(const common_options& co) {
  const bam::tools::system_root r{co.root};
  const auto fns = bam::tools::list_nvme(r);
  const auto totals = bam::tools::bam_module_totals(r);
  if (co.json) {
    json j;
    j["module_loaded"] = totals.loaded;
    j["pinned_pages"] = totals.pinned_pages;
    j["mappings"] = totals.mappings;
    j["controllers"] = json::array();
    for (const auto& f : fns) {
      json c;
      c["pci"] = f.address;
      c["vendor"] = f.vendor;
      c["device"] = f.device;
      c["driver"] = f.driver;
      c["bam_devices"] = json::array();
      for (const auto& b : f.bam_nodes) {
        json n;
        n["node"] = "/dev/" + b.name;
        n["owner_pid"] = b.owner_pid;
        n["owner"] = b.owner_name;
        n["pinned_pages"] = b.pinned_pages ? json(*b.pinned_pages) : json(nullptr);
        n["mappings"] = b.mappings ? json(*b.mappings) : json(nullptr);
        n["clients"] = json::array();
        for (const auto& cl : b.clients)
          n["clients"].push_back({{"pid", cl.pid}, {"mode", cl.mode}, {"queues", cl.queues}, {"comm", cl.comm}});
        if (b.queues)
          n["io_queues"] = {
              {"total", b.queues->total}, {"free", b.queues->free}, {"per_process", b.queues->per_process}};
        c["bam_devices"].push_back(n);
      }
      c["kernel_controllers"] = f.kernel_controllers;
      c["namespaces"] = f.block_devices;
      j["controllers"].push_back(c);
    }
    print_json(j);
    return 0;
  }
  if (fns.empty())
    std::printf("no NVMe controllers (PCI class %s) found\n", bam::tools::nvme_class_code);
  else
    std::printf("%-13s %-10s %-9s %-15s %-18s %-7s %s\n", "PCI", "ID", "DRIVER", "DEVICE", "OWNER", "PINNED",
                "MAPPINGS");
  for (const auto& f : fns) {
    const std::string id = f.vendor.substr(f.vendor.rfind('x') + 1) + ":" + f.device.substr(f.device.rfind('x') + 1);
    if (!f.bam_nodes.empty()) {
      for (const auto& b : f.bam_nodes) {
        const std::string owner =
            b.owner_pid == 0 ? std::string("-") : std::to_string(b.owner_pid) + " (" + b.owner_name + ")";
        std::printf("%-13s %-10s %-9s %-15s %-18s %-7s %s\n", f.address.c_str(), id.c_str(), f.driver.c_str(),
                    ("/dev/" + b.name).c_str(), owner.c_str(),
                    b.pinned_pages ? std::to_string(*b.pinned_pages).c_str() : "?",
                    b.mappings ? std::to_string(*b.mappings).c_str() : "?");
        print_clients(b);
      }
    } else {
      std::string devs;
      for (const auto& d : f.block_devices)
        devs += (devs.empty() ? "" : ",") + d;
      std::printf("%-13s %-10s %-9s %-15s %-18s %-7s %s\n", f.address.c_str(), id.c_str(),
                  f.driver.empty() ? "-" : f.driver.c_str(), devs.empty() ? "-" : devs.c_str(), "-", "-", "-");
    }
  }
  if (totals.loaded)
    std::printf("bam_nvme: loaded; %lld pages pinned, %lld mappings over all controllers\n",
                static_cast<long long>(totals.pinned_pages), static_cast<long long>(totals.mappings));
  else
    std::printf("bam_nvme: not loaded (modprobe bam_nvme)\n");
  return 0;
}

int report_bind(const common_options& co, const bam::tools::bind_result& b, const char* verb) {
  if (co.json) {
    json j;
    j["pci"] = b.address;
    j["driver_before"] = b.driver_before;
    j["driver_after"] = b.driver_after;
    j["changed"] = b.changed;
    if (!b.node.empty()) j["node"] = b.node;
    j["forced"] = b.forced;
    print_json(j);
    return 0;
  }
  for (const auto& f : b.forced)
    std::fprintf(stderr, "bam %s: --force: going ahead although %s\n", verb, f.c_str());
  if (!b.changed)
    std::printf("bam %s: %s is already bound to %s%s%s\n", verb, b.address.c_str(), b.driver_after.c_str(),
                b.node.empty() ? "" : ": ", b.node.c_str());
  else
    std::printf("bam %s: %s -> %s\n", verb, b.address.c_str(),
                b.node.empty() ? b.driver_after.c_str() : b.node.c_str());
  return 0;
}

// ---- identify, smart ---------------------------------------------------------------

json identify_json(const bam::controller& c) {
  const nvme_id_ctrl& id = c.identify_data();
  json j;
  j["name"] = c.name();
  j["model"] = c.model();
  j["serial"] = c.serial();
  j["firmware"] = c.firmware();
  j["vendor_id"] = hex(id.vid);
  j["subsystem_vendor_id"] = hex(id.ssvid);
  j["version"] = version_string(id.ver);
  j["mdts"] = id.mdts;
  j["max_transfer_bytes"] = c.max_transfer_bytes();
  j["nn"] = id.nn;
  j["oncs"] = hex(id.oncs);
  j["volatile_write_cache"] = (id.vwc & 1) != 0;
  j["cap"] = {{"mqes", c.cap().bits.mqes + 1},
              {"timeout_ms", c.cap().bits.to * 500},
              {"doorbell_stride", 4u << c.cap().bits.dstrd}};
  j["io_queues"] = c.io_queue_count();
  j["namespaces"] = json::array();
  for (const auto& ns : c.namespaces())
    j["namespaces"].push_back(
        {{"nsid", ns.nsid}, {"blocks", ns.blocks}, {"lba_size", ns.lba_size}, {"bytes", ns.blocks * ns.lba_size}});
  return j;
}

int cmd_identify(const common_options& co, const std::string& device) {
  // Ask for every queue pair the controller offers (shallow ones: identify
  // moves no data) so the count reported is the controller's.
  auto cs = open_device(device, 65535, 2);
  json all = json::array();
  for (auto& c : cs)
    all.push_back(identify_json(*c));
  if (co.json) {
    print_json({{"device", device}, {"controllers", all}});
    return 0;
  }
  for (const auto& j : all) {
    std::printf("controller   %s\n", j["name"].get<std::string>().c_str());
    std::printf("model        %s\nserial       %s\nfirmware     %s\n", j["model"].get<std::string>().c_str(),
                j["serial"].get<std::string>().c_str(), j["firmware"].get<std::string>().c_str());
    std::printf("vendor       %s (subsystem %s), NVMe %s\n", j["vendor_id"].get<std::string>().c_str(),
                j["subsystem_vendor_id"].get<std::string>().c_str(), j["version"].get<std::string>().c_str());
    std::printf("transfers    MDTS %u: at most %s per command\n", j["mdts"].get<unsigned>(),
                human_bytes(j["max_transfer_bytes"].get<double>()).c_str());
    std::printf("queues       %u I/O queue pairs, up to %u entries each (CAP.MQES+1)\n", j["io_queues"].get<unsigned>(),
                j["cap"]["mqes"].get<unsigned>());
    std::printf("namespaces   %zu active of %u\n", j["namespaces"].size(), j["nn"].get<unsigned>());
    for (const auto& ns : j["namespaces"])
      std::printf("  nsid %-5u %llu blocks of %u B = %s\n", ns["nsid"].get<unsigned>(),
                  static_cast<unsigned long long>(ns["blocks"].get<std::uint64_t>()), ns["lba_size"].get<unsigned>(),
                  human_bytes(ns["bytes"].get<double>()).c_str());
  }
  return 0;
}

int cmd_smart(const common_options& co, const std::string& device) {
  auto cs = open_device(device, 1, 0);
  json all = json::array();
  for (auto& c : cs) {
    auto buf = c->transport().alloc(bam::dma_page_size);
    c->get_log_page(bam::nvme::log_page_id::smart_health, 0xffffffffu, *buf, sizeof(nvme_smart_log));
    const auto* s = buf->as<nvme_smart_log>();
    const int kelvin = s->temperature[0] | (s->temperature[1] << 8);
    json j;
    j["name"] = c->name();
    j["critical_warning"] = hex(s->critical_warning, 2);
    j["temperature_celsius"] = kelvin == 0 ? json(nullptr) : json(kelvin - 273);
    j["available_spare_percent"] = s->avail_spare;
    j["available_spare_threshold_percent"] = s->spare_thresh;
    j["percentage_used"] = s->percent_used;
    j["data_units_read"] = u128(s->data_units_read);
    j["data_units_written"] = u128(s->data_units_written);
    j["host_read_commands"] = u128(s->host_reads);
    j["host_write_commands"] = u128(s->host_writes);
    j["controller_busy_minutes"] = u128(s->ctrl_busy_time);
    j["power_cycles"] = u128(s->power_cycles);
    j["power_on_hours"] = u128(s->power_on_hours);
    j["unsafe_shutdowns"] = u128(s->unsafe_shutdowns);
    j["media_errors"] = u128(s->media_errors);
    j["error_log_entries"] = u128(s->num_err_log_entries);
    all.push_back(j);
  }
  if (co.json) {
    print_json({{"device", device}, {"controllers", all}});
    return 0;
  }
  for (const auto& j : all) {
    std::printf("%-36s%s\n", "controller", j["name"].get<std::string>().c_str());
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "name") continue;
      std::string v = it->is_string() ? it->get<std::string>() : it->dump();
      if (it.key().rfind("data_units", 0) == 0) v += " (x 512,000 bytes)";
      std::printf("%-36s%s\n", it.key().c_str(), v.c_str());
    }
  }
  return 0;
}

// ---- load, dump, checksum --------------------------------------------------------------

struct transfer_args {
  std::string file, device;
  std::uint64_t offset = 0, length = 0, chunk = 1 << 20, max_rate = 0;
  std::uint32_t nsid = 1, queues = 4;
  bool verify = false, restart = false;
  std::string state;
};

json result_json(const char* what, const transfer_args& a, const bam::dataset_result& r) {
  json j;
  j["command"] = what;
  j["device"] = a.device;
  j["file"] = a.file;
  j["nsid"] = a.nsid;
  j["offset"] = a.offset;
  j["bytes"] = r.bytes;
  j["chunks"] = r.chunks;
  if (std::string(what) == "load") {
    j["resumed_chunks"] = r.resumed_chunks;
    j["verified_chunks"] = r.verified_chunks;
  }
  j["checksum"] = r.checksum;
  j["seconds"] = r.seconds;
  j["bytes_per_second"] = r.seconds > 0 ? static_cast<double>(r.bytes) / r.seconds : 0.0;
  return j;
}

bam::dataset_options dataset_opts(const transfer_args& a, bam::tools::progress_bar* bar) {
  bam::dataset_options o;
  o.nsid = a.nsid;
  o.offset = a.offset;
  o.chunk_bytes = a.chunk;
  o.queues = a.queues;
  o.max_bytes_per_second = a.max_rate;
  o.verify = a.verify;
  o.resume = !a.restart;
  o.state_path = a.state;
  o.cancel = &interrupted;
  if (bar != nullptr) o.progress = bar->follow();
  return o;
}

int cmd_load(const common_options& co, const transfer_args& a) {
  auto cs = open_device(a.device, a.queues, 0);
  bam::controller& c = single(cs, a.device);
  bam::tools::progress_bar bar("load", !co.json && !co.quiet);
  const auto r = bam::load_dataset(c, a.file, dataset_opts(a, &bar));
  bar.finish();
  const bam::device_spec spec = bam::parse_device(a.device);
  if (spec.kind != bam::device_kind::pci && spec.media != bam::media_kind::file && spec.media != bam::media_kind::shm)
    std::fprintf(stderr,
                 "bam load: warning: %s keeps its data in this process's memory, which is gone when bam exits; "
                 "to keep it, load onto emu:file=PATH,size=N, emu:shm=NAME,size=N or a /dev/bam-nvme device\n",
                 a.device.c_str());
  if (co.json) {
    print_json(result_json("load", a, r));
    return 0;
  }
  std::printf("loaded %s (%llu bytes) onto %s namespace %u at offset %llu in %.2f s (%s/s)\n", a.file.c_str(),
              static_cast<unsigned long long>(r.bytes), a.device.c_str(), a.nsid,
              static_cast<unsigned long long>(a.offset), r.seconds,
              human_bytes(r.seconds > 0 ? static_cast<double>(r.bytes) / r.seconds : 0).c_str());
  if (r.resumed_chunks != 0)
    std::printf("resumed: %llu of %llu chunks were already on the device\n",
                static_cast<unsigned long long>(r.resumed_chunks), static_cast<unsigned long long>(r.chunks));
  if (a.verify)
    std::printf("verified: %llu chunks read back equal\n", static_cast<unsigned long long>(r.verified_chunks));
  std::printf("checksum %s\n", r.checksum.c_str());
  return 0;
}

int cmd_dump(const common_options& co, const transfer_args& a) {
  auto cs = open_device(a.device, a.queues, 0);
  bam::controller& c = single(cs, a.device);
  bam::tools::progress_bar bar("dump", !co.json && !co.quiet && a.file != "-");
  const auto r = bam::dump_dataset(c, a.file, a.length, dataset_opts(a, &bar));
  bar.finish();
  if (co.json) {
    print_json(result_json("dump", a, r));
    return 0;
  }
  if (a.file == "-") {
    std::fprintf(report, "checksum %s\n", r.checksum.c_str());
    return 0;
  }
  std::fprintf(report, "dumped %llu bytes of %s namespace %u at offset %llu to %s in %.2f s (%s/s)\n",
               static_cast<unsigned long long>(r.bytes), a.device.c_str(), a.nsid,
               static_cast<unsigned long long>(a.offset), a.file.c_str(), r.seconds,
               human_bytes(r.seconds > 0 ? static_cast<double>(r.bytes) / r.seconds : 0).c_str());
  std::fprintf(report, "checksum %s\n", r.checksum.c_str());
  return 0;
}

//! `bam shm list`: the shared memory of `shm=NAME` device strings on this
//! machine; `bam shm remove NAME...`: remove names (their users keep their
//! mappings; the memory goes with the last of them).
int cmd_shm(const common_options& co, const std::string& action, const std::vector<std::string>& names) {
  if (action == "remove") {
    if (names.empty()) throw bam::error::invalid_input("bam shm remove: name the shared memory to remove");
    for (const auto& n : names)
      if (!bam::emu::remove_shared_memory(n))
        throw bam::error::invalid_input(
            "bam shm remove: no shared memory '" + n + "' (" + bam::emu::shared_memory_object(n) + ")", ENOENT);
    if (co.json) print_json({{"removed", names}});
    return 0;
  }
  json all = json::array();
  std::error_code ec;
  const std::string prefix(bam::shm_object_prefix);
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string file = e.path().filename().string();
    if (file.rfind(prefix, 0) != 0) continue;
    struct stat st {};
    if (::stat(e.path().c_str(), &st) != 0) continue;
    all.push_back({{"name", file.substr(prefix.size())},
                   {"bytes", static_cast<std::uint64_t>(st.st_size)},
                   {"uid", st.st_uid},
                   {"mode", st.st_mode & 0777}});
  }
  if (co.json) {
    print_json({{"shared_memory", all}});
    return 0;
  }
  if (all.empty()) std::printf("no shared memory of bam's (/dev/shm/%s*)\n", prefix.c_str());
  for (const auto& j : all)
    std::printf("%-40s %16llu bytes  uid %u  mode %03o\n", j["name"].get<std::string>().c_str(),
                static_cast<unsigned long long>(j["bytes"].get<std::uint64_t>()), j["uid"].get<unsigned>(),
                j["mode"].get<unsigned>());
  return 0;
}

int cmd_checksum(const common_options& co, const std::string& file) {
  const std::string sum = bam::file_checksum(file);
  if (co.json)
    print_json({{"file", file}, {"checksum", sum}});
  else
    std::printf("%s  %s\n", sum.c_str(), file.c_str());
  return 0;
}

// ---- map ---------------------------------------------------------------------

struct map_args {
  std::string file;
  std::string image;     // a file system image: `file` is a path inside it
  std::string fs_device; // a device whose namespace holds the file system: `file` is a path inside it
  std::string device;    // empty: the path plan_file_access chooses
  std::uint32_t nsid = 0;
  bool allow_holes = false;
  bool verify = false;
  std::size_t show_runs = 16;
};

#if defined(BAM_HAVE_LIBEXT2FS)
//! XXH3-128 of the file `path` of `img` as its file system reads it (what --verify compares with).
std::string fs_checksum(const bam::fs_image& img, const std::string& path) {
  bam::detail::xxh128_stream fs_read;
  img.read(path, [&](const unsigned char* p, std::size_t n) { fs_read.update(p, n); });
  return fs_read.hex();
}
#else
[[noreturn]] void needs_libext2fs(const std::string& option) {
  bam::tools::tool_fail(option + " needs libext2fs, and this bam was built without it (install libext2fs-dev "
                                 "comerr-dev and build bam again)",
                        ENOTSUP);
}
#endif

int cmd_map(const common_options& co, const map_args& a) {
  bam::extent_map_options mo;
  mo.allow_holes = a.allow_holes;
  std::string device = a.device, reason, path_kind;
  std::optional<bam::extent_map> map;
  std::string want_checksum;                           // of the file as its file system reads it (--verify)
  std::vector<std::unique_ptr<bam::controller>> fs_cs; // --fs-device's controller, kept for --verify
  if (!a.fs_device.empty()) {
#if defined(BAM_HAVE_LIBEXT2FS)
    fs_cs = open_device(a.fs_device, 0, 0);
    bam::controller& ctrl = single(fs_cs, a.fs_device);
    const std::uint32_t nsid = a.nsid != 0 ? a.nsid : 1;
    const bam::fs_image img(bam::fs_medium_of(ctrl, nsid));
    map = img.map(a.file, mo);
    device = a.fs_device;
    path_kind = "on_device";
    reason = "a file of the ext2/3/4 file system on namespace " + std::to_string(nsid) + " of " + a.fs_device +
             ", read with NVMe commands (no mount)";
    if (a.verify) want_checksum = fs_checksum(img, a.file);
#else
    needs_libext2fs("--fs-device");
#endif
  } else if (!a.image.empty()) {
#if defined(BAM_HAVE_LIBEXT2FS)
    const bam::fs_image img(a.image);
    map = img.map(a.file, mo);
    if (device.empty()) device = "emu:file=" + a.image + ",ro";
    path_kind = "image";
    reason = "a file of the ext2/3/4 file system in " + a.image + ", read through the image's blocks";
    if (a.verify) want_checksum = fs_checksum(img, a.file);
#else
    needs_libext2fs("--image");
#endif
  } else if (device.empty()) {
    bam::file_access fa = bam::plan_file_access(a.file, mo);
    device = fa.device;
    reason = fa.reason;
    path_kind = fa.kind == bam::file_access::path::direct ? "direct" : "via_file";
    map = std::move(fa.map);
  } else {
    map = bam::extent_map::of_file(a.file, mo);
    path_kind = "direct";
    reason = "reading raw blocks through " + device + " as asked";
  }
  json j{{"file", a.file}, {"path", path_kind}, {"device", device}, {"reason", reason}};
  if (map) {
    const auto& d = map->device();
    j["size"] = map->file_size();
    j["disk"] = d.disk_node;
    j["partition"] = d.partition;
    j["partition_start"] = d.partition_start;
    j["lba_size"] = d.lba_size;
    j["nsid"] = !a.fs_device.empty() ? (a.nsid != 0 ? a.nsid : 1u) : d.nsid;
    j["wwid"] = d.wwid;
    j["raw_extents"] = map->raw_extents();
    j["runs"] = map->runs();
    j["map_bytes"] = map->bytes();
    j["max_page_size"] = map->max_page_size(1u << 20);
    json runs = json::array();
    const auto x = map->extents();
    for (std::size_t i = 0; i < x.size() && i < a.show_runs; ++i)
      runs.push_back({{"file_offset", x[i].file_offset},
                      {"disk_offset", x[i].disk_offset == bam::extent_hole ? json(nullptr) : json(x[i].disk_offset)},
                      {"length", x[i].length}});
    j["first_runs"] = runs;
  }
  if (a.verify) {
    std::vector<std::unique_ptr<bam::controller>> opened;
    if (fs_cs.empty()) opened = open_device(device, 0, 0);
    bam::controller& ctrl = single(fs_cs.empty() ? opened : fs_cs, device);
    const bool in_fs = !a.image.empty() || !a.fs_device.empty(); // a path inside a file system bam reads itself
    const std::uint64_t size = map ? map->file_size() : std::filesystem::file_size(a.file);
    bam::detail::xxh128_stream through;
    std::vector<unsigned char> buf(std::min<std::uint64_t>(size, 4ull << 20));
    const double t0 = static_cast<double>(bam::detail::now_ns());
    if (!a.device.empty() || in_fs) {
      // A device given by hand is the disk's controller, read at the map's
      // LBAs: the disk's namespace id (sysfs) by default. An image is its namespace 1.
      const std::uint32_t nsid = a.nsid != 0 ? a.nsid : map->device().nsid != 0 ? map->device().nsid : 1;
      if (!in_fs) bam::check_same_namespace(ctrl, nsid, *map);
      for (std::uint64_t off = 0; off < size; off += buf.size()) {
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), size - off));
        bam::read_mapped(ctrl, nsid, *map, off, buf.data(), n);
        through.update(buf.data(), n);
      }
    } else {
      // emu:extents= or emu:file= over the file: namespace offsets are file offsets.
      const std::uint32_t lbs = ctrl.ns(1).lba_size;
      auto dma = ctrl.transport().alloc(buf.size() + lbs);
      for (std::uint64_t off = 0; off < size; off += buf.size()) {
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), size - off));
        ctrl.read(1, off / lbs, static_cast<std::uint32_t>((n + lbs - 1) / lbs), *dma);
        through.update(dma->data(), n);
      }
    }
    const double secs = (static_cast<double>(bam::detail::now_ns()) - t0) / 1e9;
    const std::string got = through.hex(), want = in_fs ? want_checksum : bam::file_checksum(a.file);
    j["verify"] = {{"checksum_through_device", got},
                   {"checksum_through_file_system", want},
                   {"equal", got == want},
                   {"seconds", secs}};
    if (got != want) {
      if (co.json) print_json(j);
      bam::tools::tool_fail("reading " + a.file + " through " + device + " gave " + got + ", the file system " + want);
    }
  }
  if (co.json) {
    print_json(j);
    return 0;
  }
  std::printf("%s: %s\n  %s\n", a.file.c_str(), path_kind.c_str(), reason.c_str());
  std::printf("  device string: %s\n", device.c_str());
  if (map) {
    const auto& d = map->device();
    std::printf(
        "  %llu bytes on %s%s, %u-byte blocks%s; %llu extents from the file system, %llu runs (%llu bytes of map)\n",
        static_cast<unsigned long long>(map->file_size()), d.disk_node.c_str(),
        d.partition.empty()
            ? ""
            : (" (partition " + d.partition + " at byte " + std::to_string(d.partition_start) + ")").c_str(),
        d.lba_size, d.nsid ? (", NVMe namespace " + std::to_string(d.nsid)).c_str() : "",
        static_cast<unsigned long long>(map->raw_extents()), static_cast<unsigned long long>(map->runs()),
        static_cast<unsigned long long>(map->bytes()));
    std::printf("  cache pages up to %s never straddle two runs\n",
                human_bytes(static_cast<double>(map->max_page_size(1u << 20))).c_str());
    const auto x = map->extents();
    for (std::size_t i = 0; i < x.size() && i < a.show_runs; ++i) {
      if (x[i].disk_offset == bam::extent_hole)
        std::printf("    file %12llu +%-10llu hole (zeroes)\n", static_cast<unsigned long long>(x[i].file_offset),
                    static_cast<unsigned long long>(x[i].length));
      else
        std::printf("    file %12llu +%-10llu disk byte %llu (LBA %llu)\n",
                    static_cast<unsigned long long>(x[i].file_offset), static_cast<unsigned long long>(x[i].length),
                    static_cast<unsigned long long>(x[i].disk_offset),
                    static_cast<unsigned long long>(x[i].disk_offset / d.lba_size));
    }
    if (x.size() > a.show_runs) std::printf("    ... %zu more\n", x.size() - a.show_runs);
  }
  if (a.verify)
    std::printf("  verified: %s through the device equals the file system's read (%.2f s)\n",
                j["verify"]["checksum_through_device"].get<std::string>().c_str(),
                j["verify"]["seconds"].get<double>());
  return 0;
}

// ---- help, usage errors ----------------------------------------------------------

std::string command_names(CLI::App& app) {
  std::string names;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    names += (names.empty() ? "" : ", ") + sub->get_name();
  return names;
}

//! A mistake in the command line: one line on standard error (and JSON with
//! --json), exit status 2.
int usage_error(const common_options& co, CLI::App& app, std::string message) {
  if (message.rfind("bam: ", 0) == 0) message.erase(0, 5);
  const auto given = app.get_subcommands();
  if (given.empty()) {
    const auto rest = app.remaining();
    if (rest.empty())
      message = "no command given (commands: " + command_names(app) + "; see bam --help)";
    else if (rest.front().rfind('-', 0) == 0)
      message = "unknown option '" + rest.front() + "' (see bam --help)";
    else
      message = "unknown command '" + rest.front() + "' (commands: " + command_names(app) + "; see bam --help)";
  } else if (message.find("(see ") == std::string::npos && message.back() != ')') {
    message += " (see bam " + given.front()->get_name() + " --help)";
  }
  std::fprintf(stderr, "bam: %s\n", message.c_str());
  if (co.json) print_json({{"error", "bam: " + message}, {"exit_status", exit_usage}});
  return exit_usage;
}

//! `bam help [TOPIC]`: the main help, a command's, or the device strings'.
int cmd_help(CLI::App& app, const std::string& topic) {
  if (topic.empty()) {
    std::cout << app.help();
    return exit_ok;
  }
  if (topic == "devices" || topic == "device") {
    std::printf("Device strings name what serves the NVMe queues and the media:\n"
                "  emu:...        software controller, CPU engine threads (host I/O and GPU programs)\n"
                "  emu-gpu:...    software controller served by GPU threads (GPU programs only)\n"
                "  /dev/bam-nvme0[+/dev/bam-nvme1...]   controllers bound to bam_nvme (bam bind)\n"
                "An emu string names one medium and any options, comma-separated:\n\n");
    std::size_t w = 0;
    for (const auto& o : bam::device_options)
      w = std::max(w, o.form.size());
    for (const auto& o : bam::device_options)
      std::printf("  %-*s  %-14s  %s\n  %-*s  %-14s  e.g. %s\n", static_cast<int>(w), std::string(o.form).c_str(),
                  std::string(o.applies).c_str(), std::string(o.meaning).c_str(), static_cast<int>(w), "", "",
                  std::string(o.example).c_str());
    std::printf("\nSIZE: bytes, or K, M, G, T (binary). RATE: K, M, G (decimal). TIME: ns, us, ms, s.\n");
    return exit_ok;
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    if (sub->get_name() == topic) {
      std::cout << sub->help(app.get_name());
      return exit_ok;
    }
  std::fprintf(stderr, "bam: no help on '%s' (topics: devices, %s)\n", topic.c_str(), command_names(app).c_str());
  return exit_usage;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"bam: NVMe controllers for GPU programs. Lists, binds and identifies controllers; loads data "
               "sets onto a device and reads them back.\nDEVICE is a device string: /dev/bam-nvme0, "
               "emu:file=/path/disk.img[,size=8G], emu:ram=64M (every option: bam help devices)",
               "bam"};
  app.require_subcommand(1);
  app.fallthrough();
  app.set_version_flag("--version", "bam " BAM_VERSION, "print the version and exit");
  common_options co;
  app.add_flag("--json", co.json, "machine-readable output (errors too)");
  app.add_flag("-q,--quiet", co.quiet, "no progress bar");
  app.add_option("--root", co.root, "system root holding sys/ and proc/ (for tests)")->group("");

  auto* list = app.add_subcommand("list", "NVMe controllers, the bam device nodes bound to them, owners, pinned pages");
  std::string pci;
  bool force = false;
  auto* bind = app.add_subcommand("bind", "hand an NVMe controller to the bam_nvme module (-> /dev/bam-nvmeN)");
  bind->add_option("pci", pci, "PCI address, e.g. 0000:01:00.0")->required();
  bind->add_flag("--force", force, "take it even if a namespace is mounted or held (data loss likely)");
  auto* unbind = app.add_subcommand("unbind", "give a controller back to the kernel's nvme driver");
  unbind->add_option("pci", pci, "PCI address")->required();
  unbind->add_flag("--force", force, "even while a process has the device open (its mappings are revoked)");

  std::string device;
  auto* identify = app.add_subcommand("identify", "controller and namespace identify data, queues and limits");
  identify->add_option("device", device, "device string")->required();
  auto* smart = app.add_subcommand("smart", "SMART / health information log");
  smart->add_option("device", device, "device string")->required();

  transfer_args ta;
  // Sizes are read by bam::parse_size once the command line is parsed: the
  // units and messages of device strings.
  struct size_arg {
    std::string name, text;
    std::uint64_t* target;
    CLI::Option* option = nullptr;
  };
  std::deque<size_arg> sizes; // stays in place: options write into `text`
  auto size_option = [&](CLI::App* sub, const std::string& name, std::uint64_t& v, const std::string& help) {
    size_arg& a = sizes.emplace_back(size_arg{name, {}, &v});
    a.option = sub->add_option(name, a.text, help + " (bytes, or K, M, G, T)")->type_name("SIZE");
    return a.option;
  };
  auto* load = app.add_subcommand("load", "write a file onto a device (resumable: run it again after an interruption)");
  load->add_option("file", ta.file, "source file")->required()->check(CLI::ExistingFile);
  load->add_option("device", ta.device, "device string")->required();
  size_option(load, "--offset", ta.offset, "byte offset on the namespace (a multiple of the LBA size)");
  load->add_option("--nsid", ta.nsid, "namespace")->check(CLI::Range(1u, 0xfffffffeu));
  size_option(load, "--chunk", ta.chunk, "bytes per command batch (default 1M)");
  load->add_option("--queues", ta.queues, "I/O queue pairs to use")->check(CLI::Range(1u, 1024u));
  load->add_flag("--verify", ta.verify, "read every chunk back and compare checksums");
  load->add_flag("--restart", ta.restart, "ignore the state of an interrupted load and start over");
  load->add_option("--state", ta.state, "state file (default: FILE.bam-load)");
  size_option(load, "--max-rate", ta.max_rate, "bytes per second at most (default: no limit)");
  auto* dump = app.add_subcommand(
      "dump", "read a byte range of a device into a file ('-': standard output; reports then go to standard error)");
  dump->add_option("device", ta.device, "device string")->required();
  dump->add_option("file", ta.file, "output file")->required();
  size_option(dump, "--length", ta.length, "bytes to read")->required();
  size_option(dump, "--offset", ta.offset, "byte offset on the namespace");
  dump->add_option("--nsid", ta.nsid, "namespace")->check(CLI::Range(1u, 0xfffffffeu));
  size_option(dump, "--chunk", ta.chunk, "bytes per command batch (default 1M)");
  dump->add_option("--queues", ta.queues, "I/O queue pairs to use")->check(CLI::Range(1u, 1024u));
  size_option(dump, "--max-rate", ta.max_rate, "bytes per second at most");
  std::string file;
  auto* checksum = app.add_subcommand("checksum", "XXH3-128 of a file, in the form load and dump print");
  checksum->add_option("file", file, "file")->required()->check(CLI::ExistingFile);
  map_args ma;
  auto* map = app.add_subcommand(
      "map", "where a file's blocks lie on its disk (FIEMAP), which path reads it, and --verify reads it that way");
  map->add_option("file", ma.file,
                  "file on a local file system (with --image or --fs-device: a path inside that file system)")
      ->required();
  map->add_option("--image", ma.image,
                  "an ext2/3/4 file system image (or block device) holding the file, read without mounting it")
      ->check(CLI::ExistingPath);
  map->add_option(
      "--fs-device", ma.fs_device,
      "the device whose namespace (--nsid, default 1) holds the ext2/3/4 file system, e.g. an SSD bound to bam's "
      "driver that the kernel cannot mount: read with NVMe commands");
  map->add_option("--device", ma.device,
                  "read the raw blocks through this device string (e.g. /dev/bam-nvme1, the file's namespace); "
                  "default: a read-only software controller over the file's disk, or over the file itself");
  map->add_option("--nsid", ma.nsid,
                  "namespace of --device or --fs-device holding the file system (default: the disk's namespace "
                  "id, else 1)")
      ->check(CLI::Range(1u, 0xfffffffeu));
  map->add_flag("--allow-holes", ma.allow_holes, "read holes and unwritten extents as zeroes instead of refusing");
  map->add_flag("--verify", ma.verify, "read the whole file through the device and compare its checksum");
  map->add_option("--runs", ma.show_runs, "runs to print (default 16)");
  std::string shm_action;
  std::vector<std::string> shm_names;
  auto* shm = app.add_subcommand("shm", "shared memory of shm=NAME device strings: list, or remove NAME...");
  shm->add_option("action", shm_action, "list | remove")->required()->check(CLI::IsMember({"list", "remove"}));
  shm->add_option("names", shm_names, "names to remove");
  std::string topic;
  auto* help = app.add_subcommand("help", "this help, a command's ('bam help load'), or device strings ('bam help "
                                          "devices')");
  help->add_option("topic", topic, "devices, or a command");
  app.footer(exit_status_help);

  // --json before the command applies to errors in the command line too.
  for (int i = 1; i < argc && std::string(argv[i]) != "--"; ++i)
    if (std::string(argv[i]) == "--json") co.json = true;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return exit_ok;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    return exit_ok;
  } catch (const CLI::CallForVersion& v) {
    if (co.json)
      print_json({{"version", BAM_VERSION}});
    else
      std::cout << v.what() << "\n";
    return exit_ok;
  } catch (const CLI::ParseError& e) {
    return usage_error(co, app, e.what());
  }

  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  // What the command line says, checked before anything is opened: a
  // mistake here is a usage error (exit status 2) and nothing is touched.
  try {
    for (const size_arg& a : sizes)
      if (a.option->count() != 0) *a.target = bam::parse_size(a.text, a.name);
    for (const std::string* d : {&device, &ta.device, &ma.device, &ma.fs_device})
      if (!d->empty()) bam::parse_device(*d);
    if (*bind || *unbind) pci = bam::tools::normalize_pci_address(pci);
    if (*map && ma.image.empty() && ma.fs_device.empty() && !std::filesystem::is_regular_file(ma.file))
      throw bam::error("map: " + ma.file +
                       ": no such file (a path inside an image needs --image IMAGE, one inside a file system on a "
                       "device --fs-device DEVICE)");
    if (*map && !ma.fs_device.empty() && (!ma.image.empty() || !ma.device.empty()))
      throw bam::error("map: --fs-device reads the file system and the file on one device: leave out --image "
                       "and --device");
  } catch (const bam::error& e) {
    return usage_error(co, app, e.what());
  }
  if (*dump && ta.file == "-") report = stderr; // the data owns standard output
  try {
    if (*help) return cmd_help(app, topic);
    if (*list) return cmd_list(co);
    const bam::tools::system_root root{co.root};
    if (*bind) return report_bind(co, bam::tools::bind_controller(root, pci, force), "bind");
    if (*unbind) return report_bind(co, bam::tools::unbind_controller(root, pci, force), "unbind");
    if (*identify) return cmd_identify(co, device);
    if (*smart) return cmd_smart(co, device);
    if (*load) return cmd_load(co, ta);
    if (*dump) return cmd_dump(co, ta);
    if (*checksum) return cmd_checksum(co, file);
    if (*shm) return cmd_shm(co, shm_action, shm_names);
    if (*map) return cmd_map(co, ma);
  } catch (const bam::error& e) {
    const int status = e.errnum() == EINTR ? exit_interrupted : exit_failure;
    std::fprintf(stderr, "%s\n", e.what());
    if (co.json) print_json({{"error", e.what()}, {"errno", e.errnum()}, {"exit_status", status}});
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bam: %s\n", e.what());
    if (co.json) print_json({{"error", std::string("bam: ") + e.what()}, {"exit_status", exit_failure}});
    return exit_failure;
  }
  return exit_ok;
}
