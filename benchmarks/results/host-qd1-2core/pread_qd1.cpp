#include <fcntl.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>
int main(int argc, char** argv) {
  const char* path = argv[1];
  int threads = argc > 2 ? atoi(argv[2]) : 1;
  int n = 5000;
  int fd = open(path, O_RDONLY | O_DIRECT);
  if (fd < 0) {
    perror("open");
    return 1;
  }
  off_t size = lseek(fd, 0, SEEK_END);
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      void* buf;
      posix_memalign(&buf, 4096, 8192);
      std::mt19937_64 rng(t + 1);
      for (int i = 0; i < n; ++i) {
        off_t off = (rng() % (size / 8192)) * 8192;
        if (pread(fd, buf, 8192, off) != 8192) {
          perror("pread");
          exit(1);
        }
      }
    });
  for (auto& p : pool)
    p.join();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("pread O_DIRECT 8 KiB, %d threads: %.0f IOPS (%.1f us each per thread)\n", threads, threads * n / s,
         s / n * 1e6);
}
