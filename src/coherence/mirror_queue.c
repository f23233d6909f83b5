/* A family's queued work: the entries and their events (mirror_queue.h). */
#include <stdlib.h>
#include <string.h>
#include "coherence/mirror_queue.h"

mapping_status mapping__mirror_queue_reserve(mirror_queue *q)
{
    if (q->n < q->cap)
        return MAPPING_OK;
    size_t cap = q->cap ? 2 * q->cap : 4;
    mirror_inflight *v = mapping_os_realloc(q->v, cap * sizeof *v);
    if (!v)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mirror: out of memory tracking queued copies");
    q->v = v;
    q->cap = cap;
    return MAPPING_OK;
}

mapping_status mapping__mirror_queue_push(mirror_queue *q, mapping_stream *stream, size_t lo, size_t hi, int target,
                                          mapping_range *ranges, size_t n)
{
    mapping_event *ev;
    mapping_status status = mapping__event_record(stream, &ev);
    if (status != MAPPING_OK)
        return status;
    q->v[q->n++] = (mirror_inflight){ev, stream, lo, hi, target, ranges, n};
    return MAPPING_OK;
}

mapping_status mapping__mirror_queue_access(mirror_queue *q, mapping_stream *stream, size_t lo, size_t hi)
{
    mapping_status status = mapping__mirror_queue_reserve(q);
    return status ? status : mapping__mirror_queue_push(q, stream, lo, hi, MIRROR_ACCESS, NULL, 0);
}

void mapping__mirror_queue_release(mirror_queue *q, size_t i)
{
    mirror_inflight *e = &q->v[i];
    mapping__event_destroy(e->event);
    free(e->ranges);
    memmove(q->v + i, q->v + i + 1, (q->n - i - 1) * sizeof *e);
    q->n--;
}

void mapping__mirror_queue_free(mirror_queue *q)
{
    for (size_t i = 0; i < q->n; i++)
        free(q->v[i].ranges);
    free(q->v);
    *q = (mirror_queue){0};
}
