/*
 * Page faults counted as they begin, in every thread (fault_count.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "track/fault_count.h"

#if defined(__linux__)
#include <linux/perf_event.h>
#include <sys/syscall.h>

enum {
    MAX_THREADS = 64, /* threads at the first call; more: not available (a read costs ~0.3 us each) */
    MAX_PASSES = 8,   /* listings of /proc/self/task until one finds no new thread */
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int            fds[MAX_THREADS];
static pid_t          tids[MAX_THREADS];
static int            n_fds;
static bool           ready;
static _Atomic bool   forked; /* a child's copies of the descriptors count its parent */
static bool           atfork_ok;

static void after_fork_child(void)
{
    forked = true;
}

/* Registered when the library is loaded: glibc (2.36 and later) leaves a
 * handler that another thread registers during a fork out of that fork, so
 * a child forked while the first thread to track set this up would not be
 * marked forked, and would read its parent's counts as its own. */
__attribute__((constructor)) static void register_fork_handler(void)
{
    atfork_ok = pthread_atfork(NULL, NULL, after_fork_child) == 0;
}

/* A counting event on thread `tid`, inherited by the threads it makes;
 * -1 with errno set when perf refuses. */
static int open_on(pid_t tid)
{
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_PAGE_FAULTS; /* at the fault's entry; _MIN and getrusage count at its end */
    a.inherit = 1;
    a.inherit_thread = 1; /* threads, not forked children (Linux 5.13) */
    a.exclude_hv = 1;     /* kernel-mode faults stay in: copy_to_user into the array */
    int fd = (int)syscall(SYS_perf_event_open, &a, tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0 && errno == EINVAL) {
        a.inherit_thread = 0; /* an older kernel: forked children count too (only more walks) */
        fd = (int)syscall(SYS_perf_event_open, &a, tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
    }
    return fd;
}

static bool attached(pid_t tid)
{
    for (int i = 0; i < n_fds; i++)
        if (tids[i] == tid)
            return true;
    return false;
}

/* One pass over /proc/self/task: 1 when it attached a new thread, 0 when
 * it found none, -1 when a thread could not be counted. */
static int attach_pass(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long tid = strtol(e->d_name, &end, 10);
        if (*end || tid <= 0 || attached((pid_t)tid))
            continue;
        if (n_fds == MAX_THREADS) {
            found = -1;
            break;
        }
        int fd = open_on((pid_t)tid);
        if (fd < 0) {
            if (errno == ESRCH)
                continue; /* it ended: its faults no longer matter */
            found = -1;
            break;
        }
        fds[n_fds] = fd;
        tids[n_fds++] = (pid_t)tid;
        found = 1;
    }
    closedir(d);
    return found;
}

static void set_up(void)
{
    const char *v = getenv("MAPPING_TRACK_FAULT_ENTRIES"); /* off: as where perf refuses (tests) */
    if ((v && !strcmp(v, "off")) || !atfork_ok)
        return;
    int rc = 1;
    for (int pass = 0; pass < MAX_PASSES && rc == 1; pass++)
        rc = attach_pass();
    if (rc == 0) {
        ready = true;
        return;
    }
    for (int i = 0; i < n_fds; i++)
        close(fds[i]);
    n_fds = 0;
}

bool mapping_track_fault_entries_available(void)
{
    pthread_once(&once, set_up);
    return ready && !forked;
}

bool mapping_track_fault_entries(uint64_t *out)
{
    pthread_once(&once, set_up);
    if (!ready || forked)
        return false;
    uint64_t sum = 0;
    for (int i = 0; i < n_fds; i++) {
        uint64_t v;
        ssize_t got;
        do
            got = read(fds[i], &v, sizeof v);
        while (got < 0 && errno == EINTR);
        if (got != (ssize_t)sizeof v)
            return false;
        sum += v;
    }
    *out = sum;
    return true;
}

#else /* no perf events */

bool mapping_track_fault_entries_available(void)
{
    return false;
}

bool mapping_track_fault_entries(uint64_t *out)
{
    (void)out;
    return false;
}
#endif
