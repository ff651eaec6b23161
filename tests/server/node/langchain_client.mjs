// LangChain JS (`@langchain/openai`'s ChatOpenAI) against `moestream serve` (pycoder-moe): invoke,
// stream (the same text), and withStructuredOutput with a zod schema both ways LangChain asks for
// it (response_format json_schema, and a forced call of a strict function).
//   node langchain_client.mjs MOESTREAM_BINARY MODEL_DIR
// Exits 77 (ctest: skipped) when the model or the installed client is missing.
import { strict as assert } from 'node:assert';
import { testSetup, withServer } from './serve.mjs';

const { binary, modelDir } = testSetup('@langchain/openai');
const { ChatOpenAI } = await import('@langchain/openai');
const { z } = await import('zod');

await withServer(binary, modelDir, 'node-test-key', async (port) => {
  const client = (maxTokens) => new ChatOpenAI({
    model: 'pycoder-moe', apiKey: 'node-test-key', maxRetries: 0, temperature: 0, maxTokens,
    configuration: { baseURL: `http://127.0.0.1:${port}/v1` },
  });
  const messages = [['system', 'You write Python.'], ['human', 'Add two numbers.']];
  const whole = await client(8).invoke(messages);
  assert.equal(typeof whole.content, 'string');
  let text = '';
  for await (const chunk of await client(8).stream(messages)) text += chunk.content;
  assert.equal(text, whole.content);
  console.log('text:', JSON.stringify(text));

  const Point = z.object({ x: z.number(), y: z.number(), label: z.string(), kind: z.enum(['a', 'b']) });
  for (const method of ['jsonSchema', 'functionCalling']) {
    const structured = client(300).withStructuredOutput(Point, { method, name: 'point', strict: true });
    const point = await structured.invoke('A point as JSON.');
    Point.parse(point);
    console.log(`withStructuredOutput (${method}):`, JSON.stringify(point));
  }
});
