// Slow storage for live tests, at the OS boundary: preloaded into `goodput run` (and so into its
// agents), it makes every write() to a file under $GOODPUT_SLOW_DIR take as long as it would at
// $GOODPUT_SLOW_BYTES_PER_S. The agent's persister is unchanged; only the disk under it is slow.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

ssize_t write(int fd, const void* buf, size_t n) {
  static ssize_t (*real_write)(int, const void*, size_t);
  if (!real_write) real_write = (ssize_t(*)(int, const void*, size_t))dlsym(RTLD_NEXT, "write");
  const char* dir = getenv("GOODPUT_SLOW_DIR");
  const char* rate = getenv("GOODPUT_SLOW_BYTES_PER_S");
  if (dir && *dir && rate && n > 0) {
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t len = readlink(link, path, sizeof path - 1);
    if (len > 0) {
      path[len] = 0;
      if (strncmp(path, dir, strlen(dir)) == 0) {
        const double seconds = (double)n / atof(rate);
        struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
        nanosleep(&ts, NULL);
      }
    }
  }
  return real_write(fd, buf, n);
}
