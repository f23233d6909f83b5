/*
 * Replays inputs through the fuzz decoder (fuzz_ops.h) without libFuzzer:
 * each argument is a file or a folder of files (a corpus). Any compiler
 * builds it, so the normal test suite replays the seed corpus on every back
 * end (CTest fuzz.replay.<backend>). Exits 77 (SKIP) when the back end of
 * $MAPPING_BACKEND is absent; aborts on a mismatch, naming the file.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "mapping.h"
#include "fuzz_ops.h"

static int replay_file(const char *path)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        fprintf(stderr, "fuzz_replay: cannot open %s\n", path);
        return 1;
    }
    static uint8_t data[1 << 20];
    size_t n = fread(data, 1, sizeof data, fp);
    fclose(fp);
    fprintf(stderr, "fuzz_replay: %s (%zu bytes)\n", path, n);
    return fuzz_run(data, n);
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The files of a folder, in name order (the same order on every run). */
static int replay_folder(const char *dir, int *files)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "fuzz_replay: cannot open folder %s\n", dir);
        return 1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **grown = realloc(names, cap * sizeof *names);
            if (!grown)
                abort();
            names = grown;
        }
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        names[n] = malloc(len);
        if (!names[n])
            abort();
        snprintf(names[n++], len, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, compare_names);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (!rc)
            rc = replay_file(names[i]);
        free(names[i]);
        (*files)++;
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|FOLDER...\n", argv[0]);
        return 2;
    }
    int st = fuzz_setup();
    if (st != 0)
        return st;
    int files = 0, rc = 0;
    for (int i = 1; i < argc && !rc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "fuzz_replay: %s does not exist\n", argv[i]);
            return 1;
        }
        if (S_ISDIR(sb.st_mode)) {
            rc = replay_folder(argv[i], &files);
        } else {
            rc = replay_file(argv[i]);
            files++;
        }
    }
    unsigned long long ops, bytes;
    fuzz_totals(&ops, &bytes);
    printf("fuzz_replay: %d inputs, %llu operations (%llu rounds with a write-tracking mirror, %s), %llu bytes compared "
           "with the model\n", files, ops, fuzz_tracked_rounds(), mapping_write_tracking_description(), bytes);
    if (files == 0) {
        fprintf(stderr, "fuzz_replay: no inputs\n");
        return 1;
    }
    return rc;
}
