/*
 * The seam to the drivers (see ops.h): every call through a back end's
 * table, with fault injection, page-locked lookup, timing and statistics.
 */
#include <stdlib.h>
#include "core/ops.h"
#include "core/trace_hooks.h"
#include "os/os.h"
#include "track/race_guard.h"

/* Blocking transfers at least this large are timed for the statistics;
 * reading the clock twice costs more than a small copy does. */
enum { TIMED_TRANSFER_MIN = 64 * 1024 };

/* The stream argument to the back end and the device both come from the
 * buffer: the caller checked that the stream (if any) is of the same device. */

mapping_status mapping__launch_host_internal(mapping_stream *stream, void (*fn)(void *user), void *user)
{
    return stream->dev->be->launch_host(stream->dev->state, stream->state, fn, user);
}

/* MAPPING_CHECK=races (track/race_guard.h): after an async copy was queued (or
 * failed to be), the guard's protection goes when the stream gets there.
 * mapping__launch_host_internal: no fault injection, no trace event, so
 * the check changes nothing else a run does. */
static void race_guard_queued(mapping_stream *stream, mapping_race_guard *guard, mapping_status st)
{
    mapping_device *dev = stream->dev;
    if (st != MAPPING_OK || mapping__launch_host_internal(stream, mapping__race_guard_end, guard) != MAPPING_OK) {
        if (st == MAPPING_OK)
            dev->be->stream_synchronize(dev->state, stream->state);
        mapping__race_guard_end(guard);
    }
}

/* The race check for a copy on a device: its own flag, or the process's. */
static inline bool race_check(const mapping_device *dev)
{
    return atomic_load_explicit(&dev->checks, memory_order_relaxed) || mapping__race_check_on();
}

/* A copy of host memory registered in place (mapping_device_set_host_
 * registration, core/host_cache.c), one registration (chunk) at a time;
 * what is not registered (forgotten meanwhile) goes as pageable memory. */
static mapping_status copy_registered(mapping_stream *stream, void *host, mapping_buffer *buf, size_t offset,
                                      size_t bytes, bool to_device)
{
    mapping_device *dev = buf->dev;
    uint64_t t0 = !stream && bytes >= TIMED_TRANSFER_MIN ? mapping_os_now_ns() : 0;
    mapping_trace_span span = mapping__trace_begin();
    mapping_status st = MAPPING_OK;
    for (size_t done = 0, len = 0; done < bytes && st == MAPPING_OK; done += len) {
        mapping_host_ref ref;
        char *at = (char *)host + done;
        bool registered = mapping__host_cache_piece(dev, at, bytes - done, &ref, &len);
        if (!registered)
            len = bytes - done;
        const mapping_host_ref *pinned = registered ? &ref : NULL;
        st = to_device ? dev->be->write(dev->state, mapping__stream_state(stream), at, pinned, buf->mem, offset + done,
                                        len)
                       : dev->be->read(dev->state, mapping__stream_state(stream), buf->mem, offset + done, at, pinned,
                                       len);
    }
    mapping__trace_op(&span, to_device ? "write" : "read", to_device ? "h2d" : "d2h", dev, stream, buf, bytes, st);
    if (st != MAPPING_OK)
        return st;
    if (t0)
        mapping__count(&dev->counters.blocking_ns, mapping_os_now_ns() - t0);
    mapping__count(to_device ? &dev->counters.h2d_bytes : &dev->counters.d2h_bytes, bytes);
    mapping__count(to_device ? &dev->counters.h2d_copies : &dev->counters.d2h_copies, 1);
    return MAPPING_OK;
}

/* Pageable memory the host-registration cache takes (registering it now). */
static inline bool registered_copy(mapping_device *dev, const void *host, size_t bytes, bool checked)
{
    return !checked && __builtin_expect(mapping__host_cache_wanted(dev, bytes), 0) &&
           mapping__host_cache_prepare(dev, host, bytes);
}

/* The write and read bodies, instantiated twice: without the race check
 * (`checked` false: no guard code at all on the common path) and with it,
 * out of line, for a copy on a stream while the check is on. */
static inline __attribute__((always_inline)) mapping_status
write_body(mapping_stream *stream, const void *src, mapping_buffer *dst, size_t dst_offset, size_t bytes, bool checked)
{
    mapping_device *dev = dst->dev;
    mapping_status st = mapping__fault_check(dev, "write");
    if (st != MAPPING_OK)
        return st;
    mapping_host_ref ref;
    const mapping_host_ref *pinned = mapping__host_registry_find(&dev->host_blocks, src, bytes, &ref) ? &ref : NULL;
    if (!pinned && registered_copy(dev, src, bytes, checked))
        return copy_registered(stream, (void *)(uintptr_t)src, dst, dst_offset, bytes, true);
    uint64_t t0 = !stream && bytes >= TIMED_TRANSFER_MIN ? mapping_os_now_ns() : 0;
    mapping_race_guard *guard = NULL; /* MAPPING_CHECK=races: the source is read-only until the copy is done */
    if (checked)
        guard = mapping__race_guard_begin(src, bytes, MAPPING_RACE_H2D, stream, mapping__stream_state(stream));
    mapping_trace_span span = mapping__trace_begin();
    st = dev->be->write(dev->state, mapping__stream_state(stream), src, pinned, dst->mem, dst_offset, bytes);
    mapping__trace_op(&span, "write", "h2d", dev, stream, dst, bytes, st);
    if (checked && guard)
        race_guard_queued(stream, guard, st);
    if (st != MAPPING_OK)
        return st;
    if (t0)
        mapping__count(&dev->counters.blocking_ns, mapping_os_now_ns() - t0);
    mapping__count(&dev->counters.h2d_bytes, bytes);
    mapping__count(&dev->counters.h2d_copies, 1);
    return MAPPING_OK;
}

static inline __attribute__((always_inline)) mapping_status
read_body(mapping_stream *stream, const mapping_buffer *src, size_t src_offset, void *dst, size_t bytes, bool checked)
{
    mapping_device *dev = src->dev;
    mapping_status st = mapping__fault_check(dev, "read");
    if (st != MAPPING_OK)
        return st;
    mapping_host_ref ref;
    const mapping_host_ref *pinned = mapping__host_registry_find(&dev->host_blocks, dst, bytes, &ref) ? &ref : NULL;
    if (!pinned && registered_copy(dev, dst, bytes, checked))
        return copy_registered(stream, dst, (mapping_buffer *)(uintptr_t)src, src_offset, bytes, false);
    uint64_t t0 = !stream && bytes >= TIMED_TRANSFER_MIN ? mapping_os_now_ns() : 0;
    mapping_race_guard *guard = NULL; /* MAPPING_CHECK=races: the destination is inaccessible until the copy starts */
    if (checked && (guard = mapping__race_guard_begin(dst, bytes, MAPPING_RACE_D2H, stream, mapping__stream_state(stream))) &&
        mapping__launch_host_internal(stream, mapping__race_guard_started, guard) != MAPPING_OK) {
        mapping__race_guard_end(guard);
        guard = NULL;
    }
    mapping_trace_span span = mapping__trace_begin();
    st = dev->be->read(dev->state, mapping__stream_state(stream), src->mem, src_offset, dst, pinned, bytes);
    mapping__trace_op(&span, "read", "d2h", dev, stream, src, bytes, st);
    if (checked && guard)
        race_guard_queued(stream, guard, st);
    if (st != MAPPING_OK)
        return st;
    if (t0)
        mapping__count(&dev->counters.blocking_ns, mapping_os_now_ns() - t0);
    mapping__count(&dev->counters.d2h_bytes, bytes);
    mapping__count(&dev->counters.d2h_copies, 1);
    return MAPPING_OK;
}

static __attribute__((noinline)) mapping_status write_checked(mapping_stream *stream, const void *src,
                                                              mapping_buffer *dst, size_t dst_offset, size_t bytes)
{
    return write_body(stream, src, dst, dst_offset, bytes, true);
}

static __attribute__((noinline)) mapping_status read_checked(mapping_stream *stream, const mapping_buffer *src,
                                                             size_t src_offset, void *dst, size_t bytes)
{
    return read_body(stream, src, src_offset, dst, bytes, true);
}

mapping_status mapping__write(mapping_stream *stream, const void *src, mapping_buffer *dst, size_t dst_offset,
                              size_t bytes)
{
    if (__builtin_expect(stream != NULL, 0) && __builtin_expect(race_check(dst->dev), 0))
        return write_checked(stream, src, dst, dst_offset, bytes);
    return write_body(stream, src, dst, dst_offset, bytes, false);
}

mapping_status mapping__read(mapping_stream *stream, const mapping_buffer *src, size_t src_offset, void *dst,
                             size_t bytes)
{
    if (__builtin_expect(stream != NULL, 0) && __builtin_expect(race_check(src->dev), 0))
        return read_checked(stream, src, src_offset, dst, bytes);
    return read_body(stream, src, src_offset, dst, bytes, false);
}

mapping_status mapping__copy(mapping_stream *stream, const mapping_buffer *src, size_t src_offset,
                             mapping_buffer *dst, size_t dst_offset, size_t bytes)
{
    mapping_device *dev = dst->dev;
    mapping_status st = mapping__fault_check(dev, "copy");
    if (st != MAPPING_OK)
        return st;
    mapping_trace_span span = mapping__trace_begin();
    st = dev->be->copy(dev->state, mapping__stream_state(stream), src->mem, src_offset, dst->mem, dst_offset, bytes);
    mapping__trace_op(&span, "copy", "d2d", dev, stream, dst, bytes, st);
    if (st != MAPPING_OK)
        return st;
    mapping__count(&dev->counters.d2d_bytes, bytes);
    mapping__count(&dev->counters.d2d_copies, 1);
    return MAPPING_OK;
}

mapping_status mapping__fill(mapping_stream *stream, mapping_buffer *dst, size_t offset, size_t bytes,
                             unsigned char value)
{
    mapping_device *dev = dst->dev;
    mapping_status st = mapping__fault_check(dev, "fill");
    if (st != MAPPING_OK)
        return st;
    mapping_trace_span span = mapping__trace_begin();
    st = dev->be->fill(dev->state, mapping__stream_state(stream), dst->mem, offset, bytes, value);
    mapping__trace_op(&span, "fill", NULL, dev, stream, dst, bytes, st);
    if (st != MAPPING_OK)
        return st;
    mapping__count(&dev->counters.fill_bytes, bytes);
    mapping__count(&dev->counters.fills, 1);
    return MAPPING_OK;
}

/* A scatter or gather counts as one device-side copy of its entries' bytes. */
static void count_table(mapping_device *dev, const mapping_scatter_entry *table, size_t count)
{
    uint64_t bytes = 0;
    for (size_t k = 0; k < count; k++)
        bytes += table[k].bytes;
    mapping__count(&dev->counters.d2d_bytes, bytes);
    mapping__count(&dev->counters.d2d_copies, 1);
}

mapping_status mapping__scatter(mapping_stream *stream, mapping_buffer *staging, size_t table_offset,
                                const mapping_scatter_entry *table, size_t count, mapping_buffer *dst)
{
    mapping_device *dev = dst->dev;
    mapping_status st = mapping__fault_check(dev, "scatter");
    if (st != MAPPING_OK)
        return st;
    mapping_trace_span span = mapping__trace_begin();
    st = dev->be->scatter(dev->state, mapping__stream_state(stream), staging->mem, table_offset, table, count,
                          dst->mem);
    mapping__trace_table_op(&span, "scatter", dev, stream, dst, table, count, st);
    if (st != MAPPING_OK)
        return st;
    count_table(dev, table, count);
    return MAPPING_OK;
}

mapping_status mapping__gather(mapping_stream *stream, const mapping_buffer *src, mapping_buffer *staging,
                               size_t table_offset, const mapping_scatter_entry *table, size_t count)
{
    mapping_device *dev = src->dev;
    mapping_status st = mapping__fault_check(dev, "gather");
    if (st != MAPPING_OK)
        return st;
    mapping_trace_span span = mapping__trace_begin();
    st = dev->be->gather(dev->state, mapping__stream_state(stream), src->mem, staging->mem, table_offset, table,
                         count);
    mapping__trace_table_op(&span, "gather", dev, stream, src, table, count, st);
    if (st != MAPPING_OK)
        return st;
    count_table(dev, table, count);
    return MAPPING_OK;
}

mapping_status mapping__diff_blocks(mapping_stream *stream, mapping_buffer *mem, size_t mem_offset,
                                   mapping_buffer *shadow, size_t shadow_offset, size_t bytes, mapping_buffer *flags,
                                   size_t flags_offset)
{
    mapping_device *dev = mem->dev;
    mapping_status st = mapping__fault_check(dev, "diff");
    if (st != MAPPING_OK)
        return st;
    mapping_trace_span span = mapping__trace_begin();
    st = dev->be->diff_blocks(dev->state, mapping__stream_state(stream), mem->mem, mem_offset, shadow->mem,
                              shadow_offset, bytes, flags->mem, flags_offset);
    mapping__trace_op(&span, "diff", NULL, dev, stream, mem, bytes, st);
    return st;
}

mapping_status mapping__map(mapping_buffer *buf, size_t offset, size_t bytes, void **host)
{
    mapping_device *dev = buf->dev;
    mapping_status st = mapping__fault_check(dev, "map");
    if (st != MAPPING_OK)
        return st;
    return dev->be->map(dev->state, buf->mem, offset, bytes, host);
}

mapping_status mapping__unmap(mapping_buffer *buf, void *host)
{
    mapping_device *dev = buf->dev;
    mapping_status st = mapping__fault_check(dev, "unmap");
    if (st != MAPPING_OK)
        return st;
    return dev->be->unmap(dev->state, buf->mem, host);
}

mapping_status mapping__prefetch(mapping_stream *stream, mapping_buffer *buf, size_t offset, size_t bytes,
                                 bool to_device)
{
    mapping_device *dev = buf->dev;
    mapping_status st = mapping__fault_check_any(dev, "prefetch");
    if (st != MAPPING_OK)
        return st;
    return dev->be->unified_prefetch(dev->state, mapping__stream_state(stream), buf->mem, offset, bytes, to_device);
}

/* ---- optional table entries ---- */

bool mapping__can_diff(const mapping_device *dev)
{
    return dev->be->diff_blocks != NULL;
}

bool mapping__can_capture(const mapping_device *dev)
{
    return dev->be->stream_capture_status != NULL;
}

bool mapping__can_graph_copy(const mapping_device *dev)
{
    return dev->be->copy_table && dev->be->graph_retain && dev->be->launch_host;
}

mapping_status mapping__copy_table(mapping_stream *stream, const uint64_t *table, size_t capacity, void *host,
                                   mapping_buffer *buf, size_t offset, bool to_host)
{
    mapping_device *dev = buf->dev;
    mapping_status st = mapping__fault_check(dev, "copy_table");
    if (st != MAPPING_OK)
        return st;
    return dev->be->copy_table(dev->state, mapping__stream_state(stream), table, capacity, host, buf->mem, offset,
                               to_host);
}

mapping_status mapping__graph_retain(mapping_stream *stream, void (*release)(void *user), void *user)
{
    return stream->dev->be->graph_retain(stream->dev->state, stream->state, release, user);
}

bool mapping__can_scatter(const mapping_device *dev)
{
    return dev->be->scatter != NULL;
}

bool mapping__can_gather(const mapping_device *dev)
{
    return dev->be->gather != NULL;
}

bool mapping__can_prefetch(const mapping_device *dev)
{
    return dev->be->unified_prefetch != NULL;
}

bool mapping__can_map(const mapping_device *dev)
{
    return dev->map_copies;
}

bool mapping__staging_shared(const mapping_device *dev)
{
    unsigned caps = dev->info.caps;
    return (caps & MAPPING_CAP_CPU_MEMORY) && !(caps & MAPPING_CAP_LINK_MODEL) && dev->be->buffer_alloc_unified;
}

void mapping__count_shared_transfer(mapping_device *dev, bool to_gpu, size_t bytes)
{
    mapping__count(to_gpu ? &dev->counters.h2d_bytes : &dev->counters.d2h_bytes, bytes);
    mapping__count(to_gpu ? &dev->counters.h2d_copies : &dev->counters.d2h_copies, 1);
}

bool mapping__can_allocate_unified(const mapping_device *dev)
{
    return dev->be->buffer_alloc_unified != NULL;
}

bool mapping__can_register_host(const mapping_device *dev)
{
    return dev->be->host_register != NULL && dev->be->host_unregister != NULL;
}

/* ---- streams and events ---- */

mapping_status mapping__stream_synchronize(mapping_stream *stream)
{
    mapping_status st = mapping__fault_check_any(stream->dev, "stream_synchronize");
    if (st != MAPPING_OK)
        return st;
    return stream->dev->be->stream_synchronize(stream->dev->state, stream->state);
}

/* MAPPING_CHECK=races: a host function runs marked as its stream's work. */
typedef struct race_host_call {
    void (*fn)(void *user);
    void           *user;
    mapping_stream *stream;
} race_host_call;

static void race_host_trampoline(void *arg)
{
    race_host_call c = *(race_host_call *)arg;
    free(arg);
    mapping__race_stream_fn_enter(c.stream);
    c.fn(c.user);
    mapping__race_stream_fn_leave();
}


mapping_status mapping__launch_host(mapping_stream *stream, void (*fn)(void *user), void *user)
{
    if (!stream) {
        fn(user);
        return MAPPING_OK;
    }
    mapping_status st = mapping__fault_check_any(stream->dev, "launch_host");
    if (st != MAPPING_OK)
        return st;
    if (__builtin_expect(race_check(stream->dev), 0)) {
        race_host_call *c = mapping_os_malloc(sizeof *c);
        if (!c)
            return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "launch_host: out of memory");
        *c = (race_host_call){fn, user, stream};
        st = stream->dev->be->launch_host(stream->dev->state, stream->state, race_host_trampoline, c);
        if (st != MAPPING_OK)
            free(c);
        return st;
    }
    mapping_trace_span span = mapping__trace_begin();
    st = stream->dev->be->launch_host(stream->dev->state, stream->state, fn, user);
    mapping__trace_host_fn(&span, stream->dev, stream, st);
    return st;
}

mapping_status mapping__stream_wait_event(mapping_stream *stream, mapping_event *event)
{
    mapping_status st = mapping__fault_check_any(stream->dev, "stream_wait_event");
    if (st != MAPPING_OK)
        return st;
    return stream->dev->be->event_wait(stream->dev->state, stream->state, event->state);
}

mapping_status mapping__event_synchronize(mapping_event *event)
{
    mapping_status st = mapping__capture_check_event("the library's wait for an event", event);
    if (st == MAPPING_OK)
        st = mapping__fault_check_any(event->dev, "event_synchronize");
    if (st != MAPPING_OK)
        return st;
    return event->dev->be->event_synchronize(event->dev->state, event->state);
}

mapping_status mapping__event_query(const mapping_event *event)
{
    mapping_status st = mapping__capture_check_event("the library's query of an event", event);
    if (st == MAPPING_OK)
        st = mapping__fault_check_any(event->dev, "event_query");
    if (st != MAPPING_OK)
        return st;
    return event->dev->be->event_query(event->dev->state, event->state);
}

mapping_status mapping__event_elapsed(const mapping_event *start, const mapping_event *end, double *seconds)
{
    return start->dev->be->event_elapsed(start->dev->state, start->state, end->state, seconds);
}

/* ---- stream capture and memory made elsewhere ---- */

mapping_status mapping__op_stream_capture_status(mapping_device *dev, void *stream_state, int *status, uint64_t *id)
{
    *status = MAPPING_CAPTURE_NONE;
    if (id)
        *id = 0;
    return dev->be->stream_capture_status ? dev->be->stream_capture_status(dev->state, stream_state, status, id)
                                          : MAPPING_OK;
}

mapping_status mapping__stream_capture_status(mapping_device *dev, const mapping_stream *stream, int *status,
                                              uint64_t *id)
{
    return mapping__op_stream_capture_status(dev, mapping__stream_state(stream), status, id);
}

bool mapping__host_locked_elsewhere(mapping_device *dev, const void *ptr, size_t bytes)
{
    return dev->be->host_locked && dev->be->host_locked(dev->state, ptr, bytes);
}

bool mapping__can_import_default_stream(const mapping_device *dev)
{
    return mapping__can_import_stream(dev) && dev->be->stream_import_default;
}

/* ---- the back-end half of object lifetimes ---- */

mapping_status mapping__op_device_info(const mapping_backend *be, int index, mapping_device_info *info)
{
    return be->device_info(index, info);
}

mapping_status mapping__op_device_open(const mapping_backend *be, int index, const mapping_device_desc *desc,
                                       void **state)
{
    return be->device_open(index, desc, state);
}

unsigned mapping__op_device_open_caps(mapping_device *dev)
{
    return dev->be->device_open_caps ? dev->be->device_open_caps(dev->state) : 0;
}

bool mapping__op_device_link(mapping_device *dev)
{
    return dev->be->device_link && dev->be->device_link(dev->state, &dev->link.latency, &dev->link.bandwidth);
}

void *mapping__op_stream_blocking(mapping_device *dev)
{
    return dev->be->stream_blocking ? dev->be->stream_blocking(dev->state) : NULL;
}

mapping_stream *mapping__blocking_stream(mapping_device *dev)
{
    return dev->blocking.state ? &dev->blocking : NULL;
}

void mapping__op_device_close(mapping_device *dev)
{
    dev->be->device_close(dev->state);
}

mapping_status mapping__op_device_native(const mapping_device *dev, mapping_native_device *out)
{
    return dev->be->device_native ? dev->be->device_native(dev->state, out) : MAPPING_OK;
}

mapping_status mapping__op_buffer_alloc(mapping_device *dev, size_t bytes, void **mem)
{
    return dev->be->buffer_alloc(dev->state, bytes, mem);
}

mapping_status mapping__op_buffer_alloc_unified(mapping_device *dev, size_t bytes, void **mem, void **host)
{
    return dev->be->buffer_alloc_unified(dev->state, bytes, mem, host);
}

void mapping__op_buffer_free(mapping_device *dev, void *mem)
{
    dev->be->buffer_free(dev->state, mem);
}

mapping_status mapping__op_buffer_native(mapping_device *dev, void *mem, void **native)
{
    return dev->be->buffer_native(dev->state, mem, native);
}

mapping_status mapping__op_host_alloc(mapping_device *dev, size_t bytes, void **ptr, void **cookie)
{
    mapping_status st = mapping__fault_check_any(dev, "host_alloc");
    if (st != MAPPING_OK)
        return st;
    return dev->be->host_alloc(dev->state, bytes, ptr, cookie);
}

void mapping__op_host_free(mapping_device *dev, void *ptr, void *cookie)
{
    dev->be->host_free(dev->state, ptr, cookie);
}

mapping_status mapping__op_host_register(mapping_device *dev, void *ptr, size_t bytes, void **cookie)
{
    mapping_status st = mapping__fault_check_any(dev, "host_register");
    if (st != MAPPING_OK)
        return st;
    return dev->be->host_register(dev->state, ptr, bytes, cookie);
}

void mapping__op_host_unregister(mapping_device *dev, void *ptr, void *cookie)
{
    if (dev->be->host_unregister)
        dev->be->host_unregister(dev->state, ptr, cookie);
}

mapping_status mapping__op_stream_create(mapping_device *dev, void **state)
{
    mapping_status st = mapping__fault_check_any(dev, "stream_create");
    if (st != MAPPING_OK)
        return st;
    return dev->be->stream_create(dev->state, state);
}

void mapping__op_stream_destroy(mapping_device *dev, void *state)
{
    dev->be->stream_destroy(dev->state, state);
}

mapping_status mapping__op_stream_native(mapping_device *dev, void *state, void **native)
{
    return dev->be->stream_native ? dev->be->stream_native(dev->state, state, native) : MAPPING_OK;
}

mapping_status mapping__op_event_record(mapping_device *dev, void *stream_state, void **event_state)
{
    mapping_status st = mapping__fault_check_any(dev, "event_record");
    if (st != MAPPING_OK)
        return st;
    return dev->be->event_record(dev->state, stream_state, event_state);
}

mapping_status mapping__op_event_wait(mapping_device *dev, void *stream_state, void *event_state)
{
    mapping_status st = mapping__fault_check_any(dev, "stream_wait_event");
    if (st != MAPPING_OK)
        return st;
    return dev->be->event_wait(dev->state, stream_state, event_state);
}

void mapping__op_event_destroy(mapping_device *dev, void *event_state)
{
    dev->be->event_destroy(dev->state, event_state);
}

mapping_status mapping__op_write_uncounted(mapping_device *dev, const void *src, const mapping_host_ref *pinned,
                                           void *dst_mem, size_t bytes)
{
    return dev->be->write(dev->state, NULL, src, pinned, dst_mem, 0, bytes);
}

/* ---- several devices: peer copies ---- */

bool mapping__can_copy_peer_direct(const mapping_device *src, const mapping_device *dst)
{
    return src == dst || (src->be == dst->be && dst->be->peer_copy != NULL);
}

/* Between back ends (or without peer_copy): through src's page-locked host
 * memory, chunk by chunk, blocking; not counted as host transfers. */
static mapping_status copy_peer_staged(mapping_stream *stream, const mapping_buffer *src, size_t src_offset,
                                       mapping_buffer *dst, size_t dst_offset, size_t bytes)
{
    enum { STAGING_CHUNK = 4 << 20 };
    mapping_device *sdev = src->dev, *ddev = dst->dev;
    mapping_status st = stream ? mapping__check_not_in_host_fn("mapping_copy_peer", stream) : MAPPING_OK;
    if (st != MAPPING_OK)
        return st; /* it waits for the stream: from the stream's own host function, for itself */
    st = stream ? mapping__stream_synchronize(stream) : MAPPING_OK;
    if (st != MAPPING_OK)
        return st;
    size_t chunk = bytes < STAGING_CHUNK ? bytes : STAGING_CHUNK;
    void *host = NULL, *cookie = NULL;
    if ((st = sdev->be->host_alloc(sdev->state, chunk, &host, &cookie)) != MAPPING_OK)
        return st;
    mapping_host_ref ref = {cookie, 0};
    for (size_t done = 0; done < bytes && st == MAPPING_OK; done += chunk) {
        size_t n = bytes - done < chunk ? bytes - done : chunk;
        st = sdev->be->read(sdev->state, NULL, src->mem, src_offset + done, host, &ref, n);
        if (st == MAPPING_OK)
            st = ddev->be->write(ddev->state, NULL, host, NULL, dst->mem, dst_offset + done, n);
    }
    sdev->be->host_free(sdev->state, host, cookie);
    return st;
}

mapping_status mapping__copy_peer(mapping_stream *stream, const mapping_buffer *src, size_t src_offset,
                                  mapping_buffer *dst, size_t dst_offset, size_t bytes)
{
    mapping_device *dev = dst->dev;
    if (src->dev == dev)
        return mapping__copy(stream, src, src_offset, dst, dst_offset, bytes);
    mapping_status st = mapping__fault_check(dev, "peer copy");
    if (st != MAPPING_OK)
        return st;
    if (mapping__can_copy_peer_direct(src->dev, dev)) {
        st = dev->be->peer_copy(dev->state, mapping__stream_state(stream), src->dev->state, src->mem, src_offset,
                                dst->mem, dst_offset, bytes);
        if (st == MAPPING_OK && stream) /* queued: closing src's device waits for it (core/peer_fence.c) */
            mapping__fence_add(stream, src->dev);
    } else
        st = copy_peer_staged(stream, src, src_offset, dst, dst_offset, bytes);
    if (st != MAPPING_OK)
        return st;
    mapping__count(&dev->counters.peer_bytes, bytes);
    mapping__count(&dev->counters.peer_copies, 1);
    return MAPPING_OK;
}

mapping_status mapping__op_peer_copy_uncounted(mapping_device *dst_dev, mapping_device *src_dev, void *src_mem,
                                               void *dst_mem, size_t bytes)
{
    if (src_dev == dst_dev)
        return dst_dev->be->copy(dst_dev->state, NULL, src_mem, 0, dst_mem, 0, bytes);
    return dst_dev->be->peer_copy(dst_dev->state, NULL, src_dev->state, src_mem, 0, dst_mem, 0, bytes);
}

/* ---- adopting objects made elsewhere ---- */

bool mapping__can_import_buffer(const mapping_device *dev)
{
    return dev->be->buffer_import != NULL && dev->be->buffer_unimport != NULL;
}

bool mapping__can_import_stream(const mapping_device *dev)
{
    return dev->be->stream_import != NULL && dev->be->stream_unimport != NULL;
}

mapping_status mapping__device_synchronize(mapping_device *dev)
{
    return dev->be->device_synchronize ? dev->be->device_synchronize(dev->state) : MAPPING_OK;
}

mapping_status mapping__op_device_adopt(const mapping_backend *be, const mapping_native_device *native, int *index,
                                        void **state)
{
    if (!be->device_adopt)
        return mapping__fail(MAPPING_ERR_UNSUPPORTED, "%s: this back end cannot open a device on native handles",
                             be->name);
    return be->device_adopt(native, index, state);
}

mapping_status mapping__op_buffer_import(mapping_device *dev, void *native, size_t offset, size_t bytes, void **mem)
{
    return dev->be->buffer_import(dev->state, native, offset, bytes, mem);
}

void mapping__op_buffer_unimport(mapping_device *dev, void *mem)
{
    dev->be->buffer_unimport(dev->state, mem);
}

mapping_status mapping__op_stream_import(mapping_device *dev, void *native, void **state)
{
    return dev->be->stream_import(dev->state, native, state);
}

void mapping__op_stream_unimport(mapping_device *dev, void *state)
{
    dev->be->stream_unimport(dev->state, state);
}
