/*
 * Devices: open (choosing the back end), close (cleaning up what the caller
 * left), information, native handles, and the measured link.
 */
#include <stdlib.h>
#include <string.h>
#include "core/backends.h"
#include "core/ops.h"
#include "core/trace_hooks.h"
#include "os/os.h"
#include "os/settings.h"

static const char *env_or_null(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* $MAPPING_BATCH_MAP: "0" turns off copies through mapped device memory
 * (mapping__can_map), so that blocking batches pack and scatter as they do
 * on a GPU (tests run both ways); unset, empty or "1": on. False when the
 * value is anything else. */
static bool batch_map_from_env(bool *on)
{
    const char *v = env_or_null("MAPPING_BATCH_MAP");
    *on = !v || strcmp(v, "0") != 0;
    return !v || !strcmp(v, "0") || !strcmp(v, "1");
}

/* ---- the link's probe memory ----
 * Measuring the link copies PROBE_BYTES from page-locked memory. On a
 * device whose memory is not the CPU's, allocating or freeing may wait for
 * every stream (a CUDA driver synchronizes frees with the device), and the
 * link is asked for inside batch flushes, mirror syncs and pipelines, while
 * the caller's streams may hold work that waits for the caller. So such a
 * device gets its probe memory at open and keeps it until close. */
enum { PROBE_BYTES = 8 << 20 };

static void probe_free(mapping_device *dev)
{
    if (dev->probe_host)
        mapping__op_host_free(dev, dev->probe_host, dev->probe_cookie);
    if (dev->probe_mem)
        mapping__op_buffer_free(dev, dev->probe_mem);
    dev->probe_host = dev->probe_cookie = dev->probe_mem = NULL;
}

static void probe_alloc(mapping_device *dev)
{
    if (dev->info.caps & MAPPING_CAP_CPU_MEMORY)
        return; /* measured with memory allocated for the purpose */
    mapping_error_mark before;
    mapping__error_mark(&before);
    if (mapping__op_buffer_alloc(dev, PROBE_BYTES, &dev->probe_mem) != MAPPING_OK ||
        mapping__op_host_alloc(dev, PROBE_BYTES, &dev->probe_host, &dev->probe_cookie) != MAPPING_OK) {
        mapping__log(1, "mapping_open: no memory to measure the link with now (%s); it will be allocated when "
                        "the link is first measured", mapping__last_message());
        probe_free(dev);
        mapping__error_forget(&before); /* mapping_open still succeeds */
    }
}

void mapping__list_add(mapping_device *dev, mapping_list_node *head, mapping_list_node *node)
{
    pthread_mutex_lock(&dev->objects_lock);
    node->next = head->next;
    node->prev = head;
    head->next->prev = node;
    head->next = node;
    pthread_mutex_unlock(&dev->objects_lock);
}

void mapping__list_remove(mapping_device *dev, mapping_list_node *node)
{
    pthread_mutex_lock(&dev->objects_lock);
    node->prev->next = node->next;
    node->next->prev = node->prev;
    node->prev = node->next = node;
    pthread_mutex_unlock(&dev->objects_lock);
}

/* The desc of 0.1.0: what the exported mapping_open reads. */
#define DESC_0_1_BYTES (offsetof(mapping_device_desc, link_latency) + sizeof(double))
enum { DESC_MAX_BYTES = 4096 };

/* The caller's desc of desc_size bytes as this library's (fields past it
 * 0); a longer one must hold zeros past what this library knows. */
static mapping_status desc_read(const char *fn, const mapping_device_desc *desc, size_t desc_size,
                                mapping_device_desc *d)
{
    *d = (mapping_device_desc){0};
    if (!desc)
        return MAPPING_OK;
    if (desc_size < DESC_0_1_BYTES || desc_size > DESC_MAX_BYTES)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: desc_size %zu is not the size of a mapping_device_desc (%zu to %d bytes)", fn,
                             desc_size, (size_t)DESC_0_1_BYTES, (int)DESC_MAX_BYTES);
    memcpy(d, desc, desc_size < sizeof *d ? desc_size : sizeof *d);
    for (size_t i = sizeof *d; i < desc_size; i++)
        if (((const unsigned char *)desc)[i])
            return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                                 "%s: byte %zu of the desc (%zu bytes) is set, a field this library (%zu bytes of "
                                 "desc) does not know: a newer header than the library",
                                 fn, i, desc_size, sizeof *d);
    return MAPPING_OK;
}

mapping_status (mapping_open)(const mapping_device_desc *desc, mapping_device **out)
{
    return mapping_open_sized(desc, out, DESC_0_1_BYTES);
}

/* $MAPPING_DEVICE: decimal digits only (no sign, space or suffix), at most 1000000. */
static mapping_status device_from_env(const char *fn, int *device)
{
    const char *env = getenv("MAPPING_DEVICE");
    long index = 0;
    for (const char *c = env; *c && index <= 1000000; c++)
        index = *c >= '0' && *c <= '9' ? index * 10 + (*c - '0') : 1000001;
    if (index > 1000000)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: MAPPING_DEVICE=\"%s\" is not a device index (decimal digits, 0 to 1000000)", fn, env);
    *device = (int)index;
    return MAPPING_OK;
}

/* What the environment adds to the desc d (the budget, the back end, the
 * device index where no desc was given), each value checked. */
static mapping_status desc_resolve(const char *fn, const mapping_device_desc *desc, mapping_device_desc *d)
{
    mapping_status st;
    if (!d->memory_budget && !mapping__budget_from_env(&d->memory_budget))
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: MAPPING_MEMORY_BUDGET=\"%s\" is not a memory budget (decimal digits, bytes, 0 to "
                             "2^60; 0: none)", fn, getenv("MAPPING_MEMORY_BUDGET"));
    if (d->memory_budget > ((uint64_t)1 << 60))
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: memory_budget %llu is more than 2^60", fn,
                             (unsigned long long)d->memory_budget);
    if (!d->backend)
        d->backend = env_or_null("MAPPING_BACKEND");
    /* A desc given: its index, 0 included, is the one asked for. */
    if (!desc && env_or_null("MAPPING_DEVICE") && (st = device_from_env(fn, &d->device)))
        return st;
    if (d->device < 0)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: device index %d is negative", fn, d->device);
    const char *why = mapping_os_link_check(d->link_bandwidth, d->link_latency);
    if (why)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: link_bandwidth %g, link_latency %g: %s", fn,
                             d->link_bandwidth, d->link_latency, why);
    return MAPPING_OK;
}

/* The process-wide settings an open reads: $MAPPING_BATCH_MAP (checked
 * here, used by mapping__device_finish) and $MAPPING_COPY_THREADS (set). */
static mapping_status process_settings(const char *fn)
{
    bool map_on;
    if (!batch_map_from_env(&map_on))
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: MAPPING_BATCH_MAP=\"%s\" is not 0 or 1", fn,
                             getenv("MAPPING_BATCH_MAP"));
    int copy_threads;
    if (!mapping_os_copy_threads_from_env(&copy_threads))
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: MAPPING_COPY_THREADS=\"%s\" is not a number of threads from 0 to 64", fn,
                             getenv("MAPPING_COPY_THREADS"));
    mapping_os_copy_threads_set(copy_threads);
    return MAPPING_OK;
}

/* The back end d names (or the default) and its info, with device d->device. */
static mapping_status backend_choose(const char *fn, const mapping_device_desc *d, const mapping_backend **be,
                                     mapping_backend_info *info)
{
    int which = d->backend ? mapping__backend_index(d->backend) : mapping__backend_default();
    if (which < 0 && !d->backend)
        return mapping__fail(MAPPING_ERR_NO_BACKEND, "%s: no back end is available", fn);
    if (which < 0)
        return mapping__fail(MAPPING_ERR_NO_BACKEND, "%s: unknown back end \"%s\" (%s)", fn, d->backend,
                             mapping__backend_names());
    *be = mapping__backend_get(which, info);
    if (!*be)
        return mapping__fail(MAPPING_ERR_NO_BACKEND, "%s: back end %s is unavailable: %s", fn, info->name,
                             info->reason);
    if (d->device >= info->device_count)
        return mapping__fail(MAPPING_ERR_NO_DEVICE, "%s: %s has %d device(s); there is no device %d", fn, info->name,
                             info->device_count, d->device);
    return MAPPING_OK;
}

mapping_status mapping_open_sized(const mapping_device_desc *desc, mapping_device **out, size_t desc_size)
{
    static const char fn[] = "mapping_open";
    mapping_status st;
    if ((st = mapping__check_ptr(fn, "out", out)))
        return st;
    *out = NULL;
    mapping_device_desc d;
    const mapping_backend *be = NULL;
    mapping_backend_info info;
    if ((st = mapping__settings_check(fn)) ||          /* every MAPPING_* variable (os/settings.c) */
        (st = mapping__trace_from_environment(fn)) || /* $MAPPING_TRACE */
        (st = desc_read(fn, desc, desc_size, &d)) || (st = desc_resolve(fn, desc, &d)) ||
        (st = process_settings(fn)) || (st = backend_choose(fn, &d, &be, &info)))
        return st;
    mapping_device *dev = mapping_os_handle_alloc(sizeof *dev); /* zeroed; see os/handle_arena.c */
    if (!dev)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    dev->be = be;
    dev->budget = d.memory_budget;
    if ((st = mapping__op_device_info(be, d.device, &dev->info)) != MAPPING_OK ||
        (st = mapping__op_device_open(be, d.device, &d, &dev->state)) != MAPPING_OK) {
        mapping_os_handle_free(dev);
        return st;
    }
    return mapping__device_finish(dev, out);
}

mapping_status mapping__device_finish(mapping_device *dev, mapping_device **out)
{
    dev->info.caps |= mapping__op_device_open_caps(dev); /* e.g. a modelled link */
    dev->blocking = (mapping_stream){.dev = dev, .state = mapping__op_stream_blocking(dev)};
    bool map_on;
    batch_map_from_env(&map_on); /* checked by mapping_open; an adopted device takes it as it is */
    dev->map_copies = map_on && dev->be->map && dev->be->unmap && (dev->info.caps & MAPPING_CAP_CPU_MEMORY) &&
                      !(dev->info.caps & MAPPING_CAP_LINK_MODEL);
    probe_alloc(dev);
    /* The link as the back end measured it at open (cuda: on a private
     * stream, not behind the user's work); else measured on first use. */
    mapping__op_device_link(dev);
    mapping__host_registry_init(&dev->host_blocks);
    pthread_mutex_init(&dev->objects_lock, NULL);
    pthread_mutex_init(&dev->link_lock, NULL);
    pthread_mutex_init(&dev->reclaim_lock, NULL);
    dev->reclaimables.next = dev->reclaimables.prev = &dev->reclaimables;
    uint64_t env_budget = 0;
    if (!dev->budget && mapping__budget_from_env(&env_budget)) /* checked by the opens */
        dev->budget = env_budget;
    dev->buffers.next = dev->buffers.prev = &dev->buffers;
    dev->streams.next = dev->streams.prev = &dev->streams;
    dev->events.next = dev->events.prev = &dev->events;
    mapping__fence_init(&dev->fences);
    mapping__fence_init(&dev->blocking.fences);
    static _Atomic uint64_t serials;
    dev->serial = atomic_fetch_add(&serials, 1) + 1;
    if (mapping__handle_add(MAPPING_HANDLE_DEVICE, dev) != MAPPING_OK) {
        probe_free(dev);
        mapping__host_registry_destroy(dev);
        pthread_mutex_destroy(&dev->objects_lock);
        pthread_mutex_destroy(&dev->link_lock);
        pthread_mutex_destroy(&dev->reclaim_lock);
        mapping__op_device_close(dev);
        mapping_os_handle_free(dev);
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mapping_open: out of memory for the handle registry");
    }
    *out = dev;
    return MAPPING_OK;
}

void mapping_close(mapping_device *dev)
{
    if (!dev || mapping__check_device("mapping_close", dev) != MAPPING_OK)
        return;
    if (atomic_load(&dev->running_pipelines) > 0) {
        mapping__fail(MAPPING_ERR_BUSY, "mapping_close: device %p has a pipeline running (called from its step, or "
                                        "while another thread runs it): close it after the run",
                      (void *)dev);
        return;
    }
    /* From a host function on one of its streams, close would wait for itself. */
    const void *worker = mapping_os_worker_stream();
    const mapping_stream *own = NULL;
    pthread_mutex_lock(&dev->objects_lock);
    for (mapping_list_node *n = dev->streams.next; worker && n != &dev->streams && !own; n = n->next) {
        const mapping_stream *s = (const mapping_stream *)((const char *)n - offsetof(mapping_stream, node));
        own = s->state == worker ? s : NULL;
    }
    pthread_mutex_unlock(&dev->objects_lock);
    /* Then work queued on other devices' streams that reads this device's
     * memory (peer copies, multimirror syncs): it must end before the memory
     * goes (or BUSY, from a host function that such work waits behind). */
    if ((own && mapping__check_not_in_host_fn("mapping_close", own) != MAPPING_OK) ||
        mapping__fences_wait("mapping_close", dev) != MAPPING_OK || !mapping__handle_remove(MAPPING_HANDLE_DEVICE, dev))
        return;
    mapping__trace_statistics(dev, "device closed");
    /* Streams first (they wait for their work), then the memory it used. */
    while (dev->streams.next != &dev->streams) {
        mapping_stream *s = (mapping_stream *)((char *)dev->streams.next - offsetof(mapping_stream, node));
        mapping__log(1, "mapping_close: stream %p was never destroyed; destroying it", (void *)s);
        mapping__stream_destroy(s);
    }
    while (dev->events.next != &dev->events) {
        mapping_event *e = (mapping_event *)((char *)dev->events.next - offsetof(mapping_event, node));
        mapping__log(1, "mapping_close: event %p was never destroyed; destroying it", (void *)e);
        mapping__event_destroy(e);
    }
    while (dev->buffers.next != &dev->buffers) {
        mapping_buffer *b = (mapping_buffer *)((char *)dev->buffers.next - offsetof(mapping_buffer, node));
        mapping__log(1, "mapping_close: buffer %p (%zu bytes) was never freed; freeing it", (void *)b, b->size);
        mapping__free_gpu(b);
    }
    mapping__host_registry_destroy(dev);
    mapping__host_cache_destroy(dev);
    mapping__native_mark_destroy(dev);
    probe_free(dev);
    mapping__op_device_close(dev);
    pthread_mutex_destroy(&dev->objects_lock);
    pthread_mutex_destroy(&dev->link_lock);
    pthread_mutex_destroy(&dev->reclaim_lock);
    mapping_os_handle_free(dev);
}

const char *mapping_backend_name(const mapping_device *dev)
{
    if (!mapping__handle_live(MAPPING_HANDLE_DEVICE, dev))
        return "";
    return dev->be->name;
}

mapping_status mapping_device_get_info(const mapping_device *dev, mapping_device_info *out)
{
    static const char fn[] = "mapping_device_get_info";
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)) || (st = mapping__check_ptr(fn, "out", out)))
        return st;
    *out = dev->info;
    return MAPPING_OK;
}

mapping_status mapping_native_device_handles(const mapping_device *dev, mapping_native_device *out)
{
    static const char fn[] = "mapping_native_device_handles";
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)) || (st = mapping__check_ptr(fn, "out", out)))
        return st;
    memset(out, 0, sizeof *out);
    return mapping__op_device_native(dev, out);
}

/* ---- the link: per-transfer latency and bandwidth, measured once ---- */

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, compare_doubles);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Straight to the back end: measuring must not show in the statistics. */
static mapping_status measure_link(mapping_device *dev, mapping_link *link)
{
    const size_t big = PROBE_BYTES;
    bool kept = dev->probe_host != NULL; /* probe_alloc's, else our own */
    void *mem = dev->probe_mem, *host = dev->probe_host, *cookie = dev->probe_cookie;
    mapping_status st = kept ? MAPPING_OK : mapping__op_buffer_alloc(dev, big, &mem);
    if (st == MAPPING_OK && !kept)
        st = mapping__op_host_alloc(dev, big, &host, &cookie);
    if (st == MAPPING_OK) {
        mapping_host_ref ref = {cookie, 0};
        memset(host, 1, big);
        enum { SMALL_RUNS = 21, BIG_RUNS = 3 };
        double small[SMALL_RUNS], large[BIG_RUNS];
        for (int i = 0; i < SMALL_RUNS && st == MAPPING_OK; i++) {
            double t0 = mapping_os_now();
            st = mapping__op_write_uncounted(dev, host, &ref, mem, 64);
            small[i] = mapping_os_now() - t0;
        }
        for (int i = 0; i < BIG_RUNS && st == MAPPING_OK; i++) {
            double t0 = mapping_os_now();
            st = mapping__op_write_uncounted(dev, host, &ref, mem, big);
            large[i] = mapping_os_now() - t0;
        }
        if (st == MAPPING_OK) {
            double lat = median(small, SMALL_RUNS), t_big = median(large, BIG_RUNS);
            if (link->latency <= 0)
                link->latency = lat > 1e-9 ? lat : 1e-9;
            if (link->bandwidth <= 0)
                link->bandwidth = t_big > lat ? (double)big / (t_big - lat) : (double)big / t_big;
        }
    }
    if (host && !kept)
        mapping__op_host_free(dev, host, cookie);
    if (mem && !kept)
        mapping__op_buffer_free(dev, mem);
    return st;
}

mapping_status mapping__device_link(mapping_device *dev, mapping_link *out)
{
    mapping_status st = MAPPING_OK;
    pthread_mutex_lock(&dev->link_lock);
    if (dev->link.latency <= 0 || dev->link.bandwidth <= 0)
        st = measure_link(dev, &dev->link);
    *out = dev->link;
    pthread_mutex_unlock(&dev->link_lock);
    return st;
}

mapping_status mapping_device_link(mapping_device *dev, mapping_link *out)
{
    static const char fn[] = "mapping_device_link";
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)) || (st = mapping__check_ptr(fn, "out", out)))
        return st;
    return mapping__device_link(dev, out);
}

mapping_status mapping_device_set_link(mapping_device *dev, const mapping_link *link)
{
    static const char fn[] = "mapping_device_set_link";
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)) || (st = mapping__check_ptr(fn, "link", link)))
        return st;
    const char *why = mapping_os_link_check(link->bandwidth, link->latency);
    if (why)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: bandwidth %g, latency %g: %s", fn, link->bandwidth,
                             link->latency, why);
    pthread_mutex_lock(&dev->link_lock);
    dev->link = *link;
    pthread_mutex_unlock(&dev->link_lock);
    return MAPPING_OK;
}

mapping_status mapping_device_set_checks(mapping_device *dev, unsigned checks)
{
    static const char fn[] = "mapping_device_set_checks";
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)))
        return st;
    if (checks & ~(unsigned)MAPPING_DEVICE_CHECK_RACES)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: unknown check bits 0x%x (known: MAPPING_DEVICE_CHECK_RACES)",
                             fn, checks & ~(unsigned)MAPPING_DEVICE_CHECK_RACES);
    atomic_store_explicit(&dev->checks, checks, memory_order_relaxed);
    return MAPPING_OK;
}

unsigned mapping_device_checks(mapping_device *dev)
{
    if (mapping__check_device("mapping_device_checks", dev))
        return 0;
    return atomic_load_explicit(&dev->checks, memory_order_relaxed);
}
