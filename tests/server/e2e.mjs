// e2e.mjs: drives a running `hone serve` with the official OpenAI and
// Anthropic SDKs, replays every recorded client request, and checks errors.
//
// env: HONE_URL (http://127.0.0.1:PORT), HONE_API_KEY, HONE_SHARED (the
// shared data folder), HONE_ENGINE = "test" (scripted engine: exact content
// is known) or "real" (a real model: only shapes are checked).
// Prints "ok - NAME" / "FAIL - NAME: why" and ends with "N passed, N failed".
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const URL = process.env.HONE_URL || 'http://127.0.0.1:8080';
const KEY = process.env.HONE_API_KEY || 'test-key';
const SHARED = process.env.HONE_SHARED || '../shared';
const SCRIPTED = (process.env.HONE_ENGINE || 'test') === 'test';
// With a real model, prefilling Claude Code's ~19K-token prompts takes a while:
// the wrapper may bound the replayed bodies (bytes) to keep the suite fast.
const REPLAY_MAX = Number(process.env.HONE_E2E_REPLAY_MAX || Infinity);

const openai = new OpenAI({ baseURL: URL + '/v1', apiKey: KEY, maxRetries: 0, timeout: 120000 });
const anthropic = new Anthropic({ baseURL: URL, apiKey: KEY, maxRetries: 0, timeout: 120000 });

let passed = 0, failed = 0;
function check(cond, name, why) {
  if (cond) { passed++; } else { failed++; console.log(`FAIL - ${name}${why ? ': ' + why : ''}`); }
  return cond;
}
async function test(name, fn) {
  const before = failed;
  try { await fn(); } catch (e) { failed++; console.log(`FAIL - ${name}: threw ${e && e.stack ? e.stack.split('\n').slice(0, 3).join(' | ') : e}`); return; }
  if (failed === before) console.log(`ok - ${name}`);
}

const bashTool = { type: 'function', function: { name: 'bash', description: 'Run a shell command', parameters: { type: 'object', properties: { command: { type: 'string' } }, required: ['command'] } } };
const bashAnth = { name: 'Bash', description: 'Run a shell command', input_schema: { type: 'object', properties: { command: { type: 'string' } }, required: ['command'] } };
const bashResp = { type: 'function', name: 'bash', description: 'Run a shell command', parameters: { type: 'object', properties: { command: { type: 'string' } }, required: ['command'] } };
const toolAsk = (name) => `MOCK:TOOL ${name} {"command": "echo hi"}`;

// ---------- OpenAI chat completions ----------

await test('chat: non-streaming text', async () => {
  const r = await openai.chat.completions.create({ model: 'any-model-name', messages: [{ role: 'user', content: 'Say hello' }], max_tokens: 16 });
  check(r.object === 'chat.completion', 'object');
  check(typeof r.choices[0].message.content === 'string', 'content is a string');
  check(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason), 'finish_reason', r.choices[0].finish_reason);
  check(r.usage.prompt_tokens > 0 && r.usage.total_tokens === r.usage.prompt_tokens + r.usage.completion_tokens, 'usage');
  if (SCRIPTED) check(r.choices[0].message.content === 'Hello from the hone test engine.', 'scripted text', r.choices[0].message.content);
});

await test('chat: streaming with include_usage', async () => {
  const s = await openai.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'MOCK:THINK' }], stream: true, stream_options: { include_usage: true }, max_tokens: 32 });
  let text = '', reasoning = '', usage = null, finish = null, n = 0;
  for await (const c of s) {
    n++;
    if (c.usage) usage = c.usage;
    const ch = c.choices[0];
    if (!ch) continue;
    if (ch.delta.content) text += ch.delta.content;
    if (ch.delta.reasoning_content) reasoning += ch.delta.reasoning_content;
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  check(n >= 3, 'several chunks');
  check(usage && usage.prompt_tokens > 0 && usage.prompt_tokens_details && typeof usage.prompt_tokens_details.cached_tokens === 'number', 'usage chunk with cached_tokens');
  check(finish !== null, 'finish_reason');
  if (SCRIPTED) {
    check(text === 'Here is my answer.', 'content', text);
    check(reasoning.includes('Let me think about this.'), 'reasoning_content', reasoning);
  }
});

await test('chat: tool call round trip', async () => {
  const messages = [{ role: 'user', content: toolAsk('bash') }];
  let call;
  if (SCRIPTED) {
    const r = await openai.chat.completions.create({ model: 'm', messages, tools: [bashTool] });
    const m = r.choices[0].message;
    check(r.choices[0].finish_reason === 'tool_calls', 'finish tool_calls', r.choices[0].finish_reason);
    check(m.tool_calls && m.tool_calls.length === 1 && m.tool_calls[0].function.name === 'bash', 'one bash call');
    call = m.tool_calls[0];
    check(call.id && call.id.startsWith('call_'), 'call id');
    check(JSON.parse(call.function.arguments).command === 'echo hi', 'arguments parse', call.function.arguments);
  } else {
    call = { id: 'call_abc', type: 'function', function: { name: 'bash', arguments: '{"command": "echo hi"}' } };
  }
  messages.push({ role: 'assistant', content: null, tool_calls: [call] });
  messages.push({ role: 'tool', tool_call_id: call.id, content: 'hi' });
  const stream = openai.chat.completions.stream({ model: 'm', messages, tools: [bashTool], max_tokens: 16 });
  const fin = await stream.finalChatCompletion();
  check(typeof fin.choices[0].message.content === 'string' || fin.choices[0].message.tool_calls, 'a reply after the tool result');
  if (SCRIPTED) check(fin.choices[0].message.content === 'Done: the tool ran.', 'reply', fin.choices[0].message.content);
});

if (SCRIPTED) await test('chat: parallel tool calls stream with distinct indices', async () => {
  const stream = openai.chat.completions.stream({ model: 'm', messages: [{ role: 'user', content: 'MOCK:TOOL2 bash {"command": "ls"}' }], tools: [bashTool] });
  const indices = new Set();
  stream.on('chunk', (c) => { for (const t of c.choices[0]?.delta?.tool_calls || []) indices.add(t.index); });
  const fin = await stream.finalChatCompletion();
  const calls = fin.choices[0].message.tool_calls || [];
  check(calls.length === 2, 'two calls', JSON.stringify(calls));
  check(indices.size === 2, 'two indices');
  check(calls.length === 2 && calls[0].id !== calls[1].id, 'distinct ids');
  check(calls.every((c) => JSON.parse(c.function.arguments).command === 'ls'), 'arguments');
});

await test('chat: cached tokens on a repeated prefix', async () => {
  const sys = 'You are a careful assistant. ' + 'Follow the rules. '.repeat(60);
  const ask = (q) => openai.chat.completions.create({ model: 'm', messages: [{ role: 'system', content: sys }, { role: 'user', content: q }], max_tokens: 4 });
  await ask('first question');
  const r = await ask('second question');
  check(r.usage.prompt_tokens_details.cached_tokens > 0, 'cached_tokens > 0', JSON.stringify(r.usage));
  check(r.usage.prompt_tokens_details.cached_tokens < r.usage.prompt_tokens, 'cached < prompt');
});

await test('completions: legacy text completion', async () => {
  const r = await openai.completions.create({ model: 'm', prompt: 'Once upon a time', max_tokens: 8 });
  check(r.object === 'text_completion' && typeof r.choices[0].text === 'string', 'shape');
  const s = await openai.completions.create({ model: 'm', prompt: 'Once upon a time', max_tokens: 8, stream: true });
  let n = 0;
  for await (const c of s) if (c.choices[0]) n++;
  check(n >= 1, 'stream chunks');
});

await test('models: list', async () => {
  const list = await openai.models.list();
  check(list.data.length === 1 && typeof list.data[0].id === 'string', 'one model');
});

// ---------- Anthropic messages ----------

await test('anthropic: non-streaming text', async () => {
  const r = await anthropic.messages.create({ model: 'claude-local', max_tokens: 16, messages: [{ role: 'user', content: 'Say hello' }] });
  check(r.type === 'message' && r.role === 'assistant', 'shape');
  check(Array.isArray(r.content), 'content array');
  check(['end_turn', 'max_tokens', 'tool_use', 'stop_sequence'].includes(r.stop_reason), 'stop_reason', r.stop_reason);
  check(r.usage.input_tokens + r.usage.cache_read_input_tokens > 0, 'usage');
  if (SCRIPTED) check(r.content[0].type === 'text' && r.content[0].text === 'Hello from the hone test engine.', 'text');
});

await test('anthropic: streaming thinking then text (MessageStream)', async () => {
  const stream = anthropic.messages.stream({ model: 'claude-x', max_tokens: 64, thinking: { type: 'enabled', budget_tokens: 1024 }, messages: [{ role: 'user', content: 'MOCK:THINK' }] });
  const events = [];
  stream.on('streamEvent', (e) => events.push(e.type));
  const m = await stream.finalMessage();
  check(events[0] === 'message_start' && events[events.length - 1] === 'message_stop', 'starts and ends', events.join(','));
  check(events.includes('message_delta'), 'message_delta');
  if (SCRIPTED) {
    check(m.content.length === 2 && m.content[0].type === 'thinking' && m.content[1].type === 'text', 'blocks', JSON.stringify(m.content));
    check(m.content[0].thinking.includes('Let me think') && typeof m.content[0].signature === 'string', 'thinking + signature');
    check(m.content[1].text === 'Here is my answer.', 'text');
  }
});

await test('anthropic: tool_use round trip (thinking block replayed with a signature)', async () => {
  const messages = [{ role: 'user', content: toolAsk('Bash') }];
  let tu;
  let assistantContent;
  if (SCRIPTED) {
    const stream = anthropic.messages.stream({ model: 'claude-x', max_tokens: 200, tools: [bashAnth], tool_choice: { type: 'auto' }, messages });
    const m = await stream.finalMessage();
    check(m.stop_reason === 'tool_use', 'stop_reason tool_use', m.stop_reason);
    tu = m.content.find((b) => b.type === 'tool_use');
    check(tu && tu.name === 'Bash' && tu.input.command === 'echo hi' && tu.id.startsWith('toolu_'), 'tool_use block', JSON.stringify(m.content));
    assistantContent = [{ type: 'thinking', thinking: 'I should run it.', signature: 'any-signature-at-all' }, ...m.content];
  } else {
    tu = { type: 'tool_use', id: 'toolu_01', name: 'Bash', input: { command: 'echo hi' } };
    assistantContent = [{ type: 'thinking', thinking: 'I should run it.', signature: 'sig' }, tu];
  }
  messages.push({ role: 'assistant', content: assistantContent });
  messages.push({ role: 'user', content: [{ type: 'tool_result', tool_use_id: tu.id, content: 'hi' }] });
  const r = await anthropic.messages.create({ model: 'claude-x', max_tokens: 16, tools: [bashAnth], messages });
  check(r.type === 'message', 'reply after the result');
  if (SCRIPTED) check(r.content[0].text === 'Done: the tool ran.', 'reply', JSON.stringify(r.content));
});

if (SCRIPTED) await test('anthropic: parallel tool_use blocks keep distinct indices', async () => {
  const stream = anthropic.messages.stream({ model: 'claude-x', max_tokens: 200, tools: [bashAnth], messages: [{ role: 'user', content: 'MOCK:TOOL2 Bash {"command": "ls"}' }] });
  const m = await stream.finalMessage();
  const uses = m.content.filter((b) => b.type === 'tool_use');
  check(uses.length === 2 && uses[0].id !== uses[1].id && uses.every((u) => u.input.command === 'ls'), 'two tool_use blocks', JSON.stringify(m.content));
});

await test('anthropic: count_tokens', async () => {
  const r = await anthropic.messages.countTokens({ model: 'claude-x', messages: [{ role: 'user', content: 'hello there' }] });
  check(r.input_tokens > 0, 'input_tokens', JSON.stringify(r));
});

await test('anthropic: cache_read_input_tokens on a repeated prefix', async () => {
  const system = 'You are Claude Code. ' + 'Be concise. '.repeat(80);
  await anthropic.messages.create({ model: 'claude-x', max_tokens: 4, system, messages: [{ role: 'user', content: 'one' }] });
  const r = await anthropic.messages.create({ model: 'claude-x', max_tokens: 4, system, messages: [{ role: 'user', content: 'two' }] });
  check(r.usage.cache_read_input_tokens > 0, 'cache_read_input_tokens', JSON.stringify(r.usage));
});

// ---------- Responses ----------

await test('responses: non-streaming', async () => {
  const r = await openai.responses.create({ model: 'local', input: 'Say hello', max_output_tokens: 16 });
  check(r.object === 'response' && ['completed', 'incomplete'].includes(r.status), 'shape', r.status);
  check(typeof r.output_text === 'string', 'output_text');
  check(r.usage && r.usage.input_tokens > 0 && r.usage.input_tokens_details, 'usage');
  if (SCRIPTED) check(r.output_text === 'Hello from the hone test engine.', 'text', r.output_text);
});

await test('responses: streaming events through response.completed', async () => {
  const stream = openai.responses.stream({ model: 'local', input: [{ role: 'user', content: 'MOCK:THINK' }], reasoning: { effort: 'medium', summary: 'auto' } });
  const types = [];
  stream.on('event', (e) => types.push(e.type));
  const r = await stream.finalResponse();
  check(types[0] === 'response.created', 'created first', types[0]);
  check(types[types.length - 1] === 'response.completed' || types[types.length - 1] === 'response.incomplete', 'completed last');
  check(types.includes('response.output_item.done'), 'output_item.done');
  check(r.usage && typeof r.usage.input_tokens_details.cached_tokens === 'number', 'usage with cached_tokens');
  if (SCRIPTED) {
    check(r.output.length === 2 && r.output[0].type === 'reasoning' && r.output[1].type === 'message', 'reasoning + message items', JSON.stringify(r.output));
    check(r.output_text === 'Here is my answer.', 'text', r.output_text);
  }
});

await test('responses: function_call round trip', async () => {
  const input = [{ role: 'developer', content: 'You run commands.' }, { role: 'user', content: toolAsk('bash') }];
  let fc;
  if (SCRIPTED) {
    const stream = openai.responses.stream({ model: 'local', input, tools: [bashResp] });
    const r = await stream.finalResponse();
    fc = r.output.find((o) => o.type === 'function_call');
    check(fc && fc.name === 'bash' && fc.call_id.startsWith('call_') && JSON.parse(fc.arguments).command === 'echo hi', 'function_call item', JSON.stringify(r.output));
  } else {
    fc = { type: 'function_call', call_id: 'call_1', name: 'bash', arguments: '{"command":"echo hi"}' };
  }
  input.push({ type: 'function_call', call_id: fc.call_id, name: fc.name, arguments: fc.arguments });
  input.push({ type: 'function_call_output', call_id: fc.call_id, output: 'hi' });
  const r2 = await openai.responses.create({ model: 'local', input, tools: [bashResp], max_output_tokens: 16, store: false });
  check(r2.object === 'response', 'reply');
  if (SCRIPTED) check(r2.output_text === 'Done: the tool ran.', 'text', r2.output_text);
});

// ---------- forced tool calls (constrained decoding) ----------

const health = await (await fetch(URL + '/health')).json();
if (health.constrained_decoding) {
  // With a real model these are the round trips: random weights call a tool only when forced.
  const ask = SCRIPTED ? toolAsk('bash') : 'Run ls';
  await test('forced: chat tool_choice required -> a bash call, then the result goes back', async () => {
    const messages = [{ role: 'user', content: ask }];
    const r = await openai.chat.completions.create({ model: 'm', messages, tools: [bashTool], tool_choice: 'required', max_tokens: 200 });
    const calls = r.choices[0].message.tool_calls || [];
    check(calls.length >= 1 && calls[0].function.name === 'bash', 'a bash call', JSON.stringify(r.choices[0]));
    if (r.choices[0].finish_reason === 'tool_calls') check(typeof JSON.parse(calls[0].function.arguments).command === 'string', 'arguments follow the schema');
    if (!calls.length) return;
    messages.push(r.choices[0].message, { role: 'tool', tool_call_id: calls[0].id, content: 'file.txt' });
    const r2 = await openai.chat.completions.create({ model: 'm', messages, tools: [bashTool], max_tokens: 8 });
    check(r2.object === 'chat.completion', 'reply');
  });
  await test('forced: anthropic tool_choice tool -> tool_use, then tool_result', async () => {
    const messages = [{ role: 'user', content: SCRIPTED ? toolAsk('Bash') : 'Run ls' }];
    const m = await anthropic.messages.stream({ model: 'c', max_tokens: 200, tools: [bashAnth], tool_choice: { type: 'tool', name: 'Bash' }, messages }).finalMessage();
    const tu = m.content.find((b) => b.type === 'tool_use');
    check(tu && tu.name === 'Bash', 'tool_use Bash', JSON.stringify(m.content));
    if (!tu) return;
    messages.push({ role: 'assistant', content: m.content }, { role: 'user', content: [{ type: 'tool_result', tool_use_id: tu.id, content: 'file.txt' }] });
    const r2 = await anthropic.messages.create({ model: 'c', max_tokens: 8, tools: [bashAnth], messages });
    check(r2.type === 'message', 'reply');
  });
  await test('forced: responses tool_choice required -> function_call, then output', async () => {
    const input = [{ role: 'user', content: SCRIPTED ? toolAsk('bash') : 'Run ls' }];
    const r = await openai.responses.stream({ model: 'l', input, tools: [bashResp], tool_choice: 'required', max_output_tokens: 200 }).finalResponse();
    const fc = r.output.find((o) => o.type === 'function_call');
    check(fc && fc.name === 'bash', 'function_call bash', JSON.stringify(r.output));
    if (!fc) return;
    input.push({ type: 'function_call', call_id: fc.call_id, name: fc.name, arguments: fc.arguments }, { type: 'function_call_output', call_id: fc.call_id, output: 'file.txt' });
    const r2 = await openai.responses.create({ model: 'l', input, tools: [bashResp], max_output_tokens: 8 });
    check(r2.object === 'response', 'reply');
  });
  await test('forced: response_format json_schema', async () => {
    const r = await openai.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: SCRIPTED ? 'MOCK:TOOL x {"title": "t"}' : 'A title?' }], max_tokens: 200,
      response_format: { type: 'json_schema', json_schema: { name: 't', schema: { type: 'object', properties: { title: { type: 'string' } }, required: ['title'], additionalProperties: false } } } });
    if (!SCRIPTED && r.choices[0].finish_reason === 'stop') check(typeof JSON.parse(r.choices[0].message.content).title === 'string', 'JSON of the schema', r.choices[0].message.content);
    check(r.object === 'chat.completion', 'shape');
  });
} else {
  console.log('note: no constrained decoding in this build: forced tool-call tests skipped');
}

// ---------- errors ----------

async function expectError(name, fn, status, extra) {
  await test(name, async () => {
    try {
      await fn();
      check(false, 'should fail');
    } catch (e) {
      check(e.status === status, 'status', `${e.status} ${e.message}`);
      if (extra) extra(e);
    }
  });
}

await expectError('errors: OpenAI missing messages -> 400', () => openai.chat.completions.create({ model: 'm' }), 400);
await expectError('errors: Anthropic bad content -> 400 invalid_request_error',
  () => anthropic.messages.create({ model: 'm', max_tokens: 5, messages: [{ role: 'user', content: 5 }] }), 400,
  (e) => check(e.error && e.error.error && e.error.error.type === 'invalid_request_error', 'anthropic error type', JSON.stringify(e.error)));
await expectError('errors: wrong API key -> 401', () => new OpenAI({ baseURL: URL + '/v1', apiKey: 'wrong', maxRetries: 0 }).models.list(), 401);
const huge = 'lorem ipsum dolor sit amet '.repeat(Number(process.env.HONE_E2E_CTX || 2048));
await expectError('errors: context overflow (OpenAI) -> 400 context_length_exceeded',
  () => openai.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: huge }] }), 400,
  (e) => check(e.code === 'context_length_exceeded', 'code', e.code));
await expectError('errors: context overflow (Anthropic) -> 400 prompt is too long',
  () => anthropic.messages.create({ model: 'm', max_tokens: 5, messages: [{ role: 'user', content: huge }] }), 400,
  (e) => check(/prompt is too long/.test(e.message), 'message', e.message));
await expectError('errors: context overflow (Responses) -> 400 context_length_exceeded',
  () => openai.responses.create({ model: 'm', input: huge }), 400, (e) => check(e.code === 'context_length_exceeded', 'code', e.code));

await test('errors: raw bad inputs keep the server up', async () => {
  const post = (p, body, headers = {}) => fetch(URL + p, { method: 'POST', headers: { 'content-type': 'application/json', authorization: 'Bearer ' + KEY, ...headers }, body });
  check((await post('/v1/chat/completions', '{"messages": [')).status === 400, 'malformed JSON');
  check((await post('/v1/messages', Buffer.from([0x7b, 0x22, 0xff, 0x22, 0x7d]))).status === 400, 'invalid UTF-8');
  check((await post('/v1/responses', '[]')).status === 400, 'not an object');
  check((await post('/v1/messages', 'x'.repeat(40 << 20))).status === 413, 'too large');
  const h = await fetch(URL + '/health');
  check(h.status === 200, 'still up');
});

// ---------- replay of recorded client requests ----------

function sseEvents(text) {
  const out = [];
  for (const frame of text.split('\n\n')) {
    let ev = null, data = null;
    for (const line of frame.split('\n')) {
      if (line.startsWith('event: ')) ev = line.slice(7);
      else if (line.startsWith('data: ')) data = line.slice(6);
    }
    if (data === null) continue;
    if (data === '[DONE]') { out.push({ event: ev, done: true }); continue; }
    let j = null;
    try { j = JSON.parse(data); } catch { out.push({ event: ev, bad: data }); continue; }
    out.push({ event: ev, data: j });
  }
  return out;
}

function checkShape(p, body, status, text, name) {
  if (!check(status === 200, name, `status ${status}: ${text.slice(0, 200)}`)) return;
  const stream = body.stream === true;
  if (p.includes('/count_tokens')) {
    let j = null;
    try { j = JSON.parse(text); } catch {}
    check(j && j.input_tokens > 0, name + ' input_tokens');
    return;
  }
  const api = p.includes('/messages') ? 'anthropic' : p.includes('/responses') ? 'responses' : p.includes('/chat/completions') ? 'chat' : 'other';
  if (!stream) {
    let j = null;
    try { j = JSON.parse(text); } catch {}
    check(j !== null, name + ' json');
    if (api === 'anthropic') check(j && j.type === 'message', name + ' message');
    if (api === 'chat') check(j && j.object === 'chat.completion', name + ' chat.completion');
    if (api === 'responses') check(j && j.object === 'response', name + ' response');
    return;
  }
  const evs = sseEvents(text);
  check(evs.every((e) => !e.bad), name + ' every data line is JSON');
  if (api === 'anthropic') {
    check(evs[0] && evs[0].event === 'message_start', name + ' message_start first');
    check(evs.length && evs[evs.length - 1].event === 'message_stop', name + ' message_stop last');
    let open = -1, next = 0, ok = true;
    for (const e of evs) {
      if (e.event === 'content_block_start') { ok = ok && open === -1 && e.data.index === next; open = e.data.index; next++; }
      if (e.event === 'content_block_delta') ok = ok && e.data.index === open;
      if (e.event === 'content_block_stop') { ok = ok && e.data.index === open; open = -1; }
      if (e.data && e.event && e.data.type !== e.event) ok = false;
    }
    check(ok && open === -1, name + ' block order');
  } else if (api === 'responses') {
    check(evs[0] && evs[0].event === 'response.created', name + ' response.created first');
    const last = evs[evs.length - 1];
    check(last && (last.event === 'response.completed' || last.event === 'response.incomplete'), name + ' completed last', last && last.event);
    check(evs.every((e, i) => e.data.sequence_number === i), name + ' sequence numbers');
  } else {
    check(evs.length && evs[evs.length - 1].done, name + ' [DONE] last');
    const chunks = evs.filter((e) => e.data);
    check(chunks.some((c) => c.data.choices && c.data.choices[0] && c.data.choices[0].finish_reason), name + ' finish_reason');
    if (body.stream_options && body.stream_options.include_usage) check(chunks.some((c) => c.data.usage && c.data.choices.length === 0), name + ' usage chunk');
  }
}

await test('replay: every recorded client request', async () => {
  const dir = path.join(SHARED, 'data/clients');
  const files = fs.readdirSync(dir).filter((f) => f.endsWith('.jsonl')).sort();
  let n = 0, skipped = 0;
  for (const f of files) {
    for (const line of fs.readFileSync(path.join(dir, f), 'utf8').split('\n')) {
      if (!line.trim()) continue;
      const rec = JSON.parse(line);
      const name = `${f}#${rec.seq} ${rec.method} ${rec.raw_path}`;
      const headers = {};
      for (const [k, v] of rec.headers || []) {
        const lk = k.toLowerCase();
        if (['host', 'content-length', 'authorization', 'x-api-key', 'connection', 'accept-encoding', 'transfer-encoding'].includes(lk)) continue;
        headers[k] = v;
      }
      headers.authorization = 'Bearer ' + KEY;
      if (rec.method === 'GET' || rec.method === 'HEAD') {
        const r = await fetch(URL + rec.raw_path, { method: rec.method, headers });
        const text = await r.text();
        check(r.status === 200, name, `status ${r.status} ${text.slice(0, 100)}`);
        n++;
        continue;
      }
      if (rec.path.startsWith('/api/')) continue; // Ollama model management (pull): not served
      const body = typeof rec.body === 'string' ? rec.body : JSON.stringify(rec.body);
      if (body.length > REPLAY_MAX) { skipped++; continue; }
      const r = await fetch(URL + rec.raw_path, { method: 'POST', headers, body });
      const text = await r.text();
      checkShape(rec.raw_path, rec.body || {}, r.status, text, name);
      n++;
    }
  }
  if (skipped) console.log(`note: ${skipped} recorded requests over ${REPLAY_MAX} bytes not replayed on this engine`);
  else check(n >= 90, 'replayed', String(n));
});

const h = await fetch(URL + '/health');
check(h.status === 200, 'server still up at the end');
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
