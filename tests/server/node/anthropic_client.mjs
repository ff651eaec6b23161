// The official Anthropic TypeScript SDK (`@anthropic-ai/sdk`) against `moestream serve`
// (pycoder-moe) on the Messages API: a message, the same message streamed (its events and the
// SDK's final message), a conversation holding a tool_use block and its tool_result, a stop
// sequence, a forced tool, count_tokens, the key in x-api-key, and errors as the SDK's typed
// errors.
//   node anthropic_client.mjs MOESTREAM_BINARY MODEL_DIR
// Exits 77 (ctest: skipped) when the model or the installed client is missing.
import { strict as assert } from 'node:assert';
import { testSetup, withServer } from './serve.mjs';

const { binary, modelDir } = testSetup('@anthropic-ai/sdk');
const { default: Anthropic } = await import('@anthropic-ai/sdk');

const tools = [{
  name: 'read_file',
  description: 'Read a text file',
  input_schema: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] },
}];

await withServer(binary, modelDir, 'node-test-key', async (port) => {
  // The SDK sends the key as x-api-key.
  const client = new Anthropic({ baseURL: `http://127.0.0.1:${port}`, apiKey: 'node-test-key', maxRetries: 0 });
  const request = {
    model: 'pycoder-moe',
    max_tokens: 8,
    system: 'You write Python.',
    messages: [{ role: 'user', content: 'Add two numbers.' }],
  };

  const msg = await client.messages.create(request);
  const { max_tokens, ...counted } = request;
  assert.equal((await client.messages.countTokens(counted)).input_tokens, msg.usage.input_tokens);
  assert.equal(msg.type, 'message');
  assert.equal(msg.role, 'assistant');
  assert.equal(msg.stop_reason, 'max_tokens');
  assert.equal(msg.usage.output_tokens, 8);
  assert.ok(msg.usage.input_tokens > 5);
  assert.equal(msg.content[0].type, 'text');
  console.log('message:', JSON.stringify(msg.content[0].text));

  // Streamed: the SDK's helper assembles the same text from the events.
  const events = [];
  const stream = client.messages.stream(request);
  stream.on('streamEvent', (e) => events.push(e.type));
  const final = await stream.finalMessage();
  assert.equal(final.content[0].text, msg.content[0].text);
  assert.equal(final.stop_reason, 'max_tokens');
  assert.equal(final.usage.output_tokens, 8);
  assert.equal(events[0], 'message_start');
  assert.equal(events.at(-1), 'message_stop');
  assert.ok(events.includes('content_block_start') && events.includes('content_block_delta'));
  assert.ok(events.indexOf('content_block_stop') < events.indexOf('message_delta'));
  console.log(`streamed: ${events.length} events`);

  // A conversation holding a tool_use and its tool_result; tools go through the template.
  const withTools = await client.messages.create({
    model: 'pycoder-moe',
    max_tokens: 8,
    tools,
    messages: [
      { role: 'user', content: 'What does data.txt hold?' },
      { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'read_file', input: { path: 'data.txt' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: '3\n1\n2' }] },
    ],
  });
  assert.ok(['end_turn', 'max_tokens', 'tool_use'].includes(withTools.stop_reason));
  assert.ok(withTools.usage.input_tokens > 60, 'the tool schema is in the prompt');
  for (const b of withTools.content) if (b.type === 'tool_use') assert.equal(typeof b.input, 'object');
  console.log('tools:', JSON.stringify(withTools.content));

  // A stop sequence that the greedy text holds ends it there, and is named.
  const word = msg.content[0].text.trim().split(/\s+/)[0];
  if (word) {
    const stopped = await client.messages.create({ ...request, stop_sequences: [word] });
    assert.equal(stopped.stop_reason, 'stop_sequence');
    assert.equal(stopped.stop_sequence, word);
    assert.ok(!stopped.content.some((b) => b.type === 'text' && b.text.includes(word)));
  }

  // Errors as the SDK's typed errors, in Anthropic's shape.
  await assert.rejects(client.messages.create({ model: 'pycoder-moe', messages: request.messages }), (e) => {
    assert.ok(e instanceof Anthropic.BadRequestError, String(e));
    assert.equal(e.error.type, 'error');
    assert.equal(e.error.error.type, 'invalid_request_error');
    assert.match(e.error.error.message, /max_tokens/);
    return true;
  });
  // A forced tool: the answer is one tool_use block of that tool, its input an object.
  const forced = await client.messages.create({ ...request, max_tokens: 96, tools, tool_choice: { type: 'tool', name: 'read_file' } });
  assert.equal(forced.stop_reason, 'tool_use');
  assert.equal(forced.content.length, 1);
  assert.equal(forced.content[0].type, 'tool_use');
  assert.equal(forced.content[0].name, 'read_file');
  assert.equal(typeof forced.content[0].input, 'object');
  await assert.rejects(client.messages.create({ ...request, tool_choice: { type: 'any' } }), Anthropic.BadRequestError);
  const wrongKey = new Anthropic({ baseURL: `http://127.0.0.1:${port}`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrongKey.messages.create(request), Anthropic.AuthenticationError);
  console.log('errors: ok');
});
