/* SPDX-License-Identifier: MIT */
/*
 * loadgen_spawn.c - the servers `pagoda bench -m` starts: `pagoda serve` (this very
 * executable, /proc/self/exe) on 127.0.0.1 with an ephemeral port, its output in an
 * unlinked temporary file, its URL read from its ready line; stopped with SIGTERM.
 * Callers: loadgen.c (lg_server_start, lg_server_stop).
 *
 * Invariants: a started server dies with the bench (PR_SET_PDEATHSIG); the child calls
 * only async-signal-safe functions between fork and exec; lg_server_stop always reaps
 * the child (SIGKILL after STOP_TIMEOUT_S) and closes the log, so nothing is left behind.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "loadgen.h"

#define START_TIMEOUT_S 300.0 /* a multi-GB model may take a while to map and warm */
#define STOP_TIMEOUT_S 20.0

static void sleep_s(double s)
{
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    nanosleep(&ts, NULL);
}

/* Prints the last lines of the server's output, indented, on stderr. */
static void print_log_tail(const lg_server *sv)
{
    char text[4096];
    struct stat st;
    off_t from = 0;
    ssize_t n;
    const char *p;
    int lines = 0;

    if (sv->log_fd < 0 || fstat(sv->log_fd, &st) != 0) return;
    if (st.st_size > (off_t)sizeof text - 1) from = st.st_size - (off_t)(sizeof text - 1);
    n = pread(sv->log_fd, text, sizeof text - 1, from);
    if (n <= 0) {
        fprintf(stderr, "  (the server wrote nothing)\n");
        return;
    }
    text[n] = '\0';
    /* Keep the last 20 lines. */
    p = text + n;
    while (p > text && lines <= 20) {
        p--;
        if (*p == '\n' && p + 1 < text + n) lines++;
    }
    if (*p == '\n') p++;
    fprintf(stderr, "  --- the server's output (last lines) ---\n");
    while (*p) {
        const char *nl = strchr(p, '\n');
        int len = nl ? (int)(nl - p) : (int)strlen(p);
        fprintf(stderr, "  | %.*s\n", len, p);
        p += len + (nl ? 1 : 0);
    }
}

/* Finds "listening on http://HOST:PORT\n" in the server's output so far. 1: found. */
static int find_ready(lg_server *sv)
{
    char text[16384];
    ssize_t n = pread(sv->log_fd, text, sizeof text - 1, 0);
    const char *p, *e;

    if (n <= 0) return 0;
    text[n] = '\0';
    p = strstr(text, "listening on http://");
    if (!p) return 0;
    p += strlen("listening on ");
    e = p;
    while (*e && *e != '\n' && *e != '\r' && *e != ' ')
        e++;
    if (*e == '\0' || e - p >= (ptrdiff_t)sizeof sv->url) return 0; /* the line is not whole yet */
    memcpy(sv->url, p, (size_t)(e - p));
    sv->url[e - p] = '\0';
    while (e > p && sv->url[e - p - 1] == '/') {
        sv->url[e - p - 1] = '\0';
        e--;
    }
    return 1;
}

/* Starts `pagoda serve -m MODEL --host 127.0.0.1 --port 0 [passed flags]
 * [--no-prefix-cache]` and waits for its ready line. Returns 0, or -1 after printing why
 * (with the server's last output lines). */
int lg_server_start(const lg_opts *o, int prefix_cache, lg_server *sv)
{
    const char **argv = calloc((size_t)o->n_serve_args + 16, sizeof *argv);
    char tmpl[] = "/tmp/pagoda-bench-XXXXXX";
    double deadline;
    int n = 0, st;

    memset(sv, 0, sizeof *sv);
    sv->log_fd = -1;
    if (!argv) {
        fprintf(stderr, "%s: out of memory\n", o->cmd);
        return -1;
    }
    argv[n++] = "pagoda";
    argv[n++] = "serve";
    argv[n++] = "-m";
    argv[n++] = o->model_path;
    argv[n++] = "--host";
    argv[n++] = "127.0.0.1";
    argv[n++] = "--port";
    argv[n++] = "0";
    if (o->api_key) {
        argv[n++] = "--api-key";
        argv[n++] = o->api_key;
    }
    for (int i = 0; i < o->n_serve_args; i++)
        argv[n++] = o->serve_args[i];
    if (!prefix_cache) argv[n++] = "--no-prefix-cache";
    argv[n] = NULL;

    sv->log_fd = mkstemp(tmpl);
    if (sv->log_fd < 0) {
        fprintf(stderr, "%s: cannot create a log file in /tmp: %s\n", o->cmd, strerror(errno));
        free(argv);
        return -1;
    }
    unlink(tmpl);
    fflush(NULL);
    sv->pid = fork();
    if (sv->pid < 0) {
        fprintf(stderr, "%s: fork: %s\n", o->cmd, strerror(errno));
        sv->pid = 0;
        free(argv);
        return -1;
    }
    if (sv->pid == 0) {
        /* The child: only async-signal-safe calls until exec. The server dies with us. */
        int devnull = open("/dev/null", O_RDONLY);
        static const char msg[] = "pagoda bench: cannot exec /proc/self/exe\n";
        if (devnull >= 0) dup2(devnull, 0);
        dup2(sv->log_fd, 1);
        dup2(sv->log_fd, 2);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        execv("/proc/self/exe", (char *const *)argv);
        if (write(2, msg, sizeof msg - 1) < 0) _exit(127);
        _exit(127);
    }
    free(argv);

    deadline = cli_now_s() + START_TIMEOUT_S;
    for (;;) {
        if (find_ready(sv)) return 0;
        if (waitpid(sv->pid, &st, WNOHANG) == sv->pid) {
            sv->pid = 0;
            if (WIFEXITED(st)) {
                fprintf(stderr, "%s: pagoda serve exited with status %d before it was ready\n",
                        o->cmd, WEXITSTATUS(st));
            } else {
                fprintf(stderr, "%s: pagoda serve died of signal %d before it was ready\n", o->cmd,
                        WIFSIGNALED(st) ? WTERMSIG(st) : 0);
            }
            print_log_tail(sv);
            return -1;
        }
        if (cli_now_s() > deadline) {
            fprintf(stderr, "%s: pagoda serve printed no ready line in %.0f s\n", o->cmd,
                    START_TIMEOUT_S);
            print_log_tail(sv);
            return -1;
        }
        sleep_s(0.02);
    }
}

/* Stops the server (SIGTERM, then SIGKILL after STOP_TIMEOUT_S). Returns 0 when it was
 * running and exited with status 0, -1 (after a message and its last output) otherwise. */
int lg_server_stop(const lg_opts *o, lg_server *sv)
{
    double deadline = cli_now_s() + STOP_TIMEOUT_S;
    int st = 0, rc = 0;
    pid_t w = 0;

    if (sv->pid > 0) {
        kill(sv->pid, SIGTERM);
        for (;;) {
            w = waitpid(sv->pid, &st, WNOHANG);
            if (w != 0 || cli_now_s() > deadline) break;
            sleep_s(0.01);
        }
        if (w == 0) {
            fprintf(stderr, "%s: pagoda serve did not stop in %.0f s after SIGTERM; killed\n",
                    o->cmd, STOP_TIMEOUT_S);
            kill(sv->pid, SIGKILL);
            waitpid(sv->pid, &st, 0);
            rc = -1;
        } else if (w < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            if (w > 0 && WIFSIGNALED(st)) {
                fprintf(stderr, "%s: pagoda serve died of signal %d\n", o->cmd, WTERMSIG(st));
            } else {
                fprintf(stderr, "%s: pagoda serve exited with status %d on SIGTERM\n", o->cmd,
                        w > 0 ? WEXITSTATUS(st) : -1);
            }
            rc = -1;
        }
        if (rc != 0) print_log_tail(sv);
        sv->pid = 0;
    }
    if (sv->log_fd >= 0) close(sv->log_fd);
    sv->log_fd = -1;
    return rc;
}
