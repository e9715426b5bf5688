// SPDX-License-Identifier: MIT
// The scratch block device of the block-device media tests
// (BAM_TEST_BLOCK_DEVICE; scripts/test makes a loop device for it), held
// with an exclusive lock while a test uses it: the test programs (plain and
// under sanitizers) run in parallel and would overwrite each other's data.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

struct scratch_block_device {
  std::string path; //!< empty: none configured
  int fd = -1;
  scratch_block_device() {
    const char* dev = std::getenv("BAM_TEST_BLOCK_DEVICE");
    if (dev == nullptr || *dev == '\0') return;
    path = dev;
    fd = ::open(dev, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) ::flock(fd, LOCK_EX);
  }
  ~scratch_block_device() {
    if (fd >= 0) ::close(fd); // releases the lock
  }
  scratch_block_device(const scratch_block_device&) = delete;
  scratch_block_device& operator=(const scratch_block_device&) = delete;
};
