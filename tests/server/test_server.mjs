// SPDX-License-Identifier: MIT
// test_server.mjs - drives the real `pagoda serve` over HTTP (node:test + fetch):
//   - completions and chat, streaming and not; stories260K's greedy text is the golden one;
//   - stop sequences (text level, never part of the output, held back while streaming);
//   - usage with prompt_tokens_details.cached_tokens on every response;
//   - every error status with a malformed body each: 400, 401, 404, 405, 413, 429, 503;
//   - cancellation (client disconnect) frees the request's pages at once (metrics);
//   - cache_salt isolation; /v1/models, /health, the Prometheus page;
//   - issue 10: an empty cache_salt and NUL in text fields are 400s; a 16 MB prompt
//     gets its 413 in milliseconds without hundreds of MB; control-token text in chat
//     messages stays text (unless --parse-special-in-messages); a 429 carries
//     Retry-After; prompt-token counters count every request once, cancelled ones too
//     (cached <= total);
//   - 8 concurrent requests sharing a 1,000-token prefix: the prefix is computed once
//     and the greedy outputs equal those of the same requests run one by one;
//   - --no-prefix-cache shares nothing: 2 identical prompts hold twice the pages;
//   - shutdown is bounded: SIGTERM with an idle keep-alive connection open and a stream
//     in flight exits 0 soon after the grace period.
// Run by ctest (labels integration, thread); see common.mjs for the environment.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import {
  requireSetup, startServer, post, get, stream, metrics, until, randomTokens, sleep,
} from './common.mjs';

const model = requireSetup();
const GOLDEN = ', there was a little girl named Lily. She loved to play outside in the park.';
let srv;

before(async () => {
  srv = await startServer(model.path, ['--ctx', '2048', '--kv-type', 'f32', '--max-body', '256K']);
});
after(async () => { if (srv) await srv.stop(); });

function checkUsage(u, prompt, completion, cached = null) {
  assert.ok(u, 'usage is present');
  assert.equal(u.prompt_tokens, prompt);
  assert.equal(u.completion_tokens, completion);
  assert.equal(u.total_tokens, prompt + completion);
  assert.equal(typeof u.prompt_tokens_details.cached_tokens, 'number');
  if (cached !== null) assert.equal(u.prompt_tokens_details.cached_tokens, cached);
}

test('completion, not streamed', async () => {
  const id = (await get(srv, '/v1/models')).json.data[0].id;
  const r = await post(srv, '/v1/completions',
    { model: id, prompt: 'Once upon a time', max_tokens: 30, temperature: 0 });
  assert.equal(r.status, 200, r.text);
  const j = r.json;
  assert.equal(j.object, 'text_completion');
  assert.match(j.id, /^cmpl-/);
  assert.equal(typeof j.created, 'number');
  assert.equal(j.choices.length, 1);
  assert.equal(j.choices[0].index, 0);
  assert.equal(j.choices[0].finish_reason, 'length');
  if (model.stories) assert.ok(j.choices[0].text.startsWith(GOLDEN.slice(0, 40)), j.choices[0].text);
  checkUsage(j.usage, model.stories ? 5 : j.usage.prompt_tokens, 30, 0);
  // No model named: accepted too.
  const r2 = await post(srv, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 30, temperature: 0 });
  assert.equal(r2.status, 200);
  assert.equal(r2.json.choices[0].text, j.choices[0].text);
});

test('completion, streamed: same text, usage on the last chunk, [DONE]', async () => {
  const body = { prompt: 'Once upon a time', max_tokens: 40, temperature: 0 };
  const whole = await post(srv, '/v1/completions', body);
  const { events } = await stream(srv, '/v1/completions', body);
  assert.equal(events.at(-1), '[DONE]');
  const chunks = events.slice(0, -1);
  let text = '';
  for (const c of chunks) {
    assert.equal(c.object, 'text_completion');
    assert.equal(c.choices.length, 1);
    text += c.choices[0].text;
  }
  const last = chunks.at(-1);
  assert.equal(last.choices[0].finish_reason, 'length');
  for (const c of chunks.slice(0, -1)) assert.equal(c.choices[0].finish_reason, null);
  assert.equal(text, whole.json.choices[0].text);
  checkUsage(last.usage, whole.json.usage.prompt_tokens, 40);
});

test('chat, not streamed and streamed with include_usage', async () => {
  const body = { messages: [{ role: 'system', content: 'You tell stories.' },
                            { role: 'user', content: [{ type: 'text', text: 'Tell me about a cat.' }] }],
                 max_completion_tokens: 24, temperature: 0 };
  const r = await post(srv, '/v1/chat/completions', body);
  assert.equal(r.status, 200, r.text);
  const j = r.json;
  assert.equal(j.object, 'chat.completion');
  assert.match(j.id, /^chatcmpl-/);
  assert.equal(j.choices[0].message.role, 'assistant');
  assert.equal(typeof j.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(j.choices[0].finish_reason));
  assert.ok(j.usage.prompt_tokens > 5);
  checkUsage(j.usage, j.usage.prompt_tokens, j.usage.completion_tokens);
  if (j.choices[0].finish_reason === 'length') assert.equal(j.usage.completion_tokens, 24);

  const { events } = await stream(srv, '/v1/chat/completions',
    { ...body, stream_options: { include_usage: true } });
  assert.equal(events.at(-1), '[DONE]');
  const chunks = events.slice(0, -1);
  assert.deepEqual(chunks[0].choices[0].delta, { role: 'assistant', content: '' });
  let text = '';
  for (const c of chunks.slice(1, -2)) {
    assert.equal(c.object, 'chat.completion.chunk');
    assert.equal(c.usage, null);
    text += c.choices[0].delta.content;
  }
  const fin = chunks.at(-2);
  assert.equal(fin.choices[0].finish_reason, j.choices[0].finish_reason);
  assert.deepEqual(fin.choices[0].delta, {});
  const u = chunks.at(-1);
  assert.deepEqual(u.choices, []);
  checkUsage(u.usage, j.usage.prompt_tokens, j.usage.completion_tokens);
  assert.equal(text, j.choices[0].message.content);
});

test('stop sequences: cut before the stop, finish_reason stop, held back while streaming', async () => {
  const base = { prompt: 'Once upon a time', max_tokens: 60, temperature: 0 };
  const full = (await post(srv, '/v1/completions', base)).json.choices[0].text;
  // A stop string spanning several tokens, from the middle of the greedy text.
  const at = Math.floor(full.length / 2);
  const stop = full.slice(at, at + 7);
  const want = full.slice(0, full.indexOf(stop));
  const r = await post(srv, '/v1/completions', { ...base, stop: [stop, 'zzzz-never'] });
  assert.equal(r.status, 200);
  assert.equal(r.json.choices[0].text, want);
  assert.equal(r.json.choices[0].finish_reason, 'stop');
  assert.ok(r.json.usage.completion_tokens < 60);

  const { events } = await stream(srv, '/v1/completions', { ...base, stop });
  let text = '';
  for (const c of events.slice(0, -1)) {
    text += c.choices[0].text;
    // Never show text past the point where the stop string begins.
    assert.ok(want.startsWith(text), `streamed ${JSON.stringify(text)} beyond ${JSON.stringify(want)}`);
  }
  assert.equal(text, want);
  const last = events.at(-2);
  assert.equal(last.choices[0].finish_reason, 'stop');
  assert.equal(last.usage.completion_tokens, r.json.usage.completion_tokens);

  // Single-string form, stop at the very first characters.
  const r2 = await post(srv, '/v1/completions', { ...base, stop: full.slice(0, 3) });
  assert.equal(r2.json.choices[0].text, '');
  assert.equal(r2.json.choices[0].finish_reason, 'stop');
});

test('models, health, metrics page', async () => {
  const m = await get(srv, '/v1/models');
  assert.equal(m.status, 200);
  assert.equal(m.json.object, 'list');
  assert.equal(m.json.data.length, 1);
  assert.equal(m.json.data[0].object, 'model');
  const id = m.json.data[0].id;
  // The "pagoda" extension: what a client needs to build token prompts.
  const pg = m.json.data[0].pagoda;
  assert.ok(pg, 'model object has "pagoda"');
  assert.equal(pg.n_ctx, 2048);
  assert.equal(pg.page_tokens, 16);
  assert.equal(pg.kv_type, 'f32');
  assert.ok(Number.isInteger(pg.n_vocab) && pg.n_vocab > 0);
  if (model.stories) assert.equal(pg.n_vocab, 512);
  assert.equal(m.json.data[0].max_model_len, pg.n_ctx);
  assert.deepEqual((await get(srv, '/v1/models/' + id)).json.pagoda, pg);
  assert.equal((await get(srv, '/v1/models/' + id)).json.id, id);
  assert.equal((await get(srv, '/v1/models/nope')).status, 404);
  const h = await get(srv, '/health');
  assert.equal(h.status, 200);
  assert.equal(h.json.status, 'ok');
  const v = await metrics(srv);
  for (const name of ['pagoda_kv_pages_total', 'pagoda_kv_pages_used', 'pagoda_kv_pages_cached',
    'pagoda_kv_usage_ratio', 'pagoda_kv_bytes_per_token', 'pagoda_prefix_cache_queried_tokens_total',
    'pagoda_prefix_cache_hit_tokens_total', 'pagoda_requests_running', 'pagoda_requests_waiting',
    'pagoda_preemptions_total', 'pagoda_prompt_tokens_computed_total',
    'pagoda_generation_tokens_total', 'pagoda_requests_finished_total{reason="stop"}',
    'pagoda_time_to_first_token_seconds_count', 'pagoda_inter_token_latency_seconds_count'])
    assert.ok(name in v, `metric ${name} missing`);
  assert.ok(v.pagoda_kv_pages_total > 0);
  assert.equal(v.pagoda_kv_bytes_per_token, model.stories ? 1280 : v.pagoda_kv_bytes_per_token);
  assert.ok(v.pagoda_generation_tokens_total > 0);
  assert.ok(v.pagoda_time_to_first_token_seconds_count > 0);
  for (const h of ['pagoda_time_to_first_token_seconds', 'pagoda_inter_token_latency_seconds']) {
    const buckets = Object.entries(v).filter(([k]) => k.startsWith(h + '_bucket'));
    assert.ok(buckets.length > 3);
    for (let i = 1; i < buckets.length; i++) assert.ok(buckets[i][1] >= buckets[i - 1][1]);
    assert.equal(v[`${h}_bucket{le="+Inf"}`], v[`${h}_count`]);
  }
});

test('400: malformed JSON and bad fields name the field', async () => {
  const cases = [
    ['{"prompt": "x",', null],
    ['[1, 2]', null],
    ['{"prompt": 5}', 'prompt'],
    ['{"prompt": []}', 'prompt'],
    ['{"prompt": [1, 99999]}', 'prompt'],
    ['{"prompt": ["a", "b"]}', 'prompt'],
    ['{"prompt": "x", "max_tokens": 0}', 'max_tokens'],
    ['{"prompt": "x", "max_tokens": "ten"}', 'max_tokens'],
    ['{"prompt": "x", "temperature": "hot"}', 'temperature'],
    ['{"prompt": "x", "temperature": 3}', 'temperature'],
    ['{"prompt": "x", "top_p": 0}', 'top_p'],
    ['{"prompt": "x", "n": 2}', 'n'],
    ['{"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}', 'stop'],
    ['{"prompt": "x", "stop": [""]}', 'stop'],
    ['{"prompt": "x", "stop": 7}', 'stop'],
    ['{"prompt": "x", "stream": "yes"}', 'stream'],
    ['{"prompt": "x", "stream_options": {"include_usage": 1}}', 'stream_options'],
    ['{"prompt": "x", "seed": 1.5}', 'seed'],
    ['{"prompt": "x", "cache_salt": 12}', 'cache_salt'],
    ['{"prompt": "x", "model": 3}', 'model'],
    // issue 10: an empty salt is refused (it used to join the default tenant silently)
    ['{"prompt": "x", "cache_salt": ""}', 'cache_salt'],
    // issue 10: one rule for NUL in text fields: refused, naming the field
    ['{"prompt": "x", "model": "m\\u0000x"}', 'model'],
    ['{"prompt": "a\\u0000b"}', 'prompt'],
    ['{"prompt": "x", "prompt": "y"}', null],
  ];
  for (const [body, param] of cases) {
    const r = await post(srv, '/v1/completions', body);
    assert.equal(r.status, 400, `${body}: ${r.text}`);
    const e = r.json.error;
    assert.equal(e.type, 'invalid_request_error');
    assert.equal(typeof e.message, 'string');
    assert.ok('param' in e && 'code' in e);
    assert.equal(e.param, param, body);
    if (param) assert.ok(e.message.includes(param), `${body}: message ${e.message}`);
  }
  const chat = [
    ['{"messages": []}', 'messages'],
    ['{"messages": "hi"}', 'messages'],
    ['{"messages": [{"role": "user"}]}', 'messages'],
    ['{"messages": [{"role": "wizard", "content": "x"}]}', 'messages'],
    ['{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', 'messages'],
    ['{"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -1}', 'max_completion_tokens'],
    ['{"prompt": "no messages"}', 'messages'],
    ['{"messages": [{"role": "user\\u0000x", "content": "x"}]}', 'messages'],
    ['{"messages": [{"role": "user", "content": "a\\u0000b"}]}', 'messages'],
  ];
  for (const [body, param] of chat) {
    const r = await post(srv, '/v1/chat/completions', body);
    assert.equal(r.status, 400, `${body}: ${r.text}`);
    assert.equal(r.json.error.param, param, body);
  }
});

test('404 unknown route or model, 405 wrong method, 413 too long or too big', async () => {
  let r = await post(srv, '/v1/embeddings', '{"input": "x"}');
  assert.equal(r.status, 404);
  assert.equal(r.json.error.type, 'not_found_error');
  r = await get(srv, '/nothing/here');
  assert.equal(r.status, 404);
  r = await post(srv, '/v1/completions', { model: 'gpt-4', prompt: 'x' });
  assert.equal(r.status, 404);
  assert.equal(r.json.error.code, 'model_not_found');
  assert.equal(r.json.error.param, 'model');
  r = await post(srv, '/v1/chat/completions', { model: 'gpt-4', messages: [{ role: 'user', content: 'x' }] });
  assert.equal(r.status, 404);

  r = await get(srv, '/v1/completions');
  assert.equal(r.status, 405);
  assert.equal(r.headers.get('allow'), 'POST');
  r = await post(srv, '/health', '{}');
  assert.equal(r.status, 405);
  r = await post(srv, '/v1/models', '{"malformed":');
  assert.equal(r.status, 405);

  // Prompt longer than the context (2048): token ids, and text.
  r = await post(srv, '/v1/completions', { prompt: randomTokens(7, 2100) });
  assert.equal(r.status, 413, r.text);
  assert.equal(r.json.error.code, 'context_length_exceeded');
  assert.equal(r.json.error.param, 'prompt');
  r = await post(srv, '/v1/completions', { prompt: 'Once upon a time '.repeat(600) });
  assert.equal(r.status, 413);
  r = await post(srv, '/v1/chat/completions', { messages: [{ role: 'user', content: 'the cat '.repeat(1200) }] });
  assert.equal(r.status, 413);
  assert.equal(r.json.error.param, 'messages');
  // Bodies over --max-body (256K) are refused unread: malformed content does not matter.
  r = await post(srv, '/v1/completions', '{"prompt": "' + 'x'.repeat(300 * 1024));
  assert.equal(r.status, 413);
  assert.equal(r.json.error.code, 'request_too_large');
  // And the server is still fine.
  r = await post(srv, '/v1/completions', { prompt: 'Once', max_tokens: 2 });
  assert.equal(r.status, 200);
});

test('cache_salt: same prompt, other salt, 0 cached tokens', async () => {
  const prompt = randomTokens(99, 100);
  const ask = async (salt) => {
    const body = { prompt, max_tokens: 2, temperature: 0 };
    if (salt !== undefined) body.cache_salt = salt;
    const r = await post(srv, '/v1/completions', body);
    assert.equal(r.status, 200, r.text);
    return r.json.usage.prompt_tokens_details.cached_tokens;
  };
  assert.equal(await ask('tenant-a'), 0);
  assert.equal(await ask('tenant-a'), 96); // whole pages of the first 99 tokens
  assert.equal(await ask('tenant-b'), 0);
  assert.equal(await ask(undefined), 0);
  assert.equal(await ask(undefined), 96);
  assert.equal(await ask('tenant-b'), 96);
});

// issue 10: cancelled requests used to be left out of pagoda_prompt_tokens_total while
// the cached counter (the scheduler's) had them, so a hit ratio passed 100%.
test('metrics: prompt tokens counted once per request, cancelled too; cached <= total', async () => {
  const prompt = randomTokens(4242, 300);
  const m0 = await metrics(srv);
  const first = await post(srv, '/v1/completions', { prompt, max_tokens: 2, temperature: 0 });
  assert.equal(first.status, 200, first.text);
  // Three streams of the same prompt (cache hits), each cancelled after its first token.
  for (let i = 0; i < 3; i++) {
    const { aborted } = await stream(srv, '/v1/completions',
      { prompt, max_tokens: 1500, temperature: 0, ignore_eos: true }, (ev, evs) => evs.length >= 1);
    assert.ok(aborted);
  }
  const d = await until(async () => {
    const v = await metrics(srv);
    const total = v.pagoda_prompt_tokens_total - m0.pagoda_prompt_tokens_total;
    return v.pagoda_requests_running === 0 && total >= 4 * 300 ? { v, total } : null;
  }, 'the cancelled requests to be counted');
  const cached = d.v.pagoda_prompt_tokens_cached_total - m0.pagoda_prompt_tokens_cached_total;
  const computed = d.v.pagoda_prompt_tokens_computed_total - m0.pagoda_prompt_tokens_computed_total;
  console.log(`# 1 finished + 3 cancelled requests of 300 tokens: total ${d.total}, cached ${cached}, computed ${computed}`);
  assert.equal(d.total, 4 * 300);
  assert.equal(cached, 3 * 288); // whole pages of the first 299 tokens, for each hit
  assert.ok(cached <= d.total);
  assert.equal(computed, d.total - cached);
  assert.ok(d.v.pagoda_prompt_tokens_cached_total <= d.v.pagoda_prompt_tokens_total);
  assert.equal(d.v.pagoda_prompt_tokens_computed_total,
    d.v.pagoda_prompt_tokens_total - d.v.pagoda_prompt_tokens_cached_total);
  assert.ok(d.v.pagoda_prefill_tokens_computed_total >= 300, 'the scheduler work counter stays');
});

test('cancellation: a client that goes away frees its pages at once', async () => {
  const before = await metrics(srv);
  assert.equal(before.pagoda_kv_pages_used, 0);
  // Streamed: abort after a few chunks.
  let pagesWhileRunning = 0;
  const { aborted } = await stream(srv, '/v1/completions',
    { prompt: randomTokens(5, 300), max_tokens: 1700, temperature: 0 }, (ev, evs) => evs.length >= 3);
  assert.ok(aborted);
  await until(async () => {
    const v = await metrics(srv);
    return v.pagoda_kv_pages_used === 0 && v.pagoda_requests_running === 0 &&
      v['pagoda_requests_finished_total{reason="cancelled"}'] ===
        before['pagoda_requests_finished_total{reason="cancelled"}'] + 1;
  }, 'the cancelled stream to release its pages');

  // Not streamed: abort while it runs (pages are held then), then they go back.
  const ctl = new AbortController();
  const p = fetch(srv.url + '/v1/completions', {
    method: 'POST', body: JSON.stringify({ prompt: randomTokens(6, 300), max_tokens: 1700 }),
    signal: ctl.signal,
  }).catch((e) => e);
  await until(async () => {
    const v = await metrics(srv);
    pagesWhileRunning = v.pagoda_kv_pages_used;
    return v.pagoda_requests_running === 1 && pagesWhileRunning > 0;
  }, 'the request to run');
  ctl.abort();
  assert.ok((await p) instanceof Error);
  await until(async () => {
    const v = await metrics(srv);
    return v.pagoda_kv_pages_used === 0 && v.pagoda_requests_running === 0 &&
      v['pagoda_requests_finished_total{reason="cancelled"}'] ===
        before['pagoda_requests_finished_total{reason="cancelled"}'] + 2;
  }, 'the cancelled request to release its pages');
  assert.ok(pagesWhileRunning >= 300 / 16);
});

test('8 concurrent requests sharing a 1,000-token prefix: computed once, same outputs', async () => {
  const PREFIX = 1000, N = 8, PT = 16, MAX = 16;
  const prefix = randomTokens(1234, PREFIX);
  const prompts = [];
  let sumSuffix = 0;
  for (let i = 0; i < N; i++) {
    const suf = randomTokens(7001 + 2 * i, 5 + 3 * i); // odd seeds: all distinct
    sumSuffix += suf.length;
    prompts.push(prefix.concat(suf));
  }
  const m0 = await metrics(srv);
  const together = await Promise.all(prompts.map((p) =>
    post(srv, '/v1/completions', { prompt: p, max_tokens: MAX, temperature: 0, cache_salt: 'shared' })));
  const m1 = await metrics(srv);
  for (const r of together) assert.equal(r.status, 200, r.text);
  const computed = m1.pagoda_prompt_tokens_computed_total - m0.pagoda_prompt_tokens_computed_total;
  // One prefix plus the suffixes, plus at most the prefix's last partial page per request.
  assert.ok(computed >= PREFIX + sumSuffix, `computed ${computed}`);
  assert.ok(computed <= PREFIX + sumSuffix + N * PT, `computed ${computed}: prefix recomputed`);
  const full = Math.floor(PREFIX / PT) * PT;
  const late = together.filter((r) => r.json.usage.prompt_tokens_details.cached_tokens >= full);
  assert.equal(late.length, N - 1);
  console.log(`# shared prefix ${PREFIX} + suffixes ${sumSuffix}: computed ${computed} prompt tokens`);

  // The same requests one by one, each on its own tenant (nothing cached): same text.
  for (let i = 0; i < N; i++) {
    const r = await post(srv, '/v1/completions',
      { prompt: prompts[i], max_tokens: MAX, temperature: 0, cache_salt: `solo-${i}` });
    assert.equal(r.json.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal(r.json.choices[0].text, together[i].json.choices[0].text, `request ${i}`);
    assert.equal(r.json.usage.completion_tokens, together[i].json.usage.completion_tokens);
  }
});

test('401 without the API key; /health stays open', async () => {
  const s = await startServer(model.path, ['--api-key', 'sekret', '--ctx', '256']);
  try {
    let r = await post(s, '/v1/completions', '{"prompt": "x"');
    assert.equal(r.status, 401);
    assert.equal(r.json.error.type, 'authentication_error');
    assert.equal(r.json.error.code, 'invalid_api_key');
    r = await post(s, '/v1/completions', { prompt: 'x', max_tokens: 1 }, { authorization: 'Bearer wrong' });
    assert.equal(r.status, 401);
    r = await get(s, '/v1/models');
    assert.equal(r.status, 401);
    r = await post(s, '/v1/completions', { prompt: 'x', max_tokens: 1 }, { authorization: 'Bearer sekret' });
    assert.equal(r.status, 200);
    assert.equal((await get(s, '/health')).status, 200);
  } finally {
    await s.stop();
  }
});

test('429 when the queue is full', async () => {
  const s = await startServer(model.path, ['--max-running', '1', '--max-queued', '1', '--ctx', '4096']);
  try {
    // A runs (long), B waits in the queue, C finds the queue full.
    const ctl = new AbortController();
    const resA = await fetch(s.url + '/v1/completions', {
      method: 'POST', signal: ctl.signal,
      body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 4000, stream: true }),
    });
    const reader = resA.body.getReader();
    await reader.read(); // A is running
    const pB = post(s, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 2 });
    await until(async () => (await metrics(s)).pagoda_requests_waiting === 1, 'B to queue');
    const c = await post(s, '/v1/completions', '{"prompt": "Once upon a time", "max_tokens": 2}');
    assert.equal(c.status, 429, c.text);
    assert.equal(c.json.error.code, 'queue_full');
    assert.equal(c.headers.get('retry-after'), '1', 'a 429 carries Retry-After (issue 10)');
    ctl.abort(); // A goes; B runs
    const b = await pB;
    assert.equal(b.status, 200);
    const v = await metrics(s);
    assert.equal(v['pagoda_http_responses_total{code="429"}'], 1);
  } finally {
    await s.stop();
  }
});

test('503 while shutting down; exit 0', async () => {
  const s = await startServer(model.path, ['--ctx', '256', '--shutdown-grace', '60']);
  // A request whose body is still arriving when SIGTERM comes.
  const body = '{"prompt": "Once upon a time", "max_tokens": 2}';
  const sock = net.connect(s.port, '127.0.0.1');
  await new Promise((r) => sock.on('connect', r));
  let reply = '';
  sock.on('data', (d) => { reply += d.toString(); });
  const closed = new Promise((r) => sock.on('close', r));
  sock.write(`POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n` +
             `Content-Length: ${body.length}\r\nConnection: close\r\n\r\n${body.slice(0, 10)}`);
  await until(async () => (await metrics(s)).pagoda_http_requests_active >= 2, 'the request to be seen');
  s.proc.kill('SIGTERM');
  await s.waitStdout(/shutting down\n/);
  sock.write(body.slice(10));
  await closed;
  assert.match(reply, /^HTTP\/1\.1 503/);
  const json = JSON.parse(reply.slice(reply.indexOf('\r\n\r\n') + 4));
  assert.equal(json.error.code, 'shutting_down');
  const { code } = await s.exited;
  assert.equal(code, 0, s.stderr());
});

// Two identical prompts of 2,000 tokens running at once (greedy: identical outputs too).
// Returns the pages used in a /metrics scrape made after both streamed their first token
// (their prompts are then wholly in the cache) that saw both still running.
async function pagesOfTwoIdentical(extra, maxTokens) {
  const s = await startServer(model.path, ['--ctx', '8192', '--max-running', '2', ...extra]);
  try {
    const body = { prompt: randomTokens(7, 2000), max_tokens: maxTokens, temperature: 0,
                   ignore_eos: true, stream: true };
    const ctls = [new AbortController(), new AbortController()];
    const readers = await Promise.all(ctls.map(async (c) => {
      const res = await fetch(s.url + '/v1/completions', {
        method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body), signal: c.signal,
      });
      assert.equal(res.status, 200);
      return res.body.getReader();
    }));
    // The first chunk of each stream holds its first token.
    await Promise.all(readers.map((r) => r.read()));
    const v = await metrics(s);
    for (const c of ctls) c.abort();
    assert.equal(v.pagoda_requests_running, 2, 'both still running at the scrape');
    return v.pagoda_kv_pages_used;
  } finally {
    await s.stop();
  }
}

test('--no-prefix-cache shares nothing: 2 identical prompts hold twice the pages', async () => {
  const promptPages = Math.floor(2000 / 16);
  // Shared: the prompt's full pages once (and the identical greedy outputs' pages too).
  const shared = await pagesOfTwoIdentical([], 1500); // < 2 * promptPages whatever it generated
  assert.ok(shared < 2 * promptPages, `prefix cache on: ${shared} pages used`);
  // Not shared: each request holds its own copy of every page.
  const own = await pagesOfTwoIdentical(['--no-prefix-cache'], 6000);
  assert.ok(own >= 2 * promptPages, `--no-prefix-cache: ${own} pages used`);
  assert.ok(own > shared);
  console.log(`pages used by 2 identical running prompts: shared ${shared}, --no-prefix-cache ${own}`);
});

test('shutdown is bounded: idle keep-alive connection + stream in flight, SIGTERM, exit 0', async () => {
  const grace = 1;
  const s = await startServer(model.path,
    ['--ctx', '16384', '--kv-memory', '64M', '--shutdown-grace', String(grace)]);
  // An idle keep-alive connection: one request answered, the socket kept open.
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  await new Promise((resolve, reject) => {
    http.get(s.url + '/health', { agent }, (res) => { res.resume(); res.on('end', resolve); })
      .on('error', reject);
  });
  assert.equal(Object.values(agent.freeSockets).flat().length, 1, 'one idle keep-alive socket');
  // A stream that would run far longer than the grace period.
  const ctl = new AbortController();
  const res = await fetch(s.url + '/v1/completions', {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 16000, ignore_eos: true,
                           stream: true }),
    signal: ctl.signal,
  });
  assert.equal(res.status, 200);
  const reader = res.body.getReader();
  await reader.read(); // it is generating
  const drained = (async () => { try { for (;;) { if ((await reader.read()).done) break; } } catch { /* cut */ } })();
  s.proc.kill('SIGTERM');
  // A bound against hanging, not a timing assertion: grace + the teardown's own bound.
  let timer;
  const hung = new Promise((r) => { timer = setTimeout(() => r({ hung: true }), (grace + 30) * 1000); });
  const r = await Promise.race([s.exited, hung]);
  clearTimeout(timer);
  if (r.hung) s.proc.kill('SIGKILL');
  assert.ok(!r.hung, `pagoda serve still running ${grace + 30} s after SIGTERM:\n${s.stderr()}`);
  assert.equal(r.code, 0, s.stderr());
  assert.doesNotMatch(s.stderr(), /did not finish|exiting now/, 'the watchdog was not needed');
  await drained;
  ctl.abort();
  agent.destroy();
});

// Peak resident memory of a process (VmHWM), in MB; null where /proc is missing.
function peakRssMB(pid) {
  try {
    const st = readFileSync(`/proc/${pid}/status`, 'utf8');
    const m = st.match(/VmHWM:\s+(\d+) kB/);
    return m ? Number(m[1]) / 1024 : null;
  } catch { return null; }
}

// issue 10: a 16 MB prompt was tokenized twice before its 413 (16 s of CPU on
// stories260K, +512 MB RSS). Now its token count is bounded from its length: refused in
// milliseconds, and the server allocates a small multiple of the body at most.
test('a 16 MB prompt gets its 413 fast, without hundreds of MB (text, chat, token ids)', async () => {
  const s = await startServer(model.path, ['--ctx', '2048', '--max-body', '40M']);
  try {
    const text = 'Once upon a time '.repeat(Math.floor((16 << 20) / 17));
    const bodies = [
      ['text', '/v1/completions', JSON.stringify({ prompt: text })],
      ['chat', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: text }] })],
      ['token ids', '/v1/completions', '{"prompt":[' + '1,'.repeat(8 << 20) + '1]}'],
    ];
    const rss0 = peakRssMB(s.proc.pid);
    for (const [what, route, body] of bodies) {
      const t0 = performance.now();
      const r = await post(s, route, body);
      const ms = performance.now() - t0;
      const rss = peakRssMB(s.proc.pid);
      console.log(`# 16 MB ${what} prompt: ${r.status} in ${ms.toFixed(0)} ms, peak RSS ` +
                  `${rss0 === null ? '?' : `${rss0.toFixed(0)} -> ${rss.toFixed(0)}`} MB`);
      assert.equal(r.status, 413, r.text.slice(0, 300));
      assert.ok(['context_length_exceeded', 'request_too_large'].includes(r.json.error.code));
      assert.ok(ms < 5000, `${what}: ${ms} ms`);
      if (rss0 !== null) assert.ok(rss - rss0 < 300, `${what}: peak RSS grew by ${rss - rss0} MB`);
    }
    // A prompt just under the context still works, one just over gets the exact count.
    let r = await post(s, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 2 });
    assert.equal(r.status, 200);
    r = await post(s, '/v1/completions', { prompt: randomTokens(3, 2048) });
    assert.equal(r.status, 413);
    assert.match(r.json.error.message, /has 2048 tokens/);
  } finally {
    await s.stop();
  }
});

// issue 10: text in a chat message that spells a control token became that token, so a
// user could forge turn boundaries. Message content is plain text now; the template's
// own markers are still control tokens; --parse-special-in-messages keeps the old way.
test('chat: control-token text in a message stays text (--parse-special-in-messages: parsed)', async () => {
  if (!model.stories) return; // needs stories260K's "</s>" (EOS, a control token)
  const chat = { messages: [{ role: 'user', content: 'Hi</s> there' }], max_tokens: 1, temperature: 0 };
  // The plain template renders this text; a completion parses special tokens in it.
  const same = { prompt: 'User: Hi</s> there\nAssistant:', max_tokens: 1, temperature: 0 };
  const asText = (await post(srv, '/v1/chat/completions', chat)).json.usage.prompt_tokens;
  const parsed = (await post(srv, '/v1/completions', same)).json.usage.prompt_tokens;
  console.log(`# 'Hi</s> there' in a chat message: ${asText} prompt tokens; parsed as EOS: ${parsed}`);
  assert.ok(asText > parsed, 'the four characters of "</s>" take more than one token');
  const s = await startServer(model.path, ['--ctx', '256', '--parse-special-in-messages']);
  try {
    const old = (await post(s, '/v1/chat/completions', chat)).json.usage.prompt_tokens;
    assert.equal(old, parsed);
  } finally {
    await s.stop();
  }
});
