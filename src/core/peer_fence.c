/*
 * Cross-device work and mapping_close. A peer copy queued on a stream of
 * device B that reads device A's memory runs when B's stream reaches it:
 * closing A before then would free the memory (and, for a staged OpenCL
 * copy, A's queue and staging) under it. So such copies leave a fence,
 * listed with A (the device read) and with the stream: mapping_close(A)
 * waits for A's fences; destroying the stream, whose work is then done,
 * drops the stream's fences.
 *
 * A fence holds an event recorded on the stream after a copy. The stream
 * runs in order, so one event covers every copy before it: a copy queued
 * while the fence's event is still pending only marks the fence `dirty`
 * (copies after its event), and close then records one more event and
 * waits for that too. So a run of async peer copies records about one event
 * per completion of the previous one, not one per copy. Only the thread
 * that recorded an event knows that its next copy comes later (two threads
 * enqueueing on one stream may do so in either order), so each thread has
 * its own fence per (stream, device read).
 *
 * The lists live under one lock (cross-device copies are rare next to
 * everything else). No library call is made under it (a call may fail, and
 * the log callback it reaches may call the library): an event is queried
 * or waited for with the fence pinned (`pins`) or taken by a close
 * (`waited`), which keeps its event alive, and the stream's destruction
 * (which frees the event's device) waits for both to end.
 */
#include <stdlib.h>
#include "core/ops.h"
#include "os/os.h"

typedef struct fence {
    mapping_list_node by_device; /* in read->fences, until a close takes it */
    mapping_list_node by_stream; /* in stream->fences */
    mapping_device   *read;
    mapping_stream   *stream;
    mapping_event    *event;  /* after the copies; NULL: none could be recorded */
    const void       *thread; /* the thread that queued the copies (thread_token) */
    bool              dirty;  /* copies queued after `event` (or with no event) */
    bool              done;   /* `event` was seen complete */
    bool              waited; /* a close took it: it waits outside the lock */
    int               pins;   /* queries of `event` outside the lock */
} fence;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t  released = PTHREAD_COND_INITIALIZER; /* a pin or a close's hold ended */

#define FENCE_OF(node, member) ((fence *)(void *)((char *)(node) - offsetof(fence, member)))

/* Distinct per live thread. A thread that reuses a dead one's token queues
 * after everything the dead one queued, so its events come later. */
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

/* Under the lock: this thread's fence for (stream, read) that no close has
 * taken, or NULL. */
static fence *own_fence(mapping_stream *stream, const mapping_device *read, const void *me)
{
    for (mapping_list_node *n = stream->fences.next; n != &stream->fences; n = n->next) {
        fence *f = FENCE_OF(n, by_stream);
        if (f->read == read && f->thread == me && !f->waited)
            return f;
    }
    return NULL;
}

/* Under the lock (released meanwhile): has f's event completed? The fence
 * is pinned so that its event outlives the query. */
static bool event_done(fence *f)
{
    if (f->done)
        return true;
    f->pins++;
    pthread_mutex_unlock(&lock);
    mapping_error_mark mark;
    mapping__error_mark(&mark);
    bool done = mapping__event_query(f->event) == MAPPING_OK;
    mapping__error_forget(&mark); /* a failed query counts as pending */
    pthread_mutex_lock(&lock);
    f->pins--;
    f->done |= done;
    pthread_cond_broadcast(&released);
    return done;
}

/* Waits for everything queued on the stream so far: an event recorded now,
 * or the stream itself where none can be. A fault injected into a wait
 * (tests) fires once: the second try is real, so close never frees memory
 * that queued work still reads. */
static void wait_event(mapping_stream *stream, mapping_event *ev)
{
    mapping_status st = MAPPING_ERR_FAULT_INJECTED;
    for (int i = 0; i < 2 && st == MAPPING_ERR_FAULT_INJECTED; i++)
        st = ev ? mapping__event_synchronize(ev) : mapping__stream_synchronize(stream);
    if (st != MAPPING_OK)
        mapping__log(1, "mapping_close: waiting for stream %p's copies from this device: %s", (void *)stream,
                     mapping_status_string(st));
}

static void wait_stream_now(mapping_stream *stream)
{
    mapping_error_mark mark;
    mapping__error_mark(&mark);
    mapping_event *ev = NULL;
    if (mapping__event_record(stream, &ev) != MAPPING_OK)
        ev = NULL;
    mapping__error_forget(&mark);
    wait_event(stream, ev);
    if (ev)
        mapping__event_destroy(ev);
}

void mapping__fence_add(mapping_stream *stream, mapping_device *read)
{
    const void *me = thread_token();
    pthread_mutex_lock(&lock);
    if (!stream->fences.next)
        mapping__fence_init(&stream->fences);
    fence *f = own_fence(stream, read, me);
    /* Behind a pending event: the close that waits for it will look again. */
    if (f && f->event && !event_done(f) && !f->waited) {
        f->dirty = true;
        pthread_mutex_unlock(&lock);
        return;
    }
    pthread_mutex_unlock(&lock);

    mapping_error_mark mark;
    mapping__error_mark(&mark);
    mapping_event *ev = NULL;
    if (mapping__event_record(stream, &ev) != MAPPING_OK) {
        ev = NULL; /* dirty without an event: the close records one then */
        mapping__error_forget(&mark);
    }
    mapping_event *old = NULL;
    pthread_mutex_lock(&lock);
    f = own_fence(stream, read, me); /* a close may have taken the old one meanwhile */
    if (f) {
        old = f->event;
        f->event = ev;
        f->dirty = ev == NULL;
        f->done = false;
    } else if ((f = mapping_os_calloc(1, sizeof *f))) {
        *f = (fence){.read = read, .stream = stream, .event = ev, .thread = me, .dirty = ev == NULL};
        list_push(&read->fences, &f->by_device);
        list_push(&stream->fences, &f->by_stream);
    }
    pthread_mutex_unlock(&lock);
    if (old)
        mapping__event_destroy(old);
    if (!f) { /* no memory for a fence: the copy becomes blocking */
        wait_event(stream, ev);
        if (ev)
            mapping__event_destroy(ev);
    }
}

/* Under the lock (released meanwhile): a fence on the stream whose host
 * function runs on this thread that is not known to be complete, which
 * waiting would wait for itself on; or NULL. */
static const fence *waits_for_itself(mapping_device *dev)
{
    const void *worker = mapping_os_worker_stream();
again:
    for (mapping_list_node *n = dev->fences.next; worker && n != &dev->fences; n = n->next) {
        fence *f = FENCE_OF(n, by_device);
        if (f->stream->state != worker)
            continue;
        if (f->dirty || !f->event) /* copies after the event may come after this function */
            return f;
        if (!f->done) {
            if (!event_done(f))
                return f;
            goto again; /* the lock was released: the list may have changed */
        }
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
                             "%s: called from a host function on stream %p, which may hold a peer copy from this "
                             "device queued after the function: closing would wait for itself",
                             fn, stream);
    }
    while (dev->fences.next != &dev->fences) {
        fence *f = FENCE_OF(dev->fences.next, by_device);
        list_unlink(&f->by_device);
        f->waited = true; /* from now on no one else changes it */
        while (f->pins)
            pthread_cond_wait(&released, &lock);
        pthread_mutex_unlock(&lock);
        if (f->event)
            wait_event(f->stream, f->event);
        if (f->dirty) /* copies after its event: wait for them too */
            wait_stream_now(f->stream);
        if (f->event) /* while taken: the event's device cannot be closed meanwhile */
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
        if (f->waited || f->pins) { /* a close or a query is using its event: wait, then look again */
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
