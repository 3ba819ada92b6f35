// SPDX-License-Identifier: MIT
// test_tiers.mjs - the storage tiers below the pool (issue 11) through the real
// `pagoda serve`, on a pool of 20 pages (--ctx 256, --kv-memory 200K: 320 f16 tokens of
// stories260K) so that a few prompts evict it, over a RAM tier and a disk tier in a
// temporary directory (loopback only):
//   - a prompt cached in the pool: usage.pagoda.cached_tokens_by_tier.pool > 0, the keys
//     are "pool", "ram", "disk" and add up to prompt_tokens_details.cached_tokens, in
//     completions and chat, streamed (final usage chunk) and not;
//   - the prompt pushed out of the pool by other prompts: served from "ram";
//   - a multi-turn conversation whose pages were evicted while the user was away resumes
//     from the tiers: turn N+1 computes only its new tokens plus at most one partial page;
//   - /metrics has the tier families (tier="ram", tier="disk"), the latency histograms and
//     the preemptions by kind;
//   - after a restart on the same disk directory: served from "disk" (the RAM tier starts
//     empty; records the prefetch staged in RAM still count as found in "disk"), and
//     from "disk" with the disk tier alone;
//   - write-through: a clean restart with no eviction in between serves from "disk", and
//     so does one after kill -9 during writes, with the cold greedy outputs;
//   - a second server on a disk directory in use exits 1 with a clear error; two tiers of
//     one name get the keys "disk" and "disk2".
// Every greedy answer (temperature 0) equals the first cold one of its prompt.
// Run by ctest (labels integration, thread, http); see common.mjs for the environment.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  requireSetup, startServer, post, stream, metrics, until, randomTokens, sleep, BIN,
} from './common.mjs';

const model = requireSetup();
const PAGE = 16;
const MAX = 8; // completion tokens of each request
const T = { timeout: 120000 }; // a bound on each test, not a timing assertion
const dir = mkdtempSync(path.join(os.tmpdir(), 'pagoda-tiers-'));
const diskDir = path.join(dir, 'disk');
// 20 pages in the pool; the RAM tier holds ~48 pages of records, the disk tier plenty.
const SERVE = ['--ctx', '256', '--kv-memory', '200K', '--max-running', '4'];
const TIERS = ['--tier', 'ram:512K', '--tier', `disk:${diskDir}:16M`];
let srv;
let fillerSeed = 1000;

before(async () => { srv = await startServer(model.path, [...SERVE, ...TIERS]); });
after(async () => {
  try { if (srv) await srv.stop(); } finally { rmSync(dir, { recursive: true, force: true }); }
});

const P1 = randomTokens(1, 100);
let cold1 = null; // the first (cold) answer to P1

function byTier(u, keys = ['pool', 'ram', 'disk']) {
  assert.ok(u && u.pagoda && u.pagoda.cached_tokens_by_tier, `usage.pagoda: ${JSON.stringify(u)}`);
  const t = u.pagoda.cached_tokens_by_tier;
  assert.deepEqual(Object.keys(t), keys);
  assert.equal(keys.reduce((a, k) => a + t[k], 0), u.prompt_tokens_details.cached_tokens,
    `the tiers add up to cached_tokens: ${JSON.stringify(u)}`);
  return t;
}

async function complete(prompt, extra = {}, keys = undefined) {
  const r = await post(srv, '/v1/completions', { prompt, max_tokens: MAX, temperature: 0, ...extra });
  assert.equal(r.status, 200, r.text);
  return { text: r.json.choices[0].text, usage: r.json.usage, t: byTier(r.json.usage, keys) };
}

// Prompts no other request shares: each pushes ~12 pages through the pool.
async function otherTraffic(n) {
  for (let i = 0; i < n; i++) await complete(randomTokens(fillerSeed++, 200));
}

// Waits until the write-back queue is empty (twice, 100 ms apart: a mover may hold the
// last page it took), so that evicted pages are in the RAM tier.
async function writebackDone() {
  await until(async () => {
    const m1 = await metrics(srv);
    if (m1.pagoda_tier_writeback_queue_pages !== 0) return false;
    await sleep(100);
    return (await metrics(srv)).pagoda_tier_writeback_queue_pages === 0;
  }, 'the write-back queue to drain');
}

test('a prompt cached in the pool: by_tier.pool, completions and chat, streamed or not', T, async () => {
  const c = await complete(P1);
  cold1 = c.text;
  assert.deepEqual(c.t, { pool: 0, ram: 0, disk: 0 });
  const h = await complete(P1);
  assert.equal(h.text, cold1);
  assert.ok(h.t.pool > 0, JSON.stringify(h.usage));
  console.log(`# in the pool: ${JSON.stringify(h.t)} of ${h.usage.prompt_tokens} prompt tokens`);
  assert.equal(h.t.ram + h.t.disk, 0);

  // Streamed: the usage of the last chunk has the split too (include_usage or not).
  for (const so of [undefined, { include_usage: true }]) {
    const body = { prompt: P1, max_tokens: MAX, temperature: 0 };
    if (so) body.stream_options = so;
    const { events } = await stream(srv, '/v1/completions', body);
    const chunks = events.slice(0, -1);
    const u = chunks.at(-1).usage;
    assert.ok(byTier(u).pool > 0, JSON.stringify(u));
    assert.equal(chunks.map((k) => (k.choices[0] ? k.choices[0].text : '')).join(''), cold1);
  }

  // Chat, whole and streamed: the same keys.
  const chat = { messages: [{ role: 'user', content: 'Tell me a story about a cat who lived in '
    + 'a big house with a garden full of flowers, and about the birds that sang there.' }],
                 max_tokens: MAX, temperature: 0 };
  const r1 = await post(srv, '/v1/chat/completions', chat);
  assert.equal(r1.status, 200, r1.text);
  byTier(r1.json.usage);
  const { events } = await stream(srv, '/v1/chat/completions',
    { ...chat, stream_options: { include_usage: true } });
  const u = events.at(-2).usage;
  assert.ok(byTier(u).pool > 0, JSON.stringify(u));
});

test('a prompt pushed out of the pool by other prompts is served from the RAM tier', T, async () => {
  assert.ok(cold1 !== null);
  await otherTraffic(3); // 36 pages through a pool of 20
  await writebackDone();
  const r = await complete(P1);
  assert.ok(r.t.ram > 0, `from ram: ${JSON.stringify(r.usage)}`);
  console.log(`# after other traffic: ${JSON.stringify(r.t)}`);
  assert.equal(r.text, cold1, 'greedy output from promoted pages equals the cold one');
  // A cold recompute (another salt shares nothing) gives the same answer too.
  const s = await complete(P1, { cache_salt: 'cold' });
  assert.equal(s.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(s.text, cold1);
});

test('multi-turn: a conversation evicted while the user was away resumes from the tiers', T, async () => {
  const messages = [{ role: 'user', content: 'Once upon a time there was a little dog named '
    + 'Max. He liked to run in the park with his friends every day.' }];
  let prev = null;
  for (let turn = 0; turn < 3; turn++) {
    const body = { messages, max_tokens: 24, temperature: 0 };
    const r = await post(srv, '/v1/chat/completions', body);
    assert.equal(r.status, 200, r.text);
    const u = r.json.usage;
    const t = byTier(u);
    const answer = r.json.choices[0].message.content;
    if (prev) {
      // The turn's new tokens: beyond the previous prompt and its answer.
      const fresh = u.prompt_tokens - (prev.prompt_tokens + prev.completion_tokens);
      const computed = u.prompt_tokens - u.prompt_tokens_details.cached_tokens;
      assert.ok(fresh > 0);
      assert.ok(t.ram + t.disk > 0, `turn ${turn} resumed from the tiers: ${JSON.stringify(u)}`);
      console.log(`# turn ${turn}: ${JSON.stringify(t)}, prompt ${u.prompt_tokens}, new ${fresh}, `
        + `computed ${computed}`);
      assert.ok(computed <= fresh + PAGE,
        `turn ${turn} computed ${computed} tokens, new ${fresh}: ${JSON.stringify(u)}`);
    }
    // The same turn computed cold (another salt) gives the same answer.
    const cold = await post(srv, '/v1/chat/completions', { ...body, cache_salt: `mt-${turn}` });
    assert.equal(cold.json.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal(cold.json.choices[0].message.content, answer);
    prev = u;
    messages.push({ role: 'assistant', content: answer });
    messages.push({ role: 'user', content: 'And then what happened to the dog?' });
    // The user is away: other traffic evicts the conversation's pages from the pool.
    await otherTraffic(3);
    await writebackDone();
  }
});

test('/metrics: the tier families by tier, latency histograms, preemptions by kind', T, async () => {
  const m = await metrics(srv);
  for (const tier of ['ram', 'disk']) {
    for (const f of ['bytes_used', 'bytes_capacity', 'records', 'full', 'hit_pages_total',
                     'hit_tokens_total', 'miss_pages_total', 'miss_tokens_total',
                     'promoted_pages_total', 'promoted_bytes_total', 'demoted_pages_total',
                     'demoted_bytes_total', 'demote_dropped_total', 'checksum_failures_total',
                     'io_errors_total', 'put_refused_total']) {
      const k = `pagoda_tier_${f}{tier="${tier}"}`;
      assert.equal(typeof m[k], 'number', `${k} is on the page`);
    }
    assert.equal(m[`pagoda_tier_get_latency_seconds_bucket{tier="${tier}",le="+Inf"}`],
      m[`pagoda_tier_get_latency_seconds_count{tier="${tier}"}`]);
    assert.equal(typeof m[`pagoda_tier_put_latency_seconds_bucket{tier="${tier}",le="1e-05"}`],
      'number');
  }
  assert.equal(m['pagoda_tier_bytes_capacity{tier="ram"}'], 512 * 1024);
  assert.equal(m['pagoda_tier_bytes_capacity{tier="disk"}'], 16 * 1024 * 1024);
  assert.ok(m['pagoda_tier_records{tier="ram"}'] > 0);
  assert.ok(m['pagoda_tier_bytes_used{tier="ram"}'] > 0);
  assert.ok(m['pagoda_tier_demoted_pages_total{tier="ram"}'] > 0);
  assert.ok(m['pagoda_tier_hit_tokens_total{tier="ram"}'] > 0);
  assert.ok(m['pagoda_tier_promoted_pages_total{tier="ram"}'] > 0);
  assert.ok(m['pagoda_tier_put_latency_seconds_count{tier="ram"}'] > 0);
  assert.ok(m['pagoda_tier_get_latency_seconds_count{tier="ram"}'] > 0);
  assert.ok(m['pagoda_tier_get_latency_seconds_sum{tier="ram"}'] > 0);
  assert.ok(m['pagoda_tier_put_latency_seconds_sum{tier="ram"}'] > 0);
  assert.equal(m['pagoda_tier_checksum_failures_total{tier="ram"}'], 0);
  assert.equal(typeof m.pagoda_tier_writeback_queue_pages, 'number');
  for (const kind of ['swap', 'recompute'])
    assert.equal(typeof m[`pagoda_preemptions_by_kind_total{kind="${kind}"}`], 'number');
  assert.equal(m['pagoda_preemptions_by_kind_total{kind="swap"}']
    + m['pagoda_preemptions_by_kind_total{kind="recompute"}'], m.pagoda_preemptions_total);
});

test('after a restart on the same disk directory the prompt is served from disk', T, async () => {
  assert.ok(cold1 !== null);
  // Enough traffic for the RAM tier to spill the prompt's records to the disk tier.
  await otherTraffic(8);
  await writebackDone();
  await srv.stop(); // SIGTERM: write-back finishes (pgd_cache_flush), exit 0
  srv = null;

  // The same two tiers: the RAM tier starts empty, so every cached token was found in
  // the disk tier. The prefetch at submit may stage the disk's records in the RAM tier
  // before the match promotes them; the split still names the tier they were found in.
  srv = await startServer(model.path, [...SERVE, ...TIERS]);
  let r = await complete(P1);
  console.log(`# after the restart (ram + disk): ${JSON.stringify(r.t)}`);
  assert.equal(r.t.pool, 0);
  assert.equal(r.t.ram, 0, `nothing was in RAM: ${JSON.stringify(r.usage)}`);
  assert.ok(r.t.disk > 0, `from disk: ${JSON.stringify(r.usage)}`);
  assert.equal(r.text, cold1, 'greedy output from disk-restored pages equals the cold one');
  let m = await metrics(srv);
  assert.ok(m['pagoda_tier_get_latency_seconds_count{tier="disk"}'] > 0, 'records read from disk');
  assert.equal(m['pagoda_tier_checksum_failures_total{tier="disk"}'], 0);
  await srv.stop();
  srv = null;

  // The disk tier alone (nothing to stage through): usage says "disk".
  srv = await startServer(model.path, [...SERVE, '--tier', `disk:${diskDir}:16M`]);
  r = await complete(P1, {}, ['pool', 'disk']);
  console.log(`# after the restart (disk): ${JSON.stringify(r.t)}`);
  assert.ok(r.t.disk > 0, `from disk: ${JSON.stringify(r.usage)}`);
  assert.equal(r.text, cold1, 'greedy output from disk-restored pages equals the cold one');
  m = await metrics(srv);
  assert.ok(m['pagoda_tier_records{tier="disk"}'] > 0);
  assert.ok(m['pagoda_tier_hit_tokens_total{tier="disk"}'] > 0);
  assert.equal(m['pagoda_tier_checksum_failures_total{tier="disk"}'], 0);
  await srv.stop();
  srv = null;
  srv = await startServer(model.path, [...SERVE, ...TIERS]); // for the tests below
});

test('write-through: a restart, even after kill -9, serves what was committed', T, async () => {
  assert.ok(cold1 !== null);
  const wtDir = path.join(dir, 'wt');
  const WT = [...SERVE, '--tier', `disk:${wtDir}:4M:write-through`];
  let s1 = await startServer(model.path, WT);
  const P2 = randomTokens(2, 100);
  const first = await post(s1, '/v1/completions', { prompt: P1, max_tokens: MAX, temperature: 0 });
  assert.equal(first.json.choices[0].text, cold1);
  const cold2 = (await post(s1, '/v1/completions',
    { prompt: P2, max_tokens: MAX, temperature: 0 })).json.choices[0].text;
  await s1.stop(); // no eviction happened: the disk has the pages because of write-through
  s1 = await startServer(model.path, WT);
  const r = await post(s1, '/v1/completions', { prompt: P1, max_tokens: MAX, temperature: 0 });
  const t = byTier(r.json.usage, ['pool', 'disk']);
  console.log(`# write-through, after a clean restart: ${JSON.stringify(t)}`);
  assert.ok(t.disk > 0, JSON.stringify(r.json.usage));
  assert.equal(r.json.choices[0].text, cold1);
  // kill -9 with other prompts in flight (computed, written through): what is served
  // after the restart verifies, and greedy outputs stay those of a cold recompute.
  const busy = [];
  for (let i = 0; i < 4; i++)
    busy.push(post(s1, '/v1/completions', { prompt: randomTokens(3000 + i, 200), max_tokens: 4 })
      .catch(() => null));
  await sleep(20);
  s1.proc.kill('SIGKILL');
  await s1.exited;
  await Promise.all(busy);
  s1 = await startServer(model.path, WT);
  try {
    for (const [p, cold] of [[P1, cold1], [P2, cold2]]) {
      const q = await post(s1, '/v1/completions', { prompt: p, max_tokens: MAX, temperature: 0 });
      const u = byTier(q.json.usage, ['pool', 'disk']);
      assert.ok(u.disk > 0, JSON.stringify(q.json.usage));
      assert.equal(q.json.choices[0].text, cold);
    }
    const m = await metrics(s1);
    assert.equal(m['pagoda_tier_io_errors_total{tier="disk"}'], 0);
  } finally {
    await s1.stop();
  }
});

// Runs `pagoda serve` expecting it to exit by itself; resolves { code, stderr }.
function runToExit(args, ms = 60000) {
  return new Promise((resolve, reject) => {
    const p = spawn(BIN, ['serve', '-m', model.path, '--host', '127.0.0.1', '--port', '0',
                          '-t', '1', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let err = '';
    p.stderr.on('data', (d) => { err += d; });
    const timer = setTimeout(() => { p.kill('SIGKILL'); reject(new Error(`still running: ${err}`)); }, ms);
    p.on('exit', (code) => { clearTimeout(timer); resolve({ code, stderr: err }); });
  });
}

test('a disk directory in use by another server: exit 1, a clear error', T, async () => {
  const r = await runToExit([...SERVE, ...TIERS]);
  assert.equal(r.code, 1, r.stderr);
  assert.match(r.stderr, /in use|locked|lock/i, r.stderr);
  assert.ok(r.stderr.includes(diskDir), `the error names the directory: ${r.stderr}`);
});

test('two tiers of one name: keys "disk" and "disk2"', T, async () => {
  const two = await startServer(model.path, ['--ctx', '256', '--tier',
    `disk:${path.join(dir, 'a')}:1M`, '--tier', `disk:${path.join(dir, 'b')}:1M`]);
  try {
    const r = await post(two, '/v1/completions', { prompt: P1, max_tokens: 2, temperature: 0 });
    assert.equal(r.status, 200, r.text);
    assert.deepEqual(Object.keys(r.json.usage.pagoda.cached_tokens_by_tier), ['pool', 'disk', 'disk2']);
    const m = await metrics(two);
    assert.equal(m['pagoda_tier_bytes_capacity{tier="disk2"}'], 1024 * 1024);
  } finally {
    await two.stop();
  }
});
