// GET /dashboard's page (server/dashboard.h): HTML, style and script in one document, drawn on
// canvases by hand so that nothing is fetched from elsewhere. It polls /api/dashboard once a
// second; rates are differences of the counters between polls.
#include "server/dashboard.h"

namespace ms {

std::string_view dashboard_page() {
  static constexpr char kPage[] = R"page(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>moestream dashboard</title>
<link rel="icon" href="data:,">
<style>
  body { font: 13px system-ui, sans-serif; margin: 16px; background: #101418; color: #d8dee4; }
  h1 { font-size: 17px; margin: 0 0 4px; }
  h2 { font-size: 14px; margin: 18px 0 6px; color: #9fb3c8; }
  .row { display: flex; flex-wrap: wrap; gap: 18px; }
  .figure { background: #182028; border-radius: 6px; padding: 8px 12px; min-width: 120px; }
  .figure b { display: block; font-size: 20px; color: #fff; }
  .legend span { display: inline-block; margin-right: 14px; }
  .legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; vertical-align: -1px; }
  canvas { background: #0b0e11; border-radius: 4px; display: block; }
  table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
  td, th { padding: 2px 8px; text-align: right; border-bottom: 1px solid #222b33; }
  th { color: #9fb3c8; font-weight: normal; }
  #status { color: #9fb3c8; }
  #status.error { color: #ff8080; }
</style>
</head>
<body>
<h1>moestream <span id="model"></span></h1>
<div id="status">connecting…</div>
<div class="row" style="margin-top:10px">
  <div class="figure">hit rate (top tier)<b id="hit-rate">–</b></div>
  <div class="figure">decode<b id="decode">–</b></div>
  <div class="figure">prefill<b id="prefill">–</b></div>
  <div class="figure">stall share<b id="stall">–</b></div>
  <div class="figure">queue<b id="queue">–</b></div>
</div>
<h2>Experts: where each is, and how often it was routed lately (a row per MoE layer)</h2>
<div class="legend" id="legend"></div>
<canvas id="heatmap" width="1024" height="64"></canvas>
<h2>Tiers</h2>
<table id="tiers"></table>
<h2>Over time</h2>
<div class="row">
  <div><div>tokens/s (decode, prefill)</div><canvas id="ts-tok" width="330" height="110"></canvas></div>
  <div><div>stall share</div><canvas id="ts-stall" width="330" height="110"></canvas></div>
  <div><div>GB/s (disk, PCIe)</div><canvas id="ts-io" width="330" height="110"></canvas></div>
  <div><div>queue length</div><canvas id="ts-queue" width="330" height="110"></canvas></div>
</div>
<h2>Memory plan</h2>
<div id="plans"></div>
<h2>Layers</h2>
<canvas id="layer-hits" width="1024" height="90"></canvas>
<table id="layers"></table>
<script>
'use strict';
const TIERS = { v: ['VRAM', 210], h: ['host RAM', 200], r: ['RAM pool', 130], m: ['in memory', 170], d: ['disk', 0] };
const HISTORY = 120;
const series = { decode: [], prefill: [], stall: [], disk: [], pcie: [], queue: [] };
let prev = null, recent = [];

const $ = (id) => document.getElementById(id);
const pct = (x) => (100 * x).toFixed(1) + ' %';
const mib = (b) => (b / 1048576).toFixed(0) + ' MiB';

function cellColour(tier, heat) {
  if (tier === 'd') return `hsl(0, 0%, ${12 + 50 * heat}%)`;
  return `hsl(${TIERS[tier] ? TIERS[tier][1] : 300}, 70%, ${20 + 55 * heat}%)`;
}

function drawHeatmap(layers, nExperts) {
  const c = $('heatmap');
  const rows = layers.length, cell = Math.max(1, Math.floor(1024 / Math.max(1, nExperts)));
  const rowH = Math.max(3, Math.min(12, Math.floor(480 / Math.max(1, rows))));
  c.width = cell * nExperts;
  c.height = rowH * rows;
  const g = c.getContext('2d');
  let max = 1e-9;
  for (const r of recent) for (const v of r) max = Math.max(max, v);
  let cells = 0;
  layers.forEach((l, i) => {
    for (let e = 0; e < nExperts; ++e) {
      g.fillStyle = cellColour(l.where[e] || 'd', Math.sqrt((recent[i] ? recent[i][e] : 0) / max));
      g.fillRect(e * cell, i * rowH, cell, rowH - (rowH > 4 ? 1 : 0));
      ++cells;
    }
  });
  c.dataset.cells = String(cells);
  c.dataset.rows = String(rows);
  c.dataset.experts = String(nExperts);
}

function drawSeries(id, lines, colours, fixedMax) {
  const c = $(id), g = c.getContext('2d');
  g.clearRect(0, 0, c.width, c.height);
  let max = fixedMax || 1e-9;
  if (!fixedMax) for (const s of lines) for (const v of s) max = Math.max(max, v);
  g.fillStyle = '#6b7a89';
  g.fillText(max.toPrecision(3), 4, 11);
  lines.forEach((s, k) => {
    g.strokeStyle = colours[k];
    g.beginPath();
    s.forEach((v, i) => {
      const x = (i / (HISTORY - 1)) * c.width, y = c.height - (v / max) * (c.height - 14);
      i ? g.lineTo(x, y) : g.moveTo(x, y);
    });
    g.stroke();
  });
}

function push(name, v) {
  series[name].push(Number.isFinite(v) ? v : 0);
  if (series[name].length > HISTORY) series[name].shift();
}

function table(id, head, rows) {
  const t = $(id);
  t.innerHTML = '';
  const tr = t.insertRow();
  for (const h of head) { const th = document.createElement('th'); th.textContent = h; tr.appendChild(th); }
  for (const r of rows) { const row = t.insertRow(); for (const v of r) row.insertCell().textContent = v; }
}

function drawPlans(plans) {
  const box = $('plans');
  box.innerHTML = '';
  const parts = [['dense', '#5b8def'], ['pool', '#b07be0'], ['staging', '#e0a050'], ['kv', '#50c0a0'],
                 ['activations', '#c0c050'], ['process', '#808890']];
  for (const p of plans) {
    const total = parts.reduce((s, [k]) => s + p[k], 0), scale = Math.max(p.budget, total, 1);
    const div = document.createElement('div');
    div.textContent = `${p.name}: ${mib(total)} planned` + (p.budget ? ` of a ${mib(p.budget)} budget (${p.source})` : ' (no budget)');
    const c = document.createElement('canvas');
    c.width = 1024; c.height = 18;
    const g = c.getContext('2d');
    let x = 0;
    for (const [k, colour] of parts) {
      const w = (p[k] / scale) * c.width;
      g.fillStyle = colour; g.fillRect(x, 0, w, 18);
      if (w > 60) { g.fillStyle = '#000'; g.fillText(`${k} ${mib(p[k])}`, x + 3, 13); }
      x += w;
    }
    if (p.budget) { g.fillStyle = '#fff'; g.fillRect((p.budget / scale) * c.width - 2, 0, 2, 18); }
    div.appendChild(c);
    box.appendChild(div);
  }
}

function update(d) {
  const layers = d.layers;
  while (recent.length < layers.length) recent.push(new Array(d.n_experts).fill(0));
  const dt = prev ? Math.max(1e-3, d.uptime_s - prev.uptime_s) : 0;
  layers.forEach((l, i) => {
    const before = prev && prev.layers[i] ? prev.layers[i].routed : null;
    for (let e = 0; e < d.n_experts; ++e) {
      const delta = before ? l.routed[e] - before[e] : 0;
      recent[i][e] = 0.7 * recent[i][e] + delta;
    }
  });
  $('model').textContent = `on ${d.device}, up ${d.uptime_s.toFixed(0)} s, ${d.requests} requests served`;
  const hr = $('hit-rate');
  hr.textContent = d.tiers.length ? pct(d.hit_rate) : 'all resident';
  hr.dataset.value = String(d.hit_rate);
  if (prev) {
    const steps = (d.tokens.steps - prev.tokens.steps) / dt, prompt = (d.tokens.prompt - prev.tokens.prompt) / dt;
    const top = d.tiers[0], topBefore = prev.tiers[0];
    const stall = top && topBefore ? (d.stall_s - prev.stall_s) / dt : 0;
    const pcieTier = d.tiers.find((t) => t.name === 'vram'), pcieBefore = prev.tiers.find((t) => t.name === 'vram');
    push('decode', steps); push('prefill', prompt); push('stall', Math.min(1, stall));
    push('disk', (d.disk_bytes - prev.disk_bytes) / dt / 1e9);
    push('pcie', pcieTier && pcieBefore ? (pcieTier.bytes - pcieBefore.bytes) / dt / 1e9 : 0);
    push('queue', d.queue.waiting + d.queue.running);
    $('decode').textContent = steps.toFixed(1) + ' tok/s';
    $('prefill').textContent = prompt.toFixed(1) + ' tok/s';
    $('stall').textContent = pct(Math.min(1, stall));
  }
  $('queue').textContent = `${d.queue.running} running, ${d.queue.waiting} waiting`;
  drawHeatmap(layers, d.n_experts);
  table('tiers', ['tier', 'resident / slots', 'hits', 'misses', 'hit rate', 'moved', 'GB/s', 'measured GB/s', 'stall s',
                  'recall', 'waste'],
        d.tiers.map((t) => [t.name, `${t.resident} / ${t.slots}`, t.hits, t.misses,
                            pct(t.hits + t.misses ? t.hits / (t.hits + t.misses) : 0), mib(t.bytes),
                            t.read_s > 0 ? (t.bytes / t.read_s / 1e9).toFixed(2) : '–', t.measured_gb_s ? t.measured_gb_s.toFixed(1) : '–',
                            t.stall_s.toFixed(2), pct(t.recall), pct(t.waste)]));
  table('layers', ['layer', 'resident / slots', 'hits', 'misses', 'hit rate', 'predicted', 'recall', 'waste'],
        layers.map((l) => [l.layer, l.slots !== undefined ? `${l.resident} / ${l.slots}` : 'all', l.hits ?? '–', l.misses ?? '–',
                           l.hits + l.misses ? pct(l.hits / (l.hits + l.misses)) : '–', l.predicted ?? '–',
                           l.recall !== undefined ? pct(l.recall) : '–', l.waste !== undefined ? pct(l.waste) : '–']));
  const lc = $('layer-hits'), g = lc.getContext('2d');
  g.clearRect(0, 0, lc.width, lc.height);
  const w = lc.width / Math.max(1, layers.length);
  layers.forEach((l, i) => {
    const rate = l.hits + l.misses ? l.hits / (l.hits + l.misses) : 0;
    g.fillStyle = '#5b8def';
    g.fillRect(i * w + 1, lc.height - rate * lc.height, Math.max(1, w - 2), rate * lc.height);
  });
  drawSeries('ts-tok', [series.decode, series.prefill], ['#7fd17f', '#e0a050']);
  drawSeries('ts-stall', [series.stall], ['#ff8080'], 1);
  drawSeries('ts-io', [series.disk, series.pcie], ['#c0c0c0', '#b07be0']);
  drawSeries('ts-queue', [series.queue], ['#5b8def']);
  drawPlans(d.plans);
  prev = d;
}

async function poll() {
  const status = $('status');
  try {
    const r = await fetch('/api/dashboard', { credentials: 'same-origin', cache: 'no-store' });
    if (!r.ok) throw new Error(`/api/dashboard answered ${r.status}`);
    update(await r.json());
    status.textContent = `updated ${new Date().toLocaleTimeString()}`;
    status.className = '';
    document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
  } catch (e) {
    status.textContent = String(e.message || e);
    status.className = 'error';
  }
  setTimeout(poll, 1000);
}

$('legend').innerHTML = Object.entries(TIERS).map(([k, [name]]) =>
  `<span><i style="background:${cellColour(k, 0.8)}"></i>${name}</span>`).join('') + '<span>brighter: routed more lately</span>';
poll();
</script>
</body>
</html>
)page";
  return {kPage, sizeof(kPage) - 1};
}

}  // namespace ms
