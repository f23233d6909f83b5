/*
 * What the transfer layer reports: a batch flush's plan and a pipeline's
 * chunks, as trace events (os/trace.h) and, for flushes, an info-level log
 * line. One-line hooks for batch_flush.c and pipeline.c.
 */
#ifndef MAPPING_TRANSFER_OBSERVE_H
#define MAPPING_TRANSFER_OBSERVE_H

#include "transfer/transfer.h"
#include "os/trace.h"

/* After a flush ran its plan p (status st). */
void mapping__batch_flush_done(const mapping_trace_span *span, mapping_stream *stream, const mapping_batch *b,
                               const batch_plan *p, mapping_status st);
/* After a pipeline chunk was queued on its slot's stream. */
void mapping__pipeline_chunk_done(const mapping_trace_span *span, mapping_device *dev, mapping_stream *stream,
                                  const mapping_pipeline_chunk *chunk, mapping_status st);

#endif
