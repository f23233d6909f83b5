/*
 * Write tracking: choosing the mechanism once, widening regions to pages,
 * refusing regions that share a page, and dispatching to the mechanism
 * (write_track.h).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "os/os.h"
#include "track/fault_log.h"
#include "track/race_guard.h"
#include "track/write_track.h"

static pthread_once_t        choose_once = PTHREAD_ONCE_INIT;
static mapping_track_kind chosen;
static const char           *chosen_reason = "";
static char                  reason_buf[384];

/* The uffd line of `mapping info`: the fault log, and what streams do. */
static void describe_uffd(void)
{
    const char *log_why = "";
    char streams[96];
    size_t open_min = 0;
    if (mapping_track_streams(&open_min) != 0)
        snprintf(streams, sizeof streams, "MAPPING_TRACK_STREAMS is not valid");
    else if (open_min)
        snprintf(streams, sizeof streams, "repeated streams of %zu %s or more stay open",
                 open_min % ((size_t)1 << 20) ? open_min >> 10 : open_min >> 20,
                 open_min % ((size_t)1 << 20) ? "KiB" : "MiB");
    else
        snprintf(streams, sizeof streams, "no stream stays open (MAPPING_TRACK_STREAMS=off)");
    if (mapping_track_fault_log_probe(&log_why))
        snprintf(reason_buf, sizeof reason_buf,
                 "uffd: userfaultfd async write-protect + PAGEMAP_SCAN, of the faulted pages (perf fault log); %s",
                 streams);
    else
        snprintf(reason_buf, sizeof reason_buf,
                 "uffd: userfaultfd async write-protect + PAGEMAP_SCAN, walks only (no fault log: %s); %s", log_why,
                 streams);
}

/* uffd probed: 0, or why not (with the kernel's words) in *why. */
static int probe_uffd(const char **why, char *buf, size_t size)
{
    int rc = mapping__uffd_probe(why);
    if (rc != 0 && rc != -ENOSYS) { /* why the kernel refused: EMFILE, EPERM (seccomp), ... */
        snprintf(buf, size, "%s (%s)", *why, strerror(-rc));
        *why = buf;
    }
    return rc;
}

static void choose(void)
{
    const char *env = getenv("MAPPING_TRACK"), *uffd_why = "", *mprot_why = "";
    bool any = !env || !*env || strcmp(env, "auto") == 0;
    bool want_uffd = any || strcmp(env, "uffd") == 0, want_mprot = any || strcmp(env, "mprotect") == 0;
    if (!want_uffd && !want_mprot) {
        chosen_reason = env && strcmp(env, "none") == 0 ? "none: MAPPING_TRACK=none"
                                                        : "none: MAPPING_TRACK is not auto, uffd, mprotect or none";
        return;
    }
    char uffd_buf[160];
    if (want_uffd && probe_uffd(&uffd_why, uffd_buf, sizeof uffd_buf) == 0) {
        chosen = MAPPING_TRACK_KIND_UFFD;
        describe_uffd();
    } else if (want_mprot && mapping__mprot_probe(&mprot_why) == 0) {
        chosen = MAPPING_TRACK_KIND_MPROTECT;
        snprintf(reason_buf, sizeof reason_buf, "mprotect: SIGSEGV handler%s%s", want_uffd ? "; uffd: " : "",
                 want_uffd ? uffd_why : "");
    } else {
        snprintf(reason_buf, sizeof reason_buf, "none: %s%s", want_uffd ? uffd_why : "", want_mprot ? mprot_why : "");
    }
    chosen_reason = reason_buf;
}

int mapping_track_streams(size_t *open_min)
{
    const char *v = getenv("MAPPING_TRACK_STREAMS");
    *open_min = (size_t)8 << 20;
    if (!v || !*v || strcmp(v, "on") == 0)
        return 0;
    if (strcmp(v, "off") == 0) {
        *open_min = 0;
        return 0;
    }
    size_t n = 0;
    for (const char *c = v; *c; c++) {
        if (*c < '0' || *c > '9' || n > (SIZE_MAX >> 4))
            return -EINVAL;
        n = n * 10 + (size_t)(*c - '0');
    }
    if (n < 4 * mapping_os_page_size() || (n & (n - 1)) || n > ((size_t)1 << 40))
        return -EINVAL;
    *open_min = n;
    return 0;
}

mapping_track_kind mapping_track_kind_get(void)
{
    pthread_once(&choose_once, choose);
    return chosen;
}

const char *mapping_track_reason(void)
{
    pthread_once(&choose_once, choose);
    return chosen_reason;
}

/* Every tracked region, to refuse a second one on the same page (two
 * regions sharing a page would take each other's writes). */
static pthread_mutex_t   regions_lock = PTHREAD_MUTEX_INITIALIZER;
static mapping_track_region **regions;
static size_t             n_regions, cap_regions;

static int regions_add(mapping_track_region *t)
{
    for (size_t i = 0; i < n_regions; i++)
        if (regions[i]->lo < t->hi && t->lo < regions[i]->hi)
            return -EBUSY;
    if (n_regions == cap_regions) {
        size_t cap = cap_regions ? 2 * cap_regions : 16;
        mapping_track_region **v = mapping_os_realloc(regions, cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        regions = v;
        cap_regions = cap;
    }
    regions[n_regions++] = t;
    return 0;
}

static void regions_remove(mapping_track_region *t)
{
    for (size_t i = 0; i < n_regions; i++)
        if (regions[i] == t) {
            regions[i] = regions[--n_regions];
            break;
        }
    if (!n_regions) {
        free(regions);
        regions = NULL;
        cap_regions = 0;
    }
}

/* fork(): a child must not inherit a lock another thread held (it would
 * wait for it forever). The handlers take the registry's lock and then each
 * region's, the order every other path takes them in (begin and end take
 * the registry's, then the fault log's; a collect its region's, then the
 * fault log's). The fault log's own handlers must run after these, so they
 * are registered before them (constructor priorities, fault_log.c). */
static bool           fork_handlers_ok;

static void before_fork(void)
{
    pthread_mutex_lock(&regions_lock);
    /* In address order, the same at every fork (the registry's order changes
     * as regions go; under regions_lock either order is safe, but a lock-order
     * checker such as ThreadSanitizer's would report it). */
    uintptr_t last = 0;
    for (size_t k = 0; k < n_regions; k++) {
        mapping_track_region *next = NULL;
        for (size_t i = 0; i < n_regions; i++)
            if ((uintptr_t)regions[i] > last && (!next || (uintptr_t)regions[i] < (uintptr_t)next))
                next = regions[i];
        pthread_mutex_lock(&next->lock);
        last = (uintptr_t)next;
    }
}

static void after_fork(void)
{
    for (size_t i = n_regions; i-- > 0;)
        pthread_mutex_unlock(&regions[i]->lock);
    pthread_mutex_unlock(&regions_lock);
}

/* Registered when the library is loaded, not at the first tracked mirror:
 * glibc (2.36 and later) runs a fork's prepare handlers without its atfork
 * lock, and a handler that another thread registers meanwhile is left out
 * of that fork (neither its prepare nor its child handler runs). Registered
 * by the first begin, which takes regions_lock right after, they let a fork
 * in progress in another thread make a child that started with the lock
 * held by a thread it does not have: its first tracked mirror waited
 * forever (seen in CI as a child's SIGALRM). At load, no thread of the
 * program can be inside the library. */
__attribute__((constructor(202))) static void fork_handlers_install(void)
{
    fork_handlers_ok = pthread_atfork(before_fork, after_fork, after_fork) == 0;
}

bool mapping_track_overlaps(uintptr_t lo, uintptr_t hi)
{
    bool found = false;
    pthread_mutex_lock(&regions_lock);
    for (size_t i = 0; i < n_regions && !found; i++)
        found = regions[i]->lo < hi && lo < regions[i]->hi;
    pthread_mutex_unlock(&regions_lock);
    return found;
}

/* mapping_track_range_protection: read-write throughout (write_track.h). */
int mapping_track_range_protection(uintptr_t lo, uintptr_t hi, int *exec)
{
    return mapping_os_range_access(lo, hi, PROT_READ | PROT_WRITE, exec);
}

/* Only memory the library may write (a sync to the CPU does), and whose
 * protection mprotect tracking puts back as it was: read-write, and
 * executable throughout or nowhere. Looked at once the pages are known to
 * be nobody else's (mprotect tracking of another region makes its pages
 * read-only: that is -EBUSY, in regions_add). Locks held. */
static int check_protection(mapping_track_region *t)
{
    int exec = 0;
    int rc = mapping__race_guards_range_access_locked(t->lo, t->hi, PROT_READ | PROT_WRITE, &exec);
    if (rc == 0 && exec < 0 && t->kind == MAPPING_TRACK_KIND_MPROTECT)
        rc = -ENOEXEC;
    if (rc == -ENOENT)
        rc = 0; /* no /proc: taken as read-write, as it must be */
    t->prot_exec = exec > 0 ? exec : 0;
    return rc;
}

/* Adds t to the regions and starts its mechanism, under the race guards'
 * lock (they stay put meanwhile: race_guard.h) and regions_lock. */
static int start_region(mapping_track_region *t)
{
    mapping__race_guards_lock();
    pthread_mutex_lock(&regions_lock);
    int rc = regions_add(t);
    bool added = rc == 0;
    bool mprot = t->kind == MAPPING_TRACK_KIND_MPROTECT;
    /* mprotect: the guards give the pages up (a guard's end would make a
     * tracked page writable) and protect none of them from now on. */
    bool watched = added && (rc = check_protection(t)) == 0 && mprot &&
                   (rc = mapping__race_guards_watch_locked(t->lo, t->hi)) == 0;
    if (added && rc == 0)
        rc = mprot ? mapping__mprot_begin(t) : mapping__uffd_begin(t);
    if (rc && watched)
        mapping__race_guards_unwatch_locked(t->lo, t->hi);
    if (rc && added)
        regions_remove(t);
    pthread_mutex_unlock(&regions_lock);
    mapping__race_guards_unlock();
    return rc;
}

int mapping_track_begin(void *addr, size_t bytes, mapping_track_region **out)
{
    *out = NULL;
    mapping_track_kind kind = mapping_track_kind_get();
    if (kind == MAPPING_TRACK_KIND_NONE)
        return -ENOSYS;
    uintptr_t page = mapping_os_page_size(), a = (uintptr_t)addr;
    if (!bytes || a + bytes < a || a + bytes > UINTPTR_MAX - page)
        return -EINVAL;
    mapping_track_region *t = mapping_os_calloc(1, sizeof *t);
    if (!t)
        return -ENOMEM;
    *t = (mapping_track_region){
        .kind = kind, .lo = a & ~(page - 1), .hi = (a + bytes + page - 1) & ~(page - 1), .slot = -1};
    if (mapping_track_streams(&t->open_min) != 0 || !fork_handlers_ok) {
        free(t);
        return fork_handlers_ok ? -EINVAL : -ENOMEM;
    }
    if (kind == MAPPING_TRACK_KIND_UFFD) {
        /* The fault log's event opened (by the first thread that tracks)
         * before regions_lock is taken, not inside it (start_region). */
        const char *why;
        (void)mapping_track_fault_log_available(&why);
    }
    pthread_mutex_init(&t->lock, NULL);
    atomic_init(&t->refs, 1);
    int rc = start_region(t);
    if (rc) {
        pthread_mutex_destroy(&t->lock);
        free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void mapping_track_end(mapping_track_region *t)
{
    if (!t)
        return;
    mapping__race_guards_lock(); /* the lock order of begin: the guards', then regions_lock */
    pthread_mutex_lock(&regions_lock);
    pthread_mutex_lock(&t->lock);
    if (t->kind == MAPPING_TRACK_KIND_UFFD) {
        mapping__uffd_end(t);
    } else {
        mapping__mprot_end(t);
        mapping__race_guards_unwatch_locked(t->lo, t->hi);
    }
    t->ended = true;
    regions_remove(t);
    pthread_mutex_unlock(&t->lock);
    pthread_mutex_unlock(&regions_lock);
    mapping__race_guards_unlock();
    mapping_track_drop(t);
}

void mapping_track_hold(mapping_track_region *t)
{
    atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
}

void mapping_track_drop(mapping_track_region *t)
{
    if (atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) != 1)
        return;
    pthread_mutex_destroy(&t->lock);
    free(t);
}

int mapping_track_collect(mapping_track_region *t, mapping_track_fn fn, void *user, bool upload)
{
    pthread_mutex_lock(&t->lock);
    int rc = t->ended                         ? 0
             : t->kind == MAPPING_TRACK_KIND_UFFD ? mapping__uffd_collect(t, fn, user, upload)
                                                : mapping__mprot_collect(t, fn, user);
    pthread_mutex_unlock(&t->lock);
    return rc;
}

/* The pages wholly inside [lo, hi), within the region; false if none. */
static bool inner_pages(const mapping_track_region *t, uintptr_t *lo, uintptr_t *hi)
{
    uintptr_t page = mapping_os_page_size();
    uintptr_t a = (*lo + page - 1) & ~(page - 1), b = *hi & ~(page - 1);
    a = a < t->lo ? t->lo : a;
    b = b > t->hi ? t->hi : b;
    *lo = a;
    *hi = b;
    return a < b;
}

void mapping_track_clear(mapping_track_region *t, uintptr_t lo, uintptr_t hi)
{
    if (!inner_pages(t, &lo, &hi))
        return;
    pthread_mutex_lock(&t->lock);
    if (t->ended) /* nothing to forget */
        ;
    else if (t->kind == MAPPING_TRACK_KIND_UFFD)
        mapping__uffd_protect(t, lo, hi);
    else
        mapping__mprot_clear(t, lo, hi);
    pthread_mutex_unlock(&t->lock);
}

void mapping_track_release(mapping_track_region *t, uintptr_t lo, uintptr_t hi)
{
    if (t->kind != MAPPING_TRACK_KIND_MPROTECT)
        return;
    uintptr_t page = mapping_os_page_size();
    lo &= ~(page - 1);
    hi = (hi + page - 1) & ~(page - 1);
    lo = lo < t->lo ? t->lo : lo;
    hi = hi > t->hi ? t->hi : hi;
    if (lo >= hi)
        return;
    pthread_mutex_lock(&t->lock);
    if (!t->ended)
        mapping__mprot_release(t, lo, hi);
    pthread_mutex_unlock(&t->lock);
}
