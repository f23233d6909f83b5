/*
 * The mark log: a mark that needs no check against the other side (nothing
 * of it modified, nothing queued) appends its range to an array instead of
 * updating three B+ trees. The next reader of the sets (a sync, a stale-bytes
 * query, a mark of the other side, a fold of a completed copy) applies the
 * log once: sorted (radix), merged, then added to the trees in one pass each
 * (a rebuild when the log is a large part of a tree). Marks of one side are
 * unions and differences with the same ranges, so their order does not
 * matter; every operation of the other kind flushes the log first, so the
 * state is what marking one by one would have made.
 *
 * A long log is compacted, not applied: each time it doubles (from
 * MIRROR_LOG_MIN_COMPACT marks on), its new part is sorted and merged into the part
 * already sorted, so marking the same ranges again and again keeps it as
 * small as the ranges it names. The trees see it only when something reads
 * them: one rebuild each, not one per compaction. While the trees have
 * ranges and the log is much longer than they are, it is applied instead
 * (as before compactions existed): a log of ranges inside the trees' ranges
 * would otherwise hold memory the sets do not.
 */
#include <stdlib.h>
#include <string.h>
#include "coherence/mirror_mark_log.h"

/* The log is compacted once it holds MIRROR_LOG_MIN_COMPACT marks
 * (mirror_mark_log.h: 131,072; 65,536 sorted twice as often for no gain)
 * and twice the ranges it held sorted after the last compaction (a mark
 * then costs O(1) amortised sorting and merging). It is applied instead
 * when the trees are not empty and the log holds more than four times
 * their ranges. */

static bool log_grow(mirror_state *st)
{
    size_t cap = st->log.cap ? 2 * st->log.cap : 256;
    mapping_range *v = mapping_os_realloc(st->log.v, cap * sizeof *v);
    if (!v)
        return false;
    st->log.v = v;
    st->log.cap = cap;
    free(st->log.scratch); /* made again at the size of the log by the next sort that needs it */
    st->log.scratch = NULL;
    return true;
}

/* mapping__mirror_log_append's rest (mirror_mark_log.h has the common
 * cases inline): a mark that starts below the previous one it touches, a
 * compaction or an application that is due, a log that must grow. */
bool mapping__mirror_log_append_slow(mirror_state *st, int x, size_t lo, size_t hi)
{
    if (st->log.n) {
        mapping_range *last = &st->log.v[st->log.n - 1];
        if (lo <= last->hi && hi >= last->lo) { /* touches the previous mark: one range */
            if (lo < last->lo) { /* it may now touch the one before */
                last->lo = lo;
                st->log.unsorted = true;
                if (st->log.sorted == st->log.n)
                    st->log.sorted--; /* the sorted part ends before it now */
            }
            if (hi > last->hi)
                last->hi = hi;
            return true;
        }
        if (st->log.n >= MIRROR_LOG_MIN_COMPACT && st->log.n >= 2 * st->log.sorted) {
            size_t ranges = st->modified[x].count;
            if (ranges && st->log.n > 4 * ranges) {
                if (mapping__mirror_log_apply(st) != MAPPING_OK)
                    return false;
            } else if (mapping__mirror_log_sort(st) != MAPPING_OK) { /* the compaction */
                return false;
            }
        }
    }
    if (st->log.n == st->log.cap && !log_grow(st))
        return false;
    if (st->log.n && lo < st->log.v[st->log.n - 1].lo)
        st->log.unsorted = true;
    else if (!st->log.n) {
        st->log.unsorted = false;
        st->log.sorted = 0;
    }
    st->log.v[st->log.n++] = (mapping_range){lo, hi};
    st->log.side = x;
    return true;
}

void mapping__mirror_log_free(mirror_state *st)
{
    free(st->log.v);
    free(st->log.scratch);
    st->log.v = st->log.scratch = NULL;
    st->log.n = st->log.cap = st->log.sorted = 0;
}

static void insertion_sort(mapping_range *v, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        mapping_range x = v[i];
        size_t j = i;
        for (; j > 0 && v[j - 1].lo > x.lo; j--)
            v[j] = v[j - 1];
        v[j] = x;
    }
}

/* Appends x to the ranges being joined: *cur is the one growing, out[0, *m)
 * the finished ones. Without branches on the data: two sorted runs of
 * random ranges interleave unpredictably, and a mispredicted branch per
 * range would cost more than the rest of the merge. */
static inline void join_one(mapping_range *out, size_t *m, mapping_range *cur, mapping_range x)
{
    bool apart = x.lo > cur->hi;
    out[*m] = *cur; /* final if x starts another range */
    *m += apart;
    cur->lo = apart ? x.lo : cur->lo;
    cur->hi = apart || x.hi > cur->hi ? x.hi : cur->hi;
}

/* Merges the ranges of v[0, n) (sorted by lo) that overlap or touch, in
 * place; returns how many are left. */
static size_t join_sorted(mapping_range *v, size_t n)
{
    if (!n)
        return 0;
    size_t m = 0;
    mapping_range cur = v[0];
    for (size_t i = 1; i < n; i++)
        join_one(v, &m, &cur, v[i]);
    v[m++] = cur;
    return m;
}

/* Merges the sorted runs a[0, p) and b[0, k) (p, k > 0) into out, joining
 * what overlaps or touches; returns the ranges in out. */
static size_t merge_sorted(const mapping_range *a, size_t p, const mapping_range *b, size_t k, mapping_range *out)
{
    size_t i = 0, j = 0, m = 0;
    mapping_range cur = a[0].lo <= b[0].lo ? a[i++] : b[j++];
    while (i < p && j < k) {
        bool from_a = a[i].lo <= b[j].lo;
        mapping_range x = *(from_a ? &a[i] : &b[j]);
        i += from_a;
        j += !from_a;
        join_one(out, &m, &cur, x);
    }
    for (; i < p; i++)
        join_one(out, &m, &cur, a[i]);
    for (; j < k; j++)
        join_one(out, &m, &cur, b[j]);
    out[m++] = cur;
    return m;
}

/* Sorts and merges the log: its unsorted tail (from log_sorted, the part a
 * compaction left sorted and merged) is sorted, then merged with that part.
 * The result is st->log.v[0, st->log.n), sorted, disjoint and not touching
 * (the log and its scratch may swap). Out of memory: nothing changes. */
mapping_status mapping__mirror_log_sort(mirror_state *st)
{
    if (!st->log.unsorted) { /* appended in order: already sorted and merged */
        st->log.sorted = st->log.n;
        return MAPPING_OK;
    }
    size_t p = st->log.sorted, k = st->log.n - p;
    mapping_range *tail = st->log.v + p;
    bool sorted = true;
    for (size_t i = 1; i < k && sorted; i++)
        sorted = tail[i - 1].lo <= tail[i].lo;
    if (!st->log.scratch && ((!sorted && k > 32) || p) &&
        !(st->log.scratch = mapping_os_malloc(st->log.cap * sizeof *st->log.scratch)))
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mirror: out of memory applying %zu marks", st->log.n);
    if (!sorted) {
        if (k <= 32) {
            insertion_sort(tail, k);
        } else {
            mapping_range *v = mapping__radix_sort(tail, st->log.scratch, k);
            if (v != tail)
                memcpy(tail, v, k * sizeof *v);
        }
    }
    if (!p) {
        st->log.n = join_sorted(st->log.v, k);
    } else if (k) { /* two sorted runs: one merge into the scratch, which becomes the log */
        mapping_range *out = st->log.scratch;
        st->log.n = merge_sorted(st->log.v, p, tail, k, out);
        st->log.scratch = st->log.v;
        st->log.v = out;
    }
    st->log.sorted = st->log.n;
    st->log.unsorted = false;
    return MAPPING_OK;
}

mapping_status mapping__mirror_log_apply(mirror_state *st)
{
    if (!st->log.n)
        return MAPPING_OK;
    mapping_status status;
    if ((status = mapping__mirror_log_sort(st)))
        return status;
    mapping_range *v = st->log.v;
    size_t m = st->log.n;
    int x = st->log.side, y = 1 - x;
    /* As mapping__mirror_mark, in its order: the other side becomes stale
     * first, so modified[x] stays within it. Each step is idempotent: a
     * failure keeps the log, and the next flush redoes it all. */
    if ((status = mapping__rs_add_sorted(&st->stale[y], v, m)) ||
        (status = mapping__rs_add_sorted(&st->modified[x], v, m)) ||
        (status = mapping__rs_remove_sorted(&st->stale[x], v, m)))
        return status; /* the log, sorted and merged, stays */
    st->log.n = 0;
    return MAPPING_OK;
}
