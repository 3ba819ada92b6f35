/* SPDX-License-Identifier: MIT */
/*
 * tokenizer_pre.c - BPE pre-tokenization: the regex lists of llama.cpp's llm_tokenizer_bpe
 * (src/llama-vocab.cpp) run with PCRE2, with llama.cpp's splitting rules
 * (src/unicode.cpp, unicode_regex_split):
 *
 *   1. The text is decoded to code points leniently (invalid bytes -> U+FFFD, one each).
 *   2. Each regex of the list runs over each piece the previous ones left, on its own:
 *      a match never reaches into the next piece. Text between matches is kept as a piece
 *      of its own, so pieces always cover the whole text.
 *   3. Each final piece is re-encoded as UTF-8 and every byte mapped to the GPT-2 alphabet.
 *
 *        "Hello world"  --regex-->  "Hello" | " world"  --bytes-->  "Hello" | "Ġworld"
 *
 * llama.cpp runs the gpt2 and llama3 lists through hand-written splitters, and the rest
 * through std::regex over text whose non-ASCII code points are collapsed to one byte per
 * Unicode category. Both agree with a real regex engine with these adjustments, made in
 * the patterns below: "\s" is Unicode White_Space, which PCRE2's \s lacks U+0085 of (hence
 * [\s\x{85}]); the gpt2 list ends with "|\s+" as the hand-written splitter does; "$" means
 * the end of the piece only (PCRE2_DOLLAR_ENDONLY). Category tables are PCRE2's (the
 * Unicode version of the system library), llama.cpp's are its own; code points assigned
 * in between are the only place they can disagree.
 *
 * Code points PCRE2 refuses in UTF mode (surrogates, which lenient decoding produces from
 * ED A0..BF xx) are given to the regex as U+0001, a control character like them; the
 * words keep their real bytes. A value above U+10FFFF (lead bytes F5..F7) becomes U+FFFD
 * (llama.cpp throws there).
 *
 * Callers: tokenize.c and vocab.c. Invariants: see tokenizer_pre.h.
 */
#define PCRE2_CODE_UNIT_WIDTH 8

#include "tokenizer_pre.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unicode.h"

#define PE_PRETOK_MAX_RE 6

struct pe_pretok {
    uint32_t n_re;
    pcre2_code *re[PE_PRETOK_MAX_RE];
};

/* ---- the regex lists ---- */

/* Unicode White_Space inside a character class. */
#define WS "\\s\\x{85}"

/* llama.cpp: "'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)" */
#define RE_GPT2                                                                                    \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS       \
    "])|[" WS "]+"

/* llama.cpp: "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?
 * \p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+" (qwen2: \p{N}). */
#define RE_LLAMA3_HEAD                                                                             \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
#define RE_LLAMA3_TAIL                                                                             \
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+"
#define RE_LLAMA3 RE_LLAMA3_HEAD "\\p{N}{1,3}" RE_LLAMA3_TAIL
#define RE_QWEN2 RE_LLAMA3_HEAD "\\p{N}" RE_LLAMA3_TAIL

#define RE_PUNCT "[\\p{P}\\$\\+<=>\\^~\\|]+"
#define RE_CJK "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"

/* deepseek-llm's letter ranges (llama.cpp spells them as literal characters). */
#define RE_DS_LETTERS                                                                              \
    "[" WS "]?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"       \
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"         \
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-"         \
    "\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}"             \
    "\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-"       \
    "\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}"        \
    "\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"         \
    "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}"        \
    "\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-"       \
    "\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}"          \
    "\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}"         \
    "\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}"         \
    "\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-"        \
    "\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}"        \
    "\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"               \
    "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}"         \
    "\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+"

typedef struct pre_set {
    const char *name;
    int ignore_merges;
    int add_bos;
    const char *re[PE_PRETOK_MAX_RE]; /* NULL-terminated when shorter */
} pre_set;

static const pre_set sets[] = {
    {"default", 0, -1, {RE_PUNCT, RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
    {"gpt2", 0, -1, {RE_GPT2}},
    {"llama3", 1, 1, {RE_LLAMA3}},
    {"dbrx", 0, -1, {RE_LLAMA3}},
    {"qwen2", 0, -1, {RE_QWEN2}},
    {"deepseek-llm",
     0,
     -1,
     {"[\\r\\n]", RE_DS_LETTERS,
      "[" WS "]?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}"
      "\\x{3000}-\\x{3002}]+",
      "[" WS "]+$", RE_CJK, "\\p{N}+"}},
    {"deepseek-coder",
     0,
     -1,
     {"[\\r\\n]", "[" WS "]?\\p{L}+", "[" WS "]?\\p{P}+", RE_CJK, "\\p{N}"}},
    {"falcon", 0, -1, {RE_PUNCT, RE_GPT2, "[0-9][0-9][0-9]"}},
    {"starcoder", 0, -1, {"\\p{N}", RE_GPT2}},
};

/* tokenizer.ggml.pre names -> set (the subset of llama.cpp's table without side effects
 * this engine does not implement). */
static const struct {
    const char *pre;
    const char *set;
} aliases[] = {
    {"default", "default"},
    {"gpt2", "gpt2"},
    {"gpt-2", "gpt2"},
    {"phi-2", "gpt2"},
    {"mpt", "gpt2"},
    {"olmo", "gpt2"},
    {"jais", "gpt2"},
    {"trillion", "gpt2"},
    {"exaone4", "gpt2"},
    {"jina-es", "gpt2"},
    {"jina-de", "gpt2"},
    {"jina-v2-es", "gpt2"},
    {"jina-v2-de", "gpt2"},
    {"gigachat", "gpt2"},
    {"a.x-4.0", "gpt2"},
    {"mellum", "gpt2"},
    {"granite-docling", "gpt2"},
    {"llama3", "llama3"},
    {"llama-v3", "llama3"},
    {"llama-bpe", "llama3"},
    {"falcon3", "llama3"},
    {"falcon-h1", "llama3"},
    {"pixtral", "llama3"},
    {"midm-2.0", "llama3"},
    {"lfm2", "llama3"},
    {"dbrx", "dbrx"},
    {"smaug-bpe", "dbrx"},
    {"qwen2", "qwen2"},
    {"deepseek-r1-qwen", "qwen2"},
    {"megrez", "qwen2"},
    {"stablelm2", "qwen2"},
    {"hunyuan", "qwen2"},
    {"deepseek-llm", "deepseek-llm"},
    {"deepseek-coder", "deepseek-coder"},
    {"falcon", "falcon"},
    {"starcoder", "starcoder"},
    {"refact", "starcoder"},
    {"command-r", "starcoder"},
    {"smollm", "starcoder"},
    {"codeshell", "starcoder"},
    {"exaone", "starcoder"},
    {"minerva-7b", "starcoder"},
};

/* ---- create / destroy ---- */

static const pre_set *find_set(const char *name, size_t len)
{
    size_t i, j;
    if (!name || len == 0) return &sets[0];
    for (i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
        if (strlen(aliases[i].pre) != len || memcmp(aliases[i].pre, name, len) != 0) continue;
        for (j = 0; j < sizeof sets / sizeof sets[0]; j++)
            if (strcmp(sets[j].name, aliases[i].set) == 0) return &sets[j];
    }
    return NULL;
}

int pe_pretok_create(const char *name, size_t name_len, pe_pretok **out, pe_pretok_info *info,
                     char *err, size_t errlen)
{
    const pre_set *s = find_set(name, name_len);
    pe_pretok *p;
    uint32_t i;

    *out = NULL;
    if (!s) {
        snprintf(err, errlen,
                 "tokenizer.ggml.pre = '%.*s': unsupported pre-tokenizer (supported: default, "
                 "gpt-2 and its aliases, llama-bpe/llama3, dbrx, qwen2, deepseek-llm, "
                 "deepseek-coder, falcon, starcoder)",
                 (int)(name_len > 64 ? 64 : name_len), name);
        return -1;
    }
    p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (i = 0; i < PE_PRETOK_MAX_RE && s->re[i]; i++) {
        int ec;
        PCRE2_SIZE eo;
        p->re[i] = pcre2_compile((PCRE2_SPTR)s->re[i], PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &ec, &eo, NULL);
        if (!p->re[i]) {
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(ec, msg, sizeof msg);
            snprintf(err, errlen, "pre-tokenizer '%s': regex %u: %s at offset %zu", s->name, i,
                     (const char *)msg, (size_t)eo);
            pe_pretok_destroy(p);
            return -1;
        }
        /* JIT is an optimisation only: without it the interpreter gives the same splits. */
        (void)pcre2_jit_compile(p->re[i], PCRE2_JIT_COMPLETE);
        p->n_re = i + 1;
    }
    if (info) {
        info->name = s->name;
        info->ignore_merges = s->ignore_merges;
        info->add_bos = s->add_bos;
    }
    *out = p;
    return 0;
}

void pe_pretok_destroy(pe_pretok *p)
{
    uint32_t i;
    if (!p) return;
    for (i = 0; i < PE_PRETOK_MAX_RE; i++)
        pcre2_code_free(p->re[i]);
    free(p);
}

/* ---- split ---- */

void pe_words_deinit(pe_words *w)
{
    if (!w) return;
    free(w->buf);
    free(w->ends);
    free(w->cps);
    free(w->sub_off);
    free(w->subj);
    free(w->cuts);
    free(w->cuts2);
    memset(w, 0, sizeof *w);
}

/* Grows *p to hold n elements of size sz. Returns 0 or -1. */
static int reserve(void **p, size_t *cap, size_t n, size_t sz)
{
    size_t c = *cap ? *cap : 16;
    void *np;
    if (n <= *cap) return 0;
    while (c < n)
        c *= 2;
    if (c > SIZE_MAX / sz) return -1;
    np = realloc(*p, c * sz);
    if (!np) return -1;
    *p = np;
    *cap = c;
    return 0;
}

/* Returns the code point index whose subject offset is off (off is a character start). */
static size_t cp_at(const pe_words *w, size_t lo, size_t hi, size_t off)
{
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (w->sub_off[mid] < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Decodes text into w->cps and builds the regex subject. Returns the number of code
 * points, or (size_t)-1 on ENOMEM. */
static size_t decode(pe_words *w, const uint8_t *t, size_t len)
{
    size_t i = 0, n = 0, so = 0;
    if (reserve((void **)&w->cps, &w->cap_cps, len + 1, sizeof *w->cps)) return (size_t)-1;
    if (w->cap_cuts < len + 1) {
        /* sub_off, cuts and cuts2 each hold up to n_cps + 1 entries */
        size_t c1 = w->cap_cuts, c2 = w->cap_cuts, c3 = w->cap_cuts;
        if (reserve((void **)&w->sub_off, &c1, len + 1, sizeof *w->sub_off) ||
            reserve((void **)&w->cuts, &c2, len + 1, sizeof *w->cuts) ||
            reserve((void **)&w->cuts2, &c3, len + 1, sizeof *w->cuts2))
            return (size_t)-1;
        w->cap_cuts = c1;
    }
    /* each input byte gives at most 3 subject bytes (an invalid byte becomes U+FFFD) */
    if (reserve((void **)&w->subj, &w->cap_subj, 3 * len + 4, 1)) return (size_t)-1;
    while (i < len) {
        size_t adv;
        uint32_t cp = pe_utf8_decode(t + i, len - i, &adv);
        if (cp > 0x10ffff) cp = PE_UTF8_REPLACEMENT;
        w->cps[n] = cp;
        w->sub_off[n] = so;
        so += pe_utf8_encode((cp >= 0xd800 && cp <= 0xdfff) ? 1 : cp, w->subj + so);
        n++;
        i += adv;
    }
    w->sub_off[n] = so;
    return n;
}

/* Appends byte-encoded code points cps[a..b) as one word. Returns 0 or -1. */
static int emit_word(pe_words *w, size_t a, size_t b)
{
    size_t i;
    if (reserve((void **)&w->ends, &w->cap_ends, w->n + 1, sizeof *w->ends)) return -1;
    if (reserve((void **)&w->buf, &w->cap, w->len + 8 * (b - a), 1)) return -1;
    for (i = a; i < b; i++) {
        uint8_t u[4];
        size_t k, nb = pe_utf8_encode(w->cps[i], u);
        for (k = 0; k < nb; k++) {
            uint8_t e[4];
            size_t ne = pe_utf8_encode(pe_gpt2_byte_to_cp(u[k]), e);
            memcpy(w->buf + w->len, e, ne);
            w->len += ne;
        }
    }
    w->ends[w->n++] = w->len;
    return 0;
}

int pe_pretok_split(const pe_pretok *p, const char *text, size_t len, pe_words *w)
{
    pcre2_match_data *md = NULL;
    size_t n, n_cuts, r, i;
    int rc = -1;

    w->len = 0;
    w->n = 0;
    if (len == 0) return 0;
    n = decode(w, (const uint8_t *)text, len);
    if (n == (size_t)-1) return -1;
    md = pcre2_match_data_create(1, NULL);
    if (!md) return -1;

    w->cuts[0] = 0;
    w->cuts[1] = n;
    n_cuts = 2;
    for (r = 0; r < p->n_re; r++) {
        size_t m = 0;
        w->cuts2[m++] = 0;
        for (i = 0; i + 1 < n_cuts; i++) {
            size_t a = w->cuts[i], b = w->cuts[i + 1];
            size_t base = w->sub_off[a], plen = w->sub_off[b] - base, start = 0;
            const uint8_t *subj = w->subj + base;
            while (start < plen) {
                PCRE2_SIZE *ov;
                size_t ms, me, c;
                int mrc = pcre2_match(p->re[r], subj, plen, start, PCRE2_NO_UTF_CHECK, md, NULL);
                if (mrc == PCRE2_ERROR_NOMATCH) break;
                if (mrc < 0) {
                    rc = -2;
                    goto out;
                }
                ov = pcre2_get_ovector_pointer(md);
                ms = ov[0];
                me = ov[1];
                c = cp_at(w, a, b, base + ms);
                if (c > w->cuts2[m - 1]) w->cuts2[m++] = c;
                if (me == ms) {
                    /* An empty match: step over one character (none of the lists has one). */
                    if (c >= b) break;
                    start = w->sub_off[c + 1] - base;
                    continue;
                }
                c = cp_at(w, a, b, base + me);
                if (c > w->cuts2[m - 1]) w->cuts2[m++] = c;
                start = me;
            }
            if (b > w->cuts2[m - 1]) w->cuts2[m++] = b;
        }
        {
            size_t *t = w->cuts;
            w->cuts = w->cuts2;
            w->cuts2 = t;
        }
        n_cuts = m;
    }
    for (i = 0; i + 1 < n_cuts; i++)
        if (emit_word(w, w->cuts[i], w->cuts[i + 1])) goto out;
    rc = 0;
out:
    pcre2_match_data_free(md);
    return rc;
}
