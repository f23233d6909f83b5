/*
 * Many small scattered copies as one transfer: a particle array lives on the
 * device; 10,000 scattered particles change on the CPU and go up in one
 * batch, then a scattered selection comes back down in another. Each flush
 * is one driver transfer, which the device's statistics show.
 * Runs on the default back end ($MAPPING_BACKEND to choose).
 */
#include <stdio.h>
#include <stdlib.h>
#include "check.h"
#include "mapping.h"

typedef struct particle {
    float pos[3], vel[3], mass;
    unsigned id;
} particle; /* 32 bytes */

enum { N = 100000, UPDATED = 10000, PICKED = 2000 };

/* The k-th particle read back: every 50th, and every other one of those moved. */
static size_t picked_index(size_t k)
{
    return k * (N / PICKED) + (k % 2) * 3;
}

int main(void)
{
    mapping_device *dev;
    CHECK(mapping_open(NULL, &dev));
    particle *p = malloc(N * sizeof *p), *picked = malloc(PICKED * sizeof *picked);
    if (!p || !picked) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (unsigned i = 0; i < N; i++)
        p[i] = (particle){{(float)i, 0, 0}, {1, 0, 0}, 1.0f, i};

    mapping_buffer *gpu;
    CHECK(mapping_allocate_gpu(dev, N * sizeof *p, &gpu));
    CHECK(mapping_sync_to_gpu(p, gpu)); /* the whole array, once */

    mapping_batch *b;
    CHECK(mapping_batch_create(dev, &b));
    mapping_device_stats_reset(dev);

    /* Every 10th particle moves; queue each one's 32 bytes. */
    for (size_t k = 0; k < UPDATED; k++) {
        size_t i = k * (N / UPDATED) + 3;
        p[i].pos[0] += p[i].vel[0];
        p[i].mass = 2.0f;
        CHECK(mapping_batch_add_to_gpu(b, &p[i], gpu, i * sizeof *p, sizeof *p));
    }
    size_t queued = mapping_batch_count(b);
    CHECK(mapping_batch_flush(NULL, b)); /* pack, one transfer, scatter on the device */
    mapping_stats up;
    CHECK(mapping_device_stats(dev, &up));

    /* Bring a scattered selection back into a compact array. */
    for (size_t k = 0; k < PICKED; k++)
        CHECK(mapping_batch_add_to_cpu(b, gpu, picked_index(k) * sizeof *p, &picked[k], sizeof *p));
    CHECK(mapping_batch_flush(NULL, b)); /* gather on the device, one transfer, unpack */
    mapping_stats down;
    CHECK(mapping_device_stats(dev, &down));

    size_t wrong = 0;
    for (size_t k = 0; k < PICKED; k++) {
        const particle *want = &p[picked_index(k)], *got = &picked[k];
        wrong += got->id != want->id || got->pos[0] != want->pos[0] || got->mass != want->mass;
    }

    printf("back end %s: %zu copies of %zu bytes up, %d down\n", mapping_backend_name(dev), queued, sizeof *p,
           PICKED);
    printf("up:   %llu host-to-device transfer(s), %llu bytes, %llu flush\n", (unsigned long long)up.h2d_copies,
           (unsigned long long)up.h2d_bytes, (unsigned long long)up.batch_flushes);
    printf("down: %llu device-to-host transfer(s), %llu bytes; batch copies in all: %llu\n",
           (unsigned long long)down.d2h_copies, (unsigned long long)down.d2h_bytes,
           (unsigned long long)down.batch_copies);

    /* Small copies are staged: one transfer per direction, not one per copy. */
    int ok = wrong == 0 && queued == UPDATED && up.h2d_copies == 1 && down.d2h_copies == 1 &&
             down.batch_flushes == 2 && down.batch_copies == UPDATED + PICKED && mapping_batch_count(b) == 0;
    printf("%s: %zu of %d particles read back differ\n", ok ? "ok" : "FAIL", wrong, PICKED);

    mapping_batch_destroy(b);
    mapping_free_gpu(gpu);
    mapping_close(dev);
    free(p);
    free(picked);
    return ok ? 0 : 1;
}
