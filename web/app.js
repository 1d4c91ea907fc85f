// memwall's web page: a form that becomes a `memwall` argument vector, run by the CLI itself
// compiled to WebAssembly (worker.js), and the JSON report drawn as numbers, tables and charts.
// Every number shown carries data-k (its path in the report) and data-v (its value there), so the
// browser tests can hold the page to `memwall … --json`.

import { stackedBar, phaseChart, rooflinePlot, swatch } from './charts.js';

// ---- the CLI, in a worker ---------------------------------------------------------------------

let worker = null;
let nextId = 1;
const waiting = new Map();

function startWorker() {
  worker = new Worker(new URL('worker.js', import.meta.url), { type: 'module' });
  worker.onmessage = (e) => {
    const { id, text } = e.data;
    const done = waiting.get(id);
    waiting.delete(id);
    if (done) done(text);
  };
  worker.onerror = (e) => {
    e.preventDefault();
    for (const done of waiting.values()) {
      done(JSON.stringify({ error: [`error: the WebAssembly module failed: ${e.message}`] }));
    }
    waiting.clear();
    worker.terminate();
    startWorker();
  };
}

/** Runs `memwall ...args` (with `config`, the text of a config.json, as the model when given; or
 * over `files`, dropped model files [{name, size, prefix}]). */
function memwall(args, config = null, files = null) {
  return new Promise((resolve) => {
    const id = nextId++;
    waiting.set(id, (text) => resolve(JSON.parse(text)));
    worker.postMessage({ id, args, config, files });
  });
}

// ---- number formats, as the CLI prints them ---------------------------------------------------

/** `x.toFixed(d)`, rounding exact ties to even as Rust's `{:.d}` does (JS rounds them up). */
export function fixed(x, d) {
  const t = x * 2 ** (d + 1); // a tie ⇔ x = odd / 2^(d+1)
  if (Number.isInteger(t) && Math.abs(t) % 2 === 1) {
    const lo = (Math.abs(t) * 5 ** d - 1) / 2; // the two candidates: lo and lo + 1 (in 10^-d)
    const n = lo % 2 === 0 ? lo : lo + 1;
    return (Math.sign(x) < 0 ? '-' : '') + (n / 10 ** d).toFixed(d);
  }
  return x.toFixed(d);
}

/** `memwall_core::Bytes` Display: binary units, two decimals. */
export function bytes(b) {
  const KIB = 1024;
  if (b >= KIB ** 3) return `${fixed(b / KIB ** 3, 2)} GiB`;
  if (b >= KIB ** 2) return `${fixed(b / KIB ** 2, 2)} MiB`;
  if (b >= KIB) return `${fixed(b / KIB, 2)} KiB`;
  return `${b} B`;
}

const pct = (x) => `${fixed(x * 100, 1)}%`;

// ---- DOM helpers --------------------------------------------------------------------------------

function h(tag, attrs = {}, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === false || v == null) continue;
    if (k === 'on') for (const [ev, f] of Object.entries(v)) el.addEventListener(ev, f);
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const kid of kids.flat()) if (kid != null) el.append(kid);
  return el;
}

/** A number of the report: shown formatted, tagged with its path and exact value. */
function num(path, value, format = String) {
  return h('span', { class: 'num', 'data-k': path, 'data-v': String(value) }, format(value));
}

function table(head, rows, cls = '') {
  return h('table', { class: cls },
    h('thead', {}, h('tr', {}, head.map((c) => h('th', {}, c)))),
    h('tbody', {}, rows.map((r) => h('tr', {}, r.map((c) => h('td', {}, c))))));
}

const section = (title, ...kids) => h('section', { class: 'card' }, h('h2', {}, title), ...kids);

// ---- the form -----------------------------------------------------------------------------------

const MODES = {
  train: 'Train',
  plan: 'Plan a cluster',
  infer: 'Inference',
  serve: 'Serve (vLLM)',
  roofline: 'Roofline',
};

// key = the CLI flag without dashes; def = the CLI's default (left out of the command when equal);
// kind: num | text | select (values from the CLI) | check | multi (comma list from the CLI)
const F = (key, kind, def, label, extra = {}) => ({ key, kind, def, label, ...extra });
const FIELDS = {
  train: [
    F('batch', 'num', '1', 'micro-batch'),
    F('seq', 'num', '2048', 'sequence length'),
    F('grad-accum', 'num', '1', 'grad accumulation'),
    F('precision', 'select', 'bf16', 'precision'),
    F('optimizer', 'select', 'adamw', 'optimizer'),
    F('attention', 'select', 'sdpa', 'attention'),
    F('loss', 'select', 'torch', 'loss kernel'),
    F('checkpointing', 'check', false, 'activation checkpointing'),
    F('checkpointing-policy', 'text', '', 'checkpointing policy (full, every-k:K, selective-attn, selective-op)'),
    F('no-dropout', 'check', false, 'no dropout'),
    F('padding-free', 'check', false, 'padding-free batches'),
    F('loop', 'select', 'trainer', 'training loop'),
    F('use-cache', 'text', '', 'use_cache (true/false; default: the config)'),
    F('lora-rank', 'num', '', 'LoRA rank'),
    F('lora-targets', 'text', '', 'LoRA targets'),
    F('qlora', 'check', false, 'QLoRA (4-bit base)'),
    F('activation-offload', 'check', false, 'activation offloading to host (save_on_cpu)'),
    F('alloc-margin', 'num', '0.05', 'allocator margin'),
    F('gpus', 'num', '1', 'GPUs', { group: 'cluster' }),
    F('gpus-per-node', 'num', '8', 'GPUs per node', { group: 'cluster' }),
    F('strategy', 'select', '', 'strategy', { group: 'cluster' }),
    F('tp', 'num', '1', 'tensor parallel', { group: 'cluster' }),
    F('sequence-parallel', 'check', false, 'sequence parallel', { group: 'cluster' }),
    F('pp', 'num', '1', 'pipeline parallel', { group: 'cluster' }),
    F('schedule', 'select', '1f1b', 'pipeline schedule', { group: 'cluster' }),
    F('virtual-stages', 'num', '1', 'virtual stages', { group: 'cluster' }),
    F('cp', 'num', '1', 'context parallel', { group: 'cluster' }),
    F('ep', 'num', '1', 'expert parallel', { group: 'cluster' }),
    F('offload', 'select', 'none', 'offload', { group: 'cluster' }),
    F('offload-device', 'select', 'cpu', 'offload to', { group: 'cluster' }),
    F('global-batch', 'num', '', 'global batch', { group: 'cluster' }),
  ],
  plan: [
    F('gpus', 'num', '8', 'GPUs'),
    F('gpus-per-node', 'num', '8', 'GPUs per node'),
    F('seq', 'num', '2048', 'sequence length'),
    F('global-batch', 'num', '32', 'global batch'),
    F('precision', 'select', 'amp-bf16', 'precision'),
    F('optimizer', 'select', 'adamw', 'optimizer'),
    F('attention', 'select', 'sdpa', 'attention'),
    F('loss', 'select', 'torch', 'loss kernel'),
    F('loop', 'select', 'trainer', 'training loop'),
    F('allow', 'multi', '', 'the search may also'),
    F('max-step-s', 'num', '', 'max seconds per step'),
    F('top', 'num', '10', 'plans shown'),
    F('alloc-margin', 'num', '0.05', 'allocator margin'),
  ],
  infer: [
    F('batch', 'num', '1', 'sequences'),
    F('prompt', 'num', '2048', 'prompt tokens'),
    F('new-tokens', 'num', '256', 'new tokens'),
    F('weights', 'text', '', 'weights', { list: 'weight-formats', placeholder: 'checkpoint\'s own' }),
    F('kv-dtype', 'select', 'auto', 'KV cache dtype'),
    F('attention', 'select', 'sdpa', 'attention'),
    F('moe-grouped-decode', 'check', false, 'MoE grouped decode'),
    F('alloc-margin', 'num', '0.05', 'allocator margin'),
  ],
  serve: [
    F('tp', 'num', '1', 'tensor parallel'),
    F('gpu-memory-utilization', 'num', '0.92', 'GPU memory utilization'),
    F('kv-cache-dtype', 'select', 'auto', 'KV cache dtype'),
    F('max-model-len', 'num', '', 'max model length', { placeholder: 'the model\'s' }),
    F('max-num-seqs', 'num', '', 'max sequences'),
    F('max-num-batched-tokens', 'num', '', 'max batched tokens'),
    F('block-size', 'num', '16', 'block size'),
    F('quantization', 'text', '', 'quantization', { placeholder: 'checkpoint\'s own' }),
    F('weights', 'text', '', 'weights', { list: 'weight-formats', placeholder: 'checkpoint\'s own' }),
    F('enforce-eager', 'check', false, 'enforce eager'),
    F('request-lengths', 'text', '2048,4096,8192,32768', 'request lengths'),
  ],
  roofline: [
    F('phase', 'select', 'train', 'phase'),
    F('batch', 'num', '1', 'sequences'),
    F('seq', 'num', '2048', 'sequence / context length'),
    F('dtype', 'select', 'bf16', 'GEMM dtype'),
    F('tp', 'num', '1', 'tensor parallel'),
    F('flops-efficiency', 'num', '1', 'FLOP/s efficiency'),
    F('bandwidth-efficiency', 'num', '1', 'bandwidth efficiency'),
  ],
};

const WEIGHT_FORMATS = ['bf16', 'fp16', 'fp32', 'fp8', 'int8', 'nf4', 'nf4-dq', 'fp4', 'fp4-dq',
  'gptq-int4-g128', 'awq-int4-g128', 'gguf-q4_k_m', 'gguf-q5_k_m', 'gguf-q8_0', 'gguf-q6_k', 'gguf-q4_0'];

const DEFAULT_MODEL = 'llama-3.1-8b';
const DEFAULT_GPU = 'h100-sxm';

const $ = (id) => document.getElementById(id);
const fieldId = (mode, key) => `f-${mode}-${key}`;
let mode = 'train';
let gpus = [];

/** The accepted values of a flag, as the CLI's own error lists them. */
async function choices(cmd, flag) {
  const r = await memwall([cmd, `--${flag}`, '\u0000']);
  const text = (r.error || []).join('\n');
  const m = text.match(/\[possible values: ([^\]]*)\]/);
  return m ? m[1].split(', ') : [];
}

async function buildForm() {
  const nav = $('modes');
  for (const [m, label] of Object.entries(MODES)) {
    nav.append(h('button', {
      type: 'button', role: 'tab', 'data-mode': m, id: `mode-${m}`,
      on: { click: () => { setMode(m); changed(); } },
    }, label));
  }
  const gpuSelect = h('select', { id: 'gpu', on: { change: changed } },
    gpus.map((g) => h('option', { value: g.id }, `${g.id} — ${bytes(g.memory_bytes)}`)));
  $('fields').append(h('fieldset', {}, h('legend', {}, 'GPU'), gpuSelect));
  $('fields').append(h('datalist', { id: 'weight-formats' }, WEIGHT_FORMATS.map((w) => h('option', { value: w }))));
  for (const [m, fields] of Object.entries(FIELDS)) {
    const box = h('div', { class: 'mode-fields', 'data-mode': m, hidden: true });
    const groups = {};
    for (const f of fields) {
      const g = f.group || 'workload';
      if (!groups[g]) {
        groups[g] = h('fieldset', {}, h('legend', {}, g === 'cluster' ? 'Cluster' : 'Workload'));
        box.append(groups[g]);
      }
      groups[g].append(await control(m, f));
    }
    $('fields').append(box);
  }
}

async function control(m, f) {
  const id = fieldId(m, f.key);
  const on = { change: changed, input: changed };
  if (f.kind === 'check') {
    return h('label', { class: 'check' }, h('input', { type: 'checkbox', id, on }), ` ${f.label}`);
  }
  if (f.kind === 'multi') {
    const values = await choices(m, f.key);
    return h('div', { class: 'multi', id },
      h('span', { class: 'label' }, f.label),
      values.map((v) => h('label', { class: 'check' },
        h('input', { type: 'checkbox', value: v, on }), ` ${v}`)));
  }
  let input;
  if (f.kind === 'select') {
    const values = await choices(m, f.key);
    const options = f.def === '' ? [h('option', { value: '' }, '(default)')] : [];
    input = h('select', { id, on }, options, values.map((v) => h('option', { value: v }, v)));
  } else {
    input = h('input', {
      id, on, type: 'text', inputmode: f.kind === 'num' ? 'decimal' : 'text',
      placeholder: f.placeholder || f.def, list: f.list, spellcheck: 'false',
    });
  }
  return h('label', { class: 'field' }, h('span', { class: 'label' }, f.label), input);
}

function getField(m, f) {
  const el = $(fieldId(m, f.key));
  if (f.kind === 'check') return el.checked;
  if (f.kind === 'multi') return [...el.querySelectorAll('input:checked')].map((i) => i.value).join(',');
  return el.value.trim() === '' ? f.def : el.value.trim();
}

function setField(m, f, v) {
  const el = $(fieldId(m, f.key));
  if (f.kind === 'check') el.checked = v === true || v === 'true' || v === '1';
  else if (f.kind === 'multi') {
    const on = new Set(String(v).split(',').filter(Boolean));
    for (const i of el.querySelectorAll('input')) i.checked = on.has(i.value);
  } else el.value = v === f.def ? '' : v;
  if (f.kind === 'select' && el.value === '' && v !== '') el.value = f.def;
}

function setMode(m) {
  mode = m;
  for (const b of $('modes').children) b.setAttribute('aria-selected', String(b.dataset.mode === m));
  for (const box of document.querySelectorAll('.mode-fields')) box.hidden = box.dataset.mode !== m;
}

const source = () => document.querySelector('input[name=source]:checked').value;

function setSource(s) {
  for (const r of document.querySelectorAll('input[name=source]')) r.checked = r.value === s;
  $('catalogue-pick').hidden = s !== 'catalogue';
  $('config-pick').hidden = s !== 'config';
  $('files-pick').hidden = s !== 'files';
  $('link-note').hidden = s !== 'files';
}

/** The argument vector of the form, as `memwall` takes it. */
function argv() {
  const args = [mode];
  const model = $('model').value.trim() || DEFAULT_MODEL;
  if (source() === 'config') args.push('--model', 'config.json');
  else if (source() === 'files') args.push('--model', dropped ? dropped.model : (linkedFiles ? primary(linkedFiles.split(',')) : 'FILE'));
  else if (model !== DEFAULT_MODEL) args.push('--model', model);
  if ($('gpu').value !== DEFAULT_GPU) args.push('--gpu', $('gpu').value);
  for (const f of FIELDS[mode]) {
    const v = getField(mode, f);
    if (f.kind === 'check') { if (v) args.push(`--${f.key}`); } else if (v !== f.def) args.push(`--${f.key}`, v);
  }
  return args;
}

const shellWord = (w) => (/^[\w@%+=:,./-]+$/.test(w) ? w : `'${w.replaceAll("'", "'\\''")}'`);

// ---- the URL ------------------------------------------------------------------------------------

function toBase64Url(text) {
  const bin = Array.from(new TextEncoder().encode(text), (b) => String.fromCharCode(b)).join('');
  return btoa(bin).replaceAll('+', '-').replaceAll('/', '_').replace(/=+$/, '');
}

function fromBase64Url(s) {
  const bin = atob(s.replaceAll('-', '+').replaceAll('_', '/'));
  return new TextDecoder().decode(Uint8Array.from(bin, (c) => c.charCodeAt(0)));
}

function saveUrl() {
  const p = new URLSearchParams();
  p.set('mode', mode);
  if (source() === 'config') p.set('config', toBase64Url($('config').value));
  else if (source() === 'files') p.set('files', dropped ? readNames().join(',') : linkedFiles);
  else if ($('model').value.trim()) p.set('model', $('model').value.trim());
  if ($('gpu').value !== DEFAULT_GPU) p.set('gpu', $('gpu').value);
  for (const f of FIELDS[mode]) {
    const v = getField(mode, f);
    if (v !== f.def) p.set(f.key, String(v));
  }
  history.replaceState(null, '', `#${p}`);
}

function loadUrl() {
  const p = new URLSearchParams(location.hash.slice(1));
  setMode(MODES[p.get('mode')] ? p.get('mode') : 'train');
  if (p.has('config')) {
    try { $('config').value = fromBase64Url(p.get('config')); } catch { $('config').value = ''; }
    setSource('config');
  } else if (p.has('files')) {
    // a link cannot carry the files: it names them, and asks for them unless they are here
    linkedFiles = p.get('files');
    setSource('files');
    const missing = dropped == null || readNames().join(',') !== linkedFiles;
    $('files-note').hidden = !missing;
    $('files-note').textContent = missing
      ? `This link was made from dropped files (${linkedFiles.split(',').join(', ')}). A link cannot carry files — they never leave the computer they are on — so drop or pick the same files again to see its result.`
      : '';
  } else setSource('catalogue');
  $('model').value = p.get('model') || '';
  $('gpu').value = p.get('gpu') || DEFAULT_GPU;
  if (!$('gpu').value) $('gpu').value = DEFAULT_GPU;
  for (const f of FIELDS[mode]) setField(mode, f, p.has(f.key) ? p.get(f.key) : f.def);
}

/** Loads an argument vector of the CLI (a doctor step, a plan) into the form. */
function applyArgs(cmd, args) {
  setMode(cmd);
  for (const f of FIELDS[cmd]) setField(cmd, f, f.def);
  for (let i = 0; i < args.length; i++) {
    const key = args[i].replace(/^--/, '');
    const f = FIELDS[cmd].find((x) => x.key === key);
    const takesValue = !(f && f.kind === 'check') && key !== 'sequence-parallel';
    const value = takesValue ? args[++i] : true;
    if (key === 'model') { if (source() === 'catalogue') $('model').value = value === DEFAULT_MODEL ? '' : value; }
    else if (key === 'gpu') $('gpu').value = value;
    else if (f) setField(cmd, f, value);
  }
  changed();
  window.scrollTo({ top: 0 });
}

// ---- running ------------------------------------------------------------------------------------

let timer = null;
let running = false;
let again = false;

function changed() {
  clearTimeout(timer);
  timer = setTimeout(compute, 120);
}

async function compute() {
  if (running) { again = true; return; }
  saveUrl();
  const args = argv();
  const shown = ['memwall', ...args, '--json'].map(shellWord).join(' ');
  $('command').textContent = shown;
  if (source() === 'files' && !dropped) {
    $('status').textContent = 'Drop the model\u2019s files (or pick them) to see the result.';
    $('report').replaceChildren();
    document.body.dataset.state = 'need-files';
    document.body.dataset.command = args.join(' ');
    return;
  }
  running = true;
  $('status').textContent = mode === 'plan' ? 'searching…' : 'computing…';
  document.body.dataset.state = 'busy';
  const config = source() === 'config' ? $('config').value : null;
  const t0 = performance.now();
  const r = source() === 'files' ? await withFiles([...args, '--json']) : await memwall([...args, '--json'], config);
  const ms = performance.now() - t0;
  running = false;
  if (again) { again = false; compute(); return; }
  const report = $('report');
  report.replaceChildren();
  if (r.error) {
    $('status').textContent = '';
    report.append(h('pre', { class: 'error', id: 'error' }, r.error.join('\n')));
    window.memwallReport = null; // no report: never the previous run's
  } else {
    $('status').textContent = `computed in ${Math.max(1, Math.round(ms))} ms, in this page`;
    report.append(...RENDER[mode](r.ok));
    window.memwallReport = r.ok; // the report as the CLI printed it (the browser tests read it)
  }
  document.body.dataset.state = r.error ? 'error' : 'done';
  document.body.dataset.command = args.join(' ');
}

// ---- dropped model files ------------------------------------------------------------------------
// A dropped .gguf, or a config.json with its safetensors index and shards, is read as the CLI
// reads a file: only a bounded prefix of each (File.slice), never the tensors. The CLI says when
// a prefix was too short ({"more": {file, bytes}}): that many first bytes are read and it runs
// again. The command shown is what the CLI prints in the directory holding the files.

const MIB = 1 << 20;
/** First read of each kind of file: configs and indexes whole (up to the CLI's 16 MiB limit, and
 * one byte more to tell "over it"); a safetensors header is usually under 1 MiB; a GGUF header
 * (metadata, dominated by the tokenizer's vocabulary and merges, then the tensor infos) a few MiB. */
const FIRST_READ = { json: 16 * MIB + 1, safetensors: MIB, gguf: 16 * MIB };
/** Re-reads per run at most: the CLI asks for at least twice as much each time (GGUF) or the exact
 * header (safetensors), up to its 256 MiB header limit. */
const MAX_PASSES = 12;

let dropped = null; // {files: [{file, name, size, kind, prefix, passes}], model, summary}
let linkedFiles = ''; // the files a link names, when it was opened without them

function kindOf(name) {
  if (name.endsWith('.gguf')) return 'gguf';
  if (name.endsWith('.safetensors')) return 'safetensors';
  if (name === 'config.json' || name.endsWith('.safetensors.index.json')) return 'json';
  return null;
}

/** The file `--model` names, as a model directory would be read: the index, else the one
 * safetensors file (several: the directory), else the first .gguf (a split's first part), else
 * the config. */
function primary(names) {
  const index = names.find((n) => n.endsWith('.safetensors.index.json'));
  if (index) return index;
  const st = names.filter((n) => n.endsWith('.safetensors'));
  if (st.length) return st.length === 1 ? st[0] : '.';
  const gguf = names.filter((n) => n.endsWith('.gguf')).sort();
  if (gguf.length) return gguf[0];
  return names.includes('config.json') ? 'config.json' : names[0];
}

const readNames = () => dropped.files.filter((f) => f.kind).map((f) => f.name).sort();

async function readPrefix(f, n) {
  const p = new Uint8Array(await f.file.slice(0, Math.min(n, f.size)).arrayBuffer());
  // two runs over the same files may read at once: a shorter read never replaces a longer one
  if (f.prefix == null || p.length > f.prefix.length) f.prefix = p;
  f.passes += 1;
}

/** Runs memwall over the dropped files, re-reading a file's first bytes while it asks for more. */
async function withFiles(args) {
  for (let pass = 0; ; pass++) {
    const files = dropped.files.filter((f) => f.kind).map(({ name, size, prefix }) => ({ name, size, prefix }));
    const r = await memwall(args, null, files);
    const f = r.more && dropped.files.find((x) => x.name === r.more.file);
    if (!f || pass >= MAX_PASSES) return r;
    // what this pass gave: another run over the same files (the summary's `inspect` and the
    // report run at once) may have read more of this file meanwhile; then run again on it
    const given = files.find((x) => x.name === f.name).prefix.length;
    if (f.prefix.length > given) continue;
    if (r.more.bytes <= given) return r;
    $('status').textContent = `reading the first ${bytes(r.more.bytes)} of ${f.name}…`;
    await readPrefix(f, r.more.bytes);
    renderFiles();
  }
}

function renderFiles() {
  $('file-list').replaceChildren(...dropped.files.map((f) => h('li', { 'data-name': f.name, 'data-read': f.kind ? f.prefix.length : null },
    h('code', { class: f.kind ? '' : 'ignored' }, f.name),
    h('span', { class: 'muted' }, f.kind
      ? (f.prefix.length === f.size ? `${bytes(f.size)}, read whole` : `read ${bytes(f.prefix.length)} of ${bytes(f.size)}`)
      : 'not read (not a model file)'))));
}

/** What the headers say: `memwall inspect FILE --json`, as the CLI shows it. */
function renderSummary(r) {
  if (r.error) {
    $('file-summary').replaceChildren(h('pre', { class: 'error', id: 'files-error' }, r.error.join('\n')));
    return;
  }
  const i = r.ok;
  const inum = (path, value, format = String) => h('span', { class: 'num', 'data-ik': path, 'data-v': String(value) }, format(value));
  const rows = [
    ['architecture', h('span', {}, i.model.model_type, ', ', inum('model.num_layers', i.model.num_layers), ' layers')],
    ['parameters', inum('params.total', i.params.total, (x) => x.toLocaleString('en-US'))],
  ];
  if (i.checkpoint_dtype) rows.push(['config dtype', i.checkpoint_dtype]);
  const c = i.checkpoint;
  if (c) {
    rows.push(['weights', h('span', {}, c.storage, ` (${c.files} ${c.format} file${c.files === 1 ? '' : 's'})`)]);
    rows.push(['tensor bytes', inum('checkpoint.tensor_bytes', c.tensor_bytes, bytes)]);
    rows.push(['estimated as', h('code', {}, `--weights ${c.weights}`)]);
  }
  $('file-summary').replaceChildren(h('table', { class: 'summary' }, h('tbody', {}, rows.map(([k, v]) => h('tr', {}, h('th', {}, k), h('td', {}, v))))));
  window.memwallInspect = i; // the browser tests hold it to `memwall inspect FILE --json`
}

/** Takes dropped or picked files as the model: reads their first bytes, shows what they hold. */
async function setFiles(list) {
  const files = [...list].map((file) => ({ file, name: file.name, size: file.size, kind: kindOf(file.name), prefix: null, passes: 0 }));
  if (!files.some((f) => f.kind)) {
    $('status').textContent = `${files.map((f) => f.name).join(', ')}: not model files (drop a .gguf, or a config.json with its .safetensors files and index)`;
    return;
  }
  await Promise.all(files.filter((f) => f.kind).map((f) => readPrefix(f, FIRST_READ[f.kind])));
  dropped = { files, model: primary(files.filter((f) => f.kind).map((f) => f.name)) };
  linkedFiles = '';
  $('files-note').hidden = true;
  setSource('files');
  renderFiles();
  $('file-summary').replaceChildren(h('p', { class: 'muted' }, 'reading…'));
  renderSummary(await withFiles(['inspect', dropped.model, '--json']));
  changed();
}

/** The files of a drop: a dropped folder's files (one level), else the files themselves. */
async function filesOf(dt) {
  // entries must be taken before the first await: the drop's data is gone after it
  const entries = [...dt.items].map((i) => (i.webkitGetAsEntry ? i.webkitGetAsEntry() : null)).filter(Boolean);
  const direct = [...dt.files];
  if (!entries.some((e) => e.isDirectory)) return direct;
  const fileOf = (e) => new Promise((resolve, reject) => e.file(resolve, reject));
  const out = [];
  for (const e of entries) {
    if (e.isFile) out.push(await fileOf(e));
    else if (e.isDirectory) {
      const reader = e.createReader();
      for (;;) {
        const batch = await new Promise((resolve, reject) => reader.readEntries(resolve, reject));
        if (!batch.length) break;
        for (const c of batch) if (c.isFile) out.push(await fileOf(c));
      }
    }
  }
  return out;
}

// ---- the reports --------------------------------------------------------------------------------

const gpuOf = (id) => gpus.find((g) => g.id === id);

function modelLine(m) {
  return h('p', { class: 'model' }, h('strong', {}, m.label), ` (${m.model_type}, ${m.num_layers} layers, `,
    num('model.params_total', m.params_total, (x) => `${x.toLocaleString('en-US')} params`), ') — ',
    h('span', { class: 'muted' }, m.origin));
}

/** The fit against the GPU: the stacked bar and the needs/free line. */
function fitBlock(atPeak, fit, prefix = '') {
  const segs = Object.entries(atPeak).filter(([, v]) => v > 0).map(([k, v]) => ({ name: k, bytes: v, path: `${prefix}at_peak.${k}` }));
  const outside = [
    { name: 'cuda_context', bytes: fit.cuda_context_bytes, path: 'gpu.cuda_context_bytes', outside: true },
    { name: 'cublas_workspace', bytes: fit.cublas_workspace_bytes, path: 'gpu.cublas_workspace_bytes', outside: true },
    { name: 'allocator_margin', bytes: fit.alloc_margin_bytes, path: 'gpu.alloc_margin_bytes', outside: true },
  ];
  const all = [...segs, ...outside];
  const sum = segs.reduce((a, s) => a + s.bytes, 0);
  const verdict = fit.fits
    ? h('span', { class: 'fits' }, 'fits, ', num('gpu.headroom_bytes', fit.headroom_bytes, bytes), ' free')
    : h('span', { class: 'nofit' }, 'does not fit: ', num('gpu.headroom_bytes', fit.headroom_bytes, (x) => bytes(-x)), ' short');
  return [
    h('p', { class: 'fit' }, `on ${fit.id} (${fit.name}): needs `, num('gpu.required_bytes', fit.required_bytes, bytes),
      ' of ', num('gpu.memory_bytes', fit.memory_bytes, bytes), ' — ', verdict),
    stackedBar(all, fit.memory_bytes, `${fit.id} ${bytes(fit.memory_bytes)}`),
    table(['at the peak', 'bytes', 'share'], all.map((s) => [
      h('span', {}, swatch(s.name), s.name + (s.outside ? ' (outside PyTorch\u2019s allocator)' : '')),
      num(s.path, s.bytes, bytes),
      s.outside ? '' : pct(s.bytes / sum),
    ]), 'breakdown'),
  ];
}

function doctorBlock(d, cmd) {
  if (!d) return [];
  const argsKey = cmd === 'train' ? 'train_args' : 'infer_args';
  return [section('The doctor: fixes, cheapest first',
    h('p', {}, d.fixed ? 'Applied in order, these make it fit:' : 'Even all of these do not make it fit:'),
    table(['', 'change', 'peak', 'needs', 'fits', cmd === 'train' ? 'step' : 'phase', ''],
      d.steps.map((s, i) => [
        String(i + 1),
        h('span', {}, s.change, s.changes_result ? h('em', { class: 'muted' }, ' (changes the result)') : ''),
        num(`doctor.steps.${i}.peak_bytes`, s.peak_bytes, bytes),
        num(`doctor.steps.${i}.required_bytes`, s.required_bytes, bytes),
        s.fits ? h('span', { class: 'fits' }, 'yes') : h('span', { class: 'nofit' }, 'no'),
        s.step_s != null ? num(`doctor.steps.${i}.step_s`, s.step_s, (x) => `${fixed(x, 3)} s`) : s.phase,
        h('button', { type: 'button', class: 'apply', on: { click: () => applyArgs(cmd, s[argsKey]) } }, 'apply'),
      ]), 'doctor'))];
}

const PHASES = ['forward', 'loss', 'backward', 'optimizer'];

function renderTrain(r) {
  const dist = r.distributed;
  const worst = dist ? dist.groups[dist.worst] : null;
  const phasePeaks = dist ? worst.phase_peaks : r.phase_peaks;
  const phasePath = dist ? `distributed.groups.${dist.worst}.phase_peaks` : 'phase_peaks';
  const out = [
    section('Peak',
      modelLine(r.model),
      h('p', { class: 'headline' }, 'peak ', num('peak_bytes', r.peak_bytes, bytes), ` during the ${r.phase}`,
        h('span', { class: 'muted' }, ` (runtime profile: ${r.runtime_profile}${dist ? `, worst rank group: ${worst.label}` : ''})`)),
      ...fitBlock(r.at_peak, r.gpu),
      h('p', {}, 'speed: ', num('speed.step_s', r.speed.step_s, (x) => `${fixed(x, 3)} s`), ' per step → ',
        num('speed.tokens_per_s_per_gpu', r.speed.tokens_per_s_per_gpu, (x) => fixed(x, 0)), ' tokens/s per GPU, MFU ',
        num('speed.mfu', r.speed.mfu, pct))),
  ];
  if (phasePeaks && Object.keys(phasePeaks).length) {
    out.push(section('Memory over the step',
      h('p', { class: 'muted' }, 'The peak of each phase of one steady-state step', dist ? ` on ${worst.label}` : '', ', against the GPU\u2019s memory less the CUDA context and cuBLAS workspace.'),
      phaseChart(PHASES.filter((p) => p in phasePeaks).map((p) => ({ name: p, bytes: phasePeaks[p] })),
        r.gpu.memory_bytes - r.gpu.cuda_context_bytes - r.gpu.cublas_workspace_bytes, r.phase),
      table(PHASES.filter((p) => p in phasePeaks), [PHASES.filter((p) => p in phasePeaks).map((p) => num(`${phasePath}.${p}`, phasePeaks[p], bytes))], 'phases')));
  }
  if (dist) {
    out.push(section('Ranks',
      h('p', {}, `${dist.layout.strategy} · tp ${dist.layout.tp} · pp ${dist.layout.pp} · cp ${dist.layout.cp} · ep ${dist.layout.ep} · dp `,
        num('distributed.dp', dist.dp), ' · global batch ', num('distributed.global_batch', dist.global_batch)),
      table(['ranks', 'peak', 'model states', 'host', 'phase', 'fits'], dist.groups.map((g, i) => [
        g.label, num(`distributed.groups.${i}.peak_bytes`, g.peak_bytes, bytes),
        num(`distributed.groups.${i}.model_state_bytes`, g.model_state_bytes, bytes),
        num(`distributed.groups.${i}.host_bytes`, g.host_bytes, bytes), g.phase, g.fits ? 'yes' : 'no']), 'groups'),
      dist.comm_buffers.length ? table(['communication buffer', 'bytes'], dist.comm_buffers.map((c, i) => [c.name, num(`distributed.comm_buffers.${i}.bytes`, c.bytes, bytes)])) : '',
      dist.fits_with.length ? h('div', {}, h('h3', {}, 'Layouts that fit'), table(['flags', 'peak', 'host per node'], dist.fits_with.map((a, i) => [
        h('code', {}, a.flags), num(`distributed.fits_with.${i}.peak_bytes`, a.peak_bytes, bytes),
        num(`distributed.fits_with.${i}.host_bytes_per_node`, a.host_bytes_per_node, bytes)]))) : ''));
  }
  out.push(...doctorBlock(r.doctor, 'train'));
  return out;
}

function renderInfer(r) {
  return [
    section('Peak',
      modelLine(r.model),
      h('p', { class: 'headline' }, 'peak ', num('peak_bytes', r.peak_bytes, bytes), ` during the ${r.phase}`,
        h('span', { class: 'muted' }, ` (runtime profile: ${r.runtime_profile})`)),
      h('p', { class: 'muted' }, `weights from: ${r.weights_from}`),
      ...fitBlock(r.at_peak, r.gpu),
      table(['weights', 'KV cache (at its largest)', 'prefill peak'], [[
        num('weights_bytes', r.weights_bytes, bytes), num('kv_cache_bytes', r.kv_cache_bytes, bytes),
        num('prefill_peak_bytes', r.prefill_peak_bytes, bytes)]])),
    ...doctorBlock(r.doctor, 'infer'),
  ];
}

function renderServe(r) {
  const c = r.config;
  const segs = [
    { name: 'weights', bytes: c.weights_bytes_per_rank, path: 'config.weights_bytes_per_rank' },
    { name: 'activations', bytes: c.activation_peak_bytes, path: 'config.activation_peak_bytes' },
    { name: 'non_torch', bytes: c.non_torch_bytes, path: 'config.non_torch_bytes' },
    { name: 'cuda_graphs', bytes: c.cuda_graph_bytes, path: 'config.cuda_graph_bytes' },
    { name: 'kv_cache', bytes: Math.max(0, r.available_kv_bytes), path: 'available_kv_bytes' },
  ].filter((s) => s.bytes != null);
  return [
    section('KV cache',
      modelLine(r.model),
      h('p', { class: 'headline' }, num('kv_tokens', r.kv_tokens, String), ' tokens of KV cache: ',
        num('num_gpu_blocks', r.num_gpu_blocks, String), ' blocks of ', String(c.block_size), ' tokens (',
        num('bytes_per_block', r.bytes_per_block, bytes), ' per block)'),
      h('p', {}, `requested ${bytes(c.gpu_memory_bytes)} × ${c.gpu_memory_utilization} = `,
        num('requested_memory_bytes', r.requested_memory_bytes, bytes), '; KV cache available ',
        num('available_kv_bytes', r.available_kv_bytes, bytes)),
      h('p', { class: 'muted' }, `weights from: ${r.weights_from}`),
      stackedBar(segs, c.gpu_memory_bytes, `${r.gpu} ${bytes(c.gpu_memory_bytes)}`, r.requested_memory_bytes),
      table(['part of the requested memory', 'bytes'], segs.map((s) => [
        h('span', {}, swatch(s.name), s.name + (r.estimated_inputs.includes(s.path.replace('config.', '')) ? ' (estimated)' : '')),
        num(s.path, s.bytes, bytes)]), 'breakdown'),
      h('p', {}, r.fits_max_model_len ? 'max-model-len ' : h('span', { class: 'nofit' }, 'max-model-len does not fit: '),
        num('config.max_model_len', c.max_model_len), ' (largest that fits: ', num('max_model_len_that_fits', r.max_model_len_that_fits), ')')),
    section('Concurrency',
      table(['tokens per request', 'max concurrent requests'], Object.entries(r.max_concurrency).map(([k, v]) => [k, num(`max_concurrency.${k}`, v, (x) => fixed(x, 2))]))),
    section('Launch', h('pre', {}, r.vllm_serve_command)),
  ];
}

function renderPlan(r) {
  const a = r.asked;
  const layout = (l) => [l.strategy, l.tp > 1 ? `tp${l.tp}` : '', l.sequence_parallel ? 'sp' : '', l.pp > 1 ? `pp${l.pp}` : '',
    l.virtual_stages > 1 ? `v${l.virtual_stages}` : '', l.cp > 1 ? `cp${l.cp}` : '', l.ep > 1 ? `ep${l.ep}` : '',
    l.offload !== 'none' ? `offload ${l.offload}` : ''].filter(Boolean).join(' ');
  const out = [section('Plans',
    modelLine(r.model),
    h('p', {}, `${a.gpus} × ${a.gpu} (${a.gpus_per_node} per node) · seq ${a.seq} · global batch ${a.global_batch}: `,
      num('candidates_evaluated', r.candidates_evaluated), ' candidates evaluated, ', num('fitting', r.fitting), ' fit'),
    r.plans.length ? table(['rank', 'tokens/s/GPU', 'step s', 'MFU', 'peak', 'headroom', 'layout', 'mb×acc', 'ckpt', 'precision', 'optimizer', 'changes result', ''],
      r.plans.map((p, i) => [String(p.rank),
        num(`plans.${i}.tokens_per_s_per_gpu`, p.tokens_per_s_per_gpu, (x) => fixed(x, 0)),
        num(`plans.${i}.step_s`, p.step_s, (x) => fixed(x, 3)), num(`plans.${i}.mfu`, p.mfu, pct),
        num(`plans.${i}.peak_bytes`, p.peak_bytes, bytes), num(`plans.${i}.headroom_bytes`, p.headroom_bytes, bytes),
        layout(p.layout), `${p.micro_batch}×${p.grad_accum}`, p.checkpointing ? 'on' : 'off', p.precision, p.optimizer,
        p.changes_result.length ? p.changes_result.join(', ') : 'no',
        h('button', { type: 'button', class: 'apply', on: { click: () => applyArgs('train', p.train_args) } }, 'open')]), 'plans')
      : h('p', { class: 'nofit' }, 'No plan fits.'),
    r.would_fit_with && r.would_fit_with.length ? table(['allowing', 'fitting plans', 'best tokens/s/GPU'], r.would_fit_with.map((w, i) => [
      w.allow, num(`would_fit_with.${i}.fitting`, w.fitting), num(`would_fit_with.${i}.best_tokens_per_s_per_gpu`, w.best_tokens_per_s_per_gpu, (x) => fixed(x, 0))])) : '')];
  return out;
}

function renderRoofline(r) {
  const g = gpuOf(r.gpu);
  const w = r.workload;
  const bw = g.memory_bandwidth_bytes_per_s * w.bandwidth_efficiency;
  const si = (x) => { // the CLI's `si`: `{:.2} {prefix}`
    const [d, u] = [[1e15, 'P'], [1e12, 'T'], [1e9, 'G'], [1e6, 'M'], [1e3, 'k']].find(([f]) => x >= f) || [1, ''];
    return `${fixed(x / d, 2)} ${u}`;
  };
  return [
    section('Roofline',
      modelLine(r.model),
      h('p', { class: 'headline' }, 'lower bound ', num('time_s', r.time_s, (x) => `${fixed(x * 1e3, 3)} ms`), ` per ${w.phase === 'decode' ? 'token step' : 'step'} → `,
        num('tokens_per_s', r.tokens_per_s, (x) => fixed(x, 0)), ' tokens/s'),
      r.decode ? h('p', {}, 'decode: ', num('decode.tokens_per_s_per_sequence', r.decode.tokens_per_s_per_sequence, (x) => fixed(x, 1)),
        ' tokens/s per sequence, ', num('decode.aggregate_tokens_per_s', r.decode.aggregate_tokens_per_s, (x) => fixed(x, 0)), ' tokens/s aggregate; ',
        r.decode.compute_bound_from_batch != null ? h('span', {}, 'the weight GEMMs turn compute-bound from batch ', num('decode.compute_bound_from_batch', r.decode.compute_bound_from_batch))
          : 'memory-bound at every batch probed') : '',
      h('p', {}, `on ${g.name}: ridge `, num('ridge_flops_per_byte', r.ridge_flops_per_byte, (x) => fixed(x, 0)), ' FLOP/byte; ',
        num('total_flops', r.total_flops, (x) => `${si(x)} FLOPs`), ', ', num('total_bytes', r.total_bytes, (x) => `${si(x)}B`), ' moved'),
      rooflinePlot(r.ops, bw, r.ridge_flops_per_byte * bw),
      table(['#', 'op', 'FLOPs', 'bytes', 'FLOP/byte', 'bound', 'time'], r.ops.map((o, i) => [String(i + 1), o.name,
        num(`ops.${i}.flops`, o.flops, (x) => si(x).trimEnd()), num(`ops.${i}.bytes`, o.bytes, (x) => `${si(x)}B`),
        num(`ops.${i}.intensity`, o.intensity, (x) => fixed(x, 1)), o.bound, num(`ops.${i}.time_s`, o.time_s, (x) => `${fixed(x * 1e3, 3)} ms`)]), 'ops')),
  ];
}

const RENDER = { train: renderTrain, infer: renderInfer, serve: renderServe, plan: renderPlan, roofline: renderRoofline };

// ---- start --------------------------------------------------------------------------------------

async function main() {
  startWorker();
  const [g, models, v] = await Promise.all([memwall(['gpus', '--json']), memwall(['models', '--json']), memwall(['--version'])]);
  gpus = g.ok;
  $('models').append(...models.ok.flatMap((m) => [h('option', { value: m.id }, `${m.hf_repo} · ${m.published_params}`)]));
  $('version').textContent = v.error ? v.error[0] : '';
  await buildForm();
  for (const r of document.querySelectorAll('input[name=source]')) r.addEventListener('change', () => { setSource(source()); changed(); });
  $('model').addEventListener('input', changed);
  $('config').addEventListener('input', changed);
  $('copy-command').addEventListener('click', () => navigator.clipboard.writeText($('command').textContent));
  $('copy-link').addEventListener('click', () => navigator.clipboard.writeText(location.href));
  // replaceState does not fire it: only a link or an edited address does
  window.addEventListener('hashchange', () => { loadUrl(); compute(); });
  document.addEventListener('dragover', (e) => { e.preventDefault(); document.body.classList.add('dragging'); });
  document.addEventListener('dragleave', (e) => { if (!e.relatedTarget) document.body.classList.remove('dragging'); });
  document.addEventListener('drop', async (e) => {
    e.preventDefault();
    document.body.classList.remove('dragging');
    const files = await filesOf(e.dataTransfer);
    if (!files.length) return;
    const [file] = files;
    // one config.json (not an index): its text, as if pasted; anything else: the model's files
    if (files.length === 1 && file.name.endsWith('.json') && !file.name.endsWith('.safetensors.index.json') && file.size <= 16 << 20) {
      $('config').value = await file.text();
      setSource('config');
      changed();
      return;
    }
    await setFiles(files);
  });
  $('file-input').addEventListener('change', async (e) => { if (e.target.files.length) await setFiles(e.target.files); });
  loadUrl();
  await compute();
}

main();
