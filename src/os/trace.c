/*
 * The trace recorder (os/trace.h): events in memory while tracing, written
 * as Chrome Trace Event JSON ({"traceEvents":[...]}) at stop or at exit.
 * Start decides under the lock (two threads starting at once: one gets
 * MAPPING_ERR_BUSY). The file is written to a temporary one beside it and
 * renamed over it, so a full disk leaves the file as it was, never a
 * truncated trace; only a path that is not a regular file (a FIFO) or that
 * goes through /proc (/dev/stdout) is written in place (start_target). A forked child never writes
 * its parent's recording (fork handlers: the lock is not inherited taken).
 * Memory is bounded: at most MAPPING_TRACE_MAX_EVENTS events are kept (a
 * ring: the newest replace the oldest, which are counted as dropped and
 * reported in the file's metadata and the log). The stop takes the
 * recording under the lock and writes it after (a stalled FIFO reader
 * holds up the stop only).
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

/* The most events a trace keeps in memory unless MAPPING_TRACE_MAX_EVENTS
 * says otherwise (about 224 MB of events, a JSON file of about 150 MB: as
 * much as Perfetto and chrome://tracing open comfortably). */
#define DEFAULT_MAX_EVENTS 1000000ull
/* The largest value MAPPING_TRACE_MAX_EVENTS may take (0 = no limit). */
#define LIMIT_MAX_EVENTS 1000000000000ull

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

/* What a trace holds: taken whole by the stop, which writes it without
 * the lock (a slow disk or a FIFO reader that stalls then holds up only
 * the stop, never the threads that record). */
typedef struct recording {
    trace_event  *events;      /* a ring once full: the oldest is at head */
    size_t        count, capacity, head;
    size_t        max_events;  /* 0: no limit */
    uint64_t      dropped;     /* the oldest, replaced once full */
    uint64_t      lost;        /* no memory to grow the array */
    bool          drop_logged; /* the log said the trace is full */
    trace_process processes[MAX_PROCESSES];
    uint32_t      n_processes;
    trace_track   tracks[MAX_TRACKS];
    uint32_t      n_tracks;
} recording;

static struct {
    pthread_mutex_t lock;
    char           *path;
    uint64_t        origin_ns;
    recording       rec;
    pid_t           owner; /* the process that started the recording */
} trace = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* pid of a device, 1-based; named on first sight. Lock held. */
static uint32_t process_of(const void *device, const char *name)
{
    for (uint32_t i = 0; i < trace.rec.n_processes; i++)
        if (trace.rec.processes[i].key == device)
            return i + 1;
    if (trace.rec.n_processes == MAX_PROCESSES)
        return MAX_PROCESSES; /* the last one takes the rest */
    trace_process *p = &trace.rec.processes[trace.rec.n_processes++];
    p->key = device;
    snprintf(p->name, sizeof p->name, "mapping device %u: %s", trace.rec.n_processes, name ? name : "?");
    return trace.rec.n_processes;
}

/* tid of a stream within its device: 0 = blocking calls. Lock held. */
static uint32_t track_of(uint32_t pid, const void *stream)
{
    if (!stream)
        return 0;
    uint32_t streams = 0;
    for (uint32_t i = 0; i < trace.rec.n_tracks; i++) {
        if (trace.rec.tracks[i].key == stream && trace.rec.tracks[i].pid == pid)
            return trace.rec.tracks[i].tid;
        streams += trace.rec.tracks[i].pid == pid;
    }
    if (trace.rec.n_tracks == MAX_TRACKS)
        return MAX_TRACKS;
    trace.rec.tracks[trace.rec.n_tracks++] = (trace_track){stream, pid, streams + 1};
    return streams + 1;
}

/* The slot for a new event, or NULL (the event is lost, and counted): grows
 * the array up to max_events, then reuses the oldest slot. Lock held;
 * *full_now tells that the trace has just become full. */
static trace_event *slot_for_new_event(bool *full_now)
{
    recording *r = &trace.rec;
    size_t max = r->max_events ? r->max_events : SIZE_MAX / sizeof(trace_event);
    if (r->count == r->capacity && r->capacity < max) {
        size_t cap = r->capacity ? (r->capacity < max / 2 ? 2 * r->capacity : max) : (max < 1024 ? max : 1024);
        trace_event *v = mapping_os_realloc(r->events, cap * sizeof *v);
        if (!v) { /* out of memory: this event is lost (counted), tracing goes on */
            r->lost++;
            return NULL;
        }
        r->events = v;
        r->capacity = cap;
    }
    if (r->count < r->capacity)
        return &r->events[r->count++];
    if (r->count == 0) { /* no memory for a single event */
        r->lost++;
        return NULL;
    }
    /* Full: the newest event replaces the oldest. */
    trace_event *e = &r->events[r->head];
    r->head = r->head + 1 == r->count ? 0 : r->head + 1;
    r->dropped++;
    if (!r->drop_logged)
        *full_now = r->drop_logged = true;
    return e;
}

static void append(char phase, uint64_t t0, uint64_t t1, const mapping_trace_record *record)
{
    bool full_now = false;
    size_t max = 0;
    pthread_mutex_lock(&trace.lock);
    if (!atomic_load_explicit(&mapping__trace_active, memory_order_relaxed)) {
        pthread_mutex_unlock(&trace.lock);
        return;
    }
    trace_event *e = slot_for_new_event(&full_now);
    if (e) {
        e->record = *record;
        e->phase = phase;
        e->ts_ns = t0 > trace.origin_ns ? t0 - trace.origin_ns : 0;
        e->dur_ns = t1 > t0 ? t1 - t0 : 0;
        e->pid = process_of(record->device, record->device_name);
        e->tid = track_of(e->pid, record->stream);
        e->record.device_name = NULL; /* copied into the process's name */
    }
    max = trace.rec.max_events;
    pthread_mutex_unlock(&trace.lock);
    if (full_now) /* outside the lock: the callback may call the library */
        mapping__log(1, "trace: %zu events are kept in memory (MAPPING_TRACE_MAX_EVENTS); from now on each new event "
                        "replaces the oldest, and the trace file counts them as dropped", max);
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
static void put_trace(FILE *f, const recording *r)
{
    fprintf(f,
            "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"library\":\"mapping %s\",\"max_events\":%zu,"
            "\"events\":%zu,\"dropped_events\":%" PRIu64 ",\"lost_events\":%" PRIu64 "},\"traceEvents\":[\n",
            mapping_version(), r->max_events, r->count, r->dropped, r->lost);
    fprintf(f, "{\"name\":\"trace start\",\"ph\":\"i\",\"s\":\"g\",\"ts\":0,\"pid\":0,\"tid\":0}");
    if (r->dropped || r->lost) /* at the first event kept: what is missing before it */
        fprintf(f,
                ",\n{\"name\":\"trace events dropped\",\"cat\":\"trace\",\"ph\":\"i\",\"s\":\"g\",\"ts\":%" PRIu64
                ".%03u,\"pid\":0,\"tid\":0,\"args\":{\"dropped_events\":%" PRIu64 ",\"lost_events\":%" PRIu64
                ",\"max_events\":%zu}}",
                r->count ? r->events[r->head].ts_ns / 1000 : 0,
                r->count ? (unsigned)(r->events[r->head].ts_ns % 1000) : 0, r->dropped, r->lost,
                r->max_events);
    for (uint32_t i = 0; i < r->n_processes; i++) {
        fprintf(f, ",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%" PRIu32 ",\"tid\":0,\"args\":{\"name\":",
                i + 1);
        put_string(f, r->processes[i].name);
        fprintf(f, "}}");
        fprintf(f,
                ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%" PRIu32
                ",\"tid\":0,\"args\":{\"name\":\"blocking calls\"}}",
                i + 1);
    }
    for (uint32_t i = 0; i < r->n_tracks; i++)
        fprintf(f,
                ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%" PRIu32 ",\"tid\":%" PRIu32
                ",\"args\":{\"name\":\"stream %" PRIu32 "\"}}",
                r->tracks[i].pid, r->tracks[i].tid, r->tracks[i].tid);
    for (size_t i = 0; i < r->count; i++) /* oldest first */
        put_event(f, &r->events[(r->head + i) % r->count]);
    fprintf(f, "\n]}\n");
}

/* Where the trace goes, decided at start (start_target) and kept until
 * stop (write_file):
 * - A path that reaches its file through /proc (it lies there, or a
 *   symbolic link on the way points there: /dev/stdout -> /proc/self/fd/1
 *   -> the pipe, terminal or file stdout is), or that resolves (symbolic
 *   links followed) to something other than a regular file (a FIFO,
 *   /dev/null, a terminal): written in place, through a descriptor opened
 *   at start and kept, so a FIFO's reader sees one writer from start to
 *   stop, and a missing reader fails the start (ENXIO) instead of blocking.
 *   A regular file reached through /proc is appended to (it is the
 *   program's own output, never replaced: replacing it would lose what the
 *   program wrote to it, and a link such as /dev/stdout).
 * - Otherwise (the usual case): the file the path's links lead to (a link
 *   is followed, never replaced, a dangling one included) is written
 *   through a new temporary file beside it, created exclusively with a
 *   random name, then renamed over it. */
static int target_fd = -1;   /* in place: kept from start to stop */
static FILE *target_stdio;   /* the stream target_fd copies (stdout): flushed first */
static char *target_path;    /* else: the resolved path the trace replaces */

static bool in_proc(const char *real)
{
    return strcmp(real, "/proc") == 0 || strncmp(real, "/proc/", 6) == 0;
}

/* N when real (a directory's real path) and name are this process's
 * /proc/<pid>/fd (or /proc/<pid>/task/<tid>/fd) and N, else -1. */
static int own_descriptor(const char *real, const char *name)
{
    long pid = 0, tid = 0;
    int used = 0;
    if (!(sscanf(real, "/proc/%ld/fd%n", &pid, &used) == 1 && real[used] == '\0') &&
        !(sscanf(real, "/proc/%ld/task/%ld/fd%n", &pid, &tid, &used) == 2 && real[used] == '\0'))
        return -1;
    if (pid != (long)getpid() || !*name || strlen(name) > 9 || strspn(name, "0123456789") != strlen(name))
        return -1;
    return atoi(name);
}

/* Follows the symbolic links of path's last component into out (the name
 * of the file, existing or not, that opening path would reach) and says
 * whether the way passes through /proc, and through which descriptor of
 * this process (/dev/stdout: 1; else -1): 0 or an errno. */
static int follow_links(const char *path, char *out, size_t len, bool *through_proc, int *descriptor)
{
    char next[4096], joined[8300];
    *through_proc = false;
    *descriptor = -1;
    int n = snprintf(out, len, "%s", path);
    if (n <= 0 || (size_t)n >= len)
        return ENAMETOOLONG;
    for (int links = 0;; links++) {
        const char *slash = strrchr(out, '/');
        char dir[4096];
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - out + (slash == out)) : 1, slash ? out : ".");
        char *rdir = realpath(dir, NULL);
        *through_proc |= rdir && in_proc(rdir);
        if (rdir && *descriptor < 0)
            *descriptor = own_descriptor(rdir, slash ? slash + 1 : out);
        free(rdir);
        struct stat st;
        if (*through_proc || lstat(out, &st) != 0 || !S_ISLNK(st.st_mode))
            return 0;
        if (links == 40)
            return ELOOP;
        ssize_t got = readlink(out, next, sizeof next - 1);
        if (got <= 0)
            return got < 0 ? errno : ENOENT;
        next[got] = '\0';
        if (next[0] == '/' || !slash)
            n = snprintf(joined, sizeof joined, "%s", next);
        else
            n = snprintf(joined, sizeof joined, "%.*s/%s", (int)(slash - out), out, next);
        if (n <= 0 || (size_t)n >= len)
            return ENAMETOOLONG;
        memcpy(out, joined, (size_t)n + 1);
    }
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
    char final[4096];
    bool through_proc;
    int descriptor, err = follow_links(path, final, sizeof final, &through_proc, &descriptor);
    if (err)
        return err;
    /* One of this process's descriptors (/dev/stdout): a copy of it, so the
     * trace and the program's own writes share one offset (a new open of a
     * file would write at its end, where the program's next write, at its
     * own offset, would land on the trace). */
    int copy = descriptor >= 0 ? fcntl(descriptor, F_DUPFD_CLOEXEC, 3) : -1;
    if (copy >= 0) {
        int fl = fcntl(copy, F_GETFL);
        if (fl == -1 || (fl & O_ACCMODE) == O_RDONLY) { /* /dev/stdin: the program's input, never written */
            close(copy);
            return EBADF;
        }
        target_fd = copy;
        target_stdio = descriptor == STDOUT_FILENO ? stdout : descriptor == STDERR_FILENO ? stderr : NULL;
        return 0;
    }
    char *real = realpath(final, NULL);
    struct stat st;
    bool exists = real ? stat(real, &st) == 0 : stat(path, &st) == 0;
    if (through_proc || (exists && !S_ISREG(st.st_mode))) {
        int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC | (exists && S_ISREG(st.st_mode) ? O_APPEND : 0));
        err = fd < 0 ? errno : 0;
        free(real);
        if (fd < 0)
            return err; /* ENXIO: a FIFO with no reader */
        int fl = fcntl(fd, F_GETFL);
        if (fl != -1)
            fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
        target_fd = fd;
        return 0;
    }
    path = final; /* a dangling link's target is created, the link kept */
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
    target_stdio = NULL;
    free(target_path);
    target_path = NULL;
}

/* Where a stopped trace goes, taken from start_target's decision. */
typedef struct target {
    int   fd;     /* in place (closed here), or -1 */
    FILE *stdio;  /* the stream fd copies, flushed first */
    char *path;   /* else: the file to replace (freed here) */
} target;

static target target_take(void)
{
    target t = {target_fd, target_stdio, target_path};
    target_fd = -1;
    target_stdio = NULL;
    target_path = NULL;
    return t;
}

/* Writes r where t says, and lets t go: 0, or the errno of the first
 * failure (a replaced file is then left as it was). */
static int write_file(const recording *r, target *t)
{
    char tmp[4200];
    bool in_place = t->fd >= 0;
    FILE *f = NULL;
    errno = 0;
    if (in_place) {
        if (t->stdio) /* what the program wrote comes first */
            fflush(t->stdio);
        f = fdopen(t->fd, "w");
        if (f)
            t->fd = -1; /* closed by fclose */
    } else if (t->path) {
        f = create_temporary(t->path, tmp, sizeof tmp);
        struct stat old;
        if (f && stat(t->path, &old) == 0 && S_ISREG(old.st_mode)) {
            /* The file replaced keeps its permissions (a trace made 0600
             * stays private) and, where allowed, its owner and group. */
            if (fchown(fileno(f), old.st_uid, old.st_gid) != 0)
                errno = 0; /* another user's file: ours now, as any new file */
            (void)fchmod(fileno(f), old.st_mode & 07777);
        }
    } else {
        errno = EINVAL;
    }
    int err = f ? 0 : errno ? errno : EIO;
    if (f) {
        errno = 0;
        put_trace(f, r);
        err = fflush(f) != 0 || ferror(f) ? (errno ? errno : EIO) : 0;
        errno = 0;
        if (fclose(f) != 0 && !err)
            err = errno ? errno : EIO;
        if (!in_place && !err && rename(tmp, t->path) != 0)
            err = errno ? errno : EIO;
        if (!in_place && err)
            unlink(tmp);
    }
    if (t->fd >= 0)
        close(t->fd);
    free(t->path);
    *t = (target){-1, NULL, NULL};
    return err;
}

static void reset_locked(void)
{
    free(trace.rec.events);
    trace.rec.events = NULL;
    trace.rec.count = trace.rec.capacity = trace.rec.head = 0;
    trace.rec.dropped = trace.rec.lost = 0;
    trace.rec.drop_logged = false;
    trace.rec.n_processes = trace.rec.n_tracks = 0;
}

/* $MAPPING_TRACE_MAX_EVENTS: decimal digits, 0 (no limit) to
 * LIMIT_MAX_EVENTS; unset or empty: DEFAULT_MAX_EVENTS. False for anything
 * else. */
static bool max_events_from_env(size_t *out)
{
    const char *v = getenv("MAPPING_TRACE_MAX_EVENTS");
    unsigned long long n = 0;
    *out = DEFAULT_MAX_EVENTS;
    if (!v || !*v)
        return true;
    for (const char *c = v; *c; c++) {
        if (*c < '0' || *c > '9' || n > LIMIT_MAX_EVENTS)
            return false;
        n = n * 10 + (unsigned long long)(*c - '0');
    }
    if (n > LIMIT_MAX_EVENTS || n > SIZE_MAX / sizeof(trace_event))
        return false;
    *out = (size_t)n;
    return true;
}

/* Why $MAPPING_TRACE_MAX_EVENTS (value) is refused, in buf. */
static const char *max_events_why(const char *value, char *buf, size_t len)
{
    snprintf(buf, len, "MAPPING_TRACE_MAX_EVENTS=\"%.60s%s\" is not a number of events from 0 (no limit) to %llu "
                       "(decimal digits)",
             value ? value : "", value && strlen(value) > 60 ? "..." : "", LIMIT_MAX_EVENTS);
    return buf;
}

/* path for a message: whole when short, else its start and end around
 * "...", so that what follows it in a 512-byte message is not cut off. */
static const char *shown_path(const char *path, char *buf, size_t len)
{
    size_t n = strlen(path), keep = (len - 4) / 2;
    if (n < len)
        return path;
    snprintf(buf, len, "%.*s...%s", (int)keep, path, path + n - (len - 4 - keep));
    return buf;
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
}

/* Registered when the library loads, not at the first trace: glibc (2.36
 * and later) runs a fork's prepare handlers without its atfork lock, and a
 * handler another thread registers meanwhile is left out of that fork
 * (track/write_track.c). A leaf lock (nothing else is taken under it):
 * priority 150, before the write-tracking handlers (201, 202), so its
 * prepare runs after theirs. */
__attribute__((constructor(150))) static void register_fork_handlers(void)
{
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
    char shown[240];
    size_t max_events;
    if (!max_events_from_env(&max_events)) {
        free(copy);
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: %s", fn,
                             max_events_why(getenv("MAPPING_TRACE_MAX_EVENTS"), shown, sizeof shown));
    }
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
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: cannot create a file at %s: %s", fn,
                             shown_path(path, shown, sizeof shown),
                             err == ENXIO ? "a FIFO with no reader (start the reader first)" : strerror(err));
    }
    free(trace.path);
    trace.path = copy;
    reset_locked();
    trace.rec.max_events = max_events;
    trace.owner = getpid();
    trace.origin_ns = mapping_os_now_ns();
    atomic_store_explicit(&mapping__trace_active, true, memory_order_relaxed);
    pthread_mutex_unlock(&trace.lock);
    pthread_once(&at_exit, register_stop_at_exit);
    return MAPPING_OK;
}

mapping_status mapping__trace_stop(void)
{
    /* The recording is taken under the lock and written after it (into
     * taken); with no memory for that, it is written under the lock. */
    recording *taken = mapping_os_malloc(sizeof *taken);
    pthread_mutex_lock(&trace.lock);
    bool was = atomic_exchange_explicit(&mapping__trace_active, false, memory_order_relaxed);
    /* A forked child inherits the recording: it is the parent's to write. */
    bool mine = was && trace.path && trace.owner == getpid();
    target to = target_take();
    int err = 0;
    if (mine && taken) {
        *taken = trace.rec;
        trace.rec.events = NULL; /* now taken's */
    } else if (mine) {
        err = write_file(&trace.rec, &to);
    }
    char path[240];
    const char *shown = shown_path(trace.path ? trace.path : "", path, sizeof path);
    if (shown != path) /* short: shown whole */
        snprintf(path, sizeof path, "%s", shown);
    uint64_t dropped = mine ? trace.rec.dropped : 0, lost = mine ? trace.rec.lost : 0;
    size_t kept = trace.rec.count, max = trace.rec.max_events;
    reset_locked();
    pthread_mutex_unlock(&trace.lock);
    if (mine && taken) {
        err = write_file(taken, &to);
        free(taken->events);
    }
    free(taken);
    if (to.fd >= 0) /* not written (a forked child's copy): let it go */
        close(to.fd);
    free(to.path);
    if (dropped || lost) { /* outside the lock: the callback may call the library */
        char lost_text[96] = "";
        if (lost)
            snprintf(lost_text, sizeof lost_text, "; %" PRIu64 " more were lost for want of memory", lost);
        mapping__log(1,
                     "trace %s: %" PRIu64 " of %" PRIu64 " events were dropped, the oldest (it keeps the newest %zu: "
                     "MAPPING_TRACE_MAX_EVENTS)%s; the file holds %zu",
                     path, dropped, dropped + lost + kept, max, lost_text, kept);
    }
    if (err)
        return mapping__fail(MAPPING_ERR_IO, "mapping_trace_stop: cannot write the trace to %s: %s (errno %d)", path,
                             strerror(err), err);
    return MAPPING_OK;
}

static bool environment_failed, environment_bad_max;
static char environment_why[160];

static void start_from_environment(void)
{
    const char *path = getenv("MAPPING_TRACE");
    size_t max_events;
    if (!path || !*path)
        return;
    if (!max_events_from_env(&max_events)) {
        environment_failed = environment_bad_max = true;
        return;
    }
    mapping_error_mark before;
    mapping__error_mark(&before);
    mapping_status st = mapping__trace_start("MAPPING_TRACE", path);
    if (st == MAPPING_ERR_BUSY) {
        /* The program started a trace of its own before its first
         * mapping_open: that one is recorded, this one cannot be (one
         * recorder per process), and mapping_open goes on. */
        char shown[240];
        mapping__error_forget(&before);
        mapping__log(1, "MAPPING_TRACE=%s is ignored: the program records a trace of its own (mapping_trace_start)",
                     shown_path(path, shown, sizeof shown));
    } else if (st != MAPPING_OK) {
        environment_failed = true;
        const char *m = mapping_last_error_message(), *why = strrchr(m, ':'); /* "...: <strerror>" */
        snprintf(environment_why, sizeof environment_why, "%s", why ? why + 2 : m);
    }
}

mapping_status mapping__trace_from_environment(const char *fn)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, start_from_environment);
    if (__builtin_expect(environment_failed, 0)) {
        char shown[240], why[240];
        const char *path = getenv("MAPPING_TRACE") ? getenv("MAPPING_TRACE") : "";
        if (environment_bad_max)
            return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: MAPPING_TRACE=%s: %s", fn,
                                 shown_path(path, shown, sizeof shown),
                                 max_events_why(getenv("MAPPING_TRACE_MAX_EVENTS"), why, sizeof why));
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: MAPPING_TRACE=%s: cannot create the trace file: %s", fn,
                             shown_path(path, shown, sizeof shown), environment_why);
    }
    return MAPPING_OK;
}
