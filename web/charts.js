// Hand-written SVG charts of memwall's reports: a stacked bar of what is alive at the peak, the
// peak of each phase of a step, and a roofline. No library: each is a few dozen lines, and the page
// stays one small, offline, dependency-free folder.

const NS = 'http://www.w3.org/2000/svg';

/** Fill colour of each category (a swatch's `data-color` in the tables picks the same). */
export const COLORS = {
  weights: '#4e79a7',
  buffers: '#9c755f',
  gradients: '#f28e2b',
  optimizer_states: '#e15759',
  activations: '#76b7b2',
  activations_and_kv_cache: '#76b7b2',
  logits_and_loss: '#59a14f',
  logits: '#59a14f',
  backward_temporaries: '#edc948',
  optimizer_temporaries: '#b07aa1',
  communication_buffers: '#ff9da7',
  cuda_context: '#bab0ac',
  cublas_workspace: '#d4cfcb',
  allocator_margin: '#e8e4e1',
  non_torch: '#bab0ac',
  cuda_graphs: '#d4cfcb',
  kv_cache: '#59a14f',
};

function s(tag, attrs = {}, ...kids) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v != null) el.setAttribute(k, v);
  for (const kid of kids.flat()) if (kid != null) el.append(kid);
  return el;
}

const text = (x, y, str, attrs = {}) => s('text', { x, y, ...attrs }, str);

/** A round step (1, 2 or 5 × 10^k GiB, or a power-of-two fraction below 1 GiB) near `raw` bytes. */
function niceStep(raw) {
  const g = raw / 2 ** 30;
  if (g < 1) return 2 ** 30 / 2 ** Math.floor(Math.log2(1 / g));
  const e = 10 ** Math.floor(Math.log10(g));
  const m = [1, 2, 5, 10].find((x) => x * e >= g);
  return m * e * 2 ** 30;
}

const gib = (b) => (b >= 2 ** 30 || b === 0
  ? `${(b / 2 ** 30).toFixed(b >= 10 * 2 ** 30 || b === 0 ? 0 : 1)} GiB`
  : `${Math.round(b / 2 ** 20)} MiB`);

function svg(w, hgt, label, ...kids) {
  return s('svg', { viewBox: `0 0 ${w} ${hgt}`, width: '100%', role: 'img', 'aria-label': label, class: 'chart' }, ...kids);
}

/**
 * One horizontal bar of `segments` ({name, bytes}) against `capacity` bytes, with a line at the
 * capacity (`capLabel`) and, when given, one at `limit` (vLLM's requested memory).
 */
export function stackedBar(segments, capacity, capLabel, limit = null) {
  const W = 720; const H = 70; const x0 = 10; const w = W - 20;
  const total = segments.reduce((a, x) => a + x.bytes, 0);
  const max = Math.max(total, capacity, limit || 0) * 1.04;
  const X = (b) => x0 + (b / max) * w;
  const parts = [];
  let at = 0;
  for (const seg of segments) {
    const x = X(at); const width = X(at + seg.bytes) - x;
    parts.push(s('rect', { x, y: 18, width: Math.max(0, width), height: 28, fill: COLORS[seg.name] || '#999', 'data-name': seg.name },
      s('title', {}, `${seg.name}: ${gib(seg.bytes)}`)));
    at += seg.bytes;
  }
  const cap = X(capacity);
  parts.push(s('line', { x1: cap, x2: cap, y1: 8, y2: 56, class: 'capacity' }));
  parts.push(text(Math.min(cap, W - 4), 66, capLabel, { 'text-anchor': cap > W / 2 ? 'end' : 'start', class: 'axis' }));
  if (limit != null) {
    const l = X(limit);
    parts.push(s('line', { x1: l, x2: l, y1: 12, y2: 52, class: 'limit' }));
    parts.push(text(l - 4, 10, 'requested', { 'text-anchor': 'end', class: 'axis' }));
  }
  parts.push(text(x0, 12, `0 … ${gib(max / 1.04)}`, { class: 'axis' }));
  return svg(W, H, 'memory at the peak, by category, against the GPU', ...parts);
}

/**
 * Memory over one step: each phase ({name, bytes}) as a plateau at its peak, in step order, the
 * phase of the peak marked, against `limit` bytes (the GPU less what lives outside the allocator).
 */
export function phaseChart(phases, limit, peakPhase) {
  const W = 720; const H = 240; const left = 64; const right = 16; const top = 20; const bottom = 36;
  const highest = Math.max(...phases.map((p) => p.bytes));
  // the GPU's limit is drawn when it is in reach; far above a small step, it is only named
  const showLimit = limit <= highest * 2.5;
  const tick = niceStep((showLimit ? Math.max(limit, highest) : highest) * 1.1 / 4);
  const max = Math.ceil(((showLimit ? Math.max(limit, highest) : highest) * 1.08) / tick) * tick;
  const Y = (b) => top + (1 - b / max) * (H - top - bottom);
  const step = (W - left - right) / phases.length;
  const parts = [];
  for (let b = 0; b <= max + tick / 2; b += tick) { // grid
    parts.push(s('line', { x1: left, x2: W - right, y1: Y(b), y2: Y(b), class: 'grid' }));
    parts.push(text(left - 6, Y(b) + 4, gib(b), { 'text-anchor': 'end', class: 'axis' }));
  }
  let d = `M ${left} ${Y(0)}`;
  phases.forEach((p, i) => {
    const x = left + i * step;
    d += ` L ${x} ${Y(p.bytes)} L ${x + step} ${Y(p.bytes)}`;
    parts.push(s('rect', {
      x: x + 2, y: Y(p.bytes), width: step - 4, height: Y(0) - Y(p.bytes),
      class: p.name === peakPhase ? 'phase peak' : 'phase', 'data-phase': p.name,
    }, s('title', {}, `${p.name}: ${gib(p.bytes)}`)));
    parts.push(text(x + step / 2, Y(p.bytes) - 6, gib(p.bytes), { 'text-anchor': 'middle', class: 'value' }));
    parts.push(text(x + step / 2, H - bottom + 18, p.name + (p.name === peakPhase ? ' (peak)' : ''), { 'text-anchor': 'middle', class: 'axis' }));
  });
  d += ` L ${W - right} ${Y(0)}`;
  parts.push(s('path', { d, class: 'step-line' }));
  if (showLimit) {
    parts.push(s('line', { x1: left, x2: W - right, y1: Y(limit), y2: Y(limit), class: 'capacity' }));
    parts.push(text(left + 4, Y(limit) - 5, `GPU limit ${gib(limit)}`, { class: 'axis limit-label' }));
  } else {
    parts.push(text(W - right, 12, `GPU limit ${gib(limit)}, far above`, { 'text-anchor': 'end', class: 'axis' }));
  }
  return svg(W, H, 'peak memory of each phase of the step', ...parts);
}

/**
 * Roofline on log-log axes: the roof min(I × bandwidth, peak) and each op at (its FLOP/byte, its
 * FLOP/s), numbered as in the op table. Ops that move no FLOPs or bytes have no point.
 */
export function rooflinePlot(ops, bandwidth, peak) {
  const W = 720; const H = 320; const left = 70; const right = 20; const top = 16; const bottom = 40;
  const pts = ops.map((o, i) => ({ i, x: o.intensity, y: o.flops / o.time_s, bound: o.bound }))
    .filter((p) => p.x > 0 && p.y > 0 && Number.isFinite(p.y));
  const xs = [0.1, ...pts.map((p) => p.x), (peak / bandwidth) * 10];
  const lx0 = Math.floor(Math.log10(Math.min(...xs))); const lx1 = Math.ceil(Math.log10(Math.max(...xs)));
  const ly1 = Math.ceil(Math.log10(peak * 1.5)); const ly0 = Math.min(ly1 - 4, Math.floor(Math.log10(Math.min(...pts.map((p) => p.y), peak))));
  const X = (v) => left + ((Math.log10(v) - lx0) / (lx1 - lx0)) * (W - left - right);
  const Y = (v) => top + (1 - (Math.log10(v) - ly0) / (ly1 - ly0)) * (H - top - bottom);
  const parts = [];
  for (let e = lx0; e <= lx1; e++) {
    parts.push(s('line', { x1: X(10 ** e), x2: X(10 ** e), y1: top, y2: H - bottom, class: 'grid' }));
    parts.push(text(X(10 ** e), H - bottom + 16, `1e${e}`, { 'text-anchor': 'middle', class: 'axis' }));
  }
  for (let e = ly0; e <= ly1; e++) {
    parts.push(s('line', { x1: left, x2: W - right, y1: Y(10 ** e), y2: Y(10 ** e), class: 'grid' }));
    parts.push(text(left - 6, Y(10 ** e) + 4, `1e${e}`, { 'text-anchor': 'end', class: 'axis' }));
  }
  const ridge = peak / bandwidth;
  const a = 10 ** lx0; const b = 10 ** lx1;
  const lowest = 10 ** ly0;
  const start = Math.max(a, lowest / bandwidth);
  parts.push(s('path', { d: `M ${X(start)} ${Y(start * bandwidth)} L ${X(ridge)} ${Y(peak)} L ${X(b)} ${Y(peak)}`, class: 'roof' }));
  parts.push(text(X(ridge), Y(peak) - 6, `ridge ${ridge.toFixed(0)} FLOP/byte`, { 'text-anchor': 'middle', class: 'axis' }));
  // ops at the same spot (a decode step's GEMMs) share one point and one label
  const spots = new Map();
  for (const p of pts) {
    const key = `${Math.round(X(p.x))},${Math.round(Y(p.y))}`;
    if (!spots.has(key)) spots.set(key, { ...p, names: [] });
    spots.get(key).names.push(p.i);
  }
  for (const p of spots.values()) {
    parts.push(s('circle', { cx: X(p.x), cy: Y(p.y), r: 5, class: `op ${p.bound}` },
      s('title', {}, p.names.map((i) => `${i + 1}: ${ops[i].name}`).join('\n'))));
    parts.push(text(X(p.x) + 8, Y(p.y) + 4, p.names.map((i) => i + 1).join(','), { class: 'value' }));
  }
  parts.push(text((left + W - right) / 2, H - 6, 'arithmetic intensity, FLOP/byte', { 'text-anchor': 'middle', class: 'axis' }));
  parts.push(text(14, (top + H - bottom) / 2, 'FLOP/s', { transform: `rotate(-90 14 ${(top + H - bottom) / 2})`, 'text-anchor': 'middle', class: 'axis' }));
  return svg(W, H, 'roofline: each op against the GPU\u2019s bandwidth and compute roof', ...parts);
}

/** A small square of a category's colour, for tables. */
export function swatch(name) {
  return s('svg', { width: 12, height: 12, class: 'swatch', 'aria-hidden': 'true' },
    s('rect', { width: 12, height: 12, rx: 2, fill: COLORS[name] || '#999' }));
}
