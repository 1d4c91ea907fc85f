//! Real model artifacts in: model directories as `huggingface-cli download` leaves them, the
//! Hugging Face cache layout, safetensors files and indexes, GGUF files (all built here as
//! header-only sparse files of their real size), catalogue variants, and quantised checkpoints
//! sized from their quantization_config and held to published checkpoint sizes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A scratch directory removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let p =
            std::env::temp_dir().join(format!("memwall-artifacts-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run_env(args: &[&str], env: &[(&str, &Path)]) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_memwall"));
    c.args(args).current_dir(repo());
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("run memwall");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json_of(args: &[&str], env: &[(&str, &Path)]) -> Value {
    let mut a = args.to_vec();
    a.extend(["--format", "json"]);
    let (code, out, err) = run_env(&a, env);
    assert_eq!(code, 0, "{args:?}\n{out}{err}");
    serde_json::from_str(&out).unwrap()
}

/// Exit 2, `error:` first, one `hint:` last, no panic; returns stderr.
fn refused(args: &[&str], needles: &[&str]) -> String {
    let (code, out, err) = run_env(args, &[]);
    assert_eq!(code, 2, "{args:?}: exit {code}\n{out}{err}");
    assert!(out.is_empty() && !err.contains("panicked"), "{err}");
    assert!(err.starts_with("error: "), "{err}");
    assert_eq!(
        err.lines().filter(|l| l.starts_with("hint: ")).count(),
        1,
        "{err}"
    );
    assert!(err.lines().last().unwrap().starts_with("hint: "), "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` not in\n{err}");
    }
    err
}

fn dtype_size(d: &str) -> u64 {
    match d {
        "F32" | "I32" => 4,
        "BF16" | "F16" => 2,
        _ => 1,
    }
}

/// Writes a header-only safetensors file of its real size (the data is a hole); returns the
/// tensor bytes.
fn write_safetensors(path: &Path, tensors: &[(String, &str, Vec<u64>)]) -> u64 {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, dtype, shape) in tensors {
        let n = shape.iter().product::<u64>() * dtype_size(dtype);
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}),
        );
        offset += n;
    }
    let mut text = serde_json::to_string(&Value::Object(header)).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(text.as_bytes());
    std::fs::write(path, &bytes).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(bytes.len() as u64 + offset).unwrap();
    offset
}

const TINY_LLAMA: &str = r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama","vocab_size":1000,"hidden_size":256,"intermediate_size":512,"num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":2,"max_position_embeddings":4096,"tie_word_embeddings":false,"torch_dtype":"bfloat16"}"#;

/// The tensors transformers saves for [`TINY_LLAMA`], layer by layer.
fn tiny_llama_tensors(dtype: &'static str) -> Vec<Vec<(String, &'static str, Vec<u64>)>> {
    let mut shards = vec![vec![(
        "model.embed_tokens.weight".to_string(),
        dtype,
        vec![1000, 256],
    )]];
    for i in 0..2 {
        let p = format!("model.layers.{i}");
        let mut t = Vec::new();
        for (n, shape) in [
            ("self_attn.q_proj.weight", vec![256, 256]),
            ("self_attn.k_proj.weight", vec![64, 256]),
            ("self_attn.v_proj.weight", vec![64, 256]),
            ("self_attn.o_proj.weight", vec![256, 256]),
            ("mlp.gate_proj.weight", vec![512, 256]),
            ("mlp.up_proj.weight", vec![512, 256]),
            ("mlp.down_proj.weight", vec![256, 512]),
            ("input_layernorm.weight", vec![256]),
            ("post_attention_layernorm.weight", vec![256]),
        ] {
            t.push((format!("{p}.{n}"), dtype, shape));
        }
        shards.push(t);
    }
    shards.push(vec![
        ("model.norm.weight".to_string(), dtype, vec![256]),
        ("lm_head.weight".to_string(), dtype, vec![1000, 256]),
    ]);
    shards
}

/// A directory as `huggingface-cli download` leaves a sharded checkpoint: config.json, the
/// index and its shards. Returns the tensor bytes.
fn write_sharded(dir: &Path, config: &str, shards: &[Vec<(String, &str, Vec<u64>)>]) -> u64 {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), config).unwrap();
    let n = shards.len();
    let mut map = serde_json::Map::new();
    let mut total = 0;
    for (i, tensors) in shards.iter().enumerate() {
        let name = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
        total += write_safetensors(&dir.join(&name), tensors);
        for (t, _, _) in tensors {
            map.insert(t.clone(), json!(name));
        }
    }
    let index = json!({"metadata": {"total_size": total}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    total
}

fn weights(v: &Value) -> u64 {
    v["weights_bytes"].as_u64().unwrap()
}

#[test]
fn a_downloaded_directory_resolves_with_exact_tensor_bytes() {
    let s = Scratch::new("dir");
    let total = write_sharded(&s.0, TINY_LLAMA, &tiny_llama_tensors("BF16"));
    let d = s.0.to_str().unwrap();
    let v = json_of(
        &["infer", "-m", d, "--prompt", "64", "--new-tokens", "4"],
        &[],
    );
    assert_eq!(weights(&v), total);
    assert!(v["model"]["origin"]
        .as_str()
        .unwrap()
        .contains("4 shard(s)"));
    let from = v["weights_from"].as_str().unwrap();
    assert!(
        from.starts_with("checkpoint headers (4 safetensors file(s), BF16"),
        "{from}"
    );
    assert_eq!(v["workload"]["weights"], "bf16");
    // the same through the index, and through one shard with its config beside it
    let idx = s.0.join("model.safetensors.index.json");
    let v = json_of(
        &["infer", "-m", idx.to_str().unwrap(), "--prompt", "64"],
        &[],
    );
    assert_eq!(weights(&v), total);
    // an explicit --weights overrides the headers and says so
    let v = json_of(
        &["infer", "-m", d, "--prompt", "64", "--weights", "nf4"],
        &[],
    );
    let from = v["weights_from"].as_str().unwrap();
    assert!(
        from.starts_with("--weights nf4 (overrides the checkpoint's BF16"),
        "{from}"
    );
    assert!(weights(&v) < total);
    // serve: the exact bytes split over the ranks
    let v = json_of(&["serve", "-m", d, "--gpu", "l4"], &[]);
    assert!(v["weights_from"].as_str().unwrap().contains("exactly"));
}

#[test]
fn one_safetensors_file_needs_its_config_and_all_layers() {
    let s = Scratch::new("single");
    std::fs::write(s.0.join("config.json"), TINY_LLAMA).unwrap();
    let all: Vec<_> = tiny_llama_tensors("BF16").into_iter().flatten().collect();
    let total = write_safetensors(&s.0.join("model.safetensors"), &all);
    let f = s.0.join("model.safetensors");
    let v = json_of(&["infer", "-m", f.to_str().unwrap(), "--prompt", "64"], &[]);
    assert_eq!(weights(&v), total);
    // a layer missing: the first mismatch is named
    let partial: Vec<_> = all
        .iter()
        .filter(|(n, _, _)| !n.starts_with("model.layers.1."))
        .cloned()
        .collect();
    write_safetensors(&f, &partial);
    refused(
        &["infer", "-m", f.to_str().unwrap()],
        &["no tensors for layer 1", "hint: "],
    );
    // a wrong shape: the layer's parameter count is named
    let mut wrong = all.clone();
    wrong[1].2 = vec![128, 256];
    write_safetensors(&f, &wrong);
    refused(&["infer", "-m", f.to_str().unwrap()], &["layer 0 stores"]);
    // no config.json beside it
    std::fs::remove_file(s.0.join("config.json")).unwrap();
    refused(
        &["infer", "-m", f.to_str().unwrap()],
        &["no config.json beside it"],
    );
    refused(&["infer", "-m", s.0.to_str().unwrap()], &["no config.json"]);
}

#[test]
fn the_hugging_face_cache_layout_resolves_offline() {
    let s = Scratch::new("cache");
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let repo_dir = s.0.join("models--my-org--tiny-llama");
    let snap = repo_dir.join("snapshots").join(commit);
    let blobs = repo_dir.join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let total = write_sharded(&blobs, TINY_LLAMA, &tiny_llama_tensors("BF16"));
    // snapshot files are symbolic links into blobs/, as huggingface_hub makes them
    std::fs::create_dir_all(&snap).unwrap();
    for e in std::fs::read_dir(&blobs).unwrap() {
        let e = e.unwrap();
        std::os::unix::fs::symlink(
            Path::new("../../blobs").join(e.file_name()),
            snap.join(e.file_name()),
        )
        .unwrap();
    }
    std::fs::create_dir_all(repo_dir.join("refs")).unwrap();
    std::fs::write(repo_dir.join("refs/main"), commit).unwrap();
    let env = [("HF_HUB_CACHE", s.0.as_path())];
    for spec in [
        "my-org/tiny-llama".to_string(),
        "my-org/tiny-llama@main".to_string(),
        format!("my-org/tiny-llama@{commit}"),
    ] {
        let v = json_of(&["infer", "-m", &spec, "--prompt", "64"], &env);
        assert_eq!(weights(&v), total, "{spec}");
        let origin = v["model"]["origin"].as_str().unwrap();
        assert!(
            origin.starts_with("Hugging Face cache (my-org/tiny-llama@0123456789ab)"),
            "{origin}"
        );
        assert_eq!(v["model"]["hf_repo"], "my-org/tiny-llama");
    }
    // HF_HOME/hub is the cache too
    let home = Scratch::new("hfhome");
    std::fs::create_dir_all(home.0.join("hub")).unwrap();
    std::fs::rename(&repo_dir, home.0.join("hub/models--my-org--tiny-llama")).unwrap();
    let v = json_of(
        &["infer", "-m", "my-org/tiny-llama", "--prompt", "64"],
        &[("HF_HOME", home.0.as_path())],
    );
    assert_eq!(weights(&v), total);
    let (code, _, err) = run_env(
        &["infer", "-m", "my-org/tiny-llama@v2"],
        &[("HF_HOME", home.0.as_path())],
    );
    assert_eq!(code, 2);
    assert!(
        err.contains("not at revision `v2`") && err.contains("hint: "),
        "{err}"
    );
}

#[test]
fn instruct_variants_resolve_to_their_base_and_say_so() {
    for (repo_id, base) in [
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ] {
        let v = json_of(&["infer", "-m", repo_id], &[]);
        let origin = v["model"]["origin"].as_str().unwrap();
        assert!(
            origin.contains(&format!("has the architecture of {base}")),
            "{origin}"
        );
        assert_eq!(v["model"]["hf_repo"], repo_id);
    }
    // the base repo id itself is a catalogue entry
    let v = json_of(&["infer", "-m", "meta-llama/Llama-3.1-8B"], &[]);
    assert_eq!(v["model"]["label"], "llama-3.1-8b");
}

// ---------------------------------------------------------------- GGUF

/// A GGUF v3 writer (little-endian, as gguf-py's `GGUFWriter`).
struct Gguf {
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<(String, Vec<u64>, u32, u64, u64)>,
}

fn gstr(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

impl Gguf {
    fn new() -> Gguf {
        Gguf {
            kv: Vec::new(),
            n_kv: 0,
            tensors: Vec::new(),
        }
    }
    fn u32(mut self, k: &str, v: u32) -> Gguf {
        gstr(&mut self.kv, k);
        self.kv.extend_from_slice(&4u32.to_le_bytes());
        self.kv.extend_from_slice(&v.to_le_bytes());
        self.n_kv += 1;
        self
    }
    fn f32(mut self, k: &str, v: f32) -> Gguf {
        gstr(&mut self.kv, k);
        self.kv.extend_from_slice(&6u32.to_le_bytes());
        self.kv.extend_from_slice(&v.to_le_bytes());
        self.n_kv += 1;
        self
    }
    fn str(mut self, k: &str, v: &str) -> Gguf {
        gstr(&mut self.kv, k);
        self.kv.extend_from_slice(&8u32.to_le_bytes());
        gstr(&mut self.kv, v);
        self.n_kv += 1;
        self
    }
    /// `ty`: ggml type id with its (block, bytes per block).
    fn tensor(mut self, name: &str, dims: &[u64], ty: (u32, u64, u64)) -> Gguf {
        self.tensors
            .push((name.into(), dims.to_vec(), ty.0, ty.1, ty.2));
        self
    }
    /// Writes the header, then extends the file to its real size; returns the tensor bytes.
    fn write(&self, path: &Path) -> u64 {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&self.n_kv.to_le_bytes());
        b.extend_from_slice(&self.kv);
        let pad = |x: u64| x.div_ceil(32) * 32;
        let (mut offset, mut end, mut total) = (0u64, 0u64, 0u64);
        for (name, dims, ty, block, size) in &self.tensors {
            gstr(&mut b, name);
            b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend_from_slice(&offset.to_le_bytes());
            let n = dims.iter().product::<u64>() / block * size;
            total += n;
            end = offset + n;
            offset = pad(end);
        }
        let data = pad(b.len() as u64);
        std::fs::write(path, &b).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        f.set_len(data + end).unwrap();
        total
    }
}

const F32: (u32, u64, u64) = (0, 1, 4);
const Q4K: (u32, u64, u64) = (12, 256, 144);
const Q6K: (u32, u64, u64) = (14, 256, 210);

/// A Llama-shaped GGUF with real tensor infos in a Q4_K_M mix.
fn tiny_gguf() -> Gguf {
    let mut g = Gguf::new()
        .str("general.architecture", "llama")
        .u32("general.file_type", 15)
        .u32("llama.block_count", 2)
        .u32("llama.context_length", 4096)
        .u32("llama.embedding_length", 256)
        .u32("llama.feed_forward_length", 512)
        .u32("llama.attention.head_count", 8)
        .u32("llama.attention.head_count_kv", 2)
        .f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        .tensor("token_embd.weight", &[256, 1024], Q4K)
        .tensor("output_norm.weight", &[256], F32)
        .tensor("output.weight", &[256, 1024], Q6K);
    for i in 0..2 {
        for (n, dims, t) in [
            ("attn_norm", vec![256], F32),
            ("attn_q", vec![256, 256], Q4K),
            ("attn_k", vec![256, 64], Q4K),
            ("attn_v", vec![256, 64], Q6K),
            ("attn_output", vec![256, 256], Q4K),
            ("ffn_norm", vec![256], F32),
            ("ffn_gate", vec![256, 512], Q4K),
            ("ffn_up", vec![256, 512], Q4K),
            ("ffn_down", vec![512, 256], Q6K),
        ] {
            g = g.tensor(&format!("blk.{i}.{n}.weight"), &dims, t);
        }
    }
    g
}

#[test]
fn a_gguf_file_gives_its_own_tensor_bytes() {
    let s = Scratch::new("gguf");
    let f = s.0.join("tiny-Q4_K_M.gguf");
    let total = tiny_gguf().write(&f);
    let v = json_of(&["infer", "-m", f.to_str().unwrap(), "--prompt", "64"], &[]);
    assert_eq!(weights(&v), total);
    assert_eq!(v["workload"]["weights"], json!({"gguf": "q4_k_m"}));
    assert!(v["weights_from"]
        .as_str()
        .unwrap()
        .contains("GGUF, mostly Q4_K"));
    // a directory holding only the .gguf resolves too
    let v = json_of(
        &["infer", "-m", s.0.to_str().unwrap(), "--prompt", "64"],
        &[],
    );
    assert_eq!(weights(&v), total);
    // the preset table stays for what-ifs
    let v = json_of(
        &["infer", "-m", "llama-3.1-8b", "--weights", "gguf-q4_k_m"],
        &[],
    );
    assert!(weights(&v) > 4 << 30);
}

// ---------------------------------------------------------------- malformed artifacts

#[test]
fn every_malformed_artifact_exits_2_naming_the_field_or_offset() {
    let s = Scratch::new("bad");
    std::fs::write(s.0.join("config.json"), TINY_LLAMA).unwrap();
    let f = s.0.join("model.safetensors");
    let p = f.to_str().unwrap();
    // header length past the end of the file
    std::fs::write(&f, 1000u64.to_le_bytes()).unwrap();
    refused(&["infer", "-m", p], &["safetensors"]);
    // header length beyond the limit, whatever the file claims
    let mut b = (1u64 << 40).to_le_bytes().to_vec();
    b.extend_from_slice(b"{}");
    std::fs::write(&f, &b).unwrap();
    refused(&["infer", "-m", p], &["safetensors"]);
    // shorter than 8 bytes
    std::fs::write(&f, b"abc").unwrap();
    refused(&["infer", "-m", p], &["safetensors"]);
    // not JSON
    let mut b = 8u64.to_le_bytes().to_vec();
    b.extend_from_slice(b"not json");
    std::fs::write(&f, &b).unwrap();
    refused(&["infer", "-m", p], &["safetensors"]);
    // offsets past the end of the file
    let mut text = r#"{"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}}"#.to_string();
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut b = (text.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(text.as_bytes());
    std::fs::write(&f, &b).unwrap();
    refused(&["infer", "-m", p], &["safetensors"]);
    std::fs::remove_file(&f).unwrap();
    // an index naming a shard that is not there
    let idx = s.0.join("model.safetensors.index.json");
    std::fs::write(
        &idx,
        r#"{"weight_map":{"model.embed_tokens.weight":"model-00001-of-00002.safetensors"}}"#,
    )
    .unwrap();
    refused(&["infer", "-m", s.0.to_str().unwrap()], &["is missing"]);
    // an index that escapes the directory
    std::fs::write(&idx, r#"{"weight_map":{"a":"../evil.safetensors"}}"#).unwrap();
    refused(&["infer", "-m", s.0.to_str().unwrap()], &["index"]);
    std::fs::remove_file(&idx).unwrap();
    // GGUF: bad magic, truncated header, a huge tensor count
    let g = s.0.join("m.gguf");
    std::fs::write(&g, b"GGUX\x03\0\0\0").unwrap();
    refused(&["infer", "-m", g.to_str().unwrap()], &["GGUF"]);
    let total = tiny_gguf().write(&g);
    assert!(total > 0);
    let bytes = std::fs::read(&g).unwrap();
    std::fs::write(&g, &bytes[..200]).unwrap();
    refused(&["infer", "-m", g.to_str().unwrap()], &["GGUF"]);
    let mut b = b"GGUF\x03\0\0\0".to_vec();
    b.extend_from_slice(&u64::MAX.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    std::fs::write(&g, &b).unwrap();
    refused(&["infer", "-m", g.to_str().unwrap()], &["GGUF"]);
}

// ---------------------------------------------------------------- quantised checkpoints

/// A catalogued config with `quantization_config` added, written as `dir/config.json`.
fn quantised(dir: &Path, catalogue_file: &str, q: Value) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("data/models").join(catalogue_file)).unwrap();
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v["quantization_config"] = q;
    let p = dir.join("config.json");
    std::fs::write(&p, v.to_string()).unwrap();
    p
}

/// Mixtral 8x7B weights from each quantization_config (no flags) against the published
/// checkpoints' safetensors totals (the sum of the shard sizes the Hub lists, in GB = 1e9
/// bytes, 3 significant digits each):
/// - GPTQ int4 per column (`group_size: -1`, `desc_act: true`): TheBloke/Mixtral-8x7B-v0.1-GPTQ,
///   branch main (commit 7d1eb57; quantize_config.json bits 4, group_size -1):
///   model.safetensors 23.8 GB.
/// - AWQ int4 g128 GEMM: casperhansen/mixtral-instruct-awq (commit 0a89813):
///   9.97 + 9.98 + 4.7 = 24.65 GB.
/// - bitsandbytes NF4 with double quantisation: cmarkea/Mixtral-8x7B-Instruct-v0.1-4bit
///   (commit 8ad088b; config.json nf4, bnb_4bit_use_double_quant true, bfloat16):
///   4.99 + 4.98 + 5 + 5 + 4.52 = 24.49 GB.
/// - fp8 per tensor (AutoFP8, `quant_method: fp8`): neuralmagic/Mixtral-8x7B-Instruct-v0.1-FP8
///   (main; shards 1–8: 4.95, 5, 4.98, 5, 5, 4.98, 5, 4.98; shards 9–10 from its copy
///   soprasteria/Mixtral-8x7B-Instruct-v0.1-FP8: 5, 2.07) = 46.96 GB.
///
/// No published bitsandbytes int8 or GPTQ g128 Mixtral total was found with its config, so
/// none is held here.
#[test]
fn mixtral_quantised_weights_match_published_checkpoints() {
    let s = Scratch::new("mixtral");
    let cases = [
        (
            json!({"quant_method":"gptq","bits":4,"group_size":-1,"desc_act":true,"sym":true}),
            23.8e9,
            "gptq-int4-per-column",
        ),
        (
            json!({"quant_method":"awq","bits":4,"group_size":128,"version":"gemm","zero_point":true}),
            24.65e9,
            "awq-int4-g128",
        ),
        (
            json!({"quant_method":"bitsandbytes","load_in_4bit":true,"bnb_4bit_quant_type":"nf4","bnb_4bit_use_double_quant":true}),
            24.49e9,
            "nf4-dq",
        ),
        (
            json!({"quant_method":"fp8","activation_scheme":"static"}),
            46.96e9,
            "fp8",
        ),
    ];
    for (q, published, name) in cases {
        let cfg = quantised(&s.0, "mistralai/Mixtral-8x7B-v0.1.json", q);
        let v = json_of(
            &[
                "infer",
                "-m",
                cfg.to_str().unwrap(),
                "--prompt",
                "16",
                "--new-tokens",
                "1",
            ],
            &[],
        );
        let from = v["weights_from"].as_str().unwrap();
        assert!(from.contains(&format!("→ {name}")), "{from}");
        let w = weights(&v) as f64;
        let err = (w - published) / published;
        assert!(
            err.abs() < 0.01,
            "{name}: {w} vs {published} ({:.2}%)",
            err * 100.0
        );
        assert!(
            from.starts_with("the config's quantization_config"),
            "{from}"
        );
    }
    // explicit formats quantise the experts too (they were left in bf16: 85 GiB)
    for f in ["gptq-int4-g128", "awq-int4-g128", "nf4", "fp8"] {
        let v = json_of(
            &[
                "infer",
                "-m",
                "mixtral-8x7b",
                "--weights",
                f,
                "--prompt",
                "16",
            ],
            &[],
        );
        assert!(weights(&v) < 50 << 30, "{f}: {}", weights(&v));
    }
}

#[test]
fn an_awq_config_is_sized_without_flags() {
    let s = Scratch::new("awq");
    let cfg = quantised(
        &s.0,
        "Qwen/Qwen2.5-14B.json",
        json!({"quant_method":"awq","bits":4,"group_size":128,"version":"gemm","zero_point":true}),
    );
    let v = json_of(
        &["infer", "-m", cfg.to_str().unwrap(), "--prompt", "16"],
        &[],
    );
    let gib = weights(&v) as f64 / (1u64 << 30) as f64;
    // bf16 would be 27.5 GiB; int4 g128 linears + bf16 embeddings and head ≈ 9.3 GiB
    assert!((8.5..10.0).contains(&gib), "{gib}");
    // serve sizes it too, and names the config
    let v = json_of(&["serve", "-m", cfg.to_str().unwrap(), "--gpu", "l4"], &[]);
    assert!(v["weights_from"]
        .as_str()
        .unwrap()
        .contains("awq int4 g128"));
}

#[test]
fn deepseek_v3_serves_on_eight_h200s_from_its_fp8_config() {
    let v = json_of(
        &[
            "serve",
            "-m",
            "deepseek-v3",
            "--gpu",
            "h200-sxm",
            "--tp",
            "8",
        ],
        &[],
    );
    assert!(v["kv_tokens"].as_u64().unwrap() > 100_000, "{v}");
    assert_eq!(v["fits_max_model_len"], true);
    assert!(v["model"]["origin"]
        .as_str()
        .unwrap()
        .contains("huggingface.co/deepseek-ai/DeepSeek-V3"));
    assert!(v["weights_from"]
        .as_str()
        .unwrap()
        .contains("fp8 (128×128 blocks)"));
    let per_rank = v["config"]["weights_bytes_per_rank"].as_u64().unwrap() as f64 / 1e9;
    // 671B parameters, ~1 byte each, over 8 ranks
    assert!((80.0..90.0).contains(&per_rank), "{per_rank}");
    // --weights bf16 is the what-if that does not fit
    let v = json_of(
        &[
            "serve",
            "-m",
            "deepseek-v3",
            "--gpu",
            "h200-sxm",
            "--tp",
            "8",
            "--weights",
            "bf16",
        ],
        &[],
    );
    assert_eq!(v["kv_tokens"], 0);
}

#[test]
fn serve_quantization_follows_vllm() {
    // online fp8 of a bf16 checkpoint, named as vLLM 0.33 names it
    let v = json_of(
        &[
            "serve",
            "-m",
            "llama-3.1-8b",
            "--quantization",
            "fp8_per_tensor",
        ],
        &[],
    );
    assert!(v["vllm_serve_command"]
        .as_str()
        .unwrap()
        .contains("--quantization fp8_per_tensor"));
    let bf16 = json_of(&["serve", "-m", "llama-3.1-8b"], &[]);
    assert!(
        v["config"]["weights_bytes_per_rank"].as_u64()
            < bf16["config"]["weights_bytes_per_rank"].as_u64()
    );
    refused(
        &["serve", "-m", "llama-3.1-8b", "--quantization", "fp8"],
        &["--quantization", "fp8_per_tensor"],
    );
    refused(
        &["serve", "-m", "deepseek-v3", "--quantization", "awq"],
        &["quantised with fp8"],
    );
    let s = Scratch::new("bnb");
    let cfg = quantised(
        &s.0,
        "mistralai/Mixtral-8x7B-v0.1.json",
        json!({"quant_method":"bitsandbytes","load_in_4bit":true,"bnb_4bit_quant_type":"nf4"}),
    );
    refused(&["serve", "-m", cfg.to_str().unwrap()], &["bitsandbytes"]);
    // kv-cache dtypes vLLM accepts
    let v = json_of(
        &[
            "serve",
            "-m",
            "llama-3.1-8b",
            "--kv-cache-dtype",
            "bfloat16",
        ],
        &[],
    );
    assert_eq!(v["config"]["kv_dtype_bytes"], 2);
}

#[test]
fn mxfp4_checkpoints_train_dequantised_and_infer_as_stored() {
    // transformers trains gpt-oss dequantised (Mxfp4Config(dequantize=True)): bf16 weights
    let t = json_of(
        &[
            "train",
            "-m",
            "gpt-oss-20b",
            "--attention",
            "eager",
            "--seq",
            "256",
        ],
        &[],
    );
    assert_eq!(t["model"]["params_total"], 20_914_757_184u64, "{t}");
    let w = t["at_peak"]["weights"].as_u64().unwrap() as f64;
    assert!((w / 20_914_757_184f64 - 2.0).abs() < 1e-3, "{t}");
    // inference keeps the experts as stored: e2m1 nibbles + one e8m0 scale per 32 values
    let i = json_of(&["infer", "-m", "gpt-oss-20b", "--attention", "eager"], &[]);
    assert!(i.to_string().contains("mxfp4"), "{i}");
}

#[test]
fn training_a_quantised_checkpoint_needs_adapters() {
    refused(&["train", "-m", "deepseek-v3"], &["purely quantised"]);
    let s = Scratch::new("qlora");
    let cfg = quantised(
        &s.0,
        "mistralai/Mixtral-8x7B-v0.1.json",
        json!({"quant_method":"bitsandbytes","load_in_4bit":true,"bnb_4bit_quant_type":"nf4","bnb_4bit_use_double_quant":true}),
    );
    let (code, out, err) = run_env(
        &[
            "train",
            "-m",
            cfg.to_str().unwrap(),
            "--lora-rank",
            "16",
            "--lora-targets",
            "q_proj,v_proj",
            "--seq",
            "512",
            "--format",
            "json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    // the NF4 base, experts included: ~24 GB, not Mixtral's 87 GiB in bf16
    let w = v["at_peak"]["weights"]
        .as_u64()
        .or(v["at_peak"]["parameters"].as_u64());
    if let Some(w) = w {
        assert!(w < 30 << 30, "{w}");
    }
}

// ---------------------------------------------------------------- files given in memory

use memwall_cli::{run_args_with_files, FilesError, GivenFile};

/// The binary run in `dir` (as a user runs it beside the model's files): exit code, stdout, stderr.
fn run_in(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run memwall");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `dir/name` given in memory: its first `prefix` bytes (all of it when `None`), its real length.
fn given(dir: &Path, name: &str, prefix: Option<u64>) -> GivenFile {
    use std::io::Read;
    let f = std::fs::File::open(dir.join(name)).unwrap();
    let len = f.metadata().unwrap().len();
    let mut bytes = Vec::new();
    f.take(prefix.unwrap_or(len))
        .read_to_end(&mut bytes)
        .unwrap();
    GivenFile::new(name, bytes, len)
}

/// The first bytes of a safetensors file its header needs: 8, then the length they hold.
fn safetensors_prefix(dir: &Path, name: &str) -> u64 {
    let b = std::fs::read(dir.join(name)).unwrap();
    8 + u64::from_le_bytes(b[..8].try_into().unwrap())
}

fn with_files(args: &[&str], files: Vec<GivenFile>) -> Result<String, FilesError> {
    let mut out = Vec::new();
    run_args_with_files(args.iter().copied(), files, &mut out)?;
    Ok(String::from_utf8(out).unwrap())
}

/// The report from the given files is the binary's, byte for byte, in the files' directory.
fn same_as_cli(dir: &Path, args: &[&str], files: &[GivenFile]) {
    let (code, want, err) = run_in(dir, args);
    assert_eq!(code, 0, "{args:?}: {err}");
    let have = with_files(args, files.to_vec()).unwrap_or_else(|e| panic!("{args:?}: {e:?}"));
    assert_eq!(have, want, "{args:?}");
}

/// A GGUF whose metadata holds a long (skipped, but walked) string: a header of ~`mib` MiB.
fn big_header_gguf(mib: usize) -> Gguf {
    let mut g = tiny_gguf();
    let template = "x".repeat(mib << 20);
    gstr(&mut g.kv, "tokenizer.chat_template");
    g.kv.extend_from_slice(&8u32.to_le_bytes());
    gstr(&mut g.kv, &template);
    g.n_kv += 1;
    g
}

#[test]
fn a_given_gguf_prefix_reports_what_the_binary_prints_for_the_file() {
    let s = Scratch::new("given-gguf");
    let name = "tiny-Q4_K_M.gguf";
    tiny_gguf().write(&s.0.join(name));
    // the header is ~2 KiB: 64 KiB of the 1 MiB file are plenty
    let files = vec![given(&s.0, name, Some(64 << 10))];
    for args in [
        &["inspect", name, "--json"][..],
        &["inspect", name],
        &["infer", "--model", name, "--prompt", "64", "--json"],
        &["infer", "--model", name, "--prompt", "64"],
        &["train", "--model", name, "--batch", "2", "--json"],
        &["serve", "--model", name, "--gpu", "l4", "--json"],
        &["roofline", "--model", name, "--phase", "decode", "--json"],
    ] {
        same_as_cli(&s.0, args, &files);
    }
    // the directory of the given files, as `--model .` in the file's directory
    same_as_cli(&s.0, &["infer", "--model", ".", "--json"], &files);
    let v: Value =
        serde_json::from_str(&with_files(&["inspect", name, "--json"], files).unwrap()).unwrap();
    assert_eq!(v["checkpoint"]["storage"], "GGUF, mostly Q4_K");
    assert_eq!(v["checkpoint"]["weights"], "gguf-q4_k_m");
    assert_eq!(v["model"]["origin"], format!("GGUF file {name}"));
}

#[test]
fn a_short_gguf_prefix_names_the_bytes_to_read_next_until_it_suffices() {
    let s = Scratch::new("given-gguf-big");
    let name = "big.gguf";
    big_header_gguf(3).write(&s.0.join(name));
    let args = ["infer", "--model", name, "--json"];
    let mut prefix = 100u64;
    let mut reads = Vec::new();
    let answer = loop {
        match with_files(&args, vec![given(&s.0, name, Some(prefix))]) {
            Ok(report) => break report,
            Err(e) => {
                let more = e.more.clone().unwrap_or_else(|| panic!("{e:?}"));
                assert_eq!((more.file.as_str(), more.have), (name, prefix));
                assert!(more.needed > prefix, "{more:?}");
                assert_eq!(
                    e.lines[0],
                    format!(
                        "error: only the first {prefix} bytes of `{name}` ({} bytes) were given; reading it needs its first {} bytes",
                        more.len, more.needed
                    )
                );
                assert_eq!(
                    e.lines.last().unwrap(),
                    &format!(
                        "hint: give the first {0} bytes of the file (in a browser: `file.slice(0, {0})`) and run again; the tensor data is never needed",
                        more.needed
                    )
                );
                reads.push(more.needed);
                prefix = more.needed;
            }
        }
    };
    // 100 B → 1 MiB (the command line's first read) → the end of the 3 MiB string → at least
    // twice that, at most the file (here its 4 MiB)
    let len = std::fs::metadata(s.0.join(name)).unwrap().len();
    assert_eq!(reads.len(), 3, "{reads:?}");
    assert_eq!(reads[0], 1 << 20, "{reads:?}");
    assert!(
        reads[1] > 3 << 20 && reads[1] < (3 << 20) + 4096,
        "{reads:?}"
    );
    assert_eq!(reads[2], (2 * reads[1]).min(len), "{reads:?}");
    let (code, want, err) = run_in(&s.0, &args);
    assert_eq!(code, 0, "{err}");
    assert_eq!(answer, want);
}

#[test]
fn a_given_index_with_its_config_and_shard_headers_is_the_binarys_directory() {
    let s = Scratch::new("given-index");
    write_sharded(&s.0, TINY_LLAMA, &tiny_llama_tensors("BF16"));
    let index = "model.safetensors.index.json";
    let shards: Vec<String> = (1..=4)
        .map(|i| format!("model-{i:05}-of-00004.safetensors"))
        .collect();
    let mut files = vec![given(&s.0, "config.json", None), given(&s.0, index, None)];
    for sh in &shards {
        files.push(given(&s.0, sh, Some(safetensors_prefix(&s.0, sh))));
    }
    for args in [
        &["inspect", index, "--json"][..],
        &["inspect", index],
        &["infer", "--model", index, "--prompt", "64", "--json"],
        &["train", "--model", index, "--json"],
        &["serve", "--model", index, "--gpu", "l4", "--json"],
        &["infer", "--model", ".", "--json"],
        &["infer", "--model", &shards[0], "--json"][..],
    ] {
        if args.contains(&shards[0].as_str()) {
            // one shard alone lacks layers: the binary's error, as lines
            let (code, _, err) = run_in(&s.0, args);
            assert_eq!(code, 2);
            let e = with_files(args, files.clone()).unwrap_err();
            assert_eq!(e.lines.join("\n"), err.trim_end());
            continue;
        }
        same_as_cli(&s.0, args, &files);
    }
    // a shard's prefix short of its header: exactly 8 + N bytes are asked for
    let mut short = files.clone();
    short[2] = given(&s.0, &shards[0], Some(8));
    let e = with_files(&["inspect", index], short).unwrap_err();
    let more = e.more.unwrap();
    assert_eq!(more.needed, safetensors_prefix(&s.0, &shards[0]));
    assert_eq!(more.file, shards[0]);
    // a config given in part is read whole
    let mut part = files.clone();
    part[0] = given(&s.0, "config.json", Some(10));
    let e = with_files(&["inspect", index], part).unwrap_err();
    assert_eq!(e.more.unwrap().needed, TINY_LLAMA.len() as u64);
}

#[test]
fn given_files_that_cannot_make_a_model_are_refused_with_a_hint() {
    let s = Scratch::new("given-bad");
    write_sharded(&s.0, TINY_LLAMA, &tiny_llama_tensors("BF16"));
    let index = "model.safetensors.index.json";
    let shard = "model-00001-of-00004.safetensors";
    let refused_given = |args: &[&str], files: Vec<GivenFile>, needles: &[&str]| {
        let e = with_files(args, files).unwrap_err();
        let text = e.lines.join("\n");
        assert!(text.starts_with("error: "), "{text}");
        assert_eq!(
            e.lines.iter().filter(|l| l.starts_with("hint: ")).count(),
            1
        );
        assert!(e.lines.last().unwrap().starts_with("hint: "), "{text}");
        assert!(e.more.is_none(), "{e:?}");
        for n in needles {
            assert!(text.contains(n), "`{n}` not in\n{text}");
        }
    };
    // an index alone: its config is asked for, in the page's words
    refused_given(
        &["inspect", index],
        vec![given(&s.0, index, None)],
        &["has no config.json beside it", "hint: safetensors headers name tensors, not the architecture: give the model's config.json too"],
    );
    // the index and config without shards: the shards are asked for
    refused_given(
        &["inspect", index],
        vec![given(&s.0, "config.json", None), given(&s.0, index, None)],
        &[
            "shard `model-00001-of-00004.safetensors` is missing",
            "hint: give every shard the index names too",
        ],
    );
    // nothing on disk, in the cache or the catalogue is looked at
    refused_given(
        &["inspect", "gpt2"],
        vec![given(&s.0, "config.json", None)],
        &["model file `gpt2` was not given (given: `config.json`)"],
    );
    // malformed GGUF bytes: the parser's error, naming what is wrong
    let garbage = GivenFile::new("x.gguf", b"GGUF\x09\x00\x00\x00".to_vec(), 1 << 20);
    refused_given(
        &["inspect", "x.gguf"],
        vec![garbage],
        &["version 9", "hint: "],
    );
    let not_gguf = GivenFile::new("x.gguf", b"PK\x03\x04junkjunk".to_vec(), 1 << 20);
    refused_given(
        &["inspect", "x.gguf"],
        vec![not_gguf],
        &["magic", "not a GGUF file"],
    );
    // a safetensors header claiming more than the file holds
    let mut st = 1_000_000u64.to_le_bytes().to_vec();
    st.extend_from_slice(b"{}");
    refused_given(
        &["inspect", shard],
        vec![
            given(&s.0, "config.json", None),
            GivenFile::new(shard, st, 100),
        ],
        &["safetensors"],
    );
    // the files themselves: names, lengths, duplicates
    let cfg = given(&s.0, "config.json", None);
    refused_given(
        &["inspect", "config.json"],
        vec![GivenFile::new(
            "../config.json",
            cfg.prefix().to_vec(),
            cfg.len(),
        )],
        &["not a plain file name"],
    );
    refused_given(
        &["inspect", "config.json"],
        vec![GivenFile::new("config.json", cfg.prefix().to_vec(), 3)],
        &[&format!(
            "has {} bytes given but a length of 3",
            TINY_LLAMA.len()
        )],
    );
    refused_given(
        &["inspect", "config.json"],
        vec![cfg.clone(), cfg],
        &["given twice"],
    );
}

#[test]
fn a_given_split_gguf_needs_every_split_as_the_binary_does() {
    let s = Scratch::new("given-split");
    let all = tiny_gguf();
    let (first, second) = ("tiny-00001-of-00002.gguf", "tiny-00002-of-00002.gguf");
    let mut a = Gguf {
        tensors: all
            .tensors
            .iter()
            .filter(|t| !t.0.starts_with("blk.1."))
            .cloned()
            .collect(),
        ..tiny_gguf()
    };
    a = a.u32("split.no", 0).u32("split.count", 2);
    a.write(&s.0.join(first));
    let mut b = Gguf::new().u32("split.no", 1).u32("split.count", 2);
    b.tensors = all
        .tensors
        .iter()
        .filter(|t| t.0.starts_with("blk.1."))
        .cloned()
        .collect();
    b.write(&s.0.join(second));
    let files = vec![
        given(&s.0, first, Some(64 << 10)),
        given(&s.0, second, Some(64 << 10)),
    ];
    same_as_cli(&s.0, &["infer", "--model", first, "--json"], &files);
    same_as_cli(&s.0, &["inspect", first], &files);
    let e = with_files(&["inspect", first], files[..1].to_vec()).unwrap_err();
    assert_eq!(
        e.lines,
        [
            format!("error: GGUF split `{second}` is missing"),
            "hint: give every split of the model (only the first bytes of each are read)"
                .to_owned()
        ]
    );
}
