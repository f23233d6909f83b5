/*
 * The host back end's streams (a worker thread each, running operations in
 * order), its events, and its link model. Used only by backend/host.c.
 */
#ifndef MAPPING_BACKEND_HOST_QUEUE_H
#define MAPPING_BACKEND_HOST_QUEUE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include "backend/backend.h"
#include "mapping.h"

typedef enum host_link_direction { HOST_LINK_NONE = -1, HOST_LINK_H2D = 0, HOST_LINK_D2H = 1 } host_link_direction;

/* A modelled link: one copy engine per direction, so transfers in one
 * direction queue behind each other across streams, while the two
 * directions overlap (as on PCIe, which is full duplex). A transfer holds
 * its direction's engine for latency + bytes / bandwidth, or for as long as
 * the memcpy that moves the bytes takes, whichever is longer: a link
 * modelled faster than memcpy cannot gain bandwidth from concurrent streams. */
typedef struct host_link {
    double          bandwidth; /* bytes/s; 0 = infinite */
    double          latency;   /* seconds per transfer */
    pthread_mutex_t engine[2]; /* per host_link_direction */
    /* Per direction, under its engine: how long before the deadline a
     * transfer's sleep ends (it then spins to the deadline), following the
     * scheduler's wake-up latency on this machine (host_queue.c). */
    uint64_t        wake_margin_ns[2];
} host_link;

enum { HOST_LINK_MARGIN_START_NS = 20000 }; /* the wake-up margin a device opens with */

typedef struct host_device {
    bool      poison;
    host_link link;
    /* Where the last device-to-host copy ended, and the bytes of the run of
     * back-to-back device-to-host copies that ends there: host_queue.c uses
     * them to pick streaming stores. A hint, updated without a lock. */
    _Atomic uintptr_t d2h_end;
    _Atomic size_t    d2h_run;
} host_device;

typedef struct host_event host_event;

typedef enum host_op_kind {
    HOST_OP_COPY,
    HOST_OP_FILL,
    HOST_OP_FUNCTION,
    HOST_OP_EVENT_RECORD,
    HOST_OP_EVENT_WAIT
} host_op_kind;

typedef struct host_op {
    host_op_kind        kind;
    void               *dst;
    const void         *src;
    size_t              bytes;
    unsigned char       value;
    host_link_direction link_direction;
    void (*fn)(void *);
    void               *user;
    host_event         *event;
    struct host_op     *next;
} host_op;

/* Runs op now when stream is NULL, else queues a copy of it. */
mapping_status mapping__host_submit(void *dev, void *stream, const host_op *op);

/* backend/host/host_scatter.c: mapping_backend.scatter / .gather. */
mapping_status mapping__host_scatter(void *dev, void *stream, void *staging_mem, size_t table_offset,
                            const mapping_scatter_entry *table, size_t count, void *dst_mem);
mapping_status mapping__host_gather(void *dev, void *stream, void *src_mem, void *staging_mem, size_t table_offset,
                           const mapping_scatter_entry *table, size_t count);
/* backend/host/host_diff.c: mapping_backend.diff_blocks. */
mapping_status mapping__host_diff_blocks(void *dev, void *stream, void *mem, size_t mem_offset, void *shadow_mem,
                                         size_t shadow_offset, size_t bytes, void *flags_mem, size_t flags_offset);

mapping_status mapping__host_stream_create(void *dev, void **stream);
void           mapping__host_stream_destroy(void *dev, void *stream);
mapping_status mapping__host_stream_synchronize(void *dev, void *stream);

mapping_status mapping__host_event_record(void *dev, void *stream, void **event);
mapping_status mapping__host_event_wait(void *dev, void *stream, void *event);
mapping_status mapping__host_event_synchronize(void *dev, void *event);
mapping_status mapping__host_event_query(void *dev, void *event);
mapping_status mapping__host_event_elapsed(void *dev, void *start, void *end, double *seconds);
void           mapping__host_event_destroy(void *dev, void *event);

#endif
