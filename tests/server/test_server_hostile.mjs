// SPDX-License-Identifier: MIT
// test_server_hostile.mjs - the real `pagoda serve` against hostile or odd clients, over
// raw sockets (node:net) where fetch would hide what is tested:
//   - slowloris: 1,000 connections (200 under TSan) trickling their headers a byte a second while /health
//     (a fresh connection each time) and a completion still answer; /health's p50/p99
//     latency under the attack is printed (no timing assertion beyond 5 s each);
//   - the guard: a trickler is cut after --header-timeout, a slow body after
//     --min-body-rate; --max-connections-per-ip refuses the connection over the limit;
//   - before the body: 401/404/405 answered on the headers, four 16 MB bodies unread (the
//     server's peak RSS, VmHWM, does not grow by a body's size);
//   - half-close: a client that shuts down its write side after the request still gets
//     its answer, whole or streamed;
//   - smuggling: two Content-Length headers, Content-Length with Transfer-Encoding and an
//     HTTP/1.1 request without Host get 400;
//   - shutdown: SIGTERM during 4 streams ends every one with [DONE] (after an error event
//     or its last chunk); during the grace period a new connection gets 503 at once;
//   - a FIFO given as the model: inspect, run and serve exit non-zero at once, saying so;
//   - SIGTERM while the model loads (strace holds its open; skipped without strace) ends
//     the process with 128+15 and no listening line.
// Run by ctest (labels integration, thread, http); see common.mjs for the environment.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { spawn, execFileSync } from 'node:child_process';
import { readFileSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BIN, requireSetup, startServer, post, get, stream, sleep, until } from './common.mjs';

const model = requireSetup();

// ---- raw HTTP over a socket ----

// Sends `req` (a string or Buffer) on a new connection and collects everything the server
// sends until it closes (or `ms` passes). opts.halfClose: shut down the write side after
// sending. Resolves { data, closed, ms }.
function raw(port, req, opts = {}) {
  const ms = opts.ms ?? 10000;
  return new Promise((resolve) => {
    const t0 = performance.now();
    const s = net.connect({ host: '127.0.0.1', port, allowHalfOpen: true });
    let data = '', done = false;
    const finish = (closed) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      s.destroy();
      resolve({ data, closed, ms: performance.now() - t0 });
    };
    const timer = setTimeout(() => finish(false), ms);
    s.on('connect', () => {
      s.write(req);
      if (opts.halfClose) s.end();
    });
    s.on('data', (d) => { data += d.toString('latin1'); });
    s.on('end', () => finish(true));
    s.on('close', () => finish(true));
    s.on('error', () => finish(true));
  });
}

// The final status of a raw response (past any interim 1xx).
function statusOf(data) {
  const all = [...data.matchAll(/HTTP\/1\.[01] (\d{3})/g)].map((m) => Number(m[1]));
  const fin = all.filter((c) => c >= 200);
  return fin.length ? fin[0] : 0;
}

function postReq(route, body, extra = '') {
  return `POST ${route} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
    `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n${extra}\r\n${body}`;
}

const healthReq = 'GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n';

function vm(pid, key) {
  const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(new RegExp(`^${key}:\\s+(\\d+) kB`, 'm'));
  return m ? Number(m[1]) * 1024 : 0;
}

// Raises this process's soft limit on open files to `want` (node cannot: prlimit can).
function fdLimit(want) {
  const lim = readFileSync('/proc/self/limits', 'utf8').match(/^Max open files\s+(\d+|unlimited)\s+(\d+|unlimited)/m);
  if (!lim) return want;
  const soft = lim[1] === 'unlimited' ? Infinity : Number(lim[1]);
  const hard = lim[2] === 'unlimited' ? Infinity : Number(lim[2]);
  if (soft >= want) return want;
  const to = Math.min(want, hard);
  try {
    execFileSync('prlimit', [`--pid=${process.pid}`, `--nofile=${to}:${lim[2]}`]);
    return to;
  } catch {
    return soft;
  }
}

// ---- slowloris ----

// Under TSan 200: its thread registry makes each thread's creation cost grow with the live
// threads, so the listen thread, creating a connection thread per attacker, had made 731 of
// 1,000 after 4.5 s (gdb: in __tsan::ThreadCreate) and the /health connection queued behind
// them (a 5 s timeout; the same binary without TSan answers at once).
const TSAN = /thread/.test(process.env.PGD_SANITIZE || '');

test('slowloris: 1,000 trickling connections (200 under TSan), /health and a completion still answer', async () => {
  const N = TSAN ? 200 : 1000;
  const limit = fdLimit(N + 200);
  if (limit < N + 100) {
    console.log(`# skipped: open-file limit ${limit} < ${N + 100}`);
    return;
  }
  const srv = await startServer(model.path);
  const socks = [];
  let closedEarly = 0, stop = false;
  try {
    // Open the attack, a few at a time (the listen backlog is finite), each sending the
    // start of a request and then a byte a second, never the end of its headers.
    for (let i = 0; i < N; i++) {
      const s = net.connect({ host: '127.0.0.1', port: srv.port });
      s.on('error', () => {});
      s.on('close', () => { if (!stop) closedEarly++; });
      s.on('connect', () => s.write('GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: '));
      socks.push(s);
      if (i % 50 === 49) await sleep(20);
    }
    await until(() => socks.every((s) => !s.connecting), 'the attack to connect', 400, 25);
    const trickle = setInterval(() => { for (const s of socks) if (!s.destroyed) s.write('a'); }, 1000);
    try {
      await sleep(500);
      // /health on a fresh connection each time, while the attack holds its connections.
      const lat = [];
      const tEnd = performance.now() + 6000;
      while (performance.now() < tEnd && lat.length < 200) {
        const r = await raw(srv.port, healthReq, { ms: 5000 });
        assert.equal(statusOf(r.data), 200, `/health under the attack: ${JSON.stringify(r.data.slice(0, 80))}`);
        lat.push(r.ms);
        await sleep(10);
      }
      const c = await post(srv, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 8 });
      assert.equal(c.status, 200, c.text);
      lat.sort((a, b) => a - b);
      const q = (p) => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))];
      console.log(`# slowloris: ${N} trickling connections (${closedEarly} closed by the server ` +
        `meanwhile); /health x${lat.length}: p50 ${q(0.5).toFixed(1)} ms, ` +
        `p99 ${q(0.99).toFixed(1)} ms, max ${lat[lat.length - 1].toFixed(1)} ms`);
      assert.equal(closedEarly, 0, 'the attack stayed connected (it was under every limit)');
    } finally {
      clearInterval(trickle);
    }
  } finally {
    stop = true;
    for (const s of socks) s.destroy();
    await srv.stop();
  }
});

test('guard: a trickler is cut after --header-timeout, a slow body after --min-body-rate', async () => {
  const srv = await startServer(model.path, ['--header-timeout', '1', '--min-body-rate', '1000']);
  try {
    const cut = (first, every) => new Promise((resolve) => {
      const t0 = performance.now();
      const s = net.connect({ host: '127.0.0.1', port: srv.port });
      let timer;
      s.on('error', () => {});
      s.on('connect', () => {
        s.write(first);
        timer = setInterval(() => { if (!s.destroyed) s.write(every); }, 200);
      });
      s.on('close', () => { clearInterval(timer); resolve(performance.now() - t0); });
      setTimeout(() => { clearInterval(timer); s.destroy(); resolve(Infinity); }, 8000);
    });
    const tHdr = await cut('GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ', 'a');
    assert.ok(tHdr >= 900 && tHdr < 5000, `headers trickled: cut after ${tHdr} ms`);
    const tBody = await cut(
      'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{', ' ');
    assert.ok(tBody >= 900 && tBody < 5000, `body at 5 bytes/s: cut after ${tBody} ms`);
    const h = await get(srv, '/health');
    assert.equal(h.status, 200);
  } finally {
    await srv.stop();
  }
});

test('--max-connections-per-ip refuses the connection over the limit', async () => {
  const srv = await startServer(model.path, ['--max-connections-per-ip', '4']);
  const held = [];
  try {
    for (let i = 0; i < 4; i++) {
      const s = net.connect({ host: '127.0.0.1', port: srv.port });
      s.on('error', () => {});
      held.push(s);
    }
    await until(() => held.every((s) => !s.connecting), 'four connections');
    await sleep(200);
    const r = await raw(srv.port, healthReq, { ms: 3000 });
    assert.ok(r.closed && statusOf(r.data) === 0, `the fifth connection: ${r.data.slice(0, 60)}`);
    for (const s of held) s.destroy();
    await until(async () => statusOf((await raw(srv.port, healthReq)).data) === 200,
      '/health once the four closed');
  } finally {
    for (const s of held) s.destroy();
    await srv.stop();
  }
});

// ---- before the body ----

test('401/404/405 are answered on the headers: 16 MB bodies are never read', async () => {
  const srv = await startServer(model.path, ['--api-key', 'sekret', '--max-body', '64M']);
  try {
    const body = Buffer.alloc(16 << 20, 0x20);
    // Sends the headers, waits 200 ms for an early answer (as curl does for a large body),
    // then writes the body 64 KB at a time, stopping at the first byte of an answer: a
    // server that answers on the headers closes without reading, and a client still
    // writing into the closed connection would get a reset instead of the answer.
    const send = (head) => new Promise((resolve) => {
      const s = net.connect({ host: '127.0.0.1', port: srv.port });
      let data = '', closed = false;
      s.on('error', () => {});
      s.on('data', (d) => { data += d.toString('latin1'); });
      s.on('close', () => { closed = true; resolve(statusOf(data)); });
      s.on('connect', async () => {
        s.write(head + `Content-Length: ${body.length}\r\n\r\n`);
        await until(() => data || closed, 'an early answer', 4, 50).catch(() => {});
        for (let off = 0; off < body.length && !data && !closed; off += 65536) {
          if (!s.write(body.subarray(off, off + 65536)))
            await new Promise((r) => { s.once('drain', r); s.once('close', r); });
          await sleep(1);
        }
        await until(() => /\r\n\r\n/.test(data) || closed, 'an answer', 400, 50).catch(() => {});
        s.destroy();
      });
    });
    await get(srv, '/health');
    const hwm0 = vm(srv.proc.pid, 'VmHWM');
    const codes = await Promise.all([
      send('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n'),
      send('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n'),
      send('POST /nowhere HTTP/1.1\r\nHost: x\r\n'),
      send('POST /health HTTP/1.1\r\nHost: x\r\n'),
    ]);
    assert.deepEqual(codes, [401, 401, 404, 405]);
    const grew = vm(srv.proc.pid, 'VmHWM') - hwm0;
    console.log(`# four 16 MB bodies refused on the headers: peak RSS grew by ${(grew / 1048576).toFixed(1)} MB`);
    assert.ok(grew < 8 << 20, `peak RSS grew by ${grew} bytes`);
    // With the key, the same route still reads its body.
    const ok = await post(srv, '/v1/completions', { prompt: 'Once', max_tokens: 2 },
      { authorization: 'Bearer sekret' });
    assert.equal(ok.status, 200, ok.text);
  } finally {
    await srv.stop();
  }
});

// ---- half-close, smuggling ----

test('half-close: the request, then shutdown(SHUT_WR): the answer still comes', async () => {
  const srv = await startServer(model.path);
  try {
    const whole = await raw(srv.port,
      postReq('/v1/completions', JSON.stringify({ prompt: 'Once upon a time', max_tokens: 8 })),
      { halfClose: true });
    assert.equal(statusOf(whole.data), 200, whole.data.slice(0, 200));
    assert.match(whole.data, /"text_completion"/);
    const streamed = await raw(srv.port,
      postReq('/v1/completions', JSON.stringify({ prompt: 'Once', max_tokens: 8, stream: true })),
      { halfClose: true });
    assert.equal(statusOf(streamed.data), 200, streamed.data.slice(0, 200));
    assert.match(streamed.data, /data: \[DONE\]/);
    const health = await raw(srv.port, healthReq, { halfClose: true });
    assert.equal(statusOf(health.data), 200);
  } finally {
    await srv.stop();
  }
});

test('smuggling: duplicate Content-Length, Content-Length with chunked, no Host: 400', async () => {
  const srv = await startServer(model.path);
  try {
    const body = JSON.stringify({ prompt: 'Once', max_tokens: 2 });
    const two = await raw(srv.port, 'POST /v1/completions HTTP/1.1\r\nHost: x\r\n' +
      `Content-Length: ${body.length}\r\nContent-Length: 5\r\nConnection: close\r\n\r\n${body}`);
    assert.equal(statusOf(two.data), 400, two.data.slice(0, 200));
    const same = await raw(srv.port, 'POST /v1/completions HTTP/1.1\r\nHost: x\r\n' +
      `Content-Length: ${body.length}\r\ncontent-length: ${body.length}\r\nConnection: close\r\n\r\n${body}`);
    assert.equal(statusOf(same.data), 400, same.data.slice(0, 200));
    const te = await raw(srv.port, 'POST /v1/completions HTTP/1.1\r\nHost: x\r\n' +
      `Content-Length: 4\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n` +
      `${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`);
    assert.equal(statusOf(te.data), 400, te.data.slice(0, 200));
    const noHost = await raw(srv.port, 'GET /health HTTP/1.1\r\nConnection: close\r\n\r\n');
    assert.equal(statusOf(noHost.data), 400, noHost.data.slice(0, 200));
    const http10 = await raw(srv.port, 'GET /health HTTP/1.0\r\n\r\n');
    assert.equal(statusOf(http10.data), 200, http10.data.slice(0, 200));
    const ok = await raw(srv.port, postReq('/v1/completions', body));
    assert.equal(statusOf(ok.data), 200, ok.data.slice(0, 200));
  } finally {
    await srv.stop();
  }
});

// ---- shutdown ----

test('shutdown: SIGTERM during 4 streams ends each with [DONE]', async () => {
  const srv = await startServer(model.path, ['--shutdown-grace', '0', '--max-running', '4']);
  let started = 0;
  const streams = [];
  for (let i = 0; i < 4; i++) {
    streams.push(stream(srv, '/v1/completions',
      { prompt: `Once upon a time ${i}`, max_tokens: 100000, ignore_eos: true },
      (ev, evs) => { if (evs.length === 2) started++; return false; }).catch((e) => ({ err: e })));
  }
  await until(() => started === 4, 'four streams under way');
  srv.proc.kill('SIGTERM');
  const rs = await Promise.all(streams);
  for (const r of rs) {
    assert.ok(!r.err, `a stream broke: ${r.err}`);
    assert.equal(r.events[r.events.length - 1], '[DONE]', 'the stream ends with [DONE]');
    const last = r.events[r.events.length - 2];
    assert.ok(last.error || last.choices?.[0]?.finish_reason,
      `before [DONE]: an error event or a finish: ${JSON.stringify(last)}`);
  }
  const { code } = await srv.exited;
  assert.equal(code, 0);
});

test('shutdown: during the grace period a new connection gets 503 at once', async () => {
  const srv = await startServer(model.path, ['--shutdown-grace', '4']);
  // A request in flight that holds the grace period open: headers in, body unfinished.
  const hold = net.connect({ host: '127.0.0.1', port: srv.port });
  hold.on('error', () => {});
  await new Promise((r) => hold.on('connect', r));
  hold.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{');
  await sleep(300);
  srv.proc.kill('SIGTERM');
  await srv.waitStdout(/shutting down/);
  const h = await raw(srv.port, healthReq, { ms: 2000 });
  assert.ok(h.closed, 'the new connection is answered or refused, not left hanging');
  assert.ok(statusOf(h.data) === 503 || statusOf(h.data) === 0, h.data.slice(0, 100));
  const c = await raw(srv.port,
    postReq('/v1/completions', JSON.stringify({ prompt: 'Once', max_tokens: 2 })), { ms: 2000 });
  assert.ok(c.closed, 'a new completion is answered or refused, not left hanging');
  assert.ok(statusOf(c.data) === 503 || statusOf(c.data) === 0, c.data.slice(0, 100));
  hold.destroy();
  const { code } = await srv.exited;
  assert.equal(code, 0);
});

// ---- a FIFO as the model ----

test('a FIFO as the model: inspect, run and serve refuse it at once', async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'pagoda-fifo-'));
  try {
    const fifo = path.join(dir, 'model.gguf');
    execFileSync('mkfifo', [fifo]);
    for (const args of [['inspect', fifo], ['run', '-m', fifo, '-p', 'x', '-n', '1'],
      ['serve', '-m', fifo, '--port', '0']]) {
      const r = await new Promise((resolve) => {
        const p = spawn(BIN, args, { stdio: ['ignore', 'ignore', 'pipe'] });
        let err = '';
        p.stderr.on('data', (d) => { err += d; });
        const timer = setTimeout(() => p.kill('SIGKILL'), 5000);
        p.on('exit', (code, sig) => { clearTimeout(timer); resolve({ code, sig, err }); });
      });
      assert.ok(r.sig === null && r.code !== 0, `pagoda ${args[0]}: exit ${r.code} ${r.sig}`);
      assert.match(r.err, /not a regular file/, `pagoda ${args[0]}: ${r.err}`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

// ---- a signal while the model loads ----

test('SIGTERM while the model loads (its open held 2 s by strace) exits, never serving', async (t) => {
  try {
    execFileSync('strace', ['-o', '/dev/null', 'true']);
  } catch {
    t.skip('strace is missing or cannot trace here');
    return;
  }
  const m = path.resolve(model.path);
  // Only the model's openat is traced (-P) and held 2 s on entry: the load is under way.
  const p = spawn('strace', ['-f', '-o', '/dev/null', '-P', m, '-e', 'trace=openat', '-e',
    'inject=openat:delay_enter=2000000', BIN, 'serve', '-m', m, '--port', '0'],
  { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '', err = '';
  p.stdout.on('data', (d) => { out += d; });
  p.stderr.on('data', (d) => { err += d; });
  const exited = new Promise((resolve) => p.on('exit', (code, sig) => resolve({ code, sig })));
  // strace forks short-lived probes of its own before the tracee: the pid to signal is
  // the child that has exec'ed `pagoda serve`.
  const child = await until(() => {
    try {
      const kids = readFileSync(`/proc/${p.pid}/task/${p.pid}/children`, 'utf8').trim();
      for (const c of kids.split(/\s+/).filter(Boolean)) {
        const argv = readFileSync(`/proc/${c}/cmdline`, 'utf8').split('\0');
        if (argv[0] === BIN && argv[1] === 'serve') return Number(c);
      }
    } catch { /* gone meanwhile: look again */ }
    return 0;
  }, 'pagoda under strace');
  await sleep(500);
  let code;
  try {
    process.kill(child, 'SIGTERM');
    const timer = setTimeout(() => p.kill('SIGKILL'), 15000);
    ({ code } = await exited);
    clearTimeout(timer);
  } finally {
    // Never leave a server behind (killing strace would let it run on, detached).
    try { process.kill(child, 'SIGKILL'); } catch { /* exited */ }
  }
  assert.doesNotMatch(out, /listening/, 'it never served');
  assert.match(err, /SIGTERM while loading/, err);
  assert.equal(code, 128 + 15);
});
