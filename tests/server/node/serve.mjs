// What the client tests share: their arguments, the checks that skip them (exit 77) and
// `moestream serve` started on a free port.
import { spawn } from 'node:child_process';
import { strict as assert } from 'node:assert';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const SKIP = 77;
const here = dirname(fileURLToPath(import.meta.url));

// The binary and the model of `node SCRIPT MOESTREAM_BINARY MODEL_DIR` ($MOESTREAM_SHARED's
// pycoder-moe where set); exits 77 where the model or the npm package `pkg` is missing.
export function testSetup(pkg) {
  const [binary, modelArg] = process.argv.slice(2);
  const modelDir = process.env.MOESTREAM_SHARED ? join(process.env.MOESTREAM_SHARED, 'models/pycoder-moe') : modelArg;
  if (!existsSync(modelDir)) {
    console.log(`SKIP: ${modelDir} not found (set MOESTREAM_SHARED to the shared/ folder)`);
    process.exit(SKIP);
  }
  if (!existsSync(join(here, 'node_modules', pkg))) {
    console.log(`SKIP: ${pkg} is not installed: run scripts/setup.sh (npm ci in ${here})`);
    process.exit(SKIP);
  }
  return { binary, modelDir };
}

// Starts the server on a free port (with `extra` arguments); resolves with the process, its port
// and a promise of its exit.
export function startServer(binary, modelDir, apiKey, extra = []) {
  const child = spawn(binary, ['serve', '--model', modelDir, '--port', '0', '--api-key', apiKey, ...extra], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  return new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error('the server did not start within 60 s')), 60000);
    child.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/serving .* on http:\/\/[^:]+:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve({ child, port: Number(m[1]), exited });
      }
    });
    child.on('exit', (code) => reject(new Error(`the server exited with ${code} before serving`)));
  });
}

// Runs test(port) against a server started with `apiKey`, then stops it with SIGTERM, which it
// must survive to exit 0; prints PASS, or FAIL and exits 1.
export async function withServer(binary, modelDir, apiKey, test, extra = []) {
  try {
    const { child, port, exited } = await startServer(binary, modelDir, apiKey, extra);
    try {
      await test(port);
    } finally {
      child.kill('SIGTERM');
    }
    const { code, signal } = await exited;
    assert.equal(signal, null, `the server died of ${signal}`);
    assert.equal(code, 0, 'the server exits 0 on SIGTERM');
    console.log('PASS');
  } catch (e) {
    console.error('FAIL:', e);
    process.exit(1);
  }
}
