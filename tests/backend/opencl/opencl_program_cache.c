/*
 * OpenCL: the scatter/gather program binary kept between device opens in the
 * cache directory ($MAPPING_CACHE_DIR): written after a source build, used
 * by the next open, ignored and rewritten when corrupt, never written when
 * the cache is "off". Every case checks the scatter's data too.
 *
 * The cache holds native code, so a hostile or broken cache must neither
 * hang nor crash a process, nor run a file another user could have written:
 * a FIFO in place of the file, a truncated binary whose checksum was
 * recomputed (PoCL aborts on it), a directory owned by another user
 * (`nobody`, where the test runs as root), a directory or file writable by
 * others, a link. Those tests open devices in child processes (a crash or a
 * hang, caught by alarm(), is the failure they look for).
 */
#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"

#ifdef MAPPING_WITH_OPENCL
#include "backend/opencl/opencl_api.h"
#endif
#ifdef MAPPING_OPENCL_HEADERS

/* The one opencl-*.bin of dir into path; how many there are. */
static int cache_files(const char *dir, char *path, size_t len)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, "opencl-", 7) && strstr(e->d_name, ".bin") && !strstr(e->d_name, ".tmp")) {
            snprintf(path, len, "%s/%s", dir, e->d_name);
            n++;
        }
    if (d)
        closedir(d);
    return n;
}

/* Opens an OpenCL device, scatters 64 copies through a batch, checks them. */
static void scatter_and_check(void)
{
    mapping_device *dev = NULL;
    /* On a CPU device a blocking flush copies through mapped memory and
     * needs no kernel: this one must scatter with the kernel. */
    setenv("MAPPING_BATCH_MAP", "0", 1);
    mapping_status st = mapping_open(&(mapping_device_desc){.backend = "opencl"}, &dev);
    if (st == MAPPING_ERR_NO_BACKEND || st == MAPPING_ERR_NO_DEVICE)
        test_skip("OpenCL is not available here: %s", mapping_last_error_message());
    CHECK_OK(st);
    enum { N = 64, COPY = 40 };
    unsigned char src[N * COPY], back[N * COPY];
    test_pattern(src, sizeof src, 9);
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, N * COPY * 3, &buf));
    mapping_batch *b;
    CHECK_OK(mapping_batch_create(dev, &b));
    for (size_t i = 0; i < N; i++)
        CHECK_OK(mapping_batch_add_to_gpu(b, src + i * COPY, buf, i * COPY * 3, COPY));
    CHECK_OK(mapping_batch_flush(NULL, b));
    for (size_t i = 0; i < N; i++)
        CHECK_OK(mapping_sync_to_cpu_range(NULL, buf, i * COPY * 3, back + i * COPY, COPY));
    CHECK(memcmp(src, back, sizeof src) == 0);
    mapping_batch_destroy(b);
    mapping_free_gpu(buf);
    mapping_close(dev);
}

/* The file format (opencl_program_cache.c): magic "mapclbnV", key, size,
 * check, then size bytes of binary. V 1 (before the hardening): check is the
 * FNV-1a hash of the binary; V 2: of the header with check 0, then the binary. */
typedef struct kept_header {
    char     magic[8];
    uint64_t key, size, check;
} kept_header;

static uint64_t fnv(const void *data, size_t len, uint64_t h)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t kept_check(kept_header h, const unsigned char *binary)
{
    uint64_t start = 0xcbf29ce484222325ull;
    if (h.magic[7] == '1')
        return fnv(binary, h.size, start);
    h.check = 0;
    return fnv(binary, h.size, fnv(&h, sizeof h, start));
}

/* The file (at most 16 MiB; PoCL's binary is about 120 KiB) in a static buffer. */
static unsigned char *read_whole(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    static unsigned char data[16 << 20];
    *len = fread(data, 1, sizeof data, f);
    fclose(f);
    CHECK(*len < sizeof data);
    return data;
}

/* Whether path holds a whole file of the current format with a good checksum. */
static bool cache_file_is_whole(const char *path)
{
    size_t len;
    unsigned char *data = read_whole(path, &len);
    kept_header h;
    if (len <= sizeof h)
        return false;
    memcpy(&h, data, sizeof h);
    return !memcmp(h.magic, "mapclbn", 7) && h.size == len - sizeof h && h.check == kept_check(h, data + sizeof h);
}

/* Cuts the binary of path to half and writes the checksum that the file's
 * own format computes, as a broken writer (or one who can write the file)
 * would: the file passes every check the cache makes, and PoCL aborts on it. */
static void plant_truncated_binary(const char *from, const char *to)
{
    size_t len;
    unsigned char *data = read_whole(from, &len);
    kept_header h;
    CHECK(len > sizeof h + 64);
    memcpy(&h, data, sizeof h);
    h.size = (len - sizeof h) / 2;
    h.check = kept_check(h, data + sizeof h);
    memcpy(data, &h, sizeof h);
    remove(to);
    FILE *f = fopen(to, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(data, 1, sizeof h + h.size, f) == sizeof h + h.size);
    CHECK(fclose(f) == 0);
    CHECK(chmod(to, 0600) == 0);
}

static int cache_log_lines;
static void count_cache_log(int level, const char *message, void *user)
{
    (void)level;
    (void)user;
    if (!strncmp(message, "cache: ", 7) || strstr(message, "program binary"))
        cache_log_lines++;
}

/* Opens, scatters and checks `opens` times in a child process with
 * $MAPPING_CACHE_DIR = dir; the child fails unless the log heard
 * `log_lines` lines about the cache (-1: any number). 0 when it passed, 77
 * when OpenCL is absent, else the exit code or 128 + the signal. A hang
 * ends in SIGALRM. */
static int opens_in_child(const char *dir, int opens, int log_lines)
{
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        alarm(60);
        setenv("MAPPING_CACHE_DIR", dir, 1);
        mapping_set_log(count_cache_log, NULL);
        for (int i = 0; i < opens; i++)
            scatter_and_check();
        if (log_lines >= 0 && cache_log_lines != log_lines) {
            fprintf(stderr, "FAIL: %d log lines about the cache, expected %d\n", cache_log_lines, log_lines);
            _exit(3);
        }
        _exit(0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (rc == TEST_SKIP_CODE)
        test_skip("OpenCL is not available here");
    return rc;
}

static void mode_is(const char *path, unsigned mode)
{
    struct stat st;
    CHECK(stat(path, &st) == 0);
    if ((st.st_mode & 0777) != mode)
        test_fail(__FILE__, __LINE__, "%s has mode %03o, expected %03o", path, (unsigned)(st.st_mode & 0777), mode);
}

/* A fresh directory dir/name (mode 0700) holding the one kept binary, good,
 * written by a child; its path into file. */
static void fresh_cache(const char *dir, const char *name, char *sub, char *file, size_t len)
{
    snprintf(sub, len, "%s/%s", dir, name);
    CHECK(opens_in_child(sub, 1, 0) == 0);
    CHECK(cache_files(sub, file, len) == 1);
    CHECK(cache_file_is_whole(file));
    mode_is(sub, 0700);
    mode_is(file, 0600);
}

static void remove_tree(const char *dir)
{
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

static void program_cache_body(void)
{
    char dir[] = "/tmp/mapping-cache-test-XXXXXX", path[4200], again[4200];
    CHECK(mkdtemp(dir) != NULL);
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/made/by/the/library", dir);
    setenv("MAPPING_CACHE_DIR", sub, 1);
    scatter_and_check(); /* a source build, then kept */
    CHECK(cache_files(sub, path, sizeof path) == 1);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    CHECK(size > 64);
    scatter_and_check(); /* from the binary */
    CHECK(cache_files(sub, again, sizeof again) == 1 && !strcmp(path, again));

    /* Corrupt: a byte in the middle flipped. The next open ignores it, builds
     * from source and rewrites a good file. */
    f = fopen(path, "r+b");
    CHECK(f != NULL);
    fseek(f, size / 2, SEEK_SET);
    int c = fgetc(f);
    fseek(f, size / 2, SEEK_SET);
    fputc(c ^ 0xff, f);
    fclose(f);
    scatter_and_check();
    CHECK(cache_file_is_whole(path)); /* rewritten */
    /* Truncated to a few bytes: the same. */
    f = fopen(path, "wb");
    CHECK(f != NULL);
    fputs("mapc", f);
    fclose(f);
    scatter_and_check();
    CHECK(cache_files(sub, again, sizeof again) == 1);
    CHECK(cache_file_is_whole(path)); /* rewritten (a first build's size may differ from a later one's) */
    remove(path);

    /* Off: nothing is written. */
    setenv("MAPPING_CACHE_DIR", "off", 1);
    scatter_and_check();
    CHECK(cache_files(sub, path, sizeof path) == 0);
    unsetenv("MAPPING_CACHE_DIR");
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}
#endif

UNIT_TEST(opencl_program_binaries_are_kept_used_and_rebuilt_when_corrupt)
{
#ifdef MAPPING_OPENCL_HEADERS
    program_cache_body();
#else
    test_skip("the OpenCL back end is not compiled into this build (or without its headers)");
#endif
}

#ifdef MAPPING_OPENCL_HEADERS
static bool is_regular(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int loading_files(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strstr(e->d_name, ".loading") != NULL;
    if (d)
        closedir(d);
    return n;
}
#endif

UNIT_TEST(opencl_program_cache_never_blocks_on_a_fifo_in_place_of_the_binary)
{
#ifdef MAPPING_OPENCL_HEADERS
    char dir[] = "/tmp/mapping-cache-fifo-XXXXXX", sub[4200], file[4200];
    CHECK(mkdtemp(dir) != NULL);
    fresh_cache(dir, "cache", sub, file, sizeof file);
    CHECK(remove(file) == 0 && mkfifo(file, 0600) == 0);
    /* Before: open() waited for a writer, in every process (SIGALRM here). */
    int rc = opens_in_child(sub, 2, 1);
    if (rc != 0)
        test_fail(__FILE__, __LINE__, "an open with a FIFO in the cache ended with %d (142: hung)", rc);
    CHECK(is_regular(file) && cache_file_is_whole(file)); /* the source build replaced it */
    remove_tree(dir);
#else
    test_skip("the OpenCL back end is not compiled into this build (or without its headers)");
#endif
}

UNIT_TEST(opencl_program_cache_a_binary_that_crashes_the_driver_crashes_no_later_process)
{
#ifdef MAPPING_OPENCL_HEADERS
    char dir[] = "/tmp/mapping-cache-cut-XXXXXX", sub[4200], file[4200];
    CHECK(mkdtemp(dir) != NULL);
    fresh_cache(dir, "cache", sub, file, sizeof file);
    plant_truncated_binary(file, file);
    /* The first process may die inside the driver (PoCL asserts; under
     * AddressSanitizer its overflow is reported and the child exits 1); it
     * has moved the binary aside first, so the next one builds from source. */
    int first = opens_in_child(sub, 1, -1);
    CHECK(first != 128 + SIGALRM);
    for (int i = 0; i < 2; i++) {
        int rc = opens_in_child(sub, 1, -1);
        if (rc != 0)
            test_fail(__FILE__, __LINE__, "open %d after a truncated binary ended with %d (first: %d)", i + 2, rc,
                      first);
    }
    CHECK(cache_file_is_whole(file));
    CHECK(loading_files(sub) == 0); /* the next source build removed what the crash left aside */

    /* A binary the driver refuses (with the right checksum): deleted, said
     * in the log, replaced by a source build. */
    size_t len;
    unsigned char *data = read_whole(file, &len);
    kept_header h;
    memcpy(&h, data, sizeof h);
    h.size = 4096;
    memset(data + sizeof h, 0x5a, h.size);
    h.check = kept_check(h, data + sizeof h);
    memcpy(data, &h, sizeof h);
    FILE *f = fopen(file, "wb");
    CHECK(f && fwrite(data, 1, sizeof h + h.size, f) == sizeof h + h.size && fclose(f) == 0);
    CHECK(opens_in_child(sub, 1, 1) == 0);
    CHECK(cache_file_is_whole(file) && loading_files(sub) == 0);
    remove_tree(dir);
#else
    test_skip("the OpenCL back end is not compiled into this build (or without its headers)");
#endif
}

#ifdef MAPPING_OPENCL_HEADERS
/* sub/file holds a binary that crashes PoCL if loaded; prepare() makes it
 * something only another user could have written; two opens must both run
 * from source, and the log says so once. dir_refused: the directory itself
 * is refused, so the planted file is left as it was; otherwise a source
 * build replaces it with a file of this user's, mode 0600. */
static void check_refused(const char *what, const char *sub, const char *file, bool dir_refused)
{
    size_t len;
    unsigned char *data = read_whole(file, &len);
    uint64_t planted = fnv(data, len, 1);
    int rc = opens_in_child(sub, 2, 1);
    if (rc != 0)
        test_fail(__FILE__, __LINE__, "%s: two opens ended with %d (134: the planted binary was loaded)", what, rc);
    struct stat st;
    CHECK(lstat(file, &st) == 0);
    data = read_whole(file, &len);
    if (dir_refused)
        CHECK(fnv(data, len, 1) == planted); /* untouched */
    else
        CHECK(S_ISREG(st.st_mode) && st.st_uid == geteuid() && (st.st_mode & 0777) == 0600 && cache_file_is_whole(file) &&
              fnv(data, len, 1) != planted);
    printf("%s: refused\n", what);
}
#endif

UNIT_TEST(opencl_program_cache_refuses_a_directory_or_file_another_user_could_have_written)
{
#ifdef MAPPING_OPENCL_HEADERS
    char dir[] = "/tmp/mapping-cache-owner-XXXXXX", sub[4200], file[4200], good[4200];
    CHECK(mkdtemp(dir) != NULL);
    fresh_cache(dir, "good", sub, good, sizeof good);
    struct passwd *nobody = getpwnam("nobody");
    bool can_chown = geteuid() == 0 && nobody && nobody->pw_uid != 0;

    /* A world-writable directory of this user's. */
    fresh_cache(dir, "open-dir", sub, file, sizeof file);
    plant_truncated_binary(good, file);
    CHECK(chmod(sub, 0777) == 0);
    check_refused("directory mode 0777", sub, file, true);
    /* A directory owned by another user (not writable by others: the owner
     * rule alone). Only root can make one. */
    if (can_chown) {
        fresh_cache(dir, "nobodys-dir", sub, file, sizeof file);
        plant_truncated_binary(good, file);
        CHECK(chown(sub, nobody->pw_uid, nobody->pw_gid) == 0 && chmod(sub, 0755) == 0);
        check_refused("directory owned by nobody", sub, file, true);
        CHECK(chmod(sub, 0777) == 0);
        check_refused("directory owned by nobody, mode 0777", sub, file, true);
    } else
        printf("not root: the directories and files of another user are not tried\n");
    /* A file writable by others, in a good directory. */
    fresh_cache(dir, "open-file", sub, file, sizeof file);
    plant_truncated_binary(good, file);
    CHECK(chmod(file, 0666) == 0);
    check_refused("file mode 0666", sub, file, false);
    /* A file owned by another user. */
    if (can_chown) {
        fresh_cache(dir, "nobodys-file", sub, file, sizeof file);
        plant_truncated_binary(good, file);
        CHECK(chown(file, nobody->pw_uid, nobody->pw_gid) == 0);
        check_refused("file owned by nobody", sub, file, false);
    }
    /* A link to a file of this user's (it could point anywhere). */
    fresh_cache(dir, "link", sub, file, sizeof file);
    char target[4300];
    snprintf(target, sizeof target, "%s/planted", dir);
    plant_truncated_binary(good, target);
    CHECK(remove(file) == 0 && symlink(target, file) == 0);
    check_refused("symbolic link", sub, file, false);
    remove_tree(dir);
#else
    test_skip("the OpenCL back end is not compiled into this build (or without its headers)");
#endif
}
