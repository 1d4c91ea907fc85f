// Runs the memwall CLI (WebAssembly) off the page's thread: {id, args, config} in, {id, text} out,
// text being {"ok": report} or {"error": [lines]} as crates/memwall-wasm returns it.
import init, { run, run_with_config } from './pkg/memwall_wasm.js';

const ready = init();

onmessage = async (e) => {
  const { id, args, config } = e.data;
  await ready;
  let text;
  try {
    text = config == null ? run(args) : run_with_config(args, config);
  } catch (err) {
    // a panic in the module: report it; the page starts a fresh worker on the next error
    text = JSON.stringify({ error: [`error: the WebAssembly module failed: ${err}`] });
    setTimeout(() => { throw err; });
  }
  postMessage({ id, text });
};
