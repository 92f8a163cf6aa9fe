// A file system that takes O_DIRECT at open() but refuses it at write() (EINVAL), as some network
// and FUSE file systems do: preloaded into a process, every write() to a file opened with O_DIRECT
// fails with EINVAL. The checkpoint library must then write the file buffered, whole and correct.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

ssize_t write(int fd, const void* buf, size_t n) {
  static ssize_t (*real_write)(int, const void*, size_t);
  if (!real_write) real_write = (ssize_t(*)(int, const void*, size_t))dlsym(RTLD_NEXT, "write");
  const int flags = fcntl(fd, F_GETFL);
  if (flags >= 0 && (flags & O_DIRECT)) {
    errno = EINVAL;
    return -1;
  }
  return real_write(fd, buf, n);
}
