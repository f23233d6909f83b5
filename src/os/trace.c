/*
 * The trace recorder (os/trace.h): events in memory while tracing, written
 * as Chrome Trace Event JSON ({"traceEvents":[...]}) at stop or at exit.
 * Start decides under the lock (two threads starting at once: one gets
 * MAPPING_ERR_BUSY). The file is written to a temporary one beside it and
 * renamed over it, so a full disk leaves the file as it was, never a
 * truncated trace; only a path that is not a regular file (/dev/stdout, a
 * FIFO) is written in place.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "os/json.h"
#include "os/os.h"
#include "os/trace.h"

_Atomic bool mapping__trace_active;

enum { MAX_PROCESSES = 64, MAX_TRACKS = 256, NAME_BYTES = 160 };

typedef struct trace_event {
    mapping_trace_record record;
    uint64_t             ts_ns, dur_ns;
    uint32_t             pid, tid;
    char                 phase; /* 'X' complete, 'i' instant */
} trace_event;

typedef struct trace_process {
    const void *key;
    char        name[NAME_BYTES];
} trace_process;

typedef struct trace_track {
    const void *key;
    uint32_t    pid, tid;
} trace_track;

static struct {
    pthread_mutex_t lock;
    char           *path;
    uint64_t        origin_ns;
    trace_event    *events;
    size_t          count, capacity;
    trace_process   processes[MAX_PROCESSES];
    uint32_t        n_processes;
    trace_track     tracks[MAX_TRACKS];
    uint32_t        n_tracks;
} trace = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* pid of a device, 1-based; named on first sight. Lock held. */
static uint32_t process_of(const void *device, const char *name)
{
    for (uint32_t i = 0; i < trace.n_processes; i++)
        if (trace.processes[i].key == device)
            return i + 1;
    if (trace.n_processes == MAX_PROCESSES)
        return MAX_PROCESSES; /* the last one takes the rest */
    trace_process *p = &trace.processes[trace.n_processes++];
    p->key = device;
    snprintf(p->name, sizeof p->name, "mapping device %u: %s", trace.n_processes, name ? name : "?");
    return trace.n_processes;
}

/* tid of a stream within its device: 0 = blocking calls. Lock held. */
static uint32_t track_of(uint32_t pid, const void *stream)
{
    if (!stream)
        return 0;
    uint32_t streams = 0;
    for (uint32_t i = 0; i < trace.n_tracks; i++) {
        if (trace.tracks[i].key == stream && trace.tracks[i].pid == pid)
            return trace.tracks[i].tid;
        streams += trace.tracks[i].pid == pid;
    }
    if (trace.n_tracks == MAX_TRACKS)
        return MAX_TRACKS;
    trace.tracks[trace.n_tracks++] = (trace_track){stream, pid, streams + 1};
    return streams + 1;
}

static void append(char phase, uint64_t t0, uint64_t t1, const mapping_trace_record *record)
{
    pthread_mutex_lock(&trace.lock);
    if (!atomic_load_explicit(&mapping__trace_active, memory_order_relaxed)) {
        pthread_mutex_unlock(&trace.lock);
        return;
    }
    if (trace.count == trace.capacity) {
        size_t cap = trace.capacity ? 2 * trace.capacity : 1024;
        trace_event *v = mapping_os_realloc(trace.events, cap * sizeof *v);
        if (!v) { /* out of memory: this event is lost, tracing goes on */
            pthread_mutex_unlock(&trace.lock);
            return;
        }
        trace.events = v;
        trace.capacity = cap;
    }
    trace_event *e = &trace.events[trace.count++];
    e->record = *record;
    e->phase = phase;
    e->ts_ns = t0 > trace.origin_ns ? t0 - trace.origin_ns : 0;
    e->dur_ns = t1 > t0 ? t1 - t0 : 0;
    e->pid = process_of(record->device, record->device_name);
    e->tid = track_of(e->pid, record->stream);
    e->record.device_name = NULL; /* copied into the process's name */
    pthread_mutex_unlock(&trace.lock);
}

void mapping__trace_record(const mapping_trace_span *span, const mapping_trace_record *record)
{
    append('X', span->t0, mapping_os_now_ns(), record);
}

void mapping__trace_instant(const mapping_trace_record *record)
{
    if (atomic_load_explicit(&mapping__trace_active, memory_order_relaxed)) {
        uint64_t now = mapping_os_now_ns();
        append('i', now, now, record);
    }
}

/* ---- writing ---- */

static void put_string(FILE *f, const char *s)
{
    mapping_json_fputs(s, f);
}

static void put_event(FILE *f, const trace_event *e)
{
    const mapping_trace_record *r = &e->record;
    fprintf(f, ",\n{\"name\":");
    put_string(f, r->name ? r->name : "?");
    fprintf(f, ",\"cat\":");
    put_string(f, r->cat ? r->cat : "mapping");
    fprintf(f, ",\"ph\":\"%c\",\"ts\":%" PRIu64 ".%03u", e->phase, e->ts_ns / 1000, (unsigned)(e->ts_ns % 1000));
    if (e->phase == 'X')
        fprintf(f, ",\"dur\":%" PRIu64 ".%03u", e->dur_ns / 1000, (unsigned)(e->dur_ns % 1000));
    else
        fprintf(f, ",\"s\":\"t\"");
    fprintf(f, ",\"pid\":%" PRIu32 ",\"tid\":%" PRIu32 ",\"args\":{", e->pid, e->tid);
    const char *sep = "";
    if (r->direction) {
        fprintf(f, "\"direction\":\"%s\"", r->direction);
        sep = ",";
    }
    if (r->buffer) {
        fprintf(f, "%s\"buffer\":\"%p\"", sep, r->buffer);
        sep = ",";
    }
    if (r->status != MAPPING_OK) {
        fprintf(f, "%s\"error\":\"%s\"", sep, mapping_status_name(r->status));
        sep = ",";
    }
    for (int i = 0; i < MAPPING_TRACE_MAX_ARGS && r->args[i].key; i++, sep = ",")
        fprintf(f, "%s\"%s\":%" PRIu64, sep, r->args[i].key, r->args[i].value);
    fprintf(f, "}}");
}

/* Names the processes and tracks, then every event in recording order. */
static void put_trace(FILE *f)
{
    fprintf(f, "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"library\":\"mapping %s\"},\"traceEvents\":[\n",
            mapping_version());
    fprintf(f, "{\"name\":\"trace start\",\"ph\":\"i\",\"s\":\"g\",\"ts\":0,\"pid\":0,\"tid\":0}");
    for (uint32_t i = 0; i < trace.n_processes; i++) {
        fprintf(f, ",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%" PRIu32 ",\"tid\":0,\"args\":{\"name\":",
                i + 1);
        put_string(f, trace.processes[i].name);
        fprintf(f, "}}");
        fprintf(f,
                ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%" PRIu32
                ",\"tid\":0,\"args\":{\"name\":\"blocking calls\"}}",
                i + 1);
    }
    for (uint32_t i = 0; i < trace.n_tracks; i++)
        fprintf(f,
                ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%" PRIu32 ",\"tid\":%" PRIu32
                ",\"args\":{\"name\":\"stream %" PRIu32 "\"}}",
                trace.tracks[i].pid, trace.tracks[i].tid, trace.tracks[i].tid);
    for (size_t i = 0; i < trace.count; i++)
        put_event(f, &trace.events[i]);
    fprintf(f, "\n]}\n");
}

/* Whether path names something other than a regular file (a device, a
 * FIFO): written in place, since renaming over it would replace it. */
static bool written_in_place(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && !S_ISREG(st.st_mode);
}

/* The temporary file beside path, created (mode 0666 less the umask); NULL
 * with errno set. */
static FILE *create_temporary(const char *path, char *tmp, size_t len)
{
    int n = snprintf(tmp, len, "%s.%ld.tmp", path, (long)getpid());
    if (n <= 0 || (size_t)n >= len) {
        errno = ENAMETOOLONG;
        return NULL;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0666);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (fd >= 0 && !f) {
        int e = errno;
        close(fd);
        unlink(tmp);
        errno = e;
    }
    return f;
}

/* Writes the trace to path: 0, or the errno of the first failure (the file
 * at path is then left as it was, unless it is written in place). */
static int write_file(const char *path)
{
    char tmp[4200];
    bool in_place = written_in_place(path);
    FILE *f = in_place ? fopen(path, "w") : create_temporary(path, tmp, sizeof tmp);
    if (!f)
        return errno ? errno : EIO;
    errno = 0;
    put_trace(f);
    int err = fflush(f) != 0 || ferror(f) ? (errno ? errno : EIO) : 0;
    errno = 0;
    if (fclose(f) != 0 && !err)
        err = errno ? errno : EIO;
    if (!in_place && !err && rename(tmp, path) != 0)
        err = errno ? errno : EIO;
    if (!in_place && err)
        unlink(tmp);
    return err;
}

/* Whether a trace could be written to path: the file itself where it is
 * written in place, else a new file beside it (made and removed). */
static int check_writable(const char *path)
{
    char tmp[4200];
    FILE *f = written_in_place(path) ? fopen(path, "a") : create_temporary(path, tmp, sizeof tmp);
    if (!f)
        return errno ? errno : EIO;
    fclose(f);
    if (!written_in_place(path))
        unlink(tmp);
    return 0;
}

static void reset_locked(void)
{
    free(trace.events);
    trace.events = NULL;
    trace.count = trace.capacity = 0;
    trace.n_processes = trace.n_tracks = 0;
}

static void stop_at_exit(void)
{
    if (mapping__trace_stop() != MAPPING_OK)
        fprintf(stderr, "mapping: %s\n", mapping_last_error_message());
}

static void register_stop_at_exit(void)
{
    atexit(stop_at_exit);
}

mapping_status mapping__trace_start(const char *fn, const char *path)
{
    static pthread_once_t at_exit = PTHREAD_ONCE_INIT;
    size_t len = strlen(path) + 1;
    char *copy = mapping_os_malloc(len);
    if (!copy)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    memcpy(copy, path, len);
    pthread_mutex_lock(&trace.lock);
    if (atomic_load_explicit(&mapping__trace_active, memory_order_relaxed)) {
        pthread_mutex_unlock(&trace.lock);
        free(copy);
        return mapping__fail(MAPPING_ERR_BUSY, "%s: a trace is already being recorded (stop it first)", fn);
    }
    int err = check_writable(path); /* fail now, not when the trace is written */
    if (err) {
        pthread_mutex_unlock(&trace.lock);
        free(copy);
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: cannot create a file at %s: %s", fn, path,
                             strerror(err));
    }
    free(trace.path);
    trace.path = copy;
    reset_locked();
    trace.origin_ns = mapping_os_now_ns();
    atomic_store_explicit(&mapping__trace_active, true, memory_order_relaxed);
    pthread_mutex_unlock(&trace.lock);
    pthread_once(&at_exit, register_stop_at_exit);
    return MAPPING_OK;
}

mapping_status mapping__trace_stop(void)
{
    pthread_mutex_lock(&trace.lock);
    bool was = atomic_exchange_explicit(&mapping__trace_active, false, memory_order_relaxed);
    int err = was && trace.path ? write_file(trace.path) : 0;
    char path[256];
    snprintf(path, sizeof path, "%s", trace.path ? trace.path : "");
    reset_locked();
    pthread_mutex_unlock(&trace.lock);
    if (err)
        return mapping__fail(MAPPING_ERR_IO, "mapping_trace_stop: cannot write the trace to %s: %s (errno %d)", path,
                             strerror(err), err);
    return MAPPING_OK;
}

static bool environment_failed;

static void start_from_environment(void)
{
    const char *path = getenv("MAPPING_TRACE");
    if (path && *path && mapping__trace_start("MAPPING_TRACE", path) != MAPPING_OK)
        environment_failed = true;
}

mapping_status mapping__trace_from_environment(const char *fn)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, start_from_environment);
    if (__builtin_expect(environment_failed, 0))
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: MAPPING_TRACE=%s: cannot create the trace file", fn,
                             getenv("MAPPING_TRACE") ? getenv("MAPPING_TRACE") : "");
    return MAPPING_OK;
}
