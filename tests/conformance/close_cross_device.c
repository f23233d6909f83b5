/* mapping_close(A) while another device's stream holds work that reads A's
 * memory (a peer copy, a multimirror sync): close waits for that work, or,
 * called from a host function that such work waits behind, refuses with
 * MAPPING_ERR_BUSY. CTest runs these with MAPPING_HOST_DEVICES=2 and
 * POCL_DEVICES="pthread pthread"; with one device, the second is another
 * object of device 0, which works the same way. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "harness.h"

enum { N = 3u << 20 }; /* large enough that malloc gives it back to the system on free */

/* Device 1 of the test's back end where there is one, else another object
 * of device 0: closed by the test itself. */
static mapping_device *other_device(void)
{
    int count = 0;
    CHECK_OK(mapping_list_devices(test_backend(), NULL, 0, &count));
    mapping_device_desc desc = {.backend = test_backend(), .device = count > 1 ? 1 : 0};
    mapping_device *dev = NULL;
    CHECK_OK(mapping_open(&desc, &dev));
    return dev;
}

static void *open_gate_later(void *gate)
{
    struct timespec t = {0, 200 * 1000 * 1000}; /* long enough for close to have started */
    nanosleep(&t, NULL);
    test_gate_open(gate);
    return NULL;
}

static mapping_buffer *buffer_with_pattern(mapping_device *dev, unsigned seed, unsigned char *pattern)
{
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, N, &buf));
    test_pattern(pattern, N, seed);
    CHECK_OK(mapping_sync_to_gpu(pattern, buf));
    return buf;
}

static void check_buffer_holds(mapping_buffer *buf, const unsigned char *expected)
{
    unsigned char *back = malloc(N);
    CHECK(back);
    CHECK_OK(mapping_sync_to_cpu(buf, back));
    CHECK_BYTES(back, expected, N);
    free(back);
}

TEST(close_waits_for_a_peer_copy_queued_on_another_device_that_reads_its_memory)
{
    mapping_device *b = test_device(), *a = other_device();
    unsigned char *pattern = malloc(N);
    CHECK(pattern);
    mapping_buffer *src = buffer_with_pattern(a, 24, pattern), *dst;
    CHECK_OK(mapping_allocate_gpu(b, N, &dst));
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(b, &s));
    test_gate gate = TEST_GATE_INIT;
    CHECK_OK(mapping_launch_host(s, test_gate_wait, &gate));
    CHECK_OK(mapping_copy_peer(s, src, 0, dst, 0, N)); /* queued behind the gate: reads a's memory later */
    pthread_t opener;
    CHECK(pthread_create(&opener, NULL, open_gate_later, &gate) == 0);
    mapping_close(a); /* frees src: only after the copy has read it */
    CHECK(test_gate_passed(&gate) == 1);
    CHECK(mapping_last_error() == MAPPING_OK);
    CHECK(pthread_join(opener, NULL) == 0);
    CHECK_OK(mapping_stream_synchronize(s));
    check_buffer_holds(dst, pattern);
    mapping_stream_destroy(s);
    mapping_free_gpu(dst);
    free(pattern);
}

TEST(close_waits_for_a_multimirror_sync_on_a_slow_link_that_reads_its_replica)
{
    /* Replica 1's device has a modelled link of 100 MB/s: a 32 MiB write
     * queued on its stream before the sync takes ~0.3 s, so the sync's peer
     * copy from replica 0 is still queued when device 0 is closed. */
    if (strcmp(test_backend(), "host") != 0)
        test_skip("the link model is the host back end's");
    int count = 0;
    CHECK_OK(mapping_list_devices("host", NULL, 0, &count));
    mapping_device_desc slow = {.backend = "host", .device = count > 1 ? 1 : 0, .link_bandwidth = 1e8};
    mapping_device *devs[2] = {other_device(), NULL};
    CHECK_OK(mapping_open(&slow, &devs[1]));
    mapping_multimirror *m;
    CHECK_OK(mapping_multimirror_create(devs, 2, N, &m));
    enum { SLOW_BYTES = 32u << 20 };
    unsigned char *pattern = malloc(N), *zeros = calloc(1, SLOW_BYTES);
    CHECK(pattern && zeros);
    /* Replica 0 alone holds the data: the sync to replica 1 copies from it. */
    test_pattern(pattern, N, 7);
    CHECK_OK(mapping_sync_to_gpu(pattern, mapping_multimirror_gpu(m, 0)));
    CHECK_OK(mapping_multimirror_mark_gpu_modified(m, 0, 0, N));

    mapping_stream *s;
    mapping_buffer *busy;
    mapping_event *after_write;
    CHECK_OK(mapping_stream_create(devs[1], &s));
    CHECK_OK(mapping_allocate_gpu(devs[1], SLOW_BYTES, &busy));
    CHECK_OK(mapping_sync_to_gpu_range(s, zeros, busy, 0, SLOW_BYTES));
    CHECK_OK(mapping_event_record(s, &after_write));
    CHECK_OK(mapping_multimirror_sync_to_gpu(s, m, 1));
    CHECK_STATUS(mapping_event_query(after_write), MAPPING_ERR_NOT_READY); /* really in flight */
    mapping_close(devs[0]);
    /* Close returned after the peer copy, so after the write before it. */
    CHECK_OK(mapping_event_query(after_write));
    CHECK_OK(mapping_stream_synchronize(s));
    check_buffer_holds(mapping_multimirror_gpu(m, 1), pattern);
    mapping_multimirror_destroy(m); /* device 0 was closed first: refused, its host memory freed */
    CHECK(mapping_last_error() == MAPPING_ERR_INVALID_HANDLE);
    mapping_event_destroy(after_write);
    mapping_stream_destroy(s);
    mapping_free_gpu(busy);
    mapping_close(devs[1]);
    free(pattern);
    free(zeros);
}

TEST(close_waits_for_a_multimirror_sync_queued_behind_a_gate_that_reads_its_replica)
{
    mapping_device *devs[2] = {NULL, test_device()};
    devs[0] = other_device();
    mapping_multimirror *m;
    CHECK_OK(mapping_multimirror_create(devs, 2, N, &m));
    unsigned char *pattern = malloc(N);
    CHECK(pattern);
    /* A first sync from replica 0 measures the peer link (allocating: on
     * CUDA that waits for every stream, so never behind the gate). */
    for (int round = 0; round < 2; round++) {
        test_pattern(pattern, N, 19 + (unsigned)round);
        CHECK_OK(mapping_sync_to_gpu(pattern, mapping_multimirror_gpu(m, 0)));
        CHECK_OK(mapping_multimirror_mark_gpu_modified(m, 0, 0, N));
        if (round == 0)
            CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 1));
    }
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(devs[1], &s));
    test_gate gate = TEST_GATE_INIT;
    CHECK_OK(mapping_launch_host(s, test_gate_wait, &gate));
    CHECK_OK(mapping_multimirror_sync_to_gpu(s, m, 1)); /* a peer copy from replica 0, behind the gate */
    pthread_t opener;
    CHECK(pthread_create(&opener, NULL, open_gate_later, &gate) == 0);
    mapping_close(devs[0]);
    CHECK(test_gate_passed(&gate) == 1);
    CHECK(pthread_join(opener, NULL) == 0);
    CHECK_OK(mapping_stream_synchronize(s));
    check_buffer_holds(mapping_multimirror_gpu(m, 1), pattern);
    mapping_multimirror_destroy(m);
    CHECK(mapping_last_error() == MAPPING_ERR_INVALID_HANDLE);
    mapping_stream_destroy(s);
    free(pattern);
}

typedef struct closer {
    mapping_device *dev;
    mapping_status  status; /* mapping_last_error after the close, on the stream's thread */
    int             ran;
} closer;

static void close_from_host_function(void *arg)
{
    closer *c = arg;
    mapping_clear_last_error();
    mapping_close(c->dev);
    c->status = mapping_last_error();
    c->ran = 1;
}

TEST(close_from_a_host_function_that_a_copy_from_the_device_waits_behind_is_refused_busy)
{
    mapping_device *b = test_device(), *a = other_device();
    if (strcmp(test_backend(), "cuda") == 0) {
        mapping_close(a);
        test_skip("CUDA host functions must not call the library (mapping_launch_host)");
    }
    unsigned char *pattern = malloc(N);
    CHECK(pattern);
    mapping_buffer *src = buffer_with_pattern(a, 3, pattern), *dst;
    CHECK_OK(mapping_allocate_gpu(b, N, &dst));
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(b, &s));
    test_gate gate = TEST_GATE_INIT;
    closer c = {a, MAPPING_OK, 0};
    CHECK_OK(mapping_launch_host(s, test_gate_wait, &gate));
    CHECK_OK(mapping_launch_host(s, close_from_host_function, &c));
    CHECK_OK(mapping_copy_peer(s, src, 0, dst, 0, N)); /* after the function: close would wait for itself */
    test_gate_open(&gate);
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK(c.ran == 1);
    CHECK(c.status == MAPPING_ERR_BUSY);
    check_buffer_holds(dst, pattern); /* a is open: the copy read live memory */
    mapping_device_info info;
    CHECK_OK(mapping_device_get_info(a, &info));

    /* With the copy before the function, the close goes ahead there. */
    closer later = {a, MAPPING_ERR_INTERNAL, 0};
    CHECK_OK(mapping_copy_peer(s, src, 0, dst, 0, N));
    CHECK_OK(mapping_launch_host(s, close_from_host_function, &later));
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK(later.ran == 1);
    CHECK(later.status == MAPPING_OK);
    CHECK_STATUS(mapping_device_get_info(a, &info), MAPPING_ERR_INVALID_HANDLE);
    mapping_stream_destroy(s);
    mapping_free_gpu(dst);
    free(pattern);
}

TEST(closing_the_copying_device_first_leaves_nothing_for_the_other_close_to_wait_for)
{
    /* b's stream reads a; b closes first (its streams finish), then a. */
    test_device(); /* SKIP where the back end is absent */
    mapping_device *a = other_device(), *b = NULL;
    mapping_device_desc desc = {.backend = test_backend()};
    CHECK_OK(mapping_open(&desc, &b));
    unsigned char *pattern = malloc(N);
    CHECK(pattern);
    mapping_buffer *src = buffer_with_pattern(a, 11, pattern), *dst;
    CHECK_OK(mapping_allocate_gpu(b, N, &dst));
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(b, &s));
    for (int i = 0; i < 3; i++) /* one fence per stream and device read, replaced */
        CHECK_OK(mapping_copy_peer(s, src, 0, dst, 0, N));
    mapping_close(b); /* destroys s after its work */
    mapping_clear_last_error();
    mapping_close(a);
    CHECK(mapping_last_error() == MAPPING_OK);
    free(pattern);
}

typedef struct enqueuer {
    mapping_stream *stream;
    mapping_buffer *src, *dst;
} enqueuer;

static void *enqueue_copy(void *arg)
{
    enqueuer *e = arg;
    CHECK_OK(mapping_copy_peer(e->stream, e->src, 0, e->dst, 0, N));
    return NULL;
}

TEST(close_waits_for_peer_copies_that_two_threads_queued_on_one_stream)
{
    mapping_device *b = test_device(), *a = other_device();
    unsigned char *pattern = malloc(N);
    CHECK(pattern);
    mapping_buffer *src = buffer_with_pattern(a, 5, pattern), *dst[2];
    CHECK_OK(mapping_allocate_gpu(b, N, &dst[0]));
    CHECK_OK(mapping_allocate_gpu(b, N, &dst[1]));
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(b, &s));
    test_gate gate = TEST_GATE_INIT;
    CHECK_OK(mapping_launch_host(s, test_gate_wait, &gate));
    CHECK_OK(mapping_copy_peer(s, src, 0, dst[0], 0, N));
    enqueuer e = {s, src, dst[1]};
    pthread_t other, opener;
    CHECK(pthread_create(&other, NULL, enqueue_copy, &e) == 0);
    CHECK(pthread_join(other, NULL) == 0); /* its copy is queued after the first */
    CHECK(pthread_create(&opener, NULL, open_gate_later, &gate) == 0);
    mapping_close(a);
    CHECK(test_gate_passed(&gate) == 1);
    CHECK(pthread_join(opener, NULL) == 0);
    CHECK_OK(mapping_stream_synchronize(s));
    check_buffer_holds(dst[0], pattern);
    check_buffer_holds(dst[1], pattern);
    mapping_stream_destroy(s);
    mapping_free_gpu(dst[0]);
    mapping_free_gpu(dst[1]);
    free(pattern);
}

static void *open_two_gates_later(void *arg)
{
    test_gate **gates = arg;
    struct timespec t = {0, 100 * 1000 * 1000};
    nanosleep(&t, NULL);
    test_gate_open(gates[0]);
    nanosleep(&t, NULL);
    test_gate_open(gates[1]);
    return NULL;
}

TEST(close_waits_for_the_last_of_many_peer_copies_queued_while_the_first_was_pending)
{
    /* gate 1, copy 1, gate 2, copy 2: copy 2 is queued while copy 1's
     * fence is pending; close must wait past gate 2 as well. */
    mapping_device *b = test_device(), *a = other_device();
    unsigned char *pattern = malloc(N);
    CHECK(pattern);
    mapping_buffer *src = buffer_with_pattern(a, 9, pattern), *dst[2];
    CHECK_OK(mapping_allocate_gpu(b, N, &dst[0]));
    CHECK_OK(mapping_allocate_gpu(b, N, &dst[1]));
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(b, &s));
    test_gate gate1 = TEST_GATE_INIT, gate2 = TEST_GATE_INIT;
    test_gate *gates[2] = {&gate1, &gate2};
    CHECK_OK(mapping_launch_host(s, test_gate_wait, &gate1));
    CHECK_OK(mapping_copy_peer(s, src, 0, dst[0], 0, N));
    CHECK_OK(mapping_launch_host(s, test_gate_wait, &gate2));
    for (int i = 0; i < 10; i++)
        CHECK_OK(mapping_copy_peer(s, src, 0, dst[1], 0, N));
    pthread_t opener;
    CHECK(pthread_create(&opener, NULL, open_two_gates_later, gates) == 0);
    mapping_close(a);
    CHECK(test_gate_passed(&gate2) == 1);
    CHECK(pthread_join(opener, NULL) == 0);
    CHECK_OK(mapping_stream_synchronize(s));
    check_buffer_holds(dst[0], pattern);
    check_buffer_holds(dst[1], pattern);
    mapping_stream_destroy(s);
    mapping_free_gpu(dst[0]);
    mapping_free_gpu(dst[1]);
    free(pattern);
}

/* After one of its devices is closed, a multimirror's getters give NULL for
 * what that device took with it (the CPU array is device 0's page-locked
 * memory; replica j's buffer is device j's): a pointer to them would be a
 * use after free. Replicas of open devices stay reachable. A batch of a
 * closed device counts 0 copies. */
TEST(multimirror_and_batch_getters_give_nothing_once_a_device_is_closed)
{
    mapping_device *kept = test_device(); /* first: skips where the back end is absent */
    mapping_device *devs[2] = {other_device(), kept};
    mapping_multimirror *mm;
    CHECK_OK(mapping_multimirror_create(devs, 2, 4096, &mm));
    CHECK(mapping_multimirror_size(mm) == 4096 && mapping_multimirror_cpu(mm) && mapping_multimirror_gpu(mm, 1));
    CHECK(mapping_multimirror_gpu(mm, 2) == NULL);
    mapping_batch *b;
    mapping_buffer *buf;
    static unsigned char host[64];
    CHECK_OK(mapping_batch_create(devs[0], &b));
    CHECK_OK(mapping_allocate_gpu(devs[0], 64, &buf));
    CHECK_OK(mapping_batch_add_to_gpu(b, host, buf, 0, 64));
    CHECK(mapping_batch_count(b) == 1);
    mapping_close(devs[0]);
    CHECK(mapping_multimirror_cpu(mm) == NULL);
    CHECK(strstr(mapping_last_error_message(), "closed") != NULL);
    CHECK(mapping_multimirror_gpu(mm, 0) == NULL && mapping_multimirror_gpu(mm, 1) != NULL);
    CHECK(mapping_batch_count(b) == 0);
    mapping_multimirror_destroy(mm);
    mapping_batch_destroy(b);
}

/* Calls that wait for their stream, made from a host function running on
 * that stream: a device-diff mirror's sync to the CPU reads in full instead
 * of waiting for the comparison (it used to wait for itself forever), and a
 * peer copy between back ends (staged: it waits) is refused BUSY. */
static mapping_mirror *self_mirror;
static mapping_stream *self_stream;
static mapping_status self_status;

static void diff_sync_on_own_stream(void *user)
{
    (void)user;
    self_status = mapping_mirror_sync_to_cpu(self_stream, self_mirror);
}

TEST(a_diff_mirror_synced_from_a_host_function_on_its_own_stream_reads_in_full)
{
    if (strcmp(test_backend(), "cuda") == 0)
        test_skip("CUDA host functions must not call the library (mapping_launch_host)");
    char *saved = getenv("MAPPING_DEVICE_DIFF") ? strdup(getenv("MAPPING_DEVICE_DIFF")) : NULL;
    setenv("MAPPING_DEVICE_DIFF", "on", 1);
    mapping_device *dev = test_device();
    size_t n = 1 << 20;
    CHECK_OK(mapping_stream_create(dev, &self_stream));
    CHECK_OK(mapping_mirror_create(dev, n, MAPPING_MIRROR_DEVICE_DIFF, &self_mirror));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, self_mirror));
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, self_mirror));
    CHECK_OK(mapping_fill_gpu(NULL, mapping_mirror_gpu(self_mirror), mapping_mirror_gpu_offset(self_mirror) + 4096, 100,
                              7));
    CHECK_OK(mapping_mirror_mark_gpu_modified(self_mirror, 0, n));
    self_status = MAPPING_ERR_NOT_READY;
    CHECK_OK(mapping_launch_host(self_stream, diff_sync_on_own_stream, NULL));
    CHECK_OK(mapping_stream_synchronize(self_stream)); /* the host function has run... */
    CHECK_OK(mapping_stream_synchronize(self_stream)); /* ...and what it queued too */
    CHECK_OK(self_status);
    unsigned char *cpu = mapping_mirror_cpu(self_mirror);
    CHECK(cpu[4096] == 7 && cpu[4096 + 99] == 7 && cpu[4096 + 100] == 0);
    mapping_mirror_destroy(self_mirror);
    mapping_stream_destroy(self_stream);
    if (saved) {
        setenv("MAPPING_DEVICE_DIFF", saved, 1);
        free(saved);
    } else {
        unsetenv("MAPPING_DEVICE_DIFF");
    }
}

static mapping_buffer *peer_src, *peer_dst;

static void peer_copy_on_own_stream(void *user)
{
    (void)user;
    self_status = mapping_copy_peer(self_stream, peer_src, 0, peer_dst, 0, 4096);
}

TEST(a_staged_peer_copy_from_a_host_function_on_its_own_stream_is_refused_busy)
{
    mapping_device_desc hd = {.backend = "host"}, od = {.backend = "opencl"};
    mapping_device *h, *o;
    CHECK_OK(mapping_open(&hd, &h));
    if (mapping_open(&od, &o) != MAPPING_OK) {
        mapping_close(h);
        test_skip("a copy between back ends needs OpenCL too: %s", mapping_last_error_message());
    }
    CHECK_OK(mapping_stream_create(h, &self_stream));
    CHECK_OK(mapping_allocate_gpu(o, 4096, &peer_src));
    CHECK_OK(mapping_allocate_gpu(h, 4096, &peer_dst));
    self_status = MAPPING_OK;
    CHECK_OK(mapping_launch_host(self_stream, peer_copy_on_own_stream, NULL));
    CHECK_OK(mapping_stream_synchronize(self_stream));
    CHECK(self_status == MAPPING_ERR_BUSY);
    CHECK_OK(mapping_copy_peer(self_stream, peer_src, 0, peer_dst, 0, 4096)); /* from the program's thread: fine */
    CHECK_OK(mapping_stream_synchronize(self_stream));
    mapping_free_gpu(peer_src);
    mapping_free_gpu(peer_dst);
    mapping_stream_destroy(self_stream);
    mapping_close(o);
    mapping_close(h);
}
