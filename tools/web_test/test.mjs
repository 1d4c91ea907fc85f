// Browser tests of memwall's web page: `memwall web` on a free localhost port, Debian's chromium
// driven headless by playwright-core. For each configuration the page's report must be the
// binary's `memwall … --json` (the whole report, every number the page shows, and the formatted
// headline numbers against the binary's table); the controls must change the command and the
// report; each page is screenshotted into screenshots/. Run: bash tools/web_test/run.sh
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));
const repo = join(here, '..', '..');
const bin = process.env.MEMWALL_BIN || join(repo, 'target', 'debug', 'memwall');
const shots = join(here, 'screenshots');
mkdirSync(shots, { recursive: true });

let server;
let base;
let browser;
let context;

/** The binary's answer (run in `cwd`, the repository unless given): JSON (with --json) or its table text. */
function cli(args, cwd = repo) {
  const out = execFileSync(bin, args, { cwd, encoding: 'utf8', maxBuffer: 64 << 20 });
  return args.includes('--json') ? JSON.parse(out) : out;
}

before(async () => {
  server = spawn(bin, ['web', '--port', '0'], { stdio: ['ignore', 'pipe', 'inherit'] });
  base = await new Promise((resolve, reject) => {
    let seen = '';
    server.stdout.on('data', (d) => {
      seen += d;
      const m = seen.match(/http:\/\/127\.0\.0\.1:\d+\//);
      if (m) resolve(m[0]);
    });
    server.on('exit', (code) => reject(new Error(`memwall web exited with ${code}: ${seen}`)));
  });
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
  context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
});

after(async () => {
  await browser?.close();
  server?.kill();
});

/** Opens the page at `hash` and waits for its first result. */
async function open(hash = '') {
  const page = await context.newPage();
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => { if (m.type() === 'error') problems.push(`console: ${m.text()}`); });
  page.on('request', (r) => { if (!r.url().startsWith(base)) problems.push(`request off the page's server: ${r.url()}`); });
  await page.goto(base + hash);
  await page.waitForSelector('body[data-state="done"], body[data-state="error"]', { timeout: 60000 });
  page.problems = problems;
  return page;
}

/** Waits until the page has run `command` (its argument vector, space-joined) to the end. */
async function settled(page, command) {
  await page.waitForFunction((c) => document.body.dataset.command === c
    && ['done', 'error'].includes(document.body.dataset.state), command, { timeout: 60000 });
}

const get = (obj, path) => path.split('.').reduce((o, k) => (o == null ? undefined : o[k]), obj);

/** The page's report is the binary's, and so is every number it shows. */
async function sameAsCli(page, args, { ignore = [], cwd = repo } = {}) {
  const want = cli([...args, '--json'], cwd);
  const have = await page.evaluate(() => window.memwallReport);
  const strip = (r) => { const c = structuredClone(r); for (const p of ignore) { const ks = p.split('.'); delete get(c, ks.slice(0, -1).join('.') || '')?.[ks.at(-1)]; } return c; };
  assert.deepEqual(ignore.length ? strip(have) : have, ignore.length ? strip(want) : want);
  const shown = await page.$$eval('[data-k]', (els) => els.map((e) => ({ k: e.dataset.k, v: e.dataset.v, text: e.textContent })));
  assert.ok(shown.length >= 5, `only ${shown.length} numbers shown`);
  for (const { k, v } of shown) assert.equal(Number(v), get(want, k), `${k} on the page`);
  return { want, shown: Object.fromEntries(shown.map((s) => [s.k, s.text])) };
}

const CONFIGS = [
  { name: 'train-single-gpu', hash: 'mode=train&model=gpt2&batch=4&seq=1024', args: ['train', '--model', 'gpt2', '--batch', '4', '--seq', '1024'] },
  { name: 'train-fsdp-cluster', hash: 'mode=train&model=llama-3.1-70b&checkpointing=true&gpus=16&strategy=fsdp-full', args: ['train', '--model', 'llama-3.1-70b', '--checkpointing', '--gpus', '16', '--strategy', 'fsdp-full'] },
  { name: 'train-does-not-fit', hash: 'mode=train&model=llama-3.1-70b', args: ['train', '--model', 'llama-3.1-70b'] },
  { name: 'infer', hash: 'mode=infer&model=qwen2.5-7b&batch=8&prompt=4096&kv-dtype=fp8', args: ['infer', '--model', 'qwen2.5-7b', '--batch', '8', '--prompt', '4096', '--kv-dtype', 'fp8'] },
  { name: 'serve', hash: 'mode=serve&model=llama-3.1-70b&tp=4', args: ['serve', '--model', 'llama-3.1-70b', '--tp', '4'] },
  { name: 'plan', hash: 'mode=plan&gpus=16&global-batch=64', args: ['plan', '--gpus', '16', '--global-batch', '64'] },
  { name: 'roofline-decode', hash: 'mode=roofline&gpu=a100-80gb-sxm&phase=decode&batch=8&seq=4096', args: ['roofline', '--gpu', 'a100-80gb-sxm', '--phase', 'decode', '--batch', '8', '--seq', '4096'] },
];

/** The formatted numbers of the binary's table that the page shows too, by data-k. */
function tableNumbers(kind, table) {
  const grab = (re) => { const m = table.match(re); assert.ok(m, `${re} in:\n${table}`); return m.slice(1); };
  if (kind === 'train' || kind === 'infer') {
    const [peak] = grab(/peak (\S+ \S+) (?:on the worst rank )?during/);
    const [needs, of] = grab(/needs (\S+ \S+) of (\S+ \S+)/);
    return { peak_bytes: peak, 'gpu.required_bytes': needs, 'gpu.memory_bytes': of };
  }
  if (kind === 'serve') {
    const [avail, blocks, perBlock, tokens] = grab(/KV cache: (\S+ \S+) available → (\d+) blocks of \d+ tokens \((\S+ \S+) per block.*= (\d+) tokens/);
    return { available_kv_bytes: avail, num_gpu_blocks: blocks, bytes_per_block: perBlock, kv_tokens: tokens };
  }
  if (kind === 'plan') {
    const [tps, step, mfu, peak, headroom] = grab(/\n\s+1\s+(\d+)\s+(\S+)\s+(\S+%)\s+(\S+ \S+)\s+(\S+ \S+)/);
    return { 'plans.0.tokens_per_s_per_gpu': tps, 'plans.0.step_s': step, 'plans.0.mfu': mfu, 'plans.0.peak_bytes': peak, 'plans.0.headroom_bytes': headroom };
  }
  const [flops, moved, ms, tps] = grab(/total (\S+ \S+) FLOPs, (\S+ \S+) moved; lower bound (\S+) ms per [a-z ]+ → (\d+) tokens\/s/);
  const shown = { total_flops: `${flops} FLOPs`, total_bytes: moved, time_s: `${ms} ms`, tokens_per_s: tps };
  if (table.includes('\ndecode: ')) {
    const [perSeq, aggregate] = grab(/\ndecode: (\S+) tokens\/s per sequence, (\d+) tokens\/s aggregate/);
    Object.assign(shown, { 'decode.tokens_per_s_per_sequence': perSeq, 'decode.aggregate_tokens_per_s': aggregate });
  }
  return shown;
}

for (const c of CONFIGS) {
  test(`${c.name}: the page shows memwall ${c.args.join(' ')} --json`, async () => {
    const page = await open(`#${c.hash}`);
    assert.equal(await page.evaluate(() => document.body.dataset.command), c.args.join(' '));
    assert.equal(await page.textContent('#command'), `memwall ${c.args.join(' ')} --json`);
    const { want, shown } = await sameAsCli(page, c.args);
    for (const [k, text] of Object.entries(tableNumbers(c.args[0], cli(c.args)))) {
      assert.equal(shown[k], text, `${k} as the CLI's table prints it`);
    }
    if (c.name === 'train-does-not-fit') {
      assert.equal(want.gpu.fits, false);
      assert.equal(await page.locator('table.doctor tbody tr').count(), want.doctor.steps.length);
      assert.match(await page.textContent('.fit'), /does not fit/);
    }
    if (c.args[0] === 'train') {
      const phases = c.name === 'train-fsdp-cluster' ? want.distributed.groups[want.distributed.worst].phase_peaks : want.phase_peaks;
      assert.equal(await page.locator('svg rect.phase').count(), Object.keys(phases).length);
    }
    if (c.args[0] === 'roofline') assert.ok(await page.locator('svg circle.op').count() >= 5);
    await page.screenshot({ path: join(shots, `${c.name}.png`), fullPage: true });
    assert.deepEqual(page.problems, []);
    await page.close();
  });
}

test('controls: modes, fields, GPU, URL state, doctor and plan buttons, pasted config, errors', async () => {
  const page = await open('');
  await settled(page, 'train');
  await sameAsCli(page, ['train']);

  // a mode tab and a field: the command, the URL and the report follow
  await page.click('#mode-infer');
  await settled(page, 'infer');
  await page.fill('#f-infer-batch', '16');
  await settled(page, 'infer --batch 16');
  assert.match(page.url(), /#mode=infer&batch=16$/);
  await page.selectOption('#gpu', 'a100-80gb-sxm');
  await settled(page, 'infer --gpu a100-80gb-sxm --batch 16');
  await sameAsCli(page, ['infer', '--gpu', 'a100-80gb-sxm', '--batch', '16']);

  // a shared link opens the same result
  const shared = await open(new URL(page.url()).hash);
  await settled(shared, 'infer --gpu a100-80gb-sxm --batch 16');
  await sameAsCli(shared, ['infer', '--gpu', 'a100-80gb-sxm', '--batch', '16']);
  await shared.close();

  // the doctor: applying its last step gives the peak it promised, and it fits
  await page.click('#mode-train');
  await page.fill('#model', 'llama-3.1-70b');
  await page.selectOption('#gpu', 'h100-sxm');
  await settled(page, 'train --model llama-3.1-70b');
  const sick = await page.evaluate(() => window.memwallReport);
  const last = sick.doctor.steps.at(-1);
  assert.ok(last.fits);
  await page.locator('table.doctor button.apply').last().click();
  await page.waitForFunction((p) => window.memwallReport && window.memwallReport.peak_bytes === p && document.body.dataset.state === 'done', last.peak_bytes);
  const cured = await page.evaluate(() => [window.memwallReport.gpu.fits, document.body.dataset.command]);
  assert.equal(cured[0], true);
  await sameAsCli(page, cured[1].split(' '));
  await page.screenshot({ path: join(shots, 'doctor-applied.png'), fullPage: true });

  // a plan opens as the train run it stands for, with the same worst-rank peak
  await page.goto(`${base}#mode=plan&model=qwen2.5-7b&gpus=8`);
  await settled(page, 'plan --model qwen2.5-7b');
  const plan = await page.evaluate(() => window.memwallReport.plans[0]);
  await page.locator('table.plans button.apply').first().click();
  await page.waitForFunction(() => document.body.dataset.command.startsWith('train') && document.body.dataset.state === 'done');
  assert.equal(await page.evaluate(() => window.memwallReport.peak_bytes), plan.peak_bytes);

  // a pasted config.json is the model, as the binary reads it from a file
  await page.goto(`${base}#mode=train&batch=2`);
  await settled(page, 'train --batch 2');
  const path = 'tests/truth/configs/qwen2.5-0.5b.json';
  await page.check('input[name=source][value=config]');
  await page.fill('#config', readFileSync(join(repo, path), 'utf8'));
  await settled(page, 'train --model config.json --batch 2');
  await sameAsCli(page, ['train', '--model', path, '--batch', '2'], { ignore: ['model.label', 'model.origin'] });
  assert.match(page.url(), /config=/);
  const withConfig = await open(new URL(page.url()).hash);
  await settled(withConfig, 'train --model config.json --batch 2');
  assert.equal(await withConfig.evaluate(() => window.memwallReport.model.model_type), 'qwen2');
  await withConfig.close();

  // the CLI's errors and hints, as it prints them
  await page.check('input[name=source][value=catalogue]');
  await page.fill('#model', 'llama-3.1-8x');
  await settled(page, 'train --model llama-3.1-8x --batch 2');
  const error = await page.textContent('#error');
  assert.match(error, /^error: unknown model `llama-3.1-8x`.*did you mean/);
  assert.match(error, /\nhint: /);
  await page.screenshot({ path: join(shots, 'error.png'), fullPage: true });

  // the select lists are the CLI's own values
  for (const id of ['#f-train-precision', '#f-train-optimizer', '#f-train-strategy', '#f-infer-kv-dtype', '#f-roofline-phase']) {
    assert.ok(await page.locator(`${id} option`).count() >= 3, id);
  }
  assert.deepEqual(page.problems, []);
  await page.close();
});

test('the server: content types, 404, HEAD, other methods, bounded request heads', async () => {
  const types = { '': 'text/html', 'app.js': 'text/javascript', 'style.css': 'text/css', 'pkg/memwall_wasm_bg.wasm': 'application/wasm' };
  for (const [path, type] of Object.entries(types)) {
    const r = await fetch(base + path);
    assert.equal(r.status, 200, path);
    assert.ok(r.headers.get('content-type').startsWith(type), path);
  }
  assert.equal((await fetch(`${base}nope`)).status, 404);
  assert.equal((await fetch(`${base}../Cargo.toml`)).status, 404);
  const head = await fetch(base, { method: 'HEAD' });
  assert.equal(head.status, 200);
  assert.equal((await fetch(base, { method: 'POST', body: 'x' })).status, 405);
  assert.equal((await fetch(base, { headers: { 'x-big': 'a'.repeat(9000) } })).status, 431);
});

test('screenshot for the README', async () => {
  const page = await open('#mode=train&model=llama-3.1-8b&batch=4&seq=4096&gpu=a100-80gb-sxm');
  await settled(page, 'train --gpu a100-80gb-sxm --batch 4 --seq 4096');
  await page.screenshot({ path: join(shots, 'readme.png'), fullPage: true });
  await page.close();
});

// ---- dropped model files: header-only artifacts of their real size, as the CLI tests build them

const u32 = (v) => { const b = Buffer.alloc(4); b.writeUInt32LE(v); return b; };
const u64 = (v) => { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(v)); return b; };
const f32 = (v) => { const b = Buffer.alloc(4); b.writeFloatLE(v); return b; };
const gstr = (t) => { const b = Buffer.from(t); return Buffer.concat([u64(b.length), b]); };
const numel = (shape) => shape.reduce((a, b) => a * b, 1);

/** A GGUF v3 header (metadata [key, 'u32'|'f32'|'str', value], tensor infos [name, dims, [ggml id,
 * block, bytes per block]]) and the length of the whole file. */
function gguf(kvs, tensors) {
  const parts = [Buffer.from('GGUF'), u32(3), u64(tensors.length), u64(kvs.length)];
  for (const [k, t, v] of kvs) parts.push(gstr(k), u32({ u32: 4, f32: 6, str: 8 }[t]), { u32, f32, str: gstr }[t](v));
  const pad = (x) => Math.ceil(x / 32) * 32;
  let offset = 0;
  let end = 0;
  for (const [name, dims, [id, block, size]] of tensors) {
    parts.push(gstr(name), u32(dims.length), ...dims.map(u64), u32(id), u64(offset));
    end = offset + (numel(dims) / block) * size;
    offset = pad(end);
  }
  const header = Buffer.concat(parts);
  return { header, size: pad(header.length) + end };
}

/** The Llama-shaped Q4_K_M GGUF of crates/memwall-cli/tests/artifacts.rs (`tiny_gguf`), with extra
 * metadata `extra`. */
function tinyGguf(extra = []) {
  const [F32, Q4K, Q6K] = [[0, 1, 4], [12, 256, 144], [14, 256, 210]];
  const tensors = [['token_embd.weight', [256, 1024], Q4K], ['output_norm.weight', [256], F32], ['output.weight', [256, 1024], Q6K]];
  for (let i = 0; i < 2; i++) {
    for (const [n, dims, t] of [['attn_norm', [256], F32], ['attn_q', [256, 256], Q4K], ['attn_k', [256, 64], Q4K], ['attn_v', [256, 64], Q6K],
      ['attn_output', [256, 256], Q4K], ['ffn_norm', [256], F32], ['ffn_gate', [256, 512], Q4K], ['ffn_up', [256, 512], Q4K], ['ffn_down', [512, 256], Q6K]]) {
      tensors.push([`blk.${i}.${n}.weight`, dims, t]);
    }
  }
  return gguf([['general.architecture', 'str', 'llama'], ['general.file_type', 'u32', 15], ['llama.block_count', 'u32', 2],
    ['llama.context_length', 'u32', 4096], ['llama.embedding_length', 'u32', 256], ['llama.feed_forward_length', 'u32', 512],
    ['llama.attention.head_count', 'u32', 8], ['llama.attention.head_count_kv', 'u32', 2],
    ['llama.attention.layer_norm_rms_epsilon', 'f32', 1e-5], ...extra], tensors);
}

/** A safetensors header ([name, dtype, shape]) and the length of the whole file. */
function safetensors(tensors) {
  const header = {};
  let offset = 0;
  for (const [name, dtype, shape] of tensors) {
    const n = numel(shape) * { F32: 4, BF16: 2, F16: 2 }[dtype];
    header[name] = { dtype, shape, data_offsets: [offset, offset + n] };
    offset += n;
  }
  let text = JSON.stringify(header);
  while (text.length % 8) text += ' ';
  const head = Buffer.concat([u64(text.length), Buffer.from(text)]);
  return { header: head, size: head.length + offset };
}

const TINY_LLAMA = '{"architectures":["LlamaForCausalLM"],"model_type":"llama","vocab_size":1000,"hidden_size":256,"intermediate_size":512,"num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":2,"max_position_embeddings":4096,"tie_word_embeddings":false,"torch_dtype":"bfloat16"}';

/** config.json, model.safetensors.index.json and four bf16 shards, as transformers saves the tiny Llama. */
function tinyCheckpoint() {
  const layer = (i) => [['self_attn.q_proj.weight', [256, 256]], ['self_attn.k_proj.weight', [64, 256]], ['self_attn.v_proj.weight', [64, 256]],
    ['self_attn.o_proj.weight', [256, 256]], ['mlp.gate_proj.weight', [512, 256]], ['mlp.up_proj.weight', [512, 256]],
    ['mlp.down_proj.weight', [256, 512]], ['input_layernorm.weight', [256]], ['post_attention_layernorm.weight', [256]]]
    .map(([n, shape]) => [`model.layers.${i}.${n}`, 'BF16', shape]);
  const shards = [[['model.embed_tokens.weight', 'BF16', [1000, 256]]], layer(0), layer(1),
    [['model.norm.weight', 'BF16', [256]], ['lm_head.weight', 'BF16', [1000, 256]]]];
  const files = [];
  const weightMap = {};
  let total = 0;
  shards.forEach((tensors, i) => {
    const name = `model-0000${i + 1}-of-00004.safetensors`;
    const f = safetensors(tensors);
    total += f.size - f.header.length;
    for (const [t] of tensors) weightMap[t] = name;
    files.push({ name, ...f });
  });
  const text = (name, t) => ({ name, header: Buffer.from(t), size: Buffer.byteLength(t) });
  return [text('config.json', TINY_LLAMA),
    text('model.safetensors.index.json', JSON.stringify({ metadata: { total_size: total }, weight_map: weightMap })), ...files];
}

/** Writes the files (header, then the file extended to its real size) into a fresh directory. */
function writeFiles(files) {
  const dir = mkdtempSync(join(tmpdir(), 'memwall-web-'));
  for (const f of files) {
    writeFileSync(join(dir, f.name), f.header);
    truncateSync(join(dir, f.name), f.size);
  }
  return dir;
}

/** Drops the files on the page's drop zone, as a file manager does (each of its real size). */
async function drop(page, files) {
  const dt = await page.evaluateHandle((fs) => {
    const t = new DataTransfer();
    for (const f of fs) {
      const head = Uint8Array.from(atob(f.b64), (c) => c.charCodeAt(0));
      t.items.add(new File([head, new Uint8Array(f.size - head.length)], f.name));
    }
    return t;
  }, files.map((f) => ({ name: f.name, size: f.size, b64: f.header.toString('base64') })));
  await page.dispatchEvent('#model-box', 'drop', { dataTransfer: dt });
}

/** What the page says it read is `memwall inspect FILE --json`, number for number. */
async function summaryIsInspect(page, name, cwd) {
  const want = cli(['inspect', name, '--json'], cwd);
  await page.waitForFunction(() => window.memwallInspect);
  assert.deepEqual(await page.evaluate(() => window.memwallInspect), want);
  const shown = await page.$$eval('[data-ik]', (els) => els.map((e) => ({ k: e.dataset.ik, v: e.dataset.v })));
  assert.ok(shown.length >= 3, `only ${shown.length} numbers in the summary`);
  for (const { k, v } of shown) assert.equal(Number(v), get(want, k), `${k} in the summary`);
  return want;
}

test('dropped files: a GGUF header and a safetensors checkpoint are the models the CLI reads beside them', async () => {
  const dirs = [];
  try {
    // a GGUF, dropped: only its first bytes are read, and the report is the binary's in its directory
    const ggufFile = { name: 'tiny-Q4_K_M.gguf', ...tinyGguf() };
    const ggufDir = writeFiles([ggufFile]);
    dirs.push(ggufDir);
    const page = await open('#mode=infer&prompt=64');
    await drop(page, [ggufFile]);
    await settled(page, `infer --model ${ggufFile.name} --prompt 64`);
    assert.equal(await page.textContent('#command'), `memwall infer --model ${ggufFile.name} --prompt 64 --json`);
    await sameAsCli(page, ['infer', '--model', ggufFile.name, '--prompt', '64'], { cwd: ggufDir });
    const inspect = await summaryIsInspect(page, ggufFile.name, ggufDir);
    assert.equal(inspect.checkpoint.storage, 'GGUF, mostly Q4_K');
    assert.match(await page.textContent('#file-summary'), /GGUF, mostly Q4_K.*--weights gguf-q4_k_m/s);
    // a 1 MiB file: read whole in one slice, of its real size
    assert.equal(Number(await page.getAttribute(`#file-list li[data-name="${ggufFile.name}"]`, 'data-read')), ggufFile.size);
    // the link names the file; opened elsewhere, it asks for the file again
    assert.match(page.url(), /#mode=infer&files=tiny-Q4_K_M\.gguf&prompt=64$/);
    assert.equal(await page.isVisible('#link-note'), true);
    const linked = await context.newPage();
    await linked.goto(page.url());
    await linked.waitForSelector('body[data-state="need-files"]');
    assert.equal(await linked.textContent('#command'), `memwall infer --model ${ggufFile.name} --prompt 64 --json`);
    assert.match(await linked.textContent('#files-note'), /made from dropped files \(tiny-Q4_K_M\.gguf\).*cannot carry files/);
    await linked.screenshot({ path: join(shots, 'files-link.png'), fullPage: true });
    await linked.close();
    await page.screenshot({ path: join(shots, 'dropped-gguf.png'), fullPage: true });

    // a safetensors checkpoint: config.json, its index and the shards' headers
    const ckpt = tinyCheckpoint();
    const ckptDir = writeFiles(ckpt);
    dirs.push(ckptDir);
    const index = 'model.safetensors.index.json';
    await drop(page, ckpt);
    await settled(page, `infer --model ${index} --prompt 64`);
    await sameAsCli(page, ['infer', '--model', index, '--prompt', '64'], { cwd: ckptDir });
    await summaryIsInspect(page, index, ckptDir);
    for (const f of ckpt.filter((x) => x.name.endsWith('.safetensors'))) {
      // 8 + N bytes of each shard are all it needs; the first read of 1 MiB covers the small ones whole
      assert.equal(Number(await page.getAttribute(`#file-list li[data-name="${f.name}"]`, 'data-read')), Math.min(f.size, 1 << 20), f.name);
    }
    await page.click('#mode-train');
    await settled(page, `train --model ${index}`);
    await sameAsCli(page, ['train', '--model', index], { cwd: ckptDir });
    await page.screenshot({ path: join(shots, 'dropped-safetensors.png'), fullPage: true });

    // the index without its config: the CLI's error, with the page's hint
    await drop(page, [ckpt[1]]);
    await page.waitForSelector('#files-error');
    await page.waitForFunction(() => document.body.dataset.state === 'error');
    assert.match(await page.textContent('#error'), /^error: safetensors index `model\.safetensors\.index\.json` has no config\.json beside it\nhint: .*give the model's config\.json too/);
    assert.match(await page.textContent('#files-error'), /no config\.json beside it/);
    assert.deepEqual(page.problems, []);
    await page.close();

    // a GGUF whose metadata outgrows the first 16 MiB read, picked: the page reads what the CLI asks for
    const template = 'x'.repeat(17 << 20);
    const big = { name: 'big.gguf', ...tinyGguf([['tokenizer.chat_template', 'str', template]]) };
    const bigDir = writeFiles([big]);
    dirs.push(bigDir);
    const picker = await open('#mode=infer&prompt=64');
    await picker.check('input[name=source][value=files]');
    await picker.setInputFiles('#file-input', join(bigDir, big.name));
    await settled(picker, `infer --model ${big.name} --prompt 64`);
    await sameAsCli(picker, ['infer', '--model', big.name, '--prompt', '64'], { cwd: bigDir });
    await summaryIsInspect(picker, big.name, bigDir);
    const read = Number(await picker.getAttribute(`#file-list li[data-name="${big.name}"]`, 'data-read'));
    assert.ok(read > big.header.length - 4096 && read <= big.size && read > 16 << 20, `read ${read} of ${big.size}`);
    assert.deepEqual(picker.problems, []);
    await picker.close();
  } finally {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  }
});
