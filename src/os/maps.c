/*
 * What the process may do with a range of its memory, from the kernel's
 * list of its mappings (/proc/self/maps). For memory the caller hands the
 * library (a wrapped mirror, a tracked range): a copy into read-only
 * memory, or out of PROT_NONE memory, would otherwise fault inside the
 * library instead of failing with a status.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include "os/os.h"

#if defined(__linux__)
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

/* A hex number at *p (advanced past it); false when there is none. */
static bool parse_hex(const char **p, const char *end, uintptr_t *out)
{
    uintptr_t v = 0;
    const char *s = *p;
    for (; s < end; s++) {
        int d = *s >= '0' && *s <= '9' ? *s - '0' : *s >= 'a' && *s <= 'f' ? *s - 'a' + 10 : -1;
        if (d < 0)
            break;
        v = v << 4 | (uintptr_t)d;
    }
    if (s == *p)
        return false;
    *p = s;
    *out = v;
    return true;
}

/* One line's start, "lo-hi perms ...": false when it is not one. */
static bool parse_line(const char *s, const char *end, uintptr_t *lo, uintptr_t *hi, char perms[4])
{
    if (!parse_hex(&s, end, lo) || s == end || *s++ != '-' || !parse_hex(&s, end, hi) || s == end || *s++ != ' ' ||
        end - s < 4)
        return false;
    memcpy(perms, s, 4);
    return true;
}

typedef struct walk {
    uintptr_t at, hi; /* [lo, at) is checked */
    int       need, rc, n_exec, n_plain;
    bool      done;
} walk;

static void visit(walk *w, uintptr_t a, uintptr_t b, const char perms[4])
{
    if (b <= w->at)
        return;
    if (a > w->at) {
        w->rc = -EFAULT; /* a hole */
        w->done = true;
        return;
    }
    if (((w->need & PROT_READ) && perms[0] != 'r') || ((w->need & PROT_WRITE) && perms[1] != 'w')) {
        w->rc = -EACCES;
        w->done = true;
        return;
    }
    if (perms[2] == 'x')
        w->n_exec++;
    else
        w->n_plain++;
    w->at = b;
    w->done = w->at >= w->hi;
}

int mapping_os_range_access(uintptr_t lo, uintptr_t hi, int prot, int *exec)
{
    if (exec)
        *exec = 0;
    if (lo >= hi)
        return 0;
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -ENOENT;
    walk w = {.at = lo, .hi = hi, .need = prot};
    char buf[8192];
    size_t have = 0;        /* bytes in buf */
    bool in_long_line = false; /* the rest of a line longer than buf (a long path): skipped */
    while (!w.done) {
        ssize_t got = read(fd, buf + have, sizeof buf - have);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        have += (size_t)got;
        size_t start = 0;
        for (;;) {
            char *nl = memchr(buf + start, '\n', have - start);
            if (!nl)
                break;
            if (!in_long_line) {
                uintptr_t a, b;
                char perms[4];
                if (parse_line(buf + start, nl, &a, &b, perms))
                    visit(&w, a, b, perms);
            }
            in_long_line = false;
            start = (size_t)(nl - buf) + 1;
            if (w.done)
                break;
        }
        if (w.done)
            break;
        if (start == 0 && have == sizeof buf) { /* one line fills the buffer: its start is all that counts */
            if (!in_long_line) {
                uintptr_t a, b;
                char perms[4];
                if (parse_line(buf, buf + have, &a, &b, perms))
                    visit(&w, a, b, perms);
            }
            in_long_line = true;
            have = 0;
            continue;
        }
        memmove(buf, buf + start, have - start);
        have -= start;
    }
    close(fd);
    if (w.rc == 0 && w.at < w.hi)
        w.rc = -EFAULT; /* past the last mapping, or the list ended early */
    if (w.rc == 0 && exec)
        *exec = w.n_exec && w.n_plain ? -1 : w.n_exec ? PROT_EXEC : 0;
    return w.rc;
}

#else /* no /proc/self/maps: unknown */

int mapping_os_range_access(uintptr_t lo, uintptr_t hi, int prot, int *exec)
{
    (void)lo, (void)hi, (void)prot;
    if (exec)
        *exec = 0;
    return -ENOENT;
}
#endif
