/*
 * The cuda back end's device and the helpers its files share: entering the
 * device's context on whatever thread calls, turning CUresults into statuses,
 * and the pool of page-locked staging blocks for asynchronous copies of
 * pageable memory.
 */
#ifndef MAPPING_CUDA_DEVICE_H
#define MAPPING_CUDA_DEVICE_H

#include <pthread.h>
#include "backend/backend.h"
#include "backend/cuda/cuda_driver.h"

/* A page-locked block lent to one queued copy; returned to the pool by a
 * host function when the stream has passed the copy. */
typedef struct cuda_stage_block {
    struct cuda_stage_block *next;
    struct cuda_staging     *pool;
    void                    *ptr;
    size_t                   capacity;
    void                    *copy_out;       /* device-to-host: the caller's pageable destination */
    size_t                   copy_out_bytes;
} cuda_stage_block;

enum { CUDA_STAGE_CLASSES = 48 }; /* capacity = 2^class bytes */

typedef struct cuda_staging {
    pthread_mutex_t   lock;
    cuda_stage_block *free_blocks[CUDA_STAGE_CLASSES];
    size_t            free_bytes;
} cuda_staging;

/* How scatter/gather run (MAPPING_CUDA_SCATTER=auto|batch|kernel|copies). */
typedef enum cuda_scatter_mode {
    CUDA_SCATTER_AUTO,   /* batch copy if the driver has it, else the kernel */
    CUDA_SCATTER_BATCH,  /* cuMemcpyBatchAsync */
    CUDA_SCATTER_KERNEL, /* the library's PTX kernel */
    CUDA_SCATTER_COPIES, /* one cuMemcpyDtoDAsync per entry */
} cuda_scatter_mode;

typedef struct cuda_device {
    const cuda_driver *cu;
    int                ordinal;
    cu_device          device;
    cu_context         ctx;      /* the device's primary context, retained */
    cu_stream          internal; /* non-blocking; for blocking work that needs a real stream */
    bool               managed, concurrent_managed;
    cuda_staging       staging;
    cuda_scatter_mode  scatter_mode;

    pthread_mutex_t kernels_lock;
    bool            kernels_tried;
    cu_module       module;  /* NULL until loaded, or when loading failed */
    cu_function     copy_entries;
} cuda_device;

static inline cu_deviceptr cuda_ptr(void *mem)
{
    return (cu_deviceptr)(uintptr_t)mem;
}

/* Map a CUresult to a status and record the failure of `call` with the raw
 * code and its name. CU_SUCCESS gives MAPPING_OK and records nothing. */
mapping_status cuda_check(cu_result r, const char *call);
/* Makes d's context current on this thread (pushing it only when another
 * one is current); *pushed says whether cuda_leave must pop it. */
mapping_status cuda_enter(cuda_device *d, bool *pushed);
void           cuda_leave(cuda_device *d, bool pushed);
/* cuda_peer.c: mapping_backend.peer_copy. */
mapping_status cuda_peer_copy(void *dev, void *stream, void *src_dev, void *src_mem, size_t src_offset,
                              void *dst_mem, size_t dst_offset, size_t bytes);

/* ---- staging pool (cuda_staging.c); the context must be current for get,
 * trim and destroy; put makes no driver call, so host functions may use it. */
void              cuda_staging_init(cuda_staging *pool);
cuda_stage_block *cuda_stage_get(cuda_device *d, size_t bytes, mapping_status *st);
void              cuda_stage_put(cuda_stage_block *block);
void              cuda_staging_trim(cuda_device *d);
void              cuda_staging_destroy(cuda_device *d);

/* Asynchronous copies of pageable host memory through a staging block: they
 * return once queued, never waiting for the stream (cuda_staging.c). */
mapping_status cuda_staged_write(cuda_device *d, cu_stream s, const void *src, cu_deviceptr dst, size_t bytes);
mapping_status cuda_staged_read(cuda_device *d, cu_stream s, cu_deviceptr src, void *dst, size_t bytes);

/* ---- scatter / gather (cuda_scatter.c) ---- */
mapping_status cuda_scatter(void *dev, void *stream, void *staging_mem, size_t table_offset,
                            const mapping_scatter_entry *table, size_t count, void *dst_mem);
mapping_status cuda_gather(void *dev, void *stream, void *src_mem, void *staging_mem, size_t table_offset,
                           const mapping_scatter_entry *table, size_t count);
void           cuda_kernels_unload(cuda_device *d);

#endif /* MAPPING_CUDA_DEVICE_H */
