//! The `quantization_config` of a Hugging Face `config.json`: which method, with which
//! parameters, and which modules each library leaves unquantised.
//!
//! One typed variant per `quant_method` (transformers 5.23 `utils/quantization_config.py`
//! class fields): `fp8` (`FineGrainedFP8Config`, DeepSeek-V3/Qwen3-FP8), `gptq`
//! (`GPTQConfig`), `awq` (`AwqConfig`), `bitsandbytes` (`BitsAndBytesConfig`),
//! `compressed-tensors` (`CompressedTensorsConfig`, compressed-tensors `QuantizationConfig`)
//! and `mxfp4` (`Mxfp4Config`, gpt-oss). Where memwall-core has the exact storage layout the
//! config maps to its [`WeightFormat`]; otherwise only the checkpoint header gives the bytes.
//!
//! Which modules stay unquantised, per library:
//! - transformers-integrated methods (fp8, bitsandbytes, awq, mxfp4): the config's list
//!   (`modules_to_not_convert`, bitsandbytes `llm_int8_skip_modules`); when it is absent,
//!   the default skips of `HfQuantizer.get_modules_to_not_convert` (the output embedding,
//!   `lm_head`). A module is skipped when a pattern matches as transformers
//!   `quantizers_utils.should_convert_module` does: `re.match(pattern, name)` (anchored at
//!   the start) or `name.endswith(pattern)`.
//! - gptq (optimum / GPTQModel): only linears inside the decoder blocks, restricted to
//!   `modules_in_block_to_quantize` when given; `lm_head` only with `"lm_head": true`.
//! - compressed-tensors: every module its `targets` select (`Linear`) except those in
//!   `ignore`: exact names, the class name `Linear`, or `re:` regexes (`re.match`).
//! - mxfp4: only the MoE experts (`Mxfp4HfQuantizer` replaces the experts module only).
//!
//! Routers are never quantised (no library's checkpoints of the supported families store a
//! quantised router) and embeddings never are (they are not linears). MoE experts are
//! quantised like every other linear unless a pattern names them.

use crate::error::FormatError;
use memwall_core::model::{LinearRole, Mlp, ModelDesc};
use memwall_core::workload::WeightFormat;
use regex::Regex;
use serde_json::{Map, Value};

/// A compiled module pattern with the text it came from.
#[derive(Debug, Clone)]
struct Pattern {
    text: String,
    /// `^(?:text)`: Python `re.match` anchors at the start only.
    regex: Option<Regex>,
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

/// A compressed-tensors weight scheme (`QuantizationArgs` of one config group).
#[derive(Debug, Clone, PartialEq)]
pub struct CompressedScheme {
    /// `num_bits`.
    pub num_bits: u64,
    /// `type`: `"int"` or `"float"`.
    pub kind: String,
    /// `strategy`: `tensor`, `channel`, `group`, `block`, `tensor_group`, `token`.
    pub strategy: String,
    /// `group_size` (group strategies).
    pub group_size: Option<u64>,
    /// `block_structure` (block strategy), rows × columns.
    pub block: Option<(u64, u64)>,
    /// `symmetric`.
    pub symmetric: bool,
    /// The group's `targets` (usually `["Linear"]`).
    pub targets: Vec<String>,
}

/// The quantisation method and its storage-relevant parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum QuantMethod {
    /// Block-wise (or per-tensor) fp8 weights with fp32 inverse scales.
    Fp8 {
        /// `weight_block_size` (rows, columns); `None`: one scale per tensor.
        block: Option<(u64, u64)>,
        /// `fmt` (`e4m3`) when stated.
        fmt: Option<String>,
    },
    /// GPTQ packed integers.
    Gptq {
        /// `bits`.
        bits: u64,
        /// `group_size`; `None` for `-1` (one group per column).
        group_size: Option<u64>,
        /// `desc_act` (act-order).
        desc_act: bool,
        /// `sym`.
        sym: bool,
    },
    /// AWQ packed 4-bit integers.
    Awq {
        /// `bits`.
        bits: u64,
        /// `group_size`.
        group_size: u64,
        /// `zero_point`.
        zero_point: bool,
        /// `version` (kernel layout), lower-case: `gemm`, `gemv`, `exllama`, …
        version: String,
    },
    /// bitsandbytes 4-bit.
    Bnb4 {
        /// `bnb_4bit_quant_type`: true for `nf4`, false for `fp4` (the class default).
        nf4: bool,
        /// `bnb_4bit_use_double_quant`.
        double_quant: bool,
    },
    /// bitsandbytes LLM.int8.
    Bnb8,
    /// compressed-tensors (llm-compressor).
    CompressedTensors {
        /// `format` (`pack-quantized`, `float-quantized`, `naive-quantized`, …).
        format: String,
        /// One weight scheme per config group.
        schemes: Vec<CompressedScheme>,
    },
    /// MXFP4 experts (gpt-oss).
    Mxfp4,
}

/// What a module is, for the library rules above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModuleKind {
    /// An `nn.Linear` (attention and dense MLP projections, shared experts, `lm_head`).
    Linear,
    /// The routed experts of a MoE block.
    Experts,
    /// A MoE router.
    Router,
    /// An embedding.
    Embedding,
}

/// A parsed, validated `quantization_config`.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantConfig {
    method: QuantMethod,
    skip: Vec<Pattern>,
    /// gptq: `modules_in_block_to_quantize` flattened; `lm_head` flag.
    gptq_modules: Option<Vec<String>>,
    gptq_lm_head: bool,
}

/// Reads the `quantization_config` (or the older compressed-tensors `compression_config`)
/// of a `config.json` text. `Ok(None)` when there is none.
pub fn parse_quantization_config(config_json: &str) -> Result<Option<QuantConfig>, FormatError> {
    let value: Value = serde_json::from_str(config_json).map_err(|e| FormatError::Json {
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    let Some(obj) = value.as_object() else {
        return Ok(None);
    };
    for key in ["quantization_config", "compression_config"] {
        match obj.get(key) {
            None | Some(Value::Null) => continue,
            Some(v) => return QuantConfig::from_value(v, key).map(Some),
        }
    }
    Ok(None)
}

impl QuantConfig {
    /// Parses the value of `quantization_config` (`field` names it in errors).
    pub fn from_value(v: &Value, field: &str) -> Result<QuantConfig, FormatError> {
        let obj = v.as_object().ok_or_else(|| wrong(field, "an object", v))?;
        let f = Fields { obj, field };
        let method = f
            .string("quant_method")?
            .ok_or_else(|| FormatError::MissingField {
                field: format!("{field}.quant_method"),
                model_type: "(quantization_config)".into(),
                hint: "every transformers quantization_config names its quant_method".into(),
            })?
            .to_ascii_lowercase();
        let mut gptq_modules = None;
        let mut gptq_lm_head = false;
        let (method, skip_key) = match method.as_str() {
            "fp8" => {
                let block = match f.uint_list("weight_block_size")? {
                    None => None,
                    Some(b) => Some(pair(&f, "weight_block_size", &b)?),
                };
                (
                    QuantMethod::Fp8 {
                        block,
                        fmt: f.string("fmt")?,
                    },
                    Some("modules_to_not_convert"),
                )
            }
            "gptq" => {
                let bits = f.uint("bits")?.unwrap_or(4);
                gptq_lm_head = f.boolean("lm_head")?.unwrap_or(false);
                gptq_modules = f.nested_strings("modules_in_block_to_quantize")?;
                (
                    QuantMethod::Gptq {
                        bits: check_bits(&f, "bits", bits, &[2, 3, 4, 8])?,
                        group_size: f.group_size("group_size")?,
                        desc_act: f.boolean("desc_act")?.unwrap_or(false),
                        sym: f.boolean("sym")?.unwrap_or(true),
                    },
                    None,
                )
            }
            "awq" => {
                let bits = f.uint("bits")?.unwrap_or(4);
                let group_size = f.group_size("group_size")?.unwrap_or(128);
                (
                    QuantMethod::Awq {
                        bits: check_bits(&f, "bits", bits, &[4])?,
                        group_size,
                        zero_point: f.boolean("zero_point")?.unwrap_or(true),
                        version: f
                            .string("version")?
                            .unwrap_or_else(|| "gemm".into())
                            .to_ascii_lowercase(),
                    },
                    Some("modules_to_not_convert"),
                )
            }
            "bitsandbytes" | "bitsandbytes_4bit" | "bitsandbytes_8bit" => {
                let four =
                    f.boolean("load_in_4bit")?.unwrap_or(false) || method == "bitsandbytes_4bit";
                let eight =
                    f.boolean("load_in_8bit")?.unwrap_or(false) || method == "bitsandbytes_8bit";
                let m = match (four, eight) {
                    (true, false) => {
                        let qt = f
                            .string("bnb_4bit_quant_type")?
                            .unwrap_or_else(|| "fp4".into())
                            .to_ascii_lowercase();
                        let nf4 = match qt.as_str() {
                            "nf4" => true,
                            "fp4" => false,
                            other => {
                                return Err(unsupported(
                                    &format!("{field}.bnb_4bit_quant_type"),
                                    other,
                                    "bitsandbytes 4-bit types are nf4 and fp4",
                                ))
                            }
                        };
                        QuantMethod::Bnb4 {
                            nf4,
                            double_quant: f.boolean("bnb_4bit_use_double_quant")?.unwrap_or(false),
                        }
                    }
                    (false, true) => QuantMethod::Bnb8,
                    _ => {
                        return Err(FormatError::Inconsistent {
                            fields: format!("`{field}.load_in_4bit`, `{field}.load_in_8bit`"),
                            reason: "exactly one of them must be true".into(),
                            hint: "BitsAndBytesConfig loads in 4 bits or in 8 bits".into(),
                        })
                    }
                };
                (m, Some("llm_int8_skip_modules"))
            }
            "compressed-tensors" | "compressed_tensors" => (compressed(&f)?, None),
            "mxfp4" => (QuantMethod::Mxfp4, Some("modules_to_not_convert")),
            other => {
                return Err(unsupported(
                    &format!("{field}.quant_method"),
                    other,
                    "supported: fp8, gptq, awq, bitsandbytes, compressed-tensors, mxfp4",
                ))
            }
        };
        let skip_texts = match (&method, skip_key) {
            (QuantMethod::CompressedTensors { .. }, _) => f.strings("ignore")?.unwrap_or_default(),
            (_, Some(key)) => match f.strings(key)? {
                Some(list) => list,
                // HfQuantizer.get_modules_to_not_convert: default skips (the output embedding)
                None => vec!["lm_head".into()],
            },
            (_, None) => Vec::new(),
        };
        let is_ct = matches!(method, QuantMethod::CompressedTensors { .. });
        let skip = skip_texts
            .into_iter()
            .map(|text| compile(field, text, is_ct))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(QuantConfig {
            method,
            skip,
            gptq_modules,
            gptq_lm_head,
        })
    }

    /// The method and its parameters.
    pub fn method(&self) -> &QuantMethod {
        &self.method
    }

    /// The skip patterns in effect (the config's list, or the library default), verbatim.
    pub fn skipped_patterns(&self) -> Vec<&str> {
        self.skip.iter().map(|p| p.text.as_str()).collect()
    }

    /// The memwall-core weight format with exactly this storage layout, if there is one:
    /// fp8 with 128×128 blocks → `fp8`; GPTQ with a positive group → `gptq-int{b}-g{g}`;
    /// AWQ GEMM → `awq-int4-g{g}`; bitsandbytes → `nf4`/`fp4` (`-dq`) or `int8`;
    /// compressed-tensors fp8 with 128×128 blocks → `fp8`; MXFP4 → `mxfp4` (experts only).
    /// Others (per-tensor fp8, per-column GPTQ, AWQ GEMV, other compressed-tensors schemes)
    /// have none: their bytes come from the checkpoint header.
    pub fn weight_format(&self) -> Option<WeightFormat> {
        match &self.method {
            QuantMethod::Fp8 {
                block: Some((128, 128)),
                ..
            } => Some(WeightFormat::Fp8),
            QuantMethod::Mxfp4 => Some(WeightFormat::Mxfp4),
            QuantMethod::Fp8 { .. } => None,
            QuantMethod::Gptq {
                bits,
                group_size: Some(g),
                ..
            } => Some(WeightFormat::Gptq {
                bits: u32::try_from(*bits).ok()?,
                group: u32::try_from(*g).ok()?,
            }),
            QuantMethod::Gptq { .. } => None,
            QuantMethod::Awq {
                group_size,
                version,
                ..
            } if version == "gemm" => Some(WeightFormat::Awq {
                group: u32::try_from(*group_size).ok()?,
            }),
            QuantMethod::Awq { .. } => None,
            QuantMethod::Bnb4 {
                nf4: true,
                double_quant,
            } => Some(WeightFormat::Nf4 {
                double_quant: *double_quant,
            }),
            QuantMethod::Bnb4 {
                nf4: false,
                double_quant,
            } => Some(WeightFormat::Fp4 {
                double_quant: *double_quant,
            }),
            QuantMethod::Bnb8 => Some(WeightFormat::Int8),
            QuantMethod::CompressedTensors { schemes, .. } => match schemes.as_slice() {
                [s] if s.kind == "float"
                    && s.num_bits == 8
                    && s.strategy == "block"
                    && s.block == Some((128, 128)) =>
                {
                    Some(WeightFormat::Fp8)
                }
                _ => None,
            },
        }
    }

    /// A short description for output, e.g. `fp8 (128×128 blocks)`, `gptq int4 g128`.
    pub fn describe(&self) -> String {
        match &self.method {
            QuantMethod::Fp8 {
                block: Some((r, c)),
                ..
            } => format!("fp8 ({r}×{c} blocks)"),
            QuantMethod::Fp8 { block: None, .. } => "fp8 (per tensor)".into(),
            QuantMethod::Gptq {
                bits, group_size, ..
            } => match group_size {
                Some(g) => format!("gptq int{bits} g{g}"),
                None => format!("gptq int{bits} per column"),
            },
            QuantMethod::Awq {
                bits,
                group_size,
                version,
                ..
            } => {
                format!("awq int{bits} g{group_size} ({version})")
            }
            QuantMethod::Bnb4 { nf4, double_quant } => format!(
                "bitsandbytes {}{}",
                if *nf4 { "nf4" } else { "fp4" },
                if *double_quant { " + double quant" } else { "" }
            ),
            QuantMethod::Bnb8 => "bitsandbytes int8".into(),
            QuantMethod::CompressedTensors { format, schemes } => {
                let s: Vec<String> = schemes
                    .iter()
                    .map(|s| format!("{}{} {}", s.kind, s.num_bits, s.strategy))
                    .collect();
                format!("compressed-tensors {format} ({})", s.join(", "))
            }
            QuantMethod::Mxfp4 => "mxfp4 (experts)".into(),
        }
    }

    /// Whether the library quantises the module at `path` (a transformers module name such
    /// as `model.layers.0.self_attn.q_proj`) of the given kind; see the module docs.
    pub fn is_quantized(&self, path: &str, kind: ModuleKind) -> bool {
        if matches!(kind, ModuleKind::Router | ModuleKind::Embedding) {
            return false;
        }
        match &self.method {
            QuantMethod::Mxfp4 if kind != ModuleKind::Experts => return false,
            QuantMethod::Gptq { .. } => {
                if path == "lm_head" || path.ends_with(".lm_head") {
                    return self.gptq_lm_head;
                }
                return match (&self.gptq_modules, kind) {
                    (None, _) => true,
                    (Some(list), ModuleKind::Experts) => list.iter().any(|m| m.contains("experts")),
                    (Some(list), _) => list.iter().any(|m| path.ends_with(&format!(".{m}"))),
                };
            }
            _ => {}
        }
        let ct = matches!(self.method, QuantMethod::CompressedTensors { .. });
        !self.skip.iter().any(|p| p.matches(path, kind, ct))
    }

    /// Which parts of `desc` the library quantises, with the module names transformers
    /// gives them (`model.layers.{i}.self_attn.{name}` and its per-family variants).
    pub fn coverage(&self, desc: &ModelDesc) -> QuantCoverage {
        let p = paths(&desc.model_type);
        let layers = desc
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let base = format!("{}.{i}", p.layers);
                let mut attention = Vec::new();
                let mut mlp = Vec::new();
                for (role, name) in &desc.linear_names {
                    let (list, module) = if is_attention(*role) {
                        (&mut attention, p.attention)
                    } else {
                        (&mut mlp, p.mlp)
                    };
                    let path = join(&[&base, module, name]);
                    list.push((*role, self.is_quantized(&path, ModuleKind::Linear)));
                }
                let (experts, shared_experts) = match &l.mlp {
                    Mlp::Moe(m) => {
                        let moe = join(&[&base, p.moe]);
                        (
                            Some(self.is_quantized(&format!("{moe}.experts"), ModuleKind::Experts)),
                            m.shared.map(|_| {
                                self.is_quantized(
                                    &format!("{moe}.{}", p.shared),
                                    ModuleKind::Linear,
                                )
                            }),
                        )
                    }
                    Mlp::Dense(_) | Mlp::None => (None, None),
                };
                LayerCoverage {
                    attention,
                    mlp: if matches!(l.mlp, Mlp::Dense(_)) {
                        mlp
                    } else {
                        Vec::new()
                    },
                    experts,
                    shared_experts,
                }
            })
            .collect();
        QuantCoverage {
            lm_head: !desc.head.tied && self.is_quantized(p.head, ModuleKind::Linear),
            layers,
        }
    }
}

/// Which linears of a model a quantisation config covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantCoverage {
    /// The (untied) LM head is quantised.
    pub lm_head: bool,
    /// Per decoder layer.
    pub layers: Vec<LayerCoverage>,
}

/// Which linears of one layer are quantised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerCoverage {
    /// Attention projections by role.
    pub attention: Vec<(LinearRole, bool)>,
    /// Dense MLP projections by role (empty for MoE layers).
    pub mlp: Vec<(LinearRole, bool)>,
    /// Routed experts (MoE layers).
    pub experts: Option<bool>,
    /// Shared experts (MoE layers that have them).
    pub shared_experts: Option<bool>,
}

fn is_attention(role: LinearRole) -> bool {
    use LinearRole::*;
    matches!(role, Q | K | V | Qkv | O | QA | QB | KvA | KvB)
}

fn join(parts: &[&str]) -> String {
    parts
        .iter()
        .filter(|p| !p.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(".")
}

/// Module paths of one family in transformers 5.23 (`modeling_*.py` attribute names).
struct Paths {
    layers: &'static str,
    attention: &'static str,
    mlp: &'static str,
    moe: &'static str,
    shared: &'static str,
    head: &'static str,
}

fn paths(model_type: &str) -> Paths {
    let llama = Paths {
        layers: "model.layers",
        attention: "self_attn",
        mlp: "mlp",
        moe: "mlp",
        shared: "shared_expert",
        head: "lm_head",
    };
    match model_type {
        "gemma3" => Paths {
            layers: "model.language_model.layers",
            ..llama
        },
        "deepseek_v3" => Paths {
            shared: "shared_experts",
            ..llama
        },
        "gpt2" => Paths {
            layers: "transformer.h",
            attention: "attn",
            ..llama
        },
        "falcon" => Paths {
            layers: "transformer.h",
            attention: "self_attention",
            ..llama
        },
        "gpt_neox" => Paths {
            layers: "gpt_neox.layers",
            attention: "attention",
            head: "embed_out",
            ..llama
        },
        "opt" => Paths {
            layers: "model.decoder.layers",
            mlp: "",
            ..llama
        },
        _ => llama,
    }
}

impl Pattern {
    /// transformers `should_convert_module`: `re.match(p, name)` or `name.endswith(p)`;
    /// compressed-tensors: `re:` regexes with `re.match`, else the exact name or class.
    fn matches(&self, path: &str, kind: ModuleKind, compressed_tensors: bool) -> bool {
        if compressed_tensors {
            return match &self.regex {
                Some(r) => r.is_match(path),
                None => self.text == path || (self.text == "Linear" && kind == ModuleKind::Linear),
            };
        }
        self.regex.as_ref().is_some_and(|r| r.is_match(path)) || path.ends_with(&self.text)
    }
}

fn compile(field: &str, text: String, compressed_tensors: bool) -> Result<Pattern, FormatError> {
    let source = if compressed_tensors {
        match text.strip_prefix("re:") {
            Some(r) => r.to_string(),
            None => {
                return Ok(Pattern { text, regex: None });
            }
        }
    } else {
        text.clone()
    };
    let regex = regex::RegexBuilder::new(&format!("^(?:{source})"))
        .size_limit(1 << 20)
        .build()
        .map_err(|e| FormatError::WrongType {
            field: format!("{field} (pattern {text:?})"),
            message: e.to_string(),
            hint: "module patterns are Python regular expressions matched from the start of the module name".into(),
        })?;
    Ok(Pattern {
        text,
        regex: Some(regex),
    })
}

/// compressed-tensors `QuantizationConfig`: `format` and the weight scheme of each group.
fn compressed(f: &Fields) -> Result<QuantMethod, FormatError> {
    let format = f.string("format")?.unwrap_or_else(|| "dense".into());
    let mut schemes = Vec::new();
    if let Some(groups) = f.obj.get("config_groups") {
        let groups = groups
            .as_object()
            .ok_or_else(|| wrong(&format!("{}.config_groups", f.field), "an object", groups))?;
        for (name, g) in groups {
            let gfield = format!("{}.config_groups.{name}", f.field);
            let gobj = g
                .as_object()
                .ok_or_else(|| wrong(&gfield, "an object", g))?;
            let gf = Fields {
                obj: gobj,
                field: &gfield,
            };
            let targets = gf.strings("targets")?.unwrap_or_default();
            let Some(w) = gobj.get("weights").filter(|w| !w.is_null()) else {
                continue; // activation-only group
            };
            let wfield = format!("{gfield}.weights");
            let wobj = w
                .as_object()
                .ok_or_else(|| wrong(&wfield, "an object", w))?;
            let wf = Fields {
                obj: wobj,
                field: &wfield,
            };
            let block = match wf.uint_list("block_structure")? {
                None => None,
                Some(b) => Some(pair(&wf, "block_structure", &b)?),
            };
            schemes.push(CompressedScheme {
                num_bits: wf.uint("num_bits")?.unwrap_or(8),
                kind: wf.string("type")?.unwrap_or_else(|| "int".into()),
                strategy: wf.string("strategy")?.unwrap_or_else(|| "tensor".into()),
                group_size: wf.uint("group_size")?,
                block,
                symmetric: wf.boolean("symmetric")?.unwrap_or(true),
                targets,
            });
        }
    }
    Ok(QuantMethod::CompressedTensors { format, schemes })
}

/// Typed access to the keys of one JSON object, errors naming `field.key`.
struct Fields<'a> {
    obj: &'a Map<String, Value>,
    field: &'a str,
}

impl Fields<'_> {
    fn name(&self, key: &str) -> String {
        format!("{}.{key}", self.field)
    }

    fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn string(&self, key: &str) -> Result<Option<String>, FormatError> {
        self.get(key)
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| wrong(&self.name(key), "a string", v))
            })
            .transpose()
    }

    fn uint(&self, key: &str) -> Result<Option<u64>, FormatError> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| wrong(&self.name(key), "a non-negative integer", v))
            })
            .transpose()
    }

    fn boolean(&self, key: &str) -> Result<Option<bool>, FormatError> {
        self.get(key)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| wrong(&self.name(key), "true or false", v))
            })
            .transpose()
    }

    /// A group size: positive, or `-1` for one group per column (→ `None`).
    fn group_size(&self, key: &str) -> Result<Option<u64>, FormatError> {
        match self.get(key) {
            None => Ok(Some(128)),
            Some(v) if v.as_i64() == Some(-1) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(g) if g > 0 && g <= 1 << 20 => Ok(Some(g)),
                _ => Err(wrong(&self.name(key), "a positive group size or -1", v)),
            },
        }
    }

    fn uint_list(&self, key: &str) -> Result<Option<Vec<u64>>, FormatError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let list = v
            .as_array()
            .ok_or_else(|| wrong(&self.name(key), "a list of integers", v))?;
        list.iter()
            .map(|x| {
                x.as_u64()
                    .ok_or_else(|| wrong(&self.name(key), "a list of integers", v))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<String>>, FormatError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let list = v
            .as_array()
            .ok_or_else(|| wrong(&self.name(key), "a list of strings", v))?;
        list.iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| wrong(&self.name(key), "a list of strings", v))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// A list of strings or of lists of strings (GPTQ `modules_in_block_to_quantize`).
    fn nested_strings(&self, key: &str) -> Result<Option<Vec<String>>, FormatError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let mut out = Vec::new();
        let bad = || wrong(&self.name(key), "a list of (lists of) module names", v);
        for x in v.as_array().ok_or_else(bad)? {
            match x {
                Value::String(s) => out.push(s.clone()),
                Value::Array(inner) => {
                    for y in inner {
                        out.push(y.as_str().ok_or_else(bad)?.to_string());
                    }
                }
                _ => return Err(bad()),
            }
        }
        Ok(Some(out))
    }
}

fn pair(f: &Fields, key: &str, b: &[u64]) -> Result<(u64, u64), FormatError> {
    match *b {
        [r, c] if r > 0 && c > 0 => Ok((r, c)),
        _ => Err(FormatError::OutOfRange {
            field: f.name(key),
            value: format!("{b:?}"),
            reason: "must be two positive sizes (rows, columns)".into(),
            hint: "DeepSeek-V3 and Qwen3-FP8 use [128, 128]".into(),
        }),
    }
}

fn check_bits(f: &Fields, key: &str, bits: u64, allowed: &[u64]) -> Result<u64, FormatError> {
    if allowed.contains(&bits) {
        Ok(bits)
    } else {
        Err(FormatError::OutOfRange {
            field: f.name(key),
            value: bits.to_string(),
            reason: format!("the library stores {allowed:?}-bit weights only"),
            hint: "check the checkpoint's quantization_config".into(),
        })
    }
}

fn wrong(field: &str, expected: &str, found: &Value) -> FormatError {
    FormatError::WrongType {
        field: field.into(),
        message: format!("expected {expected}, found {found}"),
        hint: "the quantization_config must have the types of its transformers config class".into(),
    }
}

fn unsupported(field: &str, value: &str, hint: &str) -> FormatError {
    FormatError::Unsupported {
        field: field.into(),
        value: format!("\"{value}\""),
        reason: "memwall does not model this quantisation".into(),
        hint: hint.into(),
    }
}
