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
 */
#include <stdlib.h>
#include <string.h>
#include "coherence/mirror_internal.h"

/* The log is applied once it holds this many marks and more than four times
 * the ranges already modified: its memory stays proportional to the set's,
 * and the work of applying it (a walk of the set) is amortised over at least
 * a quarter as many marks as the set has ranges. */
enum { LOG_MIN_FLUSH = 1 << 16 };

static bool log_grow(mirror_state *st)
{
    size_t cap = st->log_cap ? 2 * st->log_cap : 256;
    mapping_range *v = mapping_os_realloc(st->log, cap * sizeof *v);
    if (!v)
        return false;
    st->log = v;
    st->log_cap = cap;
    free(st->log_scratch); /* made again at the size of the log by the next sort that needs it */
    st->log_scratch = NULL;
    return true;
}

bool mapping__mirror_log_append(mirror_state *st, int x, size_t lo, size_t hi)
{
    if (st->n_inflight || st->modified[1 - x].count || (st->log_n && st->log_side != x))
        return false;
    if (st->log_n) {
        mapping_range *last = &st->log[st->log_n - 1];
        if (lo <= last->hi && hi >= last->lo) { /* touches the previous mark: one range */
            if (lo < last->lo) { /* it may now touch the one before */
                last->lo = lo;
                st->log_unsorted = true;
            }
            if (hi > last->hi)
                last->hi = hi;
            return true;
        }
        if (st->log_n >= LOG_MIN_FLUSH && st->log_n > 4 * st->modified[x].count &&
            mapping__mirror_log_apply(st) != MAPPING_OK)
            return false;
    }
    if (st->log_n == st->log_cap && !log_grow(st))
        return false;
    if (st->log_n && lo < st->log[st->log_n - 1].lo)
        st->log_unsorted = true;
    else if (!st->log_n)
        st->log_unsorted = false;
    st->log[st->log_n++] = (mapping_range){lo, hi};
    st->log_side = x;
    return true;
}

void mapping__mirror_log_free(mirror_state *st)
{
    free(st->log);
    free(st->log_scratch);
    st->log = st->log_scratch = NULL;
    st->log_n = st->log_cap = 0;
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

/* LSD radix sort by lo, 11 bits a pass, only over the bits some lo has.
 * Returns the sorted array: v or tmp. */
static mapping_range *radix_sort(mapping_range *v, mapping_range *tmp, size_t n)
{
    enum { MAX_BITS = 11 };
    size_t all = 0;
    for (size_t i = 0; i < n; i++)
        all |= v[i].lo;
    /* Small logs: fewer buckets, so clearing and summing them stays small. */
    const unsigned BITS = n < 4096 ? 8 : MAX_BITS;
    const size_t BUCKETS = (size_t)1 << BITS;
    size_t count[1 << MAX_BITS];
    for (unsigned shift = 0; shift < 64 && (all >> shift); shift += BITS) {
        memset(count, 0, BUCKETS * sizeof *count);
        for (size_t i = 0; i < n; i++)
            count[(v[i].lo >> shift) & (BUCKETS - 1)]++;
        size_t at = 0;
        for (size_t b = 0; b < BUCKETS; b++) {
            size_t c = count[b];
            count[b] = at;
            at += c;
        }
        for (size_t i = 0; i < n; i++)
            tmp[count[(v[i].lo >> shift) & (BUCKETS - 1)]++] = v[i];
        mapping_range *t = v;
        v = tmp;
        tmp = t;
    }
    return v;
}

/* Sorts the log and merges ranges that overlap or touch; returns the sorted
 * array (the log or its scratch) and its length in *n, NULL when out of
 * memory. */
static mapping_range *sorted_log(mirror_state *st, size_t *n)
{
    mapping_range *v = st->log;
    size_t k = st->log_n;
    if (!st->log_unsorted) { /* appended in order: already sorted and merged */
        *n = k;
        return v;
    }
    bool sorted = true;
    for (size_t i = 1; i < k && sorted; i++)
        sorted = v[i - 1].lo <= v[i].lo;
    if (!sorted) {
        if (k <= 32) {
            insertion_sort(v, k);
        } else {
            if (!st->log_scratch && !(st->log_scratch = mapping_os_malloc(st->log_cap * sizeof *st->log_scratch)))
                return NULL;
            v = radix_sort(v, st->log_scratch, k);
        }
    }
    size_t m = 0;
    for (size_t i = 0; i < k; i++) {
        if (m && v[i].lo <= v[m - 1].hi) {
            if (v[i].hi > v[m - 1].hi)
                v[m - 1].hi = v[i].hi;
        } else {
            v[m++] = v[i];
        }
    }
    *n = m;
    return v;
}

mapping_status mapping__mirror_log_sort(mirror_state *st)
{
    mapping_range *v;
    size_t m;
    if (!(v = sorted_log(st, &m)))
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mirror: out of memory applying %zu marks", st->log_n);
    if (v != st->log) { /* the sorted array becomes the log: swap, no copy */
        st->log_scratch = st->log;
        st->log = v;
    }
    st->log_n = m;
    st->log_unsorted = false;
    return MAPPING_OK;
}

mapping_status mapping__mirror_log_apply(mirror_state *st)
{
    if (!st->log_n)
        return MAPPING_OK;
    mapping_status status;
    if ((status = mapping__mirror_log_sort(st)))
        return status;
    mapping_range *v = st->log;
    size_t m = st->log_n;
    int x = st->log_side, y = 1 - x;
    /* As mapping__mirror_mark, in its order: the other side becomes stale
     * first, so modified[x] stays within it. Each step is idempotent: a
     * failure keeps the log, and the next flush redoes it all. */
    if ((status = mapping__rs_add_sorted(&st->stale[y], v, m)) ||
        (status = mapping__rs_add_sorted(&st->modified[x], v, m)) ||
        (status = mapping__rs_remove_sorted(&st->stale[x], v, m)))
        return status; /* the log, sorted and merged, stays */
    st->log_n = 0;
    return MAPPING_OK;
}
