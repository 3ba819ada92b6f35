/* SPDX-License-Identifier: MIT */
/*
 * proc.h - what the tests that drive the real `pagoda` binary share (tests/engine/
 * test_{run,eval,synth}_cli.c, tests/integration/test_{replay,bench}_cli.c), and the model
 * lookup of every test that needs a model file:
 *   t_sh         runs a shell command line, stdout captured, with a deadline
 *   t_run_bin    runs `BIN ARGS` with stdout and stderr captured (stderr through a file)
 *   t_slurp, t_read_all, t_write_all, t_is_file, t_scratch_dir   files
 *   t_cli_args   the CLI tests' command line: the binary and the scratch directory
 *   t_models_dir, t_model_file   where the model files are
 * Static inline functions in a header, like t.h: each test program is one translation unit
 * and uses only some of them.
 *
 * Models: $PGD_MODELS_DIR when set and not empty, else ../shared/models beside the source
 * tree (PGD_SOURCE_DIR, which the test's CMakeLists.txt defines). PGD_MODELS_DIR naming an
 * empty directory means "no model": each test that needs one then exits 77 (ctest:
 * skipped) with a message on stderr, which is how the skip paths are tested.
 */
#ifndef PGD_TESTS_PROC_H
#define PGD_TESTS_PROC_H

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* How long one command may run before t_sh kills it (and everything it started). */
#ifndef T_PROC_TIMEOUT_S
#define T_PROC_TIMEOUT_S 600
#endif

static inline double t_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Runs `sh -c cmd` in a process group of its own, its stdout into out (NUL-terminated;
 * output past out_size - 1 bytes is read and dropped, so the command never blocks on a full
 * pipe). After T_PROC_TIMEOUT_S seconds the whole group is killed. Returns the exit status;
 * -1 when the command could not be started, died of a signal or timed out (with a message
 * on stderr for the last two). */
static inline int t_sh(const char *cmd, char *out, size_t out_size)
{
    int fd[2], st = 0;
    size_t got = 0;
    double deadline = t_now_s() + T_PROC_TIMEOUT_S;
    pid_t pid;

    out[0] = '\0';
    fflush(NULL);
    if (pipe(fd) != 0) return -1;
    pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        dup2(fd[1], STDOUT_FILENO);
        close(fd[0]);
        close(fd[1]);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid); /* also here: the child may not have run yet when we kill it */
    close(fd[1]);
    for (;;) {
        struct pollfd p = {fd[0], POLLIN, 0};
        int left_ms = (int)((deadline - t_now_s()) * 1000);
        char drop[4096];
        ssize_t n;
        if (left_ms <= 0) break;
        if (poll(&p, 1, left_ms) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (!p.revents) continue;
        if (got + 1 < out_size) {
            n = read(fd[0], out + got, out_size - 1 - got);
            if (n > 0) got += (size_t)n;
        } else {
            n = read(fd[0], drop, sizeof drop);
        }
        if (n == 0 || (n < 0 && errno != EINTR)) break;
    }
    out[got] = '\0';
    close(fd[0]);
    for (;;) { /* stdout is closed: wait for the exit, up to the same deadline */
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) return -1;
        if (t_now_s() >= deadline) {
            fprintf(stderr, "timed out after %d s, killed: %s\n", T_PROC_TIMEOUT_S, cmd);
            kill(-pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        usleep(2000);
    }
    if (WIFSIGNALED(st)) {
        fprintf(stderr, "killed by signal %d: %s\n", WTERMSIG(st), cmd);
        return -1;
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Reads up to size - 1 bytes of path into buf, NUL-terminated; "" when unreadable. */
static inline void t_slurp(const char *path, char *buf, size_t size)
{
    FILE *f = fopen(path, "rb");
    size_t n = 0;
    if (f) {
        n = fread(buf, 1, size - 1, f);
        fclose(f);
    }
    buf[n] = '\0';
}

/* Runs `'bin' args` through sh (args may hold quotes, pipes and redirections) with its
 * stdout into out and its stderr into err, through the file dir/stderr.txt; both are
 * NUL-terminated and cut to their size. Returns what t_sh returns. */
static inline int t_run_bin(const char *bin, const char *dir, const char *args, char *out,
                            size_t out_size, char *err, size_t err_size)
{
    char cmd[8192], errpath[1024];
    int st;
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", dir);
    snprintf(cmd, sizeof cmd, "'%s' %s 2>'%s'", bin, args, errpath);
    st = t_sh(cmd, out, out_size);
    t_slurp(errpath, err, err_size);
    return st;
}

/* The whole of path, NUL-terminated past *size bytes; NULL when unreadable. Caller frees. */
static inline uint8_t *t_read_all(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf;
    long n;
    if (!f) return NULL;
    n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return NULL;
    }
    buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (!buf) return NULL;
    buf[n] = '\0';
    *size = (size_t)n;
    return buf;
}

/* Writes n bytes to path (created or truncated). Returns 0, or -1 on any error. */
static inline int t_write_all(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    if (fwrite(buf, 1, n, f) != n) {
        fclose(f);
        return -1;
    }
    return fclose(f) == 0 ? 0 : -1;
}

/* 1 when path is a regular file, else 0. */
static inline int t_is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Creates the scratch directory dir (it may exist). Returns 0, or -1 with a message. */
static inline int t_scratch_dir(const char *dir)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "cannot create %s: %s\n", dir, strerror(errno));
        return -1;
    }
    return 0;
}

/* The command line of a test that drives the CLI: argv[1] the pagoda binary, argv[2] a
 * scratch directory (created here), then one optional argument when opt names it (NULL:
 * none). Returns 0; or 2 after a usage line, 1 when the directory cannot be created, which
 * main() returns. */
static inline int t_cli_args(int argc, char **argv, const char *opt, const char **bin,
                             const char **dir)
{
    if (argc != 3 && !(opt && argc == 4)) {
        fprintf(stderr, "usage: %s PAGODA_BINARY SCRATCH_DIR%s%s%s\n", argv[0], opt ? " [" : "",
                opt ? opt : "", opt ? "]" : "");
        return 2;
    }
    *bin = argv[1];
    *dir = argv[2];
    return t_scratch_dir(*dir) != 0 ? 1 : 0;
}

#ifdef PGD_SOURCE_DIR
/* The models directory: $PGD_MODELS_DIR, else ../shared/models beside the source tree. */
static inline const char *t_models_dir(void)
{
    const char *d = getenv("PGD_MODELS_DIR");
    return d && *d ? d : PGD_SOURCE_DIR "/../shared/models";
}

/* Writes t_models_dir()/name into buf. Returns 1 when that is a regular file, else 0. */
static inline int t_model_file(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s", t_models_dir(), name);
    return t_is_file(buf);
}
#endif

#endif /* PGD_TESTS_PROC_H */
