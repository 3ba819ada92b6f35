/* SPDX-License-Identifier: MIT */
/*
 * fuzz_trace.c - fuzz target for the Mooncake trace line parser (sim/trace.c), the
 * parser of outside input behind `pagoda replay`. The input is one line; the parser must
 * return one of its four results, never crash or leak, and a request it accepts must obey
 * the format's limits. Built as a libFuzzer target with -DPGD_FUZZ=ON (clang), and always
 * as a corpus replayer (replay_main.c) that ctest runs over corpus/trace/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    trace_req req;
    char err[256];
    int rc;

    memset(&req, 0, sizeof req);
    rc = trace_parse_line((const char *)data, size, &req, err, sizeof err);
    if (rc != TRACE_REQ && rc != TRACE_BLANK && rc != TRACE_BAD && rc != TRACE_NOMEM) abort();
    if (memchr(err, '\0', sizeof err) == NULL) abort();
    if (rc == TRACE_REQ) {
        if (req.input_length > TRACE_MAX_LENGTH || req.output_length > TRACE_MAX_LENGTH ||
            req.timestamp_ms > TRACE_MAX_LENGTH) {
            abort();
        }
        for (size_t i = 0; i < req.n_ids; i++) {
            if (req.ids[i] > (uint64_t)INT64_MAX) abort();
        }
    } else if (req.n_ids != 0 || (rc == TRACE_BAD && err[0] == '\0')) {
        abort();
    }
    trace_req_deinit(&req);
    return 0;
}
