// SPDX-License-Identifier: MIT
// test_retention.mjs - the retention contract in the API and the cache admin API (issue
// 13) through the real `pagoda serve`, on a pool of 20 pages (--ctx 256, --kv-memory
// 200K: 320 f16 tokens of stories260K) so that a few prompts flood it:
//   - every retention field is accepted (prompt_cache_retention, prompt_cache_key,
//     cache_control on a message and on a part, "pagoda"), and each malformed form is a
//     400 whose param names the field, in completions and chat;
//   - usage.pagoda.retention: priority, ttl_s, expires_at, pinned, pinned_until for the
//     default, in_memory, 24h, ephemeral 1h and pagoda's own fields;
//   - a pin past --pin-share is a 400 naming pagoda.pin with "N of M pages";
//   - prompt_cache_key: the same key shares, the default tenant does not;
//   - the admin API (pin, unpin, prefetch, evict, stats) with the key, and 401 without;
//     bad bodies a 400 naming the field;
//   - a pinned prefix survives a flood of other prompts (cached_tokens stays full), and
//     is evicted after unpin and another flood; admin evict drops a cached prefix;
//   - per-tenant metrics with hashed ids (never the salt) and pagoda_kv_pages_pinned;
//   - a quota (--tenant-quota): a flood from tenant B keeps tenant A's prefix;
//   - a next-use hint (pagoda.next_use_s) warms an evicted prefix back from a RAM tier.
// Needs stories260K (exit 77 without it). Run by ctest (labels integration, thread, http).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { requireSetup, startServer, post, get, metrics, randomTokens } from './common.mjs';

const model = requireSetup();
if (!model.stories) {
  console.error('skipped: test_retention needs stories260K.gguf');
  process.exit(77);
}
const PAGE = 16;
const MAX = 8;
const KEY = 'sekrit';
const AUTH = { authorization: `Bearer ${KEY}` };
const T = { timeout: 120000 }; // a bound on each test, not a timing assertion
// 20 pages; pins may take 8 of them.
const SERVE = ['--ctx', '256', '--kv-memory', '200K', '--max-running', '2'];
let srv;
let seed = 5001;
// A prompt no other request shares (randomTokens maps seeds 2k and 2k+1 to one sequence).
const fresh = (n) => randomTokens((seed += 2), n);

before(async () => {
  srv = await startServer(model.path, [...SERVE, '--pin-share', '0.4', '--api-key', KEY]);
});
after(async () => { if (srv) await srv.stop(); });

async function complete(s, body, headers = AUTH) {
  const r = await post(s, '/v1/completions', { max_tokens: MAX, temperature: 0, ...body }, headers);
  assert.equal(r.status, 200, r.text);
  return r.json.usage;
}

const cached = (u) => u.prompt_tokens_details.cached_tokens;

// Prompts no other request shares: each pushes 13 pages through the pool.
async function flood(s, n, extra = {}) {
  for (let i = 0; i < n; i++) await complete(s, { prompt: fresh(200), ...extra });
}

function expectBad(r, param) {
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.error.param, param, r.text);
  assert.equal(r.json.error.type, 'invalid_request_error');
  const last = param.split('.').pop();
  assert.ok(r.json.error.message.includes(last), `the message names ${param}: ${r.text}`);
}

test('every retention field is accepted and reported in usage.pagoda.retention', T, async () => {
  const now = Math.floor(Date.now() / 1000);
  let u = await complete(srv, { prompt: fresh(40) });
  assert.deepEqual(u.pagoda.retention,
    { priority: 35, ttl_s: null, expires_at: null, pinned: false, pinned_until: null });
  assert.ok('pool' in u.pagoda.cached_tokens_by_tier);

  u = await complete(srv, { prompt: fresh(40), prompt_cache_retention: 'in_memory' });
  assert.equal(u.pagoda.retention.ttl_s, 3600);
  assert.equal(u.pagoda.retention.priority, 35);
  assert.ok(Math.abs(u.pagoda.retention.expires_at - (now + 3600)) <= 5, JSON.stringify(u));

  u = await complete(srv, { prompt: fresh(40), prompt_cache_retention: '24h' });
  assert.equal(u.pagoda.retention.ttl_s, 86400);
  assert.equal(u.pagoda.retention.priority, 60);

  u = await complete(srv, { prompt: fresh(40),
    pagoda: { priority: 80, ttl_s: 120, next_use_s: 3600 } });
  assert.equal(u.pagoda.retention.priority, 80);
  assert.equal(u.pagoda.retention.ttl_s, 120);
  assert.equal(u.pagoda.retention.pinned, false);
  const st = await post(srv, '/v1/cache/stats', {}, AUTH);
  assert.equal(st.status, 200, st.text);
  assert.ok(st.json.pool.hints_waiting >= 1, `the next-use hint waits: ${st.text}`);

  const chat = await post(srv, '/v1/chat/completions', {
    max_tokens: MAX, temperature: 0,
    messages: [
      { role: 'system', content: 'You tell stories.', cache_control: { type: 'ephemeral' } },
      { role: 'user', content: [{ type: 'text', text: 'Once upon a time',
        cache_control: { type: 'ephemeral', ttl: '1h' } }] }],
  }, AUTH);
  assert.equal(chat.status, 200, chat.text);
  assert.equal(chat.json.usage.pagoda.retention.ttl_s, 3600, 'the longest ttl applies');

  // 36 tokens (+ at most 8 generated): the pin covers the 2 full pages of the prompt only.
  // A pin with a TTL: pinned_until is the TTL's end. Unpin it again for the tests after.
  const P = fresh(36);
  u = await complete(srv, { prompt: P, pagoda: { pin: true, ttl_s: 600 } });
  assert.equal(u.pagoda.retention.pinned, true);
  assert.ok(Math.abs(u.pagoda.retention.pinned_until - (now + 600)) <= 5, JSON.stringify(u));
  const un = await post(srv, '/v1/cache/unpin', { tokens: P }, AUTH);
  assert.equal(un.status, 200, un.text);
  assert.equal(un.json.pages, 2, un.text);
});

test('malformed retention fields are 400s naming the field', T, async () => {
  const P = 'Once upon a time';
  const cases = [
    [{ prompt: P, prompt_cache_retention: '7d' }, 'prompt_cache_retention'],
    [{ prompt: P, prompt_cache_retention: true }, 'prompt_cache_retention'],
    [{ prompt: P, prompt_cache_key: 12 }, 'prompt_cache_key'],
    [{ prompt: P, prompt_cache_key: 'k'.repeat(257) }, 'prompt_cache_key'],
    [{ prompt: P, pagoda: 'pin' }, 'pagoda'],
    [{ prompt: P, pagoda: { priority: 101 } }, 'pagoda.priority'],
    [{ prompt: P, pagoda: { ttl_s: -1 } }, 'pagoda.ttl_s'],
    [{ prompt: P, pagoda: { pin: 'yes' } }, 'pagoda.pin'],
    [{ prompt: P, pagoda: { next_use_s: 1.5 } }, 'pagoda.next_use_s'],
    [{ prompt: P, pagoda: { pinned: true } }, 'pagoda.pinned'],
  ];
  for (const [body, param] of cases)
    expectBad(await post(srv, '/v1/completions', body, AUTH), param);
  const chat = [
    { role: 'user', content: 'hi', cache_control: { type: 'persistent' } },
    { role: 'user', content: 'hi', cache_control: { type: 'ephemeral', ttl: '24h' } },
    { role: 'user', content: [{ type: 'text', text: 'hi', cache_control: 'ephemeral' }] },
  ];
  for (const m of chat)
    expectBad(await post(srv, '/v1/chat/completions', { messages: [m] }, AUTH), 'cache_control');
  expectBad(await post(srv, '/v1/chat/completions',
    { messages: [{ role: 'user', content: 'hi' }], pagoda: { priority: -3 } }, AUTH),
    'pagoda.priority');
});

test('a pin past the pin share is a 400 naming pagoda.pin', T, async () => {
  // 200 tokens: 13 pages; the share is 8 of 20.
  const r = await post(srv, '/v1/completions',
    { prompt: fresh(200), max_tokens: MAX, pagoda: { pin: true } }, AUTH);
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.error.param, 'pagoda.pin');
  assert.match(r.json.error.message, /pinned blocks would exceed the pin share \(\d+ of 8 pages\)/);
});

test('prompt_cache_key: the same key shares, the default tenant does not', T, async () => {
  const P = fresh(70);
  assert.equal(cached(await complete(srv, { prompt: P, prompt_cache_key: 'user-1' })), 0);
  assert.equal(cached(await complete(srv, { prompt: P, prompt_cache_key: 'user-1' })), 64);
  assert.equal(cached(await complete(srv, { prompt: P })), 0, 'no sharing with the default tenant');
  assert.equal(cached(await complete(srv, { prompt: P, prompt_cache_key: 'user-2' })), 0);
});

test('the admin API needs the key and names bad fields', T, async () => {
  for (const op of ['pin', 'unpin', 'prefetch', 'evict', 'stats']) {
    const r = await post(srv, `/v1/cache/${op}`, { prompt: 'Once upon a time' });
    assert.equal(r.status, 401, `${op} without the key: ${r.text}`);
    const w = await post(srv, `/v1/cache/${op}`, { prompt: 'x' }, { authorization: 'Bearer nope' });
    assert.equal(w.status, 401, `${op} with a wrong key`);
  }
  assert.equal((await get(srv, '/v1/cache/stats')).status, 401);
  const g = await get(srv, '/v1/cache/stats', AUTH);
  assert.equal(g.status, 200, g.text);
  assert.equal(g.json.pool.pages_total, 20);
  assert.ok(Array.isArray(g.json.tenants) && g.json.tenants.length >= 1);
  assert.equal((await get(srv, '/v1/cache/pin', AUTH)).status, 405);
  expectBad(await post(srv, '/v1/cache/pin', {}, AUTH), 'prompt');
  expectBad(await post(srv, '/v1/cache/pin', { tokens: 'abc' }, AUTH), 'tokens');
  expectBad(await post(srv, '/v1/cache/pin', { prompt: 'a', ttl_s: -1 }, AUTH), 'ttl_s');
  expectBad(await post(srv, '/v1/cache/evict', { prompt: 'a', salt: 'x' }, AUTH), 'salt');
  expectBad(await post(srv, '/v1/cache/unpin', { prompt: 'a', cache_salt: '' }, AUTH), 'cache_salt');
  expectBad(await post(srv, '/v1/cache/evict', { tokens: [5, 6] }, AUTH), 'tokens');
});

test('a pinned prefix survives a flood; after unpin a flood evicts it', T, async () => {
  const P = fresh(70);
  assert.equal(cached(await complete(srv, { prompt: P })), 0);
  const pin = await post(srv, '/v1/cache/pin', { tokens: P }, AUTH);
  assert.equal(pin.status, 200, pin.text);
  assert.deepEqual([pin.json.object, pin.json.blocks, pin.json.pages, pin.json.tokens],
    ['cache.pin', 4, 4, 64]);
  let m = await metrics(srv);
  assert.ok(m.pagoda_kv_pages_pinned >= 4, `pinned: ${m.pagoda_kv_pages_pinned}`);
  await flood(srv, 6);
  const st = await post(srv, '/v1/cache/stats', { tokens: P }, AUTH);
  assert.equal(st.json.prompt.pool_pages, 4, st.text);
  assert.equal(cached(await complete(srv, { prompt: P })), 64, 'the pinned prefix stayed');

  const un = await post(srv, '/v1/cache/unpin', { tokens: P }, AUTH);
  assert.equal(un.status, 200, un.text);
  assert.equal(un.json.pages, 4);
  await flood(srv, 6);
  assert.equal(cached(await complete(srv, { prompt: P })), 0, 'evicted once unpinned');

  // prefetch warms what the pool (no tiers here) holds; evict drops it.
  const pf = await post(srv, '/v1/cache/prefetch', { tokens: P }, AUTH);
  assert.equal(pf.status, 200, pf.text);
  assert.equal(pf.json.pages, 4);
  const ev = await post(srv, '/v1/cache/evict', { tokens: P }, AUTH);
  assert.equal(ev.status, 200, ev.text);
  assert.equal(ev.json.pages, 4);
  assert.equal(cached(await complete(srv, { prompt: P })), 0, 'evicted by the admin API');
  m = await metrics(srv);
  assert.ok('pagoda_kv_pages_pinned' in m);
});

test('the admin API addresses a chat prompt and a salt', T, async () => {
  const messages = [{ role: 'user', content: 'Once upon a time there was a little girl who '
    + 'liked to play in the park with her friends every day after school.' }];
  const c1 = await post(srv, '/v1/chat/completions',
    { messages, max_tokens: MAX, temperature: 0, cache_salt: 'chat-t' }, AUTH);
  assert.equal(c1.status, 200, c1.text);
  const st = await post(srv, '/v1/cache/stats', { messages, cache_salt: 'chat-t' }, AUTH);
  assert.equal(st.status, 200, st.text);
  assert.ok(st.json.prompt.blocks >= 1 && st.json.prompt.pool_pages === st.json.prompt.blocks,
    st.text);
  const other = await post(srv, '/v1/cache/stats', { messages }, AUTH);
  assert.equal(other.json.prompt.pool_pages, 0, 'another tenant holds none of it');
});

test('per-tenant metrics carry hashed ids, never the salt', T, async () => {
  const P = fresh(70);
  await complete(srv, { prompt: P, cache_salt: 'tenant-secret-a' });
  await complete(srv, { prompt: P, cache_salt: 'tenant-secret-a' });
  const r = await get(srv, '/metrics');
  assert.ok(!r.text.includes('tenant-secret-a'), 'the salt never shows');
  const m = await metrics(srv);
  const ids = Object.keys(m).filter((k) => k.startsWith('pagoda_tenant_pages{'));
  assert.ok(ids.length >= 2, ids.join(' '));
  for (const k of ids) assert.match(k, /^pagoda_tenant_pages\{tenant="[0-9a-f]{16}"\}$/);
  const hits = Object.keys(m).filter((k) => k.startsWith('pagoda_tenant_hits_total{'));
  assert.ok(hits.some((k) => m[k] >= 4), 'the second request hit 4 pages');
  assert.ok(Object.keys(m).some((k) => k.startsWith('pagoda_tenant_evictions_total{')));
  const st = await get(srv, '/v1/cache/stats', AUTH);
  assert.ok(!st.text.includes('tenant-secret-a'));
});

test('a quota keeps tenant A\'s prefix through a flood from tenant B', T, async () => {
  const q = await startServer(model.path, [...SERVE, '--tenant-quota', 'tenant-A=0.3']);
  try {
    const P = fresh(70);
    assert.equal(cached(await complete(q, { prompt: P, cache_salt: 'tenant-A' }, {})), 0);
    await flood(q, 8, { cache_salt: 'tenant-B' });
    assert.equal(cached(await complete(q, { prompt: P, cache_salt: 'tenant-A' }, {})), 64,
      'A\'s reserved prefix stayed');
    // Without a quota the same flood evicts it (the control).
    const P2 = fresh(70);
    assert.equal(cached(await complete(q, { prompt: P2, cache_salt: 'tenant-C' }, {})), 0);
    await flood(q, 8, { cache_salt: 'tenant-B' });
    assert.equal(cached(await complete(q, { prompt: P2, cache_salt: 'tenant-C' }, {})), 0);
    const m = await metrics(q);
    assert.ok(Object.keys(m).some((k) => k.startsWith('pagoda_tenant_pages_reserved{')
      && m[k] >= 6), 'A has 6 pages reserved');
  } finally {
    await q.stop();
  }
});

test('a next-use hint warms an evicted prefix back from the RAM tier before it is due', T,
  async (t) => {
    const h = await startServer(model.path,
      [...SERVE, '--tier', 'ram:2M', '--hint-lead-ms', '500']);
    try {
      const P = fresh(70);
      const t0 = Date.now();
      const u = await complete(h, { prompt: P, pagoda: { next_use_s: 4 } }, {});
      assert.equal(cached(u), 0);
      await flood(h, 6);
      if (Date.now() - t0 > 3000) { // a slow build (sanitizers): the warm may have run already
        t.skip('the flood took longer than the hint\'s lead');
        return;
      }
      const poolPages = async () =>
        (await post(h, '/v1/cache/stats', { tokens: P })).json.prompt.pool_pages;
      assert.ok(await poolPages() < 4, 'the flood pushed the prefix out of the pool');
      // Due 4 s after the request, warmed 0.5 s before: back in the pool by then.
      let back = 0;
      for (let i = 0; i < 200 && back < 4; i++) {
        back = await poolPages();
        if (back < 4) await new Promise((r) => setTimeout(r, 50));
      }
      assert.equal(back, 4, 'the hint prefetched the prefix into the pool');
      const again = await complete(h, { prompt: P }, {});
      assert.equal(again.pagoda.cached_tokens_by_tier.pool, 64, JSON.stringify(again));
    } finally {
      await h.stop();
    }
  });
