/* SPDX-License-Identifier: MIT */
/*
 * admin.c - the cache admin API under /v1/cache/ (issue 13): pin, unpin, prefetch, evict
 * and stats, on the chain of block hashes of a prompt. Caller: routes.c's dispatch, on
 * the request's connection thread, after the API key check every /v1/ route has.
 *
 *   POST /v1/cache/pin       pgd_cache_pin: the chain's cached pages stay until unpinned
 *                            (or "ttl_s" seconds); past the pin share a 400
 *   POST /v1/cache/unpin     pgd_cache_unpin: every pin of the chain's pages (requests'
 *                            pins too)
 *   POST /v1/cache/prefetch  pgd_cache_warm: the pages the tiers hold, after the pool's
 *                            prefix, are promoted into the pool (waits for the fills)
 *   POST /v1/cache/evict     pgd_cache_evict_chain: the chain's pages leave the pool,
 *                            deepest first (tiers keep their copies)
 *   GET|POST /v1/cache/stats the cache's figures, each tier's, each tenant's (hashed id,
 *                            never the salt); with a prompt, how much of it the pool holds
 *
 * Bodies (api.h ps_admin_parse): {"prompt": "text" | [ids]} or {"tokens": [ids]} or
 * {"messages": [...]} (rendered with the chat template as a chat request would be, so
 * the chain is the one that request registers), plus "cache_salt" (the tenant; absent:
 * the default) and, for pin, "ttl_s". The chain is the prompt's full pages: a prompt
 * shorter than a page addresses nothing (400). Answers: {"object": "cache.<op>",
 * "blocks": chain length, "pages": pages affected, "tokens": pages x page_tokens}.
 *
 * Invariants: only the conn is touched besides the cache (its own lock) and the tiers'
 * stats (thread-safe), so no server lock is taken.
 */
#include <stdio.h>
#include <stdlib.h>

#include "server_int.h"

/* The op's name as the answer's "object" says it. */
static const char *op_name(route rt)
{
    switch (rt) {
    case R_CACHE_PIN:
        return "pin";
    case R_CACHE_UNPIN:
        return "unpin";
    case R_CACHE_PREFETCH:
        return "prefetch";
    case R_CACHE_EVICT:
        return "evict";
    default:
        return "stats";
    }
}

/* The tenants as [{"id", "reserved_pages", "pages", "pages_pinned", "hit_pages",
 * "hit_tokens", "query_pages", "evictions", "evictions_by_others"}]. */
static json_t *tenants_json(pgd_cache *c)
{
    json_t *a = json_array();
    uint32_t n = pgd_cache_n_tenants(c);
    for (uint32_t i = 0; a && i < n; i++) {
        pgd_tenant_stats ts;
        char id[24];
        if (pgd_cache_get_tenant_stats(c, i, &ts) != PGD_OK) continue;
        snprintf(id, sizeof id, "%016llx", (unsigned long long)ts.id);
        json_t *t = json_pack(
            "{s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "id", id, "reserved_pages",
            (json_int_t)ts.reserved_pages, "pages", (json_int_t)ts.pages_held, "pages_pinned",
            (json_int_t)ts.pages_pinned, "hit_pages", (json_int_t)ts.hit_pages, "hit_tokens",
            (json_int_t)ts.hit_tokens, "query_pages", (json_int_t)ts.query_pages, "evictions",
            (json_int_t)ts.evictions, "evictions_by_others", (json_int_t)ts.evictions_by_others);
        if (!t || json_array_append_new(a, t)) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

/* The tiers as [{"tier": label, "records", "bytes_used", "bytes_capacity"}]. */
static json_t *tiers_json(ps_server *srv)
{
    json_t *a = json_array();
    for (uint32_t i = 0; a && i < srv->info.n_tiers; i++) {
        pgd_tier_stats ts;
        pgd_tier_get_stats(pgd_cache_tier(srv->cache, i), &ts);
        json_t *t = json_pack("{s:s,s:I,s:I,s:I}", "tier", srv->info.tier_labels[i], "records",
                              (json_int_t)ts.n_records, "bytes_used", (json_int_t)ts.bytes_used,
                              "bytes_capacity", (json_int_t)ts.bytes_capacity);
        if (!t || json_array_append_new(a, t)) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

static json_t *stats_json(ps_server *srv)
{
    pgd_cache_stats cs;
    pgd_cache_get_stats(srv->cache, &cs);
    json_t *pool = json_pack(
        "{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "pages_total", (json_int_t)cs.n_pages_total,
        "pages_free", (json_int_t)cs.n_pages_free, "pages_used", (json_int_t)cs.n_pages_used,
        "pages_cached", (json_int_t)cs.n_pages_cached, "pages_evictable",
        (json_int_t)cs.n_pages_evictable, "query_tokens", (json_int_t)cs.n_query_tokens,
        "hit_tokens", (json_int_t)cs.n_hit_tokens, "evictions", (json_int_t)cs.n_evictions,
        "hints_waiting", (json_int_t)pgd_cache_n_hints(srv->cache));
    return json_pack("{s:s,s:I,s:o,s:o,s:o}", "object", "cache.stats", "page_tokens",
                     (json_int_t)srv->info.page_tokens, "pool", pool, "tiers", tiers_json(srv),
                     "tenants", tenants_json(srv->cache));
}

enum MHD_Result ps__handle_cache(conn *k)
{
    ps_server *srv = k->srv;
    pgd_cache *c = srv->cache;
    uint32_t pt = pgd_cache_page_tokens(c);
    int is_stats = k->rt == R_CACHE_STATS;
    ps_req r;
    ps_error e;
    int32_t *toks = NULL;
    pgd_hash *h = NULL;
    size_t n = 0, nh = 0;
    int rc;

    if (ps_admin_parse(k->body.data ? k->body.data : "", k->body.len,
                       pe_model_hparams(srv->m)->n_vocab, srv->info.n_ctx, !is_stats,
                       k->rt == R_CACHE_PIN, &r, &e))
        return ps__send_error(k, &e, 0);
    int has_prompt = r.prompt || r.prompt_toks || r.msgs;
    if (r.model && !model_ok(srv, r.model)) {
        ps_err(&e, 404, "model", "model_not_found", "the model '%s' does not exist", r.model);
        goto error;
    }
    if (has_prompt) {
        k->kind = r.kind;
        if (ps__build_prompt(k, &r, &toks, &n, &e)) goto error;
        nh = n / pt;
        if (!nh && !is_stats) {
            ps_err(&e, 400,
                   r.kind == PS_CHAT ? "messages"
                   : r.prompt_toks   ? "tokens"
                                     : "prompt",
                   NULL,
                   "the prompt has %zu tokens, less than a page (%u): it addresses no cached "
                   "block",
                   n, pt);
            goto error;
        }
        h = malloc((nh ? nh : 1) * sizeof *h);
        if (!h) {
            ps_err_status(&e, PS_AT_REQUEST, PGD_ENOMEM, NULL);
            goto error;
        }
        nh = pgd_cache_hash_tokens(c, r.salt, r.salt_len, toks, n, h, nh);
    }
    if (is_stats) {
        json_t *o = stats_json(srv);
        if (o && has_prompt)
            json_object_set_new(o, "prompt",
                                json_pack("{s:I,s:I,s:I}", "tokens", (json_int_t)n, "blocks",
                                          (json_int_t)nh, "pool_pages",
                                          (json_int_t)pgd_cache_lookup(c, h, nh)));
        free(toks);
        free(h);
        ps_req_deinit(&r);
        return ps__send_obj(k, 200, o);
    }
    switch (k->rt) {
    case R_CACHE_PIN:
        rc = pgd_cache_pin(c, h, nh, (uint64_t)(r.ttl_s_admin * 1000.0));
        break;
    case R_CACHE_UNPIN:
        rc = pgd_cache_unpin(c, h, nh);
        break;
    case R_CACHE_PREFETCH:
        rc = pgd_cache_warm(c, r.salt, r.salt_len, h, nh);
        break;
    default:
        rc = pgd_cache_evict_chain(c, h, nh);
        break;
    }
    if (rc == PGD_ENOSPC) {
        ps__pin_share_error(srv, nh, NULL, &e);
        goto error;
    }
    if (rc < 0) {
        ps_err(&e, rc == PGD_ENOMEM ? 500 : 400, NULL, NULL, "cache %s failed: %s", op_name(k->rt),
               pgd_strerror(rc));
        goto error;
    }
    char object[32];
    snprintf(object, sizeof object, "cache.%s", op_name(k->rt));
    json_t *o =
        json_pack("{s:s,s:I,s:I,s:I,s:I}", "object", object, "prompt_tokens", (json_int_t)n,
                  "blocks", (json_int_t)nh, "pages", (json_int_t)rc, "tokens", (json_int_t)rc * pt);
    if (o && k->rt == R_CACHE_PIN)
        json_object_set_new(o, "ttl_s",
                            r.ttl_s_admin <= 0 ? json_null()
                            : r.ttl_s_admin == (double)(json_int_t)r.ttl_s_admin
                                ? json_integer((json_int_t)r.ttl_s_admin)
                                : json_real(r.ttl_s_admin));
    free(toks);
    free(h);
    ps_req_deinit(&r);
    return ps__send_obj(k, 200, o);

error:
    free(toks);
    free(h);
    ps_req_deinit(&r);
    return ps__send_error(k, &e, 0);
}
