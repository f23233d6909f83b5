/*
 * Write tracking: which pages of a host region were written since the last
 * look, without the writer's help. Three mechanisms, chosen once per process
 * (mapping_track_kind; $MAPPING_TRACK = auto | uffd | mprotect | none):
 *
 * - uffd (write_track_uffd.c): userfaultfd write-protect in asynchronous
 *   mode (UFFD_FEATURE_WP_ASYNC, user-mode faults only) plus the
 *   PAGEMAP_SCAN ioctl of /proc/self/pagemap, Linux >= 6.7. The kernel
 *   resolves a write fault itself and leaves the page writable: one fault
 *   per page, no signal, and writes the kernel makes for the process
 *   (read(2) into the region) are seen like any other. A scan returns the
 *   written pages and protects them again in one call.
 * - mprotect (write_track_mprotect.c): the region is PROT_READ; a SIGSEGV
 *   handler (chained to any handler installed before it) records the page in
 *   a bitmap and makes it writable. A kernel write into a protected page
 *   fails with EFAULT instead: mapping_track_release makes pages writable
 *   (and counts them written) before a system call writes them.
 * - none: tracking is refused.
 *
 * Granularity: the base page (mapping_os_page_size()). A region is widened
 * to whole pages; regions must not share a page (begin refuses with -EBUSY).
 * Thread-safe: collect, clear and release on one region are serialised by
 * its lock (a clear may come from a stream's host function while the
 * program's thread collects), and writes may come from any thread. A region
 * lives until end and the last drop (mapping_track_hold): calls on an
 * ended region do nothing. fork() waits until no thread is inside a call.
 */
#ifndef MAPPING_WRITE_TRACK_H
#define MAPPING_WRITE_TRACK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "track/fault_log.h"

typedef enum mapping_track_kind {
    MAPPING_TRACK_KIND_NONE = 0,
    MAPPING_TRACK_KIND_UFFD = 1,
    MAPPING_TRACK_KIND_MPROTECT = 2,
} mapping_track_kind;


/* $MAPPING_TRACK_STREAMS, read when a region begins: with uffd, a run of at
 * least *open_min bytes written in one period is left writable ("open")
 * and counted written at every collect, instead of faulting once per page
 * at every streaming write (write_track_uffd.c). on (default, also when
 * unset or empty): 8 MiB; off: *open_min = 0; or a byte count, a power of
 * two of at least 4 pages. 0, or -EINVAL for another value. */
int mapping_track_streams(size_t *open_min);
/* What a valid $MAPPING_TRACK_STREAMS is, for the callers' messages. */
#define MAPPING_TRACK_STREAMS_VALUES "on, off or a power of two of at least 4 pages (bytes)"

/* The mechanism this process uses (chosen at the first call, from
 * $MAPPING_TRACK and what the kernel offers). Thread-safe. */
mapping_track_kind mapping_track_kind_get(void);
/* Why the mechanism is what it is ("uffd: ..."), for `mapping info`. */
const char *mapping_track_reason(void);

typedef struct mapping_track_region mapping_track_region;
/* Called with each run of written pages [lo, hi) (addresses, page-aligned). */
typedef void (*mapping_track_fn)(void *user, uintptr_t lo, uintptr_t hi);

/* How [lo, hi) (page-aligned) is mapped, from /proc/self/maps: 0 when
 * every page of it is mapped readable and writable, with *exec = PROT_EXEC
 * when all of it is executable too, 0 when none is, -1 when part is;
 * -EFAULT when a page is not mapped; -EACCES when one is not readable and
 * writable (PROT_READ memory, a const array, a PROT_NONE guard page);
 * -ENOENT when the file cannot be read (no /proc). The memory's own
 * protection, which the mprotect users (tracking, the race checker) must
 * put back as it was. Thread-safe; not async-signal-safe. mapping_os_range_access (os.h). */
int mapping_track_range_protection(uintptr_t lo, uintptr_t hi, int *exec);

/* Does a tracked region meet [lo, hi)? Thread-safe. */
bool mapping_track_overlaps(uintptr_t lo, uintptr_t hi);
/* Starts tracking [addr, addr + bytes) (widened to pages): nothing counts
 * as written yet. 0, or -errno: -ENOSYS when no mechanism is available,
 * -EBUSY when a page is tracked already, -ENOMEM, -ENOSPC (mprotect) when
 * MAPPING_TRACK_MPROT_SLOTS regions are tracked already, -EFAULT when a page is
 * not mapped, -EACCES when one is not readable and writable, -ENOEXEC
 * (mprotect) when part of the range is executable and part not. */
int  mapping_track_begin(void *addr, size_t bytes, mapping_track_region **out);
/* Stops tracking: the pages are writable again. NULL: no-op. The region's
 * memory is freed at the last drop (held references keep it). */
void mapping_track_end(mapping_track_region *t);
/* A reference that keeps the region's memory (not its tracking) alive, for
 * work that may run after end (a clear queued on a stream); drop it once. */
void mapping_track_hold(mapping_track_region *t);
void mapping_track_drop(mapping_track_region *t);
/* Reports the pages written since the last collect (or begin, clear) and
 * protects them again. 0 or -errno (nothing reported is lost: the pages
 * stay counted as written). uffd: when no page fault began or ended in
 * the process since the last scan began (fault_count.h counts the ones
 * that began in every thread; without it, only a process with a single
 * thread can tell), no page can have become writable, and the scan is
 * skipped; when the fault log (fault_log.h) holds every fault since then,
 * only the pages it names are scanned ($MAPPING_TRACK_SCAN=changed
 * keeps the first, =always neither): a write made by another process
 * (process_vm_writev, a shared mapping) counts in that process and is seen
 * at the next walk this process has a reason to make. upload: the collect
 * comes before a sync to a device, where a period ends (uffd: an open run
 * whose sample pages nobody wrote since the last such collect closes). */
int  mapping_track_collect(mapping_track_region *t, mapping_track_fn fn, void *user, bool upload);
/* Forgets writes to the pages wholly inside [lo, hi) (the library's own
 * writes, e.g. a copy from the device). */
void mapping_track_clear(mapping_track_region *t, uintptr_t lo, uintptr_t hi);
/* mprotect: makes the pages meeting [lo, hi) writable and counts them
 * written (so the kernel may write them). uffd: nothing to do. */
void mapping_track_release(mapping_track_region *t, uintptr_t lo, uintptr_t hi);

/* ---- the mechanisms (write_track_uffd.c, write_track_mprotect.c) ---- */
enum { MAPPING_TRACK_OPEN_MAX = 8 };
/* uffd: a run left writable, reported written at every collect; fresh:
 * opened since the last upload collect (not judged there yet). */
typedef struct mapping_track_open_run {
    uintptr_t lo, hi;
    uintptr_t stride; /* between its sample pages: a power of two */
    bool      fresh;
} mapping_track_open_run;

struct mapping_track_region {
    mapping_track_kind kind;
    pthread_mutex_t       lock;  /* collect, clear, release, end */
    _Atomic int           refs;  /* 1 until end, + each hold */
    bool                  ended; /* under lock */
    uintptr_t             lo, hi; /* page-aligned */
    int                   slot;   /* mprotect: index in its table */
    int                   prot_exec; /* PROT_EXEC if the memory was executable (kept by mprotect), else 0 */
    /* uffd: the process's page-fault count taken just before the last
     * complete scan (faults_valid), see mapping__uffd_collect. */
    uint64_t              faults_seen;
    bool                  faults_valid;
    /* uffd: the fault log's point taken before the last scan (fault_log.h),
     * and what the last walk of the whole region cost (0: none yet). */
    mapping_track_fault_pos  fault_pos;
    uint64_t              walk_ns;
    /* uffd: the fork generation whose userfaultfd registered the region. */
    unsigned              generation;
    /* Collects that walked the whole region (uffd), for the statistics. */
    uint64_t              walks;
    /* uffd, streams: the open runs (sorted, disjoint); the long runs the
     * last collect that found a written page found (a run opens when it is
     * found again); the smallest run that opens (0: none do;
     * $MAPPING_TRACK_STREAMS). */
    mapping_track_open_run   open[MAPPING_TRACK_OPEN_MAX];
    int                   n_open;
    bool                  samples_maybe_written; /* a fault since the last look at the samples */
    uintptr_t             streamed_lo[MAPPING_TRACK_OPEN_MAX], streamed_hi[MAPPING_TRACK_OPEN_MAX];
    int                   n_streamed;
    size_t                open_min;
};
/* Probes once: 0 when available, else -errno with *why set. */
int  mapping__uffd_probe(const char **why);
int  mapping__uffd_begin(mapping_track_region *t);
void mapping__uffd_end(mapping_track_region *t);
int  mapping__uffd_collect(mapping_track_region *t, mapping_track_fn fn, void *user, bool upload);
void mapping__uffd_protect(mapping_track_region *t, uintptr_t lo, uintptr_t hi);

/* mprotect: how many regions may be tracked at once (begin: -ENOSPC beyond). */
enum { MAPPING_TRACK_MPROT_SLOTS = 256 };
int  mapping__mprot_probe(const char **why);
int  mapping__mprot_begin(mapping_track_region *t);
void mapping__mprot_end(mapping_track_region *t);
int  mapping__mprot_collect(mapping_track_region *t, mapping_track_fn fn, void *user);
void mapping__mprot_clear(mapping_track_region *t, uintptr_t lo, uintptr_t hi);
void mapping__mprot_release(mapping_track_region *t, uintptr_t lo, uintptr_t hi);

#endif
