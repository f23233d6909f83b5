/*
 * Cross-device work and mapping_close. A peer copy queued on a stream of
 * device B that reads device A's memory runs when B's stream reaches it:
 * closing A before then would free the memory (and, for a staged OpenCL
 * copy, A's queue and staging) under it. So each such copy leaves a fence:
 * an event recorded on B's stream after it, listed with A (the device read)
 * and with the stream. mapping_close(A) waits for A's fences; destroying
 * the stream, whose work is then done, drops the stream's fences.
 *
 * One fence per (stream, device read, thread): the stream runs in order, so
 * the latest event covers the earlier copies, and a later copy replaces the
 * fence's event. Only the thread that recorded an event knows that its next
 * one is later (two threads enqueueing on one stream may record in either
 * order), so each thread keeps its own fence per pair. The lists live under one lock (cross-device copies are
 * rare next to everything else); waiting happens outside it, with the
 * fence marked so that the stream's destruction (which frees the event's
 * device) waits until the closer has finished with it.
 */
#include <stdlib.h>
#include "core/ops.h"
#include "os/os.h"

typedef struct fence {
    mapping_list_node by_device; /* in read->fences */
    mapping_list_node by_stream; /* in stream->fences */
    mapping_device   *read;
    mapping_stream   *stream;
    mapping_event    *event;  /* NULL: none could be recorded; wait for the whole stream */
    const void       *thread; /* the thread that recorded it (thread_token) */
    bool              waited; /* a close is waiting for it, outside the lock */
} fence;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t  released = PTHREAD_COND_INITIALIZER; /* a fence stopped being waited for */

#define FENCE_OF(node, member) ((fence *)(void *)((char *)(node) - offsetof(fence, member)))

/* Distinct per live thread. A thread that reuses a dead one's token
 * records after everything the dead one recorded, so replacing stays right. */
static const void *thread_token(void)
{
    static _Thread_local char token;
    return &token;
}

void mapping__fence_init(mapping_list_node *head)
{
    head->next = head->prev = head;
}

static void list_push(mapping_list_node *head, mapping_list_node *n)
{
    n->next = head->next;
    n->prev = head;
    head->next->prev = n;
    head->next = n;
}

static void list_unlink(mapping_list_node *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    mapping__fence_init(n);
}

/* Waits for what the fence stands for. A fault injected into the wait
 * (tests) fires once: the second wait is real, so close never frees memory
 * that queued work still reads. */
static void fence_wait(const fence *f)
{
    mapping_status st = MAPPING_ERR_FAULT_INJECTED;
    for (int i = 0; i < 2 && st == MAPPING_ERR_FAULT_INJECTED; i++)
        st = f->event ? mapping__event_synchronize(f->event) : mapping__stream_synchronize(f->stream);
    if (st != MAPPING_OK)
        mapping__log(1, "mapping_close: waiting for stream %p's copy from this device: %s", (void *)f->stream,
                     mapping_status_string(st));
}

/* The copy is done, or the fence could not be recorded: wait now. */
static void wait_now(mapping_stream *stream, mapping_event *ev)
{
    fence f = {.stream = stream, .event = ev};
    fence_wait(&f);
    if (ev)
        mapping__event_destroy(ev);
}

void mapping__fence_add(mapping_stream *stream, mapping_device *read)
{
    mapping_error_mark mark;
    mapping__error_mark(&mark);
    mapping_event *ev = NULL;
    if (mapping__event_record(stream, &ev) != MAPPING_OK) {
        ev = NULL; /* the fence waits for the whole stream instead; the copy itself went ahead */
        mapping__error_forget(&mark);
    }
    mapping_event *old = NULL;
    const void *me = thread_token();
    pthread_mutex_lock(&lock);
    if (!stream->fences.next)
        mapping__fence_init(&stream->fences);
    fence *f = NULL;
    for (mapping_list_node *n = stream->fences.next; n != &stream->fences && !f; n = n->next) {
        fence *g = FENCE_OF(n, by_stream);
        if (g->read == read && g->thread == me && !g->waited)
            f = g;
    }
    if (f) {
        old = f->event;
        f->event = ev;
    } else if ((f = mapping_os_calloc(1, sizeof *f))) {
        *f = (fence){.read = read, .stream = stream, .event = ev, .thread = me};
        list_push(&read->fences, &f->by_device);
        list_push(&stream->fences, &f->by_stream);
    }
    pthread_mutex_unlock(&lock);
    if (!f) /* no memory for the fence: the copy becomes blocking */
        wait_now(stream, ev);
    else if (old)
        mapping__event_destroy(old);
}

/* Under the lock: would waiting for dev's fences wait for the host
 * function running on this thread? */
static const fence *waits_for_itself(const mapping_device *dev)
{
    const void *worker = mapping_os_worker_stream();
    for (mapping_list_node *n = dev->fences.next; worker && n != &dev->fences; n = n->next) {
        const fence *f = FENCE_OF(n, by_device);
        if (f->stream->state == worker && (!f->event || mapping__event_query(f->event) != MAPPING_OK))
            return f;
    }
    return NULL;
}

mapping_status mapping__fences_wait(const char *fn, mapping_device *dev)
{
    pthread_mutex_lock(&lock);
    const fence *self = waits_for_itself(dev);
    if (self) {
        const void *stream = self->stream;
        pthread_mutex_unlock(&lock);
        return mapping__fail(MAPPING_ERR_BUSY,
                             "%s: called from a host function on stream %p, which has a peer copy from this device "
                             "queued after the function: closing would wait for itself",
                             fn, stream);
    }
    while (dev->fences.next != &dev->fences) {
        fence *f = FENCE_OF(dev->fences.next, by_device);
        list_unlink(&f->by_device);
        f->waited = true;
        pthread_mutex_unlock(&lock);
        fence_wait(f);
        if (f->event) /* while marked: the event's device cannot be closed meanwhile */
            mapping__event_destroy(f->event);
        pthread_mutex_lock(&lock);
        list_unlink(&f->by_stream);
        pthread_cond_broadcast(&released);
        free(f);
    }
    pthread_mutex_unlock(&lock);
    return MAPPING_OK;
}

void mapping__fences_drop_stream(mapping_stream *stream)
{
    mapping_list_node done;
    mapping__fence_init(&done);
    pthread_mutex_lock(&lock);
    for (mapping_list_node *n = stream->fences.next; n && n != &stream->fences;) {
        fence *f = FENCE_OF(n, by_stream);
        if (f->waited) { /* a close is using its event: wait, then look again */
            pthread_cond_wait(&released, &lock);
            n = stream->fences.next;
            continue;
        }
        n = n->next;
        list_unlink(&f->by_device);
        list_unlink(&f->by_stream);
        list_push(&done, &f->by_stream);
    }
    pthread_mutex_unlock(&lock);
    while (done.next != &done) {
        fence *f = FENCE_OF(done.next, by_stream);
        list_unlink(&f->by_stream);
        if (f->event)
            mapping__event_destroy(f->event);
        free(f);
    }
}
