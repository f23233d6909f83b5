/*
 * The seam to the drivers: src/core/ops.c is the only code that calls
 * through a back end's operations table (src/backend/backend.h), apart from
 * loading and listing in src/core/backends.c. Every function here takes
 * objects that the caller has already validated.
 *
 * - Transfers (write, read, copy, fill, scatter, gather, prefetch) apply
 *   fault injection, find page-locked host memory, time blocking copies and
 *   count statistics. Public functions validate and then call these; the
 *   transfer and coherence layers call them directly.
 * - Stream and event operations on live objects: the internal twins of the
 *   public functions of the same name (mapping__X for mapping_X).
 * - mapping__op_*: the back-end half of creating and destroying objects, for
 *   src/core/ only (buffer.c, stream.c, host_memory.c, device.c).
 */
#ifndef MAPPING_CORE_OPS_H
#define MAPPING_CORE_OPS_H

#include "core/core.h"

/* ---- transfers ---- */
mapping_status mapping__write(mapping_stream *stream, const void *src, mapping_buffer *dst, size_t dst_offset,
                              size_t bytes);
mapping_status mapping__read(mapping_stream *stream, const mapping_buffer *src, size_t src_offset, void *dst,
                             size_t bytes);
mapping_status mapping__copy(mapping_stream *stream, const mapping_buffer *src, size_t src_offset,
                             mapping_buffer *dst, size_t dst_offset, size_t bytes);
mapping_status mapping__fill(mapping_stream *stream, mapping_buffer *dst, size_t offset, size_t bytes,
                             unsigned char value);
/* Many small copies in one device-side step (see mapping_backend.scatter):
 * staging[table[i].staging_offset, +bytes) -> dst[table[i].buffer_offset, ..)
 * (scatter) or src -> staging (gather). Counted as one device-to-device copy
 * of the entries' bytes. Only where mapping__can_scatter / _gather. */
mapping_status mapping__scatter(mapping_stream *stream, mapping_buffer *staging, size_t table_offset,
                                const mapping_scatter_entry *table, size_t count, mapping_buffer *dst);
mapping_status mapping__gather(mapping_stream *stream, const mapping_buffer *src, mapping_buffer *staging,
                               size_t table_offset, const mapping_scatter_entry *table, size_t count);
/* Device-side diff (see mapping_backend.diff_blocks): compares
 * mem[mem_offset, +bytes) with shadow[shadow_offset, ..) per
 * MAPPING_DIFF_BLOCK, writes one flag byte per block to
 * flags[flags_offset, ..) and copies the changed blocks into the shadow.
 * Counted nowhere (the mirror counts what it then reads). Only where
 * mapping__can_diff. */
mapping_status mapping__diff_blocks(mapping_stream *stream, mapping_buffer *mem, size_t mem_offset,
                                   mapping_buffer *shadow, size_t shadow_offset, size_t bytes, mapping_buffer *flags,
                                   size_t flags_offset);
/* The CPU address of buf[offset, +bytes): the device memory itself
 * (mapping_backend.map), after the work queued for blocking calls; valid
 * until mapping__unmap (see mapping_backend.map: what the CPU wrote is in
 * the buffer's memory when it returns). Only where mapping__can_map.
 * Counted nowhere: the caller counts what it moves through the address. */
mapping_status mapping__map(mapping_buffer *buf, size_t offset, size_t bytes, void **host);
mapping_status mapping__unmap(mapping_buffer *buf, void *host);
/* A hint to move [offset, +bytes) of unified memory close to the device
 * (to_device) or the CPU, ordered on the stream. Only where
 * mapping__can_prefetch. */
mapping_status mapping__prefetch(mapping_stream *stream, mapping_buffer *buf, size_t offset, size_t bytes,
                                 bool to_device);

/* A copy between buffers of two devices (src->dev != dst->dev), ordered on
 * `stream` (of dst's device; NULL: blocking): the back end's peer_copy where
 * both devices have the same back end and it has one, else staged through
 * page-locked host memory in chunks (after the stream's earlier work; done
 * on return). Counted on dst's device as peer_bytes / peer_copies. */
mapping_status mapping__copy_peer(mapping_stream *stream, const mapping_buffer *src, size_t src_offset,
                                  mapping_buffer *dst, size_t dst_offset, size_t bytes);
/* Whether a copy from src's device to dst's goes straight device to device
 * (the back end's peer_copy) rather than staged through the host. */
bool mapping__can_copy_peer_direct(const mapping_device *src, const mapping_device *dst);

/* ---- what the device's back end can do (optional table entries) ---- */
bool mapping__can_scatter(const mapping_device *dev);
/* Whether the back end has stream capture (CUDA graphs): where it has not,
 * no capture check is needed (mapping__stream_refuse_capture). */
bool mapping__can_capture(const mapping_device *dev);
bool mapping__can_diff(const mapping_device *dev);
bool mapping__can_gather(const mapping_device *dev);
bool mapping__can_prefetch(const mapping_device *dev);
/* The CPU may copy to and from buffers through mapping__map: the device's
 * memory is the CPU's (MAPPING_CAP_CPU_MEMORY), no link is modelled, the
 * back end maps, and $MAPPING_BATCH_MAP is not "0" (read at open). */
bool mapping__can_map(const mapping_device *dev);
bool mapping__can_allocate_unified(const mapping_device *dev);
bool mapping__can_register_host(const mapping_device *dev);
/* Staging memory (batches) can be one unified allocation that the CPU packs
 * and the device reads in place: the device's memory is the CPU's own
 * (MAPPING_CAP_CPU_MEMORY), no link is modelled, and unified memory exists.
 * Then the staging transfer is the pack itself, counted as a transfer: */
bool mapping__staging_shared(const mapping_device *dev);
void mapping__count_shared_transfer(mapping_device *dev, bool to_gpu, size_t bytes);

/* ---- streams and events: validated objects; a NULL stream runs
 * mapping__launch_host's function inline ---- */
mapping_status mapping__stream_synchronize(mapping_stream *stream);
mapping_status mapping__launch_host(mapping_stream *stream, void (*fn)(void *user), void *user);
/* The library's own bookkeeping in stream order (stream != NULL): the back
 * end's launch_host alone, no fault injection, trace event or race check,
 * so it changes nothing else a run does. fn must not touch the program's
 * memory or call the library's API. */
mapping_status mapping__launch_host_internal(mapping_stream *stream, void (*fn)(void *user), void *user);
mapping_status mapping__stream_wait_event(mapping_stream *stream, mapping_event *event);
mapping_status mapping__event_synchronize(mapping_event *event);
mapping_status mapping__event_query(const mapping_event *event);
mapping_status mapping__event_elapsed(const mapping_event *start, const mapping_event *end, double *seconds);
/* The device's blocking stream (mapping_device.blocking), or NULL where the
 * back end has none: queue the steps of one blocking call on it, then
 * mapping__stream_synchronize it once. Never for host functions. */
mapping_stream *mapping__blocking_stream(mapping_device *dev);

/* ---- stream capture (CUDA graphs) and memory made elsewhere ----
 * The capture status (MAPPING_CAPTURE_*) of a stream, or with stream NULL of
 * the device's queue of blocking calls; *id (may be NULL) the capture's id.
 * NONE where the back end has no capture. core/capture.c turns it into the
 * public calls' refusals. */
mapping_status mapping__stream_capture_status(mapping_device *dev, const mapping_stream *stream, int *status,
                                              uint64_t *id);
mapping_status mapping__op_stream_capture_status(mapping_device *dev, void *stream_state, int *status, uint64_t *id);
/* Is [ptr, +bytes) page-locked host memory another library made (the back
 * end's host_locked)? false where the back end cannot tell. */
bool           mapping__host_locked_elsewhere(mapping_device *dev, const void *ptr, size_t bytes);
/* mapping_import_stream(dev, NULL): the back end's default native queue. */
bool           mapping__can_import_default_stream(const mapping_device *dev);

/* ---- copies a captured graph replays with new ranges (mapping_backend.copy_table,
 * graph_retain: mirror syncs recorded in a CUDA graph) ---- */
/* The back end has both, and host functions (the graph's planning nodes). */
bool           mapping__can_graph_copy(const mapping_device *dev);
/* Queues the copy of the ranges table[] lists when the stream gets there
 * (see mapping_backend.copy_table); buf's device. Counted nowhere: the
 * caller counts what each run moved. */
mapping_status mapping__copy_table(mapping_stream *stream, const uint64_t *table, size_t capacity, void *host,
                                   mapping_buffer *buf, size_t offset, bool to_host);
/* release(user) once the graph being captured on stream is gone (see
 * mapping_backend.graph_retain). */
mapping_status mapping__graph_retain(mapping_stream *stream, void (*release)(void *user), void *user);

/* ---- the back-end half of object lifetimes (src/core/ only) ---- */
mapping_status mapping__op_device_info(const mapping_backend *be, int index, mapping_device_info *info);
mapping_status mapping__op_device_open(const mapping_backend *be, int index, const mapping_device_desc *desc,
                                       void **state);
unsigned       mapping__op_device_open_caps(mapping_device *dev);
/* The link the back end measured at open, into dev->link; false if none. */
bool           mapping__op_device_link(mapping_device *dev);
void          *mapping__op_stream_blocking(mapping_device *dev);
void           mapping__op_device_close(mapping_device *dev);
mapping_status mapping__op_device_native(const mapping_device *dev, mapping_native_device *out);
mapping_status mapping__op_buffer_alloc(mapping_device *dev, size_t bytes, void **mem);
mapping_status mapping__op_buffer_alloc_unified(mapping_device *dev, size_t bytes, void **mem, void **host);
void           mapping__op_buffer_free(mapping_device *dev, void *mem);
mapping_status mapping__op_buffer_native(mapping_device *dev, void *mem, void **native);
mapping_status mapping__op_host_alloc(mapping_device *dev, size_t bytes, void **ptr, void **cookie);
void           mapping__op_host_free(mapping_device *dev, void *ptr, void *cookie);
mapping_status mapping__op_host_register(mapping_device *dev, void *ptr, size_t bytes, void **cookie);
void           mapping__op_host_unregister(mapping_device *dev, void *ptr, void *cookie);
mapping_status mapping__op_stream_create(mapping_device *dev, void **state);
void           mapping__op_stream_destroy(mapping_device *dev, void *state);
mapping_status mapping__op_stream_native(mapping_device *dev, void *state, void **native);
mapping_status mapping__op_event_record(mapping_device *dev, void *stream_state, void **event_state);
/* Later work of the stream (a back-end state) waits for the event's. */
mapping_status mapping__op_event_wait(mapping_device *dev, void *stream_state, void *event_state);
void           mapping__op_event_destroy(mapping_device *dev, void *event_state);
/* A blocking device-to-device copy from src_dev's memory to dst_dev's,
 * not counted (for measuring a peer link); only where
 * mapping__can_copy_peer_direct(src_dev, dst_dev). */
mapping_status mapping__op_peer_copy_uncounted(mapping_device *dst_dev, mapping_device *src_dev, void *src_mem,
                                               void *dst_mem, size_t bytes);
/* A blocking write of raw back-end memory, not counted in the statistics
 * (for measuring the link). */
mapping_status mapping__op_write_uncounted(mapping_device *dev, const void *src, const mapping_host_ref *pinned,
                                           void *dst_mem, size_t bytes);

/* ---- adopting objects made elsewhere (src/core/import.c; see
 * mapping_backend.device_adopt and the entries after it) ---- */
bool           mapping__can_import_buffer(const mapping_device *dev);
bool           mapping__can_import_stream(const mapping_device *dev);
/* Waits for all work on the device's native queue, the caller's included
 * (the NULL-stream contract of mapping.h); MAPPING_OK at once where the back
 * end has no such queue. */
mapping_status mapping__device_synchronize(mapping_device *dev);
mapping_status mapping__op_device_adopt(const mapping_backend *be, const mapping_native_device *native, int *index,
                                        void **state);
mapping_status mapping__op_buffer_import(mapping_device *dev, void *native, size_t offset, size_t bytes, void **mem);
void           mapping__op_buffer_unimport(mapping_device *dev, void *mem);
mapping_status mapping__op_stream_import(mapping_device *dev, void *native, void **state);
void           mapping__op_stream_unimport(mapping_device *dev, void *state);

#endif
