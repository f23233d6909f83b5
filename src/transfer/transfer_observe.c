/* Trace events and log lines of batch flushes and pipeline chunks. */
#include "transfer/transfer_observe.h"

void mapping__batch_flush_done(const mapping_trace_span *span, mapping_stream *stream, const mapping_batch *b,
                               const batch_plan *p, mapping_status st)
{
    if (__builtin_expect(span->t0 == 0, 1) && !mapping__log_enabled())
        return;
    size_t h2d_staged = p->moved[0][0], h2d_straight = p->moved[0][1];
    size_t d2h_staged = p->moved[1][0], d2h_straight = p->moved[1][1];
    MAPPING_TRACE_END(*span, .name = "batch flush", .cat = "batch", .device = b->dev,
                      .device_name = b->dev->info.name, .stream = stream, .status = st,
                      .args = {{"copies", p->count},
                               {"groups", p->group_count},
                               {"h2d_staged_groups", p->h2d_staged},
                               {"h2d_straight_groups", p->h2d_straight},
                               {"d2h_staged_groups", p->d2h_staged},
                               {"d2h_straight_groups", p->d2h_straight},
                               {"staging_bytes", p->staging_bytes},
                               {"bytes", h2d_staged + h2d_straight + d2h_staged + d2h_straight}});
    if (mapping__log_enabled())
        mapping__log(2,
                     "batch flush of %zu copies%s: %zu groups after merging; host to device: %zu groups packed "
                     "(%zu bytes, one transfer and a scatter), %zu straight through (%zu bytes); device to host: "
                     "%zu groups packed (%zu bytes, a gather and one transfer), %zu straight through (%zu bytes); "
                     "staging %zu bytes%s",
                     p->count, stream ? " (on a stream)" : "", p->group_count, p->h2d_staged, h2d_staged,
                     p->h2d_straight, h2d_straight, p->d2h_staged, d2h_staged, p->d2h_straight, d2h_straight,
                     p->staging_bytes, st ? ": failed (see mapping_last_error)" : "");
}

void mapping__pipeline_chunk_done(const mapping_trace_span *span, mapping_device *dev, mapping_stream *stream,
                                  const mapping_pipeline_chunk *chunk, mapping_status st)
{
    MAPPING_TRACE_END(*span, .name = "pipeline chunk", .cat = "pipeline", .device = dev,
                      .device_name = dev->info.name, .stream = stream, .status = st,
                      .args = {{"index", chunk->index}, {"offset", chunk->offset}, {"bytes", chunk->bytes}});
}
