/*
 * The seam between the library and the drivers: one table of operations per
 * back end. Only files in src/backend/ call a driver; everything above talks
 * to a back end through this table (via the wrappers in src/core/ops.h, which
 * add statistics and fault injection).
 *
 * Conventions for every operation:
 * - `dev` is the back end's own device state (from device_open), `mem` a
 *   buffer's (from buffer_alloc), `stream` a stream's (from stream_create).
 * - stream == NULL means blocking: return when the work is done.
 *   Non-NULL: return once the work is queued; errors of queued work are
 *   returned by stream_synchronize.
 * - Arguments have been validated by src/core/ (non-NULL, in range, same
 *   device, non-zero sizes). A back end only reports what its driver says.
 * - On a driver error, call mapping__fail_driver() (src/os/status.h) so the
 *   raw code and its name reach mapping_last_error_message(), and return the
 *   mapped status.
 * - An optional operation left NULL means "unsupported" and core reports
 *   MAPPING_ERR_UNSUPPORTED or takes a fallback.
 */
#ifndef MAPPING_BACKEND_H
#define MAPPING_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "mapping.h"

/* Where a host pointer lies inside memory from host_alloc (or host_register):
 * lets a back end take its fast path (OpenCL: copy via the mapped buffer). */
typedef struct mapping_host_ref {
    void  *cookie; /* what host_alloc / host_register returned */
    size_t offset; /* offset of the pointer within that allocation */
} mapping_host_ref;

/* One entry of a scatter/gather table (see mapping_backend.scatter). */
typedef struct mapping_scatter_entry {
    uint64_t staging_offset; /* in the staging buffer */
    uint64_t buffer_offset;  /* in the destination (scatter) or source (gather) buffer */
    uint64_t bytes;
} mapping_scatter_entry;

/* The block of mapping_backend.diff_blocks: one flag per this many bytes. */
enum { MAPPING_DIFF_BLOCK = MAPPING_DIFF_BLOCK_BYTES };

/* A stream's part in a capture into a graph (mapping_backend.stream_capture_status). */
enum {
    MAPPING_CAPTURE_NONE = 0,        /* not being captured: work runs as queued */
    MAPPING_CAPTURE_ACTIVE = 1,      /* being captured: queued work becomes graph nodes, run at each replay */
    MAPPING_CAPTURE_INVALIDATED = 2, /* its capture failed and awaits its end */
    MAPPING_CAPTURE_IMPLICIT = 3,    /* (the queue of blocking calls) work there would depend on a capture */
};

typedef struct mapping_backend {
    const char *name;

    /* Load the driver and count devices; called once per process. On
     * failure write a one-line reason into why (driver not found, dlerror(),
     * no devices, driver too old) and return an error. */
    mapping_status (*load)(char *why, size_t why_size, int *device_count);
    mapping_status (*device_info)(int index, mapping_device_info *info);
    mapping_status (*device_open)(int index, const mapping_device_desc *desc, void **dev);
    void (*device_close)(void *dev);
    mapping_status (*device_native)(void *dev, mapping_native_device *out);
    /* Optional: capabilities that depend on how the device was opened (the
     * desc, the environment), ORed into device_info's. Host: a modelled
     * link (MAPPING_CAP_LINK_MODEL). */
    unsigned (*device_open_caps)(void *dev);
    /* Optional: the link as the back end measured it at open, on a stream
     * of its own (CUDA: not the legacy stream, which may hold the user's
     * work); false when it has none (then the core measures on first use). */
    bool (*device_link)(void *dev, double *latency, double *bandwidth);

    /* Device memory. */
    mapping_status (*buffer_alloc)(void *dev, size_t bytes, void **mem);
    void (*buffer_free)(void *dev, void *mem);
    mapping_status (*buffer_native)(void *dev, void *mem, void **native);
    /* Optional: memory both the CPU and the device can use (CUDA managed
     * memory, OpenCL SVM, plain memory on host). *mem works with every buffer
     * operation and is freed by buffer_free; *host is its CPU address. */
    mapping_status (*buffer_alloc_unified)(void *dev, size_t bytes, void **mem, void **host);
    /* Optional: move [offset, +bytes) of unified memory close to the device
     * (to_device = true) or the CPU, ordered on the stream; a hint only. */
    mapping_status (*unified_prefetch)(void *dev, void *stream, void *mem, size_t offset, size_t bytes, bool to_device);

    /* Host memory for fast transfers (page-locked where possible). *cookie is
     * handed back with every copy that touches the allocation. */
    mapping_status (*host_alloc)(void *dev, size_t bytes, void **ptr, void **cookie);
    void (*host_free)(void *dev, void *ptr, void *cookie);
    /* Optional: page-lock user memory in place. */
    mapping_status (*host_register)(void *dev, void *ptr, size_t bytes, void **cookie);
    void (*host_unregister)(void *dev, void *ptr, void *cookie);

    /* Streams. stream_destroy is called after stream_synchronize. */
    mapping_status (*stream_create)(void *dev, void **stream);
    void (*stream_destroy)(void *dev, void *stream);
    mapping_status (*stream_synchronize)(void *dev, void *stream);
    mapping_status (*stream_native)(void *dev, void *stream, void **native);
    /* Optional: a stream (the back end's, kept with the device) on the queue
     * that calls with stream == NULL use, or NULL. A blocking call of several
     * steps queues them on it and waits once with stream_synchronize: one
     * round trip to the device instead of one per step. Only work the caller
     * waits for is queued on it (never a host function). */
    void *(*stream_blocking)(void *dev);

    /* Transfers. `pinned` is non-NULL when the host side lies in host_alloc
     * (or host_register) memory. */
    mapping_status (*write)(void *dev, void *stream, const void *src, const mapping_host_ref *pinned,
                            void *dst_mem, size_t dst_offset, size_t bytes);
    mapping_status (*read)(void *dev, void *stream, void *src_mem, size_t src_offset, void *dst,
                           const mapping_host_ref *pinned, size_t bytes);
    mapping_status (*copy)(void *dev, void *stream, void *src_mem, size_t src_offset, void *dst_mem,
                           size_t dst_offset, size_t bytes);
    mapping_status (*fill)(void *dev, void *stream, void *mem, size_t offset, size_t bytes,
                           unsigned char value);

    /* Optional: many small copies in one device-side step. For each entry,
     * scatter copies staging[staging_offset, +bytes) to dst[buffer_offset, ..);
     * gather copies src[buffer_offset, +bytes) to staging[staging_offset, ..).
     * The table is given twice: in host memory (`table`, readable only during
     * the call) and in the staging buffer at `table_offset` (already written
     * by earlier work on the same stream), so a back end may use either
     * (a kernel reads the device copy; a driver batch call the host one). */
    mapping_status (*scatter)(void *dev, void *stream, void *staging_mem, size_t table_offset,
                              const mapping_scatter_entry *table, size_t count, void *dst_mem);
    mapping_status (*gather)(void *dev, void *stream, void *src_mem, void *staging_mem, size_t table_offset,
                             const mapping_scatter_entry *table, size_t count);

    /* Optional, device-side diff (mirrors with MAPPING_MIRROR_DEVICE_DIFF):
     * compares mem[mem_offset, +bytes) with shadow[shadow_offset, +bytes) in
     * blocks of MAPPING_DIFF_BLOCK bytes (bytes is a multiple of it); for
     * block i writes flags[flags_offset + i] = 1 where they differ, else 0,
     * and copies each differing block from mem into shadow. mem and shadow
     * are buffers of dev and do not overlap; flags a buffer of dev. */
    mapping_status (*diff_blocks)(void *dev, void *stream, void *mem, size_t mem_offset, void *shadow_mem,
                                  size_t shadow_offset, size_t bytes, void *flags_mem, size_t flags_offset);

    /* Optional, where the device's memory is the CPU's (MAPPING_CAP_CPU_MEMORY):
     * map gives the CPU address of mem[offset, +bytes) itself, not a copy,
     * once the work queued for blocking calls is done (it blocks); the CPU
     * may read and write it until unmap. What the CPU wrote is then in the
     * buffer's memory, so unmap need not wait: it may be queued for blocking
     * calls, and everything queued there later runs after it. Core offers
     * them only without a modelled link (a CPU copy through the address
     * would bypass the model). */
    mapping_status (*map)(void *dev, void *mem, size_t offset, size_t bytes, void **host);
    mapping_status (*unmap)(void *dev, void *mem, void *host);

    /* fn(user) on a library thread when the stream reaches it; stream != NULL. */
    mapping_status (*launch_host)(void *dev, void *stream, void (*fn)(void *), void *user);

    /* Events: record creates a new event at the current end of the stream. */
    mapping_status (*event_record)(void *dev, void *stream, void **event);
    mapping_status (*event_wait)(void *dev, void *stream, void *event);
    mapping_status (*event_synchronize)(void *dev, void *event);
    mapping_status (*event_query)(void *dev, void *event);
    mapping_status (*event_elapsed)(void *dev, void *start, void *end, double *seconds);
    void (*event_destroy)(void *dev, void *event);

    /* Optional, several devices: copy src_mem[src_offset, +bytes) of src_dev
     * (another device of this back end) to dst_mem[dst_offset, ..) of dev,
     * ordered on `stream`, a stream of dev (the destination's device); NULL:
     * blocking. Core falls back to a copy staged through host memory where
     * this is NULL or the devices' back ends differ. */
    mapping_status (*peer_copy)(void *dev, void *stream, void *src_dev, void *src_mem, size_t src_offset,
                                void *dst_mem, size_t dst_offset, size_t bytes);
    /* ---- Adopting objects made elsewhere (all optional; NULL: unsupported).
     * docs/interop.md says how each back end maps them. ---- */
    /* Opens a device on the caller's driver objects (native->context,
     * ->device, ->queue; OpenCL: cl_context, cl_device_id, cl_command_queue
     * or NULL), retaining them. *index: the device's index in this back end's
     * list (device_info gives its description). */
    mapping_status (*device_adopt)(const mapping_native_device *native, int *index, void **dev);
    /* Waits for all work queued on the device's native queue (the `queue` of
     * device_native), including work the caller enqueued there directly.
     * NULL: nothing can be queued there outside the library's blocking calls. */
    mapping_status (*device_synchronize)(void *dev);
    /* Device memory the caller owns: native[offset, +bytes) (OpenCL: a cl_mem,
     * retained; CUDA: a CUdeviceptr; host: a pointer). The result works with
     * every buffer operation; buffer_unimport (not buffer_free) drops it and
     * never frees the caller's memory. */
    mapping_status (*buffer_import)(void *dev, void *native, size_t offset, size_t bytes, void **mem);
    void (*buffer_unimport)(void *dev, void *mem);
    /* A queue the caller owns (OpenCL: an in-order cl_command_queue, retained;
     * CUDA: a CUstream) as a stream; stream_unimport (called after
     * stream_synchronize) drops it without destroying the caller's queue. */
    mapping_status (*stream_import)(void *dev, void *native, void **stream);
    void (*stream_unimport)(void *dev, void *stream);
    /* stream_import takes native == NULL as the device's default native
     * queue (CUDA: the legacy default stream, which CUDA code names 0). */
    bool stream_import_default;

    /* ---- Capture into graphs and memory made elsewhere (optional) ---- */
    /* Whether `stream` (NULL: the queue of blocking calls) is being captured
     * into a graph (CUDA stream capture): *status is a MAPPING_CAPTURE_*,
     * *id (may be NULL) the capture's id, unique in the process, 0 when none
     * or unknown. NULL: the back end has no capture (always NONE). */
    mapping_status (*stream_capture_status)(void *dev, void *stream, int *status, uint64_t *id);
    /* Whether [ptr, +bytes) is page-locked host memory the driver knows but
     * host_alloc / host_register did not make (another library's pinned
     * memory): write and read then move it directly, without staging, as
     * they do with `pinned`. The back end may cache what it learns. */
    bool (*host_locked)(void *dev, const void *ptr, size_t bytes);

    /* ---- Copies a captured graph replays with new ranges (optional; mirror
     * syncs recorded in a graph, src/coherence/mirror_graph.c) ---- */
    /* Queues on `stream` a copy of the ranges a table lists, read when the
     * stream reaches the copy, not now (a replay of a captured graph copies
     * what the table says then): table[0] is the count (at most `capacity`
     * entries are read), table[1] is reserved, then `capacity` pairs
     * {offset, bytes}; entry e copies host[offset, +bytes) to
     * mem[mem_offset + offset, ..), or back when to_host. table and host are
     * page-locked memory (host_alloc, host_register, or the driver's own)
     * that the device reaches directly. */
    mapping_status (*copy_table)(void *dev, void *stream, const uint64_t *table, size_t capacity, void *host,
                                 void *mem, size_t mem_offset, bool to_host);
    /* Ties release(user) to the graph being captured on `stream`: it runs
     * once that graph and every executable made from it are gone and their
     * launches done, on a driver thread, and must call neither the driver nor
     * the library. Never called when this fails. */
    mapping_status (*graph_retain)(void *dev, void *stream, void (*release)(void *user), void *user);
} mapping_backend;

/* Each back end defines `const mapping_backend mapping_backend_<name>`; the
 * table of back ends is src/core/backends.c. */

#endif /* MAPPING_BACKEND_H */
