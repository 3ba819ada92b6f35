/* SPDX-License-Identifier: MIT */
/*
 * chat.h - chat templates: turns a list of {role, content} messages into the prompt text
 * a chat model was trained on. Called by the server (/v1/chat/completions) and the CLI.
 *
 * There is no Jinja interpreter. pe_chat_detect() recognises the family of a model's
 * tokenizer.chat_template by the special tokens it writes, and pe_chat_render() writes
 * that family's format in C. Each family is checked in tests/engine/test_chat.c against
 * the real templates in shared/models/chat-templates/ (rendered with Jinja2).
 *
 * Families and what they render for [system S, user U1, assistant A1, user U2]
 * (trim = Python str.strip(), as Jinja's |trim filter does; "\n" is a newline):
 *
 *   plain   System: S\nUser: U1\nAssistant: A1\nUser: U2\nAssistant:
 *           The documented fallback, for models without a template (stories260K):
 *           one line "<Role>: <content>\n" per message, Role capitalised ("System",
 *           "User", "Assistant"), then "Assistant:" (no trailing space) as the prompt.
 *   chatml  <|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n
 *           <|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nU2<|im_end|>\n
 *           <|im_start|>assistant\n
 *           (Qwen2.5 exactly, when a system message is given. Without one, Qwen's template
 *           adds "You are Qwen, created by Alibaba Cloud..." and this does not: that text
 *           is Qwen's, not ChatML's. SmolLM3 is detected as chatml; its "## Metadata /
 *           Reasoning Mode" system header is not reproduced.)
 *   llama3  <|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December
 *           2023\nToday Date: 26 Jul 2024\n\ntrim(S)<|eot_id|>
 *           <|start_header_id|>user<|end_header_id|>\n\ntrim(U1)<|eot_id|> ... then
 *           <|start_header_id|>assistant<|end_header_id|>\n\n
 *           Llama 3.1/3.2 exactly, preamble included (the models were trained with it), and
 *           always with the template's default date, never today's: the prompt prefix then
 *           stays the same from one day to the next, so the prefix cache keeps hitting.
 *           The system block is written even without a system message, as 3.1 does.
 *   llama2  [INST]U1[/INST]A1</s>[INST]S\n\nU2[/INST]
 *           Mistral Nemo exactly: the system text goes in front of the LAST user message
 *           (joined by "\n\n"; Nemo's template drops it when the conversation ends with an
 *           assistant turn, this keeps it), assistant turns end with the EOS text "</s>", and the
 *           generation prompt is empty (the model answers right after [/INST]). Llama 2's
 *           <<SYS>> form and the spaced "[INST] U [/INST]" of older Mistrals are also
 *           detected as llama2 and get this rendering (an approximation for them).
 *   gemma   <start_of_turn>user\ntrim(S)\n\ntrim(U1)<end_of_turn>\n<start_of_turn>model\n
 *           trim(A1)<end_of_turn>\n<start_of_turn>user\ntrim(U2)<end_of_turn>\n
 *           <start_of_turn>model\n
 *           Gemma 2 exactly for user/assistant turns. Gemma 2's template rejects a system
 *           message; here system text is folded into the next user turn, followed by
 *           "\n\n" (as Gemma 3's template and llama.cpp do); with no user turn after it, it
 *           becomes a user turn of its own before the prompt.
 *   phi3    <|system|>\nS<|end|>\n<|user|>\nU1<|end|>\n<|assistant|>\nA1<|end|>\n
 *           <|user|>\nU2<|end|>\n<|assistant|>\n
 *           Phi-3.5 exactly; a system message with empty content is left out, as there.
 *
 * Common rules:
 * - BOS is never written: the tokenizer adds it (pe_tokenize with add_special), so the
 *   model never sees two. Every other special token is written as text, and the result
 *   must be tokenized with parse_special = 1. pe_chat_render_spans also says where each
 *   message's content lies in the result: given to pe_tokenize_ex as plain ranges, text
 *   inside a message that spells a control token ("<|im_start|>", "</s>") stays text,
 *   so a message cannot forge a turn boundary; only the template's markers are parsed.
 *   (pe_tokenize with parse_special on the whole text parses them in messages too, as
 *   llama.cpp's server does: `pagoda serve --parse-special-in-messages`.)
 * - Roles are "system", "user", "assistant" (exact, lower case), in any order and any
 *   number: where a real template would raise (Gemma's and Mistral's "roles must
 *   alternate"), the format is extended naturally instead. Anything else is PGD_EINVAL.
 *   llama2 joins several system messages with "\n\n"; with no user message they become
 *   "[INST]S[/INST]". gemma folds each into the next user turn the same way. The other
 *   families write a later system message as a turn of its own, as their templates do.
 * - Stateless and allocation-free except for the results: every call is thread-safe.
 *   Cost: O(total content bytes).
 */
#ifndef PE_CHAT_H
#define PE_CHAT_H

#include <stddef.h>

#include "tokenizer.h" /* pe_text_span */

typedef enum pe_chat_family {
    PE_CHAT_PLAIN = 0, /* the documented fallback */
    PE_CHAT_CHATML,    /* ChatML / Qwen: <|im_start|>role\n...<|im_end|>\n */
    PE_CHAT_LLAMA3,    /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    PE_CHAT_LLAMA2,    /* Llama 2 / Mistral [INST] ... [/INST] (incl. Mistral Nemo's) */
    PE_CHAT_GEMMA,     /* <start_of_turn>user\n...<end_of_turn>\n, system folded into user */
    PE_CHAT_PHI3       /* <|system|>\n...<|end|>\n<|user|>\n...<|end|>\n<|assistant|>\n */
} pe_chat_family;

#define PE_CHAT_N_FAMILIES 6

typedef struct pe_chat_msg {
    const char *role;    /* "system", "user" or "assistant"; borrowed for the call */
    const char *content; /* NUL-terminated UTF-8 (not checked); borrowed for the call */
} pe_chat_msg;

/* Returns the family of a Jinja chat template (tokenizer.chat_template) from the special
 * tokens its text contains, first match wins: "<|im_start|>" chatml, "<|start_header_id|>"
 * llama3, "<start_of_turn>" gemma, "<|user|>" with "<|end|>" phi3, "[INST]" llama2.
 * NULL or anything else -> PE_CHAT_PLAIN. Pure string inspection: the template is never
 * executed. Borrowed for the call; O(strlen(template_text)). */
pe_chat_family pe_chat_detect(const char *template_text);

/* Returns "plain", "chatml", "llama3", "llama2", "gemma" or "phi3"; "plain" for a value
 * out of range. Static storage. */
const char *pe_chat_family_name(pe_chat_family f);

/* Parses a family name: the six names above and the aliases "qwen" (chatml) and "mistral"
 * (llama2), ASCII case-insensitive. Returns 0 and sets *out, or -1 (NULL or unknown name;
 * *out unchanged). */
int pe_chat_family_parse(const char *name, pe_chat_family *out);

/* Renders msgs[0..n) followed by the assistant generation prompt (see the table above),
 * without BOS, into a malloc'ed NUL-terminated string: *out, which the caller frees with
 * free(). n == 0 renders just the prompt (and llama3's system block).
 * err: when not NULL and errlen > 0, receives a one-line message on PGD_EINVAL naming the
 * message index and what is wrong (unknown role, NULL role or content); "" on success.
 * Returns 0, PGD_EINVAL (out NULL, msgs NULL with n > 0, bad role or content; an unknown
 * family value) or PGD_ENOMEM. On error *out is NULL (when out is not NULL). */
int pe_chat_render(pe_chat_family f, const pe_chat_msg *msgs, size_t n, char **out, char *err,
                   size_t errlen);

/* pe_chat_render, and where the messages' content went: *len the result's length, *spans
 * (malloc'ed, the caller frees with free(); NULL when there is none) the byte ranges of
 * the result that are message content (trimmed content where the family trims), ascending
 * and disjoint, *n_spans their count. Template text (markers, role names, labels,
 * separators between joined system messages) is never inside a span. len, spans and
 * n_spans may be NULL (*n_spans is then 0 when spans is NULL). Same statuses as pe_chat_render; on
 * error *spans is NULL. */
int pe_chat_render_spans(pe_chat_family f, const pe_chat_msg *msgs, size_t n, char **out,
                         size_t *len, pe_text_span **spans, size_t *n_spans, char *err,
                         size_t errlen);

/* Returns the strings that end an assistant turn in family f, a NULL-terminated static
 * array: chatml "<|im_end|>"; llama3 "<|eot_id|>", "<|eom_id|>"; llama2 "</s>"; gemma
 * "<end_of_turn>"; phi3 "<|end|>", "<|endoftext|>"; plain "\nUser:" (a model continuing
 * the transcript starts the next user line). The server adds them to a chat request's
 * stop list when the tokenizer does not map them to an end-of-generation id. Never NULL. */
const char *const *pe_chat_stop_strings(pe_chat_family f);

#endif /* PE_CHAT_H */
