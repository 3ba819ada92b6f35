// SPDX-License-Identifier: MIT
// test_redis.mjs - two `pagoda serve` instances sharing one Redis (issue 12), end to end:
// real redis-server processes on 127.0.0.1 with ephemeral ports (redis.mjs), instances A
// and B with `--tier redis://... --hash-key-file F` (the same F: they agree on block hashes
// and on the records' MAC key), stories260K, temperature 0:
//   - standalone: a ~100-token prompt computed by A, once A's tier wrote it (no puts
//     queued, pages demoted to "redis", keys in Redis), is served to B with
//     prompt_tokens_details.cached_tokens > 0, reported under
//     usage.pagoda.cached_tokens_by_tier.redis, and B's greedy text equals A's cold one;
//     completions (fetch) and chat completions (B's through the official `openai` client
//     when tests/server/node_modules has it);
//   - a unix socket (redis-server --port 0 --unixsocket): unix:///path shares the same way;
//   - tenants: the prompt with cache_salt "t1" on A, then "t2" on B: no hit through Redis;
//     "t1" on B: a hit;
//   - AUTH: requirepass (A) and an ACL user limited to pgd:* (B) share records; KV events
//     on a stream (AllBlocksCleared at bind, BlockStored "redis" for every record A wrote,
//     "pool" events of A's prefix index); startup errors exit 1 with the node and Redis's
//     message and no password (WRONGPASS, NOAUTH, no --hash-key-file, connection refused),
//     a bad option exits 2;
//   - Redis Cluster: three masters (redis-cli --cluster create), A and B with the three
//     seeds: the same cross-instance check, and the records are spread over all three
//     masters (KEYS on each), each key's slot that of its hash tag; then the slots of
//     new records migrated from one master to another (IMPORTING / MIGRATING, MIGRATE,
//     SETSLOT NODE) while B serves them: no request lost, cold answers, B follows the
//     redirections (redirects_total) and finds the moved records; slots caught
//     mid-migration (keys moved, MIGRATING / IMPORTING still): B follows ASK; a master
//     SIGKILLed while B serves a load: no request fails, the outage shows (nodes_up,
//     connected 0); restarted (same nodes.conf, empty), it rejoins, B reconnects, and new
//     records land on it and are served.
// The faults (Redis killed, restarted empty, garbage and forged records, a slow Redis)
// are in test_redis_faults.mjs. Skips (77) without redis-server / redis-cli or a model.
// Run by ctest (labels integration, thread, http, redis); see common.mjs for the environment.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { requireSetup, post, metrics, randomTokens } from './common.mjs';
import {
  requireRedis, startRedis, startCluster, keys, command, tempDir, killChildren, tierMetric,
  migrateSlot, finishSlot, clusterOk, connect, serveToExit, waitFor, instances, complete, chat,
  written, byTier, MAX_TOKENS,
} from './redis.mjs';

requireRedis();
// The prompt of a seed (randomTokens starts from seed | 1: seeds 2k and 2k+1 would agree).
const tokens = (seed, n) => randomTokens(2 * seed + 1, n);
const model = requireSetup();
const T = { timeout: 120000 }; // a bound on each test, not a timing assertion
const dir = tempDir('pagoda-redis-e2e-');
const keyFile = path.join(dir, 'hash.key');
// A fixed key: block hashes, key names and MACs are the same on every run.
writeFileSync(keyFile, Buffer.from('pagoda issue 12 shared test key, 32B'.slice(0, 32)));
const SERVE = ['--ctx', '512', '--kv-memory', '1M', '--max-running', '4'];

const inst = instances(model.path, keyFile, SERVE);
// A second for a get and a command (defaults 20 ms + 2 ms per page, 200 ms), so that a hit
// never depends on scheduling (a loaded machine, a sanitizer build); test_redis_faults.mjs
// tests the default deadline.
const RELAXED = 'deadline_ms=1000&timeout_ms=1000';
let redis = null, cluster = null;

before(async () => { redis = await startRedis(); });
after(async () => {
  try {
    await inst.stopAll();
  } finally {
    if (redis) await redis.stop();
    if (cluster) await cluster.stop();
    killChildren();
  }
});

// B's chat goes through the official `openai` client when tests/server/node_modules has
// it (npm ci there), else through fetch: the usage extension reaches the client's callers.
const here = path.dirname(fileURLToPath(import.meta.url));
const OpenAI = existsSync(path.join(here, 'node_modules', 'openai'))
  ? (await import('openai')).default : null;
async function chatOn(srv, content) {
  if (!OpenAI) return chat(srv, content);
  const client = new OpenAI({ apiKey: 'none', baseURL: srv.url + '/v1', maxRetries: 0 });
  const modelId = (await client.models.list()).data[0].id;
  const r = await client.chat.completions.create({
    model: modelId, messages: [{ role: 'user', content }], max_tokens: MAX_TOKENS, temperature: 0,
  });
  return { text: r.choices[0].message.content, usage: r.usage, t: byTier(r.usage) };
}

const P1 = tokens(12, 100);
const STORY = 'Once upon a time there was a little girl named Lily. She liked to play in the '
  + 'garden with her dog Max. One day they found a big red ball under a tree, and they played '
  + 'with it all afternoon until the sun went down and her mother called them home.';

// The cross-instance check on a pair (A, B) sharing one Redis (or one cluster): returns
// the number of keys written.
async function crossInstance(A, B, prompt, content, nKeys) {
  let m0 = await metrics(A);
  const a = await complete(A, prompt);
  assert.deepEqual(a.t, { pool: 0, redis: 0 }, 'a cold prompt on A');
  await written(A, m0);
  const k1 = await nKeys();
  assert.ok(k1 >= Math.floor(prompt.length / 16), `A wrote the prompt's pages: ${k1} keys`);

  const b = await complete(B, prompt);
  console.log(`# B, completions: ${JSON.stringify(b.t)} of ${b.usage.prompt_tokens} prompt tokens`);
  assert.ok(b.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(b.usage));
  assert.ok(b.t.redis > 0, `served from redis: ${JSON.stringify(b.usage)}`);
  assert.equal(b.text, a.text, "B's greedy output from A's pages equals A's cold one");

  m0 = await metrics(A);
  const ac = await chat(A, content);
  assert.equal(ac.t.redis, 0);
  await written(A, m0);
  const bc = await chatOn(B, content);
  console.log(`# B, chat: ${JSON.stringify(bc.t)} of ${bc.usage.prompt_tokens} prompt tokens`);
  assert.ok(bc.t.redis > 0, `chat served from redis: ${JSON.stringify(bc.usage)}`);
  assert.equal(bc.text, ac.text);

  const mb = await metrics(B);
  assert.ok(tierMetric(mb, 'pagoda_tier_hit_tokens_total') >= b.t.redis + bc.t.redis);
  assert.equal(tierMetric(mb, 'pagoda_tier_mac_failures_total'), 0);
  assert.equal(tierMetric(mb, 'pagoda_tier_checksum_failures_total'), 0);
  return nKeys();
}

test('standalone: B serves from Redis what A computed, the same greedy output', T, async () => {
  const url = `redis://127.0.0.1:${redis.port}?${RELAXED}`;
  const A = await inst.start(url);
  const B = await inst.start(url);
  const ma = await metrics(A);
  assert.equal(tierMetric(ma, 'pagoda_tier_nodes'), 1);
  assert.equal(tierMetric(ma, 'pagoda_tier_nodes_up'), 1);
  const dbsize = async () => Number(await command(redis.port, 'DBSIZE'));
  const n = await crossInstance(A, B, P1, STORY, dbsize);
  console.log(`# ${n} records in Redis`);
  for (const k of await keys(redis.port)) {
    assert.match(k, /^pgd:[0-9a-f]{16}:\{[0-9a-f]{32}\}$/, 'key NS:IDENT:{BLOCK}');
    const ttl = Number(await command(redis.port, 'TTL', k));
    assert.ok(ttl > 0 && ttl <= 86400, `every record has a TTL: ${k} ${ttl}`);
  }
});

test('a unix socket: unix:///path, shared the same way', T, async () => {
  const ru = await startRedis({ unix: true });
  try {
    const url = `unix://${ru.port}?${RELAXED}`;
    const A = await inst.start(url);
    const B = await inst.start(url);
    const P = tokens(16, 100);
    const m0 = await metrics(A);
    const a = await complete(A, P);
    await written(A, m0);
    assert.ok(Number(await command(ru.port, 'DBSIZE')) >= 6);
    const b = await complete(B, P);
    assert.ok(b.t.redis > 0, JSON.stringify(b.usage));
    assert.equal(b.text, a.text);
    await inst.stop(A);
    await inst.stop(B);
  } finally {
    await ru.stop();
  }
});

test('tenants: another cache_salt gets no hit through Redis, the same salt does', T, async () => {
  const [A, B] = inst.list;
  assert.ok(A && B);
  const P = tokens(13, 100);
  const m0 = await metrics(A);
  const a = await complete(A, P, { cache_salt: 't1' });
  assert.equal(a.usage.prompt_tokens_details.cached_tokens, 0);
  await written(A, m0);

  const b2 = await complete(B, P, { cache_salt: 't2' });
  assert.equal(b2.usage.prompt_tokens_details.cached_tokens, 0,
    `tenant t2 shares nothing with t1: ${JSON.stringify(b2.usage)}`);
  assert.equal(b2.text, a.text);
  const b1 = await complete(B, P, { cache_salt: 't1' });
  assert.ok(b1.t.redis > 0, `tenant t1 on B hits A's records: ${JSON.stringify(b1.usage)}`);
  assert.equal(b1.text, a.text);
  // The default tenant shares nothing with t1 or t2, in the pool or in Redis.
  const b0 = await complete(B, P);
  assert.equal(b0.usage.prompt_tokens_details.cached_tokens, 0, JSON.stringify(b0.usage));
  assert.equal(b0.text, a.text);
  await inst.stopAll();
});

// XRANGE of a KV-event stream: [{ id, instance, seq, ts, events: [...] }].
async function events(c, stream) {
  return (await c.cmd('XRANGE', stream, '-', '+')).map(([id, f]) => {
    const o = { id: id.toString() };
    for (let i = 0; i < f.length; i += 2) o[f[i].toString()] = f[i + 1].toString();
    o.events = JSON.parse(o.events);
    o.seq = Number(o.seq);
    return o;
  });
}

test('AUTH (requirepass, an ACL user), startup errors, KV events', T, async () => {
  const pw = 's3cret-pw';
  const rp = await startRedis({ extra: ['--requirepass', pw] });
  const c = await connect(rp.port);
  try {
    assert.equal(await c.cmd('AUTH', pw), 'OK');
    // An ACL user that may touch the keys pgd:* only (the records and the event stream).
    assert.equal(await c.cmd('ACL', 'SETUSER', 'pagoda', 'on', '>user-pw', '~pgd:*', '+@all'),
      'OK');
    const where = `127.0.0.1:${rp.port}`;
    const opts = `events=pgd:events&${RELAXED}`;
    const A = await inst.start(`redis://:${pw}@${where}?${opts}&instance=A`);
    const B = await inst.start(`redis://pagoda:user-pw@${where}?${opts}&instance=B`);
    const P = tokens(15, 100);
    const m0 = await metrics(A);
    const a = await complete(A, P);
    await written(A, m0);
    const b = await complete(B, P);
    assert.ok(b.t.redis > 0, `the ACL user reads A's records: ${JSON.stringify(b.usage)}`);
    assert.equal(b.text, a.text);
    const blocks = (await c.cmd('KEYS', 'pgd:*:{*}')).map((k) => {
      const s = k.toString();
      return s.slice(s.indexOf('{') + 1, -1);
    });
    assert.ok(blocks.length >= 6);

    // KV events (tier_redis.h): each instance clears at bind, A's records are stored
    // "redis" blocks, and its prefix index publishes "pool" events.
    await waitFor(async () => (await events(c, 'pgd:events')).some((e) => e.instance === 'B'
      && e.events.some((x) => x.type === 'BlockStored')), "B's events", 10000);
    const ev = await events(c, 'pgd:events');
    for (const who of ['A', 'B']) {
      const mine = ev.filter((e) => e.instance === who);
      assert.ok(mine.length > 0, `events of ${who}`);
      assert.equal(mine[0].events[0].type, 'AllBlocksCleared', `${who} starts empty`);
      for (let i = 1; i < mine.length; i++) assert.ok(mine[i].seq > mine[i - 1].seq);
    }
    const stored = (who, medium) => ev.filter((e) => e.instance === who).flatMap((e) => e.events)
      .filter((x) => x.type === 'BlockStored' && x.medium === medium)
      .flatMap((x) => x.block_hashes);
    const aRedis = new Set(stored('A', 'redis'));
    assert.ok(blocks.every((h) => aRedis.has(h)), 'every record A wrote is a BlockStored "redis"');
    assert.ok(stored('A', 'pool').length > 0, 'A publishes its pool');
    console.log(`# events: ${ev.length} batches; A: ${aRedis.size} redis, `
      + `${stored('A', 'pool').length} pool blocks; B: ${stored('B', 'pool').length} pool blocks`);
    await inst.stopAll();
  } finally {
    c.close();
    await rp.stop();
  }
  // Startup errors: one line naming the node and Redis's own message; no password shown.
  const m = model.path;
  const key = ['--hash-key-file', keyFile];
  const dead = rp.port; // stopped: nothing listens there
  let r;
  const rp2 = await startRedis({ extra: ['--requirepass', pw] });
  try {
    r = await serveToExit(m, [...key, '--tier', `redis://:wrong-pw@127.0.0.1:${rp2.port}`]);
    assert.equal(r.code, 1, r.stderr);
    assert.match(r.stderr, /WRONGPASS/);
    assert.ok(r.stderr.includes(`127.0.0.1:${rp2.port}`) && r.stderr.includes('***'), r.stderr);
    assert.ok(!r.stderr.includes('wrong-pw'), `the password is not shown: ${r.stderr}`);
    r = await serveToExit(m, [...key, '--tier', `redis://127.0.0.1:${rp2.port}`]);
    assert.equal(r.code, 1, r.stderr);
    assert.match(r.stderr, /NOAUTH/);
    r = await serveToExit(m, ['--tier', `redis://:${pw}@127.0.0.1:${rp2.port}`]);
    assert.equal(r.code, 1, r.stderr);
    assert.match(r.stderr, /needs --hash-key-file/);
    assert.ok(!r.stderr.includes(pw), r.stderr);
  } finally {
    await rp2.stop();
  }
  r = await serveToExit(m, [...key, '--tier', `redis://127.0.0.1:${dead}`]);
  assert.equal(r.code, 1, r.stderr);
  assert.match(r.stderr, new RegExp(`127\\.0\\.0\\.1:${dead}: Connection refused`));
  r = await serveToExit(m, [...key, '--tier', `redis://127.0.0.1:${dead}?bogus=1`]);
  assert.equal(r.code, 2, r.stderr);
  assert.match(r.stderr, /unknown option "bogus"/);
});

test('cluster: three masters, B serves what A computed; records on all three', T, async () => {
  cluster = await startCluster(3);
  const url = 'redis://' + cluster.ports.map((p) => `127.0.0.1:${p}`).join(',') + `?${RELAXED}`;
  const A = await inst.start(url);
  const B = await inst.start(url);
  const ma = await metrics(A);
  assert.equal(tierMetric(ma, 'pagoda_tier_nodes'), 3);
  assert.equal(tierMetric(ma, 'pagoda_tier_nodes_up'), 3);
  const count = async () => {
    let n = 0;
    for (const p of cluster.ports) n += (await keys(p)).length;
    return n;
  };
  // 200 tokens and the chat: ~20 records, so every master gets some.
  await crossInstance(A, B, tokens(14, 200), STORY + ' The end.', count);
  const per = [];
  for (const p of cluster.ports) {
    const ks = await keys(p);
    per.push(ks.length);
    // A record's slot is its hash tag's (the block hash): a chain's records spread out.
    for (const k of ks) {
      const slot = Number(await command(p, 'CLUSTER', 'KEYSLOT', k));
      const tag = k.slice(k.indexOf('{') + 1, k.indexOf('}'));
      assert.equal(Number(await command(p, 'CLUSTER', 'KEYSLOT', tag)), slot, `hash tag of ${k}`);
    }
  }
  console.log(`# records per master: ${per.join(' ')}`);
  assert.ok(per.every((n) => n > 0), `records on every master: ${per.join(' ')}`);
  const mb = await metrics(B);
  assert.equal(tierMetric(mb, 'pagoda_tier_nodes_up'), 3);
});

test('cluster: slots migrated under load: nothing lost, B follows MOVED and ASK', T, async () => {
  const [A, B] = inst.list;
  assert.ok(A && B && cluster);
  // Prompts A computed and B has not seen: their records are only in the cluster.
  const seeds = [40, 41, 42, 43, 44];
  const [p0, p1] = cluster.ports;
  const cold = new Map();
  const seen = new Set(await keys(p0));
  const fresh = []; // the new records on the first master
  let lastOnP0 = 0;
  for (const sd of seeds) {
    const m0 = await metrics(A);
    cold.set(sd, (await complete(A, tokens(sd, 200))).text);
    await written(A, m0);
    const added = (await keys(p0)).filter((k) => !seen.has(k));
    added.forEach((k) => { seen.add(k); fresh.push(k); });
    lastOnP0 = added.length;
  }
  // Every slot of the new records on the first master moves to the second, while B
  // serves four of the prompts; the fifth comes after, with B's slot map stale (some of
  // its records were on the first master: B meets MOVED whatever the load did).
  assert.ok(lastOnP0 > 0, 'the last prompt has records on the first master');
  const slots = new Set();
  for (const k of fresh) slots.add(Number(await command(p0, 'CLUSTER', 'KEYSLOT', k)));
  const mb0 = await metrics(B);
  const load = seeds.slice(0, 4).map((sd) => complete(B, tokens(sd, 200)));
  let moved = 0;
  for (const slot of slots) moved += await migrateSlot(cluster, slot, p0, p1);
  const rs = await Promise.all(load);
  rs.forEach((r, i) => assert.equal(r.text, cold.get(seeds[i]), `seed ${seeds[i]}`));
  const last = await complete(B, tokens(seeds[4], 200));
  assert.equal(last.text, cold.get(seeds[4]));
  const mb1 = await metrics(B);
  const redirects = (x, kind) => x[`pagoda_tier_redirects_total{tier="redis",kind="${kind}"}`];
  console.log(`# ${slots.size} slots (${moved} records) moved under load; B: redis tokens `
    + `${rs.map((r) => r.t.redis).join(' ')}, then ${last.t.redis}; MOVED `
    + `${redirects(mb0, 'moved')} -> ${redirects(mb1, 'moved')}, ASK ${redirects(mb0, 'ask')} -> `
    + `${redirects(mb1, 'ask')}, slot refreshes `
    + `${tierMetric(mb1, 'pagoda_tier_slot_refreshes_total')}`);
  assert.ok(last.t.redis > 0, `B found the moved records: ${JSON.stringify(last.usage)}`);
  assert.ok(redirects(mb1, 'moved') + redirects(mb1, 'ask') > 0, 'B was redirected');

  // Caught mid-migration: the slots of a new prompt's records on the second master are
  // MIGRATING to the third, their keys moved already: B's map is right, the owner answers
  // ASK, B asks the importing node.
  const p2 = cluster.ports[2];
  const had = new Set(await keys(p1));
  const m0 = await metrics(A);
  const coldA = (await complete(A, tokens(45, 200))).text;
  await written(A, m0);
  const mid = new Set();
  for (const k of (await keys(p1)).filter((x) => !had.has(x)))
    mid.add(Number(await command(p1, 'CLUSTER', 'KEYSLOT', k)));
  assert.ok(mid.size > 0, 'the prompt has records on the second master');
  for (const slot of mid) await migrateSlot(cluster, slot, p1, p2, false);
  const r = await complete(B, tokens(45, 200));
  const mb2 = await metrics(B);
  for (const slot of mid) await finishSlot(cluster, slot, p1, p2);
  console.log(`# ${mid.size} slots caught mid-migration: B: ${JSON.stringify(r.t)}, ASK `
    + `${redirects(mb1, 'ask')} -> ${redirects(mb2, 'ask')}`);
  assert.equal(r.text, coldA);
  assert.ok(r.t.redis > 0, JSON.stringify(r.usage));
  assert.ok(redirects(mb2, 'ask') > redirects(mb1, 'ask'), 'B followed ASK');
  assert.equal(tierMetric(mb2, 'pagoda_tier_mac_failures_total'), 0);
});

test('cluster: a master killed during load: none fails; restarted, it is used again', T, async () => {
  const [A, B] = inst.list;
  assert.ok(A && B && cluster);
  const victim = cluster.nodes[2];
  // A computes the prompts first (cold answers); B serves them while a master dies.
  const seeds = Array.from({ length: 12 }, (_, i) => 50 + i);
  const cold = new Map();
  for (const sd of seeds) cold.set(sd, (await complete(A, tokens(sd, 100))).text);
  let answered = 0;
  const load = seeds.map((sd) => post(B, '/v1/completions',
    { prompt: tokens(sd, 100), max_tokens: MAX_TOKENS, temperature: 0 }));
  load.forEach((p) => p.then(() => { answered++; }, () => {}));
  await Promise.race(load);
  const inFlight = seeds.length - answered;
  assert.ok(inFlight > 0);
  await victim.kill('SIGKILL'); // the signal is sent at once; this waits for the exit
  const rs = await Promise.all(load);
  const failed = rs.filter((r) => r.status !== 200);
  assert.equal(failed.length, 0, failed.map((r) => r.text).join('\n'));
  rs.forEach((r, i) => {
    assert.equal(r.json.choices[0].text, cold.get(seeds[i]), `seed ${seeds[i]}`);
  });
  // The outage: a node down (B notices at its next command to it: requests keep coming).
  let k = 0;
  await waitFor(async () => {
    if (tierMetric(await metrics(B), 'pagoda_tier_nodes_up') < 3) return true;
    await complete(B, tokens(80 + k++, 100)); // answers (status 200), computed
    return false;
  }, 'nodes_up < 3 after the kill', 20000, 100);
  const down = await metrics(B);
  console.log(`# a master killed with ${inFlight} of ${seeds.length} requests in flight: `
    + `nodes_up ${tierMetric(down, 'pagoda_tier_nodes_up')} of `
    + `${tierMetric(down, 'pagoda_tier_nodes')}, connected `
    + `${tierMetric(down, 'pagoda_tier_connected')}`);
  assert.equal(tierMetric(down, 'pagoda_tier_connected'), 0);
  // Restarted (same port and nodes.conf: same slots, empty): it rejoins, the tier
  // reconnects, and records are written to it again.
  cluster.nodes[2] = await victim.restart();
  await clusterOk(cluster);
  assert.equal((await keys(victim.port)).length, 0, 'restarted empty');
  // A was idle during the outage: its connections to the victim are stale until used
  // (the first command on each fails). Both are sent prompts until they reconnected.
  for (const [who, srv] of [['B', B], ['A', A]]) {
    await waitFor(async () => {
      const x = await metrics(srv);
      if (tierMetric(x, 'pagoda_tier_nodes_up') === 3
          && tierMetric(x, 'pagoda_tier_reconnects_total') > 0) return true;
      await complete(srv, tokens(90 + k++, 100));
      return false;
    }, `${who} to reconnect to the restarted master`, 30000, 100);
  }
  const had = new Set(await keys(victim.port)); // the warm-up prompts' records
  const m0 = await metrics(A);
  const c = await complete(A, tokens(70, 200));
  await written(A, m0);
  const n2 = (await keys(victim.port)).filter((x) => !had.has(x)).length;
  const b = await complete(B, tokens(70, 200));
  console.log(`# restarted master: ${n2} new records on it; B: ${JSON.stringify(b.t)}`);
  assert.ok(n2 > 0, 'records on the restarted master');
  assert.ok(b.t.redis > 0, JSON.stringify(b.usage));
  assert.equal(b.text, c.text);
  await inst.stopAll();
});
