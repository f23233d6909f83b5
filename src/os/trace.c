/*
 * The trace recorder (os/trace.h): events in memory while tracing, written
 * as Chrome Trace Event JSON ({"traceEvents":[...]}) at stop or at exit.
 * Start decides under the lock (two threads starting at once: one gets
 * MAPPING_ERR_BUSY). The file is written to a temporary one beside it and
 * renamed over it, so a full disk leaves the file as it was, never a
 * truncated trace; only a path that is not a regular file (/dev/stdout, a
 * FIFO) is written in place (start_target). A forked child never writes
 * its parent's recording (fork handlers: the lock is not inherited taken).
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
    pid_t           owner; /* the process that started the recording */
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

/* Where the trace goes, decided at start (start_target) and kept until
 * stop (write_file):
 * - A path that resolves (symbolic links followed) to something other than
 *   a regular file (a FIFO, /dev/null, a terminal), or to a file under
 *   /proc or /dev (/dev/stdout redirected to a file): written in place,
 *   through a descriptor opened at start and kept, so a FIFO's reader sees
 *   one writer from start to stop, and a missing reader fails the start
 *   (ENXIO) instead of blocking. A regular file there is appended to (it
 *   is the program's own output).
 * - Otherwise (the usual case): the resolved path (a link to a file is
 *   followed, never replaced) is written through a new temporary file beside
 *   it, created exclusively with a random name, then renamed over it. */
static int target_fd = -1;   /* in place: kept from start to stop */
static char *target_path;    /* else: the resolved path the trace replaces */

static bool under_proc_or_dev(const char *real)
{
    return strncmp(real, "/proc/", 6) == 0 || strncmp(real, "/dev/", 5) == 0;
}

/* A new temporary file beside path: O_EXCL with a random name, a regular
 * file of ours; NULL with errno set. */
static FILE *create_temporary(const char *path, char *tmp, size_t len)
{
    for (int attempt = 0; attempt < 16; attempt++) {
        uint64_t r = mapping_os_now_ns() ^ ((uint64_t)getpid() << 32) ^ ((uint64_t)(uintptr_t)tmp * 0x9e3779b97f4a7c15u);
        r ^= r >> 29;
        r *= 0xbf58476d1ce4e5b9u;
        r ^= r >> 32;
        int n = snprintf(tmp, len, "%s.%ld.%016" PRIx64 ".tmp", path, (long)getpid(), r + (uint64_t)attempt);
        if (n <= 0 || (size_t)n >= len) {
            errno = ENAMETOOLONG;
            return NULL;
        }
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd < 0 && errno == EEXIST)
            continue;
        if (fd < 0)
            return NULL;
        FILE *f = fdopen(fd, "w");
        if (!f) {
            int e = errno;
            close(fd);
            unlink(tmp);
            errno = e;
        }
        return f;
    }
    errno = EEXIST;
    return NULL;
}

/* Decides where the trace goes (above) and checks it can be written there:
 * 0 or an errno. Lock held. */
static int start_target(const char *path)
{
    char *real = realpath(path, NULL);
    struct stat st;
    if (real && stat(real, &st) == 0 && (!S_ISREG(st.st_mode) || under_proc_or_dev(real))) {
        int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC | (S_ISREG(st.st_mode) ? O_APPEND : 0));
        int err = fd < 0 ? errno : 0;
        free(real);
        if (fd < 0)
            return err; /* ENXIO: a FIFO with no reader */
        int fl = fcntl(fd, F_GETFL);
        if (fl != -1)
            fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
        target_fd = fd;
        return 0;
    }
    /* A regular file (or none yet: its directory's real path plus the name). */
    if (!real) {
        const char *slash = strrchr(path, '/');
        size_t dir_len = slash ? (size_t)(slash - path + (slash == path)) : 1;
        char *dir = mapping_os_malloc(dir_len + 1);
        if (dir) {
            memcpy(dir, slash ? path : ".", dir_len);
            dir[dir_len] = '\0';
        }
        char *rdir = dir ? realpath(dir, NULL) : NULL;
        free(dir);
        if (!rdir)
            return errno ? errno : ENOENT;
        const char *name = slash ? slash + 1 : path;
        size_t len = strlen(rdir) + 1 + strlen(name) + 1;
        real = mapping_os_malloc(len);
        if (real)
            snprintf(real, len, "%s/%s", strcmp(rdir, "/") ? rdir : "", name);
        free(rdir);
        if (!real)
            return ENOMEM;
    }
    char tmp[4200];
    FILE *f = create_temporary(real, tmp, sizeof tmp);
    if (!f) {
        int err = errno ? errno : EIO;
        free(real);
        return err;
    }
    fclose(f);
    unlink(tmp);
    target_path = real;
    return 0;
}

static void target_forget(void)
{
    if (target_fd >= 0)
        close(target_fd);
    target_fd = -1;
    free(target_path);
    target_path = NULL;
}

/* Writes the trace where start_target decided: 0, or the errno of the
 * first failure (a replaced file is then left as it was). Lock held. */
static int write_file(void)
{
    char tmp[4200];
    bool in_place = target_fd >= 0;
    FILE *f = NULL;
    if (in_place) {
        f = fdopen(target_fd, "w");
        if (f)
            target_fd = -1; /* closed by fclose */
    } else if (target_path) {
        f = create_temporary(target_path, tmp, sizeof tmp);
    } else {
        errno = EINVAL;
    }
    if (!f)
        return errno ? errno : EIO;
    errno = 0;
    put_trace(f);
    int err = fflush(f) != 0 || ferror(f) ? (errno ? errno : EIO) : 0;
    errno = 0;
    if (fclose(f) != 0 && !err)
        err = errno ? errno : EIO;
    if (!in_place && !err && rename(tmp, target_path) != 0)
        err = errno ? errno : EIO;
    if (!in_place && err)
        unlink(tmp);
    return err;
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

/* fork(): the lock is held across it (a child never inherits it taken by a
 * thread it does not have); the child records nothing of its own and
 * leaves the parent's recording to the parent. */
static void lock_for_fork(void)
{
    pthread_mutex_lock(&trace.lock);
}

static void unlock_in_parent(void)
{
    pthread_mutex_unlock(&trace.lock);
}

static void unlock_in_child(void)
{
    atomic_store_explicit(&mapping__trace_active, false, memory_order_relaxed);
    reset_locked();
    target_forget(); /* the child's copies of the descriptor and path */
    pthread_mutex_unlock(&trace.lock);
}

static void register_stop_at_exit(void)
{
    atexit(stop_at_exit);
    (void)pthread_atfork(lock_for_fork, unlock_in_parent, unlock_in_child); /* without: trace.owner still guards */
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
    target_forget();
    int err = start_target(path); /* fail now, not when the trace is written */
    if (err) {
        pthread_mutex_unlock(&trace.lock);
        free(copy);
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: cannot create a file at %s: %s", fn, path,
                             err == ENXIO ? "a FIFO with no reader (start the reader first)" : strerror(err));
    }
    free(trace.path);
    trace.path = copy;
    reset_locked();
    trace.owner = getpid();
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
    /* A forked child inherits the recording: it is the parent's to write. */
    int err = was && trace.path && trace.owner == getpid() ? write_file() : 0;
    target_forget();
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
static char environment_why[160];

static void start_from_environment(void)
{
    const char *path = getenv("MAPPING_TRACE");
    if (path && *path && mapping__trace_start("MAPPING_TRACE", path) != MAPPING_OK) {
        environment_failed = true;
        const char *m = mapping_last_error_message(), *why = strrchr(m, ':'); /* "...: <strerror>" */
        snprintf(environment_why, sizeof environment_why, "%s", why ? why + 2 : m);
    }
}

mapping_status mapping__trace_from_environment(const char *fn)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, start_from_environment);
    if (__builtin_expect(environment_failed, 0))
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: MAPPING_TRACE=%s: cannot create the trace file: %s", fn,
                             getenv("MAPPING_TRACE") ? getenv("MAPPING_TRACE") : "", environment_why);
    return MAPPING_OK;
}
