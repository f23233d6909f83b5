/*
 * Events, from per-device pools of idle CUevents: a record takes one (made
 * with cuEventCreate only when the pool is empty) and mapping_event_destroy
 * gives it back, so a loop of records and destroys makes no driver
 * allocation per record. Re-recording an event whose earlier record is
 * still queued is what CUDA does anyway: waits already queued for it keep
 * the record they saw (cuStreamWaitEvent uses the state at the call). Two
 * pools: timed events (CU_EVENT_DEFAULT) for mapping_event_record, which may
 * be timed, and untimed ones (CU_EVENT_DISABLE_TIMING) for the back end's
 * own marks (staged copies), which are cheaper to record.
 */
#include "backend/cuda/cuda_device.h"
#include "os/status.h"

static void pool_init(cuda_event_pool *p, unsigned flags)
{
    pthread_mutex_init(&p->lock, NULL);
    p->flags = flags;
    p->count = 0;
}

void mapping__cuda_event_pools_init(cuda_device *d)
{
    pool_init(&d->timed_events, CU_EVENT_DEFAULT_);
    pool_init(&d->untimed_events, CU_EVENT_DISABLE_TIMING_);
}

static void pool_destroy(cuda_device *d, cuda_event_pool *p)
{
    for (int i = 0; i < p->count; i++)
        d->cu->cuEventDestroy_v2(p->idle[i]);
    p->count = 0;
    pthread_mutex_destroy(&p->lock);
}

void mapping__cuda_event_pools_destroy(cuda_device *d)
{
    pool_destroy(d, &d->timed_events);
    pool_destroy(d, &d->untimed_events);
}

mapping_status mapping__cuda_event_take(cuda_device *d, cuda_event_pool *pool, cu_event *out)
{
    pthread_mutex_lock(&pool->lock);
    cu_event e = pool->count > 0 ? pool->idle[--pool->count] : NULL;
    pthread_mutex_unlock(&pool->lock);
    if (e) {
        *out = e;
        return MAPPING_OK;
    }
    return mapping__cuda_check(d->cu->cuEventCreate(out, pool->flags), "cuEventCreate");
}

void mapping__cuda_event_give(cuda_device *d, cuda_event_pool *pool, cu_event e)
{
    pthread_mutex_lock(&pool->lock);
    bool kept = pool->count < CUDA_EVENT_POOL;
    if (kept)
        pool->idle[pool->count++] = e;
    pthread_mutex_unlock(&pool->lock);
    if (!kept)
        d->cu->cuEventDestroy_v2(e);
}

/* A timed event at the current end of the stream. */
static mapping_status record(cuda_device *d, cu_stream s, cu_event *out)
{
    cu_event e = NULL;
    mapping_status st = mapping__cuda_event_take(d, &d->timed_events, &e);
    if (st == MAPPING_OK && (st = mapping__cuda_check(d->cu->cuEventRecord(e, s), "cuEventRecord")) != MAPPING_OK)
        mapping__cuda_event_give(d, &d->timed_events, e);
    if (st == MAPPING_OK)
        *out = e;
    return st;
}

mapping_status mapping__cuda_event_record(void *dev, void *stream, void **event)
{
    cuda_device *d = dev;
    cu_event e = NULL;
    mapping_status st;
    IN_CONTEXT(d, st = record(d, stream, &e));
    if (st == MAPPING_OK)
        *event = e;
    return st;
}

mapping_status mapping__cuda_event_wait(void *dev, void *stream, void *event)
{
    cuda_device *d = dev;
    mapping_status st;
    IN_CONTEXT(d, st = mapping__cuda_check(d->cu->cuStreamWaitEvent(stream, event, 0), "cuStreamWaitEvent"));
    return st;
}

mapping_status mapping__cuda_event_synchronize(void *dev, void *event)
{
    cuda_device *d = dev;
    mapping_status st;
    IN_CONTEXT(d, st = mapping__cuda_check(d->cu->cuEventSynchronize(event), "cuEventSynchronize"));
    return st;
}

mapping_status mapping__cuda_event_query(void *dev, void *event)
{
    cuda_device *d = dev;
    mapping_status st;
    IN_CONTEXT(d, {
        cu_result r = d->cu->cuEventQuery(event);
        /* Not ready is an answer, not a failure: nothing is recorded. */
        st = r == CU_ERROR_NOT_READY ? MAPPING_ERR_NOT_READY : mapping__cuda_check(r, "cuEventQuery");
    });
    return st;
}

mapping_status mapping__cuda_event_elapsed(void *dev, void *start, void *end, double *seconds)
{
    cuda_device *d = dev;
    float ms = 0;
    mapping_status st;
    IN_CONTEXT(d, st = mapping__cuda_check(d->cu->cuEventElapsedTime(&ms, start, end), "cuEventElapsedTime"));
    if (st == MAPPING_OK)
        *seconds = (double)ms * 1e-3;
    return st;
}

/* Back to the pool: no driver call (but cuEventDestroy_v2 when it is full). */
void mapping__cuda_event_destroy(void *dev, void *event)
{
    cuda_device *d = dev;
    mapping_status st;
    IN_CONTEXT(d, mapping__cuda_event_give(d, &d->timed_events, event));
    (void)st;
}
