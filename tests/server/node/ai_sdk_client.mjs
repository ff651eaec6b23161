// Vercel's AI SDK (`ai` with `@ai-sdk/openai-compatible`, tools described with zod) against
// `moestream serve` (pycoder-moe): generateText, streamText (the same text), a forced tool call
// read back as the SDK's typed tool call, and generateObject with a zod schema.
//   node ai_sdk_client.mjs MOESTREAM_BINARY MODEL_DIR
// Exits 77 (ctest: skipped) when the model or the installed client is missing.
import { strict as assert } from 'node:assert';
import { testSetup, withServer } from './serve.mjs';

const { binary, modelDir } = testSetup('ai');
const { generateText, generateObject, streamText, tool } = await import('ai');
const { createOpenAICompatible } = await import('@ai-sdk/openai-compatible');
const { z } = await import('zod');

await withServer(binary, modelDir, 'node-test-key', async (port) => {
  // supportsStructuredOutputs: generateObject sends its zod schema as response_format json_schema.
  const provider = createOpenAICompatible({
    name: 'moestream', baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'node-test-key', supportsStructuredOutputs: true,
  });
  const model = provider.chatModel('pycoder-moe');
  const prompt = { system: 'You write Python.', prompt: 'Add two numbers.', maxOutputTokens: 8, maxRetries: 0 };

  const whole = await generateText({ model, ...prompt });
  assert.equal(typeof whole.text, 'string');
  assert.equal(whole.finishReason, 'length');
  assert.equal(whole.usage.outputTokens, 8);

  const streamed = streamText({ model, ...prompt });
  let text = '';
  for await (const piece of streamed.textStream) text += piece;
  assert.equal(text, whole.text);
  assert.equal(await streamed.finishReason, 'length');
  console.log('text:', JSON.stringify(text));

  // A forced tool call: the SDK reads it back as a typed call of that tool.
  const readFile = tool({ description: 'Read a text file', inputSchema: z.object({}).passthrough() });
  const call = await generateText({
    model, tools: { read_file: readFile }, toolChoice: 'required', maxOutputTokens: 96, maxRetries: 0,
    prompt: 'What does data.txt hold?',
  });
  assert.equal(call.finishReason, 'tool-calls');
  assert.equal(call.toolCalls.length, 1);
  assert.equal(call.toolCalls[0].toolName, 'read_file');
  assert.equal(typeof call.toolCalls[0].input, 'object');
  console.log('tool call:', JSON.stringify(call.toolCalls[0].input));

  // generateObject with a zod schema: decoding is held to the schema, and the SDK validates it.
  const { object } = await generateObject({
    model, maxOutputTokens: 300, maxRetries: 0, prompt: 'A point as JSON.',
    schema: z.object({ x: z.number(), y: z.number(), label: z.string(), kind: z.enum(['a', 'b']) }),
  });
  assert.equal(typeof object.x, 'number');
  assert.ok(['a', 'b'].includes(object.kind));
  console.log('object:', JSON.stringify(object));
});
