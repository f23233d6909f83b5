/*
 * OpenCL streams (in-order command queues with profiling), transfers, host
 * functions and events.
 *
 * Blocking calls (stream == NULL) go to the device's own in-order queue with
 * the blocking flag, or with an event waited for: one driver call, nothing
 * more, so a blocking copy costs what the raw OpenCL call costs.
 *
 * Host functions (launch_host): OpenCL has no "run this host function in
 * queue order". Each launch enqueues a marker (`reached`) and then a barrier
 * that waits for a user event (`done`). A worker thread of the stream waits
 * for the marker, runs fn, and completes the user event: fn runs after the
 * earlier work, and later work waits until fn has returned. fn runs on our
 * thread, never on a driver callback thread, so it may block or call the
 * library (on other streams) without stalling the driver.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backend/opencl/opencl_internal.h"
#include "os/os.h"
#include "os/status.h"
#ifdef MAPPING_OPENCL_HEADERS

void mapping__opencl_stream_record_error(opencl_stream *s, mapping_status st, const char *message)
{
    pthread_mutex_lock(&s->lock);
    if (s->first_error == MAPPING_OK) {
        s->first_error = st;
        snprintf(s->error_message, sizeof s->error_message, "%s", message);
    }
    pthread_mutex_unlock(&s->lock);
}

/* Status of a completed (or failed) event: MAPPING_OK, or the failure. */
static mapping_status event_outcome(const char *what, cl_event ev)
{
    cl_int status = CL_COMPLETE;
    cl_int err = mapping__opencl_driver.clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
    if (err != CL_SUCCESS)
        return mapping__opencl_fail("clGetEventInfo", err);
    if (status < 0) /* a failed command's status is its error code */
        return mapping__opencl_fail(what, status);
    return MAPPING_OK;
}

mapping_status mapping__opencl_finish_blocking(const char *call, cl_int err, cl_event ev)
{
    if (err != CL_SUCCESS)
        return mapping__opencl_fail(call, err);
    err = mapping__opencl_driver.clWaitForEvents(1, &ev);
    mapping_status st = err == CL_SUCCESS ? event_outcome(call, ev) : mapping__opencl_fail(call, err);
    mapping__opencl_driver.clReleaseEvent(ev);
    return st;
}

/* ---- streams ---- */

mapping_status mapping__opencl_stream_create(void *dev, void **out)
{
    opencl_device *d = dev;
    opencl_stream *s = mapping_os_calloc(1, sizeof *s);
    if (!s)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "opencl: out of memory");
    cl_int err = CL_SUCCESS;
    s->queue = mapping__opencl_driver.clCreateCommandQueue(d->context, d->device, CL_QUEUE_PROFILING_ENABLE, &err);
    if (err != CL_SUCCESS) {
        free(s);
        return mapping__opencl_fail("clCreateCommandQueue", err);
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    *out = s;
    return MAPPING_OK;
}

/* Stops the host-function worker (if one started), finishes the queue. */
static void stream_stop(opencl_stream *s)
{
    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    pthread_cond_broadcast(&s->cond);
    bool joined = s->worker_started;
    pthread_mutex_unlock(&s->lock);
    if (joined)
        pthread_join(s->worker, NULL);
    mapping__opencl_driver.clFinish(s->queue);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->lock);
}

/* Called after stream_synchronize: no host job is pending. */
void mapping__opencl_stream_destroy(void *dev, void *stream)
{
    (void)dev;
    opencl_stream *s = stream;
    stream_stop(s);
    mapping__opencl_driver.clReleaseCommandQueue(s->queue);
    free(s);
}

void mapping__opencl_blocking_stream_init(opencl_device *d)
{
    d->blocking.queue = d->queue;
    pthread_mutex_init(&d->blocking.lock, NULL);
    pthread_cond_init(&d->blocking.cond, NULL);
    d->blocking_ready = true;
}

void mapping__opencl_blocking_stream_fini(opencl_device *d)
{
    if (d->blocking_ready)
        stream_stop(&d->blocking); /* the queue is the device's: released by its owner */
    d->blocking_ready = false;
}

void *mapping__opencl_stream_blocking(void *dev)
{
    opencl_device *d = dev;
    return d->blocking_ready ? &d->blocking : NULL;
}

/* A marker after everything queued; its status says whether that work
 * failed. Then the first error a host-function worker recorded. */
mapping_status mapping__opencl_stream_synchronize(void *dev, void *stream)
{
    (void)dev;
    opencl_stream *s = stream;
    cl_event ev = NULL;
    cl_int err = mapping__opencl_driver.clEnqueueMarkerWithWaitList(s->queue, 0, NULL, &ev);
    mapping_status st = mapping__opencl_finish_blocking("clEnqueueMarkerWithWaitList (stream_synchronize)", err, ev);
    pthread_mutex_lock(&s->lock);
    mapping_status first = s->first_error;
    char message[sizeof s->error_message];
    memcpy(message, s->error_message, sizeof message);
    s->first_error = MAPPING_OK;
    bool failed = s->failed;
    pthread_mutex_unlock(&s->lock);
    if (first != MAPPING_OK)
        return mapping__fail(first, "%s", message); /* the earlier failure explains a later one */
    if (failed)
        return mapping__fail(MAPPING_ERR_DRIVER, "opencl: the stream failed earlier (clWaitForEvents before a host "
                                                 "function failed) and runs no host function any more: destroy it");
    return st;
}

mapping_status mapping__opencl_stream_native(void *dev, void *stream, void **native)
{
    (void)dev;
    *native = ((opencl_stream *)stream)->queue;
    return MAPPING_OK;
}

/* ---- transfers ---- */

/* The pinned path: `src` lies in a mapped CL_MEM_ALLOC_HOST_PTR buffer, which
 * drivers page-lock, and clEnqueueWriteBuffer from such a pointer is their
 * DMA path (NVIDIA's and AMD's guides say so). The pinned buffer itself is
 * not used as a copy source: while mapped, its device-side content is
 * undefined, so clEnqueueCopyBuffer from it would be wrong on drivers that
 * keep a device copy. Both paths are therefore the same call. */
mapping_status mapping__opencl_write(void *dev, void *stream, const void *src, const mapping_host_ref *pinned, void *dst_mem,
                         size_t dst_offset, size_t bytes)
{
    (void)pinned;
    cl_command_queue q = opencl_queue_of(dev, stream);
    cl_int err = mapping__opencl_driver.clEnqueueWriteBuffer(q, ((opencl_buffer *)dst_mem)->mem, stream ? CL_FALSE : CL_TRUE, dst_offset,
                                          bytes, src, 0, NULL, NULL);
    return err == CL_SUCCESS ? MAPPING_OK : mapping__opencl_fail("clEnqueueWriteBuffer", err);
}

mapping_status mapping__opencl_read(void *dev, void *stream, void *src_mem, size_t src_offset, void *dst,
                        const mapping_host_ref *pinned, size_t bytes)
{
    (void)pinned; /* see mapping__opencl_write */
    cl_command_queue q = opencl_queue_of(dev, stream);
    cl_int err = mapping__opencl_driver.clEnqueueReadBuffer(q, ((opencl_buffer *)src_mem)->mem, stream ? CL_FALSE : CL_TRUE, src_offset,
                                         bytes, dst, 0, NULL, NULL);
    return err == CL_SUCCESS ? MAPPING_OK : mapping__opencl_fail("clEnqueueReadBuffer", err);
}

mapping_status mapping__opencl_copy(void *dev, void *stream, void *src_mem, size_t src_offset, void *dst_mem, size_t dst_offset,
                        size_t bytes)
{
    cl_event ev = NULL;
    cl_int err = mapping__opencl_driver.clEnqueueCopyBuffer(opencl_queue_of(dev, stream), ((opencl_buffer *)src_mem)->mem,
                                         ((opencl_buffer *)dst_mem)->mem, src_offset, dst_offset, bytes, 0, NULL,
                                         stream ? NULL : &ev);
    if (!stream)
        return mapping__opencl_finish_blocking("clEnqueueCopyBuffer", err, ev);
    return err == CL_SUCCESS ? MAPPING_OK : mapping__opencl_fail("clEnqueueCopyBuffer", err);
}

mapping_status mapping__opencl_fill(void *dev, void *stream, void *mem, size_t offset, size_t bytes, unsigned char value)
{
    cl_event ev = NULL;
    cl_uchar pattern = value;
    cl_int err = mapping__opencl_driver.clEnqueueFillBuffer(opencl_queue_of(dev, stream), ((opencl_buffer *)mem)->mem, &pattern,
                                         sizeof pattern, offset, bytes, 0, NULL, stream ? NULL : &ev);
    if (!stream)
        return mapping__opencl_finish_blocking("clEnqueueFillBuffer", err, ev);
    return err == CL_SUCCESS ? MAPPING_OK : mapping__opencl_fail("clEnqueueFillBuffer", err);
}

/* ---- host functions ---- */

/* Waits, without clWaitForEvents, until the marker is no longer queued or
 * running (complete, or failed), or its status cannot be read. */
static void settle(cl_event marker)
{
    for (;;) {
        cl_int status = CL_COMPLETE;
        if (mapping__opencl_driver.clGetEventInfo(marker, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL) !=
                CL_SUCCESS ||
            status <= CL_COMPLETE)
            return;
        struct timespec ts = {0, 100000}; /* 100 us */
        nanosleep(&ts, NULL);
    }
}

static void *host_worker(void *arg)
{
    opencl_stream *s = arg;
    mapping_os_set_worker_stream(s); /* host functions run here: see os/worker.c */
    for (;;) {
        pthread_mutex_lock(&s->lock);
        while (!s->head && !s->stopping)
            pthread_cond_wait(&s->cond, &s->lock);
        opencl_host_job *job = s->head;
        if (job) {
            s->head = job->next;
            if (!s->head)
                s->tail = NULL;
        }
        pthread_mutex_unlock(&s->lock);
        if (!job)
            return NULL; /* stopping, and nothing left */
        cl_int err = mapping__opencl_driver.clWaitForEvents(1, &job->reached);
        if (err != CL_SUCCESS || s->failed) {
            /* The work queued before fn failed, or could not be waited for:
             * fn must not run against unfinished data. It is skipped, and
             * the stream is failed for good: its later host functions are
             * skipped too, and every stream_synchronize reports the error.
             * The barrier behind fn is released only once the marker has
             * settled, so that later work still runs in order (failing it
             * through a negative user-event status would be the clean way,
             * but PoCL aborts on it). */
            if (err != CL_SUCCESS)
                settle(job->reached);
            if (!s->failed) {
                char message[200];
                snprintf(message, sizeof message,
                         "opencl: clWaitForEvents failed: %s (%d): the work before a host function failed; the "
                         "function was not run and the stream runs no host function any more",
                         mapping__opencl_error_name(err), err);
                mapping__opencl_stream_record_error(s, MAPPING_ERR_DRIVER, message);
                pthread_mutex_lock(&s->lock);
                s->failed = true;
                pthread_mutex_unlock(&s->lock);
            }
        } else {
            job->fn(job->user);
        }
        mapping__opencl_driver.clSetUserEventStatus(job->done, CL_COMPLETE);
        mapping__opencl_driver.clReleaseEvent(job->reached);
        mapping__opencl_driver.clReleaseEvent(job->done);
        free(job);
    }
}

mapping_status mapping__opencl_launch_host(void *dev, void *stream, void (*fn)(void *), void *user)
{
    opencl_device *d = dev;
    opencl_stream *s = stream;
    opencl_host_job *job = mapping_os_calloc(1, sizeof *job);
    if (!job)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "opencl: out of memory");
    job->fn = fn;
    job->user = user;
    mapping_status st = MAPPING_OK;
    cl_int err = CL_SUCCESS;
    /* Under the lock: two threads launching on one stream get their markers
     * and jobs in the same order. */
    pthread_mutex_lock(&s->lock);
    if (!s->worker_started) {
        if (mapping_os_thread_create(&s->worker, NULL, host_worker, s) != 0) {
            st = mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "opencl: cannot start the host-function thread");
            goto fail;
        }
        s->worker_started = true;
    }
    job->done = mapping__opencl_driver.clCreateUserEvent(d->context, &err);
    if (err != CL_SUCCESS) {
        st = mapping__opencl_fail("clCreateUserEvent", err);
        goto fail;
    }
    if ((err = mapping__opencl_driver.clEnqueueMarkerWithWaitList(s->queue, 0, NULL, &job->reached)) != CL_SUCCESS) {
        st = mapping__opencl_fail("clEnqueueMarkerWithWaitList", err);
        goto fail_done;
    }
    if ((err = mapping__opencl_driver.clEnqueueBarrierWithWaitList(s->queue, 1, &job->done, NULL)) != CL_SUCCESS) {
        /* The marker is queued already; with no job for it nothing waits on it. */
        mapping__opencl_driver.clReleaseEvent(job->reached);
        st = mapping__opencl_fail("clEnqueueBarrierWithWaitList", err);
        goto fail_done;
    }
    if (s->tail)
        s->tail->next = job;
    else
        s->head = job;
    s->tail = job;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->lock);
    mapping__opencl_driver.clFlush(s->queue); /* so the marker is reached without a later wait */
    return MAPPING_OK;
fail_done:
    mapping__opencl_driver.clSetUserEventStatus(job->done, CL_COMPLETE);
    mapping__opencl_driver.clReleaseEvent(job->done);
fail:
    pthread_mutex_unlock(&s->lock);
    free(job);
    return st;
}

/* ---- events: markers on profiling queues ---- */

mapping_status mapping__opencl_event_record(void *dev, void *stream, void **out)
{
    (void)dev;
    opencl_stream *s = stream;
    cl_event ev = NULL;
    cl_int err = mapping__opencl_driver.clEnqueueMarkerWithWaitList(s->queue, 0, NULL, &ev);
    if (err != CL_SUCCESS)
        return mapping__opencl_fail("clEnqueueMarkerWithWaitList", err);
    mapping__opencl_driver.clFlush(s->queue); /* an event polled with event_query must make progress */
    *out = ev;
    return MAPPING_OK;
}

mapping_status mapping__opencl_event_wait(void *dev, void *stream, void *event)
{
    (void)dev;
    opencl_stream *s = stream;
    cl_event ev = event;
    cl_int err = mapping__opencl_driver.clEnqueueBarrierWithWaitList(s->queue, 1, &ev, NULL);
    if (err != CL_SUCCESS)
        return mapping__opencl_fail("clEnqueueBarrierWithWaitList", err);
    mapping__opencl_driver.clFlush(s->queue);
    return MAPPING_OK;
}

mapping_status mapping__opencl_event_synchronize(void *dev, void *event)
{
    (void)dev;
    cl_event ev = event;
    cl_int err = mapping__opencl_driver.clWaitForEvents(1, &ev);
    if (err != CL_SUCCESS)
        return mapping__opencl_fail("clWaitForEvents", err);
    return event_outcome("the work before the event", ev);
}

mapping_status mapping__opencl_event_query(void *dev, void *event)
{
    (void)dev;
    cl_int status = CL_COMPLETE;
    cl_int err = mapping__opencl_driver.clGetEventInfo(event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
    if (err != CL_SUCCESS)
        return mapping__opencl_fail("clGetEventInfo", err);
    if (status < 0)
        return mapping__opencl_fail("the work before the event", status);
    return status == CL_COMPLETE ? MAPPING_OK : MAPPING_ERR_NOT_READY;
}

/* Timestamps are the markers' CL_PROFILING_COMMAND_END: the moment the stream
 * passed the point where the event was recorded. */
mapping_status mapping__opencl_event_elapsed(void *dev, void *start, void *end, double *seconds)
{
    cl_ulong t[2] = {0, 0};
    void *events[2] = {start, end};
    for (int i = 0; i < 2; i++) {
        mapping_status st = mapping__opencl_event_query(dev, events[i]);
        if (st == MAPPING_ERR_NOT_READY)
            return mapping__fail(st, "mapping_event_elapsed: the %s event has not completed", i ? "end" : "start");
        if (st != MAPPING_OK)
            return st;
        cl_int err = mapping__opencl_driver.clGetEventProfilingInfo(events[i], CL_PROFILING_COMMAND_END, sizeof t[i], &t[i], NULL);
        if (err != CL_SUCCESS)
            return mapping__opencl_fail("clGetEventProfilingInfo(CL_PROFILING_COMMAND_END)", err);
    }
    *seconds = ((double)t[1] - (double)t[0]) * 1e-9;
    return MAPPING_OK;
}

void mapping__opencl_event_destroy(void *dev, void *event)
{
    (void)dev;
    mapping__opencl_driver.clReleaseEvent(event);
}
#endif /* MAPPING_OPENCL_HEADERS */
