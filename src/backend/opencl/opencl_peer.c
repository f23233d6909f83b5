/*
 * Several OpenCL devices: one context per platform, shared by the devices
 * opened on it (so their buffers meet in clEnqueueCopyBuffer), and the peer
 * copy: clEnqueueCopyBuffer within a context, else staged through
 * page-locked host memory in pipelined chunks.
 *
 * $MAPPING_OPENCL_SHARED_CONTEXT=0 gives every device its own context, as
 * before sharing (and so tests reach the staged path on one platform).
 */
#include <stdlib.h>
#include <string.h>
#include "backend/opencl/opencl_internal.h"
#include "os/os.h"
#include "os/status.h"

#ifdef MAPPING_OPENCL_HEADERS

enum { SHARED_MAX = 16, STAGING_CHUNK = 4 << 20 };

/* The platforms' shared contexts and how many open devices use each. */
static struct {
    cl_platform_id platform;
    cl_context     context;
    int            users;
} shared[SHARED_MAX];
static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;

static bool sharing_enabled(void)
{
    const char *env = getenv("MAPPING_OPENCL_SHARED_CONTEXT");
    return !(env && strcmp(env, "0") == 0);
}

static cl_context create_context(cl_platform_id platform, cl_uint n, const cl_device_id *ids, cl_int *err)
{
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)platform, 0};
    return mapping__opencl_driver.clCreateContext(props, n, ids, NULL, NULL, err);
}

cl_context mapping__opencl_context_acquire(cl_platform_id platform, cl_device_id device, cl_int *err)
{
    if (!sharing_enabled())
        return create_context(platform, 1, &device, err);
    pthread_mutex_lock(&shared_lock);
    cl_context context = NULL;
    int free_slot = -1;
    for (int i = 0; i < SHARED_MAX && !context; i++) {
        if (shared[i].users > 0 && shared[i].platform == platform) {
            *err = mapping__opencl_driver.clRetainContext(shared[i].context);
            if (*err == CL_SUCCESS) {
                context = shared[i].context;
                shared[i].users++;
            }
        } else if (shared[i].users == 0 && free_slot < 0) {
            free_slot = i;
        }
    }
    if (!context) {
        cl_device_id ids[64];
        cl_uint n = 0;
        if (free_slot < 0 ||
            mapping__opencl_driver.clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 64, ids, &n) != CL_SUCCESS || n == 0) {
            context = create_context(platform, 1, &device, err); /* not shared */
        } else {
            context = create_context(platform, n < 64 ? n : 64, ids, err);
            if (*err == CL_SUCCESS) {
                shared[free_slot].platform = platform;
                shared[free_slot].context = context;
                shared[free_slot].users = 1;
            }
        }
    }
    pthread_mutex_unlock(&shared_lock);
    return *err == CL_SUCCESS ? context : NULL;
}

void mapping__opencl_context_release(cl_context context)
{
    pthread_mutex_lock(&shared_lock);
    for (int i = 0; i < SHARED_MAX; i++)
        if (shared[i].users > 0 && shared[i].context == context)
            shared[i].users--;
    pthread_mutex_unlock(&shared_lock);
    mapping__opencl_driver.clReleaseContext(context);
}

/* ---- the staged copy: two page-locked chunks, the read of chunk i + 1 from
 * the source overlapping the write of chunk i to the destination. The two
 * contexts cannot share events, so the host waits between them. ---- */

static cl_int wait_release(cl_event *ev)
{
    cl_int err = CL_SUCCESS;
    if (*ev) {
        err = mapping__opencl_driver.clWaitForEvents(1, ev);
        mapping__opencl_driver.clReleaseEvent(*ev);
        *ev = NULL;
    }
    return err;
}

static mapping_status staged_copy(opencl_device *d, opencl_device *s, cl_mem src, size_t src_offset, cl_mem dst,
                                  size_t dst_offset, size_t bytes)
{
    size_t chunk = bytes < STAGING_CHUNK ? bytes : STAGING_CHUNK;
    size_t count = (bytes + chunk - 1) / chunk;
    void *host[2] = {NULL, NULL}, *cookie[2] = {NULL, NULL};
    cl_event rd[2] = {NULL, NULL}, wr[2] = {NULL, NULL};
    mapping_status st = MAPPING_OK;
    for (int b = 0; b < (count > 1 ? 2 : 1) && st == MAPPING_OK; b++)
        st = mapping__opencl_host_alloc(s, chunk, &host[b], &cookie[b]);
    const char *call = "clEnqueueReadBuffer";
    cl_int err = CL_SUCCESS;
    if (st == MAPPING_OK)
        err = mapping__opencl_driver.clEnqueueReadBuffer(s->queue, src, CL_FALSE, src_offset, chunk, host[0], 0, NULL, &rd[0]);
    for (size_t i = 0; i < count && st == MAPPING_OK && err == CL_SUCCESS; i++) {
        int b = (int)(i % 2), nb = 1 - b;
        size_t n = i + 1 < count ? chunk : bytes - i * chunk;
        call = "clWaitForEvents (read)";
        if ((err = wait_release(&rd[b])) != CL_SUCCESS)
            break;
        if (i + 1 < count) {
            size_t next = i + 2 < count ? chunk : bytes - (i + 1) * chunk;
            call = "clWaitForEvents (write)";
            if ((err = wait_release(&wr[nb])) != CL_SUCCESS)
                break;
            call = "clEnqueueReadBuffer";
            err = mapping__opencl_driver.clEnqueueReadBuffer(s->queue, src, CL_FALSE, src_offset + (i + 1) * chunk, next,
                                                    host[nb], 0, NULL, &rd[nb]);
            if (err != CL_SUCCESS)
                break;
            mapping__opencl_driver.clFlush(s->queue);
        }
        call = "clEnqueueWriteBuffer";
        err = mapping__opencl_driver.clEnqueueWriteBuffer(d->queue, dst, CL_FALSE, dst_offset + i * chunk, n, host[b], 0, NULL,
                                                 &wr[b]);
        if (err == CL_SUCCESS)
            mapping__opencl_driver.clFlush(d->queue);
    }
    for (int b = 0; b < 2; b++) { /* everything in flight ends before the memory goes */
        cl_int e1 = wait_release(&rd[b]), e2 = wait_release(&wr[b]);
        if (err == CL_SUCCESS && (e1 != CL_SUCCESS || e2 != CL_SUCCESS)) {
            err = e1 != CL_SUCCESS ? e1 : e2;
            call = "clWaitForEvents";
        }
    }
    for (int b = 0; b < 2; b++)
        if (host[b])
            mapping__opencl_host_free(s, host[b], cookie[b]);
    if (st == MAPPING_OK && err != CL_SUCCESS)
        st = mapping__opencl_fail(call, err);
    return st;
}

/* A staged copy queued on a stream runs on the stream's host-function
 * thread: the stream's later work waits for it. */
typedef struct staged_job {
    opencl_device *d, *s;
    opencl_stream *stream;
    cl_mem         src, dst;
    size_t         src_offset, dst_offset, bytes;
} staged_job;

static void run_staged_job(void *arg)
{
    staged_job *job = arg;
    mapping_status st = staged_copy(job->d, job->s, job->src, job->src_offset, job->dst, job->dst_offset, job->bytes);
    if (st != MAPPING_OK)
        mapping__opencl_stream_record_error(job->stream, st, mapping__last_message());
    free(job);
}

mapping_status mapping__opencl_peer_copy(void *dev, void *stream, void *src_dev, void *src_mem, size_t src_offset,
                                void *dst_mem, size_t dst_offset, size_t bytes)
{
    opencl_device *d = dev, *s = src_dev;
    if (d->context == s->context)
        return mapping__opencl_copy(dev, stream, src_mem, src_offset, dst_mem, dst_offset, bytes);
    cl_mem src = ((opencl_buffer *)src_mem)->mem, dst = ((opencl_buffer *)dst_mem)->mem;
    if (!stream)
        return staged_copy(d, s, src, src_offset, dst, dst_offset, bytes);
    staged_job *job = mapping_os_malloc(sizeof *job);
    if (!job)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "opencl: out of memory");
    *job = (staged_job){d, s, stream, src, dst, src_offset, dst_offset, bytes};
    mapping_status st = mapping__opencl_launch_host(dev, stream, run_staged_job, job);
    if (st != MAPPING_OK)
        free(job);
    return st;
}

#endif /* MAPPING_OPENCL_HEADERS */
