// `serve`'s dashboard in a real browser: headless Chromium (Debian's `chromium`, driven by
// puppeteer-core) opens /dashboard on a server that streams pycoder-moe-q4's experts under a
// memory budget while it decodes a long answer. The page loads with no console error, asks for
// the API key (given as the Basic password), draws a heat map of layers x experts cells, shows the
// hit rate /api/stats reports at the same moment, and a screenshot is kept as a test artifact.
//   node dashboard_browser.mjs MOESTREAM_BINARY MODEL_DIR SCREENSHOT_PATH
// Exits 77 (ctest: skipped) when Chromium or puppeteer-core is missing (scripts/setup.sh installs both).
import { strict as assert } from 'node:assert';
import { existsSync, mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { withServer } from './serve.mjs';

const SKIP = 77;
const here = dirname(fileURLToPath(import.meta.url));
const [binary, modelDir, screenshot] = process.argv.slice(2);
const chromium = process.env.CHROMIUM || '/usr/bin/chromium';
for (const [what, path] of [['chromium', chromium], ['puppeteer-core', join(here, 'node_modules', 'puppeteer-core')]]) {
  if (!existsSync(path)) {
    console.log(`SKIP: ${what} not found at ${path}: run scripts/setup.sh`);
    process.exit(SKIP);
  }
}
const { default: puppeteer } = await import('puppeteer-core');
const KEY = 'dashboard-test-key';
// The page's hit rate is its last poll's (at most a second old); over a second of decoding the
// pools' cumulative hit rate moves by far less than this.
const HIT_RATE_TOLERANCE = 0.02;

async function api(port, path) {
  const r = await fetch(`http://127.0.0.1:${port}${path}`, { headers: { Authorization: `Bearer ${KEY}` } });
  assert.equal(r.status, 200, `${path}: ${r.status}`);
  return r.json();
}

await withServer(binary, modelDir, KEY, async (port) => {
  const base = `http://127.0.0.1:${port}`;
  // Without the key the page is refused, and the browser is asked for it.
  const refused = await fetch(`${base}/dashboard`);
  assert.equal(refused.status, 401);
  assert.match(refused.headers.get('www-authenticate'), /^Basic realm="moestream"/);

  // A long answer decodes while the page watches.
  const decoding = new AbortController();
  const answer = fetch(`${base}/v1/completions`, {
    method: 'POST',
    signal: decoding.signal,
    headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'def quicksort(items):', max_tokens: 20000, temperature: 1, ignore_eos: true, stream: true }),
  }).then((r) => r.body.pipeTo(new WritableStream())).catch(() => {});

  // As root (CI) Chromium needs --no-sandbox; a container's small /dev/shm would crash its renderer.
  const browser = await puppeteer.launch({
    executablePath: chromium, headless: true, args: ['--no-sandbox', '--disable-dev-shm-usage', '--disable-gpu'],
  });
  try {
    const page = await browser.newPage();
    const errors = [];
    page.on('console', (m) => { if (m.type() === 'error') errors.push(`console: ${m.text()}`); });
    page.on('pageerror', (e) => errors.push(`page: ${e.message}`));
    page.on('requestfailed', (r) => errors.push(`request: ${r.url()} ${r.failure()?.errorText}`));
    await page.authenticate({ username: 'dashboard', password: KEY });
    await page.setViewport({ width: 1100, height: 1300 });
    const loaded = await page.goto(`${base}/dashboard`, { waitUntil: 'load' });
    assert.equal(loaded.status(), 200);
    // Three polls, the decode seen in the figures.
    await page.waitForFunction(
      () => Number(document.body.dataset.polls || 0) >= 3 && parseFloat(document.getElementById('decode').textContent) > 0,
      { timeout: 60000 });

    const stats = await api(port, '/api/stats');
    const pageHitRate = Number(await page.$eval('#hit-rate', (e) => e.dataset.value));
    const moe = stats.layers.filter((l) => l.moe);
    assert.ok(moe.length > 0);
    const cells = Number(await page.$eval('#heatmap', (c) => c.dataset.cells));
    assert.equal(cells, moe.length * moe[0].routed.length, 'a heat map cell per expert of every MoE layer');
    const statsHitRate = stats.expert_pool.hit_rate;
    assert.ok(statsHitRate > 0 && statsHitRate < 1, `the pools stream under the budget: hit rate ${statsHitRate}`);
    assert.ok(Math.abs(pageHitRate - statsHitRate) <= HIT_RATE_TOLERANCE,
              `the page's hit rate ${pageHitRate} against /api/stats' ${statsHitRate}`);
    // Some experts are in the pool and some on disk: both kinds of cell are drawn.
    const places = new Set((await api(port, '/api/dashboard')).layers.flatMap((l) => [...l.where]));
    assert.ok(places.has('r') && places.has('d'), `places ${[...places]}`);

    mkdirSync(dirname(screenshot), { recursive: true });
    await page.screenshot({ path: screenshot, fullPage: true });
    console.log(`screenshot: ${screenshot}; hit rate page ${pageHitRate.toFixed(4)}, /api/stats ${statsHitRate.toFixed(4)}; ${cells} cells`);
    assert.deepEqual(errors, [], 'the page ran without errors');
  } finally {
    await browser.close();
    decoding.abort();
    await answer;
  }
}, ['--memory', '60M']);
