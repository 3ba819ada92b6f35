/* SPDX-License-Identifier: MIT */
/*
 * tier.c - `pagoda tier inspect DIR` and `pagoda tier clear DIR`: look after a disk tier's
 * directory (the --tier disk:DIR:SIZE of run and serve) with the library's
 * pgd_tier_disk_inspect and pgd_tier_disk_clear. inspect groups the records by identity
 * (model fingerprint, KV type, geometry), verifies every checksum and exits 1 when a
 * record is damaged; clear removes records, temp files and quarantined records and keeps
 * the hash key, refusing while another process holds the directory's lock.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "pagoda/tier.h"

static void usage(FILE *f, const char *cmd)
{
    fprintf(f,
            "usage: %s inspect DIR\n"
            "       %s clear DIR\n"
            "\n"
            "Looks after the directory of a disk tier (--tier disk:DIR:SIZE of pagoda run and\n"
            "pagoda serve).\n"
            "\n"
            "  inspect DIR   lists the records by identity (model fingerprint, KV type, page\n"
            "                geometry; records and bytes of each), reads every record whole\n"
            "                and verifies its checksum, then counts the files: ok, damaged,\n"
            "                foreign (an identity other than the one the directory was last\n"
            "                opened with: ignored, never served), temp (being written, or\n"
            "                cut short by a crash: removed at the next start) and\n"
            "                quarantined (damaged records moved to DIR/quarantine/). Damaged\n"
            "                files are named. It takes no lock and changes nothing, so a\n"
            "                running server's directory can be inspected. Exit status 1\n"
            "                when a record is damaged or DIR is not a disk tier directory.\n"
            "  clear DIR     removes every record, temp file and quarantined record and\n"
            "                DIR/ident, keeping the hash key (DIR/key), so records written\n"
            "                later match as before. Refuses (exit status 1) while a process\n"
            "                has the directory open.\n"
            "\n"
            "Layout: DIR/LOCK, DIR/key (0600), DIR/ident, DIR/records/XX/<hash>.rec,\n"
            "DIR/quarantine/<hash>.rec.\n"
            "\n"
            "options:\n"
            "  -h, --help   show this help\n",
            cmd, cmd);
}

/* ---- inspect ---- */

typedef struct ident_row {
    pgd_record_ident ident;
    uint64_t n_records, n_bytes;
    int foreign;
} ident_row;

typedef struct inspect_state {
    ident_row *rows;
    size_t n_rows, cap_rows;
    uint64_t n_kind[5];
    int oom;
} inspect_state;

static void on_file(void *ud, const pgd_tier_disk_file *f)
{
    inspect_state *st = ud;
    if (f->kind >= 0 && f->kind < 5) st->n_kind[f->kind]++;
    if (f->kind == PGD_TIER_DISK_DAMAGED) printf("damaged: %s\n", f->path);
    if (!f->has_info) return;
    size_t i = 0;
    while (i < st->n_rows && !pgd_record_ident_eq(&st->rows[i].ident, &f->info.ident))
        i++;
    if (i == st->n_rows) {
        if (st->n_rows == st->cap_rows) {
            size_t cap = st->cap_rows ? 2 * st->cap_rows : 8;
            ident_row *r = realloc(st->rows, cap * sizeof *r);
            if (!r) {
                st->oom = 1;
                return;
            }
            st->rows = r;
            st->cap_rows = cap;
        }
        memset(&st->rows[i], 0, sizeof st->rows[i]);
        st->rows[i].ident = f->info.ident;
        st->rows[i].foreign = f->kind == PGD_TIER_DISK_FOREIGN;
        st->n_rows++;
    }
    st->rows[i].n_records++;
    st->rows[i].n_bytes += f->file_bytes;
}

static const char *flags_name(uint32_t flags)
{
    static const char *const names[4] = {"-", "rotated", "key-bounds", "rotated,key-bounds"};
    return names[flags & 3];
}

static const char *kv_name(uint32_t t)
{
    const char *n = pgd_kv_type_name((pgd_kv_type)t);
    return n ? n : "?";
}

static int do_inspect(const char *cmd, const char *dir)
{
    inspect_state st;
    pgd_record_ident bound;
    struct stat sb;
    char path[4096], hex[33];

    memset(&st, 0, sizeof st);
    int rc = pgd_tier_disk_inspect(dir, on_file, &st, &bound);
    if (rc == PGD_ENOTFOUND) {
        fprintf(stderr, "%s: %s: not a disk tier directory (no key, no records/)\n", cmd, dir);
        return CLI_EXIT_FAIL;
    }
    if (rc < 0) {
        fprintf(stderr, "%s: %s: not a readable directory\n", cmd, dir);
        return CLI_EXIT_FAIL;
    }
    printf("directory: %s\n", dir);
    snprintf(path, sizeof path, "%s/key", dir);
    if (stat(path, &sb) == 0)
        printf("key: present (mode %04o)\n", (unsigned)(sb.st_mode & 07777));
    else
        printf("key: absent\n");
    if (rc == 1) {
        pgd_hash_hex(bound.model_fingerprint, hex);
        printf("identity opened last: model %s, kv %s, layers %" PRIu32 ", kv heads %" PRIu32
               ", head_dim %" PRIu32 ", page tokens %" PRIu32 ", %s\n",
               hex, kv_name(bound.kv_type), bound.n_layers, bound.n_kv_heads, bound.head_dim,
               bound.page_tokens, flags_name(bound.flags));
    }
    if (st.n_rows) {
        printf("%-32s  %-5s %6s %8s %8s %11s  %-18s %9s %14s  %s\n", "model", "kv", "layers",
               "kv_heads", "head_dim", "page_tokens", "flags", "records", "bytes", "state");
        for (size_t i = 0; i < st.n_rows; i++) {
            const ident_row *r = &st.rows[i];
            pgd_hash_hex(r->ident.model_fingerprint, hex);
            printf("%-32s  %-5s %6" PRIu32 " %8" PRIu32 " %8" PRIu32 " %11" PRIu32
                   "  %-18s %9" PRIu64 " %14" PRIu64 "  %s\n",
                   hex, kv_name(r->ident.kv_type), r->ident.n_layers, r->ident.n_kv_heads,
                   r->ident.head_dim, r->ident.page_tokens, flags_name(r->ident.flags),
                   r->n_records, r->n_bytes, r->foreign ? "foreign" : "ok");
        }
    }
    printf("files: ok %" PRIu64 ", damaged %" PRIu64 ", foreign %" PRIu64 ", temp %" PRIu64
           ", quarantined %" PRIu64 "\n",
           st.n_kind[PGD_TIER_DISK_OK], st.n_kind[PGD_TIER_DISK_DAMAGED],
           st.n_kind[PGD_TIER_DISK_FOREIGN], st.n_kind[PGD_TIER_DISK_TEMP],
           st.n_kind[PGD_TIER_DISK_QUARANTINED]);
    free(st.rows);
    if (st.oom) {
        fprintf(stderr, "%s: out of memory\n", cmd);
        return CLI_EXIT_FAIL;
    }
    return st.n_kind[PGD_TIER_DISK_DAMAGED] ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}

/* ---- clear ---- */

static void log_stderr(void *ud, int level, const char *msg)
{
    (void)level;
    fprintf(stderr, "%s: %s\n", (const char *)ud, msg);
}

static int do_clear(const char *cmd, const char *dir)
{
    uint64_t n = 0;
    int rc = pgd_tier_disk_clear(dir, log_stderr, (void *)cmd, &n);
    if (rc == PGD_EBUSY) {
        fprintf(stderr, "%s: %s: nothing removed; stop the process that uses it first\n", cmd, dir);
        return CLI_EXIT_FAIL;
    }
    if (rc != PGD_OK) {
        /* The library's log line said why (not a directory, not a tier's, an I/O error). */
        if (rc == PGD_EINVAL) fprintf(stderr, "%s: %s: %s\n", cmd, dir, pgd_strerror(rc));
        return CLI_EXIT_FAIL;
    }
    printf("removed %" PRIu64 " files from %s (the key is kept)\n", n, dir);
    return CLI_EXIT_OK;
}

int cmd_tier(int argc, char **argv)
{
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    const char *cmd = argv[0];
    char sub_cmd[64];

    optind = 1;
    for (;;) {
        int opt = getopt_long(argc, argv, "+h", opts, NULL);
        if (opt == -1) break;
        if (opt == 'h') {
            usage(stdout, cmd);
            return CLI_EXIT_OK;
        }
        return cli_usage_error(cmd);
    }
    if (optind >= argc) {
        fprintf(stderr, "%s: missing subcommand: inspect or clear\n", cmd);
        return cli_usage_error(cmd);
    }
    const char *sub = argv[optind++];
    int inspect = strcmp(sub, "inspect") == 0;
    if (!inspect && strcmp(sub, "clear") != 0) {
        fprintf(stderr, "%s: unknown subcommand '%s': inspect or clear\n", cmd, sub);
        return cli_usage_error(cmd);
    }
    snprintf(sub_cmd, sizeof sub_cmd, "%s %s", cmd, sub);
    for (int i = optind; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout, cmd);
            return CLI_EXIT_OK;
        }
    }
    for (int i = optind; i < argc; i++) {
        if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "%s: unknown option '%s'\n", sub_cmd, argv[i]);
            return cli_usage_error(cmd);
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "%s: missing DIR\n", sub_cmd);
        return cli_usage_error(cmd);
    }
    if (optind + 1 < argc) return cli_unexpected_arg(cmd, argv[optind + 1]);
    return inspect ? do_inspect(sub_cmd, argv[optind]) : do_clear(sub_cmd, argv[optind]);
}
