// SPDX-License-Identifier: MIT
// The bam command as a user runs it: identify, smart, load and dump on
// software controllers (emu: device strings), a load killed with SIGKILL and
// resumed, Ctrl-C, and list/bind/unbind over a made-up sysfs tree (the real
// ones run in the QEMU guest).
#include <bam/host/dataset.hpp>
#include <bam/transport/device_string.hpp>

#include <catch2/catch_test_macros.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct temp_dir {
  fs::path path;
  temp_dir() {
    char tmpl[] = "/tmp/bam-cli-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~temp_dir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

struct run_result {
  int status = -1; //!< exit code, or 128 + signal
  std::string out, err;
};

//! Start the bam command with `args`; stdout and stderr go to files in `dir`.
pid_t spawn(const std::vector<std::string>& args, const std::string& out, const std::string& err) {
  std::vector<std::string> all{BAM_TOOL_PATH};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  REQUIRE(posix_spawn(&pid, BAM_TOOL_PATH, &fa, nullptr, argv.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

int wait_exit(pid_t pid) {
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

run_result run_bam(const temp_dir& d, const std::vector<std::string>& args) {
  const std::string out = d / ".out", err = d / ".err";
  run_result r;
  r.status = wait_exit(spawn(args, out, err));
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

json bam_json(const temp_dir& d, const std::vector<std::string>& args) {
  auto all = args;
  all.insert(all.begin(), "--json");
  const run_result r = run_bam(d, all);
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  return json::parse(r.out);
}

void random_file(const std::string& p, std::size_t n, std::uint64_t seed) {
  std::vector<unsigned char> v(n);
  std::mt19937_64 rng(seed);
  for (auto& b : v)
    b = static_cast<unsigned char>(rng());
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(n));
}

std::size_t recorded_chunks(const std::string& state) {
  std::ifstream f(state);
  std::string line;
  std::size_t n = 0;
  while (std::getline(f, line))
    n += line.rfind("done ", 0) == 0;
  return n;
}

} // namespace

TEST_CASE("bam identify and smart on a software controller, text and JSON", "[cli]") {
  temp_dir d;
  const json id = bam_json(d, {"identify", "emu:ram=16M,lba=4096,queues=3"});
  REQUIRE(id["controllers"].size() == 1);
  const json& c = id["controllers"][0];
  CHECK(c["model"] == "bam software NVMe controller");
  CHECK(c["io_queues"] == 3);
  CHECK(c["namespaces"].size() == 1);
  CHECK(c["namespaces"][0]["lba_size"] == 4096);
  CHECK(c["namespaces"][0]["blocks"] == 4096);
  CHECK(c["max_transfer_bytes"] == 128 * 1024);

  const run_result text = run_bam(d, {"identify", "emu:ram=16M,ssds=2"});
  CHECK(text.status == 0);
  CHECK(text.out.find("controller   emu0") != std::string::npos);
  CHECK(text.out.find("controller   emu1") != std::string::npos);
  CHECK(text.out.find("nsid 1     32768 blocks of 512 B = 16.0 MiB") != std::string::npos);

  const json smart = bam_json(d, {"smart", "emu:ram=16M"});
  CHECK(smart["controllers"][0]["available_spare_percent"] == 100);
  CHECK(smart["controllers"][0]["temperature_celsius"] == 40);
  CHECK(smart["controllers"][0]["media_errors"] == "0");
}

TEST_CASE("bam reports bad device strings and bad arguments clearly", "[cli]") {
  temp_dir d;
  run_result r = run_bam(d, {"identify", "emu:ram=12Q"});
  CHECK(r.status == 2);
  CHECK(r.err.find("unknown size unit 'Q' in ram=12Q") != std::string::npos);
  r = run_bam(d, {"identify", "/dev/bam-nvme97"});
  CHECK(r.status == 1);
  CHECK(r.err.find("bind-nvme") != std::string::npos); // says how to get the device
  random_file(d / "src", 4096, 1);
  r = run_bam(d, {"load", d / "src", "emu:ram=1M", "--offset", "100"});
  CHECK(r.status == 1);
  CHECK(r.err.find("not a multiple of the LBA size") != std::string::npos);
  r = run_bam(d, {"load", d / "src", "emu:ram=1M,ssds=2"});
  CHECK(r.status == 1);
  CHECK(r.err.find("one controller at a time") != std::string::npos);
  r = run_bam(d, {"--json", "dump", "emu:ram=1M", d / "out", "--length", "2M"});
  CHECK(r.status == 1);
  CHECK(json::parse(r.out)["error"].get<std::string>().find("do not fit") != std::string::npos);
  r = run_bam(d, {"bind", "not-an-address"});
  CHECK(r.status == 2);
  CHECK(r.err.find("is not a PCI address") != std::string::npos);
}

TEST_CASE("bam load and dump: checksums agree with the file and with each other", "[cli]") {
  temp_dir d;
  random_file(d / "src", 5 * 1000 * 1000 + 7, 2); // not a multiple of anything
  const std::string dev = "emu:file=" + d / "disk.img" + ",size=32M";
  const json load = bam_json(d, {"load", d / "src", dev, "--offset", "64K", "--chunk", "256K", "--verify"});
  CHECK(load["bytes"] == 5000007);
  CHECK(load["resumed_chunks"] == 0);
  CHECK(load["verified_chunks"] == load["chunks"]);
  CHECK(load["checksum"] == bam::file_checksum(d / "src"));
  // Another process, the same media file.
  const json dump =
      bam_json(d, {"dump", "emu:file=" + d / "disk.img", d / "back", "--offset", "64K", "--length", "5000007"});
  CHECK(dump["checksum"] == load["checksum"]);
  CHECK(slurp(d / "back") == slurp(d / "src"));
  CHECK(run_bam(d, {"checksum", d / "back"}).out.find(load["checksum"].get<std::string>()) == 0);
}

TEST_CASE("bam load killed with SIGKILL resumes and completes", "[cli][resume]") {
  temp_dir d;
  random_file(d / "src", 8 << 20, 3);
  const std::string dev = "emu:file=" + d / "disk.img" + ",size=16M";
  // 8 MiB at 1 MiB/s: progress is recorded once a second, so the kill lands
  // with 8 to 56 of the 64 chunks recorded, even on a loaded machine.
  const pid_t pid =
      spawn({"--quiet", "load", d / "src", dev, "--chunk", "128K", "--max-rate", "1M"}, d / "o1", d / "e1");
  const std::string state = d / "src.bam-load";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (recorded_chunks(state) < 8 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ::kill(pid, SIGKILL);
  CHECK(wait_exit(pid) == 128 + SIGKILL);
  const std::size_t before = recorded_chunks(state);
  INFO("chunks recorded before the kill: " << before);
  REQUIRE(before >= 8);
  REQUIRE(before < 64);

  const json again = bam_json(d, {"load", d / "src", dev, "--chunk", "128K", "--verify"});
  CHECK(again["resumed_chunks"] == before);
  CHECK(again["verified_chunks"].get<std::size_t>() == 64 - before);
  CHECK(again["checksum"] == bam::file_checksum(d / "src"));
  CHECK_FALSE(fs::exists(state));
  const json dump = bam_json(d, {"dump", "emu:file=" + d / "disk.img", d / "back", "--length", "8M"});
  CHECK(dump["checksum"] == again["checksum"]);
}

TEST_CASE("bam load stopped with Ctrl-C records its progress and says how to resume", "[cli][resume]") {
  temp_dir d;
  random_file(d / "src", 4 << 20, 4);
  const std::string dev = "emu:file=" + d / "disk.img" + ",size=8M";
  const pid_t pid = spawn({"load", d / "src", dev, "--chunk", "64K", "--max-rate", "2M"}, d / "o1", d / "e1");
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  ::kill(pid, SIGINT);
  CHECK(wait_exit(pid) == 130);
  CHECK(slurp(d / "e1").find("run it again to resume") != std::string::npos);
  const std::size_t before = recorded_chunks(d / "src.bam-load");
  CHECK(before > 0);
  const json again = bam_json(d, {"load", d / "src", dev, "--chunk", "64K"});
  CHECK(again["resumed_chunks"] == before);
  CHECK(again["checksum"] == bam::file_checksum(d / "src"));
}

namespace {

//! A sysfs/proc tree with one NVMe controller at 0000:01:00.0 and a
//! controller of another class at 0000:02:00.0.
struct fake_system {
  temp_dir d;
  fs::path root = d.path;
  fs::path dev = root / "sys/bus/pci/devices/0000:01:00.0";
  fake_system() {
    fs::create_directories(dev / "nvme/nvme0/nvme0n1");
    fs::create_directories(root / "sys/bus/pci/drivers/nvme");
    fs::create_directories(root / "sys/block/nvme0n1/holders");
    fs::create_directories(root / "proc");
    put(dev / "class", "0x010802\n");
    put(dev / "vendor", "0x1b36\n");
    put(dev / "device", "0x0010\n");
    put(dev / "driver_override", "(null)\n");
    put(root / "sys/bus/pci/drivers/nvme/unbind", "");
    put(root / "sys/bus/pci/drivers_probe", "");
    fs::create_directory_symlink("../../drivers/nvme", dev / "driver");
    fs::create_directories(root / "sys/bus/pci/devices/0000:02:00.0");
    put(root / "sys/bus/pci/devices/0000:02:00.0/class", "0x020000\n");
    put(root / "proc/mounts", "proc /proc proc rw 0 0\n");
    put(root / "proc/swaps", "Filename Type Size Used Priority\n");
  }
  static void put(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }
  //! What the kernel would do once bam_nvme probes the device.
  void become_bam(std::int64_t owner) {
    fs::remove(dev / "driver");
    fs::create_directories(root / "sys/bus/pci/drivers/bam_nvme");
    put(root / "sys/bus/pci/drivers/bam_nvme/unbind", "");
    fs::create_directory_symlink("../../drivers/bam_nvme", dev / "driver");
    fs::remove_all(dev / "nvme");
    fs::create_directories(dev / "bam-nvme/bam-nvme0");
    put(dev / "bam-nvme/bam-nvme0/owner_pid", std::to_string(owner) + "\n");
    put(dev / "bam-nvme/bam-nvme0/pinned_pages", "64\n");
    put(dev / "bam-nvme/bam-nvme0/mappings", "3\n");
    fs::create_directories(root / "sys/class/bam-nvme");
    put(root / "sys/class/bam-nvme/pinned_pages", "64\n");
    put(root / "sys/class/bam-nvme/mappings", "3\n");
    fs::create_directories(root / "proc/4242");
    put(root / "proc/4242/comm", "trainer\n");
  }
  std::vector<std::string> args(std::vector<std::string> a) const {
    a.insert(a.begin(), {"--root", root.string()});
    return a;
  }
};

} // namespace

TEST_CASE("bam list shows NVMe controllers, bam device nodes, owners and pins", "[cli][sysfs]") {
  fake_system s;
  json l = bam_json(s.d, s.args({"list"}));
  CHECK(l["module_loaded"] == false);
  REQUIRE(l["controllers"].size() == 1);
  CHECK(l["controllers"][0]["pci"] == "0000:01:00.0");
  CHECK(l["controllers"][0]["driver"] == "nvme");
  CHECK(l["controllers"][0]["namespaces"] == json::array({"nvme0n1"}));
  s.become_bam(4242);
  l = bam_json(s.d, s.args({"list"}));
  CHECK(l["module_loaded"] == true);
  CHECK(l["pinned_pages"] == 64);
  const json& n = l["controllers"][0]["bam_devices"][0];
  CHECK(n["node"] == "/dev/bam-nvme0");
  CHECK(n["owner_pid"] == 4242);
  CHECK(n["owner"] == "trainer");
  CHECK(n["pinned_pages"] == 64);
  CHECK(n["mappings"] == 3);
  const run_result text = run_bam(s.d, s.args({"list"}));
  CHECK(text.out.find("/dev/bam-nvme0  4242 (trainer)") != std::string::npos);
}

TEST_CASE("bam bind refuses what bind-nvme refuses and writes what it writes", "[cli][sysfs]") {
  fake_system s;
  run_result r = run_bam(s.d, s.args({"bind", "02:00.0"}));
  CHECK(r.status == 1);
  CHECK(r.err.find("0000:02:00.0 is not an NVMe controller (class 0x020000)") != std::string::npos);
  r = run_bam(s.d, s.args({"bind", "0000:07:00.0"}));
  CHECK(r.err.find("no PCI device 0000:07:00.0") != std::string::npos);

  fake_system::put(s.root / "proc/mounts", "/dev/nvme0n1 /data ext4 rw 0 0\n");
  fs::create_directories(s.root / "sys/block/nvme0n1/holders/dm-0");
  r = run_bam(s.d, s.args({"bind", "01:00.0"}));
  CHECK(r.status == 1);
  CHECK(r.err.find("refusing: 0000:01:00.0 is in use: /dev/nvme0n1(held by dm-0) /dev/nvme0n1(mounted)") !=
        std::string::npos);
  // Nothing was touched.
  CHECK(slurp((s.dev / "driver_override").string()) == "(null)\n");

  // With --force it goes on; without the module it stops and says what to load.
  r = run_bam(s.d, s.args({"bind", "01:00.0", "--force"}));
  CHECK(r.status == 1);
  CHECK(r.err.find("the bam_nvme module is not loaded") != std::string::npos);
  fs::create_directories(s.root / "sys/bus/pci/drivers/bam_nvme");
  r = run_bam(s.d, s.args({"bind", "01:00.0", "--force"}));
  // The made-up kernel never binds: the command reports exactly that, after
  // having done what binding takes.
  CHECK(r.status == 1);
  CHECK(r.err.find("bam_nvme did not bind 0000:01:00.0 (driver now: nvme)") != std::string::npos);
  CHECK(slurp((s.dev / "driver_override").string()) == "bam_nvme");
  CHECK(slurp((s.root / "sys/bus/pci/drivers/nvme/unbind").string()) == "0000:01:00.0");
  CHECK(slurp((s.root / "sys/bus/pci/drivers_probe").string()) == "0000:01:00.0");

  s.become_bam(0);
  const json again = bam_json(s.d, s.args({"bind", "0000:01:00.0"}));
  CHECK(again["changed"] == false);
  CHECK(again["node"] == "/dev/bam-nvme0");
}

TEST_CASE("bam unbind refuses while a process holds the device, --force goes on", "[cli][sysfs]") {
  fake_system s;
  s.become_bam(4242);
  run_result r = run_bam(s.d, s.args({"unbind", "01:00.0"}));
  CHECK(r.status == 1);
  CHECK(r.err.find("refusing: pid 4242 (trainer) has /dev/bam-nvme0 open") != std::string::npos);
  CHECK(slurp((s.root / "sys/bus/pci/drivers/bam_nvme/unbind").string()).empty());
  r = run_bam(s.d, s.args({"unbind", "01:00.0", "--force"}));
  CHECK(r.status == 1); // the made-up kernel gives it to no driver
  CHECK(r.err.find("the nvme driver did not take 0000:01:00.0") != std::string::npos);
  CHECK(slurp((s.root / "sys/bus/pci/drivers/bam_nvme/unbind").string()) == "0000:01:00.0");
  CHECK(slurp((s.dev / "driver_override").string()) == "\n");
}

TEST_CASE("bam map says which path reads a file, and --verify reads it that way", "[cli][map]") {
  temp_dir d;
  random_file(d / "data", 300000 + 11, 5);
  json j = bam_json(d, {"map", d / "data", "--verify"});
  CHECK((j["path"] == "direct" || j["path"] == "via_file"));
  CHECK(j["verify"]["equal"] == true);
  CHECK(j["verify"]["checksum_through_device"] == bam::file_checksum(d / "data"));
  if (j.contains("disk")) { // the file system reported the file's blocks
    CHECK(j["size"] == 300011);
    CHECK(j["runs"].get<int>() >= 1);
    CHECK(j["first_runs"][0]["file_offset"] == 0);
  }
  if (j["path"] == "direct")
    CHECK(j["device"] == "emu:extents=" + d / "data");
  else
    CHECK(j["device"] == "emu:file=" + d / "data" + ",ro");
  // A file on tmpfs: no blocks to map; the file itself is read.
  if (fs::is_directory("/dev/shm")) {
    const std::string shm = "/dev/shm/bam-cli-map-" + std::to_string(::getpid());
    random_file(shm, 70000, 6);
    j = bam_json(d, {"map", shm, "--verify"});
    fs::remove(shm);
    CHECK(j["path"] == "via_file");
    CHECK(j["verify"]["equal"] == true);
  }
  // A sparse file is refused unless holes may read as zeroes.
  {
    std::ofstream f(d / "sparse", std::ios::binary);
    f.seekp(1 << 20);
    f.put('x');
  }
  run_result r = run_bam(d, {"map", d / "sparse"});
  if (r.status == 1) { // its file system reports blocks (else there is nothing to refuse)
    CHECK(r.err.find("a hole of") != std::string::npos);
    CHECK(r.err.find("allow holes") != std::string::npos);
    j = bam_json(d, {"map", d / "sparse", "--allow-holes", "--verify"});
    CHECK(j["verify"]["equal"] == true);
  }
}

#if defined(BAM_HAVE_LIBEXT2FS)
namespace {
//! A directory holding tree/sub/features.bin (random bytes) and disk.img, a 4 MiB ext4 image of tree/.
struct ext4_tree {
  temp_dir d;
  fs::path feats = d.path / "tree" / "sub" / "features.bin";
  std::string image = d / "disk.img";
  bool made = false; //!< false where mkfs.ext4 is missing
  ext4_tree(std::size_t bytes, std::uint64_t seed) {
    fs::create_directories(feats.parent_path());
    random_file(feats.string(), bytes, seed);
    const std::string mkfs = "PATH=/usr/sbin:/sbin:$PATH mkfs.ext4 -q -F -b 1024 -O ^has_journal -d " + (d / "tree") +
                             " " + image + " 4M > /dev/null 2>&1";
    made = std::system(mkfs.c_str()) == 0;
  }
};
} // namespace
#endif

TEST_CASE("bam map --image maps and verifies a file inside an ext4 image, without mounting it", "[cli][map]") {
#if !defined(BAM_HAVE_LIBEXT2FS)
  SKIP("bam was built without libext2fs");
#else
  const ext4_tree t(123457, 8);
  if (!t.made) SKIP("mkfs.ext4 is not here");
  const temp_dir& d = t.d;
  const fs::path& feats = t.feats;
  const std::string& image = t.image;
  json j = bam_json(d, {"map", "--image", image, "/sub/features.bin", "--verify"});
  CHECK(j["path"] == "image");
  CHECK(j["device"] == "emu:file=" + image + ",ro");
  CHECK(j["size"] == 123457);
  CHECK(j["runs"].get<int>() >= 1);
  CHECK(j["first_runs"][0]["disk_offset"].get<std::uint64_t>() > 0);
  CHECK(j["verify"]["equal"] == true);
  CHECK(j["verify"]["checksum_through_device"] == bam::file_checksum(feats.string()));
  run_result r = run_bam(d, {"map", "--image", image, "/sub/missing.bin"});
  CHECK(r.status == 1);
  CHECK(r.err.find("no such file in the file system") != std::string::npos);
  r = run_bam(d, {"map", "/sub/features.bin"}); // a path inside an image without --image
  CHECK(r.status == 2);
  CHECK(r.err.find("needs --image") != std::string::npos);
#endif
}

TEST_CASE("bam map --fs-device maps and verifies a file of the file system on a device's namespace", "[cli][map]") {
#if !defined(BAM_HAVE_LIBEXT2FS)
  SKIP("bam was built without libext2fs");
#else
  // An SSD bound to bam's driver cannot be mounted: bam reads its file system with NVMe commands.
  // Here the namespace is a software controller over the image file.
  const ext4_tree t(200001, 9);
  if (!t.made) SKIP("mkfs.ext4 is not here");
  const temp_dir& d = t.d;
  const fs::path& feats = t.feats;
  const std::string& image = t.image;
  const std::string dev = "emu:file=" + image;
  json j = bam_json(d, {"map", "/sub/features.bin", "--fs-device", dev, "--verify"});
  CHECK(j["path"] == "on_device");
  CHECK(j["device"] == dev);
  CHECK(j["nsid"] == 1);
  CHECK(j["size"] == 200001);
  CHECK(j["verify"]["equal"] == true);
  CHECK(j["verify"]["checksum_through_device"] == bam::file_checksum(feats.string()));
  // The same runs as the image read as a file.
  const json by_image = bam_json(d, {"map", "--image", image, "/sub/features.bin"});
  CHECK(j["runs"] == by_image["runs"]);
  CHECK(j["first_runs"] == by_image["first_runs"]);
  run_result r = run_bam(d, {"map", "/sub/missing.bin", "--fs-device", dev});
  CHECK(r.status == 1);
  CHECK(r.err.find("no such file in the file system") != std::string::npos);
  r = run_bam(d, {"map", "/sub/features.bin", "--fs-device", "emu:ram=4M"});
  CHECK(r.status == 1);
  CHECK(r.err.find("ext2/3/4 file system") != std::string::npos);
  CHECK(r.err.find("Bad magic number in super-block") != std::string::npos); // libext2fs's words, not a code
  r = run_bam(d, {"map", "/sub/features.bin", "--fs-device", dev, "--image", image});
  CHECK(r.status == 2);
  CHECK(r.err.find("leave out --image") != std::string::npos);
#endif
}

namespace {

std::size_t count_lines(const std::string& s) { return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n')); }

} // namespace

TEST_CASE("bam refuses negative sizes and takes the device string's size units", "[cli][sizes]") {
  temp_dir d;
  random_file(d / "src", 4096, 7);
  run_result r = run_bam(d, {"load", d / "src", "emu:ram=64M", "--offset", "-1"});
  CHECK(r.status == 2);
  CHECK(r.err == "bam: --offset -1 is negative (a size counts up from 0, e.g. --offset 64M)\n");
  CHECK(r.out.empty());
  r = run_bam(d, {"dump", "emu:ram=64M", d / "out", "--length", "512", "--offset", "-1"});
  CHECK(r.status == 2);
  CHECK(r.err.find("--offset -1 is negative") != std::string::npos);
  CHECK(r.err.find("18446744073709551615") == std::string::npos);
  CHECK_FALSE(fs::exists(d / "out")); // refused before anything was opened
  r = run_bam(d, {"dump", "emu:ram=64M", d / "out", "--length", "-512"});
  CHECK(r.status == 2);
  CHECK(r.err.find("--length -512 is negative") != std::string::npos);

  // The units of --offset are those of device strings, with the same words.
  r = run_bam(d, {"load", d / "src", "emu:ram=64M", "--offset", "1P"});
  CHECK(r.status == 2);
  CHECK(r.err == "bam: unknown size unit 'P' in --offset 1P (use K, M, G or T, e.g. --offset 1G)\n");
  const run_result dev = run_bam(d, {"identify", "emu:ram=1P"});
  CHECK(dev.status == 2);
  CHECK(dev.err.find("unknown size unit 'P' in ram=1P (use K, M, G or T, e.g. emu:ram=1G)") != std::string::npos);
  for (const char* v : {"4096", "4K", "4k", "4KiB", "4KB"}) {
    const json j = bam_json(d, {"load", d / "src", "emu:ram=64M", "--offset", v});
    CHECK(j["offset"] == bam::parse_size(v));
    CHECK(j["offset"] == bam::parse_device(std::string("emu:file=x,size=") + v).bytes);
  }
  const json j = bam_json(d, {"dump", "emu:ram=64M", d / "out", "--length", "1K", "--chunk", "512"});
  CHECK(j["bytes"] == 1024);
}

TEST_CASE("bam dump to standard output: the data alone there, reports on standard error", "[cli][stdout]") {
  temp_dir d;
  run_result r = run_bam(d, {"--json", "dump", "emu:ram=64M", "-", "--length", "512"});
  CHECK(r.status == 0);
  CHECK(r.out == std::string(512, '\0'));
  const json report = json::parse(r.err);
  CHECK(report["bytes"] == 512);
  CHECK(report["file"] == "-");
  r = run_bam(d, {"dump", "emu:ram=64M", "-", "--length", "1024"});
  CHECK(r.status == 0);
  CHECK(r.out == std::string(1024, '\0'));
  CHECK(r.err.rfind("checksum xxh128:", 0) == 0);
  // An error while the data owns standard output goes to standard error too.
  r = run_bam(d, {"--json", "dump", "emu:ram=1M", "-", "--length", "2M"});
  CHECK(r.status == 1);
  CHECK(r.out.empty());
  CHECK(r.err.find("\"error\"") != std::string::npos);
  CHECK(r.err.find("do not fit") != std::string::npos);
}

TEST_CASE("bam exit status: 0 done, 1 failed, 2 a wrong command line; --version; JSON errors", "[cli][usage]") {
  temp_dir d;
  run_result r = run_bam(d, {"frobnicate"});
  CHECK(r.status == 2);
  CHECK(r.err.find("bam: unknown command 'frobnicate' (commands: list, bind, unbind, identify, smart, load, dump, "
                   "checksum, map, shm, help; see bam --help)") == 0);
  CHECK(count_lines(r.err) == 1);
  r = run_bam(d, {});
  CHECK(r.status == 2);
  CHECK(r.err.find("no command given") != std::string::npos);
  r = run_bam(d, {"--frobnicate"});
  CHECK(r.status == 2);
  CHECK(r.err.find("unknown option '--frobnicate'") != std::string::npos);
  r = run_bam(d, {"identify"});
  CHECK(r.status == 2);
  CHECK(r.err == "bam: device is required (see bam identify --help)\n");
  r = run_bam(d, {"load", "/nonexistent/file", "emu:ram=1M"});
  CHECK(r.status == 2);
  r = run_bam(d, {"dump", "emu:ram=1M", d / "out", "--length", "512", "--queues", "0"});
  CHECK(r.status == 2);
  r = run_bam(d, {"dump", "emu:ram=1M", d / "out", "--length", "2M"}); // the device refuses: not a usage error
  CHECK(r.status == 1);

  // With --json, mistakes in the command line are JSON too.
  r = run_bam(d, {"--json", "frobnicate"});
  CHECK(r.status == 2);
  json j = json::parse(r.out);
  CHECK(j["exit_status"] == 2);
  CHECK(j["error"].get<std::string>().find("unknown command 'frobnicate'") != std::string::npos);
  r = run_bam(d, {"--json", "identify", "emu:ram=12Q"});
  CHECK(r.status == 2);
  j = json::parse(r.out);
  CHECK(j["error"].get<std::string>().find("unknown size unit 'Q'") != std::string::npos);
  r = run_bam(d, {"--json", "load", d / "nothing", "emu:ram=1M"});
  CHECK(r.status == 2);
  CHECK(json::parse(r.out)["exit_status"] == 2);

  r = run_bam(d, {"--version"});
  CHECK(r.status == 0);
  CHECK(r.out.rfind("bam ", 0) == 0);
  CHECK(std::isdigit(static_cast<unsigned char>(r.out.at(4))));
  CHECK(json::parse(run_bam(d, {"--json", "--version"}).out)["version"] == r.out.substr(4, r.out.size() - 5));

  // The help says all of it.
  r = run_bam(d, {"--help"});
  CHECK(r.status == 0);
  for (const char* part : {"Exit status:", "  0    done", "  1    failed", "  2    the command line is wrong",
                           "  130  interrupted", "bam help devices", "--version"})
    CHECK(r.out.find(part) != std::string::npos);
  r = run_bam(d, {"help", "load"});
  CHECK(r.status == 0);
  CHECK(r.out.find("Usage: bam load") != std::string::npos);
}

TEST_CASE("bam's errors are one line: what is wrong and what to write instead", "[cli][usage]") {
  temp_dir d;
  run_result r = run_bam(d, {"identify", "emu:ram=12Q"});
  CHECK(r.err ==
        "bam: device string 'emu:ram=12Q': unknown size unit 'Q' in ram=12Q (use K, M, G or T, e.g. emu:ram=12G)\n");
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"identify", "tcp:foo"},
                                             {"identify", "emu:ram=64M,frobnicate=3"},
                                             {"smart", "emu:ram=1000"},
                                             {"identify", "emu:hbm=1G"},
                                             {"identify", "emu:ram=64M,queues=0"},
                                             {"bind", "zz"}}) {
    r = run_bam(d, args);
    INFO(args[1] << ": " << r.err);
    CHECK(r.status == 2);
    CHECK(count_lines(r.err) == 1);
    CHECK(r.err.find("errno") == std::string::npos);
    CHECK(r.err.find("emu-gpu:ram=16G,ssds=4 |") == std::string::npos); // no list of examples
    CHECK(r.err.find(" (") != std::string::npos);                       // says what to write instead
  }
  // A file that is not there: how to create it.
  r = run_bam(d, {"identify", "emu:file=" + d / "new.img"});
  CHECK(r.status == 1);
  CHECK(r.err == "bam: emu:file=" + d / "new.img" + ": no such file " + d / "new.img" +
                     "; add size=... to create it (e.g. emu:file=" + d / "new.img" + ",size=1G)\n");
  CHECK(run_bam(d, {"identify", "emu:file=" + d / "new.img" + ",size=1M"}).status == 0);
  // An offset the namespace cannot take.
  random_file(d / "src", 4096, 8);
  r = run_bam(d, {"load", d / "src", "emu:ram=1M", "--offset", "100"});
  CHECK(r.status == 1);
  CHECK(r.err == "bam: offset 100 is not a multiple of the LBA size (512 bytes) of namespace 1 (e.g. 0 or 512): "
                 "controller emu0\n");
}

TEST_CASE("bam help devices and docs/transports.md list every device-string option", "[cli][help]") {
  temp_dir d;
  const run_result r = run_bam(d, {"help", "devices"});
  CHECK(r.status == 0);
  std::ifstream f(std::string(BAM_SOURCE_DIR) + "/docs/transports.md");
  REQUIRE(f);
  const std::string docs{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  for (const auto& o : bam::device_options) {
    const std::string form(o.form), example(o.example);
    INFO(form);
    CHECK(r.out.find("  " + form + " ") != std::string::npos);
    CHECK(r.out.find("e.g. " + example + "\n") != std::string::npos);
    CHECK(docs.find("| `" + form + "` |") != std::string::npos);
  }
  for (const char* units : {"SIZE: bytes, or K, M, G, T", "RATE: K, M, G", "TIME: ns, us, ms, s"})
    CHECK(r.out.find(units) != std::string::npos);
}

TEST_CASE("bam load warns when the device keeps nothing after the command", "[cli][load]") {
  temp_dir d;
  random_file(d / "src", 4096, 9);
  run_result r = run_bam(d, {"load", d / "src", "emu:ram=1M"});
  CHECK(r.status == 0);
  CHECK(r.err.find("bam load: warning: emu:ram=1M keeps its data in this process's memory, which is gone when bam "
                   "exits") != std::string::npos);
  r = run_bam(d, {"--quiet", "--json", "load", d / "src", "emu:ram=1M"});
  CHECK(r.err.find("warning") != std::string::npos); // a warning, not progress: --quiet keeps it
  CHECK(json::parse(r.out)["bytes"] == 4096);
  r = run_bam(d, {"load", d / "src", "emu:file=" + d / "disk.img" + ",size=1M"});
  CHECK(r.status == 0);
  CHECK(r.err.find("warning") == std::string::npos);
}

TEST_CASE("bam load onto shared memory keeps the data for the next process; shm list and remove", "[cli][shm]") {
  temp_dir d;
  const std::string name = "cli-" + std::to_string(::getpid());
  random_file(d / "src", 64 * 1024, 5);
  const json loaded = bam_json(d, {"load", d / "src", "emu:shm=" + name + ",size=1M"});
  // Another process (this bam) reads what the first one wrote.
  run_result r = run_bam(d, {"dump", "emu:shm=" + name, d / "back", "--length", "64K"});
  INFO("stderr: " << r.err);
  CHECK(r.status == 0);
  CHECK(loaded["checksum"] == bam::file_checksum(d / "src"));
  CHECK(bam::file_checksum(d / "back") == loaded["checksum"].get<std::string>());
  const json listed = bam_json(d, {"shm", "list"});
  const auto& all = listed["shared_memory"];
  const auto it = std::find_if(all.begin(), all.end(), [&](const json& j) { return j["name"] == name; });
  REQUIRE(it != all.end());
  CHECK((*it)["bytes"] == 1u << 20);
  CHECK((*it)["mode"] == 0600);
  CHECK(run_bam(d, {"shm", "remove", name}).status == 0);
  r = run_bam(d, {"shm", "remove", name});
  CHECK(r.status == 1);
  CHECK(r.err.find("no shared memory") != std::string::npos);
  r = run_bam(d, {"identify", "emu:shm=" + name});
  CHECK(r.status == 1);
  CHECK(r.err.find("give size=") != std::string::npos);
}
