// SPDX-License-Identifier: MIT
// redis.mjs - real Redis for the server tests of the Redis tier (test_redis*.mjs): a
// launcher of redis-server on 127.0.0.1 with ephemeral ports in a temporary directory, a
// Redis Cluster of masters built with `redis-cli --cluster create`, a small RESP client
// (binary-safe values, for reading and rewriting records), redis-cli, and a delaying TCP
// proxy. No npm dependencies: node:* only.
//
//   requireRedis()            exits 77 (ctest: skipped) when redis-server / redis-cli are absent
//   startRedis({ port })      one server: --save "" --appendonly no, loopback (or a unix
//                             socket), its own dir; .kill(sig), .restart() on the same port
//   startCluster(n)           n masters, every slot assigned, cluster_state:ok everywhere
//                             (clusterOk waits for it again); migrateSlot / finishSlot move
//                             a slot between masters as redis-cli --cluster reshard does
//   connect(port)             a RESP connection: cmd(...args) -> reply (Buffer, number,
//                             string, array, or a RedisError thrown); command(port, ...)
//   redisCli(port, args)      runs redis-cli, resolves its stdout (bounded)
//   startProxy(port)          127.0.0.1:<ephemeral> -> 127.0.0.1:port, delaying each chunk
//                             by proxy.delayMs (settable at any time; 0: pass through)
// and for the `pagoda serve` side (common.mjs starts it): instances() (a set of servers on
// one tier URL and key file, stopped with a bound), complete / chat (greedy requests, the
// usage split by tier checked), written() (waits until a tier wrote what it was given),
// serveToExit() (a serve that must fail at startup), tierMetric().
//
// Every child process is registered: killChildren() (called by the tests' after hooks,
// and on process exit whatever happens) SIGKILLs what is still running, so no redis-server
// outlives its test. Every wait is bounded.
import { spawn, spawnSync, execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import assert from 'node:assert/strict';
import { startServer, post, metrics } from './common.mjs';

const children = new Set();
const tmpDirs = new Set();

// SIGKILLs every child still running (redis-server, pagoda serve: whatever track() got)
// and removes the temporary directories. Synchronous: safe in an 'exit' handler.
export function killChildren() {
  for (const c of children) {
    if (c.exitCode === null && c.signalCode === null) {
      try { c.kill('SIGKILL'); } catch { /* gone already */ }
    }
  }
  children.clear();
  for (const d of tmpDirs) rmSync(d, { recursive: true, force: true });
  tmpDirs.clear();
}
process.on('exit', killChildren);
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.on(sig, () => { killChildren(); process.exit(128 + os.constants.signals[sig]); });
}

// Registers a child process so that killChildren() kills it; returns it.
export function track(proc) {
  children.add(proc);
  proc.on('exit', () => children.delete(proc));
  return proc;
}

export function tempDir(prefix) {
  const d = mkdtempSync(path.join(os.tmpdir(), prefix));
  tmpDirs.add(d);
  return d;
}

export function requireRedis() {
  for (const b of ['redis-server', 'redis-cli']) {
    const r = spawnSync(b, ['--version'], { encoding: 'utf8', timeout: 10000 });
    if (r.error || r.status !== 0) {
      console.error(`skipped: ${b} is not installed (Debian: apt-get install redis-server)`);
      process.exit(77);
    }
  }
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Polls fn() every everyMs until it returns a truthy value, for at most ms milliseconds.
export async function waitFor(fn, what, ms = 20000, everyMs = 50) {
  const end = Date.now() + ms;
  let last;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) { last = e; }
    if (Date.now() > end) {
      throw new Error(`gave up after ${ms} ms waiting for ${what}${last ? `: ${last.message}` : ''}`);
    }
    await sleep(everyMs);
  }
}

// Resolves what p resolves, or rejects after ms (the timer does not outlive p).
export function bounded(p, ms, what) {
  let timer;
  const t = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`gave up after ${ms} ms waiting for ${what}`)), ms);
  });
  return Promise.race([p, t]).finally(() => clearTimeout(timer));
}

// A port that is free now on 127.0.0.1 (the kernel's choice; closed again before use).
export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// ---- a RESP client ----

export class RedisError extends Error {}

// Parses one RESP reply from buf at off: [value, next offset], or null when incomplete.
function parseReply(buf, off) {
  const eol = buf.indexOf('\r\n', off);
  if (eol < 0) return null;
  const type = String.fromCharCode(buf[off]);
  const line = buf.toString('latin1', off + 1, eol);
  const next = eol + 2;
  switch (type) {
    case '+': return [line, next];
    case '-': return [new RedisError(line), next];
    case ':': return [Number(line), next];
    case '$': {
      const n = Number(line);
      if (n < 0) return [null, next];
      if (buf.length < next + n + 2) return null;
      return [buf.subarray(next, next + n), next + n + 2];
    }
    case '*': {
      const n = Number(line);
      if (n < 0) return [null, next];
      const out = [];
      let o = next;
      for (let i = 0; i < n; i++) {
        const r = parseReply(buf, o);
        if (!r) return null;
        out.push(r[0]);
        o = r[1];
      }
      return [out, o];
    }
    default: throw new Error(`bad RESP reply type ${JSON.stringify(type)}`);
  }
}

// A connection to 127.0.0.1:port (port a string: the unix socket at that path). cmd(...args) sends one command (strings or Buffers) and
// resolves its reply (bulk strings as Buffers); an error reply rejects with RedisError;
// no reply within timeoutMs rejects and closes the connection.
export function connect(port, timeoutMs = 5000) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(typeof port === 'string' ? { path: port } : { host: '127.0.0.1', port });
    const pending = [];
    let buf = Buffer.alloc(0);
    const fail = (e) => {
      for (const p of pending.splice(0)) { clearTimeout(p.timer); p.reject(e); }
    };
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      let off = 0;
      for (;;) {
        const r = pending.length ? parseReply(buf, off) : null;
        if (!r) break;
        off = r[1];
        const p = pending.shift();
        clearTimeout(p.timer);
        if (r[0] instanceof RedisError) p.reject(r[0]); else p.resolve(r[0]);
      }
      buf = buf.subarray(off);
    });
    sock.on('error', (e) => { fail(e); reject(e); });
    sock.on('close', () => fail(new Error(`redis ${port}: connection closed`)));
    sock.on('connect', () => resolve({
      cmd(...args) {
        const parts = [Buffer.from(`*${args.length}\r\n`)];
        for (const a of args) {
          const b = Buffer.isBuffer(a) ? a : Buffer.from(String(a));
          parts.push(Buffer.from(`$${b.length}\r\n`), b, Buffer.from('\r\n'));
        }
        return new Promise((res, rej) => {
          const timer = setTimeout(() => {
            rej(new Error(`redis ${port}: no reply to ${args[0]} in ${timeoutMs} ms`));
            sock.destroy();
          }, timeoutMs);
          pending.push({ resolve: res, reject: rej, timer });
          sock.write(Buffer.concat(parts));
        });
      },
      close() { sock.destroy(); },
    }));
  });
}

// One command on a fresh connection (closed after).
export async function command(port, ...args) {
  const c = await connect(port);
  try { return await c.cmd(...args); } finally { c.close(); }
}

// Runs redis-cli -h 127.0.0.1 -p port ...args (input, when given, on its stdin: with -x,
// the last argument, binary-safe); resolves stdout, rejects on a non-zero exit or after ms.
export function redisCli(port, args, ms = 30000, input = null) {
  return new Promise((resolve, reject) => {
    const c = execFile('redis-cli', ['-h', '127.0.0.1', '-p', String(port), ...args],
      { timeout: ms, maxBuffer: 64 << 20 }, (err, stdout, stderr) => {
        if (err) reject(new Error(`redis-cli ${args.join(' ')}: ${err.message}\n${stderr}`));
        else resolve(stdout);
      });
    c.stdin.end(input || undefined);
  });
}

// ---- redis-server ----

// Starts redis-server on 127.0.0.1:port (default: an ephemeral one; pass the port of a
// server that was stopped to restart "on the same port") in dir (default: a new temporary
// directory), without persistence (--save "" --appendonly no: a restart is empty), and
// resolves once it answers PING. extra: more "--name value" arguments. unix: no TCP port,
// a unix socket dir/redis.sock (mode 700) instead, whose path is then `port` (connect and
// command take it). Returns { port, dir, proc, exited, kill(sig), stop(), info(section) }.
export async function startRedis({ port, dir, extra = [], unix = false } = {}) {
  if (!dir) dir = tempDir('pagoda-redis-');
  if (unix) port = path.join(dir, 'redis.sock');
  else if (!port) port = await freePort();
  const where = unix ? ['--port', '0', '--unixsocket', port, '--unixsocketperm', '700']
    : ['--port', String(port), '--bind', '127.0.0.1'];
  const args = [...where, '--save', '', '--appendonly', 'no', '--dir', dir, '--daemonize', 'no',
                '--logfile', '', '--loglevel', 'warning', ...extra];
  const proc = track(spawn('redis-server', args, { stdio: ['ignore', 'pipe', 'pipe'] }));
  let log = '';
  proc.stdout.on('data', (d) => { log += d; });
  proc.stderr.on('data', (d) => { log += d; });
  const exited = new Promise((r) => proc.on('exit', (code, sig) => r({ code, sig })));
  let gone = null;
  exited.then((e) => { gone = e; });
  await waitFor(async () => {
    if (gone) throw new Error(`redis-server exited (${JSON.stringify(gone)}): ${log}`);
    try {
      return (await command(port, 'PING')) === 'PONG';
    } catch (e) {
      if (e instanceof RedisError && e.message.startsWith('NOAUTH')) return true; // requirepass
      throw e;
    }
  }, `redis-server on port ${port} to answer PING`, 15000);
  const r = {
    port, dir, extra, proc, exited,
    log: () => log,
    // A new redis-server on the same port, directory and arguments (a cluster node keeps
    // its identity and slots from its nodes.conf; the data is gone: no persistence).
    restart() { return startRedis({ port: unix ? undefined : port, dir, extra, unix }); },
    // Sends sig (SIGKILL: no shutdown at all) and waits (bounded) for the exit.
    async kill(sig = 'SIGKILL') {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(sig);
      await bounded(exited, 10000, `redis-server on port ${port} to exit`);
    },
    stop() { return r.kill('SIGKILL'); },
    async info(section) {
      const s = (await command(port, 'INFO', section)).toString();
      const o = {};
      for (const l of s.split('\r\n')) {
        const i = l.indexOf(':');
        if (i > 0 && !l.startsWith('#')) o[l.slice(0, i)] = l.slice(i + 1);
      }
      return o;
    },
  };
  return r;
}

// Waits (bounded) until every node of cl says cluster_state:ok, knows all of them and has
// every slot assigned.
export async function clusterOk(cl, ms = 30000) {
  for (const x of cl.nodes) {
    await waitFor(async () => {
      const s = (await command(x.port, 'CLUSTER', 'INFO')).toString();
      return s.includes('cluster_state:ok') && s.includes(`cluster_known_nodes:${cl.nodes.length}`)
        && s.includes('cluster_slots_assigned:16384');
    }, `cluster_state:ok on node ${x.port}`, ms, 100);
  }
}

// Starts n cluster-enabled masters (each with an explicit --cluster-port, so the bus port
// is ephemeral too), joins them with `redis-cli --cluster create ... --cluster-replicas 0
// --cluster-yes` (every slot assigned) and waits until every node says cluster_state:ok
// and knows all n. Returns { nodes: [startRedis results], ports, stop() }.
export async function startCluster(n = 3) {
  const dir = tempDir('pagoda-cluster-');
  const nodes = [];
  try {
    for (let i = 0; i < n; i++) {
      const bus = await freePort();
      nodes.push(await startRedis({
        dir,
        extra: ['--cluster-enabled', 'yes', '--cluster-port', String(bus),
                '--cluster-config-file', `nodes-${i}-${process.pid}.conf`,
                '--cluster-node-timeout', '5000'],
      }));
    }
    await redisCli(nodes[0].port, ['--cluster', 'create',
      ...nodes.map((x) => `127.0.0.1:${x.port}`), '--cluster-replicas', '0', '--cluster-yes'],
    60000);
    await clusterOk({ nodes });
  } catch (e) {
    for (const x of nodes) await x.stop();
    throw e;
  }
  return {
    nodes,
    ports: nodes.map((x) => x.port),
    async stop() { for (const x of nodes) await x.stop(); },
  };
}

const nodeId = async (port) => (await command(port, 'CLUSTER', 'MYID')).toString();

// Moves slot from the master at port src to the one at dst (the steps of redis-cli
// --cluster reshard, for one slot): IMPORTING on dst, MIGRATING on src, MIGRATE of its keys
// (a client meeting the slot meanwhile gets ASK from src), then, unless finish is false
// (finishSlot later), SETSLOT NODE on every master (from then on: MOVED). Returns the
// number of keys moved.
export async function migrateSlot(cl, slot, src, dst, finish = true) {
  const srcId = await nodeId(src), dstId = await nodeId(dst);
  await command(dst, 'CLUSTER', 'SETSLOT', slot, 'IMPORTING', srcId);
  await command(src, 'CLUSTER', 'SETSLOT', slot, 'MIGRATING', dstId);
  let moved = 0;
  for (;;) {
    const ks = await command(src, 'CLUSTER', 'GETKEYSINSLOT', slot, 100);
    if (!ks.length) break;
    await command(src, 'MIGRATE', '127.0.0.1', dst, '', 0, 5000, 'KEYS', ...ks);
    moved += ks.length;
  }
  if (finish) await finishSlot(cl, slot, src, dst);
  return moved;
}

// The last step of migrateSlot: slot belongs to dst on every master.
export async function finishSlot(cl, slot, src, dst) {
  const dstId = await nodeId(dst);
  await command(dst, 'CLUSTER', 'SETSLOT', slot, 'NODE', dstId);
  await command(src, 'CLUSTER', 'SETSLOT', slot, 'NODE', dstId);
  for (const p of cl.ports) {
    if (p !== src && p !== dst) await command(p, 'CLUSTER', 'SETSLOT', slot, 'NODE', dstId);
  }
}

// The keys matching pattern on one node (KEYS; tests hold few keys), as strings.
export async function keys(port, pattern = 'pgd:*') {
  return (await command(port, 'KEYS', pattern)).map((b) => b.toString('latin1'));
}

// ---- a delaying TCP proxy ----

// Listens on 127.0.0.1 (ephemeral port) and forwards every connection to 127.0.0.1:port.
// Each chunk, either way, is delivered proxy.delayMs after it arrived (in order: timers
// of one delay fire in the order they were set). Returns { port, delayMs, n_conns, close() }.
export function startProxy(port) {
  return new Promise((resolve, reject) => {
    const socks = new Set();
    const proxy = { port: 0, delayMs: 0, n_conns: 0, close: null };
    const pipe = (src, dst) => {
      src.on('data', (d) => {
        const ms = proxy.delayMs;
        if (ms <= 0) dst.write(d);
        else setTimeout(() => { if (!dst.destroyed) dst.write(d); }, ms);
      });
      src.on('end', () => {
        const ms = proxy.delayMs;
        setTimeout(() => dst.end(), ms > 0 ? ms + 1 : 0);
      });
      src.on('error', () => dst.destroy());
      src.on('close', () => {
        setTimeout(() => dst.destroy(), proxy.delayMs > 0 ? proxy.delayMs + 1 : 0);
      });
    };
    const srv = net.createServer((client) => {
      proxy.n_conns++;
      const up = net.connect({ host: '127.0.0.1', port });
      socks.add(client);
      socks.add(up);
      client.on('close', () => socks.delete(client));
      up.on('close', () => socks.delete(up));
      pipe(client, up);
      pipe(up, client);
    });
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      proxy.port = srv.address().port;
      proxy.close = () => new Promise((r) => {
        for (const s of socks) s.destroy();
        srv.close(() => r());
      });
      resolve(proxy);
    });
  });
}

// ---- pagoda serve instances on a Redis tier ----

// SIGTERMs a `pagoda serve` (common.mjs startServer) and waits at most ms for its exit,
// which must be 0 (a sanitizer report or a leak fails it); past ms: SIGKILL, and throws.
export async function stopServer(srv, ms = 30000) {
  if (!srv) return;
  srv.proc.kill('SIGTERM');
  let e;
  try {
    e = await bounded(srv.exited, ms, 'pagoda serve to exit after SIGTERM');
  } catch (err) {
    srv.proc.kill('SIGKILL');
    throw new Error(`${err.message}\n${srv.stderr()}`);
  }
  if (e.code !== 0) {
    throw new Error(`pagoda serve exited with code ${e.code} signal ${e.sig}:\n${srv.stderr()}`);
  }
}

// Runs `pagoda serve -m modelPath ...args` expecting it to exit by itself (a startup
// error); resolves { code, stderr }; SIGKILLs it and rejects if it still runs after ms.
export function serveToExit(modelPath, args, ms = 30000) {
  return new Promise((resolve, reject) => {
    const p = track(spawn(process.env.PAGODA_BIN, ['serve', '-m', modelPath, '--host', '127.0.0.1',
                                                   '--port', '0', '-t', '1', ...args],
                          { stdio: ['ignore', 'ignore', 'pipe'] }));
    let err = '';
    p.stderr.on('data', (d) => { err += d; });
    const timer = setTimeout(() => {
      p.kill('SIGKILL');
      reject(new Error(`still running: ${err}`));
    }, ms);
    p.on('exit', (code) => { clearTimeout(timer); resolve({ code, stderr: err }); });
  });
}

// metric name{tier="redis"} of a parseMetrics result (undefined when absent).
export const tierMetric = (m, name, tier = 'redis') => m[`${name}{tier="${tier}"}`];

// A set of `pagoda serve` instances on a Redis tier: start(url, extra) runs one with
// `--tier url --hash-key-file keyFile` after serveArgs (tracked: killChildren() kills it),
// stopAll() stops them all (bounded, exit status 0 required).
export function instances(modelPath, keyFile, serveArgs) {
  const list = [];
  return {
    list,
    async start(url, extra = [], key = keyFile) {
      const s = await startServer(modelPath, [...serveArgs, '--tier', url, '--hash-key-file', key,
                                              ...extra]);
      track(s.proc);
      list.push(s);
      return s;
    },
    async stop(s) {
      list.splice(list.indexOf(s), 1);
      await stopServer(s);
    },
    async stopAll() {
      const errs = [];
      for (const s of list.splice(0)) {
        try { await stopServer(s); } catch (e) { errs.push(e); }
      }
      if (errs.length) throw errs[0];
    },
  };
}

// The usage of a response: cached_tokens_by_tier has the keys "pool", "redis", adding up
// to prompt_tokens_details.cached_tokens; returns that split.
export function byTier(u) {
  assert.ok(u && u.pagoda && u.pagoda.cached_tokens_by_tier, `usage.pagoda: ${JSON.stringify(u)}`);
  const t = u.pagoda.cached_tokens_by_tier;
  assert.deepEqual(Object.keys(t), ['pool', 'redis']);
  assert.equal(t.pool + t.redis, u.prompt_tokens_details.cached_tokens, JSON.stringify(u));
  return t;
}

export const MAX_TOKENS = 16; // completion tokens of each request

// A greedy completion (status 200 required): { text, usage, t: byTier }.
export async function complete(srv, prompt, extra = {}) {
  const r = await post(srv, '/v1/completions',
    { prompt, max_tokens: MAX_TOKENS, temperature: 0, ...extra });
  assert.equal(r.status, 200, r.text);
  return { text: r.json.choices[0].text, usage: r.json.usage, t: byTier(r.json.usage) };
}

// A greedy chat completion of one user message, as complete().
export async function chat(srv, content, extra = {}) {
  const r = await post(srv, '/v1/chat/completions', {
    messages: [{ role: 'user', content }], max_tokens: MAX_TOKENS, temperature: 0, ...extra,
  });
  assert.equal(r.status, 200, r.text);
  return { text: r.json.choices[0].message.content, usage: r.json.usage, t: byTier(r.json.usage) };
}

// Waits until srv's Redis tier wrote what it was given: the cache's write-back slots are
// empty, the tier's put queue is empty and more pages were demoted to "redis" than in
// `since` (a metrics snapshot taken before the request), stable over two reads 100 ms
// apart (a mover may hold the last page it took). since null: only the queues empty.
export async function written(srv, since, ms = 20000) {
  const d0 = since ? tierMetric(since, 'pagoda_tier_demoted_pages_total') : -1;
  const done = (m) => m.pagoda_tier_writeback_queue_pages === 0
    && tierMetric(m, 'pagoda_tier_put_queue_bytes') === 0
    && tierMetric(m, 'pagoda_tier_demoted_pages_total') > d0;
  await waitFor(async () => {
    if (!done(await metrics(srv))) return false;
    await sleep(100);
    return done(await metrics(srv));
  }, "the Redis tier's writes", ms);
}
