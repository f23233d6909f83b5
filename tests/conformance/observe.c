/* Seeing what the library did: the trace start/stop API, info-level log
 * lines for syncs and flushes, and the MAPPING_CHECK=unmarked debug mode. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
#include "harness.h"

static size_t file_size(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n > 0 ? (size_t)n : 0;
}

static char *read_file(const char *path)
{
    size_t n = file_size(path);
    FILE *f = fopen(path, "rb");
    char *text = calloc(1, n + 1);
    if (f && text && fread(text, 1, n, f) != n)
        text[0] = '\0';
    if (f)
        fclose(f);
    return text;
}

TEST(trace_start_and_stop_write_a_chrome_trace_of_the_transfers)
{
    mapping_device *dev = test_device();
    char path[64];
    snprintf(path, sizeof path, "/tmp/mapping_trace_test_%d.json", (int)getpid());
    CHECK(!mapping_trace_active());
    CHECK_OK(mapping_trace_start(path));
    CHECK(mapping_trace_active());
    CHECK_REFUSED(mapping_trace_start(path), MAPPING_ERR_BUSY);
    mapping_buffer *buf;
    char host[256] = {1};
    CHECK_OK(mapping_allocate_gpu(dev, sizeof host, &buf));
    CHECK_OK(mapping_sync_to_gpu_range(NULL, host, buf, 0, 100));
    CHECK_OK(mapping_sync_to_cpu_range(NULL, buf, 0, host, 40));
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    CHECK_OK(mapping_fill_gpu(s, buf, 0, 64, 7));
    CHECK_OK(mapping_stream_synchronize(s));
    mapping_stream_destroy(s);
    mapping_free_gpu(buf);
    CHECK_OK(mapping_trace_stop());
    CHECK(!mapping_trace_active());
    CHECK_OK(mapping_trace_stop()); /* not tracing: nothing to do */
    char *text = read_file(path);
    CHECK(text != NULL);
    CHECK(strstr(text, "\"traceEvents\":[") != NULL);
    CHECK(strstr(text, "\"name\":\"write\"") != NULL && strstr(text, "\"bytes\":100") != NULL);
    CHECK(strstr(text, "\"name\":\"read\"") != NULL && strstr(text, "\"bytes\":40") != NULL);
    CHECK(strstr(text, "\"name\":\"fill\"") != NULL && strstr(text, "\"bytes\":64") != NULL);
    CHECK(strstr(text, "\"blocking calls\"") != NULL && strstr(text, "\"stream 1\"") != NULL);
    CHECK(text[strlen(text) - 2] == '}'); /* closed: "]}\n" */
    free(text);
    remove(path);
}

TEST(trace_refuses_bad_paths)
{
    test_device();
    CHECK_REFUSED(mapping_trace_start(NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_trace_start(""), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_REFUSED(mapping_trace_start("/nonexistent-dir/x/trace.json"), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(strstr(mapping_last_error_message(), "/nonexistent-dir/x/trace.json") != NULL);
    CHECK(!mapping_trace_active());
}

typedef struct info_log {
    char lines[8][512];
    int  count;
} info_log;

static void keep_info(int level, const char *message, void *user)
{
    info_log *log = user;
    if (level == 2 && log->count < 8)
        snprintf(log->lines[log->count++], sizeof log->lines[0], "%s", message);
}

static const char *find_line(const info_log *log, const char *what)
{
    for (int i = 0; i < log->count; i++)
        if (strstr(log->lines[i], what))
            return log->lines[i];
    return NULL;
}

TEST(the_info_log_tells_each_sync_and_each_flush_plan)
{
    mapping_device *dev = test_device();
    mapping_mirror *m = test_synced_mirror(dev, 1 << 16, 0, 3);
    info_log log = {0};
    mapping_set_log(keep_info, &log);
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 100, 10));
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 5000, 20));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m)); /* clean */
    mapping_batch *b;
    char host[64] = {0};
    CHECK_OK(mapping_batch_create(dev, &b));
    CHECK_OK(mapping_batch_add_to_gpu(b, host, mapping_mirror_gpu(m), 0, 8));
    CHECK_OK(mapping_batch_add_to_gpu(b, host, mapping_mirror_gpu(m), 1000, 8));
    CHECK_OK(mapping_batch_flush(NULL, b));
    mapping_set_log(NULL, NULL);
    const char *sync = find_line(&log, "2 stale ranges");
    CHECK(sync != NULL && strstr(sync, "mirror sync to GPU") && strstr(sync, "bytes moved"));
    const char *clean = find_line(&log, "0 stale ranges");
    CHECK(clean != NULL && strstr(clean, "65536 skipped"));
    const char *flush = find_line(&log, "batch flush of 2 copies");
    CHECK(flush != NULL && strstr(flush, "groups"));
    mapping_batch_destroy(b);
    mapping_mirror_destroy(m);
}

/* The debug mode is read from the environment once, before the first sync. */
static mapping_mirror *checked_mirror(mapping_device *dev, unsigned char *data, size_t n)
{
    setenv("MAPPING_CHECK", "unmarked", 1);
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_wrap(dev, data, n, 0, &m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    return m;
}

TEST(check_unmarked_names_the_pages_written_without_a_mark)
{
    mapping_device *dev = test_device();
    enum { N = 16 * 4096 };
    unsigned char *data = calloc(1, N);
    CHECK(data != NULL);
    mapping_mirror *m = checked_mirror(dev, data, N);
    /* Marked writes are fine, on any page. */
    data[10] = 1;
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 10, 1));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    /* Written without a mark: pages 5 and 6. */
    data[5 * 4096 + 3] = 9;
    data[6 * 4096 + 4000] = 9;
    CHECK_REFUSED(mapping_mirror_sync_to_gpu(NULL, m), MAPPING_ERR_CONFLICT);
    CHECK(strstr(mapping_last_error_message(), "pages 5 to 6") != NULL);
    CHECK(strstr(mapping_last_error_message(), "bytes 20480 to 28672") != NULL);
    /* Marked now: the sync goes through and the device has the bytes. */
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 5 * 4096, 2 * 4096));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    test_check_mirror_sides_equal(m);
    /* Bytes the device wrote and a sync brought back are not a change. */
    CHECK_OK(mapping_fill_gpu(NULL, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m) + 8192, 100, 0x55));
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 8192, 100));
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    mapping_mirror_destroy(m);
    free(data);
}

/* The evidence survives syncs of other views (a check of one view must not
 * lose another's writes), and writes the kernel makes (read(2) into the
 * array) are changes too. Run with uffd (the pages written are the
 * evidence) and with MAPPING_TRACK=mprotect (every page hashed). */
TEST(check_unmarked_keeps_the_evidence_across_views_and_sees_kernel_writes)
{
    mapping_device *dev = test_device();
    enum { N = 16 * 4096 };
    unsigned char *data = aligned_alloc(4096, N);
    CHECK(data != NULL);
    memset(data, 0, N);
    mapping_mirror *m = checked_mirror(dev, data, N), *a, *b;
    CHECK_OK(mapping_mirror_view(m, 0, 8 * 4096, &a));
    CHECK_OK(mapping_mirror_view(m, 8 * 4096, 8 * 4096, &b));
    data[12 * 4096 + 1] = 7; /* in b, no mark */
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, a)); /* a is clean */
    CHECK_REFUSED(mapping_mirror_sync_to_gpu(NULL, b), MAPPING_ERR_CONFLICT);
    CHECK(strstr(mapping_last_error_message(), "pages 12 to 12") != NULL);
    CHECK_OK(mapping_mirror_mark_cpu_modified(b, 4 * 4096, 4096));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    /* The same value written again is no change. */
    data[12 * 4096 + 1] = 7;
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    /* A kernel write: read(2) from a pipe into page 3. */
    int fds[2];
    CHECK(pipe(fds) == 0);
    unsigned char four[4] = {1, 2, 3, 4};
    CHECK(write(fds[1], four, 4) == 4);
    CHECK(read(fds[0], data + 3 * 4096 + 100, 4) == 4);
    close(fds[0]);
    close(fds[1]);
    CHECK_REFUSED(mapping_mirror_sync_to_gpu(NULL, a), MAPPING_ERR_CONFLICT);
    CHECK(strstr(mapping_last_error_message(), "pages 3 to 3") != NULL);
    CHECK_OK(mapping_mirror_mark_cpu_modified(a, 3 * 4096 + 100, 4));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    test_check_mirror_sides_equal(m);
    mapping_mirror_destroy(a);
    mapping_mirror_destroy(b);
    mapping_mirror_destroy(m);
    free(data);
}

TEST(without_the_check_an_unmarked_write_is_silently_not_copied)
{
    mapping_device *dev = test_device();
    unsigned char data[4096] = {0};
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_wrap(dev, data, sizeof data, 0, &m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    data[7] = 1; /* the bug the check catches */
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    unsigned char back[4096];
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m), back, sizeof back));
    CHECK(back[7] == 0 || mapping_mirror_is_unified(m));
    mapping_mirror_destroy(m);
}

typedef struct copier {
    mapping_buffer *buf;
    mapping_stream *stream; /* NULL: blocking */
    int             failures;
} copier;

static void *copy_many(void *arg)
{
    copier *c = arg;
    char host[64] = {3};
    for (int i = 0; i < 200; i++)
        c->failures += mapping_sync_to_gpu_range(c->stream, host, c->buf, 0, sizeof host) != MAPPING_OK;
    if (c->stream)
        c->failures += mapping_stream_synchronize(c->stream) != MAPPING_OK;
    return NULL;
}

static size_t count_of(const char *text, const char *what)
{
    size_t n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

TEST(trace_records_every_event_of_concurrent_threads)
{
    mapping_device *dev = test_device();
    char path[64];
    snprintf(path, sizeof path, "/tmp/mapping_trace_threads_%d.json", (int)getpid());
    enum { THREADS = 4 };
    copier c[THREADS];
    pthread_t t[THREADS];
    mapping_buffer *bufs[THREADS];
    mapping_stream *streams[THREADS] = {NULL}; /* alive together: two streams, two tracks */
    for (int i = 0; i < THREADS; i++) {
        CHECK_OK(mapping_allocate_gpu(dev, 64, &bufs[i]));
        if (i % 2)
            CHECK_OK(mapping_stream_create(dev, &streams[i]));
        c[i] = (copier){bufs[i], streams[i], 0};
    }
    CHECK_OK(mapping_trace_start(path));
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, copy_many, &c[i]) == 0);
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK(c[i].failures == 0);
    }
    CHECK_OK(mapping_trace_stop());
    char *text = read_file(path);
    CHECK(text != NULL);
    CHECK(count_of(text, "\"name\":\"write\"") == THREADS * 200);
    CHECK(strstr(text, "\"stream 2\"") != NULL); /* two streams: two tracks */
    free(text);
    remove(path);
    for (int i = 0; i < THREADS; i++) {
        mapping_stream_destroy(streams[i]);
        mapping_free_gpu(bufs[i]);
    }
}
