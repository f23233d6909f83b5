/* Sorted disjoint byte spans (see span_set.h). */
#include <stdlib.h>
#include <string.h>
#include "coherence/span_set.h"
#include "os/os.h"

void mapping__span_set_free(mapping_span_set *s)
{
    free(s->v);
    *s = (mapping_span_set){0};
}

/* The first span whose end is >= pos (it may touch pos). */
static size_t first_ending_at_or_after(const mapping_span_set *s, size_t pos)
{
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->v[mid].end < pos)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static bool reserve(mapping_span_set *s, size_t n)
{
    if (n <= s->cap)
        return true;
    size_t cap = s->cap ? s->cap * 2 : 8;
    while (cap < n)
        cap *= 2;
    mapping_span *v = mapping_os_realloc(s->v, cap * sizeof *v);
    if (!v)
        return false;
    s->v = v;
    s->cap = cap;
    return true;
}

bool mapping__span_set_reserve(mapping_span_set *s, size_t extra)
{
    return reserve(s, s->n + extra);
}

/* Replaces spans [i, j) with the `count` spans of `with`. */
static bool splice(mapping_span_set *s, size_t i, size_t j, const mapping_span *with, size_t count)
{
    if (!reserve(s, s->n - (j - i) + count))
        return false;
    for (size_t k = i; k < j; k++)
        s->bytes -= s->v[k].end - s->v[k].start;
    memmove(s->v + i + count, s->v + j, (s->n - j) * sizeof *s->v);
    memcpy(s->v + i, with, count * sizeof *with);
    s->n = s->n - (j - i) + count;
    for (size_t k = 0; k < count; k++)
        s->bytes += with[k].end - with[k].start;
    return true;
}

bool mapping__span_set_add(mapping_span_set *s, size_t start, size_t end)
{
    if (start >= end)
        return true;
    size_t i = first_ending_at_or_after(s, start), j = i;
    mapping_span merged = {start, end};
    while (j < s->n && s->v[j].start <= end) { /* overlapping or touching */
        if (s->v[j].start < merged.start)
            merged.start = s->v[j].start;
        if (s->v[j].end > merged.end)
            merged.end = s->v[j].end;
        j++;
    }
    return splice(s, i, j, &merged, 1);
}

bool mapping__span_set_remove(mapping_span_set *s, size_t start, size_t end)
{
    if (start >= end)
        return true;
    size_t i = first_ending_at_or_after(s, start + 1), j = i; /* spans ending after start */
    while (j < s->n && s->v[j].start < end)
        j++;
    if (i == j)
        return true;
    mapping_span keep[2];
    size_t count = 0;
    if (s->v[i].start < start)
        keep[count++] = (mapping_span){s->v[i].start, start};
    if (s->v[j - 1].end > end)
        keep[count++] = (mapping_span){end, s->v[j - 1].end};
    return splice(s, i, j, keep, count);
}

bool mapping__span_set_each_in(const mapping_span_set *s, size_t start, size_t end,
                               bool (*fn)(size_t start, size_t end, void *user), void *user)
{
    for (size_t i = first_ending_at_or_after(s, start + 1); i < s->n && s->v[i].start < end; i++) {
        size_t a = s->v[i].start > start ? s->v[i].start : start, b = s->v[i].end < end ? s->v[i].end : end;
        if (a < b && !fn(a, b, user))
            return false;
    }
    return true;
}

bool mapping__span_set_intersects(const mapping_span_set *s, size_t start, size_t end)
{
    size_t i = first_ending_at_or_after(s, start + 1);
    return start < end && i < s->n && s->v[i].start < end;
}

size_t mapping__span_set_bytes_in(const mapping_span_set *s, size_t start, size_t end)
{
    size_t total = 0;
    for (size_t i = first_ending_at_or_after(s, start + 1); i < s->n && s->v[i].start < end; i++) {
        size_t a = s->v[i].start > start ? s->v[i].start : start, b = s->v[i].end < end ? s->v[i].end : end;
        total += a < b ? b - a : 0;
    }
    return total;
}

size_t mapping__span_set_first_after(const mapping_span_set *s, size_t pos)
{
    return first_ending_at_or_after(s, pos + 1);
}
