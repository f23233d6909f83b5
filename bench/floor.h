/* The floor of a scattered transfer (floor.c): a baseline for batches and mirror syncs. */
#ifndef MAPPING_BENCH_FLOOR_H
#define MAPPING_BENCH_FLOOR_H

#include "mapping.h"

typedef struct bench_floor bench_floor;
/* NULL when the floor cannot be measured on dev. */
bench_floor *bench_floor_open(mapping_device *dev, size_t bytes);
/* Seconds of one floor: a contiguous blocking copy of the bytes (+ a kernel launch and finish). NaN on failure. */
double       bench_floor_sample(bench_floor *f, int to_gpu);
int          bench_floor_has_kernel(const bench_floor *f);
/* The host back end: each sample also scatters the packed bytes to
 * dst[offsets[i], +bytes) (device to host: gathers them first), the loop a
 * device-side scatter is there. Ignored elsewhere. */
void         bench_floor_scatter(bench_floor *f, mapping_buffer *dst, const size_t *offsets, size_t count, size_t bytes);
void         bench_floor_close(bench_floor *f);
/* What the floor adds to its contiguous copy on a back end, for the notes:
 * "" or " plus ...". */
const char  *bench_floor_extra(const char *backend);

#endif
