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

enum {
    MAPPING_MAGIC_DEVICE = 0x6d446576, /* "mDev" */
    MAPPING_MAGIC_BUFFER = 0x6d427566, /* "mBuf" */
    MAPPING_MAGIC_STREAM = 0x6d537472, /* "mStr" */
    MAPPING_MAGIC_EVENT  = 0x6d457674, /* "mEvt" */
    MAPPING_MAGIC_DEAD   = 0x64656164  /* "dead": a destroyed object */
};

/* Counters behind mapping_stats; relaxed atomics, one cache line apart from
 * the device's read-mostly fields. */
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

struct mapping_device {
    uint32_t               magic;
    const mapping_backend *be;
    void                  *state; /* the back end's device */
    mapping_device_info    info;
    mapping_host_registry  host_blocks;

    pthread_mutex_t   objects_lock;
    mapping_list_node buffers, streams, events; /* live objects */

    pthread_mutex_t link_lock;
    mapping_link    link; /* 0 fields: not measured yet */

    _Atomic int fault_countdown; /* > 0: that many more operations succeed */
    _Atomic int fault_armed;
    _Atomic int fault_any; /* 1: every fallible back-end call counts (mapping__inject_fault_any) */

    _Alignas(64) mapping_counters counters;
};

struct mapping_buffer {
    uint32_t          magic;
    mapping_device   *dev;
    void             *mem;
    size_t            size;
    mapping_list_node node;
};

struct mapping_stream {
    uint32_t          magic;
    mapping_device   *dev;
    void             *state;
    mapping_list_node node;
};

struct mapping_event {
    uint32_t          magic;
    mapping_device   *dev;
    void             *state;
    mapping_list_node node;
};

/* ---- validation (src/core/validate.c) ---- */
mapping_status mapping__check_device(const char *fn, const mapping_device *dev);
mapping_status mapping__check_buffer(const char *fn, const char *what, const mapping_buffer *buf);
mapping_status mapping__check_stream(const char *fn, const mapping_stream *stream); /* NULL is fine */
mapping_status mapping__check_event(const char *fn, const char *what, const mapping_event *ev);
mapping_status mapping__check_range(const char *fn, const char *what, size_t offset, size_t bytes, size_t size);
mapping_status mapping__check_ptr(const char *fn, const char *what, const void *ptr);
/* stream (may be NULL) and object must be of dev. */
mapping_status mapping__check_same_device(const char *fn, const mapping_device *dev, const mapping_stream *stream);

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
/* Stream and event operations, and transfers: src/core/ops.h. */

/* ---- unified memory as a buffer (src/core/buffer.c), for unified mirrors:
 * freed by mapping_free_gpu; *host is its CPU address. ---- */
mapping_status mapping__allocate_unified(mapping_device *dev, size_t bytes, mapping_buffer **out, void **host);

/* ---- user memory page-locked in place (src/core/host_memory.c), for
 * mapping_mirror_wrap: MAPPING_ERR_UNSUPPORTED (not recorded) when the back
 * end has no host_register. ---- */
mapping_status mapping__host_register(mapping_device *dev, void *ptr, size_t bytes);
void           mapping__host_unregister(mapping_device *dev, void *ptr);

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
