/* Sorted array of disjoint byte ranges; see range_set.h for why an array. */
#include "coherence/range_set.h"
#include <stdlib.h>
#include <string.h>
#include "core/error.h"

void mapping__rs_init(mapping_range_set *s)
{
    memset(s, 0, sizeof *s);
}

void mapping__rs_free(mapping_range_set *s)
{
    free(s->v);
    memset(s, 0, sizeof *s);
}

mapping_status mapping__rs_reserve(mapping_range_set *s, size_t extra)
{
    if (s->n + extra <= s->cap)
        return MAPPING_OK;
    size_t cap = s->cap ? s->cap : 4;
    while (cap < s->n + extra)
        cap *= 2;
    mapping_range *v = realloc(s->v, cap * sizeof *v);
    if (!v)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "range set: cannot grow to %zu ranges", cap);
    s->v = v;
    s->cap = cap;
    return MAPPING_OK;
}

size_t mapping__rs_lower(const mapping_range_set *s, size_t pos)
{
    size_t a = 0, b = s->n;
    while (a < b) {
        size_t mid = a + (b - a) / 2;
        if (s->v[mid].hi > pos)
            b = mid;
        else
            a = mid + 1;
    }
    return a;
}

mapping_status mapping__rs_add(mapping_range_set *s, size_t lo, size_t hi)
{
    if (lo >= hi)
        return MAPPING_OK;
    /* First interval that touches or follows lo (adjacent ones merge too). */
    size_t i = mapping__rs_lower(s, lo > 0 ? lo - 1 : 0);
    if (i < s->n && s->v[i].hi < lo)
        i++;
    size_t j = i; /* one past the last interval that touches [lo, hi] */
    size_t nlo = lo, nhi = hi, covered = 0;
    while (j < s->n && s->v[j].lo <= hi) {
        if (s->v[j].lo < nlo)
            nlo = s->v[j].lo;
        if (s->v[j].hi > nhi)
            nhi = s->v[j].hi;
        covered += s->v[j].hi - s->v[j].lo;
        j++;
    }
    if (j == i) { /* nothing touched: insert */
        mapping_status st = mapping__rs_reserve(s, 1);
        if (st != MAPPING_OK)
            return st;
        memmove(s->v + i + 1, s->v + i, (s->n - i) * sizeof *s->v);
        s->v[i] = (mapping_range){lo, hi};
        s->n++;
        s->total += hi - lo;
        return MAPPING_OK;
    }
    s->v[i] = (mapping_range){nlo, nhi};
    memmove(s->v + i + 1, s->v + j, (s->n - j) * sizeof *s->v);
    s->n -= j - i - 1;
    s->total = s->total - covered + (nhi - nlo);
    return MAPPING_OK;
}

mapping_status mapping__rs_remove(mapping_range_set *s, size_t lo, size_t hi)
{
    if (lo >= hi)
        return MAPPING_OK;
    size_t i = mapping__rs_lower(s, lo);
    if (i == s->n || s->v[i].lo >= hi)
        return MAPPING_OK;
    mapping_range *r = &s->v[i];
    if (r->lo < lo && r->hi > hi) { /* strictly inside one interval: split */
        mapping_status st = mapping__rs_reserve(s, 1);
        if (st != MAPPING_OK)
            return st;
        r = &s->v[i];
        memmove(s->v + i + 1, s->v + i, (s->n - i) * sizeof *s->v);
        s->v[i].hi = lo;
        s->v[i + 1].lo = hi;
        s->n++;
        s->total -= hi - lo;
        return MAPPING_OK;
    }
    size_t first_drop = i, last_drop = i; /* [first_drop, last_drop) are removed whole */
    if (r->lo < lo) { /* trim the tail of the first */
        s->total -= r->hi - lo;
        r->hi = lo;
        first_drop = last_drop = i + 1;
    }
    size_t j = first_drop;
    while (j < s->n && s->v[j].hi <= hi) {
        s->total -= s->v[j].hi - s->v[j].lo;
        j++;
    }
    last_drop = j;
    if (j < s->n && s->v[j].lo < hi) { /* trim the head of the last */
        s->total -= hi - s->v[j].lo;
        s->v[j].lo = hi;
    }
    memmove(s->v + first_drop, s->v + last_drop, (s->n - last_drop) * sizeof *s->v);
    s->n -= last_drop - first_drop;
    return MAPPING_OK;
}

bool mapping__rs_intersects(const mapping_range_set *s, size_t lo, size_t hi)
{
    if (lo >= hi || s->n == 0)
        return false;
    size_t i = mapping__rs_lower(s, lo);
    return i < s->n && s->v[i].lo < hi;
}

size_t mapping__rs_bytes_in(const mapping_range_set *s, size_t lo, size_t hi)
{
    if (lo >= hi || s->n == 0)
        return 0;
    if (lo <= s->v[0].lo && hi >= s->v[s->n - 1].hi)
        return s->total;
    size_t sum = 0;
    for (size_t i = mapping__rs_lower(s, lo); i < s->n && s->v[i].lo < hi; i++) {
        size_t a = s->v[i].lo > lo ? s->v[i].lo : lo;
        size_t b = s->v[i].hi < hi ? s->v[i].hi : hi;
        sum += b - a;
    }
    return sum;
}

bool mapping__rs_valid(const mapping_range_set *s)
{
    size_t total = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->v[i].lo >= s->v[i].hi)
            return false;
        if (i > 0 && s->v[i - 1].hi >= s->v[i].lo)
            return false;
        total += s->v[i].hi - s->v[i].lo;
    }
    return total == s->total && s->n <= s->cap;
}

mapping_status mapping__rs_remove_sorted(mapping_range_set *s, const mapping_range *r, size_t k)
{
    if (k == 0 || s->n == 0)
        return MAPPING_OK;
    if (k == 1)
        return mapping__rs_remove(s, r[0].lo, r[0].hi);
    size_t cap = s->n + k; /* each removed range splits at most one interval */
    mapping_range *out = malloc(cap * sizeof *out);
    if (!out)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "range set: cannot grow to %zu ranges", cap);
    size_t n = 0, total = 0, j = 0;
    for (size_t i = 0; i < s->n; i++) {
        size_t lo = s->v[i].lo, hi = s->v[i].hi;
        while (j < k && r[j].hi <= lo)
            j++;
        /* Cut every removed range that meets [lo, hi) out of it. */
        for (size_t q = j; q < k && r[q].lo < hi && lo < hi; q++) {
            if (r[q].lo > lo)
                out[n++] = (mapping_range){lo, r[q].lo}, total += r[q].lo - lo;
            if (r[q].hi > lo)
                lo = r[q].hi;
        }
        if (lo < hi)
            out[n++] = (mapping_range){lo, hi}, total += hi - lo;
    }
    free(s->v);
    s->v = out;
    s->n = n;
    s->cap = cap;
    s->total = total;
    return MAPPING_OK;
}
