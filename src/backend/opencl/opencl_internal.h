/*
 * The OpenCL back end's objects, shared by its files:
 *   opencl.c          load, devices, the back-end table
 *   opencl_memory.c   buffers, page-locked host memory, SVM
 *   opencl_queue.c    streams, transfers, host functions, events
 *   opencl_scatter.c  the scatter/gather kernel
 *   (and opencl_peer.c, opencl_import.c, opencl_program_cache.c)
 */
#ifndef MAPPING_BACKEND_OPENCL_INTERNAL_H
#define MAPPING_BACKEND_OPENCL_INTERNAL_H

#include <pthread.h>
#include "backend/backend.h"
#include "backend/opencl/opencl_api.h"
#ifdef MAPPING_OPENCL_HEADERS

/* A host function queued by launch_host: the worker waits for `reached`,
 * runs fn, then completes `done`, which the stream's queue waits on. */
typedef struct opencl_host_job {
    cl_event             reached, done;
    void               (*fn)(void *);
    void                *user;
    struct opencl_host_job *next;
} opencl_host_job;

typedef struct opencl_stream {
    cl_command_queue queue; /* in order, profiling enabled (events time themselves) */

    pthread_mutex_t lock;   /* guards everything below */
    pthread_cond_t  cond;
    bool            worker_started, stopping;
    pthread_t       worker;
    opencl_host_job   *head, *tail;
    mapping_status  first_error; /* of queued work, until stream_synchronize reports it */
    char            error_message[256];
    bool            failed; /* a host function's wait failed: no more host functions run */
} opencl_stream;

typedef struct opencl_device {
    cl_platform_id   platform;
    cl_device_id     device;
    cl_context       context;
    bool             context_adopted; /* the caller's (retained), not from mapping__opencl_context_acquire */
    cl_command_queue queue;    /* in order, for blocking calls (stream == NULL) */
    /* A stream on `queue` (not owning it): a blocking call of several steps
     * queues them here and waits once (backend stream_blocking). */
    opencl_stream    blocking;
    bool             blocking_ready;
    bool             svm_fine; /* fine-grain buffer SVM: buffer_alloc_unified works */

    /* The scatter/gather kernels, built on first use. cl_kernel arguments are
     * state shared by every caller, so setting them and enqueueing is one
     * critical section. */
    pthread_mutex_t kernel_lock;
    bool            kernels_built;
    cl_program      program;
    cl_kernel       scatter, gather;
    cl_kernel       scatter_slices, gather_slices; /* CPU devices, small entries: a slice of entries per work-item */
    cl_kernel       diff;                          /* mirrors' device-side diff (mapping_diff_blocks) */
    cl_kernel       diff_groups;                   /* the same, a work-group per block (GPUs) */
    bool            diff_by_groups;                /* $MAPPING_OPENCL_DIFF, or not a CPU device */
    cl_uint         compute_units;
    size_t          group_size;   /* work-items per work-group of their launches */
    bool            sliced_lanes; /* CPU device: an entry's work-items copy contiguous slices */
} opencl_device;

/* Device memory: a cl_mem, and the SVM allocation behind it when unified. */
typedef struct opencl_buffer {
    cl_mem mem;
    void  *svm;
} opencl_buffer;


/* Records the first asynchronous error of a stream (thread-safe). */
void mapping__opencl_stream_record_error(opencl_stream *s, mapping_status st, const char *message);

/* Device, memory, queue and scatter operations (the table is in opencl.c). */
mapping_status mapping__opencl_buffer_alloc(void *dev, size_t bytes, void **mem);
mapping_status mapping__opencl_buffer_alloc_unified(void *dev, size_t bytes, void **mem, void **host);
void           mapping__opencl_buffer_free(void *dev, void *mem);
mapping_status mapping__opencl_buffer_native(void *dev, void *mem, void **native);
mapping_status mapping__opencl_host_alloc(void *dev, size_t bytes, void **ptr, void **cookie);
void           mapping__opencl_host_free(void *dev, void *ptr, void *cookie);

mapping_status mapping__opencl_stream_create(void *dev, void **stream);
void           mapping__opencl_stream_destroy(void *dev, void *stream);
/* The device's blocking stream on its own queue (opencl_device.blocking):
 * set up once the queue exists; torn down before the queue is released. */
void           mapping__opencl_blocking_stream_init(opencl_device *d);
void           mapping__opencl_blocking_stream_fini(opencl_device *d);
void          *mapping__opencl_stream_blocking(void *dev);
mapping_status mapping__opencl_stream_synchronize(void *dev, void *stream);
mapping_status mapping__opencl_stream_native(void *dev, void *stream, void **native);
mapping_status mapping__opencl_write(void *dev, void *stream, const void *src, const mapping_host_ref *pinned, void *dst_mem,
                         size_t dst_offset, size_t bytes);
mapping_status mapping__opencl_read(void *dev, void *stream, void *src_mem, size_t src_offset, void *dst,
                        const mapping_host_ref *pinned, size_t bytes);
mapping_status mapping__opencl_copy(void *dev, void *stream, void *src_mem, size_t src_offset, void *dst_mem, size_t dst_offset,
                        size_t bytes);
mapping_status mapping__opencl_fill(void *dev, void *stream, void *mem, size_t offset, size_t bytes, unsigned char value);
mapping_status mapping__opencl_launch_host(void *dev, void *stream, void (*fn)(void *), void *user);
mapping_status mapping__opencl_event_record(void *dev, void *stream, void **event);
mapping_status mapping__opencl_event_wait(void *dev, void *stream, void *event);
mapping_status mapping__opencl_event_synchronize(void *dev, void *event);
mapping_status mapping__opencl_event_query(void *dev, void *event);
mapping_status mapping__opencl_event_elapsed(void *dev, void *start, void *end, double *seconds);
void           mapping__opencl_event_destroy(void *dev, void *event);

/* The queue a call goes to: the stream's, or the device's for blocking calls. */
static inline cl_command_queue opencl_queue_of(opencl_device *d, void *stream)
{
    return stream ? ((opencl_stream *)stream)->queue : d->queue;
}
/* Waits for an event of a blocking call and releases it; MAPPING_OK or the
 * failure (of the wait, or of the command). */
mapping_status mapping__opencl_finish_blocking(const char *call, cl_int err, cl_event ev);

mapping_status mapping__opencl_map(void *dev, void *mem, size_t offset, size_t bytes, void **host);
mapping_status mapping__opencl_unmap(void *dev, void *mem, void *host);
mapping_status mapping__opencl_scatter(void *dev, void *stream, void *staging_mem, size_t table_offset,
                           const mapping_scatter_entry *table, size_t count, void *dst_mem);
mapping_status mapping__opencl_gather(void *dev, void *stream, void *src_mem, void *staging_mem, size_t table_offset,
                          const mapping_scatter_entry *table, size_t count);
mapping_status mapping__opencl_diff_blocks(void *dev, void *stream, void *mem, size_t mem_offset, void *shadow_mem,
                                           size_t shadow_offset, size_t bytes, void *flags_mem, size_t flags_offset);
void           mapping__opencl_kernels_release(opencl_device *d);
/* At open: builds the kernels if a kept program binary allows it cheaply. */
void           mapping__opencl_kernels_prepare(opencl_device *d);
/* Program binaries kept between processes (opencl_program_cache.c): a built
 * program from the cache, or NULL (then build from source and store it). */
cl_program     mapping__opencl_program_from_cache(opencl_device *d, const char *source, const char *options);
void           mapping__opencl_program_to_cache(opencl_device *d, cl_program program, const char *source, const char *options);

/* opencl_peer.c: one context per platform shared by its open devices (a
 * reference each), and copies between devices. */
cl_context     mapping__opencl_context_acquire(cl_platform_id platform, cl_device_id device, cl_int *err);
void           mapping__opencl_context_release(cl_context context);
mapping_status mapping__opencl_peer_copy(void *dev, void *stream, void *src_dev, void *src_mem, size_t src_offset,
                                void *dst_mem, size_t dst_offset, size_t bytes);
/* Adopting objects made elsewhere (opencl_import.c). */
bool           mapping__opencl_can_import(void); /* the entry points are there */
mapping_status mapping__opencl_device_synchronize(void *dev);
mapping_status mapping__opencl_buffer_import(void *dev, void *native, size_t offset, size_t bytes, void **mem);
void           mapping__opencl_buffer_unimport(void *dev, void *mem);
/* A caller's queue: of this context and device, and in order. */
mapping_status mapping__opencl_check_queue(cl_command_queue queue, cl_context context, cl_device_id device);
mapping_status mapping__opencl_stream_import(void *dev, void *native, void **stream);
void           mapping__opencl_stream_unimport(void *dev, void *stream);

#endif /* MAPPING_OPENCL_HEADERS */
#endif
