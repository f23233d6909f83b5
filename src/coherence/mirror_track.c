/*
 * Write-tracking mirrors (MAPPING_MIRROR_TRACK_WRITES, a feature:
 * mirror_features.h). The track layer watches the CPU side's pages
 * (track/write_track.h); at the start of every call on the family the
 * feature's collect turns the pages written since the last call into the
 * bytes the program changed, by comparing them with a shadow of the CPU
 * side (track/shadow.h), and the state makes those bytes CPU marks
 * (mirror_state.c: mapping__mirror_enter). So a tracked write behaves as a
 * mark of exactly the bytes it changed, made at the next call: conflicts
 * come out as for marks, and a page holding a CPU write and a device
 * result never turns into a false conflict.
 *
 * The shadow holds the CPU side's content as of the last collect, except
 * where the library itself wrote the CPU side (a copy from the device): the
 * shadow takes those bytes when the copy completes (blocking: at once; on a
 * stream: in a host function queued after the copy, before the program can
 * know that it completed), so they are not taken for the program's. Bytes
 * with a copy to the CPU queued are not compared until it completes.
 *
 * An upload copies from the shadow, after the shadow took the bytes to
 * send (track_copy): the device then holds exactly the shadow's bytes, and
 * a write of another thread racing the sync is found by the next collect
 * whatever its value (had the copy read the CPU side, a byte written
 * during the sync and then back to the shadow's value would compare
 * unchanged while the device held the value between). So the program may
 * go on writing the array while an upload of it is queued.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "coherence/mirror_copy.h"
#include "coherence/mirror_features.h"
#include "os/os.h"
#include "track/shadow.h"
#include "track/write_track.h"

struct mirror_track {
    mapping_track_region *region;
    mapping_track_shadow  shadow;
    mapping_device       *dev;        /* the shadow is registered with it (page-locked), when registered */
    bool                  registered;
    _Atomic int           refs;  /* the family, and each queued job */
    _Atomic bool          ended; /* the family ended: a late job takes nothing */
};

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

size_t mapping__mirror_track_alloc_bytes(size_t bytes)
{
    size_t page = mapping_os_page_size();
    return bytes + (page - bytes % page) % page;
}

/* The last reference frees the shadow and lets the region's memory go
 * (mapping_track_end stopped the watch already; a take after it does nothing). */
static void track_drop(struct mirror_track *t)
{
    if (atomic_fetch_sub(&t->refs, 1) != 1)
        return;
    mapping_track_drop(t->region);
    mapping_track_shadow_free(&t->shadow);
    free(t);
}

/* ---- collect: the bytes the program changed ---- */

/* What one collect found, as offsets within the family: the written page
 * runs, then the changed byte runs. */
typedef struct collected {
    mirror_state      *st;
    mapping_range_list list;
    uint64_t           pages; /* pages reported, for the statistics */
} collected;

static void on_written(void *user, uintptr_t lo, uintptr_t hi)
{
    collected *c = user;
    uintptr_t base = (uintptr_t)c->st->cpu, end = base + c->st->size;
    c->pages += (hi - lo) / mapping_os_page_size();
    lo = lo < base ? base : lo; /* clip to the mirror (a wrap's first and last pages may hold other data) */
    hi = hi > end ? end : hi;
    if (lo < hi) /* runs of one scan may touch */
        mapping__range_list_push(&c->list, lo - base, hi - base);
}

static void on_changed(void *user, size_t lo, size_t hi)
{
    collected *c = user;
    mapping__range_list_push(&c->list, lo, hi);
}

/* The changed bytes of the written pages pages[0..n), skipping bytes with
 * a copy to the CPU queued (the library's, compared once it completed). */
static void diff_pages(mirror_state *st, const mapping_range *pages, size_t n, collected *out)
{
    size_t page = mapping_os_page_size();
    const mapping_range_set *pending = &st->pending[MIRROR_CPU];
    for (size_t i = 0; i < n; i++) {
        size_t lo = pages[i].lo, hi = pages[i].hi;
        mapping_rs_cursor c;
        mapping_range q;
        for (bool ok = pending->count && mapping__rs_seek(pending, lo, &c, &q); ok && q.lo < hi && lo < hi;
             ok = mapping__rs_next(&c, &q)) {
            if (q.lo > lo)
                mapping_track_shadow_diff(&st->track->shadow, st->cpu, lo, q.lo, page, on_changed, out);
            lo = q.hi > lo ? q.hi : lo;
        }
        if (lo < hi)
            mapping_track_shadow_diff(&st->track->shadow, st->cpu, lo, hi, page, on_changed, out);
    }
}

/* uffd: the program unmapped the array (munmap, mremap, a MAP_FIXED
 * mapping over it): -EFAULT where nothing is mapped now (the sync's copy
 * would crash on the hole), -EPERM where other memory is (PAGEMAP_SCAN
 * refuses memory no userfaultfd watches: its writes cannot be found). Say
 * so at every call, instead of a lack of memory or a crash. */
static mapping_status collect_failed(const char *fn, const mirror_state *st, int rc)
{
    if ((rc == -EPERM || rc == -EFAULT) && st->track->region->kind == MAPPING_TRACK_KIND_UFFD)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: MAPPING_MIRROR_TRACK_WRITES: the memory at [%p, +%zu) is no longer the one the mirror "
                             "tracks (unmapped or moved by munmap, mremap or a MAP_FIXED mapping while the mirror "
                             "lives): its writes cannot be found; destroy the mirror",
                             fn, (void *)st->cpu, st->size);
    return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: write tracking could not list the written pages (%s)", fn,
                         rc ? strerror(-rc) : "out of memory");
}

static mapping_status track_collect(const char *fn, mirror_state *st, bool upload, mapping_range **out, size_t *n)
{
    mapping_track_region *region = st->track->region;
    collected pages = {.st = st}, changed = {.st = st};
    uint64_t walks = region->walks;
    int rc = mapping_track_collect(region, on_written, &pages, upload);
    if (pages.pages)
        mapping__count(&st->dev->counters.tracked_pages, pages.pages);
    if (region->walks != walks)
        mapping__count(&st->dev->counters.tracking_walks, region->walks - walks);
    if (pages.list.n && !pages.list.oom)
        diff_pages(st, pages.list.v, pages.list.n, &changed);
    free(pages.list.v);
    if (rc || pages.list.oom || changed.list.oom) {
        free(changed.list.v);
        return collect_failed(fn, st, rc);
    }
    *out = changed.list.v;
    *n = changed.list.n;
    return MAPPING_OK;
}

/* ---- the library's own writes into the CPU side ---- */

/* The bytes a sync to the CPU wrote that become valid: what it copied
 * (p->merged) within the exact stale ranges; merged gaps hold the same
 * bytes on both sides and are not taken (a collect may be reading them). */
static mapping_range *copied_bytes(const sync_plan *p, size_t *n_out)
{
    mapping_range *v = mapping_os_malloc((p->n_merged + p->n_exact) * sizeof *v);
    size_t n = 0;
    for (size_t i = 0, j = 0; v && i < p->n_merged && j < p->n_exact;) {
        size_t lo = p->merged[i].lo > p->exact[j].lo ? p->merged[i].lo : p->exact[j].lo;
        size_t hi = p->merged[i].hi < p->exact[j].hi ? p->merged[i].hi : p->exact[j].hi;
        if (lo < hi)
            v[n++] = (mapping_range){lo, hi};
        if (p->merged[i].hi < p->exact[j].hi)
            i++;
        else
            j++;
    }
    *n_out = n;
    return v;
}

/* The shadow takes the copied bytes, and the tracker forgets the pages
 * wholly inside them (no compare needed there next time). */
static void take_copied(struct mirror_track *t, const unsigned char *cpu, const mapping_range *v, size_t n)
{
    uintptr_t base = (uintptr_t)cpu, page = mapping_os_page_size();
    for (size_t i = 0; i < n; i++) {
        mapping_track_shadow_take(&t->shadow, cpu, v[i].lo, v[i].hi);
        uintptr_t lo = (base + v[i].lo + page - 1) & ~(page - 1), hi = (base + v[i].hi) & ~(page - 1);
        if (lo < hi)
            mapping_track_clear(t->region, lo, hi);
    }
}

/* A take queued on a stream, after the copies. It holds the feature's
 * memory, so it may run after the mirror is gone (it takes nothing then:
 * the family's end drained the queue first, so that does not happen). */
typedef struct take_job {
    struct mirror_track *track;
    const unsigned char *cpu;
    size_t               n;
    mapping_range        v[];
} take_job;

static void run_take_job(void *user)
{
    take_job *job = user;
    if (!atomic_load(&job->track->ended))
        take_copied(job->track, job->cpu, job->v, job->n);
    track_drop(job->track);
    free(job);
}

static mapping_status take_on_stream(mapping_stream *stream, mirror_state *st, const mapping_range *v, size_t n)
{
    take_job *job = mapping_os_malloc(sizeof *job + n * sizeof *v);
    if (!job)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mirror: out of memory");
    *job = (take_job){st->track, st->cpu, n};
    memcpy(job->v, v, n * sizeof *v);
    atomic_fetch_add(&st->track->refs, 1);
    mapping_status status = mapping__launch_host_internal(stream, run_take_job, job);
    if (status != MAPPING_OK) {
        atomic_fetch_sub(&st->track->refs, 1);
        free(job);
    }
    return status;
}

/* A sync to the CPU: the shadow takes what the copy wrote when it is done
 * (blocking: now; on a stream: when the stream gets there; if that cannot
 * be queued, or the copy failed part-way, after waiting for the stream). */
static mapping_status track_copied(mapping_stream *stream, mirror_state *st, const sync_plan *p, mapping_status status)
{
    if (p->target != MIRROR_CPU || !p->n_merged)
        return MAPPING_OK;
    size_t n = 0;
    mapping_range *v = copied_bytes(p, &n);
    if (!v)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mirror: out of memory");
    mapping_status result = MAPPING_OK;
    if (stream && (status != MAPPING_OK || take_on_stream(stream, st, v, n) != MAPPING_OK)) {
        result = mapping__stream_synchronize(stream);
        stream = NULL;
    }
    if (!stream)
        take_copied(st->track, st->cpu, v, n);
    free(v);
    return result;
}

/* The copy step: an upload sends a snapshot the shadow takes now (see the
 * top of this file); a download writes the CPU side as for any mirror. */
static mapping_status track_copy(mapping_stream *stream, mirror_state *st, int t, const mapping_range *v, size_t n,
                                 size_t *done)
{
    if (t != MIRROR_GPU)
        return mapping__mirror_copy_ranges(stream, st, t, v, n, done);
    for (size_t i = 0; i < n; i++)
        mapping_track_shadow_take(&st->track->shadow, st->cpu, v[i].lo, v[i].hi);
    return mapping__mirror_copy_ranges_from(stream, st, t, st->track->shadow.bytes, v, n, done);
}

/* mprotect: a blocking copy into the CPU side opens its pages first (and
 * they count as written, as the faults would have counted them; the shadow
 * takes the copy after it). Else the copy faults page by page, and on a
 * thread that blocks SIGSEGV the kernel kills the process instead. */
static void track_before_copy(mapping_stream *stream, mirror_state *st, int t, const mapping_range *v, size_t n)
{
    if (stream || t != MIRROR_CPU)
        return;
    for (size_t i = 0; i < n; i++)
        mapping_track_release(st->track->region, (uintptr_t)st->cpu + v[i].lo, (uintptr_t)st->cpu + v[i].hi);
}

/* A CPU mark: with mprotect its pages become writable (a system call may
 * write them; they count as written). */
static void track_marked(mirror_state *st, int x, size_t lo, size_t hi, bool discard)
{
    (void)discard;
    if (x == MIRROR_CPU)
        mapping_track_release(st->track->region, (uintptr_t)st->cpu + lo, (uintptr_t)st->cpu + hi);
}

static void track_end(mirror_state *st, bool device_closed)
{
    if (st->track->registered && !device_closed)
        mapping__host_unregister(st->track->dev, st->track->shadow.bytes);
    atomic_store(&st->track->ended, true);
    mapping_track_end(st->track->region); /* the watch goes first: the memory may be gone */
    track_drop(st->track);
    st->track = NULL;
}

static const mirror_feature track_feature = {
    .name = "write tracking",
    .stages = MIRROR_STAGES_TO_CPU | MIRROR_STAGES_TO_GPU,
    .collect = track_collect,
    .marked = track_marked,
    .copy = track_copy,
    .before_copy = track_before_copy,
    .copied = track_copied,
    .end = track_end,
};

/* ---- begin ---- */

static mapping_status begin_failed(const char *fn, const mirror_state *st, int rc)
{
    const void *p = st->cpu;
    size_t n = st->size;
    switch (rc) {
    case -ENOMEM:
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory for write tracking", fn);
    case -EBUSY:
        return mapping__fail(MAPPING_ERR_UNSUPPORTED, "%s: MAPPING_MIRROR_TRACK_WRITES: a page of [%p, +%zu) is "
                             "tracked already by another mirror (tracked arrays may not share a page)", fn, p, n);
    case -EEXIST: /* uffd: the kernel's EBUSY for a page another userfaultfd watches */
        return mapping__fail(MAPPING_ERR_UNSUPPORTED, "%s: MAPPING_MIRROR_TRACK_WRITES: a page of [%p, +%zu) is "
                             "registered with another userfaultfd (the program's or another library's), and a page "
                             "takes one: unregister it first, or MAPPING_TRACK=mprotect", fn, p, n);
    case -ENOSPC:
        return mapping__fail(MAPPING_ERR_UNSUPPORTED, "%s: MAPPING_MIRROR_TRACK_WRITES: %d tracked mirrors exist "
                             "already, as many as mprotect tracking watches at once (destroy one first, or "
                             "MAPPING_TRACK=uffd, Linux >= 6.7)", fn, (int)MAPPING_TRACK_MPROT_SLOTS);
    case -EFAULT:
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: MAPPING_MIRROR_TRACK_WRITES: a page of [%p, +%zu) is "
                             "not mapped", fn, p, n);
    case -EACCES:
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: MAPPING_MIRROR_TRACK_WRITES: a page of [%p, +%zu) is "
                             "not readable and writable (PROT_READ | PROT_WRITE): a sync to the CPU could not write it",
                             fn, p, n);
    case -ENOEXEC:
        return mapping__fail(MAPPING_ERR_UNSUPPORTED, "%s: MAPPING_MIRROR_TRACK_WRITES: [%p, +%zu) is executable in "
                             "part, which mprotect tracking cannot keep (wrap the parts separately, or "
                             "MAPPING_TRACK=uffd)", fn, p, n);
    case -EOPNOTSUPP:
        return mapping__fail(MAPPING_ERR_UNSUPPORTED, "%s: MAPPING_MIRROR_TRACK_WRITES: [%p, +%zu) has pages larger "
                             "than %zu bytes (hugetlbfs), which mprotect tracking cannot protect one base page at a "
                             "time (uffd can: MAPPING_TRACK=uffd, Linux >= 6.7)", fn, p, n, mapping_os_page_size());
    default:
        return mapping__fail(MAPPING_ERR_UNSUPPORTED, "%s: MAPPING_MIRROR_TRACK_WRITES: no write tracking (%s; %s)", fn,
                             mapping_track_reason(), strerror(-rc));
    }
}

/* Uploads read the shadow: page-locked where the CPU side is (a created
 * mirror's, or one wrapped with MAPPING_MIRROR_PIN), so that they stay DMA.
 * An optimisation: a back end that cannot register is not an error. */
static void register_shadow(const mirror_state *st, struct mirror_track *t)
{
    if (!(st->owns_cpu || st->pinned) || t->shadow.size < MAPPING_TRACK_SHADOW_LOCK_MIN)
        return;
    mapping_error_mark before;
    mapping__error_mark(&before);
    t->dev = st->dev;
    t->registered = mapping__host_register(st->dev, t->shadow.bytes, t->shadow.size) == MAPPING_OK;
    mapping__error_forget(&before);
}

static mapping_status check_settings(const char *fn)
{
    size_t open_min;
    if (mapping_track_scan_mode() == MAPPING_TRACK_SCAN_BAD)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: MAPPING_TRACK_SCAN=\"%s\" is not faulted, changed or always", fn,
                             getenv("MAPPING_TRACK_SCAN"));
    if (mapping_track_streams(&open_min) != 0)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: MAPPING_TRACK_STREAMS=\"%s\" is not " MAPPING_TRACK_STREAMS_VALUES, fn,
                             getenv("MAPPING_TRACK_STREAMS"));
    return MAPPING_OK;
}

mapping_status mapping__mirror_track_begin(const char *fn, mirror_state *st)
{
    mapping_status status = check_settings(fn);
    if (status)
        return status;
    struct mirror_track *t = mapping_os_calloc(1, sizeof *t);
    if (!t)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory for write tracking", fn);
    atomic_init(&t->refs, 1);
    int rc = mapping_track_begin(st->cpu, st->size, &t->region);
    /* The shadow starts as the content: a created mirror's is zero. */
    if (rc == 0 && mapping_track_shadow_init(&t->shadow, st->owns_cpu ? NULL : st->cpu, st->size) != 0) {
        mapping_track_end(t->region);
        rc = -ENOMEM;
    }
    if (rc) {
        free(t);
        return begin_failed(fn, st, rc);
    }
    mapping_track_hold(t->region); /* its memory lives as long as t: a queued take clears pages through it */
    register_shadow(st, t);
    st->track = t;
    st->cpu_writable = true; /* asked: mapping_track_begin refuses memory it could not write */
    mapping__mirror_add_feature(st, &track_feature);
    return MAPPING_OK;
}
