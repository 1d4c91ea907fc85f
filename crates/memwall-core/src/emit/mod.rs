//! Engine launch files for an estimate: the configuration memwall estimated, written in the
//! formats DeepSpeed, accelerate, the transformers `Trainer`, `torchrun`, Megatron-LM,
//! torchtitan and vLLM read.
//!
//! Two rules hold for every emitter:
//! - every setting the estimate depends on is written explicitly (even where it equals the
//!   engine's default), so the launched run matches the estimate when a default changes;
//! - every setting memwall does not decide is left out, so it keeps the engine's default.
//!
//! Each emitter first checks that its engine can run the estimated configuration *as
//! estimated* and otherwise refuses by name with a hint ([`EmitError::Unsupported`]). Every key
//! cites the engine source that defines it; the versions are those
//! `tools/emit_check/` validates against (see its `REPORT.md`).
//!
//! Nothing here does I/O: [`emit`] and [`emit_serve`] return the files' names and contents.

mod accelerate;
mod deepspeed;
mod megatron;
mod shell;
mod spec;
mod torchrun;
mod torchtitan;
mod trainer;
mod vllm;
mod yaml;

#[cfg(test)]
mod tests;

pub use spec::{
    decoder_layer_class, EngineConstants, LaunchSpec, ModelShape, Provenance, ServeLaunchSpec,
    VllmKvCacheDtype, DECODER_LAYER_CLASSES, MODEL_PLACEHOLDER,
};

use crate::error::CoreError;
use thiserror::Error;

/// What to emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EmitKind {
    /// A DeepSpeed config JSON (`ds_config.json`) and a `deepspeed` launch line.
    Deepspeed,
    /// An accelerate config YAML (FSDP2, DeepSpeed or DDP).
    Accelerate,
    /// transformers `TrainingArguments` as JSON, with the model, PEFT and bitsandbytes kwargs.
    Trainer,
    /// A `torchrun` launch line.
    Torchrun,
    /// Megatron-LM `pretrain_gpt.py` arguments.
    Megatron,
    /// torchtitan `--module/--config` with CLI overrides.
    Torchtitan,
    /// `vllm serve` flags and a `--config` YAML.
    Vllm,
}

impl EmitKind {
    /// Every kind with its CLI name.
    pub const ALL: [(EmitKind, &'static str); 7] = [
        (EmitKind::Deepspeed, "deepspeed"),
        (EmitKind::Accelerate, "accelerate"),
        (EmitKind::Trainer, "trainer"),
        (EmitKind::Torchrun, "torchrun"),
        (EmitKind::Megatron, "megatron"),
        (EmitKind::Torchtitan, "torchtitan"),
        (EmitKind::Vllm, "vllm"),
    ];

    /// The CLI name.
    pub fn name(self) -> &'static str {
        EmitKind::ALL
            .iter()
            .find(|(k, _)| *k == self)
            .map_or("?", |(_, n)| n)
    }

    /// Parses a CLI name.
    pub fn parse(s: &str) -> Result<EmitKind, EmitError> {
        EmitKind::ALL
            .iter()
            .find(|(_, n)| n.eq_ignore_ascii_case(s))
            .map(|(k, _)| *k)
            .ok_or_else(|| EmitError::UnknownKind {
                given: s.to_string(),
            })
    }

    /// Whether the kind launches training (`memwall train`/`plan`) rather than serving.
    pub fn is_training(self) -> bool {
        self != EmitKind::Vllm
    }
}

/// One file to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmittedFile {
    /// File name (no directories).
    pub name: String,
    /// Full contents, ending with a newline.
    pub contents: String,
}

impl EmittedFile {
    fn new(name: &str, contents: String) -> EmittedFile {
        EmittedFile {
            name: name.to_string(),
            contents,
        }
    }
}

/// Why files could not be emitted.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum EmitError {
    /// The engine cannot run the estimated configuration as estimated.
    #[error("`--emit {kind}` cannot launch this configuration: {reason}")]
    Unsupported {
        /// The emit kind.
        kind: &'static str,
        /// Why, naming the setting.
        reason: String,
        /// What to do instead.
        hint: String,
    },
    /// A serving kind was asked of a training estimate or the reverse.
    #[error("`--emit {kind}` is for {expected}")]
    WrongCommand {
        /// The emit kind.
        kind: &'static str,
        /// Which command it belongs to.
        expected: &'static str,
    },
    /// Not a kind memwall knows.
    #[error("unknown emit kind `{given}`")]
    UnknownKind {
        /// What was given.
        given: String,
    },
    /// The estimate's inputs are invalid (the same checks the estimate runs).
    #[error(transparent)]
    Invalid(#[from] CoreError),
}

impl EmitError {
    fn unsupported(kind: &'static str, reason: impl Into<String>, hint: impl Into<String>) -> Self {
        EmitError::Unsupported {
            kind,
            reason: reason.into(),
            hint: hint.into(),
        }
    }

    /// A short stable name of the error (for `error[NAME]` lines and tests).
    pub fn code(&self) -> &'static str {
        match self {
            EmitError::Unsupported { .. } => "emit-unsupported",
            EmitError::WrongCommand { .. } => "emit-wrong-command",
            EmitError::UnknownKind { .. } => "emit-unknown-kind",
            EmitError::Invalid(_) => "emit-invalid-input",
        }
    }

    /// The `hint:` line to print under the error.
    pub fn hint(&self) -> Option<String> {
        match self {
            EmitError::Unsupported { hint, .. } => Some(hint.clone()),
            EmitError::WrongCommand { kind, .. } => Some(if *kind == "vllm" {
                "use `memwall serve … --emit vllm`".to_string()
            } else {
                "use `memwall train … --emit KIND` or `memwall plan … --emit KIND`".to_string()
            }),
            EmitError::UnknownKind { .. } => Some(format!(
                "kinds: {}",
                EmitKind::ALL.map(|(_, n)| n).join(", ")
            )),
            EmitError::Invalid(_) => None,
        }
    }
}

/// The files that launch the estimated training configuration with `kind`'s engine.
pub fn emit(kind: EmitKind, spec: &LaunchSpec) -> Result<Vec<EmittedFile>, EmitError> {
    if spec.runtime == crate::memory::titan::Runtime::Torchtitan
        && !matches!(kind, EmitKind::Torchtitan | EmitKind::Vllm)
    {
        // The estimate simulated torchtitan's own training step (its model code, loss and
        // FSDP2/TP wrapping), which no transformers script, DeepSpeed or Megatron-LM runs.
        return Err(EmitError::Unsupported {
            kind: kind.name(),
            reason: "the estimate is of torchtitan's own training step (--runtime torchtitan), \
                     which this engine does not run"
                .to_string(),
            hint: "use --emit torchtitan (its launch is a torchrun line), or estimate with \
                   --runtime hf for the transformers engines"
                .to_string(),
        });
    }
    match kind {
        EmitKind::Deepspeed => deepspeed::emit(spec),
        EmitKind::Accelerate => accelerate::emit(spec),
        EmitKind::Trainer => trainer::emit(spec),
        EmitKind::Torchrun => torchrun::emit(spec),
        EmitKind::Megatron => megatron::emit(spec),
        EmitKind::Torchtitan => torchtitan::emit(spec),
        EmitKind::Vllm => Err(EmitError::WrongCommand {
            kind: "vllm",
            expected: "`memwall serve` (a vLLM deployment), not training",
        }),
    }
}

/// Whether `kind` can launch `spec` as estimated (the check [`emit`] runs first).
pub fn check(kind: EmitKind, spec: &LaunchSpec) -> Result<(), EmitError> {
    emit(kind, spec).map(|_| ())
}

/// The files that launch the estimated vLLM deployment.
pub fn emit_serve(kind: EmitKind, spec: &ServeLaunchSpec) -> Result<Vec<EmittedFile>, EmitError> {
    match kind {
        EmitKind::Vllm => vllm::emit(spec),
        other => Err(EmitError::WrongCommand {
            kind: other.name(),
            expected: "`memwall train` and `memwall plan` (training), not serving",
        }),
    }
}

/// The header comment lines (without comment markers) every commented file starts with.
fn header_lines(provenance: &Provenance, engine: &str) -> Vec<String> {
    let or_unknown = |s: &str, what: &str| {
        if s.is_empty() {
            format!("({what} not recorded)")
        } else {
            s.replace('\n', " ")
        }
    };
    vec![
        format!(
            "Written by memwall {} — re-run the command to regenerate.",
            env!("CARGO_PKG_VERSION")
        ),
        format!("command:  {}", or_unknown(&provenance.command, "command")),
        format!("estimate: {}", or_unknown(&provenance.estimate, "estimate")),
        format!("engine:   {engine}"),
        "Settings the estimate depends on are written explicitly; everything else keeps the engine default.".to_string(),
    ]
}

/// `lines` as `# `-comments.
fn hash_comment(lines: &[String]) -> String {
    lines
        .iter()
        .map(|l| {
            if l.is_empty() {
                "#\n".to_string()
            } else {
                format!("# {l}\n")
            }
        })
        .collect()
}

/// A JSON document, pretty-printed with a trailing newline.
fn json_file(name: &str, value: &serde_json::Value) -> EmittedFile {
    let mut s = serde_json::to_string_pretty(value).unwrap_or_default();
    s.push('\n');
    EmittedFile::new(name, s)
}

/// transformers `from_pretrained(dtype=…)` for the estimated precision: the cast precisions
/// load the model in that dtype, the `amp-*` ones keep fp32 weights (autocast runs the forward).
fn hf_model_dtype(p: crate::workload::Precision) -> &'static str {
    use crate::workload::Precision;
    match p {
        Precision::Bf16 => "bfloat16",
        Precision::Fp16 => "float16",
        Precision::Fp32 | Precision::AmpBf16 | Precision::AmpFp16 => "float32",
    }
}

/// transformers `attn_implementation` (`modeling_utils.py` `_check_and_adjust_attn_implementation`).
fn hf_attn_implementation(a: crate::workload::AttentionImpl) -> &'static str {
    use crate::workload::AttentionImpl;
    match a {
        AttentionImpl::Sdpa => "sdpa",
        AttentionImpl::Eager => "eager",
        AttentionImpl::Flash => "flash_attention_2",
    }
}

/// What the user's transformers training script must do for the run to match the estimate
/// (the parts no engine config file carries), as comment lines.
fn hf_script_notes(spec: &LaunchSpec, checkpointing_in_config: bool) -> Vec<String> {
    let w = &spec.workload;
    let mut notes = vec![
        "Your training script must, to match the estimate:".to_string(),
        format!(
            "  model = AutoModelForCausalLM.from_pretrained({:?}, dtype=torch.{}, attn_implementation={:?})",
            spec.model_id,
            hf_model_dtype(w.precision),
            hf_attn_implementation(w.attention)
        ),
        format!(
            "  feed micro-batches of {} sequences × {} tokens (no padding), {} micro-batch(es) per optimizer step",
            w.batch, w.seq, w.grad_accum
        ),
    ];
    if w.checkpointing && !checkpointing_in_config {
        notes.push(
            "  model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={\"use_reentrant\": False})"
                .to_string(),
        );
    }
    if let Some(l) = &w.lora {
        notes.push(format!(
            "  model = get_peft_model(model, LoraConfig(r={}, target_modules={:?}, lora_dropout=0.0, bias=\"none\", task_type=\"CAUSAL_LM\"))",
            l.rank, l.targets
        ));
        if l.qlora {
            notes.push(
                "  load with quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=\"nf4\", bnb_4bit_use_double_quant=True)"
                    .to_string(),
            );
            notes.push(
                "  and do not call prepare_model_for_kbit_training (it casts the unquantised weights to fp32)"
                    .to_string(),
            );
        }
    }
    if !w.dropout && (spec.shape.attention_dropout > 0.0 || spec.shape.hidden_dropout > 0.0) {
        notes.push("  (the estimate has dropout off: every *dropout*/*pdrop* field of the model config is 0)".to_string());
    }
    notes
}
