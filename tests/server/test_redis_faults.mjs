// SPDX-License-Identifier: MIT
// test_redis_faults.mjs - the faults of a Redis shared by `pagoda serve` instances A and B
// (issue 12), end to end with a real redis-server on 127.0.0.1 (redis.mjs); every greedy
// answer must equal the cold one of its prompt (A's first), nothing wrong is ever served:
//   - Redis SIGKILLed during a load of 16 concurrent requests on A: none fails; /metrics
//     shows the outage (pagoda_tier_nodes_up 0) and requests still answer; Redis restarted
//     on the same port: the tier reconnects (reconnects_total > 0, nodes_up 1 within a
//     bounded wait) and a later prompt is written to Redis again;
//   - restarted empty: B gets misses only (cached_tokens_by_tier.redis 0) and answers right;
//   - every record of a prompt overwritten with garbage by redis-cli (random bytes of the
//     record's length; a short string): B's answer is the cold one, redis 0, and B counts
//     mac_failures_total;
//   - records forged with another key: the record bytes A wrote with the MAC recomputed
//     (AES-256-GMAC, tier_redis.h) under another key (the test first checks that the MAC it
//     computes with the shared key is the one A wrote); and the records of a third
//     instance C with another --hash-key-file (which keys the block hashes too: C's key
//     names share nothing with A's) copied under A's key names: rejected, counted, never
//     served; a record left alone is served;
//   - records whose MAC verifies (recomputed with the shared key) but with a payload byte
//     flipped, or of another KV type (an instance with --kv-type f32: other IDENT, same
//     blocks): rejected as damaged (checksum_failures_total) or foreign
//     (foreign_records_total), never served;
//   - Redis slow (a proxy delaying every chunk by 500 ms between B2 and Redis): B2's
//     requests finish within 30 s with the cold answers; timeouts or deadline misses are
//     counted; B2 still stops cleanly.
// Skips (77) without redis-server / redis-cli or a model.
// Run by ctest (labels integration, thread, http, redis); see common.mjs for the environment.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createCipheriv, createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { writeFileSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { requireSetup, post, metrics, randomTokens } from './common.mjs';
import {
  requireRedis, startRedis, startProxy, keys, command, redisCli, tempDir, killChildren,
  tierMetric, instances, complete, written, waitFor, MAX_TOKENS,
} from './redis.mjs';

requireRedis();
// The prompt of a seed (randomTokens starts from seed | 1: seeds 2k and 2k+1 would agree).
const tokens = (seed, n) => randomTokens(2 * seed + 1, n);
const model = requireSetup();
const T = { timeout: 120000 }; // a bound on each test, not a timing assertion
const dir = tempDir('pagoda-redis-faults-');
const keyFile = path.join(dir, 'hash.key');
writeFileSync(keyFile, Buffer.from('pagoda issue 12 fault-test key..'));
// Room for the 16 concurrent requests of the load (16 x ~8 pages) in the pool.
const SERVE = ['--ctx', '512', '--kv-memory', '2M', '--max-running', '4'];
const inst = instances(model.path, keyFile, SERVE);
// A and B: a second for a get and a command, so that a hit never depends on scheduling (a
// loaded machine, a sanitizer build); B2 of the slow test keeps the defaults (20 ms + 2 ms
// per page, 200 ms): their deadline is what it tests.
const RELAXED = 'deadline_ms=1000&timeout_ms=1000';
let redis = null, A = null, B = null, url = '';
const cold = new Map(); // prompt seed -> A's first (cold) answer

before(async () => {
  redis = await startRedis();
  url = `redis://127.0.0.1:${redis.port}?${RELAXED}`;
  A = await inst.start(url);
  B = await inst.start(url);
});
after(async () => {
  try {
    await inst.stopAll();
  } finally {
    if (redis) await redis.stop();
    killChildren();
  }
});

const m = async (srv, name) => tierMetric(await metrics(srv), name);
const dbsize = async () => Number(await command(redis.port, 'DBSIZE'));

// A prompt computed by A (cold: the reference answer of its seed), written to Redis;
// returns { prompt, text, keys: the keys it added }.
async function computedByA(seed, n = 100) {
  const prompt = tokens(seed, n);
  // Every instance's writes done first: a value B rejected in an earlier test is DELed,
  // then SET again by B, and a key SET after this snapshot would count as A's.
  for (const s of [A, B]) await written(s, null);
  const before = new Set(await keys(redis.port));
  const m0 = await metrics(A);
  const a = await complete(A, prompt);
  assert.equal(a.t.redis, 0, `a cold prompt: ${JSON.stringify(a.usage)}`);
  cold.set(seed, a.text);
  await written(A, m0);
  const added = (await keys(redis.port)).filter((k) => !before.has(k));
  assert.ok(added.length >= Math.floor(n / 16), `A wrote the prompt's records: ${added.length}`);
  return { prompt, text: a.text, keys: added };
}

// B waits (bounded) until its tier is connected, sending a request now and then so that a
// connection broken by a Redis restart is noticed.
async function connected(srv) {
  let i = 0;
  await waitFor(async () => {
    if (await m(srv, 'pagoda_tier_nodes_up') === 1) return true;
    if (i++ % 10 === 0) await complete(srv, tokens(900 + i, 20));
    return false;
  }, 'the tier to be connected', 30000, 100);
}

test('Redis killed during load: no request fails; the outage shows; reconnect', T, async () => {
  assert.equal(await m(A, 'pagoda_tier_nodes_up'), 1);
  const seeds = Array.from({ length: 16 }, (_, i) => 100 + i);
  const load = seeds.map((s) => post(A, '/v1/completions',
    { prompt: tokens(s, 100), max_tokens: MAX_TOKENS, temperature: 0 }));
  let answered = 0;
  load.forEach((p) => p.then(() => { answered++; }, () => {}));
  await Promise.race(load); // the first answered: the rest run, their pages are being written
  const inFlight = 16 - answered; // 4 run at once (--max-running 4): >= 11 are left
  const killed = redis.kill('SIGKILL'); // the signal is sent now
  console.log(`# Redis killed with ${inFlight} of 16 requests in flight`);
  assert.ok(inFlight > 0);
  await killed;
  const res = await Promise.all(load);
  const failed = res.filter((r) => r.status !== 200);
  assert.equal(failed.length, 0, `failed requests: ${failed.map((r) => r.text).join('\n')}`);
  res.forEach((r, i) => cold.set(seeds[i], r.json.choices[0].text));

  // The outage: nodes_up 0 (the tier notices at its next command: requests keep coming).
  let k = 0;
  await waitFor(async () => {
    if (await m(A, 'pagoda_tier_nodes_up') === 0) return true;
    await complete(A, tokens(200 + k++, 40)); // answers (status 200), computed
    return false;
  }, 'nodes_up 0 after the kill', 20000, 100);
  const ma = await metrics(A);
  console.log(`# down: nodes_up ${tierMetric(ma, 'pagoda_tier_nodes_up')}, `
    + `timeouts ${tierMetric(ma, 'pagoda_tier_timeouts_total')}, `
    + `connect failures ${tierMetric(ma, 'pagoda_tier_connect_failures_total')}`);
  assert.equal(tierMetric(ma, 'pagoda_tier_nodes'), 1);
  // While it is down, requests compute and answer right.
  const d = await complete(A, tokens(seeds[3], 100), { cache_salt: 'outage' });
  assert.equal(d.t.redis, 0);
  assert.equal(d.text, cold.get(seeds[3]));

  // Restarted on the same port (empty: no persistence): the tier reconnects with backoff.
  // The load's demotions first run out (on a busy machine the movers' puts, at nice 19,
  // can still be queued here): refused while Redis is down, they are dropped, and a later
  // one would fill the restarted Redis with pages these tests expect it not to hold.
  for (const s of [A, B]) await written(s, null);
  redis = await startRedis({ port: redis.port, dir: redis.dir });
  const t0 = Date.now();
  await waitFor(async () => {
    const x = await metrics(A);
    return tierMetric(x, 'pagoda_tier_nodes_up') === 1
      && tierMetric(x, 'pagoda_tier_reconnects_total') > 0;
  }, 'A to reconnect (reconnects_total > 0, nodes_up 1)', 20000, 50);
  console.log(`# A reconnected ${Date.now() - t0} ms after the restart`);
  assert.ok((await m(A, 'pagoda_tier_connect_failures_total')) > 0, 'attempts while down failed');
  // A later prompt is written again.
  assert.equal(await dbsize(), 0, 'restarted empty');
  const later = await computedByA(300);
  assert.equal(await dbsize(), later.keys.length, 'Redis holds what A wrote since, only');
});

test('Redis restarted empty: B gets misses only and answers right', T, async () => {
  assert.ok(cold.size >= 16);
  for (const s of [100, 101, 102, 115]) {
    const r = await complete(B, tokens(s, 100));
    assert.equal(r.t.redis, 0, `seed ${s}: nothing in Redis: ${JSON.stringify(r.usage)}`);
    assert.equal(r.text, cold.get(s), `seed ${s}: B's answer is the cold one`);
  }
  // A too: what its pool lost is recomputed, the answers stay.
  for (const s of [100, 115]) {
    const r = await complete(A, tokens(s, 100));
    assert.equal(r.t.redis, 0, JSON.stringify(r.usage));
    assert.equal(r.text, cold.get(s));
  }
  await connected(B);
  assert.ok(await m(B, 'pagoda_tier_reconnects_total') > 0);
});

test('records overwritten with garbage: B computes, counts MAC failures, serves none', T, async () => {
  await connected(B);
  // Random bytes of each record's length (redis-cli -x: binary from stdin) ...
  const g = await computedByA(400);
  for (const k of g.keys) {
    const len = (await command(redis.port, 'GET', k)).length;
    const out = await redisCli(redis.port, ['-x', 'SET', k], 30000, randomBytes(len));
    assert.equal(out.trim(), 'OK');
  }
  const mac0 = await m(B, 'pagoda_tier_mac_failures_total');
  const mb = await metrics(B);
  const r = await complete(B, g.prompt);
  assert.equal(r.t.redis, 0, `garbage is never served: ${JSON.stringify(r.usage)}`);
  assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(r.text, g.text);
  const mac1 = await m(B, 'pagoda_tier_mac_failures_total');
  assert.ok(mac1 > mac0, `MAC failures counted: ${mac0} -> ${mac1}`);
  await written(B, mb); // B writes what it computed

  // ... and a short string (KEYS 'pgd:*', then SET each that is new).
  const s = await computedByA(401);
  const all = (await redisCli(redis.port, ['--raw', 'KEYS', 'pgd:*'])).split('\n').filter(Boolean);
  for (const k of s.keys) {
    assert.ok(all.includes(k));
    assert.equal((await redisCli(redis.port, ['SET', k, 'garbage'])).trim(), 'OK');
  }
  const mb2 = await metrics(B);
  const r2 = await complete(B, s.prompt);
  assert.equal(r2.t.redis, 0, JSON.stringify(r2.usage));
  assert.equal(r2.text, s.text);
  const mac2 = await m(B, 'pagoda_tier_mac_failures_total');
  console.log(`# B's MAC failures: ${mac0} -> ${mac1} (random) -> ${mac2} (short)`);
  assert.ok(mac2 > mac1, `a short value fails the MAC too: ${mac1} -> ${mac2}`);
  await written(B, mb2);
});

// A Redis value as the tier writes it (tier_redis.h, "KEYS AND VALUES"), here in node so
// that the test can forge one: record || trailer, the trailer of the default MAC
// (mac=gmac) nonce (12) || tag (16) || "PGM1", tag = AES-256-GCM(mac_key, nonce,
// AAD = "pagoda-gmac-v1" || key name || record) with no plaintext, and mac_key =
// HMAC-SHA256(shared key, "pagoda redis record v1 gmac"). (mac=hmac: HMAC-SHA256(mac_key,
// key name || record) || "PGH1", not used by these instances.)
const GMAC_TRAILER = 12 + 16 + 4;
function gmacTag(key, k, record, nonce) {
  const macKey = createHmac('sha256', key).update('pagoda redis record v1 gmac').digest();
  const c = createCipheriv('aes-256-gcm', macKey, nonce);
  c.setAAD(Buffer.concat([Buffer.from('pagoda-gmac-v1'), Buffer.from(k, 'latin1'), record]));
  c.final();
  return c.getAuthTag();
}
const recordOf = (v) => v.subarray(0, v.length - GMAC_TRAILER);
function sealValue(key, k, record) {
  const nonce = randomBytes(12);
  return Buffer.concat([record, nonce, gmacTag(key, k, record, nonce), Buffer.from('PGM1')]);
}
function verifyValue(key, k, v) {
  if (v.length < GMAC_TRAILER || v.subarray(v.length - 4).toString('latin1') !== 'PGM1')
    return false;
  const t = v.subarray(v.length - GMAC_TRAILER);
  return timingSafeEqual(gmacTag(key, k, recordOf(v), t.subarray(0, 12)), t.subarray(12, 28));
}

test('records forged with another key: rejected, counted, never served', T, async () => {
  await connected(B);
  const f = await computedByA(500);
  const good = readFileSync(keyFile);
  const other = Buffer.from('an attacker key, not the shared');
  for (const k of f.keys) {
    const v = await command(redis.port, 'GET', k);
    const record = recordOf(v);
    assert.ok(verifyValue(good, k, v),
      `the value is record || GMAC trailer with the shared key: ${k}`);
    const forged = sealValue(other, k, record);
    assert.equal(await command(redis.port, 'SET', k, forged, 'EX', 3600), 'OK');
  }
  const mac0 = await m(B, 'pagoda_tier_mac_failures_total');
  const mb = await metrics(B);
  const r = await complete(B, f.prompt);
  assert.equal(r.t.redis, 0, `forged records are never served: ${JSON.stringify(r.usage)}`);
  assert.equal(r.text, f.text);
  const mac1 = await m(B, 'pagoda_tier_mac_failures_total');
  console.log(`# forged: B's MAC failures ${mac0} -> ${mac1}`);
  assert.ok(mac1 > mac0, 'counted');
  // What B read and rejected it deletes (tier_redis.h: a DEL queued to its writer), and
  // it writes what it computed: no forged value is left. A key may end deleted rather
  // than valid: the writer sends a batch's SETs before its DELs (src/tier/redis/redis.c
  // write_batch), so the DEL of a rejected value can follow B's own SET of that key (a
  // stricter form of this check, every value valid, failed once in ~30 runs of ctest -j2).
  await written(B, mb);
  const state = { valid: 0, deleted: 0, forged: 0 };
  for (const k of f.keys) {
    const v = await command(redis.port, 'GET', k);
    if (v === null) state.deleted++;
    else if (verifyValue(good, k, v))
      state.valid++;
    else state.forged++;
  }
  console.log(`# forged records after B's request: ${JSON.stringify(state)}`);
  assert.equal(state.forged, 0, `the rejected ones are gone: ${JSON.stringify(state)}`);

  // A third instance C with another --hash-key-file: that file keys the block hashes too,
  // so C's records of a prompt have other key names than A's (same model, same IDENT):
  // B never meets them. Its values put under A's key names (redis-cli -x SET): rejected.
  const otherFile = path.join(dir, 'other.key');
  writeFileSync(otherFile, other);
  const C = await inst.start(url, [], otherFile);
  const P = tokens(502, 100);
  const before = new Set(await keys(redis.port));
  const mc = await metrics(C);
  const c = await complete(C, P);
  await written(C, mc);
  const cKeys = (await keys(redis.port)).filter((k) => !before.has(k));
  await inst.stop(C);
  const a = await computedByA(502);
  assert.equal(a.text, c.text);
  assert.ok(cKeys.length > 0 && cKeys.every((k) => !a.keys.includes(k)), 'no key name in common');
  const ident = (k) => k.slice(0, k.indexOf('{'));
  assert.ok(cKeys.every((k) => ident(k) === ident(a.keys[0])), 'one model, one IDENT');
  for (let i = 0; i < a.keys.length; i++) {
    const v = await command(redis.port, 'GET', cKeys[i % cKeys.length]);
    assert.equal((await redisCli(redis.port, ['-x', 'SET', a.keys[i]], 30000, v)).trim(), 'OK');
  }
  const r2 = await complete(B, P);
  assert.equal(r2.t.redis, 0, `C's records are never served: ${JSON.stringify(r2.usage)}`);
  assert.equal(r2.text, a.text);
  const mac2 = await m(B, 'pagoda_tier_mac_failures_total');
  console.log(`# C's records under A's names: B's MAC failures ${mac1} -> ${mac2}`);
  assert.ok(mac2 > mac1, 'counted');

  // A record that verifies is served: the same check on a prompt left alone.
  const ok = await computedByA(503);
  const h = await complete(B, ok.prompt);
  assert.ok(h.t.redis > 0, JSON.stringify(h.usage));
  assert.equal(h.text, ok.text);
});

test('records with a valid MAC, damaged or of another KV type: rejected, counted', T, async () => {
  await connected(B);
  const good = readFileSync(keyFile);
  const block = (k) => k.slice(k.indexOf('{'));
  const ident = (k) => k.slice(0, k.indexOf('{'));
  // Damaged after the MAC: one payload byte flipped, the MAC recomputed with the shared
  // key (what only a holder of the key could do): the record's checksum catches it.
  const d = await computedByA(520);
  for (const k of d.keys) {
    const v = await command(redis.port, 'GET', k);
    const record = Buffer.from(recordOf(v));
    record[128 + 7] ^= 0x40; // past the 128-byte header (tier.h)
    await command(redis.port, 'SET', k, sealValue(good, k, record));
  }
  let x0 = await metrics(B);
  const r = await complete(B, d.prompt);
  assert.equal(r.t.redis, 0, `a damaged record is never served: ${JSON.stringify(r.usage)}`);
  assert.equal(r.text, d.text);
  let x1 = await metrics(B);
  const sum = (x, names) => names.reduce((a, n) => a + tierMetric(x, n), 0);
  console.log(`# damaged, valid MAC: B's checksum failures `
    + `${tierMetric(x0, 'pagoda_tier_checksum_failures_total')} -> `
    + `${tierMetric(x1, 'pagoda_tier_checksum_failures_total')}, MAC failures `
    + `${tierMetric(x0, 'pagoda_tier_mac_failures_total')} -> `
    + `${tierMetric(x1, 'pagoda_tier_mac_failures_total')}`);
  assert.ok(tierMetric(x1, 'pagoda_tier_checksum_failures_total')
    > tierMetric(x0, 'pagoda_tier_checksum_failures_total'), 'counted as damaged');

  // Another identity: D stores f32 KV (same model and key: the same block hashes, another
  // IDENT in its key names). D's records under A's key names, MACed with the shared key:
  // they verify, and are ignored as foreign.
  const D = await inst.start(url, ['--kv-type', 'f32']);
  const Q = tokens(521, 100);
  const before = new Set(await keys(redis.port));
  const md = await metrics(D);
  await complete(D, Q);
  await written(D, md);
  const dKeys = (await keys(redis.port)).filter((k) => !before.has(k));
  await inst.stop(D);
  const q = await computedByA(521);
  assert.ok(dKeys.length > 0 && ident(dKeys[0]) !== ident(q.keys[0]), 'another IDENT');
  let n = 0;
  for (const k of q.keys) {
    const dk = dKeys.find((x) => block(x) === block(k));
    if (!dk) continue;
    const v = await command(redis.port, 'GET', dk);
    const record = recordOf(v);
    await command(redis.port, 'SET', k, sealValue(good, k, record));
    n++;
  }
  assert.equal(n, q.keys.length, 'D wrote the same blocks');
  x0 = await metrics(B);
  const r2 = await complete(B, Q);
  assert.equal(r2.t.redis, 0, `a foreign record is never served: ${JSON.stringify(r2.usage)}`);
  assert.equal(r2.text, q.text);
  x1 = await metrics(B);
  const names = ['pagoda_tier_foreign_records_total', 'pagoda_tier_checksum_failures_total',
                 'pagoda_tier_mac_failures_total'];
  console.log(`# another KV type: B's foreign, checksum, MAC failures: `
    + `${names.map((k) => tierMetric(x0, k)).join(' ')} -> `
    + `${names.map((k) => tierMetric(x1, k)).join(' ')}`);
  assert.ok(tierMetric(x1, names[0]) > tierMetric(x0, names[0]), 'counted as foreign');
  assert.equal(sum(x1, names.slice(1)), sum(x0, names.slice(1)), 'not as damaged or forged');
});

// Prompts that push ~36 pages through a pool of 20 (--kv-memory 200K below).
async function otherTraffic(srv, seed) {
  for (let i = 0; i < 3; i++) await complete(srv, tokens(seed + i, 200));
}

test('Redis slow (500 ms per chunk): requests finish within 30 s, misses counted', T, async () => {
  const proxy = await startProxy(redis.port);
  let B2 = null;
  try {
    // B2: through the proxy, a pool of 20 pages, so that what it wrote leaves its pool.
    B2 = await inst.start(`redis://127.0.0.1:${proxy.port}`,
      ['--ctx', '256', '--kv-memory', '200K', '--max-running', '4']);
    assert.equal(await m(B2, 'pagoda_tier_nodes_up'), 1);
    const p = await computedByA(600);
    // X: computed and written by B2, then pushed out of its pool: B2 knows Redis has it
    // (its look-up asks nothing), so with Redis slow its promotion meets the deadline.
    let m0 = await metrics(B2);
    const X = tokens(700, 100);
    const x0 = await complete(B2, X);
    await written(B2, m0);
    m0 = await metrics(B2);
    await otherTraffic(B2, 710);
    await written(B2, m0);

    proxy.delayMs = 500;
    let t0 = Date.now();
    const x1 = await complete(B2, X);
    const xMs = Date.now() - t0;
    let y = await metrics(B2);
    console.log(`# slow Redis: a known prompt in ${xMs} ms: ${JSON.stringify(x1.t)}, deadline `
      + `misses ${tierMetric(y, 'pagoda_tier_deadline_misses_total')}, timeouts `
      + `${tierMetric(y, 'pagoda_tier_timeouts_total')}`);
    assert.equal(x1.t.redis, 0, JSON.stringify(x1.usage));
    assert.equal(x1.text, x0.text);
    assert.ok(tierMetric(y, 'pagoda_tier_deadline_misses_total') > 0, 'a deadline miss');

    // Prompts B2 does not know: its look-ups ask Redis, bounded by the command timeout.
    t0 = Date.now();
    const rs = await Promise.all([600, 101, 103, 300].map(async (s) => {
      const r = await complete(B2, s === 600 ? p.prompt : tokens(s, 100));
      return [s, r];
    }));
    const ms = Date.now() - t0;
    y = await metrics(B2);
    const misses = tierMetric(y, 'pagoda_tier_deadline_misses_total');
    const timeouts = tierMetric(y, 'pagoda_tier_timeouts_total');
    console.log(`# slow Redis: 4 more requests in ${ms} ms; deadline misses ${misses}, timeouts `
      + `${timeouts}, nodes_up ${tierMetric(y, 'pagoda_tier_nodes_up')}`);
    for (const [s, r] of rs) assert.equal(r.text, cold.get(s), `seed ${s}`);
    assert.ok(xMs + ms < 30000, `bounded by the deadline: ${xMs} + ${ms} ms`);
    assert.ok(misses + timeouts > 1, `deadline misses ${misses}, timeouts ${timeouts}`);
    // Shutdown with Redis still slow is bounded too.
    const t1 = Date.now();
    await inst.stop(B2);
    B2 = null;
    console.log(`# B2 stopped in ${Date.now() - t1} ms with Redis slow`);
  } finally {
    proxy.delayMs = 0;
    if (B2) await inst.stop(B2);
    await proxy.close();
  }
});
