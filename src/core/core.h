/*
 * The core layer's objects. Public handles are these structs; layers above
 * (transfer, coherence, observe) may read them but create and destroy them
 * only through core's internal functions (below and in core/ops.h).
 */
#ifndef MAPPING_CORE_H
#define MAPPING_CORE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include "backend/backend.h"
#include "os/os.h"
#include "os/status.h"
#include "mapping.h"

/* Counters behind mapping_stats; relaxed atomics, one cache line apart from
 * the device's read-mostly fields. */
/* A byte range [lo, hi), lo < hi: the coherence layer's range sets hold
 * them, and the transfer layer moves lists of them (mapping__transfer_ranges). */
typedef struct mapping_range {
    size_t lo, hi;
} mapping_range;

/* core/radix_sort.c: sorts v[0, n) by lo, stably (equal lo keep their
 * order), using tmp[0, n) as the second array; returns the sorted array,
 * v or tmp. */
mapping_range *mapping__radix_sort(mapping_range *v, mapping_range *tmp, size_t n);

typedef struct mapping_counters {
#define MAPPING_COUNTER_FIELD_(field) _Atomic uint64_t field;
    MAPPING_STATS_LIST(MAPPING_COUNTER_FIELD_)
#undef MAPPING_COUNTER_FIELD_
} mapping_counters;

/* One page-locked host allocation (or registration) of a device. */
typedef struct mapping_host_block {
    uintptr_t start;
    size_t    bytes;
    void     *cookie;
    bool      registered; /* host_register (user memory) rather than host_alloc */
    bool      owned;      /* a library object's (a mirror's CPU side, staging): mapping_free_cpu refuses it */
} mapping_host_block;

typedef struct mapping_host_registry {
    pthread_mutex_t     lock;
    mapping_host_block *blocks; /* sorted by start, non-overlapping */
    size_t              count, capacity;
    _Atomic size_t      published_count; /* lets lookups skip the lock when empty */
} mapping_host_registry;

/* Intrusive list of a device's live objects, for cleanup at close. */
typedef struct mapping_list_node {
    struct mapping_list_node *prev, *next;
} mapping_list_node;

struct mapping_stream {
    mapping_device   *dev;
    void             *state;
    mapping_list_node node;
    bool              imported; /* mapping_import_stream: the caller's queue */
    const char       *owner;    /* a library object's (a pipeline's): mapping_stream_destroy refuses it */
    mapping_list_node fences;   /* its work that reads other devices' memory (core/peer_fence.c) */
};

struct mapping_device {
    uint64_t               serial; /* unique per mapping_open in this process */
    const mapping_backend *be;
    void                  *state; /* the back end's device */
    bool                   map_copies; /* mapping__can_map: set at open (device.c) */
    mapping_device_info    info;
    mapping_host_registry  host_blocks;

    pthread_mutex_t   objects_lock;
    mapping_list_node buffers, streams, events; /* live objects */
    /* Work queued on other devices' streams that reads this device's memory
     * (core/peer_fence.c): mapping_close waits for it. */
    mapping_list_node fences;

    pthread_mutex_t link_lock;
    mapping_link    link; /* 0 fields: not measured yet */
    /* Devices whose memory is not the CPU's: the link's probe memory, from
     * open to close, so measuring never allocates or frees (device.c). */
    void *probe_mem, *probe_host, *probe_cookie;

    /* Where the back end has one (stream_blocking): a stream on the queue of
     * blocking calls, for one wait per multi-step blocking call (a batch
     * flush); .state NULL otherwise. Not a handle: never given out. */
    mapping_stream blocking;

    _Atomic unsigned checks; /* MAPPING_DEVICE_CHECK_* (mapping_device_set_checks) */
    /* mapping_pipeline_run calls in progress on this device: mapping_close
     * refuses BUSY meanwhile (a step that closes the device would leave
     * the run using freed streams and buffers). */
    _Atomic int running_pipelines;

    /* mapping_device_set_host_registration (core/host_cache.c): copies of
     * at least this many bytes of pageable memory register it in place (0:
     * off), and the cache of those registrations. */
    _Atomic size_t             host_cache_min;
    struct mapping_host_cache *host_cache;
    /* mapping_device_wait_native (core/native_order.c): per native queue,
     * an event (the back end's) at the end of its work when it was called,
     * which every stream made from then on waits for; NULL when none.
     * Under objects_lock. */
    struct mapping_native_marks *native_marks;
    /* The memory budget (core/budget.c): counted device memory (mirror
     * sides, the program's buffers) and the owners of memory it may evict. */
    _Atomic uint64_t  budget;         /* bytes; 0: none */
    _Atomic uint64_t  resident;       /* counted bytes allocated now */
    _Atomic uint64_t  resident_plain; /* of which buffers from mapping_allocate_gpu */
    _Atomic uint64_t  use_clock;      /* the last use stamp given out (least recently used first) */
    pthread_mutex_t   reclaim_lock;   /* the list below; one eviction at a time per device */
    mapping_list_node reclaimables;

    _Atomic int fault_countdown; /* > 0: that many more operations succeed */
    _Atomic int fault_armed;
    _Atomic int fault_any; /* 1: every fallible back-end call counts (mapping__inject_fault_any) */

    _Alignas(64) mapping_counters counters;
};

struct mapping_buffer {
    mapping_device   *dev;
    void             *mem;
    size_t            size;
    mapping_list_node node;
    /* A library object's buffer (a mirror's GPU side, a pipeline's chunk
     * buffers), given out by a getter: mapping_free_gpu refuses it (the
     * object would use it after the free); NULL for the program's. */
    const char       *owner;
    /* Imported (mapping_import_gpu): memory the caller owns; freeing drops
     * the library's handle and then calls release(release_user). */
    bool              imported;
    /* Bytes counted against the device's budget (0: not counted); plain:
     * the program's own (mapping_allocate_gpu), never evicted. */
    size_t            counted;
    bool              plain;
    void            (*release)(void *user);
    void             *release_user;
};

struct mapping_event {
    mapping_device   *dev;
    void             *state;
    const void       *stream_state; /* the stream it was recorded on (its back-end state) */
    mapping_list_node node;
    uint64_t          capture; /* recorded in a capture into a graph: its id (core/capture.c); else 0 */
};

/* ---- the registry of live handles (src/core/handles.c) ----
 * Every object a public function accepts is added when created and removed
 * before it is freed; a handle is looked up (never dereferenced) before any
 * of its fields is read. Lookups take no lock. */
#define MAPPING_HANDLE_KIND_LIST(X) X(DEVICE) X(BUFFER) X(STREAM) X(EVENT) X(MIRROR) X(BATCH) X(PIPELINE) X(MULTIMIRROR)
typedef enum mapping_handle_kind {
#define MAPPING_HANDLE_KIND_ENUM_(kind) MAPPING_HANDLE_##kind,
    MAPPING_HANDLE_KIND_LIST(MAPPING_HANDLE_KIND_ENUM_)
#undef MAPPING_HANDLE_KIND_ENUM_
    MAPPING_HANDLE_KINDS
} mapping_handle_kind;
/* MAPPING_ERR_OUT_OF_HOST_MEMORY (not recorded) when the set cannot grow. */
mapping_status mapping__handle_add(mapping_handle_kind kind, const void *handle);
bool           mapping__handle_live(mapping_handle_kind kind, const void *handle);
/* false when it was not live (nothing changes): lets exactly one of two
 * destroys of the same handle go ahead. */
bool           mapping__handle_remove(mapping_handle_kind kind, const void *handle);
/* How many handles (of any kind) have been removed so far. A lookup that
 * found a handle live stays true while this has not changed: a call made
 * many times on the same objects (a batch add) looks them up once and then
 * compares this count (read before the lookup it stands for). */
extern _Atomic uint64_t mapping__handle_epoch;
static inline uint64_t mapping__handle_removals_any(void)
{
    return atomic_load_explicit(&mapping__handle_epoch, memory_order_acquire);
}
/* One call site's memory of the last handle it found live, per thread: a
 * loop of batch adds or mirror marks looks up the same handle on every call
 * and, while no handle has been removed since, finds it here with no hash
 * and no probe (an add went from 6.0 to 5.0 ns). Declare it
 * `static _Thread_local MAPPING_TLS_FAST mapping_live_memo` at the call site:
 * initial-exec TLS is a load relative to the thread pointer, where the
 * default model calls __tls_get_addr, which cost more than the lookup it
 * saves. Its bytes come from the static TLS block, whose surplus glibc keeps
 * for libraries loaded with dlopen (as Python loads this one). */
#define MAPPING_TLS_FAST __attribute__((tls_model("initial-exec")))
typedef struct mapping_live_memo {
    const void *handle;
    uint64_t    removals;
} mapping_live_memo;
/* mapping__handle_live, remembered: `removals` is mapping__handle_removals_any
 * read before this call (a count that has not moved since the remembered
 * lookup vouches for it: mapping__handle_remove bumps it after clearing). */
static inline bool mapping__handle_live_memo(mapping_live_memo *memo, mapping_handle_kind kind, const void *handle,
                                             uint64_t removals)
{
    if (handle && handle == memo->handle && removals == memo->removals)
        return true;
    if (!mapping__handle_live(kind, handle))
        return false;
    memo->handle = handle;
    memo->removals = removals;
    return true;
}
/* dev is a live device and the one a dependent object (mirror, batch,
 * pipeline) was made on: not closed since, nor another device opened at the
 * same address. */
bool           mapping__device_alive(const mapping_device *dev, uint64_t serial);

/* ---- validation (src/core/validate.c) ---- */
mapping_status mapping__check_device(const char *fn, const mapping_device *dev);
mapping_status mapping__check_buffer(const char *fn, const char *what, const mapping_buffer *buf);
mapping_status mapping__check_stream(const char *fn, const mapping_stream *stream); /* NULL is fine */
mapping_status mapping__check_event(const char *fn, const char *what, const mapping_event *ev);
/* [offset, +bytes) is a non-empty range within size bytes; inline, as it is
 * checked per batch add and per range: the failure is mapping__range_fail. */
mapping_status mapping__range_fail(const char *fn, const char *what, size_t offset, size_t bytes, size_t size);
static inline mapping_status mapping__check_range(const char *fn, const char *what, size_t offset, size_t bytes,
                                                  size_t size)
{
    if (bytes != 0 && offset <= size && bytes <= size - offset)
        return MAPPING_OK;
    return mapping__range_fail(fn, what, offset, bytes, size);
}
/* A device-to-device copy's arguments: the stream (NULL is fine), both
 * buffers and both ranges. Which devices may take part is the caller's own
 * check, then mapping__check_no_overlap (within one buffer). */
mapping_status mapping__check_copy(const char *fn, const mapping_stream *stream, const mapping_buffer *src,
                                   size_t src_offset, const mapping_buffer *dst, size_t dst_offset, size_t bytes);
mapping_status mapping__check_no_overlap(const char *fn, const mapping_buffer *src, size_t src_offset,
                                         const mapping_buffer *dst, size_t dst_offset, size_t bytes);
/* ptr is not NULL; inline (checked per batch add), the failure out of line. */
mapping_status mapping__null_fail(const char *fn, const char *what);
static inline mapping_status mapping__check_ptr(const char *fn, const char *what, const void *ptr)
{
    return ptr ? MAPPING_OK : mapping__null_fail(fn, what);
}
/* MAPPING_ERR_BUSY when called from a host function running on `stream`
 * (waiting for or destroying it there would deadlock); NULL is fine. */
mapping_status mapping__check_not_in_host_fn(const char *fn, const mapping_stream *stream);
/* Waits for the event, or, called from a host function running on the
 * stream the event was recorded on while the event is not complete (it
 * was recorded after the function: the wait would never end),
 * MAPPING_ERR_BUSY without waiting. stream.c. */
mapping_status mapping__event_wait(const char *fn, mapping_event *event);
/* stream (may be NULL) and object must be of dev. */
mapping_status mapping__check_same_device(const char *fn, const mapping_device *dev, const mapping_stream *stream);

/* ---- stream capture into graphs, at the public boundary (core/capture.c) ----
 * MAPPING_ERR_UNSUPPORTED, recorded under fn, when the call cannot be
 * captured correctly: a stream that is being captured (or whose capture was
 * invalidated), or with stream NULL a blocking call whose work would depend
 * on a capture (the legacy stream while a blocking stream captures).
 * MAPPING_OK at once where the back end has no capture. */
mapping_status mapping__stream_refuse_capture(mapping_device *dev, mapping_stream *stream, const char *fn);
/* The same, saying why the call cannot be captured. */
mapping_status mapping__stream_refuse_capture_why(mapping_device *dev, mapping_stream *stream, const char *fn,
                                                  const char *why);
/* Work queued on the stream that a capture records correctly (a copy
 * between buffers, a fill, a host function, an event): refused only as
 * above when not ACTIVE, and a host function under MAPPING_CHECK=races;
 * *id (may be NULL) the capture's id, 0 when none. */
mapping_status mapping__capture_check_queued(const char *fn, mapping_device *dev, mapping_stream *stream,
                                             bool host_function, uint64_t *id);
/* A copy between a buffer and host memory: on a capturing stream only from
 * or into page-locked memory (a copy node reads it at each replay); pageable
 * memory would be staged now. */
mapping_status mapping__capture_check_copy(const char *fn, mapping_device *dev, mapping_stream *stream,
                                           const void *host, size_t bytes);
/* An event recorded in a capture can be neither waited for nor queried
 * nor timed by the host. */
mapping_status mapping__capture_check_event(const char *fn, const mapping_event *event);
/* stream waits for event: in a capture, only for an event of the same
 * capture; outside one, an event of a capture still going on (the stream
 * joins it). */
mapping_status mapping__capture_check_wait(const char *fn, mapping_stream *stream, const mapping_event *event);

/* ---- host memory registry (src/core/host_memory.c) ---- */
void           mapping__host_registry_init(mapping_host_registry *r);
void           mapping__host_registry_destroy(mapping_device *dev);
mapping_status mapping__host_registry_add(mapping_host_registry *r, void *ptr, size_t bytes, void *cookie, bool registered);
bool           mapping__host_registry_remove(mapping_host_registry *r, void *ptr, mapping_host_block *removed);
/* Is [ptr, ptr+bytes) inside one block? Fills ref if so. */
bool           mapping__host_registry_find(mapping_host_registry *r, const void *ptr, size_t bytes,
                                           mapping_host_ref *ref);

/* ---- internal twins of public functions (mapping__X for mapping_X): the
 * same work on arguments the caller has validated, so that validation
 * happens once, at the public boundary. Errors are recorded under the public
 * function's name. The upper layers call these, never the public API. ---- */
mapping_status mapping__allocate_gpu(mapping_device *dev, size_t bytes, mapping_buffer **out); /* bytes > 0 */
void           mapping__free_gpu(mapping_buffer *buf);
mapping_status mapping__allocate_cpu(mapping_device *dev, size_t bytes, void **out); /* bytes > 0 */
/* false (nothing recorded) when ptr is not from mapping__allocate_cpu of dev. */
bool           mapping__free_cpu(mapping_device *dev, void *ptr);
mapping_status mapping__stream_create(mapping_device *dev, mapping_stream **out);
void           mapping__stream_destroy(mapping_stream *stream); /* waits for its work first */
mapping_status mapping__event_record(mapping_stream *stream, mapping_event **out);
void           mapping__event_destroy(mapping_event *event);
/* Measured on first use (or as set); see mapping_device_link. */
mapping_status mapping__device_link(mapping_device *dev, mapping_link *out);
/* The link of direct copies from src's memory to dst's (core/peer.c),
 * measured now with uncounted copies (a few milliseconds): latency and
 * bandwidth as in mapping_link. Only where mapping__can_copy_peer_direct. */
mapping_status mapping__peer_link_measure(mapping_device *src, mapping_device *dst, mapping_link *out);
/* Stream and event operations, and transfers: src/core/ops.h. */

/* ---- the memory budget (src/core/budget.c) ----
 * Counted device memory: the program's buffers (mapping_allocate_gpu) and
 * the memory of objects that register a mapping_reclaimable (mirror device
 * sides, multimirror replicas: the coherence layer). When a counted
 * allocation would exceed the budget, core evicts registered owners, least
 * recently used first (EVICT_FIRST hints before the others, KEEP never),
 * by calling their evict hook until the allocation fits; core knows
 * nothing else of them. */
typedef struct mapping_reclaimable mapping_reclaimable;
/* What an evict hook did: freed its memory; could not now because a call
 * on another thread holds the owner (it will be idle again soon: the
 * allocation waits a little for it); or will not (acquired, work queued,
 * a graph addresses it, the eviction failed). */
typedef enum mapping_evict_result {
    MAPPING_EVICT_REFUSED = 0,
    MAPPING_EVICT_DONE,
    MAPPING_EVICT_IN_USE,
} mapping_evict_result;
struct mapping_reclaimable {
    mapping_list_node node;
    _Atomic uint64_t  stamp; /* the device's use_clock at the last use */
    _Atomic int       hint;  /* mapping_residency */
    _Atomic size_t    bytes; /* counted device bytes it holds now; 0: nothing to evict */
    uint64_t          tried; /* the reclaim round that last tried it (reclaim_lock held) */
    /* Evicts it now if it can (not in use on any thread, nothing queued).
     * Called with the device's reclaim_lock held, on the thread that needs
     * the memory; it must not allocate counted memory (an allocation it
     * makes is refused, not reclaimed). */
    mapping_evict_result (*evict)(mapping_reclaimable *r);
};
/* This thread, as a token (the address of a thread-local): an owner records
 * it while a call holds its lock, so that its evict hook can tell a call on
 * the allocating thread itself (REFUSED: it cannot end before the
 * allocation does) from one on another thread (IN_USE: it ends soon). */
const void *mapping__reclaim_thread_token(void);
void mapping__reclaimable_add(mapping_device *dev, mapping_reclaimable *r);
void mapping__reclaimable_remove(mapping_device *dev, mapping_reclaimable *r);
/* r was used now: the last to be evicted of its hint. */
static inline void mapping__reclaimable_touch(mapping_device *dev, mapping_reclaimable *r)
{
    atomic_store_explicit(&r->stamp, atomic_fetch_add_explicit(&dev->use_clock, 1, memory_order_relaxed) + 1,
                          memory_order_relaxed);
}
/* Counts `bytes` more resident, evicting registered owners while the
 * budget would be exceeded; MAPPING_ERR_OUT_OF_DEVICE_MEMORY (recorded
 * under fn, naming the budget and what holds it) when it cannot. plain:
 * the program's own buffer. */
mapping_status mapping__budget_reserve(const char *fn, mapping_device *dev, size_t bytes, bool plain);
void           mapping__budget_release(mapping_device *dev, size_t bytes, bool plain);
/* Evicts owners until resident <= target or none can be: how many. */
size_t         mapping__budget_reclaim(mapping_device *dev, uint64_t target);
/* True on a thread inside an eviction (its evict hook runs). */
bool           mapping__budget_reclaiming(void);
/* $MAPPING_MEMORY_BUDGET: decimal digits, 0 to 2^60 (0, unset or empty:
 * no budget); false for anything else. */
bool           mapping__budget_from_env(uint64_t *out);
/* A device buffer counted against the budget (a mirror's device side, a
 * multimirror replica, a diff shadow): errors name fn. */
mapping_status mapping__allocate_gpu_counted(const char *fn, mapping_device *dev, size_t bytes, mapping_buffer **out);

/* ---- unified memory as a buffer (src/core/buffer.c), for unified mirrors:
 * freed by mapping_free_gpu; *host is its CPU address. ---- */
mapping_status mapping__allocate_unified(const char *fn, mapping_device *dev, size_t bytes, mapping_buffer **out,
                                         void **host);

/* ---- registration of large pageable copies in place (core/host_cache.c) ---- */
typedef struct mapping_host_cache mapping_host_cache;
/* Whether a copy of `bytes` bytes of pageable memory of dev should be
 * registered in place first (mapping_device_set_host_registration). */
static inline bool mapping__host_cache_wanted(const mapping_device *dev, size_t bytes)
{
    size_t min = atomic_load_explicit(&dev->host_cache_min, memory_order_relaxed);
    return min && bytes >= min;
}
/* Registers what [ptr, +bytes) lacks (in parallel chunks, evicting the least
 * recently used beyond the capacity); false when some of it cannot be (then
 * the copy is staged as before; nothing is recorded). */
bool mapping__host_cache_prepare(mapping_device *dev, const void *ptr, size_t bytes);
/* The registration holding ptr: its reference, and how many of `bytes`
 * bytes from ptr lie in it; false when none. */
bool mapping__host_cache_piece(mapping_device *dev, const void *ptr, size_t bytes, mapping_host_ref *ref, size_t *len);
/* Does the cache hold any of [ptr, +bytes) (registered by it)? */
bool mapping__host_cache_holds(mapping_device *dev, const void *ptr, size_t bytes);
/* Unregisters everything (mapping_close). */
void mapping__host_cache_destroy(mapping_device *dev);
/* A new stream of dev waits for mapping_device_wait_native's event, if any
 * (core/native_order.c); the event's release at close. */
void mapping__native_mark_wait(mapping_device *dev, void *stream_state);
void mapping__native_mark_destroy(mapping_device *dev);

/* ---- user memory page-locked in place (src/core/host_memory.c), for
 * mapping_mirror_wrap: MAPPING_ERR_UNSUPPORTED (not recorded) when the back
 * end has no host_register. ---- */
mapping_status mapping__host_register(mapping_device *dev, void *ptr, size_t bytes);
void           mapping__host_unregister(mapping_device *dev, void *ptr);

/* ---- adopting objects made elsewhere (src/core/import.c) ---- */
/* The common tail of opening a device: a back end's state and the device's
 * index become a live device (src/core/device.c). Frees dev on failure. */
mapping_status mapping__device_finish(mapping_device *dev, mapping_device **out);
/* A buffer over native[offset, +bytes) (see mapping_import_gpu). */
mapping_status mapping__import_gpu(mapping_device *dev, void *native, size_t offset, size_t bytes,
                                   void (*release)(void *user), void *user, mapping_buffer **out);
/* A stream on the caller's native queue (see mapping_import_stream). */
mapping_status mapping__import_stream(mapping_device *dev, void *native, mapping_stream **out);

/* ---- cross-device work (src/core/peer_fence.c) ----
 * A peer copy queued on a stream of one device reads another device's
 * memory when the stream reaches it. mapping__fence_add, called after such
 * work is queued, records an event after it on the stream, listed both with
 * the stream and with the device read (one per stream, device read and
 * enqueueing thread: that thread's later one replaces it, as the stream
 * runs in order). mapping_close of the device
 * read waits for those events (mapping__fences_wait); destroying the stream
 * (its work done) drops them (mapping__fences_drop_stream). */
void           mapping__fence_init(mapping_list_node *head);
void           mapping__fence_add(mapping_stream *stream, mapping_device *read);
/* MAPPING_ERR_BUSY (recorded under fn, nothing waited for) when called from
 * a host function on a stream whose work that reads dev has not completed:
 * it would wait for itself. */
mapping_status mapping__fences_wait(const char *fn, mapping_device *dev);
void           mapping__fences_drop_stream(mapping_stream *stream);

/* ---- object lists (src/core/device.c) ---- */
void mapping__list_add(mapping_device *dev, mapping_list_node *head, mapping_list_node *node);
void mapping__list_remove(mapping_device *dev, mapping_list_node *node);

/* ---- testing hooks (src/core/fault.c): the (n+1)th back-end operation from
 * now on fails with MAPPING_ERR_FAULT_INJECTED; n < 0 disarms. ---- */
void           mapping__inject_fault(mapping_device *dev, int n);
mapping_status mapping__fault_check(mapping_device *dev, const char *op);
/* The same counting every fallible back-end call, not only transfers and
 * device allocations: page-locked host memory, registrations, streams,
 * events, host functions, stream waits, prefetches, and the waits
 * (stream and event synchronize, event query) (n < 0 disarms). Those
 * calls check with mapping__fault_check_any, which counts only in this mode.
 * mapping__fault_remaining: -1 when no fault is armed (or it has fired),
 * else how many calls still succeed before it. */
void           mapping__inject_fault_any(mapping_device *dev, int n);
mapping_status mapping__fault_check_any(mapping_device *dev, const char *op);
int            mapping__fault_remaining(const mapping_device *dev);

static inline void mapping__count(_Atomic uint64_t *counter, uint64_t value)
{
    atomic_fetch_add_explicit(counter, value, memory_order_relaxed);
}

static inline void *mapping__stream_state(const mapping_stream *stream)
{
    return stream ? stream->state : NULL;
}

#endif
