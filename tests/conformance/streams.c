/* Streams, events and host functions, on every back end. */
#include <pthread.h>
#include <time.h>
#include "harness.h"

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

TEST(stream_work_runs_in_order_and_after_the_call_returns)
{
    mapping_device *dev = test_device();
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    enum { N = 1 << 16 };
    unsigned char *a = malloc(N), *b = malloc(N), *out = malloc(N);
    test_pattern(a, N, 10);
    test_pattern(b, N, 11);
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, N, &buf));
    test_gate g = TEST_GATE_INIT;
    CHECK_OK(mapping_launch_host(s, test_gate_wait, &g));
    CHECK_OK(mapping_sync_to_gpu_range(s, a, buf, 0, N));
    CHECK_OK(mapping_sync_to_gpu_range(s, b, buf, 0, N / 2)); /* later work wins */
    CHECK_OK(mapping_sync_to_cpu_range(s, buf, 0, out, N));
    mapping_event *ev;
    CHECK_OK(mapping_event_record(s, &ev));
    CHECK_STATUS(mapping_event_query(ev), MAPPING_ERR_NOT_READY); /* the gate holds the stream */
    CHECK(test_gate_passed(&g) == 0);
    test_gate_open(&g);
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK_OK(mapping_event_query(ev));
    CHECK(test_gate_passed(&g) == 1);
    CHECK_BYTES(out, b, N / 2);
    CHECK_BYTES(out + N / 2, a + N / 2, N / 2);
    mapping_event_destroy(ev);
    mapping_free_gpu(buf);
    mapping_stream_destroy(s);
    free(a);
    free(b);
    free(out);
}

TEST(wait_event_orders_two_streams)
{
    mapping_device *dev = test_device();
    mapping_stream *s1, *s2;
    CHECK_OK(mapping_stream_create(dev, &s1));
    CHECK_OK(mapping_stream_create(dev, &s2));
    enum { N = 4096 };
    unsigned char in[N], out[N];
    test_pattern(in, N, 12);
    memset(out, 0, N);
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, N, &buf));
    test_gate g = TEST_GATE_INIT;
    CHECK_OK(mapping_launch_host(s1, test_gate_wait, &g));
    CHECK_OK(mapping_sync_to_gpu_range(s1, in, buf, 0, N));
    mapping_event *written;
    CHECK_OK(mapping_event_record(s1, &written));
    CHECK_OK(mapping_stream_wait_event(s2, written));
    CHECK_OK(mapping_sync_to_cpu_range(s2, buf, 0, out, N));
    mapping_event *read;
    CHECK_OK(mapping_event_record(s2, &read));
    sleep_ms(20);
    CHECK_STATUS(mapping_event_query(read), MAPPING_ERR_NOT_READY); /* s2 waits for s1, held by the gate */
    test_gate_open(&g);
    CHECK_OK(mapping_event_synchronize(read));
    CHECK_BYTES(out, in, N);
    mapping_event_destroy(written);
    mapping_event_destroy(read);
    mapping_free_gpu(buf);
    mapping_stream_destroy(s1);
    mapping_stream_destroy(s2);
}

static void add_one(void *arg)
{
    (*(int *)arg)++;
}

TEST(launch_host_runs_once_per_call_in_order)
{
    mapping_device *dev = test_device();
    int counter = 0;
    CHECK_OK(mapping_launch_host(NULL, add_one, &counter)); /* NULL: now, on this thread */
    CHECK(counter == 1);
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    for (int i = 0; i < 100; i++)
        CHECK_OK(mapping_launch_host(s, add_one, &counter));
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK(counter == 101);
    mapping_stream_destroy(s);
}

static void sleep_20ms(void *arg)
{
    (void)arg;
    sleep_ms(20);
}

TEST(events_measure_elapsed_time)
{
    mapping_device *dev = test_device();
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    mapping_event *a, *b;
    CHECK_OK(mapping_event_record(s, &a));
    CHECK_OK(mapping_launch_host(s, sleep_20ms, NULL));
    CHECK_OK(mapping_event_record(s, &b));
    CHECK_OK(mapping_event_synchronize(b));
    double seconds = -1;
    CHECK_OK(mapping_event_elapsed(a, b, &seconds));
    CHECK(seconds >= 0.015 && seconds < 5.0);
    mapping_event_destroy(a);
    mapping_event_destroy(b);
    mapping_stream_destroy(s);
}

TEST(destroying_a_stream_finishes_its_queued_work)
{
    mapping_device *dev = test_device();
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    enum { N = 1 << 20 };
    unsigned char *in = malloc(N), *out = malloc(N);
    test_pattern(in, N, 13);
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, N, &buf));
    CHECK_OK(mapping_launch_host(s, sleep_20ms, NULL));
    CHECK_OK(mapping_sync_to_gpu_range(s, in, buf, 0, N));
    CHECK_OK(mapping_sync_to_cpu_range(s, buf, 0, out, N));
    mapping_stream_destroy(s); /* waits */
    CHECK_BYTES(out, in, N);
    mapping_free_gpu(buf);
    free(in);
    free(out);
}
