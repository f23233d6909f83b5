/*
 * The per-user cache directory and whole-file reads and atomic writes, for
 * results worth keeping between processes (compiled device kernels).
 *   directory: $MAPPING_CACHE_DIR, else $XDG_CACHE_HOME/mapping, else
 *   $HOME/.cache/mapping; "off" as MAPPING_CACHE_DIR turns the cache off.
 * A write goes to a temporary file in the same directory, then rename():
 * a reader sees the old file or the new one, never half of one. Every
 * failure here only means "no cache": callers fall back to doing the work.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "os/os.h"

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

int mapping_os_cache_path(const char *name, char *out, size_t len)
{
    const char *dir = getenv("MAPPING_CACHE_DIR"), *base;
    char buf[4096];
    int n;
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
    if (n <= 0 || (size_t)n >= sizeof buf || make_dirs(buf) != 0)
        return -1;
    n = snprintf(out, len, "%s/%s", buf, name);
    return n > 0 && (size_t)n < len ? 0 : -1;
}

void *mapping_os_read_file(const char *path, size_t max, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    void *data = NULL;
    long size;
    if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) > 0 && (size_t)size <= max && fseek(f, 0, SEEK_SET) == 0 &&
        (data = mapping_os_malloc((size_t)size)) && fread(data, 1, (size_t)size, f) == (size_t)size) {
        *len = (size_t)size;
    } else {
        free(data);
        data = NULL;
    }
    fclose(f);
    return data;
}

int mapping_os_write_file_atomic(const char *path, const void *data, size_t len)
{
    char tmp[4200];
    int n = snprintf(tmp, sizeof tmp, "%s.%ld.%lx.tmp", path, (long)getpid(), (unsigned long)mapping_os_now_ns());
    if (n <= 0 || (size_t)n >= sizeof tmp)
        return -1;
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return -1;
    int ok = fwrite(data, 1, len, f) == len;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
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
