/* Reporting a mirror sync: trace event and info-level log line (see
 * mirror_observe.h). */
#include "coherence/mirror_observe.h"

void mapping__mirror_report_sync(const mapping_trace_span *span, mapping_stream *stream, const mapping_mirror *m,
                                 int t, mirror_sync_report r, mapping_status status)
{
    mirror_state *st = m->st;
    const char *name = t == MIRROR_GPU ? "mirror sync to GPU" : "mirror sync to CPU";
    MAPPING_TRACE_END(*span, .name = name, .cat = "mirror", .device = st->dev, .device_name = st->dev->info.name,
                      .stream = stream, .buffer = st->gpu, .direction = t == MIRROR_GPU ? "h2d" : "d2h",
                      .status = status,
                      .args = {{"bytes", m->size},
                               {"offset", m->offset},
                               {"ranges_stale", r.stale_ranges},
                               {"ranges_moved", r.copies},
                               {"ranges_merged", r.stale_ranges - r.copies},
                               {"bytes_moved", r.moved},
                               {"bytes_skipped", r.skipped}});
    if (mapping__log_enabled())
        mapping__log(2,
                     "%s of %zu bytes at offset %zu%s: %zu stale ranges, %zu merged away, %zu copies, %zu bytes "
                     "moved, %zu skipped%s",
                     name, m->size, m->offset, stream ? " (on a stream)" : "", r.stale_ranges,
                     r.stale_ranges - r.copies, r.copies, r.moved, r.skipped, status ? ": failed (see mapping_last_error)" : "");
}
