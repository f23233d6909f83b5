/*
 * Write-tracking mirrors (MAPPING_MIRROR_TRACK_WRITES): the CPU side's
 * pages are watched by the OS layer (track/write_track.h), and before every
 * sync (and stale count) the pages written since the last look become CPU
 * marks. The rest of the mirror code sees only marks.
 *
 * Which bytes of a written page are marked: those valid on the CPU. Bytes
 * stale on the CPU hold old content the program was not meant to write
 * (a byte the GPU side modified, or the GPU-valid start of an adopted
 * mirror): marking them would raise a conflict for a page shared with GPU
 * results, or send stale bytes over newer ones. So a tracked write is never
 * a conflict, and a page shared by a CPU write and a GPU result is exact:
 * the CPU's bytes go up, the GPU's come down.
 *
 * The library's own writes into the CPU side (a completed copy from the
 * device: the host back end and PoCL copy with CPU stores) are forgotten
 * again for the pages wholly inside the copied ranges; a page partly
 * copied stays counted (the program may have written its other bytes), and
 * is re-sent once, where valid on the CPU.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "coherence/mirror_internal.h"
#include "os/os.h"
#include "track/write_track.h"

mapping_track_mechanism mapping_write_tracking(size_t *granularity)
{
    if (granularity)
        *granularity = mapping_os_page_size();
    switch (mapping_track_kind_get()) {
    case MAPPING_TRACK_KIND_UFFD:
        return MAPPING_TRACK_UFFD;
    case MAPPING_TRACK_KIND_MPROTECT:
        return MAPPING_TRACK_MPROTECT;
    default:
        return MAPPING_TRACK_NONE;
    }
}

const char *mapping_write_tracking_description(void)
{
    return mapping_track_reason();
}

mapping_status mapping__mirror_track_begin(const char *fn, mirror_state *st)
{
    if (mapping_track_scan_mode() == MAPPING_TRACK_SCAN_BAD)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: MAPPING_TRACK_SCAN=\"%s\" is not faulted, changed or always", fn,
                             getenv("MAPPING_TRACK_SCAN"));
    size_t open_min;
    if (mapping_track_streams(&open_min) != 0)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: MAPPING_TRACK_STREAMS=\"%s\" is not " MAPPING_TRACK_STREAMS_VALUES,
                             fn, getenv("MAPPING_TRACK_STREAMS"));
    mapping_track_region *t = NULL;
    int rc = mapping_track_begin(st->cpu, st->size, &t);
    if (rc == -ENOMEM)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory for write tracking", fn);
    if (rc == -EBUSY)
        return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                             "%s: MAPPING_MIRROR_TRACK_WRITES: a page of [%p, +%zu) is tracked already "
                             "by another mirror",
                             fn, (void *)st->cpu, st->size);
    if (rc == -EEXIST) /* uffd: the kernel's EBUSY for a page another userfaultfd watches */
        return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                             "%s: MAPPING_MIRROR_TRACK_WRITES: a page of [%p, +%zu) is registered with another "
                             "userfaultfd (the program's or another library's), and a page takes one: unregister it "
                             "first, or MAPPING_TRACK=mprotect",
                             fn, (void *)st->cpu, st->size);
    if (rc == -ENOSPC)
        return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                             "%s: MAPPING_MIRROR_TRACK_WRITES: %d tracked mirrors exist already, as many as mprotect "
                             "tracking watches at once (destroy one first, or MAPPING_TRACK=uffd, Linux >= 6.7)",
                             fn, (int)MAPPING_TRACK_MPROT_SLOTS);
    if (rc == -EFAULT)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: MAPPING_MIRROR_TRACK_WRITES: a page of [%p, +%zu) is not mapped", fn,
                             (void *)st->cpu, st->size);
    if (rc == -EACCES)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: MAPPING_MIRROR_TRACK_WRITES: a page of [%p, +%zu) is not readable and writable "
                             "(PROT_READ | PROT_WRITE): a sync to the CPU could not write it",
                             fn, (void *)st->cpu, st->size);
    if (rc == -ENOEXEC)
        return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                             "%s: MAPPING_MIRROR_TRACK_WRITES: [%p, +%zu) is executable in part, which mprotect "
                             "tracking cannot keep (wrap the parts separately, or MAPPING_TRACK=uffd)",
                             fn, (void *)st->cpu, st->size);
    if (rc == -EOPNOTSUPP)
        return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                             "%s: MAPPING_MIRROR_TRACK_WRITES: [%p, +%zu) has pages larger than %zu bytes (hugetlbfs), "
                             "which mprotect tracking cannot protect one base page at a time (uffd can: "
                             "MAPPING_TRACK=uffd, Linux >= 6.7)",
                             fn, (void *)st->cpu, st->size, mapping_os_page_size());
    if (rc)
        return mapping__fail(MAPPING_ERR_UNSUPPORTED, "%s: MAPPING_MIRROR_TRACK_WRITES: no write tracking (%s; %s)", fn,
                             mapping_track_reason(), strerror(-rc));
    st->track = t;
    st->cpu_writable = true; /* asked: mapping_track_begin refuses memory it could not write */
    return MAPPING_OK;
}

void mapping__mirror_track_end(mirror_state *st)
{
    mapping_track_end(st->track);
    st->track = NULL;
}

/* The written page runs of one collect, as offsets within the family. */
typedef struct collected {
    mapping_range *v;
    size_t         n, cap;
    bool           oom;
    uintptr_t      base;
    size_t         size;
    uint64_t       pages; /* pages reported, for the statistics */
} collected;

static void on_written(void *user, uintptr_t lo, uintptr_t hi)
{
    collected *c = user;
    c->pages += (hi - lo) / mapping_os_page_size();
    /* Clip to the mirror (its first and last pages may hold other data). */
    lo = lo < c->base ? c->base : lo;
    hi = hi > c->base + c->size ? c->base + c->size : hi;
    if (lo >= hi)
        return;
    if (c->n && c->v[c->n - 1].hi == lo - c->base) { /* runs of one scan may touch */
        c->v[c->n - 1].hi = hi - c->base;
        return;
    }
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 64;
        mapping_range *v = mapping_os_realloc(c->v, cap * sizeof *v);
        if (!v) {
            c->oom = true;
            return;
        }
        c->v = v;
        c->cap = cap;
    }
    c->v[c->n++] = (mapping_range){lo - c->base, hi - c->base};
}

/* Marks [lo, hi) minus the CPU's stale bytes modified on the CPU. */
static mapping_status mark_valid_part(const char *fn, mirror_state *st, size_t lo, size_t hi)
{
    mapping_rs_cursor c;
    mapping_range r;
    mapping_status status;
    bool ok = mapping__rs_seek(&st->stale[MIRROR_CPU], lo, &c, &r);
    while (lo < hi) {
        size_t end = ok && r.lo < hi ? r.lo : hi; /* [lo, end) is valid on the CPU */
        if (end > lo && (status = mapping__mirror_mark(fn, st, MIRROR_CPU, lo, end, false)))
            return status;
        if (!ok || r.lo >= hi)
            break;
        if (r.hi > lo)
            lo = r.hi;
        ok = mapping__rs_next(&c, &r);
    }
    return MAPPING_OK;
}

mapping_status mapping__mirror_track_collect_pages(const char *fn, mirror_state *st, bool upload)
{
    collected c = {.base = (uintptr_t)st->cpu, .size = st->size};
    uint64_t walks = st->track->walks;
    int rc = mapping_track_collect(st->track, on_written, &c, upload);
    if (c.pages)
        mapping__count(&st->dev->counters.tracked_pages, c.pages);
    if (st->track->walks != walks)
        mapping__count(&st->dev->counters.tracking_walks, st->track->walks - walks);
    mapping_status status = MAPPING_OK;
    if (c.n && !st->n_inflight && !st->stale[MIRROR_CPU].count && !(st->log_n && st->log_side != MIRROR_CPU) &&
        !st->modified[MIRROR_GPU].count) {
        /* Nothing stale on the CPU: the runs are marks as they are (the log, a few ns each). */
        for (size_t i = 0; i < c.n; i++)
            if (!mapping__mirror_log_append(st, MIRROR_CPU, c.v[i].lo, c.v[i].hi) &&
                (status = mapping__mirror_mark(fn, st, MIRROR_CPU, c.v[i].lo, c.v[i].hi, false)))
                break;
    } else if (c.n) {
        if (st->n_inflight)
            mapping__mirror_fold_completed(st);
        status = mapping__mirror_log_flush(st);
        for (size_t i = 0; i < c.n && status == MAPPING_OK; i++)
            status = mark_valid_part(fn, st, c.v[i].lo, c.v[i].hi);
    }
    free(c.v);
    /* uffd: the program unmapped the array (munmap, mremap, a MAP_FIXED
     * mapping over it): -EFAULT where nothing is mapped now (the sync's
     * copy would crash on the hole), -EPERM where other memory is
     * (PAGEMAP_SCAN refuses memory no userfaultfd watches: its writes
     * cannot be found). Say so at every sync, instead of a lack of memory
     * or a crash. */
    if (status == MAPPING_OK && (rc == -EPERM || rc == -EFAULT) && st->track->kind == MAPPING_TRACK_KIND_UFFD)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: MAPPING_MIRROR_TRACK_WRITES: the memory at [%p, +%zu) is no longer the one the mirror "
                             "tracks (unmapped or moved by munmap, mremap or a MAP_FIXED mapping while the mirror "
                             "lives): its writes cannot be found; destroy the mirror",
                             fn, (void *)st->cpu, st->size);
    if (status == MAPPING_OK && (rc || c.oom))
        status = mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: write tracking could not list the written pages "
                                                               "(%s)", fn, rc ? strerror(-rc) : "out of memory");
    return status;
}

void mapping__mirror_track_copied(mirror_state *st, const mapping_range *v, size_t n)
{
    uintptr_t base = (uintptr_t)st->cpu;
    for (size_t i = 0; i < n; i++)
        mapping_track_clear(st->track, base + v[i].lo, base + v[i].hi);
}

/* A clear queued on a stream: the runs of whole pages to forget. The region
 * is held, so the job may run after the mirror is gone (it does nothing then). */
typedef struct track_clear_job {
    mapping_track_region *track;
    size_t            n;
    mapping_range     pages[]; /* addresses, page-aligned */
} track_clear_job;

static void run_clear_job(void *user)
{
    track_clear_job *job = user;
    for (size_t i = 0; i < job->n; i++)
        mapping_track_clear(job->track, job->pages[i].lo, job->pages[i].hi);
    mapping_track_drop(job->track);
    free(job);
}

/* The whole pages of range r of the CPU side (addresses); false if none. */
static bool whole_pages(const mirror_state *st, const mapping_range *r, mapping_range *pages)
{
    uintptr_t base = (uintptr_t)st->cpu, page = mapping_os_page_size();
    pages->lo = (base + r->lo + page - 1) & ~(page - 1);
    pages->hi = (base + r->hi) & ~(page - 1);
    return pages->lo < pages->hi;
}

mapping_status mapping__mirror_track_copied_on(mapping_stream *stream, mirror_state *st, const mapping_range *v,
                                               size_t n)
{
    mapping_range pages;
    size_t whole = 0; /* a copy within one page leaves nothing to forget: nothing is queued */
    for (size_t i = 0; i < n; i++)
        whole += whole_pages(st, &v[i], &pages);
    if (!whole)
        return MAPPING_OK;
    track_clear_job *job = mapping_os_malloc(sizeof *job + whole * sizeof job->pages[0]);
    if (!job)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mirror: out of memory");
    job->n = 0;
    for (size_t i = 0; i < n; i++)
        if (whole_pages(st, &v[i], &pages))
            job->pages[job->n++] = pages;
    job->track = st->track;
    mapping_track_hold(job->track);
    mapping_status status = mapping__launch_host_internal(stream, run_clear_job, job);
    if (status != MAPPING_OK) {
        mapping_track_drop(job->track);
        free(job);
    }
    return status;
}

void mapping__mirror_track_marked(mirror_state *st, size_t lo, size_t hi)
{
    uintptr_t base = (uintptr_t)st->cpu;
    mapping_track_release(st->track, base + lo, base + hi);
}
