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
 *
 * Streams (open runs, $MAPPING_TRACK_STREAMS): asynchronous write-protect
 * costs one fault per 4 KiB page at every first write, and splits huge
 * pages, so a program that rewrites a whole mirror between syncs pays
 * ~1 us per page (a GiB: ~10x the memset). A collect that finds a run of
 * at least open_min bytes written, over a long run the last collect that
 * found writes found too (a stream repeated, not a one-time fill), leaves
 * it writable ("open") and reports it written at every collect from then
 * on, whether written or not: more bytes may move, none is missed. One
 * sample page every open_min / 4 (wider in a run of more than 1,024 such
 * strides) stays protected; at a sync to the device (an upload collect),
 * a run fewer than half of whose samples were written since the last one
 * is protected again (and reported once more: its other pages may have
 * been written). So a stream faults open_min / 4 times less, and a
 * program that stops streaming pays one sync that moves the run
 * needlessly.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include "track/fault_count.h"
#include "os/os.h"
#include "track/write_track.h"

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
static bool             atfork_ok;

static void after_fork_child(void)
{
    generation++;
}

/* Registered when the library is loaded: glibc (2.36 and later) leaves a
 * handler that another thread registers during a fork out of that fork, and
 * a child that missed it would use its parent's descriptors (register and
 * protect ranges of the parent's memory). */
__attribute__((constructor)) static void register_fork_handler(void)
{
    atfork_ok = pthread_atfork(NULL, NULL, after_fork_child) == 0;
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
    if (probe_rc == 0 && !atfork_ok) {
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

static int write_protect(uintptr_t lo, uintptr_t hi, bool on)
{
    struct uffdio_writeprotect wp = {.range = {lo, hi - lo}, .mode = on ? UFFDIO_WRITEPROTECT_MODE_WP : 0};
    return ioctl(uffd, UFFDIO_WRITEPROTECT, &wp) == 0 ? 0 : -errno;
}

/* At most this many sample pages per open run: a look at them is one
 * ioctl each (~1 us), so a run of more than 2 GiB (at the default
 * open_min) spaces them wider than open_min / 4. */
enum { SAMPLES_MAX = 1024 };

/* The stride of a run [lo, hi)'s samples: open_min / 4, or the power of
 * two that keeps them to SAMPLES_MAX. */
static uintptr_t sample_stride(const mapping_track_region *t, uintptr_t lo, uintptr_t hi)
{
    uintptr_t stride = t->open_min / 4;
    while ((hi - lo) / stride > SAMPLES_MAX)
        stride *= 2;
    return stride;
}

/* The first sample page of run r at or after lo: samples sit at the
 * multiples of its stride. */
static uintptr_t first_sample(const mapping_track_open_run *r, uintptr_t lo)
{
    return (lo + r->stride - 1) & ~(r->stride - 1);
}

/* Protects run r's sample pages in [lo, hi). One that stays writable (a
 * failed call) reads as written: its run stays open, which is safe. */
static void protect_samples(const mapping_track_open_run *r, uintptr_t lo, uintptr_t hi)
{
    uintptr_t page = mapping_os_page_size();
    for (uintptr_t s = first_sample(r, lo); s < hi; s += r->stride)
        (void)write_protect(s, s + page, true);
}

/* Clear (the library's own writes): [lo, hi) is protected again, except
 * the open runs in it, which are reported at every collect anyway (their
 * samples are protected, so the library's writes do not keep them open). */
void mapping__uffd_protect(mapping_track_region *t, uintptr_t lo, uintptr_t hi)
{
    if (!own_fds() || t->generation != fds_generation)
        return; /* registered before a fork: the next collect reports it all */
    uintptr_t at = lo;
    for (int i = 0; i < t->n_open && at < hi; i++) {
        const mapping_track_open_run *r = &t->open[i];
        if (r->hi <= at || r->lo >= hi)
            continue;
        if (r->lo > at)
            (void)write_protect(at, r->lo, true);
        uintptr_t end = r->hi < hi ? r->hi : hi;
        protect_samples(r, r->lo > at ? r->lo : at, end);
        at = end;
    }
    if (at < hi)
        (void)write_protect(at, hi, true);
}

static int register_region(mapping_track_region *t)
{
    mapping_track_fault_log_mark(&t->fault_pos); /* before the protection: a later fault is in the log */
    struct uffdio_register reg = {.range = {t->lo, t->hi - t->lo}, .mode = UFFDIO_REGISTER_MODE_WP};
    if (ioctl(uffd, UFFDIO_REGISTER, &reg) != 0)
        /* EBUSY: a page is registered with another userfaultfd (the
         * program's own, or another library's; a page takes one). Our own
         * regions never share a page (write_track.c refuses that first),
         * so -EEXIST tells the caller it is not another mirror. */
        return errno == EBUSY ? -EEXIST : -errno;
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
    t->n_open = t->n_streamed = 0; /* everything is protected again */
    return 0;
}

int mapping__uffd_begin(mapping_track_region *t)
{
    if (!own_fds())
        return -ENOSYS;
    return register_region(t);
}

void mapping__uffd_end(mapping_track_region *t)
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
static bool its_own(mapping_track_region *t, mapping_track_fn fn, void *user)
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
        use = mapping_track_scan_mode() != MAPPING_TRACK_SCAN_ALWAYS;
    return use;
}

/* The shortcut above, and the fault log's list of faulted pages, rest on
 * the fault being counted (and sampled) before a write through the page it
 * opened can happen-before a sync. That holds for the thread that faulted
 * (it counts its fault before it returns to its write), not for another:
 * the kernel makes the page writable, then counts the fault
 * (mm_account_fault, after handle_mm_fault's work), and in between another
 * thread may write the page without a fault of its own and have a sync
 * run, whose collect then sees the old count (or a log without the page)
 * and skips the page: the sync carries stale data (the next one sends
 * it). So both are trusted only when a fault in flight cannot be missed:
 * where every thread's faults are counted as they begin (fault_count.h:
 * perf, kernel-mode faults included), or while the process has a single
 * thread, the collecting one. Finding that out reads /proc/self/stat
 * (~2-3 us, against ~0.6 us for the shortcut alone). Elsewhere a process
 * with several threads walks at every sync. */
static bool sole_thread(void)
{
    char buf[1024];
    /* Kept open (a pread costs half an open, read and close), and opened
     * again after a fork: the inherited one reads the parent's. Under
     * fds_lock, which no fork finds held by a collect (the fork handlers
     * wait for every region's lock, write_track.c). */
    static int      stat_fd = -1;
    static unsigned stat_generation;
    pthread_mutex_lock(&fds_lock);
    unsigned g = generation;
    if (stat_fd >= 0 && stat_generation != g) {
        close(stat_fd);
        stat_fd = -1;
    }
    if (stat_fd < 0) {
        stat_fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
        stat_generation = g;
    }
    ssize_t len = stat_fd >= 0 ? pread(stat_fd, buf, sizeof buf - 1, 0) : -1;
    pthread_mutex_unlock(&fds_lock);
    long threads = 0;
    if (len > 0) {
        buf[len] = 0;
        char *at = strrchr(buf, ')'); /* after the command name, which may hold spaces */
        for (int field = 2; at && field < 20; field++) /* num_threads is field 20 */
            at = strchr(at + 1, ' ');
        if (at)
            threads = strtol(at + 1, NULL, 10);
    }
    return threads == 1;
}

/* Reports and protects again the written pages of [lo, hi). */
static int scan(uintptr_t lo, uintptr_t hi, mapping_track_fn fn, void *user)
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
            return -EAGAIN; /* no progress: part of a huge page (hugetlbfs), which a scan cannot protect alone */
        start = a.walk_end;
    }
    return 0;
}

/* At most this many faulted pages are scanned one run at a time; more, or
 * runs that would cost more than a walk (~1 us each), walk the region. */
enum { FAULTED_MAX = 512, RUN_NS = 1000 };

/* The faulted pages' runs, scanned: 0, -errno, or 1 when a walk is cheaper
 * or needed (a faulted page inside a hugetlbfs page: the kernel write-
 * protects and unprotects those whole, so only a walk of the region, whose
 * ends are aligned to them, finds and protects them again). */
static int scan_faulted(const uintptr_t *pages, long n, uint64_t walk_ns, mapping_track_fn fn, void *user)
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
            return rc == -EAGAIN ? 1 : rc;
        i = j;
    }
    return 0;
}

/* ---- streams: open runs ---- */

/* How many of the run's sample pages there are, and (look) how many were
 * written; those are protected again. */
static int samples_written(const mapping_track_open_run *r, bool look, size_t *written, size_t *total)
{
    uintptr_t page = mapping_os_page_size();
    *written = *total = 0;
    for (uintptr_t at = first_sample(r, r->lo); at < r->hi; at += r->stride) {
        ++*total;
        if (!look)
            continue;
        struct page_region v;
        struct pm_scan_arg a = {.size = sizeof a,
                                .flags = PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
                                .start = at,
                                .end = at + page,
                                .vec = (uintptr_t)&v,
                                .vec_len = 1,
                                .category_mask = PAGE_IS_WRITTEN,
                                .return_mask = PAGE_IS_WRITTEN};
        long n = ioctl(pagemap, PAGEMAP_SCAN, &a);
        if (n < 0)
            return -errno;
        *written += n > 0;
    }
    return 0;
}

/* Reports every open run written. At an upload collect, a run fewer than
 * half of whose samples were written since the last one (a period without
 * the stream: a write now and then to a sample page, such as a header at
 * the array's start, does not keep it open) closes: protected, then
 * reported once more. The samples are looked at only there (a written
 * one stays writable until then, so each counts once); with no fault in
 * the process since the last look, none (protected) can have been
 * written: no look needed. */
static int report_open_runs(mapping_track_region *t, bool no_fault, bool upload, mapping_track_fn fn, void *user)
{
    if (!no_fault)
        t->samples_maybe_written = true;
    bool look = upload && t->samples_maybe_written;
    for (int i = 0; i < t->n_open;) {
        mapping_track_open_run *r = &t->open[i];
        bool closing = false;
        if (upload) {
            size_t written, total;
            int rc = samples_written(r, look, &written, &total);
            if (rc)
                return rc; /* the samples not looked at stay written: looked at next time */
            closing = 2 * written < total && !r->fresh; /* fresh: its stream came before this period */
            r->fresh = false;
        }
        uintptr_t lo = r->lo, hi = r->hi;
        /* Protected before it is reported: a write after this faults and
         * is the next collect's; one before is in what this sync copies.
         * Should protecting fail, the run stays open. */
        if (closing && write_protect(lo, hi, true) == 0) {
            memmove(r, r + 1, (size_t)(t->n_open - i - 1) * sizeof *r);
            t->n_open--;
        } else {
            i++;
        }
        fn(user, lo, hi);
    }
    if (upload)
        t->samples_maybe_written = false;
    return 0;
}

/* Drops the faulted pages inside open runs (their samples: looked at by
 * report_open_runs); returns how many are left. */
static long outside_open(const mapping_track_region *t, uintptr_t *pages, long n)
{
    long k = 0;
    for (long i = 0; i < n; i++) {
        bool inside = false;
        for (int j = 0; j < t->n_open && !inside; j++)
            inside = pages[i] >= t->open[j].lo && pages[i] < t->open[j].hi;
        if (!inside)
            pages[k++] = pages[i];
    }
    return k;
}

/* A walk of [t->lo, t->hi) around the open runs. */
static int walk_outside_open(const mapping_track_region *t, mapping_track_fn fn, void *user)
{
    uintptr_t at = t->lo;
    for (int i = 0; i <= t->n_open; i++) {
        uintptr_t end = i < t->n_open ? t->open[i].lo : t->hi;
        if (end > at) {
            int rc = scan(at, end, fn, user);
            if (rc)
                return rc;
        }
        if (i < t->n_open)
            at = t->open[i].hi;
    }
    return 0;
}

/* Passes the scan's runs on, and keeps the long ones (adjacent runs
 * joined) as runs to open. */
typedef struct opener {
    mapping_track_fn fn;
    void               *user;
    size_t              open_min;
    bool                found; /* a written page */
    uintptr_t           lo, hi; /* the run growing */
    uintptr_t           cand_lo[MAPPING_TRACK_OPEN_MAX], cand_hi[MAPPING_TRACK_OPEN_MAX];
    int                 n;
} opener;

static void opener_keep(opener *o)
{
    if (o->open_min && o->hi - o->lo >= o->open_min && o->n < MAPPING_TRACK_OPEN_MAX) {
        o->cand_lo[o->n] = o->lo;
        o->cand_hi[o->n++] = o->hi;
    }
}

static void opener_run(void *user, uintptr_t lo, uintptr_t hi)
{
    opener *o = user;
    o->fn(o->user, lo, hi);
    o->found = true;
    if (lo == o->hi && o->hi != 0) {
        o->hi = hi;
        return;
    }
    opener_keep(o);
    o->lo = lo;
    o->hi = hi;
}

/* Opens [lo, hi), just reported written (so in this sync's copy), joined
 * with the open runs it touches. The protection is lifted before the run
 * is listed; should lifting fail part way, the run is listed all the same
 * (reported at every collect: nothing written there can be missed). Where
 * joining changes the samples' stride, the whole joined run is lifted and
 * its samples protected anew. */
static void open_run(mapping_track_region *t, uintptr_t lo, uintptr_t hi, bool upload)
{
    if (t->n_open == MAPPING_TRACK_OPEN_MAX)
        return;
    int first = 0;
    while (first < t->n_open && t->open[first].hi < lo)
        first++;
    mapping_track_open_run run = {.lo = lo, .hi = hi, .fresh = !upload}; /* opened before an upload: judged after the next */
    int last = first; /* open[first, last) touch it (the scan skipped them: no overlap) */
    for (; last < t->n_open && t->open[last].lo <= run.hi; last++) {
        run.lo = t->open[last].lo < run.lo ? t->open[last].lo : run.lo;
        run.hi = t->open[last].hi > run.hi ? t->open[last].hi : run.hi;
        run.fresh |= t->open[last].fresh;
    }
    run.stride = sample_stride(t, run.lo, run.hi);
    bool same = true;
    for (int k = first; k < last; k++)
        same &= t->open[k].stride == run.stride;
    uintptr_t from = same ? lo : run.lo, to = same ? hi : run.hi;
    (void)write_protect(from, to, false);
    protect_samples(&run, from, to);
    memmove(&t->open[first + 1], &t->open[last], (size_t)(t->n_open - last) * sizeof run);
    t->n_open -= last - first - 1;
    t->open[first] = run;
}

/* The long runs of a collect that found writes: each one that meets a
 * long run of the last such collect by open_min or more opens; the others
 * are remembered for the next. (A fill written once, then scattered
 * writes, opens nothing.) */
static void open_repeated(mapping_track_region *t, const opener *o, bool upload)
{
    int kept = 0;
    uintptr_t keep_lo[MAPPING_TRACK_OPEN_MAX], keep_hi[MAPPING_TRACK_OPEN_MAX];
    for (int i = 0; i < o->n; i++) {
        bool again = false;
        for (int j = 0; j < t->n_streamed && !again; j++) {
            uintptr_t lo = o->cand_lo[i] > t->streamed_lo[j] ? o->cand_lo[i] : t->streamed_lo[j];
            uintptr_t hi = o->cand_hi[i] < t->streamed_hi[j] ? o->cand_hi[i] : t->streamed_hi[j];
            again = hi > lo && hi - lo >= t->open_min;
        }
        if (again) {
            open_run(t, o->cand_lo[i], o->cand_hi[i], upload);
        } else {
            keep_lo[kept] = o->cand_lo[i];
            keep_hi[kept++] = o->cand_hi[i];
        }
    }
    memcpy(t->streamed_lo, keep_lo, (size_t)kept * sizeof keep_lo[0]);
    memcpy(t->streamed_hi, keep_hi, (size_t)kept * sizeof keep_hi[0]);
    t->n_streamed = kept;
}

/* What the fault log says since the last scan: the pages it names (*n;
 * -1: not trusted, walk), whether no fault happened at all (*no_fault)
 * and whether the count can vouch for the next scan (*counted). */
typedef struct fault_view {
    long                    n;
    mapping_track_fault_pos now;
    uint64_t                faults;
    bool                    counted, no_fault;
} fault_view;

static void read_fault_log(mapping_track_region *t, uintptr_t *pages, fault_view *v)
{
    /* Where every thread's faults are counted as they begin, the stamp
     * sees a fault in flight; elsewhere only a process with one thread
     * (asked before the stamp is read) has none. */
    bool shortcut = use_shortcut(), entries = shortcut && mapping_track_fault_entries_available();
    bool sole = shortcut && !entries && sole_thread(), every_thread;
    v->n = mapping_track_fault_log_pages(&t->fault_pos, t->lo, t->hi, pages, FAULTED_MAX, t->walk_ns, &v->now,
                                         &v->faults, &every_thread);
    bool trusted = shortcut && (every_thread || sole);
    v->counted = v->faults != UINT64_MAX && trusted;
    if (!trusted)
        v->n = -1; /* the log may lack a fault in flight: walk */
    v->no_fault = v->counted && t->faults_valid && v->faults == t->faults_seen;
}

/* The written pages: the logged ones scanned, or the region walked. */
static int scan_written(mapping_track_region *t, uintptr_t *pages, long n, opener *o)
{
    if (n > 0)
        n = outside_open(t, pages, n);
    int rc = n < 0 ? 1 : n == 0 ? 0 : scan_faulted(pages, n, t->walk_ns, opener_run, o);
    if (rc == 1) {
        t->walks++;
        uint64_t t0 = mapping_os_now_ns();
        rc = walk_outside_open(t, opener_run, o);
        t->walk_ns = mapping_os_now_ns() - t0;
    }
    return rc;
}

int mapping__uffd_collect(mapping_track_region *t, mapping_track_fn fn, void *user, bool upload)
{
    if (!its_own(t, fn, user))
        return 0;
    /* The program may have unmapped the array while the mirror lives
     * (munmap, an mremap that moved or shrank it): the kernel watches
     * nothing there, and the sync's copy would fault on the hole.
     * msync(MS_ASYNC) writes nothing back (Linux >= 2.6.19) and fails with
     * ENOMEM where a page of the range is not mapped: a walk of the
     * range's VMAs, ~0.15 us. (Other memory mapped there instead is found
     * by the scan: PAGEMAP_SCAN refuses it with EPERM.) */
    if (msync((void *)t->lo, t->hi - t->lo, MS_ASYNC) != 0 && errno == ENOMEM)
        return -EFAULT;
    uintptr_t pages[FAULTED_MAX];
    fault_view v;
    read_fault_log(t, pages, &v);
    int rc = report_open_runs(t, v.no_fault, upload, fn, user);
    if (rc)
        return rc;
    if (v.no_fault) {
        t->fault_pos = v.now; /* no fault since the last scan: nothing in the log either */
        return 0;
    }
    t->faults_valid = false;
    opener o = {.fn = fn, .user = user, .open_min = t->open_min};
    if ((rc = scan_written(t, pages, v.n, &o)))
        return rc; /* the point stays: the next scan looks at these pages again */
    opener_keep(&o);
    if (o.found)
        open_repeated(t, &o, upload);
    t->fault_pos = v.now;
    t->faults_seen = v.faults;
    t->faults_valid = v.counted;
    return 0;
}

#else /* no userfaultfd on this system */

int mapping__uffd_probe(const char **why)
{
    *why = "no userfaultfd on this system";
    return -ENOSYS;
}
int mapping__uffd_begin(mapping_track_region *t)
{
    (void)t;
    return -ENOSYS;
}
void mapping__uffd_end(mapping_track_region *t)
{
    (void)t;
}
int mapping__uffd_collect(mapping_track_region *t, mapping_track_fn fn, void *user, bool upload)
{
    (void)t, (void)fn, (void)user, (void)upload;
    return -ENOSYS;
}
void mapping__uffd_protect(mapping_track_region *t, uintptr_t lo, uintptr_t hi)
{
    (void)t, (void)lo, (void)hi;
}
#endif
