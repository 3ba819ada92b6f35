// SPDX-License-Identifier: MIT
// test_budget.mjs - token budgets in `pagoda serve` (issue 14) through the real server, on
// stories260K with --ctx 512 (pages of 16 tokens):
//   - pagoda.kv_budget 64 with kv_budget_method "streaming" over a ~400-token prompt and
//     max_tokens 64: 200, usage.pagoda.kv_budget {method, budget, dropped_tokens > 0,
//     kv_tokens at most budget + a page}, in the whole body and in the stream's usage chunk;
//   - the /metrics counters grow: pagoda_kv_budget_dropped_tokens_total (by at least the
//     request's dropped_tokens), pagoda_kv_compaction_freed_pages_total,
//     pagoda_kv_compactions_total, pagoda_requests_with_budget_total{method};
//   - each method name works (completions and chat) and drops tokens;
//   - bad values are a 400 naming the field: -1, 1.5, "64", "x", an unknown method, a
//     number as the method, kv_budget 0 with a method, the method alone on a server with
//     no default, an unknown key;
//   - the smallest budget, 1, works for every method (adakv: each head keeps one token);
//   - a budget past the request's length drops nothing; kv_budget 0 is dense (no
//     usage.pagoda.kv_budget, no budget counted);
//   - a server started with --kv-budget 64 applies it (snapkv) to requests that name none,
//     "kv_budget": 0 opts out, the method alone takes the server's budget;
//   - the budget is real memory: pagoda_kv_pages_used while a 1600-token decode runs is
//     a few pages under streaming at 64, against every token's pages dense (--ctx 2048);
//   - prefix caching stays: the same prompt twice, the second with a budget, gets
//     cached_tokens > 0, and the pages a budgeted request committed before compaction
//     still serve a dense request after it.
// Needs stories260K (exit 77 without it). Run by ctest (labels integration, thread, http).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  requireSetup, startServer, post, metrics, stream, randomTokens, sleep,
} from './common.mjs';

const model = requireSetup();
if (!model.stories) {
  console.error('skipped: test_budget needs stories260K.gguf');
  process.exit(77);
}
const PAGE = 16;
const CTX = 512;
const LONG = 400;
const METHODS = ['streaming', 'h2o', 'tova', 'snapkv', 'pyramidkv', 'adakv'];
const T = { timeout: 120000 }; // a bound on each test, not a timing assertion
const SERVE = ['--ctx', String(CTX), '--max-running', '4'];
let srv;
let seed = 9001;
// A prompt no other request shares (randomTokens maps seeds 2k and 2k+1 to one sequence).
const fresh = (n) => randomTokens((seed += 2), n);

before(async () => { srv = await startServer(model.path, SERVE); });
after(async () => { if (srv) await srv.stop(); });

async function complete(s, body, route = '/v1/completions') {
  const r = await post(s, route, { max_tokens: 8, temperature: 0, ...body });
  assert.equal(r.status, 200, r.text);
  return r.json;
}

function expectBad(r, param) {
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.error.param, param, r.text);
  assert.equal(r.json.error.type, 'invalid_request_error');
  const last = param.split('.').pop();
  assert.ok(r.json.error.message.includes(last), `the message names ${param}: ${r.text}`);
}

// usage.pagoda.kv_budget of a request that ran with a budget: its shape and bounds.
function checkBudget(u, method, budget) {
  const kb = u.pagoda.kv_budget;
  assert.ok(kb, `usage.pagoda.kv_budget: ${JSON.stringify(u)}`);
  assert.deepEqual(Object.keys(kb).sort(), ['budget', 'dropped_tokens', 'kv_tokens', 'method']);
  assert.equal(kb.method, method);
  assert.equal(kb.budget, budget);
  assert.ok(Number.isInteger(kb.dropped_tokens) && kb.dropped_tokens >= 0, JSON.stringify(kb));
  assert.ok(Number.isInteger(kb.kv_tokens) && kb.kv_tokens > 0, JSON.stringify(kb));
  // Every token the request ran is either held or dropped (the last sampled one is never
  // run, so at most prompt + completion - 1 slots).
  assert.ok(kb.kv_tokens + kb.dropped_tokens <= u.prompt_tokens + u.completion_tokens,
    JSON.stringify(u));
  assert.ok('retention' in u.pagoda && 'cached_tokens_by_tier' in u.pagoda, 'beside the others');
  return kb;
}

test('streaming at 64 over a 400-token prompt: 200, usage shows the budget, metrics grow', T,
  async () => {
    const m0 = await metrics(srv);
    const r = await complete(srv, {
      prompt: fresh(LONG), max_tokens: 64, ignore_eos: true,
      pagoda: { kv_budget: 64, kv_budget_method: 'streaming' },
    });
    const u = r.usage;
    assert.equal(u.prompt_tokens, LONG);
    assert.equal(u.completion_tokens, 64);
    const kb = checkBudget(u, 'streaming', 64);
    assert.ok(kb.dropped_tokens > 0, JSON.stringify(kb));
    // Online methods hold between the budget and budget + page_tokens - 1 slots.
    assert.ok(kb.kv_tokens >= 64 && kb.kv_tokens < 64 + PAGE, JSON.stringify(kb));
    assert.ok(kb.dropped_tokens >= LONG + 63 - (64 + PAGE), JSON.stringify(kb));
    const m1 = await metrics(srv);
    const d = (k) => m1[k] - m0[k];
    assert.ok(d('pagoda_kv_budget_dropped_tokens_total') >= kb.dropped_tokens,
      `${d('pagoda_kv_budget_dropped_tokens_total')} < ${kb.dropped_tokens}`);
    assert.ok(d('pagoda_kv_compactions_total') >= 1);
    assert.ok(d('pagoda_kv_compaction_freed_pages_total') >= 1);
    assert.equal(d('pagoda_requests_with_budget_total{method="streaming"}'), 1);
    assert.equal(d('pagoda_requests_with_budget_total{method="snapkv"}'), 0);
  });

test('the stream reports the budget in its usage chunk', T, async () => {
  const body = {
    prompt: fresh(LONG), max_tokens: 16, temperature: 0,
    pagoda: { kv_budget: 64, kv_budget_method: 'h2o' },
  };
  let { events } = await stream(srv, '/v1/completions',
    { ...body, stream_options: { include_usage: true } });
  const last = events.filter((e) => e !== '[DONE]' && e.usage).pop();
  assert.ok(last, 'a chunk with usage');
  assert.ok(checkBudget(last.usage, 'h2o', 64).dropped_tokens > 0);
  // without include_usage the finishing chunk carries usage
  ({ events } = await stream(srv, '/v1/completions', { ...body, prompt: fresh(LONG) }));
  const fin = events.filter((e) => e !== '[DONE]' && e.usage).pop();
  assert.ok(fin, 'the finishing chunk has usage');
  checkBudget(fin.usage, 'h2o', 64);
});

test('each method works, in completions and chat, and drops tokens', T, async () => {
  for (const method of METHODS) {
    const m0 = await metrics(srv);
    const r = await complete(srv,
      { prompt: fresh(LONG), pagoda: { kv_budget: 64, kv_budget_method: method } });
    const kb = checkBudget(r.usage, method, 64);
    assert.ok(kb.dropped_tokens > 0, `${method}: ${JSON.stringify(kb)}`);
    assert.ok(kb.kv_tokens < LONG, `${method}: ${JSON.stringify(kb)}`);
    const m1 = await metrics(srv);
    assert.equal(m1[`pagoda_requests_with_budget_total{method="${method}"}`] -
      m0[`pagoda_requests_with_budget_total{method="${method}"}`], 1, method);
  }
  // chat: a long message
  const content = 'Once upon a time there was a little dog who liked to run. '.repeat(12);
  const c = await complete(srv, {
    messages: [{ role: 'user', content }],
    pagoda: { kv_budget: 48, kv_budget_method: 'snapkv' },
  }, '/v1/chat/completions');
  assert.ok(c.usage.prompt_tokens > 100, JSON.stringify(c.usage));
  assert.ok(checkBudget(c.usage, 'snapkv', 48).dropped_tokens > 0);
});

test('bad budget values are a 400 naming the field', T, async () => {
  const bad = [
    [{ kv_budget: -1 }, 'pagoda.kv_budget'],
    [{ kv_budget: 1.5 }, 'pagoda.kv_budget'],
    [{ kv_budget: '64' }, 'pagoda.kv_budget'],
    [{ kv_budget: 1 << 23 }, 'pagoda.kv_budget'],
    [{ kv_budget: 64, kv_budget_method: 'x' }, 'pagoda.kv_budget_method'],
    [{ kv_budget: 64, kv_budget_method: 'quest' }, 'pagoda.kv_budget_method'],
    [{ kv_budget: 64, kv_budget_method: 0 }, 'pagoda.kv_budget_method'],
    [{ kv_budget: 0, kv_budget_method: 'h2o' }, 'pagoda.kv_budget_method'],
    // the method alone: this server has no default budget
    [{ kv_budget_method: 'snapkv' }, 'pagoda.kv_budget_method'],
    [{ kv_budget: 64, kv_budget_methods: 'h2o' }, 'pagoda.kv_budget_methods'],
  ];
  const m0 = await metrics(srv);
  for (const [pagoda, param] of bad) {
    expectBad(await post(srv, '/v1/completions', { prompt: 'Once', max_tokens: 4, pagoda }), param);
    expectBad(await post(srv, '/v1/chat/completions',
      { messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, pagoda }), param);
  }
  let r = await post(srv, '/v1/completions',
    { prompt: 'Once', max_tokens: 4, pagoda: { kv_budget_method: 'snapkv' } });
  assert.ok(r.json.error.message.includes('--kv-budget'), r.text);
  const m1 = await metrics(srv);
  assert.equal(m1['pagoda_http_responses_total{code="400"}'] -
    m0['pagoda_http_responses_total{code="400"}'], 2 * bad.length + 1);
});

// At a budget of 1 adakv's floor share (0.2 x 1) would round to nothing: every head keeps at
// least one token (adakv.c), so the compaction runs (a head of none would be refused).
test('the smallest budget, 1, works for every method', T, async () => {
  for (const method of METHODS) {
    const r = await complete(srv,
      { prompt: fresh(100), pagoda: { kv_budget: 1, kv_budget_method: method } });
    const kb = checkBudget(r.usage, method, 1);
    assert.ok(kb.dropped_tokens > 0 && kb.kv_tokens < 100, `${method}: ${JSON.stringify(kb)}`);
  }
});

test('a budget past the length drops nothing; kv_budget 0 is dense', T, async () => {
  let r = await complete(srv,
    { prompt: fresh(40), pagoda: { kv_budget: 256, kv_budget_method: 'streaming' } });
  const kb = checkBudget(r.usage, 'streaming', 256);
  assert.equal(kb.dropped_tokens, 0);
  assert.ok(kb.kv_tokens >= 40 && kb.kv_tokens <= 40 + 8, JSON.stringify(kb));
  const m0 = await metrics(srv);
  r = await complete(srv, { prompt: fresh(LONG), pagoda: { kv_budget: 0 } });
  assert.equal(r.usage.pagoda.kv_budget, undefined, JSON.stringify(r.usage));
  r = await complete(srv, { prompt: fresh(LONG) });
  assert.equal(r.usage.pagoda.kv_budget, undefined, JSON.stringify(r.usage));
  const m1 = await metrics(srv);
  assert.equal(m1.pagoda_kv_budget_dropped_tokens_total, m0.pagoda_kv_budget_dropped_tokens_total);
  for (const method of METHODS) {
    const k = `pagoda_requests_with_budget_total{method="${method}"}`;
    assert.equal(m1[k], m0[k], k);
  }
});

test('prefix caching stays: a budgeted request is served the cached prefix, and leaves it', T,
  async () => {
    const prompt = fresh(LONG);
    let r = await complete(srv, { prompt });
    assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
    r = await complete(srv, { prompt, pagoda: { kv_budget: 64, kv_budget_method: 'snapkv' } });
    assert.ok(r.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(r.usage));
    assert.ok(checkBudget(r.usage, 'snapkv', 64).dropped_tokens > 0);
    // budget first: the full pages it committed before compaction serve a dense request
    const p2 = fresh(LONG);
    r = await complete(srv,
      { prompt: p2, pagoda: { kv_budget: 64, kv_budget_method: 'streaming' } });
    assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
    assert.ok(checkBudget(r.usage, 'streaming', 64).dropped_tokens > 0);
    r = await complete(srv, { prompt: p2 });
    assert.ok(r.usage.prompt_tokens_details.cached_tokens >= PAGE, JSON.stringify(r.usage));
    assert.equal(r.usage.pagoda.kv_budget, undefined);
  });

// The most pagoda_kv_pages_used /metrics shows while one request of body decodes on s,
// sampled from when it has run `after` tokens past its prompt until it ends; null when no
// sample caught it running (the request finished first).
async function pagesUsedWhileDecoding(s, body, after) {
  const m0 = await metrics(s);
  const gen0 = m0.pagoda_generation_tokens_total;
  let done = false;
  const req = post(s, '/v1/completions', body).then((r) => { done = true; return r; });
  let most = null;
  while (!done) {
    const m = await metrics(s);
    if (m.pagoda_requests_running === 1 && m.pagoda_generation_tokens_total - gen0 >= after)
      most = Math.max(most ?? 0, m.pagoda_kv_pages_used);
    await sleep(5);
  }
  const r = await req;
  assert.equal(r.status, 200, r.text);
  return { most, usage: r.json.usage };
}

test('the budget is real memory: pagoda_kv_pages_used while decoding', T, async () => {
  const s = await startServer(model.path, ['--ctx', '2048', '--max-running', '4']);
  try {
    const body = { max_tokens: 1600, ignore_eos: true, temperature: 0 };
    for (let tries = 0; tries < 3; tries++) {
      const dense = await pagesUsedWhileDecoding(s, { ...body, prompt: fresh(300) }, 400);
      const budgeted = await pagesUsedWhileDecoding(s,
        { ...body, prompt: fresh(300), pagoda: { kv_budget: 64, kv_budget_method: 'streaming' } },
        400);
      if (dense.most === null || budgeted.most === null) continue; // too fast to catch
      // dense: every token so far, 700+ after 400 decoded (44 pages)
      assert.ok(dense.most >= 44, `dense held ${dense.most} pages`);
      // streaming at 64: at most budget + page_tokens - 1 slots, one step's tokens on top
      assert.ok(budgeted.most <= Math.ceil((64 + PAGE) / PAGE) + 1,
        `budgeted held ${budgeted.most} pages`);
      const kb = checkBudget(budgeted.usage, 'streaming', 64);
      assert.ok(kb.kv_tokens < 64 + PAGE && kb.dropped_tokens >= 1800, JSON.stringify(kb));
      return;
    }
    assert.fail('no sample caught a request decoding in three tries');
  } finally {
    await s.stop();
  }
});

test('a server with --kv-budget 64 applies it by default; kv_budget 0 opts out', T, async () => {
  const s = await startServer(model.path, [...SERVE, '--kv-budget', '64']);
  try {
    let r = await complete(s, { prompt: fresh(LONG) });
    assert.ok(checkBudget(r.usage, 'snapkv', 64).dropped_tokens > 0);
    r = await complete(s, { prompt: fresh(LONG), pagoda: { kv_budget: 0 } });
    assert.equal(r.usage.pagoda.kv_budget, undefined, JSON.stringify(r.usage));
    // the method alone takes the server's budget; a budget alone the server's method
    r = await complete(s, { prompt: fresh(LONG), pagoda: { kv_budget_method: 'h2o' } });
    assert.ok(checkBudget(r.usage, 'h2o', 64).dropped_tokens > 0);
    r = await complete(s, { prompt: fresh(LONG), pagoda: { kv_budget: 32 } });
    assert.ok(checkBudget(r.usage, 'snapkv', 32).dropped_tokens > 0);
    const m = await metrics(s);
    assert.ok(m.pagoda_kv_budget_dropped_tokens_total > 0);
    assert.equal(m['pagoda_requests_with_budget_total{method="snapkv"}'], 2);
    assert.equal(m['pagoda_requests_with_budget_total{method="h2o"}'], 1);
  } finally {
    await s.stop();
  }
});
