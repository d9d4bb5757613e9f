/* A full disk, on demand, for the fault-injection tests (tests/test_faults.py).
 *
 * LD_PRELOAD=enospc.so XF_TEST_ENOSPC_PATH=checkpoint xf train ...
 * makes write(2) to any file whose path contains XF_TEST_ENOSPC_PATH fail with ENOSPC once
 * XF_TEST_ENOSPC_AFTER bytes (default 0) have been written to such files by this process: the
 * last write is short, as on a real disk that fills up. Every other file is untouched. Only
 * write(2) is wrapped: Python's file objects use it; C++ streams inside libraries do not.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ssize_t (*real_write)(int, const void *, size_t);
static long long budget = -1;

static int full(int fd) {
    const char *pattern = getenv("XF_TEST_ENOSPC_PATH");
    char link[64], path[4096];
    ssize_t n;
    if (fd <= 2 || pattern == NULL || *pattern == 0) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = readlink(link, path, sizeof path - 1);
    if (n < 0) return 0;
    path[n] = 0;
    return strstr(path, pattern) != NULL;
}

ssize_t write(int fd, const void *buf, size_t count) {
    if (real_write == NULL) real_write = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    if (full(fd)) {
        if (budget < 0) {
            const char *after = getenv("XF_TEST_ENOSPC_AFTER");
            budget = after ? atoll(after) : 0;
        }
        if (budget == 0) {
            errno = ENOSPC;
            return -1;
        }
        if ((long long)count > budget) count = (size_t)budget;
        ssize_t written = real_write(fd, buf, count);
        if (written > 0) budget -= written;
        return written;
    }
    return real_write(fd, buf, count);
}
