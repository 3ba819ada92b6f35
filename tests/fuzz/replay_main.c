/* SPDX-License-Identifier: MIT */
/*
 * replay_main.c - runs a libFuzzer target (LLVMFuzzerTestOneInput) over corpus files
 * without libFuzzer (SQLite fuzzcheck style), so every fuzz target's corpus is a
 * regression test in ctest under any compiler and sanitizer.
 *
 *     fuzz_<target>_replay PATH...     each PATH is a file, or a directory whose regular
 *                                      files are all run (not recursively)
 *
 * Exits 0 when every input ran (a crash aborts the process), 1 when a path is unreadable.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Runs one file; returns 0 or -1 (unreadable). */
static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;

    if (!f) {
        perror(path);
        return -1;
    }
    for (;;) {
        size_t n;
        if (len == cap) {
            uint8_t *nb;
            cap = cap ? cap * 2 : 4096;
            nb = realloc(buf, cap);
            if (!nb) {
                fprintf(stderr, "%s: out of memory\n", path);
                rc = -1;
                break;
            }
            buf = nb;
        }
        n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) break;
    }
    if (ferror(f)) {
        perror(path);
        rc = -1;
    }
    fclose(f);
    if (rc == 0) {
        /* An exactly-sized copy, so ASan sees any read past the input's end. */
        uint8_t *exact = malloc(len ? len : 1);
        if (!exact) {
            free(buf);
            return -1;
        }
        if (len) memcpy(exact, buf, len);
        LLVMFuzzerTestOneInput(exact, len);
        free(exact);
    }
    free(buf);
    return rc;
}

int main(int argc, char **argv)
{
    int n_run = 0, failed = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        DIR *d;
        struct dirent *e;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            failed = 1;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            failed |= run_file(argv[i]) != 0;
            n_run++;
            continue;
        }
        d = opendir(argv[i]);
        if (!d) {
            perror(argv[i]);
            failed = 1;
            continue;
        }
        for (e = readdir(d); e; e = readdir(d)) {
            char path[4096];
            struct stat fst;
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            if (stat(path, &fst) != 0 || !S_ISREG(fst.st_mode)) continue;
            failed |= run_file(path) != 0;
            n_run++;
        }
        closedir(d);
    }
    printf("%d inputs run%s\n", n_run, failed ? ", some unreadable" : "");
    return failed || n_run == 0 ? 1 : 0;
}
