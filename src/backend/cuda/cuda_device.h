/*
 * The cuda back end's device and the helpers its files share: entering the
 * device's context on whatever thread calls, turning CUresults into statuses,
 * and the arena of page-locked memory that stages asynchronous copies of
 * pageable memory.
 */
#ifndef MAPPING_CUDA_DEVICE_H
#define MAPPING_CUDA_DEVICE_H

#include <pthread.h>
#include "backend/backend.h"
#include "backend/cuda/cuda_driver.h"

/* The staging arena (cuda_staging.c): page-locked chunks, each used as a
 * ring of blocks lent to queued copies of pageable memory. A block's header
 * lies in the chunk just before its data; a host function gives the block
 * back when the stream has passed the copy. */
typedef struct cuda_stage_chunk {
    struct cuda_stage_chunk *next;
    char                    *base;
    size_t                   size;
    size_t                   head, tail; /* next block at head; oldest lent (or not yet reclaimed) at tail */
    size_t                   wrap_end;   /* when wrapped: where the blocks before the wrap end */
    size_t                   blocks;     /* between tail and head */
    bool                     wrapped;
} cuda_stage_chunk;

typedef struct cuda_stage_block {
    cuda_stage_chunk   *chunk;
    struct cuda_staging *arena;
    size_t              size;      /* of the whole block, header included */
    bool                returned;
    void               *copy_out;  /* device-to-host: the caller's pageable destination */
    size_t              copy_out_bytes;
} cuda_stage_block;

typedef struct cuda_staging {
    pthread_mutex_t   lock;
    cuda_stage_chunk *chunks; /* the first, made at open, stays until close */
    size_t            total;  /* bytes in all chunks */
} cuda_staging;

/* A region carved into allocations of 4 KiB units, first fit
 * (cuda_pool.c). `base` is a device address or a host pointer. */
enum { CUDA_POOL_UNIT = 4096 };
#define CUDA_POOL_MAX_BYTES ((size_t)1 << 20) /* larger requests go to the driver */
typedef struct cuda_suballoc {
    pthread_mutex_t lock;
    uintptr_t       base;
    size_t          units;
    uint64_t       *used;   /* a bit per unit */
    uint32_t       *length; /* at an allocation's first unit: its units */
} cuda_suballoc;

/* Idle CUevents of one kind (timed, or CU_EVENT_DISABLE_TIMING), reused by
 * later records instead of a cuEventCreate / cuEventDestroy per record
 * (cuda_events.c). */
enum { CUDA_EVENT_POOL = 64 };
typedef struct cuda_event_pool {
    pthread_mutex_t lock;
    unsigned        flags; /* cuEventCreate's */
    int             count;
    cu_event        idle[CUDA_EVENT_POOL];
} cuda_event_pool;

/* Page-locked host memory the library did not make (another library's
 * pinned memory), as the driver described it: ranges, each re-checked with
 * the driver once it is older than a moment (cuda_host.c). */
enum { CUDA_LOCKED_RANGES = 16 };
typedef struct cuda_locked_cache {
    pthread_mutex_t lock;
    struct {
        uintptr_t start, end; /* [start, end); end 0: unused */
        double    checked;    /* mapping_os_now() of the driver's answer */
        uint64_t  used;       /* for least-recently-used replacement */
    } range[CUDA_LOCKED_RANGES];
    uint64_t clock;
} cuda_locked_cache;

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
    /* Recorded on the legacy stream (of this device's context) just before
     * blocking work goes to `internal`, which waits for it: the blocking
     * call is ordered after the device's native queue (made at open). */
    cu_event           legacy_mark;
    /* The link, measured at open on `internal` (never on the legacy stream,
     * which may hold the user's work): 0 when it could not be. */
    double             link_latency, link_bandwidth;
    bool               managed, concurrent_managed;
    cuda_staging       staging;
    /* Small allocations without driver calls (cuda_pool.c). */
    cuda_suballoc      device_pool, host_pool;
    cu_deviceptr       device_pool_mem;
    void              *host_pool_mem;
    cuda_scatter_mode  scatter_mode;

    /* The scatter/gather kernel, loaded (and its function loaded, not left
     * to lazy loading) at open; NULL when it could not be: then copies. */
    cu_module       module;
    cu_function     copy_entries;
    cu_function     diff_blocks; /* mirrors' device-side diff; NULL when it could not be loaded */
    cu_function     copy_table;  /* graph-replayable copies (cuda_graph.c); NULL when it could not be loaded */

    cuda_event_pool   timed_events, untimed_events;
    cuda_locked_cache locked;
} cuda_device;

/* What mapping__cuda_enter did, for mapping__cuda_leave to undo. */
typedef struct cuda_scope {
    bool pushed;  /* the context was pushed: pop it */
    bool relaxed; /* the thread's capture mode was exchanged for RELAXED: restore `mode` */
    int  mode;
} cuda_scope;

static inline cu_deviceptr cuda_ptr(void *mem)
{
    return (cu_deviceptr)(uintptr_t)mem;
}

/* CU_STREAM_LEGACY or CU_STREAM_PER_THREAD: a stream no one created. */
static inline bool cuda_stream_is_special(const void *stream)
{
    return stream == (const void *)CU_STREAM_LEGACY_ || stream == (const void *)CU_STREAM_PER_THREAD_;
}

/* Map a CUresult to a status and record the failure of `call` with the raw
 * code and its name. CU_SUCCESS gives MAPPING_OK and records nothing. */
mapping_status mapping__cuda_check(cu_result r, const char *call);
/* Makes d's context current on this thread (pushing it only when another
 * one is current) and sets the thread's stream-capture mode to RELAXED
 * (cuThreadExchangeStreamCaptureMode) for the library's driver calls:
 * a synchronize, allocation or blocking copy of the library, made while
 * another thread captures a stream in CU_STREAM_CAPTURE_MODE_GLOBAL (the
 * default of cudaStreamBeginCapture and torch.cuda.graph), is then not
 * refused, nor does it invalidate that capture; what would join or break a
 * capture is refused before (cuda_capture.c, core/capture.c).
 * mapping__cuda_leave undoes both. */
mapping_status mapping__cuda_enter(cuda_device *d, cuda_scope *scope);
void           mapping__cuda_leave(cuda_device *d, const cuda_scope *scope);

/* Runs the statement (which sets st) with d's context current. */
#define IN_CONTEXT(d, ...)                                           \
    do {                                                             \
        cuda_scope scope_;                                           \
        if ((st = mapping__cuda_enter((d), &scope_)) != MAPPING_OK)  \
            break;                                                   \
        __VA_ARGS__;                                                 \
        mapping__cuda_leave((d), &scope_);                           \
    } while (0)
/* Orders d's internal stream after the work queued so far on the legacy
 * stream of d's context (an event recorded there, waited for on internal).
 * The context is current. */
mapping_status mapping__cuda_after_legacy(cuda_device *d);
/* cuda_peer.c: mapping_backend.peer_copy. */
mapping_status mapping__cuda_peer_copy(void *dev, void *stream, void *src_dev, void *src_mem, size_t src_offset,
                              void *dst_mem, size_t dst_offset, size_t bytes);

/* ---- stream capture (cuda_capture.c) ---- */
/* mapping_backend.stream_capture_status. */
mapping_status mapping__cuda_stream_capture_status(void *dev, void *stream, int *status, uint64_t *id);
/* Is s being captured (or is its capture invalidated)? false where the
 * driver cannot say, and for the legacy stream. The context is current. */
bool           mapping__cuda_capturing(cuda_device *d, cu_stream s);
/* MAPPING_ERR_UNSUPPORTED, recorded, naming `what` (what the back end
 * would do at capture time: "a copy of pageable memory is staged now"). */
mapping_status mapping__cuda_capture_refusal(const char *what);

/* ---- events (cuda_events.c): pooled CUevents ---- */
void           mapping__cuda_event_pools_init(cuda_device *d);
void           mapping__cuda_event_pools_destroy(cuda_device *d); /* the context is current */
/* An idle event of the pool, or a new one; the context is current. */
mapping_status mapping__cuda_event_take(cuda_device *d, cuda_event_pool *pool, cu_event *out);
/* Back to the pool (destroyed when it is full); the context is current. */
void           mapping__cuda_event_give(cuda_device *d, cuda_event_pool *pool, cu_event e);
mapping_status mapping__cuda_event_record(void *dev, void *stream, void **event);
mapping_status mapping__cuda_event_wait(void *dev, void *stream, void *event);
mapping_status mapping__cuda_event_synchronize(void *dev, void *event);
mapping_status mapping__cuda_event_query(void *dev, void *event);
mapping_status mapping__cuda_event_elapsed(void *dev, void *start, void *end, double *seconds);
void           mapping__cuda_event_destroy(void *dev, void *event);

/* ---- page-locked memory made elsewhere (cuda_host.c) ---- */
void           mapping__cuda_locked_init(cuda_device *d);
void           mapping__cuda_locked_destroy(cuda_device *d);
/* Is [p, +bytes) page-locked host memory of this context (or portable)
 * that the library did not make? The context is current. */
bool           mapping__cuda_host_locked(cuda_device *d, const void *p, size_t bytes);
/* mapping_backend.host_locked. */
bool           mapping__cuda_host_locked_op(void *dev, const void *p, size_t bytes);

/* ---- adopting memory and streams made elsewhere (cuda_import.c) ---- */
mapping_status mapping__cuda_buffer_import(void *dev, void *native, size_t offset, size_t bytes, void **mem);
void           mapping__cuda_buffer_unimport(void *dev, void *mem);
mapping_status mapping__cuda_stream_import(void *dev, void *native, void **stream);
void           mapping__cuda_stream_unimport(void *dev, void *stream);

/* ---- staging arena (cuda_staging.c) ----
 * init makes the first chunk (at open); trim frees idle chunks above the
 * high-water mark, and is called only where the back end frees driver memory
 * anyway (never from a synchronize, a copy or a host function); destroy
 * frees everything. The context must be current for all three. */
mapping_status mapping__cuda_staging_init(cuda_device *d);
void           mapping__cuda_staging_trim(cuda_device *d);
void           mapping__cuda_staging_destroy(cuda_device *d);

/* ---- small allocations from regions made at open (cuda_pool.c) ----
 * take fails (false) when the request is over CUDA_POOL_MAX_BYTES or finds
 * no room; give returns false for an address outside the region. The
 * context must be current for init and destroy. */
bool mapping__cuda_suballoc_init(cuda_suballoc *a, uintptr_t base, size_t bytes);
void mapping__cuda_suballoc_destroy(cuda_suballoc *a);
bool mapping__cuda_suballoc_take(cuda_suballoc *a, size_t bytes, uintptr_t *out);
bool mapping__cuda_suballoc_give(cuda_suballoc *a, uintptr_t p);
void mapping__cuda_pools_init(cuda_device *d);
void mapping__cuda_pools_destroy(cuda_device *d);

/* Asynchronous copies of pageable host memory through a staging block: they
 * return once queued, never waiting for the stream (cuda_staging.c). */
mapping_status mapping__cuda_staged_write(cuda_device *d, cu_stream s, const void *src, cu_deviceptr dst, size_t bytes);
mapping_status mapping__cuda_staged_read(cuda_device *d, cu_stream s, cu_deviceptr src, void *dst, size_t bytes);

/* ---- scatter / gather (mapping__cuda_scatter.c) ---- */
mapping_status mapping__cuda_scatter(void *dev, void *stream, void *staging_mem, size_t table_offset,
                            const mapping_scatter_entry *table, size_t count, void *dst_mem);
mapping_status mapping__cuda_gather(void *dev, void *stream, void *src_mem, void *staging_mem, size_t table_offset,
                           const mapping_scatter_entry *table, size_t count);
/* The mirrors' device-side diff (mapping_backend.diff_blocks), with the
 * kernel of the same module; MAPPING_ERR_UNSUPPORTED where it is not loaded. */
mapping_status mapping__cuda_diff_blocks(void *dev, void *stream, void *mem, size_t mem_offset, void *shadow_mem,
                                         size_t shadow_offset, size_t bytes, void *flags_mem, size_t flags_offset);
/* At open: loads the kernel module and its functions (cuFuncLoad where
 * the driver has it, else a launch over nothing of each), so that no
 * blocking flush or sync ever loads a module (lazy loading may synchronize
 * the context, hanging behind a stream held by the caller). A driver that
 * refuses the PTX (its JIT) fails the open, with the JIT's log in the
 * message; one without module entry points scatters by batch copy or
 * copies. The context is current. */
mapping_status mapping__cuda_kernels_load(cuda_device *d);
void           mapping__cuda_kernels_unload(cuda_device *d);

/* ---- copies a captured graph replays with new ranges (cuda_graph.c) ---- */
mapping_status mapping__cuda_copy_table(void *dev, void *stream, const uint64_t *table, size_t capacity, void *host,
                                        void *mem, size_t mem_offset, bool to_host);
mapping_status mapping__cuda_graph_retain(void *dev, void *stream, void (*release)(void *user), void *user);

#endif /* MAPPING_CUDA_DEVICE_H */
