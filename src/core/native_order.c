/*
 * Ordering the library's streams after work queued on native queues
 * (mapping_device_wait_native). Memory imported from another library
 * (DLPack, __cuda_array_interface__) is written by work on that library's
 * queue: a DLPack producer orders it before the consumer's stream (the
 * library names the legacy stream), a CUDA array interface names its own.
 * The library's streams are non-blocking: they do not wait for the legacy
 * stream by themselves, so a copy on one of them could read the tensor
 * before the producer's kernel wrote it. This records one back-end event at
 * the end of the native queue's work and makes every stream of the device
 * wait for it on the device (cuStreamWaitEvent: the host never waits),
 * streams made later included: each new stream waits for the marks still
 * kept, one per native queue (a newer mark of a queue covers its older one,
 * as the queue runs in order).
 */
#include <stdlib.h>
#include <string.h>
#include "core/ops.h"
#include "os/os.h"

typedef struct native_mark {
    void *native; /* the caller's queue (NULL: the default native queue) */
    void *event;  /* the back end's event at the end of its work */
} native_mark;

struct mapping_native_marks {
    native_mark *mark;
    size_t       count, capacity;
};

#define STREAM_OF(n) ((mapping_stream *)(void *)((char *)(n) - offsetof(mapping_stream, node)))

/* MAPPING_ERR_UNSUPPORTED when a stream of dev is being captured into a
 * graph: waiting there for an event recorded outside the capture would
 * invalidate it. objects_lock held. */
static mapping_status refuse_captured_streams(const char *fn, mapping_device *dev)
{
    for (mapping_list_node *n = dev->streams.next; n != &dev->streams; n = n->next) {
        int status = MAPPING_CAPTURE_NONE;
        mapping_status st = mapping__op_stream_capture_status(dev, STREAM_OF(n)->state, &status, NULL);
        if (st != MAPPING_OK)
            return st;
        if (status != MAPPING_CAPTURE_NONE)
            return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                                 "%s: stream %p of the device is being captured into a CUDA graph, and waiting there "
                                 "for work outside the capture would invalidate it; call it before or after the "
                                 "capture",
                                 fn, (void *)STREAM_OF(n));
    }
    return MAPPING_OK;
}

/* Keeps `event` as the mark of `native`, in place of its older one. */
static mapping_status keep_mark(mapping_device *dev, void *native, void *event)
{
    struct mapping_native_marks *m = dev->native_marks;
    if (!m && !(m = dev->native_marks = mapping_os_calloc(1, sizeof *m)))
        return MAPPING_ERR_OUT_OF_HOST_MEMORY;
    for (size_t i = 0; i < m->count; i++)
        if (m->mark[i].native == native) {
            mapping__op_event_destroy(dev, m->mark[i].event);
            m->mark[i].event = event;
            return MAPPING_OK;
        }
    if (m->count == m->capacity) {
        size_t cap = m->capacity ? 2 * m->capacity : 4;
        native_mark *grown = mapping_os_realloc(m->mark, cap * sizeof *grown);
        if (!grown)
            return MAPPING_ERR_OUT_OF_HOST_MEMORY;
        m->mark = grown;
        m->capacity = cap;
    }
    m->mark[m->count++] = (native_mark){native, event};
    return MAPPING_OK;
}

/* Every stream of dev (and its queue of blocking calls) waits for event.
 * objects_lock held. */
static mapping_status all_streams_wait(mapping_device *dev, void *event)
{
    mapping_status st = MAPPING_OK;
    mapping_stream *blocking = mapping__blocking_stream(dev);
    if (blocking)
        st = mapping__op_event_wait(dev, blocking->state, event);
    for (mapping_list_node *n = dev->streams.next; n != &dev->streams && st == MAPPING_OK; n = n->next)
        st = mapping__op_event_wait(dev, STREAM_OF(n)->state, event);
    return st;
}

/* The mark of native's work so far, waited for by every stream. The
 * native queue is not captured (checked). objects_lock held. */
static mapping_status mark_native(const char *fn, mapping_device *dev, void *native)
{
    void *queue = NULL, *event = NULL;
    int status = MAPPING_CAPTURE_NONE;
    mapping_status st = mapping__op_stream_import(dev, native, &queue);
    if (st != MAPPING_OK)
        return st;
    if ((st = mapping__op_stream_capture_status(dev, queue, &status, NULL)) == MAPPING_OK &&
        status != MAPPING_CAPTURE_NONE)
        st = mapping__fail(MAPPING_ERR_UNSUPPORTED,
                           "%s: native queue %p is being captured into a CUDA graph (or waits for a capture): an "
                           "event recorded there would be a point of the graph, not of its work; call it before or "
                           "after the capture",
                           fn, native);
    if (st == MAPPING_OK)
        st = refuse_captured_streams(fn, dev);
    if (st == MAPPING_OK)
        st = mapping__op_event_record(dev, queue, &event);
    mapping__op_stream_unimport(dev, queue);
    if (st == MAPPING_OK && (st = all_streams_wait(dev, event)) == MAPPING_OK &&
        (st = keep_mark(dev, native, event)) != MAPPING_OK)
        st = mapping__fail(st, "%s: out of memory", fn);
    if (st != MAPPING_OK && event)
        mapping__op_event_destroy(dev, event);
    return st;
}

mapping_status mapping_device_wait_native(mapping_device *dev, void *native_queue)
{
    static const char fn[] = "mapping_device_wait_native";
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)))
        return st;
    if (!mapping__can_import_stream(dev)) {
        if (!native_queue)
            return MAPPING_OK; /* no native queue: nothing queued elsewhere to wait for */
        return mapping__fail(MAPPING_ERR_UNSUPPORTED, "%s: back end %s has no native queues", fn, dev->be->name);
    }
    if (!native_queue && !mapping__can_import_default_stream(dev))
        return mapping__fail(MAPPING_ERR_NULL_ARGUMENT,
                             "%s: native_queue is NULL, and back end %s has no default native queue to take for it",
                             fn, dev->be->name);
    pthread_mutex_lock(&dev->objects_lock);
    st = mark_native(fn, dev, native_queue);
    pthread_mutex_unlock(&dev->objects_lock);
    return st;
}

void mapping__native_mark_wait(mapping_device *dev, void *stream_state)
{
    pthread_mutex_lock(&dev->objects_lock);
    struct mapping_native_marks *m = dev->native_marks;
    for (size_t i = 0; m && i < m->count; i++) {
        mapping_error_mark before;
        mapping__error_mark(&before);
        if (mapping__op_event_wait(dev, stream_state, m->mark[i].event) != MAPPING_OK)
            mapping__log(1, "mapping_stream_create: the new stream cannot wait for mapping_device_wait_native's "
                            "event (%s)", mapping__last_message());
        mapping__error_forget(&before);
    }
    pthread_mutex_unlock(&dev->objects_lock);
}

void mapping__native_mark_destroy(mapping_device *dev)
{
    struct mapping_native_marks *m = dev->native_marks;
    if (!m)
        return;
    for (size_t i = 0; i < m->count; i++)
        mapping__op_event_destroy(dev, m->mark[i].event);
    free(m->mark);
    free(m);
    dev->native_marks = NULL;
}
