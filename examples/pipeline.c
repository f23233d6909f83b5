/*
 * SAXPY over a large array, pipelined: the array of (x, y) pairs goes to the
 * device in chunks, a kernel computes y = a * x + y on each chunk while the
 * next chunk uploads and the previous one downloads, and the result is
 * checked against the same computation on the CPU.
 *
 *     example_pipeline [MiB]          (default 64; 1024 for the 1 GiB run)
 *     MAPPING_HOST_LINK=25e9,5e-6 example_pipeline 1024   (a PCIe-like link)
 *
 * The kernel here runs on the host back end (a host function on the
 * pipeline's stream, working on the buffers' native addresses); on other
 * back ends a real kernel would be enqueued on mapping_stream_native()'s
 * queue in the same place, so the example skips there.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "check.h"
#include "mapping.h"

typedef struct pair {
    float x, y;
} pair;

static const float A = 2.5f;

/* One queued kernel launch: its arguments live until it has run. */
typedef struct saxpy_args {
    const pair *in;
    pair       *out;
    size_t      n;
} saxpy_args;

static void saxpy_kernel(void *arg)
{
    const saxpy_args *k = arg;
    for (size_t i = 0; i < k->n; i++) {
        k->out[i].x = k->in[i].x;
        k->out[i].y = A * k->in[i].x + k->in[i].y;
    }
}

/* The pipeline is at most 2 x depth (<= 6) chunks ahead of the device. */
enum { RING = 6 };
typedef struct step_state {
    saxpy_args ring[RING];
} step_state;

static mapping_status saxpy_step(mapping_stream *stream, const mapping_pipeline_chunk *chunk, void *user)
{
    step_state *s = user;
    void *in, *out;
    mapping_status st;
    if ((st = mapping_buffer_native(chunk->input, &in)) != MAPPING_OK ||
        (st = mapping_buffer_native(chunk->output, &out)) != MAPPING_OK)
        return st;
    saxpy_args *k = &s->ring[chunk->index % RING];
    *k = (saxpy_args){(const pair *)((char *)in + chunk->input_offset), (pair *)((char *)out + chunk->output_offset),
                      chunk->bytes / sizeof(pair)};
    return mapping_launch_host(stream, saxpy_kernel, k);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 64;
    if (mib == 0) {
        fprintf(stderr, "usage: %s [MiB]\n", argv[0]);
        return 2;
    }
    mapping_device *dev;
    CHECK(mapping_open(NULL, &dev));
    if (strcmp(mapping_backend_name(dev), "host") != 0) {
        printf("SKIP: this example's kernel runs on the host back end; %s would enqueue its own kernel\n",
               mapping_backend_name(dev));
        mapping_close(dev);
        return 77;
    }
    size_t bytes = mib << 20, n = bytes / sizeof(pair);
    pair *data, *result;
    CHECK(mapping_allocate_cpu(dev, bytes, (void **)&data)); /* page-locked: no staging copy */
    CHECK(mapping_allocate_cpu(dev, bytes, (void **)&result));
    for (size_t i = 0; i < n; i++)
        data[i] = (pair){(float)(i % 1000) * 0.5f, (float)(i % 77) - 30.0f};
    memset(result, 0, bytes); /* touch its pages now, not while timing */

    mapping_pipeline *p;
    CHECK(mapping_pipeline_create(dev, &(mapping_pipeline_desc){.element_bytes = sizeof(pair)}, &p));
    mapping_pipeline_desc used;
    CHECK(mapping_pipeline_get_desc(p, &used));
    step_state state;
    double t0 = now();
    CHECK(mapping_pipeline_run(p, data, result, bytes, saxpy_step, &state));
    double seconds = now() - t0;
    printf("back end %s: SAXPY over %zu MiB in %zu KiB chunks, depth %d: %.1f ms (%.2f GB/s through the device)\n",
           mapping_backend_name(dev), mib, used.chunk_bytes >> 10, used.depth, seconds * 1e3,
           (double)bytes / seconds * 1e-9);

    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) { /* the CPU reference */
        float y = A * data[i].x + data[i].y;
        if (result[i].x != data[i].x || fabsf(result[i].y - y) > 1e-6f * fabsf(y))
            wrong++;
    }
    printf("%s: %zu of %zu results differ from the CPU reference\n", wrong ? "FAIL" : "ok", wrong, n);
    mapping_pipeline_destroy(p);
    mapping_free_cpu(dev, data);
    mapping_free_cpu(dev, result);
    mapping_close(dev);
    return wrong ? 1 : 0;
}
