/* Device memory: mapping_allocate_gpu / mapping_free_gpu and friends. */
#include <stdlib.h>
#include "core/core.h"

/* Wraps memory from one of the back end's allocators as a live buffer:
 * ordinary (host == NULL) or unified (*host gets its CPU address). */
static mapping_status buffer_new(const char *fn, mapping_device *dev, size_t bytes, void **host,
                                 mapping_buffer **out)
{
    mapping_buffer *buf = calloc(1, sizeof *buf);
    if (!buf)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    mapping_status st = mapping__fault_check(dev, fn);
    if (st == MAPPING_OK)
        st = host ? dev->be->buffer_alloc_unified(dev->state, bytes, &buf->mem, host)
                  : dev->be->buffer_alloc(dev->state, bytes, &buf->mem);
    if (st != MAPPING_OK) {
        free(buf);
        return st;
    }
    buf->magic = MAPPING_MAGIC_BUFFER;
    buf->dev = dev;
    buf->size = bytes;
    mapping__list_add(dev, &dev->buffers, &buf->node);
    *out = buf;
    return MAPPING_OK;
}

mapping_status mapping_allocate_gpu(mapping_device *dev, size_t bytes, mapping_buffer **out)
{
    static const char fn[] = "mapping_allocate_gpu";
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)) || (st = mapping__check_ptr(fn, "out", out)))
        return st;
    *out = NULL;
    if (bytes == 0)
        return mapping__fail(MAPPING_ERR_ZERO_SIZE, "%s: bytes is 0", fn);
    return buffer_new(fn, dev, bytes, NULL, out);
}

void mapping_free_gpu(mapping_buffer *buf)
{
    if (!buf || mapping__check_buffer("mapping_free_gpu", "buffer", buf) != MAPPING_OK)
        return;
    mapping_device *dev = buf->dev;
    mapping__list_remove(dev, &buf->node);
    buf->magic = MAPPING_MAGIC_DEAD;
    dev->be->buffer_free(dev->state, buf->mem);
    free(buf);
}

size_t mapping_buffer_size(const mapping_buffer *buf)
{
    return buf && buf->magic == MAPPING_MAGIC_BUFFER ? buf->size : 0;
}

mapping_device *mapping_buffer_device(const mapping_buffer *buf)
{
    return buf && buf->magic == MAPPING_MAGIC_BUFFER ? buf->dev : NULL;
}

mapping_status mapping_native_buffer(const mapping_buffer *buf, void **out)
{
    static const char fn[] = "mapping_native_buffer";
    mapping_status st;
    if ((st = mapping__check_buffer(fn, "buffer", buf)) || (st = mapping__check_ptr(fn, "out", out)))
        return st;
    return buf->dev->be->buffer_native(buf->dev->state, buf->mem, out);
}

/* For unified mirrors (src/coherence/mirror_unified.c): memory from the back
 * end's buffer_alloc_unified as an ordinary buffer, freed by
 * mapping_free_gpu; *host is its CPU address. MAPPING_ERR_UNSUPPORTED when the
 * back end has no unified memory. */
mapping_status mapping__allocate_unified(mapping_device *dev, size_t bytes, mapping_buffer **out, void **host)
{
    if (!dev->be->buffer_alloc_unified)
        return MAPPING_ERR_UNSUPPORTED;
    return buffer_new("mapping_mirror_create (unified)", dev, bytes, host, out);
}
