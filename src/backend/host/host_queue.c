#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backend/host/host_queue.h"
#include "os/status.h"
#include "os/os.h"

struct host_event {
    pthread_mutex_t lock;
    pthread_cond_t  done_cond;
    bool            done;
    uint64_t        time_ns;
    _Atomic int     refs; /* the handle, plus each queued operation that uses it */
    unsigned        generation; /* forks seen when it was recorded */
};

typedef struct host_stream {
    host_device    *dev;
    pthread_t       thread;
    pthread_mutex_t lock;
    pthread_cond_t  work_cond; /* work arrived, or stop */
    pthread_cond_t  idle_cond; /* the queue drained */
    host_op        *head, *tail;
    bool            running; /* the worker is executing an operation */
    bool            stop;
    mapping_status  first_error;
    unsigned        generation; /* forks seen when it was made */
} host_stream;

/* ---- fork(): a child has none of its parent's worker threads ----
 * A stream (or a not yet completed event) made before the fork would wait
 * for a thread that does not exist there: it is refused in the child with
 * a clear status, and destroyed without joining anyone. */
static _Atomic unsigned fork_generation;

static void in_child(void)
{
    atomic_fetch_add_explicit(&fork_generation, 1, memory_order_relaxed);
}

/*
 * Registered when the library loads, not on first use: glibc (2.36 and
 * later) runs a fork's prepare handlers without its atfork lock, and a
 * handler another thread registers meanwhile is left out of that fork
 * (neither prepare nor child handler runs; track/write_track.c).
 */
__attribute__((constructor)) static void watch_forks(void)
{
    pthread_atfork(NULL, NULL, in_child);
}

static unsigned generation_now(void)
{
    return atomic_load_explicit(&fork_generation, memory_order_relaxed);
}

static bool inherited(unsigned generation)
{
    return generation != atomic_load_explicit(&fork_generation, memory_order_relaxed);
}

static mapping_status refuse_inherited(const char *what, const void *p)
{
    return mapping__fail(MAPPING_ERR_INVALID_HANDLE,
                         "host: %s %p was made before fork(): its worker thread is the parent's and does not exist "
                         "in this child; make a new one here",
                         what, p);
}

/* ---- moving the bytes ---- */

/* A device-to-host copy writes host memory. With ordinary stores each
 * destination line is first read from DRAM (read-for-ownership) and then
 * stays in the caches; with streaming (non-temporal) stores it is only
 * written: two DRAM passes per byte instead of three, and the caches are
 * left alone. That is right when the destination would not stay in cache
 * anyway: a copy larger than a fair share of the last-level cache, or one
 * piece of a long forward sweep (a pipeline's chunks into a large host
 * array). It is wrong for a copy onto lines that are still in cache (the
 * same buffer read back again and again): ordinary stores hit the cache
 * there. glibc's memcpy streams only above 3/4 of the cache size it reads
 * from CPUID, which under a hypervisor can be far off. (The measurements
 * behind these thresholds: BENCHMARKS-archive.md, "Lab notes".)
 * Host-to-device copies write device memory, which here is a buffer a
 * kernel (or the next copy) reads next: ordinary stores keep it in cache. */
enum {
    STREAMING_ALONE = 8 << 20,   /* a copy this large streams on its own */
    STREAMING_RUN = 8 << 20,     /* a forward sweep this long streams... */
    STREAMING_PIECE = 256 << 10, /* ...in pieces at least this large */
    STREAMING_WINDOW = 16 << 20  /* how far a piece may land from the sweep's front */
};

/* Tracks the front of the device-to-host sweep (the highest end written)
 * and how many bytes the sweep has covered. A copy that moves the front
 * forward adds its new bytes; one that lands a little behind it (streams
 * finishing chunks out of order) changes nothing; one far away starts a new
 * sweep. A copy that rewrites the same buffer again and again never moves
 * the front, so it keeps ordinary stores and its cache hits. */
static bool d2h_should_stream(host_device *dev, void *dst, size_t bytes)
{
    uintptr_t lo = (uintptr_t)dst, hi = lo + bytes;
    uintptr_t front = atomic_load_explicit(&dev->d2h_end, memory_order_relaxed);
    size_t run = atomic_load_explicit(&dev->d2h_run, memory_order_relaxed);
    if (lo > front + STREAMING_WINDOW || hi + STREAMING_WINDOW < front) {
        front = hi; /* far away: a new sweep */
        run = bytes;
    } else if (hi > front) {
        run += hi - (lo > front ? lo : front);
        front = hi;
    }
    atomic_store_explicit(&dev->d2h_end, front, memory_order_relaxed);
    atomic_store_explicit(&dev->d2h_run, run, memory_order_relaxed);
    return bytes >= STREAMING_ALONE || (bytes >= STREAMING_PIECE && run >= STREAMING_RUN);
}

static void copy_bytes(host_device *dev, host_link_direction dir, void *dst, const void *src, size_t bytes)
{
    /* Small copies neither stream nor move a sweep on: keep their path bare. */
    if (dir == HOST_LINK_D2H && bytes >= STREAMING_PIECE && d2h_should_stream(dev, dst, bytes))
        mapping_os_copy_streaming(dst, src, bytes);
    else
        memcpy(dst, src, bytes);
}

/* ---- the link model ---- */

/* Waits until the deadline: a sleep, then a spin for the last few
 * microseconds. On a real device the wait is a DMA engine at work, which
 * costs the CPU nothing, so most of it is a sleep: spinning all of it would
 * take a core from the other direction's memcpy (on a 2-core machine, half
 * of it). But a sleep ends late by the scheduler's wake-up latency (12-25 us
 * on this project's machine, with a 1 us timer slack), which made a
 * modelled 5 us transfer take 17-21 us: the model was off by 4x for small
 * transfers, and by an amount that depended on how much of the transfer the
 * memcpy had already used. So the sleep ends one wake-up margin early and
 * the rest is spun. The margin follows the latency seen: up at once past a
 * late wake-up, down slowly, and never above LINK_MARGIN_MAX, which bounds
 * the spin per transfer. */
enum { LINK_MARGIN_MAX = 100000 }; /* ns */

static uint64_t next_margin(uint64_t margin, uint64_t late)
{
    uint64_t want = late + late / 4 + 1000; /* the wake-up seen, a quarter more, and the timer slack */
    if (want > margin)
        margin = want;
    else
        margin -= (margin - want) / 16;
    return margin < LINK_MARGIN_MAX ? margin : LINK_MARGIN_MAX;
}

static void link_wait_until(host_link *link, host_link_direction dir, uint64_t deadline_ns)
{
    uint64_t now = mapping_os_now_ns(), margin = link->wake_margin_ns[dir];
    if (now + margin < deadline_ns) {
        uint64_t wake = deadline_ns - margin;
        mapping_os_nap_until_ns(wake); /* a 1 us timer slack: the default 50 us made 5 us transfers 55-80 us */
        now = mapping_os_now_ns();
        link->wake_margin_ns[dir] = next_margin(margin, now > wake ? now - wake : 0);
    }
    while (now < deadline_ns)
        now = mapping_os_now_ns();
}

/* Moves the bytes while holding the direction's engine, and keeps holding it
 * until the modelled time has passed. */
static void link_copy(host_device *dev, host_link_direction dir, void *dst, const void *src, size_t bytes)
{
    host_link *link = &dev->link;
    double seconds = link->latency + (link->bandwidth > 0 ? (double)bytes / link->bandwidth : 0);
    pthread_mutex_t *engine = &link->engine[dir];
    pthread_mutex_lock(engine);
    uint64_t start = mapping_os_now_ns();
    copy_bytes(dev, dir, dst, src, bytes);
    double ns = seconds * 1e9; /* the link's values are checked (os/link.c); the size is not bounded */
    uint64_t deadline = start + (ns < 1e18 ? (uint64_t)ns : (uint64_t)1e18);
    link_wait_until(link, dir, deadline);
    pthread_mutex_unlock(engine);
}

static bool link_modelled(const host_link *link)
{
    return link->bandwidth > 0 || link->latency > 0;
}

/* ---- events ---- */

static void event_release(host_event *ev)
{
    if (atomic_fetch_sub(&ev->refs, 1) == 1) {
        pthread_mutex_destroy(&ev->lock);
        pthread_cond_destroy(&ev->done_cond);
        free(ev);
    }
}

static void event_complete(host_event *ev)
{
    pthread_mutex_lock(&ev->lock);
    ev->time_ns = mapping_os_now_ns();
    ev->done = true;
    pthread_cond_broadcast(&ev->done_cond);
    pthread_mutex_unlock(&ev->lock);
}

static void event_wait_done(host_event *ev)
{
    pthread_mutex_lock(&ev->lock);
    while (!ev->done)
        pthread_cond_wait(&ev->done_cond, &ev->lock);
    pthread_mutex_unlock(&ev->lock);
}

/* ---- running one operation ---- */

static void run_op(host_device *dev, const host_op *op)
{
    switch (op->kind) {
    case HOST_OP_COPY:
        if (op->link_direction != HOST_LINK_NONE && link_modelled(&dev->link))
            link_copy(dev, op->link_direction, op->dst, op->src, op->bytes);
        else
            copy_bytes(dev, op->link_direction, op->dst, op->src, op->bytes);
        break;
    case HOST_OP_FILL:
        memset(op->dst, op->value, op->bytes);
        break;
    case HOST_OP_FUNCTION:
        op->fn(op->user);
        break;
    case HOST_OP_EVENT_RECORD:
        event_complete(op->event);
        event_release(op->event);
        break;
    case HOST_OP_EVENT_WAIT:
        event_wait_done(op->event);
        event_release(op->event);
        break;
    }
}

mapping_status mapping__host_submit(void *dev_, void *stream_, const host_op *op)
{
    host_device *dev = dev_;
    host_stream *s = stream_;
    if (!s) {
        run_op(dev, op);
        return MAPPING_OK;
    }
    if (inherited(s->generation))
        return refuse_inherited("stream", s);
    host_op *copy = mapping_os_malloc(sizeof *copy);
    if (!copy)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "host: out of memory queueing an operation");
    *copy = *op;
    copy->next = NULL;
    pthread_mutex_lock(&s->lock);
    if (s->tail)
        s->tail->next = copy;
    else
        s->head = copy;
    s->tail = copy;
    pthread_cond_signal(&s->work_cond);
    pthread_mutex_unlock(&s->lock);
    return MAPPING_OK;
}

static void *stream_worker(void *arg)
{
    host_stream *s = arg;
    mapping_os_set_worker_stream(s); /* host functions run here: see os/worker.c */
    mapping_os_fine_timer_slack(); /* modelled transfers sleep here, to the microsecond */
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->work_cond, &s->lock);
        if (!s->head)
            break; /* stop, and nothing left */
        host_op *op = s->head;
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        s->running = true;
        pthread_mutex_unlock(&s->lock);
        run_op(s->dev, op);
        free(op);
        pthread_mutex_lock(&s->lock);
        s->running = false;
        if (!s->head)
            pthread_cond_broadcast(&s->idle_cond);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

mapping_status mapping__host_stream_create(void *dev, void **out)
{
    host_stream *s = mapping_os_calloc(1, sizeof *s);
    if (!s)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "host: out of memory");
    s->dev = dev;
    s->generation = generation_now();
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->work_cond, NULL);
    pthread_cond_init(&s->idle_cond, NULL);
    int err = mapping_os_thread_create(&s->thread, NULL, stream_worker, s);
    if (err) {
        pthread_mutex_destroy(&s->lock);
        pthread_cond_destroy(&s->work_cond);
        pthread_cond_destroy(&s->idle_cond);
        free(s);
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "host: pthread_create failed (%d)", err);
    }
    *out = s;
    return MAPPING_OK;
}

mapping_status mapping__host_stream_synchronize(void *dev, void *stream)
{
    (void)dev;
    host_stream *s = stream;
    if (inherited(s->generation))
        return refuse_inherited("stream", s);
    pthread_mutex_lock(&s->lock);
    while (s->head || s->running)
        pthread_cond_wait(&s->idle_cond, &s->lock);
    mapping_status st = s->first_error;
    s->first_error = MAPPING_OK;
    pthread_mutex_unlock(&s->lock);
    return st;
}

void mapping__host_stream_destroy(void *dev, void *stream)
{
    (void)dev;
    host_stream *s = stream;
    if (inherited(s->generation)) {
        free(s); /* its thread, and what it had queued, stay the parent's */
        return;
    }
    pthread_mutex_lock(&s->lock);
    s->stop = true;
    pthread_cond_signal(&s->work_cond);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->work_cond);
    pthread_cond_destroy(&s->idle_cond);
    free(s);
}

/* ---- events ---- */

mapping_status mapping__host_event_record(void *dev, void *stream, void **out)
{
    host_event *ev = mapping_os_calloc(1, sizeof *ev);
    if (!ev)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "host: out of memory");
    pthread_mutex_init(&ev->lock, NULL);
    pthread_cond_init(&ev->done_cond, NULL);
    atomic_init(&ev->refs, 2); /* the handle and the queued record */
    ev->generation = generation_now();
    host_op op = {.kind = HOST_OP_EVENT_RECORD, .event = ev};
    mapping_status st = mapping__host_submit(dev, stream, &op);
    if (st != MAPPING_OK) {
        event_release(ev);
        event_release(ev);
        return st;
    }
    *out = ev;
    return MAPPING_OK;
}

mapping_status mapping__host_event_wait(void *dev, void *stream, void *event)
{
    host_event *ev = event;
    if (inherited(ev->generation) && !ev->done) /* no other thread here: read without its lock */
        return refuse_inherited("event", ev);
    atomic_fetch_add(&ev->refs, 1);
    host_op op = {.kind = HOST_OP_EVENT_WAIT, .event = ev};
    mapping_status st = mapping__host_submit(dev, stream, &op);
    if (st != MAPPING_OK)
        event_release(ev);
    return st;
}

mapping_status mapping__host_event_synchronize(void *dev, void *event)
{
    (void)dev;
    host_event *ev = event;
    if (inherited(ev->generation) && !ev->done)
        return refuse_inherited("event", ev);
    event_wait_done(event);
    return MAPPING_OK;
}

mapping_status mapping__host_event_query(void *dev, void *event)
{
    (void)dev;
    host_event *ev = event;
    pthread_mutex_lock(&ev->lock);
    bool done = ev->done;
    pthread_mutex_unlock(&ev->lock);
    return done ? MAPPING_OK : MAPPING_ERR_NOT_READY;
}

mapping_status mapping__host_event_elapsed(void *dev, void *start, void *end, double *seconds)
{
    host_event *a = start, *b = end;
    if (mapping__host_event_query(dev, a) != MAPPING_OK || mapping__host_event_query(dev, b) != MAPPING_OK)
        return mapping__fail(MAPPING_ERR_NOT_READY, "mapping_event_elapsed: an event has not completed yet");
    pthread_mutex_lock(&a->lock);
    uint64_t ta = a->time_ns;
    pthread_mutex_unlock(&a->lock);
    pthread_mutex_lock(&b->lock);
    uint64_t tb = b->time_ns;
    pthread_mutex_unlock(&b->lock);
    *seconds = ((double)tb - (double)ta) * 1e-9;
    return MAPPING_OK;
}

void mapping__host_event_destroy(void *dev, void *event)
{
    (void)dev;
    event_release(event);
}
