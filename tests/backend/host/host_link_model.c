/*
 * The host back end's modelled link (mapping_device_desc.link_latency and
 * .link_bandwidth): a transfer holds its direction's copy engine for at
 * least latency + bytes / bandwidth, whether its wait ends in a sleep or in
 * the spin that follows one (host_queue.c), and transfers of one direction
 * queue behind each other across streams. Lower bounds only: how close to
 * the modelled time a transfer ends is a benchmark figure
 * (`mapping bench --only batch`, link_single_vs_model), not a test.
 */
#include <time.h>
#include "harness.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static mapping_device *open_link(double latency, double bandwidth)
{
    mapping_device *dev = NULL;
    mapping_device_desc desc = {.backend = "host", .link_latency = latency, .link_bandwidth = bandwidth};
    CHECK_OK(mapping_open(&desc, &dev));
    return dev;
}

enum { BYTES = 100000 };

/* Short and long waits alike: below the wake-up margin the wait is all
 * spin, above it a sleep then a spin; the margin adapts between rounds. */
UNIT_TEST(a_modelled_transfer_takes_at_least_the_modelled_time_in_both_directions)
{
    static const double latencies[] = {2e-6, 30e-6, 300e-6};
    static unsigned char host[BYTES];
    for (size_t l = 0; l < sizeof latencies / sizeof latencies[0]; l++) {
        mapping_device *dev = open_link(latencies[l], 1e9);
        mapping_buffer *buf = NULL;
        CHECK_OK(mapping_allocate_gpu(dev, BYTES, &buf));
        const double modelled = latencies[l] + BYTES / 1e9;
        for (int round = 0; round < 20; round++) {
            host[round] = (unsigned char)(round + 1);
            double t0 = now_s();
            CHECK_OK(mapping_sync_to_gpu_range(NULL, host, buf, 0, BYTES));
            double up = now_s() - t0;
            host[round] = 0;
            t0 = now_s();
            CHECK_OK(mapping_sync_to_cpu_range(NULL, buf, 0, host, BYTES));
            double down = now_s() - t0;
            CHECK(host[round] == (unsigned char)(round + 1)); /* the bytes moved, too */
            CHECK(up >= modelled);
            CHECK(down >= modelled);
        }
        mapping_free_gpu(buf);
        mapping_close(dev);
    }
}

/* Two streams, one direction: the second transfer waits for the engine. */
UNIT_TEST(modelled_transfers_of_one_direction_queue_behind_each_other_across_streams)
{
    static unsigned char host[2][BYTES];
    const double latency = 200e-6, modelled = latency + BYTES / 1e9;
    mapping_device *dev = open_link(latency, 1e9);
    mapping_buffer *buf = NULL;
    mapping_stream *s[2] = {NULL, NULL};
    CHECK_OK(mapping_allocate_gpu(dev, 2 * BYTES, &buf));
    CHECK_OK(mapping_stream_create(dev, &s[0]));
    CHECK_OK(mapping_stream_create(dev, &s[1]));
    for (int round = 0; round < 5; round++) {
        double t0 = now_s();
        for (int i = 0; i < 2; i++)
            CHECK_OK(mapping_sync_to_gpu_range(s[i], host[i], buf, (size_t)i * BYTES, BYTES));
        for (int i = 0; i < 2; i++)
            CHECK_OK(mapping_stream_synchronize(s[i]));
        CHECK(now_s() - t0 >= 2 * modelled);
    }
    mapping_stream_destroy(s[0]);
    mapping_stream_destroy(s[1]);
    mapping_free_gpu(buf);
    mapping_close(dev);
}
