// SPDX-License-Identifier: MIT
// common.mjs - what the server tests share: finding the pagoda binary and a model,
// starting the real `pagoda serve` on 127.0.0.1 with an ephemeral port, HTTP helpers
// (JSON, SSE, Prometheus text) and polling. No npm dependencies: node:* and global fetch.
//
// Environment (set by ctest, see CMakeLists.txt):
//   PAGODA_BIN      the pagoda binary (required)
//   PGD_MODELS_DIR  directory with stories260K.gguf (else PGD_SOURCE_DIR/../shared/models)
//   PGD_SYNTH_MODEL a synthetic model to fall back on when stories260K is absent
// A test program exits 77 (ctest: skipped) when no model is found at all.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';

export const BIN = process.env.PAGODA_BIN;

export function findModel() {
  const dirs = [];
  if (process.env.PGD_MODELS_DIR) dirs.push(process.env.PGD_MODELS_DIR);
  if (process.env.PGD_SOURCE_DIR) dirs.push(path.join(process.env.PGD_SOURCE_DIR, '..', 'shared', 'models'));
  for (const d of dirs) {
    const p = path.join(d, 'stories260K.gguf');
    if (existsSync(p)) return { path: p, stories: true };
  }
  const s = process.env.PGD_SYNTH_MODEL;
  if (s && existsSync(s)) return { path: s, stories: false };
  return null;
}

export function requireSetup() {
  if (!BIN || !existsSync(BIN)) {
    console.error('PAGODA_BIN is not set to the pagoda binary');
    process.exit(1);
  }
  const m = findModel();
  if (!m) {
    console.error('skipped: no model (stories260K.gguf via PGD_MODELS_DIR, or PGD_SYNTH_MODEL)');
    process.exit(77);
  }
  return m;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Starts `pagoda serve` and resolves once it printed its listening line.
// Returns { url, port, proc, stderr(), waitStdout(re), stop() }.
export async function startServer(model, extra = []) {
  const args = ['serve', '-m', model, '--host', '127.0.0.1', '--port', '0', '-t', '2',
                '--kv-memory', '32M', ...extra];
  const proc = spawn(BIN, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '', err = '';
  const waiters = [];
  const exited = new Promise((resolve) => proc.on('exit', (code, sig) => resolve({ code, sig })));
  proc.stdout.on('data', (d) => {
    out += d.toString();
    for (const w of waiters.slice()) {
      const m = out.match(w.re);
      if (m) { waiters.splice(waiters.indexOf(w), 1); w.resolve(m); }
    }
  });
  proc.stderr.on('data', (d) => { err += d.toString(); });
  const waitStdout = (re) => {
    const m = out.match(re);
    if (m) return Promise.resolve(m);
    return new Promise((resolve, reject) => {
      waiters.push({ re, resolve });
      exited.then(({ code, sig }) => reject(new Error(
        `pagoda serve exited (code ${code}, signal ${sig}) before printing ${re}\n${err}`)));
    });
  };
  const m = await waitStdout(/listening on (http:\/\/127\.0\.0\.1:(\d+))\n/);
  const srv = {
    url: m[1], port: Number(m[2]), proc,
    stderr: () => err,
    waitStdout,
    exited,
    // SIGTERM, then the exit status must be 0: a sanitizer report or a leak fails it.
    async stop() {
      proc.kill('SIGTERM');
      const { code, sig } = await exited;
      if (code !== 0) throw new Error(`pagoda serve exited with code ${code} signal ${sig}:\n${err}`);
    },
  };
  return srv;
}

export async function post(srv, route, body, headers = {}) {
  const res = await fetch(srv.url + route, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, json, text, headers: res.headers };
}

export async function get(srv, route, headers = {}) {
  const res = await fetch(srv.url + route, { headers });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, json, text, headers: res.headers };
}

// Reads an SSE response: returns { events: [parsed JSON | '[DONE]'], raw }.
// onEvent(ev, events) may return true to abort the read (the caller aborts the request).
export async function readSSE(res, onEvent) {
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '', raw = '';
  const events = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    const s = dec.decode(value, { stream: true });
    buf += s;
    raw += s;
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!block.startsWith('data: ')) throw new Error(`bad SSE block: ${JSON.stringify(block)}`);
      const data = block.slice(6);
      const ev = data === '[DONE]' ? data : JSON.parse(data);
      events.push(ev);
      if (onEvent && onEvent(ev, events)) return { events, raw, aborted: true };
    }
  }
  if (buf.length) throw new Error(`SSE stream ends inside a block: ${JSON.stringify(buf)}`);
  return { events, raw, aborted: false };
}

export async function stream(srv, route, body, onEvent) {
  const ctl = new AbortController();
  const res = await fetch(srv.url + route, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true }), signal: ctl.signal,
  });
  if (res.status !== 200) throw new Error(`stream: status ${res.status}: ${await res.text()}`);
  if (!String(res.headers.get('content-type')).startsWith('text/event-stream'))
    throw new Error(`stream: content-type ${res.headers.get('content-type')}`);
  try {
    const r = await readSSE(res, onEvent);
    if (r.aborted) ctl.abort();
    return r;
  } catch (e) {
    ctl.abort();
    throw e;
  }
}

// Parses Prometheus text into { 'name{labels}': value }, checking HELP/TYPE come first.
export function parseMetrics(text) {
  const vals = {};
  const typed = new Set();
  for (const line of text.split('\n')) {
    if (!line) continue;
    let m = line.match(/^# (HELP|TYPE) (\S+) (.+)$/);
    if (m) { if (m[1] === 'TYPE') typed.add(m[2]); continue; }
    m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$/);
    if (!m) throw new Error(`bad metrics line: ${line}`);
    const base = m[1].replace(/_(bucket|sum|count)$/, '');
    if (!typed.has(m[1]) && !typed.has(base)) throw new Error(`metric without # TYPE: ${line}`);
    vals[m[1] + (m[2] || '')] = Number(m[3]);
  }
  return vals;
}

export async function metrics(srv) {
  const r = await get(srv, '/metrics');
  if (r.status !== 200) throw new Error(`/metrics: ${r.status}`);
  return parseMetrics(r.text);
}

// Polls fn() until it returns a truthy value; throws after `tries` polls (a bound against
// hanging, not a timing assertion: every condition polled here must become true).
export async function until(fn, what, tries = 600, everyMs = 50) {
  for (let i = 0; i < tries; i++) {
    const v = await fn();
    if (v) return v;
    await sleep(everyMs);
  }
  throw new Error(`gave up waiting for ${what}`);
}

// Deterministic pseudo-random token ids in [3, n_vocab) (3: past unk/bos/eos).
export function randomTokens(seed, n, nVocab = 512) {
  let s = BigInt(seed) | 1n;
  const out = [];
  for (let i = 0; i < n; i++) {
    s ^= s >> 12n; s ^= (s << 25n) & 0xffffffffffffffffn; s ^= s >> 27n;
    const r = (s * 2685821657736338717n) & 0xffffffffffffffffn;
    out.push(3 + Number(r % BigInt(nVocab - 3)));
  }
  return out;
}
