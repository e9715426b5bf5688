// SPDX-License-Identifier: MIT
// Guest helper of the QEMU test's SR-IOV scenario: gives the first secondary
// controller (virtual function) of an NVMe primary controller the flexible
// resources it needs, and brings it online, through the kernel nvme driver's
// admin pass-through (/dev/nvmeN of the physical function). What the NVMe
// spec calls Virtualization Management (opcode 1Ch) and the Secondary
// Controller List (Identify CNS 15h).
//
//   nvme_vf_setup assign /dev/nvme0   2 queues (admin + 1 I/O) and 1 interrupt
//   nvme_vf_setup online /dev/nvme0   after sriov_numvfs made the function
//
// Prints one line per step; exits 1 with the reason when a step fails.
#include <linux/nvme_ioctl.h>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr std::uint8_t op_identify = 0x06;
constexpr std::uint8_t op_virt_mgmt = 0x1c;
constexpr std::uint32_t cns_secondary_list = 0x15;
constexpr std::uint32_t act_assign = 0x8;
constexpr std::uint32_t act_online = 0x9;
constexpr std::uint32_t rt_queues = 0;
constexpr std::uint32_t rt_interrupts = 1;

//! One entry of the Secondary Controller List (32 bytes each, after a 32-byte header).
struct secondary {
  std::uint16_t scid = 0; //!< its controller id
  std::uint16_t pcid = 0; //!< its primary's
  bool online = false;
  std::uint16_t vfn = 0; //!< virtual function number (1-based)
  std::uint16_t nvq = 0; //!< queue resources assigned
  std::uint16_t nvi = 0; //!< interrupt resources assigned
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "nvme_vf_setup: %s\n", what.c_str());
  std::exit(1);
}

std::uint16_t le16(const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] | (p[1] << 8)); }

//! Run an admin command; returns the NVMe status (0: success) and its result dword.
int admin(int fd, nvme_admin_cmd& c) {
  const int r = ioctl(fd, NVME_IOCTL_ADMIN_CMD, &c);
  if (r < 0) die(std::string("admin command ioctl: ") + std::strerror(errno));
  return r;
}

secondary first_secondary(int fd) {
  std::vector<std::uint8_t> buf(4096);
  nvme_admin_cmd c{};
  c.opcode = op_identify;
  c.addr = reinterpret_cast<std::uint64_t>(buf.data());
  c.data_len = static_cast<std::uint32_t>(buf.size());
  c.cdw10 = cns_secondary_list; // controller id 0 and up
  if (const int st = admin(fd, c); st != 0)
    die("Identify Secondary Controller List failed: status 0x" + std::to_string(st) +
        " (a controller without SR-IOV: QEMU needs sriov_max_vfs and an NVMe subsystem)");
  if (buf[0] == 0) die("the Secondary Controller List is empty (sriov_max_vfs=0?)");
  const std::uint8_t* e = buf.data() + 32;
  secondary s;
  s.scid = le16(e + 0);
  s.pcid = le16(e + 2);
  s.online = (e[4] & 1) != 0;
  s.vfn = le16(e + 8);
  s.nvq = le16(e + 10);
  s.nvi = le16(e + 12);
  std::printf("secondary controllers: %u; first: id %u (primary %u), virtual function %u, %s, %u queue and %u "
              "interrupt resources\n",
              buf[0], s.scid, s.pcid, s.vfn, s.online ? "online" : "offline", s.nvq, s.nvi);
  return s;
}

void virt_mgmt(int fd, std::uint16_t cntlid, std::uint32_t act, std::uint32_t rt, std::uint16_t nr, const char* what) {
  nvme_admin_cmd c{};
  c.opcode = op_virt_mgmt;
  c.cdw10 = act | (rt << 8) | (static_cast<std::uint32_t>(cntlid) << 16);
  c.cdw11 = nr;
  if (const int st = admin(fd, c); st != 0)
    die(std::string("Virtualization Management (") + what + ") failed: status 0x" + std::to_string(st));
  std::printf("%s: done (result %u)\n", what, c.result);
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "assign") != 0 && std::strcmp(argv[1], "online") != 0)) {
    std::fprintf(stderr, "usage: %s assign|online /dev/nvmeN\n", argv[0]);
    return 2;
  }
  const int fd = open(argv[2], O_RDWR);
  if (fd < 0) die(std::string("open ") + argv[2] + ": " + std::strerror(errno));
  secondary s = first_secondary(fd);
  if (std::strcmp(argv[1], "assign") == 0) {
    virt_mgmt(fd, s.scid, act_assign, rt_queues, 2, "assign 2 queue resources");
    virt_mgmt(fd, s.scid, act_assign, rt_interrupts, 1, "assign 1 interrupt resource");
    s = first_secondary(fd);
    if (s.nvq != 2 || s.nvi != 1) die("the list does not show the resources assigned");
  } else {
    virt_mgmt(fd, s.scid, act_online, 0, 0, "bring online");
    s = first_secondary(fd);
    if (!s.online) die("the list does not show the controller online");
  }
  close(fd);
  return 0;
}
