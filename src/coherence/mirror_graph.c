/*
 * Mirror syncs recorded in a CUDA graph (docs/cuda.md, "Mirror syncs in
 * CUDA graphs"): a sync called on a stream being captured records three
 * nodes, and each replay of the graph runs them in order:
 *   plan    a host node: the view's bytes stale on the target side at this
 *           replay (stale minus pending, the mark log applied first) go into
 *           a table in page-locked host memory, large ranges cut in pieces so
 *           the device's warps share them; more ranges than the table holds
 *           are joined over gaps valid on both sides, and what still does
 *           not fit stays stale (counted: graph_sync_overflows);
 *   copy    the back end's table copy (mapping__copy_table: a kernel that
 *           reads the count and the ranges when it runs, zero-copy between
 *           the device buffer and the page-locked CPU side);
 *   commit  a host node: the ranges copied become valid (the state follows
 *           the replay, not the capture), and the statistics count them.
 * Host nodes run on a driver thread: they touch host memory only (the
 * family's sets, the table), never the driver; the program must not call on
 * the family while a replay runs (the mirror belongs to the graph then).
 *
 * Lifetimes: a recorded sync (a graph_node) holds its family (a count in
 * st->refs, as a handle does), and is tied to the graph by the back end
 * (mapping__graph_retain, a CUDA user object): destroying the mirror while
 * the graph exists leaves the family to the graph, and the graph's end
 * releases the node. That happens on a driver thread, which may not free
 * driver memory, so the node is put on a list and freed by the next call
 * that reaps it (a recorded sync, mapping_mirror_create, _destroy).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "coherence/mirror_api.h"
#include "coherence/mirror_copy.h"
#include "coherence/mirror_mark_log.h"
#include "coherence/mirror_plan.h"

/* The table's entries unless the caller asks (max_ranges 0), and at most
 * (the back end's grid: a warp per entry, 65535 blocks of 8 warps). */
enum { GRAPH_TABLE_DEFAULT = 4096, GRAPH_TABLE_MAX = 65535 * 8 };
/* Pieces of a cut range are at least this large. */
#define GRAPH_PIECE_MIN ((size_t)64 << 10)

typedef struct graph_node {
    mirror_state   *st; /* held: counted in st->refs */
    mapping_device *dev;
    uint64_t        dev_serial;
    size_t          lo, hi; /* the view, family offsets */
    int             t;      /* the target side */
    bool            broken; /* recording failed part-way: its nodes do nothing */
    size_t          capacity;
    uint64_t       *table; /* page-locked: count, reserved, capacity x {offset, bytes} */
    /* One replay's plan, from the plan node to the commit node: the ranges
     * copied (sorted, disjoint), which become valid. */
    mapping_range     *list;
    size_t             n, cap;
    bool               overflow;
    struct graph_node *next_released;
} graph_node;

/* ---- at replay: the plan node ---- */

/* Appends [a, b) to the plan's list; false when out of memory. */
static bool list_push(graph_node *g, size_t a, size_t b)
{
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 64;
        mapping_range *v = mapping_os_realloc(g->list, cap * sizeof *v);
        if (!v)
            return false;
        g->list = v;
        g->cap = cap;
    }
    g->list[g->n++] = (mapping_range){a, b};
    return true;
}

/* The view's ranges stale on the target and not already queued by a sync
 * outside the graph; false when they did not all fit in memory. */
static bool collect_stale(graph_node *g)
{
    const mapping_range_set *stale = &g->st->stale[g->t], *pend = &g->st->pending[g->t];
    mapping_rs_cursor c, p;
    mapping_range r, q;
    for (bool ok = mapping__rs_seek(stale, g->lo, &c, &r); ok && r.lo < g->hi; ok = mapping__rs_next(&c, &r)) {
        size_t a = r.lo > g->lo ? r.lo : g->lo, b = r.hi < g->hi ? r.hi : g->hi;
        for (bool okp = mapping__rs_seek(pend, a, &p, &q); okp && q.lo < b && a < b; okp = mapping__rs_next(&p, &q)) {
            if (q.lo > a && !list_push(g, a, q.lo))
                return false;
            a = q.hi;
        }
        if (a < b && !list_push(g, a, b))
            return false;
    }
    return true;
}

/* More ranges than the table holds: joined over ever wider gaps valid on
 * the source (only bytes valid on both sides are copied as well, and only
 * as many as needed); what still does not fit stays stale. Returns the
 * piece size for the rest: the entries left are shared out. */
static size_t fit(graph_node *g)
{
    size_t limit = MIRROR_BATCH_MERGE_GAP, span = g->hi - g->lo;
    while (g->n > g->capacity) {
        size_t k = 0;
        for (size_t i = 0, hi; i < g->n; k++) {
            size_t next = mapping__mirror_merge_run(g->st, 1 - g->t, g->list, g->n, i, limit, &hi);
            g->list[k] = (mapping_range){g->list[i].lo, hi};
            i = next;
        }
        g->n = k;
        if (limit > span)
            break; /* every gap valid on the source is joined */
        limit = limit > span / 4 ? span + 1 : limit * 4;
    }
    if (g->n > g->capacity) {
        g->overflow = true;
        g->n = g->capacity;
    }
    size_t moved = 0;
    for (size_t i = 0; i < g->n; i++)
        moved += g->list[i].hi - g->list[i].lo;
    if (g->n >= g->capacity)
        return SIZE_MAX; /* a range per entry */
    size_t piece = (moved + (g->capacity - g->n) - 1) / (g->capacity - g->n);
    return piece > GRAPH_PIECE_MIN ? piece : GRAPH_PIECE_MIN;
}

/* The list into the table, each range in pieces of at most `piece` bytes:
 * at most n + moved / piece <= capacity entries (fit). Were a range cut
 * short, it and the rest would not be committed (they stay stale). */
static void write_table(graph_node *g, size_t piece)
{
    uint64_t *e = g->table + 2;
    size_t k = 0;
    for (size_t i = 0; i < g->n; i++) {
        size_t a = g->list[i].lo;
        for (; a < g->list[i].hi && k < g->capacity; k++) {
            size_t take = g->list[i].hi - a < piece ? g->list[i].hi - a : piece;
            e[2 * k] = a;
            e[2 * k + 1] = take;
            a += take;
        }
        if (a < g->list[i].hi) {
            g->n = i;
            g->overflow = true;
        }
    }
    atomic_store_explicit((_Atomic uint64_t *)&g->table[0], k, memory_order_release);
}

static void plan_node(void *user)
{
    graph_node *g = user;
    g->n = 0;
    g->overflow = false;
    g->table[0] = 0; /* nothing moves unless planned */
    if (g->broken || mapping__mirror_log_flush(g->st) != MAPPING_OK)
        return; /* out of memory: the bytes stay stale (the next sync moves them) */
    if (!collect_stale(g))
        g->overflow = true; /* out of memory: what was listed moves, the rest stays stale */
    write_table(g, fit(g));
}

/* ---- at replay: the commit node ---- */

static void commit_node(void *user)
{
    graph_node *g = user;
    mirror_state *st = g->st;
    if (g->broken)
        return;
    uint64_t payload = 0, moved = 0;
    for (size_t i = 0; i < g->n; i++) {
        payload += mapping__rs_bytes_in(&st->stale[g->t], g->list[i].lo, g->list[i].hi);
        moved += g->list[i].hi - g->list[i].lo;
    }
    /* Out of memory leaves them stale: moved again by the next sync. */
    mapping__mirror_apply_valid(st, g->t, g->list, g->n);
    mapping_counters *c = &st->dev->counters;
    bool up = g->t == MIRROR_GPU;
    mapping__count(up ? &c->h2d_bytes : &c->d2h_bytes, moved);
    mapping__count(up ? &c->h2d_copies : &c->d2h_copies, moved != 0);
    mapping__count(up ? &c->h2d_payload_bytes : &c->d2h_payload_bytes, payload);
    mapping__count(&c->sync_skipped_bytes, (g->hi - g->lo) - (moved < g->hi - g->lo ? moved : g->hi - g->lo));
    mapping__count(&c->graph_sync_runs, 1);
    mapping__count(&c->graph_sync_overflows, g->overflow);
}

/* ---- lifetimes ---- */

static pthread_mutex_t released_lock = PTHREAD_MUTEX_INITIALIZER;
static graph_node     *released; /* nodes whose graphs are gone, to be freed */

/* The graph and its executables are gone (a driver thread: no driver call). */
static void node_released(void *user)
{
    graph_node *g = user;
    pthread_mutex_lock(&released_lock);
    g->next_released = released;
    released = g;
    pthread_mutex_unlock(&released_lock);
}

/* Frees a node and lets go of its family (which goes with its last hold). */
static void node_free(graph_node *g)
{
    if (g->table && mapping__device_alive(g->dev, g->dev_serial))
        mapping__free_cpu(g->dev, g->table); /* a closed device took it */
    free(g->list);
    if (g->st) {
        g->st->graphs--;
        mapping__mirror_family_release(g->st);
    }
    free(g);
}

static void reap(void)
{
    pthread_mutex_lock(&released_lock);
    graph_node *list = released;
    released = NULL;
    pthread_mutex_unlock(&released_lock);
    while (list) {
        graph_node *next = list->next_released;
        node_free(list);
        list = next;
    }
}

/* ---- at capture ---- */

/* What a graph sync cannot do with this family. */
static mapping_status refuse_family(const char *fn, const mirror_state *st)
{
    if (st->unified)
        return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                             "%s: a unified mirror in a CUDA graph: its two sides are one memory (nothing to copy), "
                             "and a prefetch is no graph node here; leave the sync out of the graph",
                             fn);
    if (st->n_features)
        return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                             "%s: a mirror with %s cannot sync in a CUDA graph: the feature's work (finding the CPU's "
                             "writes, the device diff's shadow, the unmarked-write check) runs in the program's calls "
                             "and cannot run in a graph's host node; mark explicitly, and sync a mirror without it",
                             fn, st->features[0]->name);
    if (!st->owns_cpu && !st->pinned && !mapping__host_locked_elsewhere(st->dev, st->cpu, st->size))
        return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                             "%s: the mirror's CPU side is pageable memory: a replay copies it directly, so it must "
                             "be page-locked (mapping_mirror_create, mapping_mirror_wrap with MAPPING_MIRROR_PIN, or "
                             "memory pinned by CUDA or torch)",
                             fn);
    return MAPPING_OK;
}

/* The node, its table and its plan's list; holds the family. */
static mapping_status node_new(const char *fn, mapping_mirror *m, int t, size_t capacity, graph_node **out)
{
    mirror_state *st = m->st;
    graph_node *g = mapping_os_calloc(1, sizeof *g);
    mapping_status status;
    if (!g || !(g->list = mapping_os_malloc(capacity * sizeof *g->list))) {
        free(g);
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    }
    if ((status = mapping__allocate_cpu(st->dev, (capacity + 1) * 2 * sizeof(uint64_t), (void **)&g->table))) {
        free(g->list);
        free(g);
        return status;
    }
    g->table[0] = 0;
    g->cap = g->capacity = capacity;
    g->dev = st->dev;
    g->dev_serial = st->dev_serial;
    g->lo = m->offset;
    g->hi = m->offset + m->size;
    g->t = t;
    *out = g;
    return MAPPING_OK;
}

/* The three nodes; the node is the graph's already (whatever fails, its
 * nodes then do nothing). */
static mapping_status record(mapping_stream *stream, graph_node *g)
{
    mirror_state *st = g->st;
    mapping_status status;
    if ((status = mapping__launch_host_internal(stream, plan_node, g)) ||
        (status = mapping__copy_table(stream, g->table, g->capacity, st->cpu, st->gpu, st->gpu_base,
                                      g->t == MIRROR_CPU)) ||
        (status = mapping__launch_host_internal(stream, commit_node, g)))
        g->broken = true;
    return status;
}

mapping_status mapping__mirror_graph_sync(const char *fn, mapping_stream *stream, mapping_mirror *m, int t,
                                          size_t max_ranges)
{
    mirror_state *st = m->st;
    mapping_status status;
    reap();
    if (!mapping__can_graph_copy(st->dev))
        return mapping__fail(MAPPING_ERR_UNSUPPORTED, "%s: the %s back end cannot replay mirror syncs in graphs", fn,
                             st->dev->be->name);
    if ((status = refuse_family(fn, st)) || (status = mapping__mirror_check_cpu_writable(st, t)))
        return status;
    /* Copies queued outside the graph on these bytes are waited for now: the
     * graph cannot wait for them (an event outside the capture). */
    if (st->queue.n && (status = mapping__mirror_order(st, NULL, m->offset, m->offset + m->size, MIRROR_ACCESS)))
        return status;
    graph_node *g = NULL;
    if ((status = node_new(fn, m, t, max_ranges ? max_ranges : GRAPH_TABLE_DEFAULT, &g)))
        return status;
    if ((status = mapping__graph_retain(stream, node_released, g))) {
        node_free(g);
        return status;
    }
    g->st = st; /* the graph's now: it holds the family (and its device side: never evicted meanwhile) */
    st->refs++;
    st->graphs++;
    atomic_store_explicit(&mapping__mirror_reaper, reap, memory_order_release);
    return record(stream, g);
}

/* ---- the public call ---- */

mapping_status mapping_mirror_sync_in_graph(mapping_stream *stream, mapping_mirror *m, mapping_side to,
                                            size_t max_ranges)
{
    static const char fn[] = "mapping_mirror_sync_in_graph";
    mapping_status status;
    if ((status = mapping__mirror_check(fn, m)) || (status = mapping__check_stream(fn, stream)) ||
        (status = mapping__check_same_device(fn, m->st->dev, stream)))
        return status;
    if (to != MAPPING_CPU && to != MAPPING_GPU)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: to must be MAPPING_CPU or MAPPING_GPU (got %d)", fn,
                             (int)to);
    if (max_ranges > GRAPH_TABLE_MAX)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: max_ranges %zu is above %d", fn, max_ranges,
                             GRAPH_TABLE_MAX);
    if (!stream)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: stream is NULL: a sync in a graph is recorded on the stream being captured", fn);
    int capture = MAPPING_CAPTURE_NONE;
    if (!mapping__can_capture(m->st->dev) || !mapping__can_graph_copy(m->st->dev))
        return mapping__fail(MAPPING_ERR_UNSUPPORTED, "%s: the %s back end has no graphs to record a sync in", fn,
                             m->st->dev->be->name);
    if ((status = mapping__stream_capture_status(m->st->dev, stream, &capture, NULL)))
        return status;
    if (capture == MAPPING_CAPTURE_NONE)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: stream %p is not being captured into a CUDA graph (begin the capture first; outside "
                             "a capture, use mapping_mirror_sync_to_gpu / _to_cpu)",
                             fn, (void *)stream);
    if (capture != MAPPING_CAPTURE_ACTIVE)
        return mapping__stream_refuse_capture(m->st->dev, stream, fn);
    return mapping__mirror_graph_sync(fn, stream, m, to == MAPPING_GPU ? MIRROR_GPU : MIRROR_CPU, max_ranges);
}
