// SPDX-License-Identifier: MIT
// test_archs.mjs - `pagoda serve` on the reference set's architecture files (issue 15):
// llama, llama3, qwen2, qwen3, gemma2, gemma3 and phi3 (f16), each served by a real server.
//   - a greedy completion of both reference prompts equals llama.cpp's server output
//     (server-completion.json: `content`, 32 tokens, temperature 0), or, where NEAR_TIES
//     lists a step whose two best logits lie closer than rounding can order, its first
//     tokens up to that step (the text is then a prefix of llama.cpp's);
//   - the prefix cache serves a longer prompt (the prompt + llama.cpp's 32 generated ids)
//     from the pages the first request registered, past gemma's 32-token window, and the
//     answer equals the same request computed cold (another cache_salt: no hit);
//   - gemma2 and gemma3 keep their window layers in a pool of their own (/metrics
//     pagoda_kv_window_*): a 300-token answer leaves them at most a window and two pages
//     and releases the rest, the same answer with --kv-window-dense is identical, and a
//     request token budget is a 400 naming pagoda.kv_budget (budgets need the dense layout).
// The folder is ../shared/models/reference (or $PGD_REFERENCE_DIR); without it the test
// exits 77 (skipped) and says so.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { requireSetup, startServer, post, metrics } from './common.mjs';

requireSetup();
const refDir = process.env.PGD_REFERENCE_DIR
  || path.join(process.env.PGD_SOURCE_DIR || '.', '..', 'shared', 'models', 'reference');
const ARCHS = ['llama', 'llama3', 'qwen2', 'qwen3', 'gemma2', 'gemma3', 'phi3'];
const file = (a) => path.join(refDir, 'models', `tiny-${a}-f16`, `tiny-${a}-f16.gguf`);
if (!ARCHS.every((a) => existsSync(file(a)))) {
  console.error(`skipped: the reference models are not in ${refDir} (set PGD_REFERENCE_DIR)`);
  process.exit(77);
}
const T = { timeout: 120000 }; // a bound on each test, not a timing assertion

// Steps where llama.cpp's greedy pick and another token are tied within rounding: which of
// the two wins depends on the order of the sums (the ISA level, the batch's product path),
// so the completion is compared up to the step. Measured with test_arch_ref, which prints
// both logits (llama.cpp's pick first): llama, prompt 1, step 24: 413 't' 9.04585, 422 'y'
// 9.04631 (PGD_ISA=avx2, an AVX2-only CPU's path; AVX-512 picks 't'); gemma2, prompt 1,
// step 18: 420 9.58194, 421 9.58198 (PGD_ISA=scalar). Both gaps are 5e-5 relative or
// less, below one f16 rounding of the activations.
const NEAR_TIES = { 'llama/0': 24, 'gemma2/0': 18 };

const servers = new Map();
before(async () => {
  for (const a of ARCHS) servers.set(a, await startServer(file(a), ['--ctx', '512']));
});
after(async () => {
  for (const s of servers.values()) await s.stop();
});

const reference = (a) => JSON.parse(readFileSync(
  path.join(refDir, 'models', `tiny-${a}-f16`, 'server-completion.json'), 'utf8')).results;

async function complete(srv, prompt, max_tokens, extra = {}) {
  const r = await post(srv, '/v1/completions', { prompt, max_tokens, temperature: 0, ...extra });
  assert.equal(r.status, 200, r.text);
  return { text: r.json.choices[0].text, usage: r.json.usage };
}

for (const a of ARCHS) {
  test(`${a}: greedy completions equal llama.cpp's, and a prefix hit equals a cold answer`, T,
    async () => {
      const srv = servers.get(a);
      for (const [i, ref] of reference(a).entries()) {
        const tie = NEAR_TIES[`${a}/${i}`];
        const n = tie ?? ref.tokens.length;
        const r = await complete(srv, ref.prompt, n);
        assert.equal(r.usage.prompt_tokens, ref.prompt_tokens.length, JSON.stringify(r.usage));
        assert.equal(r.usage.completion_tokens, n, JSON.stringify(r.usage));
        if (tie === undefined) {
          assert.equal(r.text, ref.content, `${a}, prompt ${JSON.stringify(ref.prompt)}`);
        } else {
          assert.ok(r.text.length > 0 && ref.content.startsWith(r.text),
            `${a}, prompt ${JSON.stringify(ref.prompt)}, ${n} tokens (a near tie follows): ` +
            `${JSON.stringify(r.text)} is not the start of ${JSON.stringify(ref.content)}`);
        }

        // The prompt and llama.cpp's 32 ids (BOS included): its full pages were registered
        // by the request above, so a warm request hits them.
        const ids = [...ref.prompt_tokens, ...ref.tokens];
        if (tie !== undefined) await complete(srv, ids, 1); // registers the pages it did not reach
        const warm = await complete(srv, ids, 8);
        const cold = await complete(srv, ids, 8, { cache_salt: `cold-${a}-${Math.random()}` });
        const hit = warm.usage.prompt_tokens_details.cached_tokens;
        assert.ok(hit >= 32, `${a}: the warm request hit the cache: ${JSON.stringify(warm.usage)}`);
        assert.equal(cold.usage.prompt_tokens_details.cached_tokens, 0);
        assert.equal(warm.text, cold.text, `${a}: a prefix hit of ${hit} tokens changes nothing`);
        console.log(`# ${a}: ${JSON.stringify(ref.prompt)} ok; a hit of ${hit} of ${ids.length} tokens = cold`);
      }
    });
}

for (const a of ['gemma2', 'gemma3']) {
  test(`${a}: window layers free their old pages; the answer equals --kv-window-dense's`, T,
    async () => {
      const srv = servers.get(a);
      const before = await metrics(srv);
      assert.ok(before.pagoda_kv_window_pages_total > 0, JSON.stringify(before));
      const body = { prompt: 'Once upon a time', max_tokens: 300, temperature: 0, ignore_eos: true };
      const r = await post(srv, '/v1/completions', body);
      assert.equal(r.status, 200, r.text);
      const m = await metrics(srv);
      const released = m.pagoda_kv_window_released_pages_total - before.pagoda_kv_window_released_pages_total;
      assert.ok(released >= 10, `window pages released: ${released}`);
      assert.equal(m.pagoda_kv_window_pages_used, 0, 'nothing held after the request');
      const dense = await startServer(file(a), ['--ctx', '512', '--kv-window-dense']);
      try {
        const md = await metrics(dense);
        assert.equal(md.pagoda_kv_window_pages_total, undefined, 'no window pool when dense');
        const rd = await post(dense, '/v1/completions', body);
        assert.equal(rd.status, 200, rd.text);
        assert.equal(r.json.choices[0].text, rd.json.choices[0].text);
        const bud = await post(dense, '/v1/completions',
          { prompt: 'Once upon a time', max_tokens: 4, pagoda: { kv_budget: 32 } });
        assert.equal(bud.status, 200, `a budget on the dense layout: ${bud.text}`);
      } finally {
        await dense.stop();
      }
      const bad = await post(srv, '/v1/completions',
        { prompt: 'Once upon a time', max_tokens: 4, pagoda: { kv_budget: 32 } });
      assert.equal(bad.status, 400, bad.text);
      assert.match(bad.text, /pagoda\.kv_budget/);
      console.log(`# ${a}: 300 tokens, ${released} window pages released, same as dense; budget: 400`);
    });
}
