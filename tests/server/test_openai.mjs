// SPDX-License-Identifier: MIT
// test_openai.mjs - the official OpenAI client library for Node (`openai` on npm, pinned by
// package-lock.json) drives the real `pagoda serve`: a completion, a chat completion and a
// streamed chat completion with usage (stream_options.include_usage), with an API key.
// Skips (77) when tests/server/node_modules is missing: run `npm ci` in tests/server
// (scripts/setup.sh does).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import { requireSetup, startServer } from './common.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
if (!existsSync(path.join(here, 'node_modules', 'openai'))) {
  console.error('skipped: tests/server/node_modules/openai is missing (run `npm ci` in tests/server)');
  process.exit(77);
}
const model = requireSetup();
const { default: OpenAI } = await import('openai');

let srv, client, modelId;

before(async () => {
  srv = await startServer(model.path, ['--ctx', '512', '--api-key', 'test-key']);
  client = new OpenAI({ apiKey: 'test-key', baseURL: srv.url + '/v1', maxRetries: 0 });
  const list = await client.models.list();
  modelId = list.data[0].id;
});
after(async () => { if (srv) await srv.stop(); });

test('completions.create', async () => {
  const r = await client.completions.create({
    model: modelId, prompt: 'Once upon a time', max_tokens: 20, temperature: 0,
  });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices.length, 1);
  assert.equal(typeof r.choices[0].text, 'string');
  assert.ok(r.choices[0].text.length > 0);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 20);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 20);
  assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
  if (model.stories) assert.ok(r.choices[0].text.startsWith(', there was a little girl'));
});

test('chat.completions.create', async () => {
  const r = await client.chat.completions.create({
    model: modelId, temperature: 0, max_completion_tokens: 16,
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello!' }],
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
});

test('chat.completions.create, streamed with usage', async () => {
  const params = {
    model: modelId, temperature: 0, max_completion_tokens: 16,
    messages: [{ role: 'user', content: 'Tell me a story.' }],
  };
  const whole = await client.chat.completions.create(params);
  const s = await client.chat.completions.create({
    ...params, stream: true, stream_options: { include_usage: true },
  });
  let text = '', usage = null, finish = null, first = true;
  for await (const chunk of s) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (first) {
      assert.equal(chunk.choices[0].delta.role, 'assistant');
      first = false;
    }
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.content) text += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.ok(usage);
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
  assert.equal(usage.prompt_tokens, whole.usage.prompt_tokens);
  // The second identical prompt found the first one's pages (when it spans a full page).
  assert.equal(usage.prompt_tokens_details.cached_tokens,
    Math.floor((usage.prompt_tokens - 1) / 16) * 16);
});

test('errors surface as the client library\'s typed errors', async () => {
  await assert.rejects(client.completions.create({ model: 'nope', prompt: 'x' }),
    (e) => e.status === 404 && e.code === 'model_not_found');
  await assert.rejects(client.completions.create({ model: modelId, prompt: 'x', n: 2 }),
    (e) => e.status === 400 && e.param === 'n');
  const bad = new OpenAI({ apiKey: 'wrong', baseURL: srv.url + '/v1', maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e.status === 401);
});
