/*
 * The per-user cache directory and whole-file reads and atomic writes, for
 * results worth keeping between processes (compiled device kernels, which
 * are native code: a file here is run, so only this user may have written it).
 *   directory: $MAPPING_CACHE_DIR, else $XDG_CACHE_HOME/mapping, else
 *   $HOME/.cache/mapping; "off" as MAPPING_CACHE_DIR turns the cache off.
 * The rules are those of ssh and Python's pyc cache: the directory is made
 * 0700 and files 0600; a directory or file owned by another user, or
 * writable by group or others, is refused (and the log says so once per
 * process); only regular files are read, opened without following a link
 * and without blocking (a FIFO planted there cannot hang the reader).
 * A write goes to a temporary file in the same directory, then rename():
 * a reader sees the old file or the new one, never half of one. Every
 * failure here only means "no cache": callers fall back to doing the work.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "os/os.h"
#include "os/status.h"

/* mkdir -p with mode 0700 for the parts it makes. */
static int make_dirs(char *path)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        int rc = mkdir(path, 0700);
        *p = '/';
        if (rc != 0 && errno != EEXIST)
            return -1;
    }
    return mkdir(path, 0700) == 0 || errno == EEXIST ? 0 : -1;
}

static atomic_bool refusal_logged;

static void log_refusal(const char *what, const char *path, const char *why)
{
    if (!atomic_exchange(&refusal_logged, true))
        mapping__log(1, "cache: %s %s is %s: refused, kernels are built from source (later refusals are not logged)",
                     what, path, why);
}

/* Whether st (of path, a `what`) is private to this user; says why not in
 * the log, once per process. */
static bool private_to_user(const struct stat *st, const char *path, const char *what, bool directory)
{
    const char *why = NULL;
    char text[96];
    if (directory ? !S_ISDIR(st->st_mode) : !S_ISREG(st->st_mode))
        why = directory ? "not a directory" : "not a regular file";
    else if (st->st_uid != geteuid()) {
        snprintf(text, sizeof text, "owned by uid %lu, not by this user (uid %lu)", (unsigned long)st->st_uid,
                 (unsigned long)geteuid());
        why = text;
    } else if (st->st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(text, sizeof text, "writable by group or others (mode %03o)", (unsigned)(st->st_mode & 0777));
        why = text;
    }
    if (why)
        log_refusal(what, path, why);
    return why == NULL;
}

int mapping_os_cache_path(const char *name, char *out, size_t len)
{
    const char *dir = getenv("MAPPING_CACHE_DIR"), *base;
    char buf[4096];
    int n;
    struct stat st;
    if (dir && !strcmp(dir, "off"))
        return -1;
    if (dir && *dir)
        n = snprintf(buf, sizeof buf, "%s", dir);
    else if ((base = getenv("XDG_CACHE_HOME")) && *base == '/')
        n = snprintf(buf, sizeof buf, "%s/mapping", base);
    else if ((base = getenv("HOME")) && *base == '/')
        n = snprintf(buf, sizeof buf, "%s/.cache/mapping", base);
    else
        return -1;
    if (n <= 0 || (size_t)n >= sizeof buf || make_dirs(buf) != 0 || stat(buf, &st) != 0 ||
        !private_to_user(&st, buf, "directory", true))
        return -1;
    n = snprintf(out, len, "%s/%s", buf, name);
    return n > 0 && (size_t)n < len ? 0 : -1;
}

void *mapping_os_read_file(const char *path, size_t max, size_t *len)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ELOOP)
            log_refusal("file", path, "a symbolic link");
        return NULL;
    }
    struct stat st;
    unsigned char *data = NULL;
    if (fstat(fd, &st) == 0 && private_to_user(&st, path, "file", false) && st.st_size > 0 &&
        (unsigned long long)st.st_size <= max && (data = mapping_os_malloc((size_t)st.st_size))) {
        size_t size = (size_t)st.st_size, done = 0;
        while (done < size) {
            ssize_t got = read(fd, data + done, size - done);
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0)
                break; /* an error, or the file shrank under us */
            done += (size_t)got;
        }
        if (done == size)
            *len = size;
        else {
            free(data);
            data = NULL;
        }
    }
    close(fd);
    return data;
}

int mapping_os_write_file_atomic(const char *path, const void *data, size_t len)
{
    char tmp[4200];
    int n = snprintf(tmp, sizeof tmp, "%s.%ld.%lx.tmp", path, (long)getpid(), (unsigned long)mapping_os_now_ns());
    if (n <= 0 || (size_t)n >= sizeof tmp)
        return -1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    const unsigned char *p = data;
    size_t done = 0;
    while (done < len) {
        ssize_t put = write(fd, p + done, len - done);
        if (put < 0 && errno == EINTR)
            continue;
        if (put <= 0)
            break;
        done += (size_t)put;
    }
    /* On the disk before the rename: after a crash the name holds the old
     * content or the new, never an empty file (ext4, xfs). */
    bool ok = done == len && fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

uint64_t mapping_os_hash64(const void *data, size_t len, uint64_t h)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) { /* FNV-1a */
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
