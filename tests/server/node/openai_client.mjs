// The official `openai` npm client against `moestream serve` (pycoder-moe): a chat, a streamed
// chat, JSON mode, the Responses API, a conversation with tools holding an assistant tool call and the
// tool's result, a text completion, the client's timeout and abort, errors, chunked and gzip
// bodies through Node's fetch, then SIGTERM and exit status 0.
//   node openai_client.mjs MOESTREAM_BINARY MODEL_DIR
// Exits 77 (ctest: skipped) when the model or the installed client is missing.
import { strict as assert } from 'node:assert';
import { testSetup, withServer } from './serve.mjs';

const { binary, modelDir } = testSetup('openai');
const { default: OpenAI } = await import('openai');

const tools = [{
  type: 'function',
  function: {
    name: 'read_file',
    description: 'Read a text file',
    parameters: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] },
  },
}];

await withServer(binary, modelDir, 'node-test-key', async (port) => {
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'node-test-key', maxRetries: 0 });

  const models = await client.models.list();
  const model = models.data[0].id;
  assert.equal(model, 'pycoder-moe');
  assert.deepEqual(await client.models.retrieve(model), models.data[0]);
  await assert.rejects(client.models.retrieve('gpt-4o'), OpenAI.NotFoundError);

  // A chat.
  const chat = await client.chat.completions.create({
    model,
    messages: [{ role: 'system', content: 'You write Python.' }, { role: 'user', content: 'Add two numbers.' }],
    max_tokens: 8,
  });
  assert.equal(chat.object, 'chat.completion');
  assert.equal(chat.choices[0].message.role, 'assistant');
  assert.equal(typeof chat.choices[0].message.content, 'string');
  assert.equal(chat.choices[0].finish_reason, 'length');
  assert.equal(chat.usage.completion_tokens, 8);
  console.log('chat:', JSON.stringify(chat.choices[0].message.content));

  // The same chat streamed, with usage in the last chunk: the same greedy text.
  const stream = await client.chat.completions.create({
    model,
    messages: [{ role: 'system', content: 'You write Python.' }, { role: 'user', content: 'Add two numbers.' }],
    max_tokens: 8,
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = '', finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (!c) continue;
    text += c.delta.content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(text, chat.choices[0].message.content);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 8);
  console.log(`streamed chat: ${chunks} chunks`);

  // JSON mode: the answer is one JSON object (decoding constrained to one), whole and streamed.
  const jsonRequest = {
    model, max_tokens: 96, response_format: { type: 'json_object' },
    messages: [{ role: 'user', content: 'Give me a JSON object describing a point.' }],
  };
  const jsonChat = await client.chat.completions.create(jsonRequest);
  assert.equal(jsonChat.choices[0].finish_reason, 'stop');
  assert.equal(typeof JSON.parse(jsonChat.choices[0].message.content), 'object');
  let jsonText = '';
  for await (const chunk of await client.chat.completions.create({ ...jsonRequest, stream: true }))
    jsonText += chunk.choices[0]?.delta.content ?? '';
  assert.equal(jsonText, jsonChat.choices[0].message.content);
  console.log('json mode:', JSON.stringify(jsonChat.choices[0].message.content));

  // Structured output: a json_schema answer parses and validates (checked with zod), whole and
  // streamed; a keyword the engine cannot hold to is a 400 naming it.
  const point = {
    type: 'object', additionalProperties: false, required: ['x', 'y', 'label', 'kind'],
    properties: { x: { type: 'number' }, y: { type: 'number' }, label: { type: 'string' }, kind: { enum: ['a', 'b'] } },
  };
  const { z } = await import('zod');
  const Point = z.object({ x: z.number(), y: z.number(), label: z.string(), kind: z.enum(['a', 'b']) }).strict();
  const schemaRequest = {
    model, max_tokens: 300, messages: [{ role: 'user', content: 'A point as JSON.' }],
    response_format: { type: 'json_schema', json_schema: { name: 'point', strict: true, schema: point } },
  };
  const structured = await client.chat.completions.create(schemaRequest);
  assert.equal(structured.choices[0].finish_reason, 'stop', structured.choices[0].message.content);
  Point.parse(JSON.parse(structured.choices[0].message.content));
  let structuredText = '';
  for await (const chunk of await client.chat.completions.create({ ...schemaRequest, stream: true }))
    structuredText += chunk.choices[0]?.delta.content ?? '';
  assert.equal(structuredText, structured.choices[0].message.content);
  await assert.rejects(client.chat.completions.create({
    ...schemaRequest,
    response_format: { type: 'json_schema', json_schema: { name: 'p', schema: { ...point, properties: { ...point.properties, label: { type: 'string', pattern: 'a+' } } } } },
  }), (e) => e instanceof OpenAI.BadRequestError && e.param === 'response_format.json_schema.schema.properties.label.pattern');
  console.log('json_schema:', structured.choices[0].message.content);

  // The Responses API: the same prompt as instructions and input, the same greedy text; streamed
  // (its events, the SDK's assembled response); a conversation holding a function call and its
  // output.
  const respRequest = { model, instructions: 'You write Python.', input: 'Add two numbers.', max_output_tokens: 8 };
  const resp = await client.responses.create(respRequest);
  assert.equal(resp.object, 'response');
  assert.equal(resp.status, 'incomplete');
  assert.equal(resp.incomplete_details.reason, 'max_output_tokens');
  assert.equal(resp.output_text, chat.choices[0].message.content);
  assert.equal(resp.usage.output_tokens, 8);
  const respStream = client.responses.stream(respRequest);
  const types = [];
  let streamedText = '';
  for await (const e of respStream) {
    types.push(e.type);
    if (e.type === 'response.output_text.delta') streamedText += e.delta;
  }
  assert.equal(streamedText, resp.output_text);
  assert.equal(types[0], 'response.created');
  assert.equal(types.at(-1), 'response.incomplete');
  assert.ok(types.indexOf('response.output_item.added') < types.indexOf('response.output_text.delta'));
  assert.ok(types.includes('response.output_text.done') && types.includes('response.output_item.done'));
  const respTools = await client.responses.create({
    model,
    max_output_tokens: 8,
    tools: [{ type: 'function', ...tools[0].function }],
    input: [
      { role: 'user', content: 'What does data.txt hold?' },
      { type: 'function_call', call_id: 'call_1', name: 'read_file', arguments: '{"path": "data.txt"}' },
      { type: 'function_call_output', call_id: 'call_1', output: '3\n1\n2' },
    ],
  });
  assert.ok(respTools.usage.input_tokens > 60, 'the tool schema is in the prompt');
  for (const item of respTools.output) if (item.type === 'function_call') JSON.parse(item.arguments);
  // previous_response_id: the stored conversation goes on (its earlier turns in the prompt); an
  // unknown id or one stored with store: false is a 400.
  const next = await client.responses.create({ model, previous_response_id: resp.id, input: 'Now subtract them.', max_output_tokens: 8 });
  assert.equal(next.previous_response_id, resp.id);
  assert.ok(next.usage.input_tokens > resp.usage.input_tokens + resp.usage.output_tokens, 'the earlier turns are in the prompt');
  await assert.rejects(client.responses.create({ ...respRequest, previous_response_id: 'resp_1' }), OpenAI.BadRequestError);
  const unstored = await client.responses.create({ ...respRequest, store: false });
  await assert.rejects(client.responses.create({ model, previous_response_id: unstored.id, input: 'x' }), OpenAI.BadRequestError);
  console.log(`responses: ${types.length} events`);

  // Tools, and a conversation already holding an assistant tool call and the tool's result.
  const messages = [
    { role: 'user', content: 'What does data.txt hold?' },
    {
      role: 'assistant',
      content: null,
      tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'read_file', arguments: '{"path": "data.txt"}' } }],
    },
    { role: 'tool', tool_call_id: 'call_1', content: '3\n1\n2' },
  ];
  const withTools = await client.chat.completions.create({ model, messages, tools, max_tokens: 8 });
  const msg = withTools.choices[0].message;
  assert.equal(msg.role, 'assistant');
  assert.ok(typeof msg.content === 'string' || msg.tool_calls?.length > 0);
  for (const call of msg.tool_calls ?? []) JSON.parse(call.function.arguments);
  assert.ok(['stop', 'length', 'tool_calls'].includes(withTools.choices[0].finish_reason));
  assert.ok(withTools.usage.prompt_tokens > 60, 'the tool schema is in the prompt');
  const toolStream = await client.chat.completions.create({ model, messages, tools, max_tokens: 8, stream: true });
  for await (const chunk of toolStream) {
    for (const call of chunk.choices[0]?.delta.tool_calls ?? []) JSON.parse(call.function.arguments);
  }
  console.log('tools:', JSON.stringify(msg));

  // tool_choice "required" and a named function: one call of a tool (that one), finish_reason
  // tool_calls, its arguments a JSON object; a strict tool's arguments validate against its
  // parameters.
  const strictTools = [{ type: 'function', function: { ...tools[0].function, strict: true,
    parameters: { ...tools[0].function.parameters, additionalProperties: false } } }];
  for (const [tool_choice, toolList] of [['required', tools], [{ type: 'function', function: { name: 'read_file' } }, tools],
    [{ type: 'function', function: { name: 'read_file' } }, strictTools]]) {
    const forced = await client.chat.completions.create({
      model, tools: toolList, tool_choice, max_tokens: 96, messages: [{ role: 'user', content: 'What does data.txt hold?' }],
    });
    assert.equal(forced.choices[0].finish_reason, 'tool_calls', JSON.stringify(forced.choices[0]));
    const calls = forced.choices[0].message.tool_calls;
    assert.equal(calls.length, 1);
    assert.equal(calls[0].function.name, 'read_file');
    const args = JSON.parse(calls[0].function.arguments);
    assert.equal(typeof args, 'object');
    if (toolList === strictTools) {
      assert.deepEqual(Object.keys(args), ['path'], calls[0].function.arguments);
      assert.equal(typeof args.path, 'string');
      console.log('strict tool call:', calls[0].function.arguments);
    }
  }
  // tool_choice "auto" with a strict tool: the answer is free, and any call it makes is held to
  // the tool's parameters; a strict tool's schema is checked even where nothing is forced.
  const free = await client.chat.completions.create({
    model, tools: strictTools, max_tokens: 48, messages: [{ role: 'user', content: 'What does data.txt hold?' }],
  });
  for (const call of free.choices[0].message.tool_calls ?? [])
    assert.deepEqual(Object.keys(JSON.parse(call.function.arguments)), ['path'], call.function.arguments);
  await assert.rejects(client.chat.completions.create({
    model, max_tokens: 4, messages: [{ role: 'user', content: 'hi' }],
    tools: [{ type: 'function', function: { ...strictTools[0].function,
      parameters: { ...strictTools[0].function.parameters, properties: { path: { type: 'string', pattern: 'a+' } } } } }],
  }), (e) => e instanceof OpenAI.BadRequestError && e.param === 'tools[0].function.parameters.properties.path.pattern');

  // A text completion.
  const completion = await client.completions.create({ model, prompt: 'def add(a, b):', max_tokens: 4 });
  assert.equal(completion.object, 'text_completion');
  assert.equal(typeof completion.choices[0].text, 'string');

  // A whole answer's head waits for the answer, so the client's own timeout and abort fire as
  // documented (a space sent at once would have stopped its timer), and the server goes on.
  // Both fire after 1.5 s, past the 1 s at which a heartbeat would have sent the head.
  const endless = { model, prompt: 'def fib(n):', max_tokens: 100000, ignore_eos: true };
  const within = (p, ms) => Promise.race([p, new Promise((_, reject) => setTimeout(
    () => reject(new Error(`neither an answer nor an error within ${ms} ms`)), ms))]);
  await assert.rejects(within(client.completions.create(endless, { timeout: 1500 }), 8000),
    OpenAI.APIConnectionTimeoutError);
  const abort = new AbortController();
  setTimeout(() => abort.abort(), 1500);
  await assert.rejects(within(client.completions.create(endless, { signal: abort.signal }), 8000),
    OpenAI.APIUserAbortError);
  console.log('timeout and abort: ok');

  // Errors arrive as the client's typed errors.
  await assert.rejects(client.chat.completions.create({ model, messages: [] }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.status, 400);
    assert.equal(e.param, 'messages');
    return true;
  });
  const wrongKey = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrongKey.models.list(), OpenAI.AuthenticationError);

  // Node's own HTTP client: a chunked body (a stream of unknown length) is served, a gzip body
  // is refused by name, and a chunked body over --max-body-bytes gets 413.
  const url = `http://127.0.0.1:${port}/v1/completions`;
  const headers = { 'Content-Type': 'application/json', Authorization: 'Bearer node-test-key' };
  const chunkedBody = (parts) => new ReadableStream({
    start(c) {
      for (const p of parts) c.enqueue(new TextEncoder().encode(p));
      c.close();
    },
  });
  const chunked = await fetch(url, {
    method: 'POST', headers, duplex: 'half',
    body: chunkedBody(['{"prompt": "def add', '(a, b):", "max_', 'tokens": 2}']),
  });
  assert.equal(chunked.status, 200, await chunked.clone().text());
  assert.equal((await chunked.json()).object, 'text_completion');
  const { gzipSync } = await import('node:zlib');
  const gz = await fetch(url, {
    method: 'POST', headers: { ...headers, 'Content-Encoding': 'gzip' },
    body: gzipSync(JSON.stringify({ prompt: 'x'.repeat(1 << 20), max_tokens: 1 })),
  });
  assert.equal(gz.status, 415);
  assert.equal((await gz.json()).error.code, 'unsupported_media_type');
  const huge = await fetch(url, {
    method: 'POST', headers, duplex: 'half',
    body: chunkedBody(Array.from({ length: 8 }, () => ' '.repeat(1 << 20))),
  }).catch((e) => e);
  if (!(huge instanceof Error)) assert.equal(huge.status, 413);  // or the connection closed under the upload
  console.log('chunked and gzip bodies: ok');
});
