/*
 * Mirrors with several device sides (mapping_multimirror_*): one host array
 * and a replica per device, validity per byte range for every side, syncs
 * from the cheapest valid side. Sides: 0 = CPU, 1 + j = device j.
 *
 * State per side s: stale[s] (bytes whose content is not the latest) and
 * modified[s] (bytes s wrote that some other side has not seen yet).
 * Invariants: no byte is stale on every side; modified[s] and stale[s] are
 * disjoint. Separate from the two-sided mirrors (mirror*.c), which it does
 * not touch.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "coherence/range_set.h"
#include "coherence/span_set.h"
#include "core/ops.h"
#include "os/os.h"
#include "os/trace.h"
#include "track/shadow.h"
#include "track/write_track.h"

enum { MAX_SIDES = MAPPING_MULTIMIRROR_MAX_DEVICES + 1 };

/* A replica the memory budget of its device may evict (core/budget.c). */
struct replica_node {
    mapping_reclaimable        node; /* first: the hook finds the replica from it */
    struct mapping_multimirror *m;
    int                        j;
    bool                       registered;
};

struct mapping_multimirror {
    int              count; /* devices */
    size_t           size;
    unsigned char   *cpu; /* the host array: cpu_bytes of whole pages (alloc_host_array) */
    size_t           cpu_bytes;
    bool             cpu_locked, cpu_registered; /* mlock'ed; registered with dev[0] */
    mapping_device  *dev[MAPPING_MULTIMIRROR_MAX_DEVICES];
    uint64_t         dev_serial[MAPPING_MULTIMIRROR_MAX_DEVICES]; /* which open of dev[j] */
    mapping_buffer  *buf[MAPPING_MULTIMIRROR_MAX_DEVICES];
    mapping_span_set stale[MAX_SIDES], modified[MAX_SIDES];
    /* Syncs queued on a stream and not known to be complete: each is waited
     * for before anything observes or reads what it writes. */
    struct queued_sync {
        mapping_event  *event;
        mapping_stream *stream; /* compared, never dereferenced */
        int             side;
    } *queued;
    size_t n_queued, cap_queued;
    /* Direct peer links, measured on first need; 0 bandwidth: not yet. */
    mapping_link peer[MAPPING_MULTIMIRROR_MAX_DEVICES][MAPPING_MULTIMIRROR_MAX_DEVICES];
    /* mapping_multimirror_track_writes: the CPU pages under watch
     * (track/write_track.h), and the CPU side's content as of the last look
     * (track/shadow.h): a written page's changed bytes become CPU marks. */
    mapping_track_region *track;
    mapping_track_shadow  shadow;
    /* Memory budgets: replica j of a device with a budget (at creation, or
     * set since: it joins at the next call) may be evicted (its buffer NULL
     * until a sync to it makes it again). Every call holds `lock`, so that
     * an eviction from another thread waits for no call or skips it. */
    struct replica_node rep[MAPPING_MULTIMIRROR_MAX_DEVICES];
    pthread_mutex_t     lock; /* error-checking: a call from a callback of a call or eviction is BUSY */
    _Atomic(const void *) caller; /* the thread in a call (core.h's token), or NULL */
};

static mapping_status check_handle(const char *fn, const mapping_multimirror *m)
{
    if (!m)
        return mapping__fail(MAPPING_ERR_NULL_ARGUMENT, "%s: the multimirror is NULL", fn);
    if (!mapping__handle_live(MAPPING_HANDLE_MULTIMIRROR, m))
        return mapping__fail(MAPPING_ERR_INVALID_HANDLE, "%s: %p is not a live multimirror", fn, (const void *)m);
    for (int j = 0; j < m->count; j++)
        if (!mapping__device_alive(m->dev[j], m->dev_serial[j]))
            return mapping__fail(MAPPING_ERR_INVALID_HANDLE, "%s: device %d of multimirror %p was closed", fn, j,
                                 (const void *)m);
    return MAPPING_OK;
}

static mapping_status check_device_index(const char *fn, const mapping_multimirror *m, int device)
{
    if (device < 0 || device >= m->count)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: device side %d is not one of 0..%d", fn, device,
                             m->count - 1);
    return MAPPING_OK;
}

static mapping_status oom(const char *fn)
{
    return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of host memory for the range sets", fn);
}

/* Memory budgets (the end of this file): a call begins (the lock; the
 * replicas of devices given a budget since join it) and ends. */
static mapping_status call_begin(const char *fn, mapping_multimirror *m);
static void           call_end(mapping_multimirror *m);
static void           budget_leave(mapping_multimirror *m);
static void           budget_begin(mapping_multimirror *m);
static mapping_evict_result replica_evict_hook(mapping_reclaimable *node);

/* Waits for the queued syncs, except those to side `keep_side` on
 * `keep_stream` (ordered already by that stream); -1 / NULL keeps none. */
static mapping_status settle(mapping_multimirror *m, int keep_side, const mapping_stream *keep_stream)
{
    mapping_status first = MAPPING_OK;
    size_t kept = 0;
    for (size_t i = 0; i < m->n_queued; i++) {
        struct queued_sync *q = &m->queued[i];
        if (keep_stream && q->side == keep_side && q->stream == keep_stream &&
            mapping__event_query(q->event) == MAPPING_ERR_NOT_READY) {
            m->queued[kept++] = *q; /* still running, and ordered by the stream */
            continue;
        }
        mapping_status st = mapping__event_synchronize(q->event);
        if (first == MAPPING_OK)
            first = st;
        mapping__event_destroy(q->event);
    }
    m->n_queued = kept;
    return first;
}

/* A device closed before the multimirror took its buffers and events (and,
 * for device 0, the host array) with it: only what is still alive is freed,
 * after the syncs queued on the live devices' streams (which write their
 * buffers; one that read a closed device's replica ended before that close
 * returned: core/peer_fence.c). */
static void release(mapping_multimirror *m)
{
    bool alive[MAPPING_MULTIMIRROR_MAX_DEVICES];
    for (int j = 0; j < m->count; j++)
        alive[j] = m->dev_serial[j] == 0 || mapping__device_alive(m->dev[j], m->dev_serial[j]);
    for (size_t i = 0; i < m->n_queued; i++) {
        struct queued_sync *q = &m->queued[i];
        if (q->side > 0 && alive[q->side - 1]) { /* else its device's close destroyed the event */
            mapping__event_synchronize(q->event);
            mapping__event_destroy(q->event);
        }
    }
    m->n_queued = 0;
    free(m->queued);
    mapping_track_end(m->track); /* before the memory goes */
    mapping_track_shadow_free(&m->shadow);
    for (int j = 0; j < m->count; j++)
        if (alive[j])
            mapping__free_gpu(m->buf[j]);
    if (m->cpu_registered && alive[0])
        mapping__host_unregister(m->dev[0], m->cpu);
    if (m->cpu) /* the library's own memory: also when device 0 was closed first */
        mapping_os_free_locked(m->cpu, m->cpu_bytes, m->cpu_locked);
    for (int s = 0; s < MAX_SIDES; s++) {
        mapping__span_set_free(&m->stale[s]);
        mapping__span_set_free(&m->modified[s]);
    }
    mapping_os_handle_free(m);
}

/* The host array: whole pages of page-locked memory of the library's own
 * (not a device's: closing device 0 must not free it under the program,
 * which may hold its address), registered with device 0 where its back end
 * can (its copies then DMA from it), so that write tracking (which watches
 * pages) sees no other data in them. */
static mapping_status alloc_host_array(mapping_multimirror *m, mapping_device *dev, size_t bytes)
{
    size_t page = mapping_os_page_size();
    m->cpu_bytes = bytes + (page - bytes % page) % page;
    m->cpu = mapping_os_alloc_locked(m->cpu_bytes, &m->cpu_locked);
    if (!m->cpu)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mapping_multimirror_create: out of host memory for %zu "
                                                             "bytes", m->cpu_bytes);
    mapping_error_mark before;
    mapping__error_mark(&before);
    m->cpu_registered = mapping__host_register(dev, m->cpu, m->cpu_bytes) == MAPPING_OK;
    mapping__error_forget(&before); /* an optimisation: plain memory works too */
    return MAPPING_OK;
}

mapping_status mapping_multimirror_create(mapping_device *const *devices, int count, size_t bytes,
                                          mapping_multimirror **out)
{
    static const char fn[] = "mapping_multimirror_create";
    mapping_status st;
    if ((st = mapping__check_ptr(fn, "out", out)) || (st = mapping__check_ptr(fn, "devices", devices)))
        return st;
    *out = NULL;
    if (count < 1 || count > MAPPING_MULTIMIRROR_MAX_DEVICES)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: count %d is not 1 to %d", fn, count,
                             MAPPING_MULTIMIRROR_MAX_DEVICES);
    if (bytes == 0)
        return mapping__fail(MAPPING_ERR_ZERO_SIZE, "%s: bytes is 0", fn);
    for (int j = 0; j < count; j++) {
        if ((st = mapping__check_device(fn, devices[j])))
            return st;
        for (int i = 0; i < j; i++)
            if (devices[i] == devices[j])
                return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: devices %d and %d are the same device", fn,
                                     i, j);
    }
    mapping_multimirror *m = mapping_os_handle_alloc(sizeof *m); /* see os/handle_arena.c */
    if (!m)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    m->count = count;
    m->size = bytes;
    memcpy(m->dev, devices, (size_t)count * sizeof *devices);
    for (int j = 0; j < count; j++)
        m->dev_serial[j] = devices[j]->serial;
    st = alloc_host_array(m, devices[0], bytes);
    for (int j = 0; j < count && st == MAPPING_OK; j++) {
        st = mapping__allocate_gpu_counted(fn, devices[j], bytes, &m->buf[j]);
        if (st == MAPPING_OK)
            m->buf[j]->owner = "multimirror"; /* mapping_free_gpu refuses it */
        if (st == MAPPING_OK && !mapping__span_set_add(&m->stale[1 + j], 0, bytes))
            st = oom(fn);
    }
    if (st != MAPPING_OK) {
        release(m);
        return st;
    }
    memset(m->cpu, 0, bytes);
    if (mapping__handle_add(MAPPING_HANDLE_MULTIMIRROR, m) != MAPPING_OK) {
        release(m);
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory for the handle registry", fn);
    }
    budget_begin(m);
    *out = m;
    return MAPPING_OK;
}

void mapping_multimirror_destroy(mapping_multimirror *m)
{
    if (!m)
        return;
    if (!mapping__handle_remove(MAPPING_HANDLE_MULTIMIRROR, m)) {
        mapping__fail(MAPPING_ERR_INVALID_HANDLE, "mapping_multimirror_destroy: %p is not a live multimirror",
                      (const void *)m);
        return;
    }
    int closed = -1;
    for (int j = 0; j < m->count && closed < 0; j++)
        closed = mapping__device_alive(m->dev[j], m->dev_serial[j]) ? -1 : j;
    budget_leave(m); /* no eviction may start or run from here on */
    release(m);
    if (closed >= 0) /* its host memory is freed; what the device held went with it */
        mapping__fail(MAPPING_ERR_INVALID_HANDLE, "mapping_multimirror_destroy: device %d of %p was closed first", closed,
                      (const void *)m);
}

/* The getters: NULL for what a closed device took with it, replica j's
 * buffer once device j is, and the CPU array once device 0 is (the
 * multimirror is unusable then; the array itself stays valid until
 * destroy, for an address the program took before). */
static bool side_alive(const char *fn, const mapping_multimirror *m, int j)
{
    if (mapping__device_alive(m->dev[j], m->dev_serial[j]))
        return true;
    mapping__fail(MAPPING_ERR_INVALID_HANDLE, "%s: device %d of multimirror %p was closed", fn, j, (const void *)m);
    return false;
}

size_t mapping_multimirror_size(const mapping_multimirror *m)
{
    return mapping__handle_live(MAPPING_HANDLE_MULTIMIRROR, m) ? m->size : 0;
}

void *mapping_multimirror_cpu(mapping_multimirror *m)
{
    static const char fn[] = "mapping_multimirror_cpu";
    return mapping__handle_live(MAPPING_HANDLE_MULTIMIRROR, m) && side_alive(fn, m, 0) ? m->cpu : NULL;
}

mapping_buffer *mapping_multimirror_gpu(mapping_multimirror *m, int device)
{
    static const char fn[] = "mapping_multimirror_gpu";
    if (!mapping__handle_live(MAPPING_HANDLE_MULTIMIRROR, m) || check_device_index(fn, m, device) != MAPPING_OK ||
        !side_alive(fn, m, device) || call_begin(fn, m) != MAPPING_OK)
        return NULL;
    mapping_buffer *buf = m->buf[device]; /* NULL while evicted */
    call_end(m);
    return buf;
}

static mapping_status collect_writes(const char *fn, mapping_multimirror *m, bool upload);

size_t mapping_multimirror_stale_bytes(const mapping_multimirror *m, int device)
{
    static const char fn[] = "mapping_multimirror_stale_bytes";
    if (check_handle(fn, m) != MAPPING_OK)
        return 0;
    if ((device != -1 && check_device_index(fn, m, device) != MAPPING_OK) ||
        call_begin(fn, (mapping_multimirror *)m) != MAPPING_OK)
        return 0;
    settle((mapping_multimirror *)m, -1, NULL); /* so the answer is exact: state follows completion */
    size_t stale = collect_writes(fn, (mapping_multimirror *)m, false) == MAPPING_OK ? m->stale[1 + device].bytes
                                                                                   : 0; /* recorded */
    call_end((mapping_multimirror *)m);
    return stale;
}

/* ---- marking ---- */

typedef struct conflict_probe {
    const mapping_multimirror *m;
    int                        side;
} conflict_probe;

/* A stale part of the marking side: does another side hold modifications there? */
static bool no_modification_elsewhere(size_t start, size_t end, void *user)
{
    conflict_probe *p = user;
    for (int s = 0; s <= p->m->count; s++)
        if (s != p->side && mapping__span_set_intersects(&p->m->modified[s], start, end))
            return false;
    return true;
}

static mapping_status mark(const char *fn, mapping_multimirror *m, int side, size_t offset, size_t bytes)
{
    mapping_status st = settle(m, -1, NULL); /* a queued copy must not land after the caller's write */
    if (st != MAPPING_OK)
        return st;
    conflict_probe probe = {m, side};
    if (!mapping__span_set_each_in(&m->stale[side], offset, offset + bytes, no_modification_elsewhere, &probe)) {
        mapping_device *dev = m->dev[side > 0 ? side - 1 : 0];
        mapping__count(&dev->counters.conflicts, 1);
        return mapping__fail(MAPPING_ERR_CONFLICT,
                             "%s: [%zu, +%zu) holds modifications of another side that %s has not synced", fn, offset,
                             bytes, side ? "this device side" : "the CPU side");
    }
    /* Reserve first: each add or remove below needs at most one more span,
     * so after this nothing can fail half-way (all sides change, or none). */
    for (int s = 0; s <= m->count; s++)
        if (!mapping__span_set_reserve(&m->stale[s], 1) || !mapping__span_set_reserve(&m->modified[s], 1))
            return oom(fn);
    mapping__span_set_remove(&m->stale[side], offset, offset + bytes);
    mapping__span_set_add(&m->modified[side], offset, offset + bytes);
    for (int s = 0; s <= m->count; s++)
        if (s != side) {
            mapping__span_set_add(&m->stale[s], offset, offset + bytes);
            mapping__span_set_remove(&m->modified[s], offset, offset + bytes);
        }
    return MAPPING_OK;
}

mapping_status mapping_multimirror_mark_cpu_modified(mapping_multimirror *m, size_t offset, size_t bytes)
{
    static const char fn[] = "mapping_multimirror_mark_cpu_modified";
    mapping_status st;
    if ((st = check_handle(fn, m)) || (st = mapping__check_range(fn, "the multimirror", offset, bytes, m->size)) ||
        (st = call_begin(fn, m)))
        return st;
    if ((st = settle(m, -1, NULL)) == MAPPING_OK && (st = collect_writes(fn, m, false)) == MAPPING_OK)
        st = mark(fn, m, 0, offset, bytes);
    call_end(m);
    return st;
}

mapping_status mapping_multimirror_mark_gpu_modified(mapping_multimirror *m, int device, size_t offset, size_t bytes)
{
    static const char fn[] = "mapping_multimirror_mark_gpu_modified";
    mapping_status st;
    if ((st = check_handle(fn, m)) || (st = check_device_index(fn, m, device)) ||
        (st = mapping__check_range(fn, "the multimirror", offset, bytes, m->size)) || (st = call_begin(fn, m)))
        return st;
    if ((st = settle(m, -1, NULL)) == MAPPING_OK && (st = collect_writes(fn, m, false)) == MAPPING_OK)
        st = m->buf[device] ? mark(fn, m, 1 + device, offset, bytes)
                            : mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, /* evicted: no device bytes to mark */
                                            "%s: device side %d is not resident (evicted under its device's memory "
                                            "budget, or by mapping_multimirror_evict): there are no device bytes to "
                                            "mark; sync to it first",
                                            fn, device);
    call_end(m);
    return st;
}

/* ---- write tracking (as MAPPING_MIRROR_TRACK_WRITES, mirror_track.c) ---- */

typedef struct written_pages {
    mapping_multimirror *m;
    mapping_range_list   list; /* written page runs, offsets */
} written_pages;

static void on_written_page(void *user, uintptr_t lo, uintptr_t hi)
{
    written_pages *w = user;
    uintptr_t base = (uintptr_t)w->m->cpu;
    size_t start = lo > base ? lo - base : 0, end = hi - base < w->m->size ? hi - base : w->m->size;
    if (start < end)
        mapping__range_list_push(&w->list, start, end);
}

typedef struct changed_bytes {
    mapping_multimirror *m;
    const char          *fn;
    mapping_status       st;
} changed_bytes;

/* A tracked write to bytes stale on the CPU (another side modified them
 * and the CPU has not synced): a conflict, as a CPU mark there would be,
 * that cannot be refused: counted, and the other side's content wins. */
static void cpu_write_conflicts(changed_bytes *c, size_t start, size_t end)
{
    mapping__count(&c->m->dev[0]->counters.conflicts, 1);
    mapping__log(1, "%s: the CPU wrote [%zu, %zu) of a tracked multimirror, which a device side modified and the CPU "
                    "has not synced (a conflict): the device's bytes win at the next sync to the CPU",
                 c->fn, start, end);
}

/* The program changed [start, end): a CPU mark where the CPU side is valid,
 * a conflict where it is stale. */
static void on_changed(void *user, size_t start, size_t end)
{
    changed_bytes *c = user;
    const mapping_span_set *stale = &c->m->stale[0];
    for (size_t i = mapping__span_set_first_after(stale, start); c->st == MAPPING_OK && start < end; i++) {
        size_t gap_end = i < stale->n && stale->v[i].start < end ? stale->v[i].start : end;
        if (gap_end > start)
            c->st = mark(c->fn, c->m, 0, start, gap_end - start);
        if (gap_end >= end)
            return;
        size_t stale_end = stale->v[i].end < end ? stale->v[i].end : end;
        cpu_write_conflicts(c, gap_end > start ? gap_end : start, stale_end);
        start = stale_end;
    }
}

/* Before every call: the bytes the program changed in the pages written
 * since the last look (upload: before a sync to a device). */
static mapping_status collect_writes(const char *fn, mapping_multimirror *m, bool upload)
{
    if (!m->track)
        return MAPPING_OK;
    written_pages w = {.m = m};
    int rc = mapping_track_collect(m->track, on_written_page, &w, upload);
    changed_bytes c = {m, fn, MAPPING_OK};
    for (size_t i = 0; i < w.list.n && !w.list.oom && c.st == MAPPING_OK; i++)
        mapping_track_shadow_diff(&m->shadow, m->cpu, w.list.v[i].lo, w.list.v[i].hi, mapping_os_page_size(),
                                  on_changed, &c);
    free(w.list.v);
    if (c.st == MAPPING_OK && (rc || w.list.oom))
        c.st = mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: write tracking could not list the written pages", fn);
    return c.st;
}

static mapping_status track_writes(const char *fn, mapping_multimirror *m);

mapping_status mapping_multimirror_track_writes(mapping_multimirror *m)
{
    static const char fn[] = "mapping_multimirror_track_writes";
    mapping_status st;
    if ((st = check_handle(fn, m)) || (st = call_begin(fn, m)))
        return st;
    st = track_writes(fn, m);
    call_end(m);
    return st;
}

static mapping_status track_writes(const char *fn, mapping_multimirror *m)
{
    if (m->track)
        return MAPPING_OK;
    int rc = mapping_track_begin(m->cpu, m->size, &m->track);
    if (rc == 0 && mapping_track_shadow_init(&m->shadow, m->cpu, m->size) != 0) {
        mapping_track_end(m->track);
        m->track = NULL;
        rc = -ENOMEM;
    }
    if (rc == -ENOMEM)
        return oom(fn);
    if (rc == -EINVAL)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: MAPPING_TRACK_STREAMS=\"%s\" is not "
                             MAPPING_TRACK_STREAMS_VALUES, fn, getenv("MAPPING_TRACK_STREAMS"));
    if (rc)
        return mapping__fail(MAPPING_ERR_UNSUPPORTED, "%s: no write tracking for [%p, +%zu) (%s)", fn, (void *)m->cpu,
                             m->size, rc == -EBUSY ? "its pages are tracked already" : mapping_track_reason());
    return MAPPING_OK;
}

/* ---- syncing: each stale part from the cheapest side valid there ---- */

/* A sync to the CPU wrote [start, end) (blocking): the shadow takes it,
 * and the tracker forgets the pages wholly inside it. */
static void copied_to_cpu(mapping_multimirror *m, size_t start, size_t end)
{
    mapping_track_shadow_take(&m->shadow, m->cpu, start, end);
    mapping_track_clear(m->track, (uintptr_t)m->cpu + start, (uintptr_t)m->cpu + end);
}

static double link_cost(const mapping_link *l, size_t bytes)
{
    return l->latency + (double)bytes / (l->bandwidth > 0 ? l->bandwidth : 1e9);
}

/* Seconds to move `bytes` from side `from` to side `to` (one of them may be
 * the CPU, side 0); HUGE for an impossible pair. */
static mapping_status cost(mapping_multimirror *m, int from, int to, size_t bytes, double *out)
{
    mapping_link a, b;
    mapping_status st;
    if (from == 0 || to == 0) { /* the device's link to the host */
        if ((st = mapping__device_link(m->dev[(from ? from : to) - 1], &a)) != MAPPING_OK)
            return st;
        *out = link_cost(&a, bytes);
        return MAPPING_OK;
    }
    mapping_device *src = m->dev[from - 1], *dst = m->dev[to - 1];
    if (mapping__can_copy_peer_direct(src, dst)) {
        mapping_link *l = &m->peer[from - 1][to - 1];
        if (l->bandwidth <= 0 && (st = mapping__peer_link_measure(src, dst, l)) != MAPPING_OK)
            return st;
        *out = link_cost(l, bytes);
        return MAPPING_OK;
    }
    if ((st = mapping__device_link(src, &a)) != MAPPING_OK || (st = mapping__device_link(dst, &b)) != MAPPING_OK)
        return st;
    *out = link_cost(&a, bytes) + link_cost(&b, bytes); /* staged through the host */
    return MAPPING_OK;
}

typedef struct sync_job {
    mapping_multimirror *m;
    mapping_stream      *stream;
    int                  target;
    int                  order[MAX_SIDES]; /* candidate sources, cheapest first */
    int                  n_order;
    int                  at; /* the candidate being tried */
    mapping_status       st;
} sync_job;

static mapping_status copy_part(sync_job *job, int from, size_t start, size_t end)
{
    mapping_multimirror *m = job->m;
    size_t n = end - start;
    if (job->target == 0)
        return mapping__read(NULL, m->buf[from - 1], start, m->cpu + start, n);
    mapping_buffer *dst = m->buf[job->target - 1];
    if (from == 0 && m->track) { /* tracked: from a snapshot the shadow takes now (as mirror_track.c's uploads) */
        mapping_track_shadow_take(&m->shadow, m->cpu, start, end);
        return mapping__write(job->stream, m->shadow.bytes + start, dst, start, n);
    }
    if (from == 0)
        return mapping__write(job->stream, m->cpu + start, dst, start, n);
    return mapping__copy_peer(job->stream, m->buf[from - 1], start, dst, start, n);
}

static bool fill_from_candidates(size_t start, size_t end, void *user);

/* [start, end) is stale on the current candidate: try the next ones. */
static bool try_next(sync_job *job, size_t start, size_t end)
{
    int saved = job->at;
    job->at++;
    bool ok = fill_from_candidates(start, end, job);
    job->at = saved;
    return ok;
}

/* Copies the parts of [start, end) valid on the current candidate from it,
 * and hands the rest to the next candidates. */
static bool fill_from_candidates(size_t start, size_t end, void *user)
{
    sync_job *job = user;
    if (job->at >= job->n_order) {
        job->st = mapping__fail(MAPPING_ERR_INTERNAL, "multimirror: [%zu, %zu) is stale on every side", start, end);
        return false;
    }
    int from = job->order[job->at];
    const mapping_span_set *stale = &job->m->stale[from];
    size_t pos = start;
    for (size_t i = mapping__span_set_first_after(stale, start); i < stale->n && pos < end; i++) {
        const mapping_span *s = &stale->v[i];
        if (s->end <= pos)
            continue;
        if (s->start >= end)
            break;
        if (s->start > pos && (job->st = copy_part(job, from, pos, s->start)) != MAPPING_OK)
            return false;
        size_t stale_end = s->end < end ? s->end : end;
        if (!try_next(job, s->start > pos ? s->start : pos, stale_end))
            return false;
        pos = stale_end;
    }
    if (pos < end && (job->st = copy_part(job, from, pos, end)) != MAPPING_OK)
        return false;
    return true;
}

typedef struct candidate {
    int    side;
    double seconds;
} candidate;

static int by_cost(const void *a, const void *b)
{
    const candidate *x = a, *y = b;
    return (x->seconds > y->seconds) - (x->seconds < y->seconds);
}

static mapping_status record_queued(const char *fn, mapping_multimirror *m, mapping_stream *stream, int target)
{
    if (m->n_queued == m->cap_queued) {
        size_t cap = m->cap_queued ? 2 * m->cap_queued : 4;
        struct queued_sync *q = mapping_os_realloc(m->queued, cap * sizeof *q);
        if (!q)
            return oom(fn);
        m->queued = q;
        m->cap_queued = cap;
    }
    mapping_event *ev;
    mapping_status st = mapping__event_record(stream, &ev);
    if (st != MAPPING_OK)
        return st;
    m->queued[m->n_queued++] = (struct queued_sync){ev, stream, target};
    return MAPPING_OK;
}

static mapping_status make_replica(const char *fn, mapping_multimirror *m, int j);

static mapping_status sync_side(const char *fn, mapping_multimirror *m, mapping_stream *stream, int target)
{
    mapping_span_set *stale = &m->stale[target];
    /* Sources must hold their bytes before a copy reads them: wait for syncs
     * queued elsewhere (those to this side on this stream are ordered). A
     * replica evicted is made again (after the collect, as every call). */
    mapping_status settled = settle(m, target, stream);
    if (settled != MAPPING_OK || (settled = collect_writes(fn, m, target != 0)) != MAPPING_OK ||
        (target && (settled = make_replica(fn, m, target - 1)) != MAPPING_OK))
        return settled;
    if (stale->n == 0)
        return MAPPING_OK;
    /* The spans to fill, copied: the set changes as they are filled. */
    size_t n = stale->n;
    mapping_span *spans = mapping_os_malloc(n * sizeof *spans);
    if (!spans)
        return oom(fn);
    memcpy(spans, stale->v, n * sizeof *spans);
    sync_job job = {.m = m, .stream = stream, .target = target, .st = MAPPING_OK};
    for (size_t k = 0; k < n && job.st == MAPPING_OK; k++) {
        size_t bytes = spans[k].end - spans[k].start;
        candidate c[MAX_SIDES];
        int nc = 0;
        for (int s = 0; s <= m->count && job.st == MAPPING_OK; s++)
            if (s != target && mapping__span_set_bytes_in(&m->stale[s], spans[k].start, spans[k].end) < bytes) {
                c[nc].side = s;
                job.st = cost(m, s, target, bytes, &c[nc].seconds);
                nc++;
            }
        if (job.st != MAPPING_OK)
            break;
        qsort(c, (size_t)nc, sizeof *c, by_cost);
        for (int i = 0; i < nc; i++)
            job.order[i] = c[i].side;
        job.n_order = nc;
        job.at = 0;
        if (fill_from_candidates(spans[k].start, spans[k].end, &job)) {
            if (!mapping__span_set_remove(stale, spans[k].start, spans[k].end))
                job.st = oom(fn);
            else if (target == 0 && m->track) /* blocking: the copy's writes, not the program's */
                copied_to_cpu(m, spans[k].start, spans[k].end);
        }
    }
    free(spans);
    if (stream) { /* also after a failure: what was queued is tracked */
        mapping_status recorded = record_queued(fn, m, stream, target);
        if (job.st == MAPPING_OK)
            job.st = recorded;
    }
    return job.st;
}

/* A multimirror's state would follow a capture into a CUDA graph, not each
 * replay: refused (MAPPING_ERR_UNSUPPORTED) on a capturing stream of device
 * `device`, or (device -1, stream NULL) while any device's blocking stream
 * is captured (its copies from every replica would run on them). */
static mapping_status refuse_capture(const char *fn, const mapping_multimirror *m, mapping_stream *stream, int device)
{
    static const char why[] = "a multimirror's state would follow the capture, not each replay of the graph";
    mapping_status st = MAPPING_OK;
    for (int j = 0; j < m->count && st == MAPPING_OK; j++)
        if ((device < 0 || j == device) && mapping__can_capture(m->dev[j]))
            st = mapping__stream_refuse_capture_why(m->dev[j], stream, fn, why);
    return st;
}

mapping_status mapping_multimirror_sync_to_gpu(mapping_stream *stream, mapping_multimirror *m, int device)
{
    static const char fn[] = "mapping_multimirror_sync_to_gpu";
    mapping_status st;
    if ((st = check_handle(fn, m)) || (st = check_device_index(fn, m, device)) ||
        (st = mapping__check_stream(fn, stream)) || (st = mapping__check_same_device(fn, m->dev[device], stream)) ||
        (st = refuse_capture(fn, m, stream, device)) || (st = call_begin(fn, m)))
        return st;
    st = sync_side(fn, m, stream, 1 + device);
    call_end(m);
    return st;
}

mapping_status mapping_multimirror_sync_to_cpu(mapping_multimirror *m)
{
    static const char fn[] = "mapping_multimirror_sync_to_cpu";
    mapping_status st;
    if ((st = check_handle(fn, m)) || (st = refuse_capture(fn, m, NULL, -1)) || (st = call_begin(fn, m)))
        return st;
    st = sync_side(fn, m, NULL, 0);
    call_end(m);
    return st;
}

/* ---- memory budgets: replicas evicted and made again ---- */

/* Replicas of devices with a budget join it (at creation, and at the first
 * call after a budget was set on a device that had none): the budget may
 * evict them from then on. The lock is held, or the multimirror is not
 * yet known to any other thread. */
static void budget_join(mapping_multimirror *m)
{
    for (int j = 0; j < m->count; j++) {
        struct replica_node *r = &m->rep[j];
        if (r->registered || !atomic_load(&m->dev[j]->budget))
            continue;
        *r = (struct replica_node){.m = m, .j = j, .registered = true};
        r->node.evict = replica_evict_hook;
        atomic_init(&r->node.bytes, m->buf[j] ? m->size : 0);
        mapping__reclaimable_touch(m->dev[j], &r->node);
        mapping__reclaimable_add(m->dev[j], &r->node);
    }
}

static mapping_status call_begin(const char *fn, mapping_multimirror *m)
{
    int rc = pthread_mutex_lock(&m->lock);
    if (rc == EDEADLK)
        return mapping__fail(MAPPING_ERR_BUSY, "%s: a call on the multimirror %p, or its eviction, is under way on "
                                               "this thread (called from a callback of it)", fn, (void *)m);
    if (rc)
        return mapping__fail(MAPPING_ERR_INTERNAL, "%s: the multimirror's lock: error %d", fn, rc);
    atomic_store_explicit(&m->caller, mapping__reclaim_thread_token(), memory_order_relaxed);
    for (int j = 0; j < m->count; j++)
        if (m->rep[j].registered)
            mapping__reclaimable_touch(m->dev[j], &m->rep[j].node);
        else if (atomic_load_explicit(&m->dev[j]->budget, memory_order_relaxed))
            budget_join(m); /* a budget set since the last call */
    return MAPPING_OK;
}

static void call_end(mapping_multimirror *m)
{
    atomic_store_explicit(&m->caller, NULL, memory_order_relaxed);
    pthread_mutex_unlock(&m->lock);
}

/* Whether queued syncs are all complete (then settled): an eviction by the
 * budget never waits for a stream. */
static bool all_settled(mapping_multimirror *m)
{
    for (size_t i = 0; i < m->n_queued; i++)
        if (mapping__event_query(m->queued[i].event) != MAPPING_OK)
            return false;
    return settle(m, -1, NULL) == MAPPING_OK;
}

/* The bytes replica j holds that the CPU does not: stale on the CPU and
 * not on j (malloc'd list; NULL with *n = 0 when none). */
static mapping_span *replica_only(const mapping_multimirror *m, int j, size_t *n_out)
{
    const mapping_span_set *cpu = &m->stale[0], *rj = &m->stale[1 + j];
    mapping_span *v = mapping_os_malloc((cpu->n + rj->n + 1) * sizeof *v);
    size_t n = 0;
    for (size_t i = 0; v && i < cpu->n; i++) {
        size_t pos = cpu->v[i].start, end = cpu->v[i].end;
        for (size_t k = mapping__span_set_first_after(rj, pos); k < rj->n && pos < end; k++) {
            if (rj->v[k].start >= end)
                break;
            if (rj->v[k].start > pos)
                v[n++] = (mapping_span){pos, rj->v[k].start};
            pos = rj->v[k].end;
        }
        if (pos < end)
            v[n++] = (mapping_span){pos, end};
    }
    *n_out = n;
    return v;
}

/* Copies what only replica j holds to the CPU (blocking), which becomes
 * valid there; *back: the bytes. */
static mapping_status write_back(const char *fn, mapping_multimirror *m, int j, size_t *back)
{
    size_t n = 0;
    mapping_span *v = replica_only(m, j, &n);
    mapping_status st = v ? MAPPING_OK : oom(fn);
    for (size_t i = 0; i < n && st == MAPPING_OK; i++) {
        st = mapping__read(NULL, m->buf[j], v[i].start, m->cpu + v[i].start, v[i].end - v[i].start);
        if (st == MAPPING_OK && !mapping__span_set_remove(&m->stale[0], v[i].start, v[i].end))
            st = oom(fn);
        if (st == MAPPING_OK && m->track)
            copied_to_cpu(m, v[i].start, v[i].end);
        if (st == MAPPING_OK)
            *back += v[i].end - v[i].start;
    }
    free(v);
    return st;
}

/* Replica j goes: what only it holds is written back, its modifications
 * become the CPU's (the CPU holds them now; the other sides have not seen
 * them), it is stale everywhere, and its memory returns to the budget.
 * Nothing is queued (the caller settled). */
static mapping_status evict_replica(const char *fn, mapping_multimirror *m, int j, bool explicit_)
{
    mapping_trace_span span = mapping__trace_begin();
    size_t back = 0;
    mapping_status st = collect_writes(fn, m, false);
    if (st == MAPPING_OK)
        st = write_back(fn, m, j, &back);
    mapping_span_set *mod = &m->modified[1 + j];
    for (size_t i = 0; i < mod->n && st == MAPPING_OK; i++)
        if (!mapping__span_set_add(&m->modified[0], mod->v[i].start, mod->v[i].end))
            st = oom(fn);
    if (st == MAPPING_OK && (!mapping__span_set_reserve(&m->stale[1 + j], 1)))
        st = oom(fn);
    MAPPING_TRACE_END(span, .name = "multimirror eviction", .cat = "mirror", .device = m->dev[j],
                      .device_name = m->dev[j]->info.name, .buffer = m->buf[j], .direction = "d2h", .status = st,
                      .args = {{"bytes", m->size}, {"bytes_written_back", back}, {"explicit", explicit_}});
    if (st != MAPPING_OK)
        return st; /* still resident: what was written back is valid on both sides */
    mapping__span_set_free(mod);
    mapping__span_set_add(&m->stale[1 + j], 0, m->size);
    atomic_store(&m->rep[j].node.bytes, 0);
    mapping__free_gpu(m->buf[j]);
    m->buf[j] = NULL;
    mapping__count(&m->dev[j]->counters.evictions, 1);
    mapping__count(&m->dev[j]->counters.evict_writeback_bytes, back);
    return MAPPING_OK;
}

static mapping_evict_result replica_evict_hook(mapping_reclaimable *node)
{
    struct replica_node *r = (struct replica_node *)node;
    mapping_multimirror *m = r->m;
    if (pthread_mutex_trylock(&m->lock) != 0) /* in a call: on another thread, or the allocation's own */
        return atomic_load_explicit(&m->caller, memory_order_relaxed) == mapping__reclaim_thread_token()
                   ? MAPPING_EVICT_REFUSED
                   : MAPPING_EVICT_IN_USE;
    mapping_error_mark before;
    mapping__error_mark(&before);
    bool done = m->buf[r->j] && all_settled(m) &&
                evict_replica("multimirror eviction (memory budget)", m, r->j, false) == MAPPING_OK;
    mapping__error_forget(&before); /* not the caller's error: the budget tries another */
    pthread_mutex_unlock(&m->lock);
    return done ? MAPPING_EVICT_DONE : MAPPING_EVICT_REFUSED;
}

/* Replica j after an eviction: a buffer again, stale everywhere (the sync
 * that asks fills it). */
static mapping_status make_replica(const char *fn, mapping_multimirror *m, int j)
{
    if (m->buf[j])
        return MAPPING_OK;
    mapping_status st = mapping__allocate_gpu_counted(fn, m->dev[j], m->size, &m->buf[j]);
    if (st != MAPPING_OK)
        return st; /* nothing changed */
    m->buf[j]->owner = "multimirror";
    atomic_store(&m->rep[j].node.bytes, m->size);
    return MAPPING_OK;
}

/* At creation, the multimirror whole: its lock, and the replicas of
 * devices with a budget join it. */
static void budget_begin(mapping_multimirror *m)
{
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ERRORCHECK);
    pthread_mutex_init(&m->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    budget_join(m);
}

/* At destroy: off the devices' lists, after an eviction running elsewhere. */
static void budget_leave(mapping_multimirror *m)
{
    pthread_mutex_lock(&m->lock);
    for (int j = 0; j < m->count; j++)
        if (m->rep[j].registered && mapping__device_alive(m->dev[j], m->dev_serial[j]))
            mapping__reclaimable_remove(m->dev[j], &m->rep[j].node);
    pthread_mutex_unlock(&m->lock);
    pthread_mutex_destroy(&m->lock);
}

mapping_status mapping_multimirror_evict(mapping_multimirror *m, int device)
{
    static const char fn[] = "mapping_multimirror_evict";
    mapping_status st;
    if ((st = check_handle(fn, m)) || (st = check_device_index(fn, m, device)) || (st = call_begin(fn, m)))
        return st;
    if ((st = settle(m, -1, NULL)) == MAPPING_OK) /* ordered after its queued syncs */
        st = m->buf[device] ? evict_replica(fn, m, device, true) : collect_writes(fn, m, false);
    call_end(m);
    return st;
}

int mapping_multimirror_is_resident(const mapping_multimirror *m, int device)
{
    static const char fn[] = "mapping_multimirror_is_resident";
    if (check_handle(fn, m) != MAPPING_OK || check_device_index(fn, m, device) != MAPPING_OK)
        return 0;
    mapping_multimirror *mm = (mapping_multimirror *)m;
    if (call_begin(fn, mm) != MAPPING_OK)
        return 0;
    int resident = mm->buf[device] != NULL;
    call_end(mm);
    return resident;
}
