/*
 * Internal transfer operations on validated arguments: count statistics,
 * apply fault injection, find page-locked host memory, call the back end.
 * Public functions validate and then call these; the coherence and transfer
 * layers call them directly.
 */
#ifndef MAPPING_CORE_OPS_H
#define MAPPING_CORE_OPS_H

#include "core/core.h"

mapping_status mapping__write(mapping_stream *stream, const void *src, mapping_buffer *dst, size_t dst_offset,
                              size_t bytes);
mapping_status mapping__read(mapping_stream *stream, const mapping_buffer *src, size_t src_offset, void *dst,
                             size_t bytes);
mapping_status mapping__copy(mapping_stream *stream, const mapping_buffer *src, size_t src_offset,
                             mapping_buffer *dst, size_t dst_offset, size_t bytes);
mapping_status mapping__fill(mapping_stream *stream, mapping_buffer *dst, size_t offset, size_t bytes,
                             unsigned char value);

#endif
