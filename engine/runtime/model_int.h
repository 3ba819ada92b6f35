/* SPDX-License-Identifier: MIT */
/*
 * model_int.h - declarations shared by the files of engine/runtime only (weights.c,
 * forward.c): never included from outside this folder. Clients use model.h.
 */
#ifndef PE_MODEL_INT_H
#define PE_MODEL_INT_H

#include <stddef.h>

#include "model.h"

typedef struct pe_layer {
    const float *attn_norm; /* [n_embd] */
    const float *ffn_norm;  /* [n_embd] */
    pe_mat wq, wk, wv, wo;  /* q: n_embd -> n_head*hd; k,v: n_embd -> n_head_kv*hd */
    pe_mat w_gate, w_up;    /* n_embd -> n_ff */
    pe_mat w_down;          /* n_ff -> n_embd */
    /* qwen2: biases added after the Q, K, V products ([n_head*hd], [n_head_kv*hd] x 2);
     * NULL for the other architectures. */
    const float *bq, *bk, *bv;
    /* qwen3, gemma3: RMSNorm weights applied to each head of Q and K before RoPE ([hd]);
     * NULL for the other architectures. */
    const float *q_norm, *k_norm;
    /* gemma2, gemma3: RMSNorm of the attention output (post_attention_norm) and of the FFN
     * output (post_ffw_norm) before each residual add ([n_embd]); NULL elsewhere. */
    const float *post_attn_norm, *post_ffn_norm;
    /* phi3 stores Q, K, V in one tensor (attn_qkv) and gate, up in one (ffn_up): wq, wk,
     * wv and w_gate, w_up are then row ranges of those tensors (no copy), so the forward
     * pass is the same. */
} pe_layer;

struct pe_model {
    pe_gguf_file *gf;
    pe_hparams hp;
    char name[128];
    pe_mat tok_embd;          /* n_vocab rows of n_embd */
    pe_mat output;            /* n_vocab rows of n_embd (tied: = tok_embd) */
    const float *output_norm; /* [n_embd] */
    const float *rope_freqs;  /* [n_rot/2] or NULL (llama3-style frequency factors) */
    pe_layer *layers;         /* [n_layer] */
    float *owned;             /* norms converted to f32 when stored otherwise */
    pe_vocab *vocab;
    pgd_hash fingerprint; /* see pe_model_fingerprint */
    uint64_t weight_bytes;
    uint64_t packed_bytes; /* of the pe_mat.packed copies (weights.c pack_weights) */
};

/* Writes one formatted line into err (when err and errlen are set) and returns -1. */
int pe__errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif /* PE_MODEL_INT_H */
