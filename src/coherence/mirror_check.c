/*
 * MAPPING_CHECK=unmarked: catch host writes that were never marked (see
 * mirror_observe.h). Per family, one hash per 4 KiB page of the CPU side,
 * taken after each sync over the pages valid on the CPU; before a sync to
 * the GPU, a page that holds no marked (GPU-stale) byte and is valid on the
 * CPU must hash the same. A page that also holds marked bytes is not checked
 * (its marked bytes may change); the check therefore finds every unmarked
 * write to a page that has no mark. Kept beside the mirror state, in a
 * table of its own, so the mirror code carries only the hook calls.
 *
 * Where the process tracks writes with userfaultfd (track/write_track.h; not
 * with mprotect, which would make system calls writing the memory fail),
 * the family's CPU side is also watched: the pages written since their last
 * hash are the evidence, and only those are hashed again at a check. A
 * check then costs a page-table scan (none when the process took no page
 * fault) and a hash per written page, not a hash of the whole view. Pages
 * the tracker cannot see written (a device's DMA into page-locked memory,
 * which only the library's own copies do) are hashed again after those
 * copies, as before. A tracked mirror (MAPPING_MIRROR_TRACK_WRITES) needs
 * no watch of its own: its written pages become marks, never unmarked.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "coherence/mirror_features.h"
#include "track/write_track.h"

enum { CHECK_PAGE = 4096 };

typedef struct family_hashes {
    const mirror_state *st;
    size_t              pages;
    uint64_t           *hash;
    unsigned char      *known; /* 1: hash[p] is the page's content at the last sync */
    mapping_track_region   *watch;   /* uffd: the CPU side's writes; NULL: hash every page */
    unsigned char      *written; /* watch: 1 if the page was written since it was hashed */
} family_hashes;

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static family_hashes  *table;
static size_t          table_count, table_cap;

/* MAPPING_CHECK, read once: 0 not read yet, 1 no check, 2 unmarked, 3 a
 * value that is no check (every sync to the GPU then fails, saying so). */
static _Atomic int mapping__mirror_check_mode;

static void read_environment(void)
{
    /* A comma-separated list: "unmarked" is this check; "races" is
     * track/race_guard.c's; anything else is refused (mode 3). */
    const char *v = getenv("MAPPING_CHECK");
    int mode = 1;
    for (const char *p = v; p && *p;) {
        size_t n = strcspn(p, ",");
        if (n == 8 && strncmp(p, "unmarked", 8) == 0)
            mode = mode == 3 ? 3 : 2;
        else if (!(n == 5 && strncmp(p, "races", 5) == 0))
            mode = 3;
        p += n + (p[n] == ',');
    }
    atomic_store_explicit(&mapping__mirror_check_mode, mode, memory_order_relaxed);
}

/* The check's mode, from MAPPING_CHECK read the first time. */
static int check_mode(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, read_environment);
    return atomic_load_explicit(&mapping__mirror_check_mode, memory_order_relaxed);
}

/* 64-bit words, multiply-xorshift: several GB/s, and any change of a byte
 * changes the hash with overwhelming probability. */
static uint64_t page_hash(const unsigned char *p, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15u ^ n, w;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdu;
        h ^= h >> 32;
    }
    for (; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3u;
    return h ^ (h >> 29);
}

/* The family's table entry, made on first use; NULL when out of memory.
 * Lock held. */
static family_hashes *entry_of(const mirror_state *st)
{
    for (size_t i = 0; i < table_count; i++)
        if (table[i].st == st)
            return &table[i];
    if (table_count == table_cap) {
        size_t cap = table_cap ? 2 * table_cap : 8;
        family_hashes *v = mapping_os_realloc(table, cap * sizeof *v);
        if (!v)
            return NULL;
        table = v;
        table_cap = cap;
    }
    size_t pages = (st->size + CHECK_PAGE - 1) / CHECK_PAGE;
    family_hashes e = {st, pages, mapping_os_calloc(pages ? pages : 1, sizeof(uint64_t)), mapping_os_calloc(pages ? pages : 1, 1),
                       NULL, NULL};
    if (!e.hash || !e.known) {
        free(e.hash);
        free(e.known);
        return NULL;
    }
    /* The watch starts before the first hashes are taken: a write between
     * the two is seen. Without it (no uffd, memory shared with another
     * tracked region, out of memory) every page is hashed. */
    if (!st->track && mapping_track_kind_get() == MAPPING_TRACK_KIND_UFFD &&
        (e.written = mapping_os_calloc(pages ? pages : 1, 1)) != NULL &&
        mapping_track_begin(st->cpu, st->size, &e.watch) != 0) {
        free(e.written);
        e.written = NULL;
        e.watch = NULL;
    }
    table[table_count] = e;
    return &table[table_count++];
}

static size_t page_bytes(const mirror_state *st, size_t page)
{
    size_t lo = page * CHECK_PAGE;
    return st->size - lo < CHECK_PAGE ? st->size - lo : CHECK_PAGE;
}

/* Is the CPU side's content of the page what the last sync left, except
 * where it was marked? Only pages that are valid on the CPU and hold no
 * GPU-stale byte can be judged. */
static bool page_judged(const mirror_state *st, size_t lo, size_t hi)
{
    return !mapping__rs_intersects(&st->stale[MIRROR_GPU], lo, hi) &&
           !mapping__rs_intersects(&st->stale[MIRROR_CPU], lo, hi) &&
           !mapping__rs_intersects(&st->pending[MIRROR_CPU], lo, hi);
}

typedef struct watch_pass {
    family_hashes *e;
    uintptr_t      base;
    size_t         size;
} watch_pass;

/* Written OS pages [plo, phi) -> the check pages they meet. */
static void on_watched_write(void *user, uintptr_t plo, uintptr_t phi)
{
    watch_pass *w = user;
    size_t lo = plo > w->base ? plo - w->base : 0, hi = phi - w->base < w->size ? phi - w->base : w->size;
    for (size_t p = lo / CHECK_PAGE; p * CHECK_PAGE < hi && p < w->e->pages; p++)
        w->e->written[p] = 1;
}

/* Pages written since the last look join e->written; on failure the watch
 * is dropped and every page counts as written (hashed). Lock held. */
static void collect_watch(mirror_state *st, family_hashes *e)
{
    watch_pass w = {e, (uintptr_t)st->cpu, st->size};
    if (e->watch && mapping_track_collect(e->watch, on_watched_write, &w, false) != 0) {
        mapping_track_end(e->watch);
        e->watch = NULL;
        free(e->written);
        e->written = NULL;
    }
}

static mapping_status check_pages(const char *fn, mirror_state *st, size_t lo, size_t hi)
{
    if (atomic_load_explicit(&mapping__mirror_check_mode, memory_order_relaxed) == 3)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: MAPPING_CHECK=%s is not a check (the checks are "
                             "MAPPING_CHECK=unmarked and races, comma-separated)", fn, getenv("MAPPING_CHECK") ? getenv("MAPPING_CHECK") : "");
    if (st->unified)
        return MAPPING_OK;
    pthread_mutex_lock(&table_lock);
    family_hashes *e = entry_of(st);
    size_t first_bad = SIZE_MAX, last_bad = 0, bad = 0;
    if (e)
        collect_watch(st, e);
    for (size_t p = lo / CHECK_PAGE; e && p * CHECK_PAGE < hi; p++) {
        size_t a = p * CHECK_PAGE, n = page_bytes(st, p);
        if (!e->known[p] || (e->written && !e->written[p]) || !page_judged(st, a, a + n) ||
            page_hash(st->cpu + a, n) == e->hash[p])
            continue;
        if (first_bad == SIZE_MAX)
            first_bad = p;
        last_bad = p;
        bad++;
    }
    pthread_mutex_unlock(&table_lock);
    if (!bad)
        return MAPPING_OK;
    size_t end = last_bad * CHECK_PAGE + page_bytes(st, last_bad);
    return mapping__fail(MAPPING_ERR_CONFLICT,
                         "%s: MAPPING_CHECK=unmarked: host bytes changed without a mark since the last sync in %zu "
                         "page(s) of 4 KiB, pages %zu to %zu (bytes %zu to %zu of the mirror family); mark them with "
                         "mapping_mirror_mark_cpu_modified, or they are never copied",
                         fn, bad, first_bad, last_bad, first_bad * CHECK_PAGE, end);
}

static void check_snapshot(mirror_state *st, size_t lo, size_t hi)
{
    if (st->unified || atomic_load_explicit(&mapping__mirror_check_mode, memory_order_relaxed) != 2)
        return;
    pthread_mutex_lock(&table_lock);
    family_hashes *e = entry_of(st);
    if (e)
        collect_watch(st, e); /* writes so far count before the new hashes */
    for (size_t p = lo / CHECK_PAGE; e && p * CHECK_PAGE < hi; p++) {
        size_t a = p * CHECK_PAGE, n = page_bytes(st, p);
        e->known[p] = !mapping__rs_intersects(&st->stale[MIRROR_CPU], a, a + n) &&
                      !mapping__rs_intersects(&st->pending[MIRROR_CPU], a, a + n);
        if (e->known[p])
            e->hash[p] = page_hash(st->cpu + a, n);
        if (e->written && e->known[p])
            e->written[p] = 0;
    }
    pthread_mutex_unlock(&table_lock);
}

static void check_forget(const mirror_state *st)
{
    if (atomic_load_explicit(&mapping__mirror_check_mode, memory_order_relaxed) != 2)
        return;
    pthread_mutex_lock(&table_lock);
    for (size_t i = 0; i < table_count; i++)
        if (table[i].st == st) {
            mapping_track_end(table[i].watch);
            free(table[i].written);
            free(table[i].hash);
            free(table[i].known);
            table[i] = table[--table_count];
            break;
        }
    if (table_count == 0) {
        free(table);
        table = NULL;
        table_cap = 0;
    }
    pthread_mutex_unlock(&table_lock);
}

/* ---- the feature ---- */

/* Before a sync to the GPU: host bytes changed without a mark are an error. */
static mapping_status check_before_sync(const char *fn, mapping_stream *stream, mirror_state *st, int t, size_t lo,
                                        size_t hi)
{
    (void)stream;
    return t == MIRROR_GPU ? check_pages(fn, st, lo, hi) : MAPPING_OK;
}

static void check_end(mirror_state *st, bool device_closed)
{
    (void)device_closed;
    check_forget(st);
}

static void check_synced(mapping_stream *stream, mirror_state *st, int t, size_t lo, size_t hi, size_t moved)
{
    (void)stream, (void)t, (void)moved;
    check_snapshot(st, lo, hi);
}

static const mirror_feature check_feature = {
    .name = "MAPPING_CHECK=unmarked",
    .stages = MIRROR_STAGES_TO_CPU | MIRROR_STAGES_TO_GPU,
    .before_sync = check_before_sync,
    .synced = check_synced,
    .end = check_end,
};

void mapping__mirror_check_begin(mirror_state *st)
{
    int mode = check_mode();
    if (mode == 2 || mode == 3)
        mapping__mirror_add_feature(st, &check_feature);
}
