// Runs the memwall CLI (WebAssembly) off the page's thread: {id, args, config, files} in, {id, text}
// out, text being {"ok": report} or {"error": [lines]} (with "more" when a dropped file's first
// bytes were too few) as crates/memwall-wasm returns it. files: [{name, size, prefix}], the
// dropped model files with the first bytes read of each.
import init, { run, run_with_config, run_with_files } from './pkg/memwall_wasm.js';

/** memwall over dropped files: names, sizes, prefix lengths, and the prefixes one after another. */
function runWithFiles(args, files) {
  const bytes = new Uint8Array(files.reduce((n, f) => n + f.prefix.length, 0));
  let at = 0;
  for (const f of files) { bytes.set(f.prefix, at); at += f.prefix.length; }
  return run_with_files(args, files.map((f) => f.name), files.map((f) => f.size), files.map((f) => f.prefix.length), bytes);
}

const ready = init();

onmessage = async (e) => {
  const { id, args, config, files } = e.data;
  await ready;
  let text;
  try {
    if (files != null) text = runWithFiles(args, files);
    else text = config == null ? run(args) : run_with_config(args, config);
  } catch (err) {
    // a panic in the module: report it; the page starts a fresh worker on the next error
    text = JSON.stringify({ error: [`error: the WebAssembly module failed: ${err}`] });
    setTimeout(() => { throw err; });
  }
  postMessage({ id, text });
};
