/*
 * Planning a flush: sort the queued copies by direction, buffer and offset,
 * merge the ones whose ranges overlap or touch into groups, decide which
 * groups are staged (packed into the staging buffer) and which go straight
 * through, and lay out the staging buffer.
 */
#include <stdlib.h>
#include <string.h>
#include "transfer/transfer.h"

/* plan->keys: n of these for qsort, or the same memory as two arrays of n
 * ranges for the radix sort (lo: the packed key, hi: the copy's index). */
typedef struct batch_sort_key {
    int       direction; /* 0: host-to-device first */
    uintptr_t buf;
    size_t    offset;
    size_t    index;
} sort_key;
_Static_assert(sizeof(sort_key) >= 2 * sizeof(mapping_range), "the radix sort's two arrays fit in the keys");

/* The radix sort handles up to this many (direction, buffer) pairs. */
enum { RADIX_MAX_LANES = 16 };

static int compare_keys(const void *a_, const void *b_)
{
    const sort_key *a = a_, *b = b_;
    if (a->direction != b->direction)
        return a->direction - b->direction;
    if (a->buf != b->buf)
        return a->buf < b->buf ? -1 : 1;
    if (a->offset != b->offset)
        return a->offset < b->offset ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

void mapping__batch_plan_free(batch_plan *plan)
{
    free(plan->copies);
    free(plan->order);
    free(plan->group_of);
    free(plan->groups);
    free(plan->done);
    free(plan->keys);
    free(plan->runs);
    memset(plan, 0, sizeof *plan);
}

/* Groups of one direction, each all-large (straight through) or staged. */
static void make_groups(batch_plan *plan, size_t large_bytes)
{
    size_t n = 0;
    for (size_t i = 0; i < plan->count;) {
        const batch_copy *c = &plan->copies[plan->order[i]];
        batch_group g = {.buf = c->buf, .lo = c->offset, .hi = c->offset + c->bytes, .first = i, .to_gpu = c->to_gpu};
        bool all_large = c->bytes >= large_bytes;
        size_t j = i + 1;
        for (; j < plan->count; j++) {
            const batch_copy *d = &plan->copies[plan->order[j]];
            if (d->to_gpu != c->to_gpu || d->buf != c->buf || d->offset > g.hi)
                break;
            if (d->offset + d->bytes > g.hi)
                g.hi = d->offset + d->bytes;
            all_large = all_large && d->bytes >= large_bytes;
        }
        g.count = j - i;
        g.staged = !all_large;
        for (size_t k = i; k < j; k++)
            plan->group_of[plan->order[k]] = n;
        if (g.to_gpu)
            plan->h2d_groups = n + 1;
        plan->groups[n++] = g;
        i = j;
    }
    plan->group_count = n;
}

static void layout_staging(batch_plan *plan)
{
    const size_t entry = sizeof(mapping_scatter_entry);
    for (size_t i = 0; i < plan->group_count; i++) {
        size_t *n = plan->groups[i].to_gpu ? (plan->groups[i].staged ? &plan->h2d_staged : &plan->h2d_straight)
                                           : (plan->groups[i].staged ? &plan->d2h_staged : &plan->d2h_straight);
        ++*n;
    }
    plan->h2d_table_offset = 0;
    plan->d2h_table_offset = plan->h2d_staged * entry;
    plan->h2d_data_offset = mapping__align_up((plan->h2d_staged + plan->d2h_staged) * entry, 64);
    size_t at = plan->h2d_data_offset;
    for (size_t i = 0; i < plan->h2d_groups; i++)
        if (plan->groups[i].staged) {
            plan->groups[i].staging_offset = at;
            at += plan->groups[i].hi - plan->groups[i].lo;
        }
    plan->d2h_data_offset = mapping__align_up(at, 64);
    at = plan->d2h_data_offset;
    for (size_t i = plan->h2d_groups; i < plan->group_count; i++)
        if (plan->groups[i].staged) {
            plan->groups[i].staging_offset = at;
            at += plan->groups[i].hi - plan->groups[i].lo;
        }
    plan->staging_bytes = at;
    for (size_t i = 0; i < plan->group_count; i++) {
        const batch_group *g = &plan->groups[i];
        plan->moved[g->to_gpu ? 0 : 1][g->staged ? 0 : 1] += g->hi - g->lo;
    }
}

/* Grows the plan's arrays to hold n copies. Their content is rebuilt by
 * every plan, so growing frees and allocates rather than reallocs. */
static mapping_status reserve(batch_plan *plan, size_t n)
{
    if (n > plan->capacity) {
        free(plan->order);
        free(plan->group_of);
        free(plan->groups);
        free(plan->done);
        free(plan->keys);
        free(plan->runs);
        plan->order = mapping_os_malloc(n * sizeof *plan->order);
        plan->runs = mapping_os_malloc(n * sizeof *plan->runs);
        plan->group_of = mapping_os_malloc(n * sizeof *plan->group_of);
        plan->groups = mapping_os_malloc(n * sizeof *plan->groups);
        plan->done = mapping_os_malloc(n * sizeof *plan->done);
        plan->keys = mapping_os_malloc(n * sizeof *plan->keys);
        plan->capacity = n;
        if (!plan->order || !plan->group_of || !plan->groups || !plan->done || !plan->keys || !plan->runs)
            goto fail;
    }
    if (n > plan->copies_capacity) { /* becomes the batch's queue: room for what it holds now */
        free(plan->copies);
        plan->copies_capacity = n;
        if (!(plan->copies = mapping_os_malloc(n * sizeof *plan->copies)))
            goto fail;
    }
    return MAPPING_OK;
fail:
    mapping__batch_plan_free(plan);
    return MAPPING_ERR_OUT_OF_HOST_MEMORY; /* recorded by the caller, which knows the copies */
}

mapping_status mapping__batch_plan_take(mapping_batch *b, batch_plan *plan)
{
    size_t n = b->count;
    mapping_status st = reserve(plan, n);
    if (st != MAPPING_OK) {
        const batch_copy *c = &b->copies[0]; /* n > 0: an empty batch is not planned */
        return mapping__fail(st,
                             "mapping_batch_flush: copy 0 of %zu (%s, %zu bytes at offset %zu of buffer %p) was not "
                             "done: out of memory planning the flush; 0 copies done, %zu not done and still queued",
                             n, c->to_gpu ? "host-to-device" : "device-to-host", c->bytes, c->offset, (void *)c->buf, n);
    }
    /* Swap arrays: the queued copies become the plan's, the plan's spare
     * array becomes the batch's (empty) queue. No copy of the queue. */
    batch_copy *spare = plan->copies;
    size_t spare_capacity = plan->copies_capacity;
    plan->copies = b->copies;
    plan->copies_capacity = b->capacity;
    b->copies = spare;
    b->capacity = spare_capacity;
    mapping__batch_clear(b);

    plan->count = n;
    plan->group_count = plan->h2d_groups = plan->run_count = 0;
    plan->h2d_staged = plan->d2h_staged = plan->h2d_straight = plan->d2h_straight = 0;
    memset(plan->moved, 0, sizeof plan->moved);
    plan->d2h_read = false;
    plan->host_staging = NULL;
    memset(plan->done, 0, n * sizeof *plan->done);
    return MAPPING_OK;
}

size_t mapping__batch_sorted_prefix(const batch_copy *copies, size_t n)
{
    size_t sorted = 1;
    while (sorted < n && mapping__batch_in_order(&copies[sorted - 1], &copies[sorted]))
        sorted++;
    return n ? sorted : 0;
}

/* The lane of copy c: its (direction, buffer) among lanes[0, *count),
 * added when new; -1 when there would be more than RADIX_MAX_LANES. */
static int lane_of(const batch_copy *c, sort_key *lanes, int *count)
{
    int dir = c->to_gpu ? 0 : 1;
    for (int l = 0; l < *count; l++)
        if (lanes[l].buf == (uintptr_t)c->buf && lanes[l].direction == dir)
            return l;
    if (*count == RADIX_MAX_LANES)
        return -1;
    lanes[*count] = (sort_key){dir, (uintptr_t)c->buf, 0, 0};
    return (*count)++;
}

/* plan->order by direction, buffer, offset and index, with one stable radix
 * sort of keys packing the lane's rank above the offset: O(n) where qsort
 * took ~100 ns a copy (10,000 copies added in random order: 1.3 ms of a
 * 1.5 ms flush). False (nothing written to order) when there are too many
 * lanes or the offsets leave no bits for them: qsort then. */
static bool radix_order(batch_plan *plan)
{
    size_t n = plan->count, max_offset = 0;
    sort_key lanes[RADIX_MAX_LANES];
    int count = 0, last = -1;
    for (size_t i = 0; i < n; i++) {
        const batch_copy *c = &plan->copies[i];
        if (last < 0 || lanes[last].buf != (uintptr_t)c->buf || lanes[last].direction != (c->to_gpu ? 0 : 1))
            if ((last = lane_of(c, lanes, &count)) < 0)
                return false;
        max_offset |= c->offset;
    }
    unsigned offset_bits = max_offset ? 64 - (unsigned)__builtin_clzll(max_offset) : 0;
    unsigned lane_bits = count > 1 ? 32 - (unsigned)__builtin_clz((unsigned)count - 1) : 0;
    if (offset_bits + lane_bits > 64)
        return false;
    /* rank[l]: lane l's place in (direction, buffer) order */
    size_t rank[RADIX_MAX_LANES];
    for (int l = 0; l < count; l++) {
        rank[l] = 0;
        for (int m = 0; m < count; m++)
            rank[l] += lanes[m].direction < lanes[l].direction ||
                       (lanes[m].direction == lanes[l].direction && lanes[m].buf < lanes[l].buf);
    }
    mapping_range *v = (mapping_range *)(void *)plan->keys, *tmp = v + n;
    last = 0;
    for (size_t i = 0; i < n; i++) {
        const batch_copy *c = &plan->copies[i];
        if (lanes[last].buf != (uintptr_t)c->buf || lanes[last].direction != (c->to_gpu ? 0 : 1))
            last = lane_of(c, lanes, &count);
        size_t high = lane_bits ? rank[last] << offset_bits : 0; /* offset_bits < 64 here */
        v[i] = (mapping_range){high | c->offset, i};
    }
    v = mapping__radix_sort(v, tmp, n);
    for (size_t i = 0; i < n; i++)
        plan->order[i] = v[i].hi;
    return true;
}

mapping_status mapping__batch_plan(mapping_batch *b, batch_plan *plan, size_t large_bytes)
{
    bool sorted = !b->unsorted;
    mapping_status st = mapping__batch_plan_take(b, plan);
    if (st != MAPPING_OK)
        return st;
    size_t n = plan->count;
    /* Copies are often added in plan order: then there is nothing to sort
     * (no sort keys written). */
    if (sorted) {
        for (size_t i = 0; i < n; i++)
            plan->order[i] = i;
    } else if (!radix_order(plan)) {
        sort_key *keys = plan->keys;
        for (size_t i = 0; i < n; i++) {
            const batch_copy *c = &plan->copies[i];
            keys[i] = (sort_key){c->to_gpu ? 0 : 1, (uintptr_t)c->buf, c->offset, i};
        }
        qsort(keys, n, sizeof *keys, compare_keys);
        for (size_t i = 0; i < n; i++)
            plan->order[i] = keys[i].index;
    }
    make_groups(plan, large_bytes);
    layout_staging(plan);
    return MAPPING_OK;
}
