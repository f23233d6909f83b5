/*
 * Write tracking by userfaultfd write-protect in asynchronous mode and the
 * PAGEMAP_SCAN ioctl (Linux >= 6.7; write_track.h). One userfaultfd and one
 * /proc/self/pagemap descriptor per process. With UFFD_FEATURE_WP_ASYNC
 * nobody reads the userfaultfd: the kernel resolves each write fault by
 * making the page writable, and PAGEMAP_SCAN with PM_SCAN_WP_MATCHING lists
 * the pages that are writable ("written") and protects them again,
 * atomically per page. UFFD_USER_MODE_ONLY lets an unprivileged process use
 * it whatever vm.unprivileged_userfaultfd says; with async mode, faults the
 * kernel takes for the process (copy_to_user in read(2)) are resolved the
 * same way, so they are tracked too. The constants are defined here when
 * the build machine's headers predate them (the ABI is fixed).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include "os/os.h"
#include "os/write_track.h"

#if defined(__linux__) && defined(SYS_userfaultfd)
#include <linux/fs.h>
#include <linux/userfaultfd.h>

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif
#ifndef PAGEMAP_SCAN
struct page_region {
    uint64_t start, end, categories;
};
struct pm_scan_arg {
    uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
    uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};
#define PAGEMAP_SCAN          _IOWR('f', 16, struct pm_scan_arg)
#define PM_SCAN_WP_MATCHING   (1 << 0)
#define PM_SCAN_CHECK_WPASYNC (1 << 1)
#define PAGE_IS_WRITTEN       (1 << 1)
#endif

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int            uffd = -1, pagemap = -1, probe_rc = -ENOSYS;
static const char    *probe_why = "not probed";
static bool           unpopulated; /* UFFD_FEATURE_WP_UNPOPULATED: untouched pages are protected too */

/* The process's userfaultfd (async write-protect) and /proc/self/pagemap,
 * or -errno with *why set. */
static int open_fds(int *uffd_out, int *pagemap_out, const char **why)
{
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
    if (fd < 0) {
        *why = "userfaultfd(UFFD_USER_MODE_ONLY) refused";
        return -errno;
    }
    struct uffdio_api api = {.api = UFFD_API, .features = 0};
    if (ioctl(fd, UFFDIO_API, &api) != 0 || !(api.features & UFFD_FEATURE_WP_ASYNC)) {
        close(fd);
        *why = "the kernel offers no UFFD_FEATURE_WP_ASYNC (Linux < 6.7)";
        return -ENOSYS;
    }
    unpopulated = (api.features & UFFD_FEATURE_WP_UNPOPULATED) != 0;
    close(fd); /* the API handshake is once per descriptor: a fresh one asks for the features */
    fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
    api = (struct uffdio_api){.api = UFFD_API,
                              .features = UFFD_FEATURE_WP_ASYNC | (unpopulated ? UFFD_FEATURE_WP_UNPOPULATED : 0)};
    if (fd < 0 || ioctl(fd, UFFDIO_API, &api) != 0) {
        int rc = -errno;
        *why = "userfaultfd: enabling UFFD_FEATURE_WP_ASYNC failed";
        if (fd >= 0)
            close(fd);
        return rc;
    }
    int pm = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    struct pm_scan_arg a = {.size = sizeof a, .start = 0, .end = 0};
    if (pm < 0 || (ioctl(pm, PAGEMAP_SCAN, &a) < 0 && errno != EINVAL)) {
        *why = "no PAGEMAP_SCAN on /proc/self/pagemap (Linux < 6.7)";
        close(fd);
        if (pm >= 0)
            close(pm);
        return -ENOSYS;
    }
    *uffd_out = fd;
    *pagemap_out = pm;
    *why = "";
    return 0;
}

/* fork(): both descriptors stay bound to the parent's memory (a
 * userfaultfd acts on the address space that created it, /proc/self/pagemap
 * on the one that opened it), so a child that used them would scan and
 * protect its parent's pages. A child opens its own at its first use
 * (own_fds), and a region registered before the fork is registered again
 * in the child, all of it counted written once (its_own). */
static _Atomic unsigned generation; /* forks seen in this process's line */
static unsigned         fds_generation;
static pthread_mutex_t  fds_lock = PTHREAD_MUTEX_INITIALIZER;

static void after_fork_child(void)
{
    generation++;
}

static bool own_fds(void)
{
    unsigned g = generation;
    if (g == fds_generation)
        return uffd >= 0;
    pthread_mutex_lock(&fds_lock);
    if (g != fds_generation) {
        if (uffd >= 0)
            close(uffd); /* the child's reference only; the parent keeps its own */
        if (pagemap >= 0)
            close(pagemap);
        uffd = pagemap = -1;
        const char *why;
        if (open_fds(&uffd, &pagemap, &why) != 0)
            uffd = pagemap = -1;
        fds_generation = g;
    }
    pthread_mutex_unlock(&fds_lock);
    return uffd >= 0;
}

static void probe(void)
{
    probe_rc = open_fds(&uffd, &pagemap, &probe_why);
    if (probe_rc == 0 && pthread_atfork(NULL, NULL, after_fork_child) != 0) {
        close(uffd);
        close(pagemap);
        uffd = pagemap = -1;
        probe_rc = -ENOMEM;
        probe_why = "pthread_atfork failed";
    }
}

int mapping__uffd_probe(const char **why)
{
    pthread_once(&probe_once, probe);
    *why = probe_why;
    return probe_rc;
}

void mapping__uffd_protect(mapping_os_track *t, uintptr_t lo, uintptr_t hi)
{
    if (!own_fds() || t->generation != fds_generation)
        return; /* registered before a fork: the next collect reports it all */
    struct uffdio_writeprotect wp = {.range = {lo, hi - lo}, .mode = UFFDIO_WRITEPROTECT_MODE_WP};
    ioctl(uffd, UFFDIO_WRITEPROTECT, &wp);
}

static int register_region(mapping_os_track *t)
{
    mapping_os_fault_log_mark(&t->fault_pos); /* before the protection: a later fault is in the log */
    struct uffdio_register reg = {.range = {t->lo, t->hi - t->lo}, .mode = UFFDIO_REGISTER_MODE_WP};
    if (ioctl(uffd, UFFDIO_REGISTER, &reg) != 0)
        return -errno;
    struct uffdio_writeprotect wp = {.range = {t->lo, t->hi - t->lo}, .mode = UFFDIO_WRITEPROTECT_MODE_WP};
    if (ioctl(uffd, UFFDIO_WRITEPROTECT, &wp) != 0) {
        int rc = -errno;
        struct uffdio_range r = {t->lo, t->hi - t->lo};
        ioctl(uffd, UFFDIO_UNREGISTER, &r);
        return rc;
    }
    t->generation = fds_generation;
    t->faults_valid = false;
    t->walk_ns = 0;
    return 0;
}

int mapping__uffd_begin(mapping_os_track *t)
{
    if (!own_fds())
        return -ENOSYS;
    return register_region(t);
}

void mapping__uffd_end(mapping_os_track *t)
{
    if (!own_fds() || t->generation != fds_generation)
        return; /* the parent's registration: not this process's to undo */
    /* Unprotect first: pages of a region that stays mapped (wrapped memory)
     * must not keep a protection nobody resolves. Fails harmlessly when the
     * memory is gone already. */
    struct uffdio_writeprotect wp = {.range = {t->lo, t->hi - t->lo}, .mode = 0};
    ioctl(uffd, UFFDIO_WRITEPROTECT, &wp);
    struct uffdio_range r = {t->lo, t->hi - t->lo};
    ioctl(uffd, UFFDIO_UNREGISTER, &r);
}

/* A region registered before a fork, in the child: nothing of it is
 * watched here, so all of it counts written once, and it is registered in
 * the child's own userfaultfd for the next syncs. */
static bool its_own(mapping_os_track *t, mapping_os_track_fn fn, void *user)
{
    if (own_fds() && t->generation == fds_generation)
        return true;
    fn(user, t->lo, t->hi);
    if (own_fds())
        (void)register_region(t); /* on failure, reported whole at every collect */
    return false;
}

enum { SCAN_VEC = 256 };

/* A clean sync without a page-table walk. In asynchronous mode the kernel
 * makes a protected page writable only inside a page fault, and every
 * fault, the kernel's own on the process's behalf (copy_to_user in read(2),
 * get_user_pages) included, is counted in the faulting thread's minor or
 * major fault count, which getrusage(RUSAGE_SELF) sums over the process
 * (exited threads too), after the page table was updated. So if the sum
 * (read by the fault log's drain, before the scan) equals the one read
 * before the last scan began, no page became writable since: nothing to
 * report. A fault that completes while the sum is read changes it for the
 * next collect, which then scans. ~0.6 us, against a walk of ~40 us per
 * GiB. $MAPPING_TRACK_SCAN=always turns it off. */
static bool use_shortcut(void)
{
    static _Atomic int use = -1;
    if (use < 0)
        use = mapping_os_track_scan_mode() != MAPPING_OS_SCAN_ALWAYS;
    return use;
}

/* Reports and protects again the written pages of [lo, hi). */
static int scan(uintptr_t lo, uintptr_t hi, mapping_os_track_fn fn, void *user)
{
    struct page_region vec[SCAN_VEC];
    uint64_t start = lo;
    while (start < hi) {
        struct pm_scan_arg a = {.size = sizeof a,
                                .flags = PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
                                .start = start,
                                .end = hi,
                                .vec = (uintptr_t)vec,
                                .vec_len = SCAN_VEC,
                                .category_mask = PAGE_IS_WRITTEN,
                                .return_mask = PAGE_IS_WRITTEN};
        long n = ioctl(pagemap, PAGEMAP_SCAN, &a);
        if (n < 0)
            return -errno;
        for (long i = 0; i < n; i++)
            fn(user, (uintptr_t)vec[i].start, (uintptr_t)vec[i].end);
        if (a.walk_end <= start)
            break; /* no progress: should not happen */
        start = a.walk_end;
    }
    return 0;
}

/* At most this many faulted pages are scanned one run at a time; more, or
 * runs that would cost more than a walk (~1 us each), walk the region. */
enum { FAULTED_MAX = 512, RUN_NS = 1000 };

/* The faulted pages' runs, scanned: 0, -errno, or 1 when a walk is cheaper. */
static int scan_faulted(const uintptr_t *pages, long n, uint64_t walk_ns, mapping_os_track_fn fn, void *user)
{
    uintptr_t page = mapping_os_page_size();
    long runs = 0;
    for (long i = 0; i < n; i++)
        runs += i == 0 || pages[i] != pages[i - 1] + page;
    if (walk_ns && (uint64_t)runs * RUN_NS > walk_ns)
        return 1;
    for (long i = 0; i < n;) {
        long j = i + 1;
        while (j < n && pages[j] == pages[j - 1] + page)
            j++;
        int rc = scan(pages[i], pages[j - 1] + page, fn, user);
        if (rc)
            return rc;
        i = j;
    }
    return 0;
}

int mapping__uffd_collect(mapping_os_track *t, mapping_os_track_fn fn, void *user)
{
    if (!its_own(t, fn, user))
        return 0;
    uintptr_t pages[FAULTED_MAX];
    mapping_os_fault_pos now;
    uint64_t faults;
    long n = mapping_os_fault_log_pages(&t->fault_pos, t->lo, t->hi, pages, FAULTED_MAX, t->walk_ns, &now, &faults);
    bool counted = faults != UINT64_MAX && use_shortcut();
    if (counted && t->faults_valid && faults == t->faults_seen) {
        t->fault_pos = now; /* no fault since the last scan: nothing in the log either */
        return 0;
    }
    t->faults_valid = false;
    int rc = n < 0 ? 1 : n == 0 ? 0 : scan_faulted(pages, n, t->walk_ns, fn, user);
    if (rc == 1) {
        t->walks++;
        uint64_t t0 = mapping_os_now_ns();
        rc = scan(t->lo, t->hi, fn, user);
        t->walk_ns = mapping_os_now_ns() - t0;
    }
    if (rc)
        return rc; /* the point stays: the next scan looks at these pages again */
    t->fault_pos = now;
    t->faults_seen = faults;
    t->faults_valid = counted;
    return 0;
}

#else /* no userfaultfd on this system */

int mapping__uffd_probe(const char **why)
{
    *why = "no userfaultfd on this system";
    return -ENOSYS;
}
int mapping__uffd_begin(mapping_os_track *t)
{
    (void)t;
    return -ENOSYS;
}
void mapping__uffd_end(mapping_os_track *t)
{
    (void)t;
}
int mapping__uffd_collect(mapping_os_track *t, mapping_os_track_fn fn, void *user)
{
    (void)t, (void)fn, (void)user;
    return -ENOSYS;
}
void mapping__uffd_protect(mapping_os_track *t, uintptr_t lo, uintptr_t hi)
{
    (void)t, (void)lo, (void)hi;
}
#endif
