//! User-facing errors. Every exit-2 message names the flag (or config field) and the offending
//! value and ends with one `hint:` line; the hint is attached where the error is made — by a
//! [`UserError`] here, a [`CoreError`] in the core or a [`FormatError`] in the config parser —
//! never found afterwards by matching text. The core speaks of fields (`batch`, `tp`, …);
//! [`FLAGS`] is the one table that maps them to this binary's flags.

use memwall_core::error::untrusted;
use memwall_core::CoreError;
use memwall_formats::FormatError;
use std::fmt;

/// An error made by the CLI itself: a message and what to do about it.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct UserError {
    /// What went wrong, naming the flag and the value (already made safe to show).
    pub message: String,
    /// What to do instead.
    pub hint: String,
}

impl UserError {
    /// An error with its hint.
    pub fn new(message: impl Into<String>, hint: impl Into<String>) -> Self {
        UserError {
            message: message.into(),
            hint: hint.into(),
        }
    }

    /// `invalid FLAG VALUE: reason`, the value shown through [`untrusted`].
    pub fn flag(
        flag: &str,
        value: impl fmt::Display,
        reason: impl fmt::Display,
        hint: impl Into<String>,
    ) -> Self {
        UserError::new(
            format!("invalid {flag} {}: {reason}", untrusted(&value.to_string())),
            hint,
        )
    }
}

/// Core field → flag. A field not listed is a field of the model's config.
pub const FLAGS: &[(&str, &str)] = &[
    ("batch", "--batch/-b"),
    ("seq", "--seq/-s"),
    ("grad_accum", "--grad-accum"),
    ("precision", "--precision"),
    ("optimizer", "--optimizer"),
    ("attention", "--attention"),
    ("lora_rank", "--lora-rank"),
    ("lora_targets", "--lora-targets"),
    ("qlora", "--qlora"),
    ("loss", "--loss"),
    ("padding_free", "--padding-free"),
    ("kernels", "--kernels"),
    ("matmul_efficiency", "--matmul-efficiency"),
    ("plan_rank", "--plan-rank"),
    ("top", "--top"),
    ("alloc_margin", "--alloc-margin"),
    ("flops_efficiency", "--flops-efficiency"),
    ("bandwidth_efficiency", "--bandwidth-efficiency"),
    ("gpus", "--gpus"),
    ("gpus_per_node", "--gpus-per-node"),
    ("strategy", "--strategy"),
    ("tp", "--tp"),
    ("sequence_parallel", "--sequence-parallel"),
    ("pp", "--pp"),
    ("schedule", "--schedule"),
    ("virtual_stages", "--virtual-stages"),
    ("cp", "--cp"),
    ("ep", "--ep"),
    ("offload", "--offload"),
    ("offload_device", "--offload-device"),
    ("global_batch", "--global-batch"),
    ("prompt", "--prompt"),
    ("new_tokens", "--new-tokens"),
    ("weights", "--weights"),
    ("kv_dtype", "--kv-dtype"),
    ("moe_decode_batched", "--moe-grouped-decode"),
    ("dtype", "--dtype"),
    ("gpu", "--gpu"),
    ("model", "--model/-m"),
    ("gpu_memory_utilization", "--gpu-memory-utilization"),
    ("kv_cache_dtype", "--kv-cache-dtype"),
    ("block_size", "--block-size"),
    ("max_model_len", "--max-model-len"),
    ("max_num_batched_tokens", "--max-num-batched-tokens"),
    ("max_num_seqs", "--max-num-seqs"),
    ("kv_cache_memory_bytes", "--kv-cache-memory-bytes"),
    ("non_torch_bytes", "--non-torch-bytes"),
    ("activation_peak_bytes", "--activation-bytes"),
    ("cuda_graph_bytes", "--cuda-graph-bytes"),
    ("request_lengths", "--request-lengths"),
    ("train_vision", "--train-vision"),
    ("image_tokens", "--image-tokens"),
    ("loop", "--loop"),
    ("checkpointing_policy", "--checkpointing-policy"),
    ("use_cache", "--use-cache"),
    ("activation_offload", "--activation-offload"),
    ("float8", "--float8"),
    ("float8_all_gather", "--float8-all-gather"),
];

/// The flag of a core field, or `None` for a field of the model's config.
pub fn flag_of(field: &str) -> Option<&'static str> {
    FLAGS
        .iter()
        .find(|(f, _)| *f == field)
        .map(|(_, flag)| *flag)
}

/// How a field is named to the user: its flag, or "model field `field`".
fn field_name(field: &str) -> String {
    match flag_of(field) {
        Some(flag) => flag.to_owned(),
        None => format!("model field `{field}`"),
    }
}

/// Rewrites `` `field` `` mentions of core fields in core text into their flags.
fn to_flags(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('`') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find('`') {
            Some(close) => {
                let name = &after[..close];
                match flag_of(name) {
                    Some(flag) => out.push_str(flag),
                    None => {
                        out.push('`');
                        out.push_str(name);
                        out.push('`');
                    }
                }
                rest = &after[close + 1..];
            }
            None => {
                out.push_str(&rest[open..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// A core error in this binary's words: message and hint.
pub fn from_core(e: &CoreError) -> UserError {
    if let CoreError::Unsupported {
        field,
        value,
        engine,
        reason,
        hint,
    } = e
    {
        return UserError::new(
            format!(
                "{engine} does not support {} `{value}`: {}",
                field_name(field),
                to_flags(reason)
            ),
            to_flags(hint),
        );
    }
    let message = match e.field() {
        Some(field) => match e.value() {
            Some(value) => format!(
                "invalid {} {value}: {}",
                field_name(field),
                to_flags(&e.reason())
            ),
            None => format!("invalid {}: {}", field_name(field), to_flags(&e.reason())),
        },
        None => to_flags(&e.reason()),
    };
    UserError::new(message, to_flags(&e.hint()))
}

/// The lines of an error report: `error: …`, `  caused by: …` for each cause, then `hint: …`.
pub fn report(e: &anyhow::Error) -> Vec<String> {
    let mut lines = Vec::new();
    let mut hint = None;
    for (i, cause) in e.chain().enumerate() {
        let (text, h) = if let Some(u) = cause.downcast_ref::<UserError>() {
            (u.message.clone(), Some(u.hint.clone()))
        } else if let Some(c) = cause.downcast_ref::<CoreError>() {
            let u = from_core(c);
            (u.message, Some(u.hint))
        } else if let Some(f) = cause.downcast_ref::<FormatError>() {
            (f.message(), Some(f.hint()))
        } else if let Some(p) = cause.downcast_ref::<crate::given::PrefixTooShort>() {
            (p.message(), Some(p.hint()))
        } else {
            // text from elsewhere (I/O errors, contexts naming paths): made safe to show
            (untrusted(&cause.to_string()), None)
        };
        // the innermost hint is the most specific
        if h.is_some() {
            hint = h;
        }
        for (j, line) in text.lines().enumerate() {
            let prefix = match (i, j) {
                (0, 0) => "error: ",
                (_, 0) => "  caused by: ",
                _ => "  ",
            };
            lines.push(format!("{prefix}{line}"));
        }
    }
    lines.push(format!(
        "hint: {}",
        hint.unwrap_or_else(|| {
            "no input should lead here; please report it with the command line you ran".into()
        })
    ));
    lines
}

/// Prints a command-line parsing error (clap's) with a hint, and returns its exit code.
pub fn clap_error(e: &clap::Error) -> u8 {
    let code = u8::try_from(e.exit_code()).unwrap_or(2);
    if !e.use_stderr() {
        // --help and --version: not errors
        let _ = e.print();
        return code;
    }
    for line in clap_lines(e) {
        eprintln!("{line}");
    }
    code
}

/// The lines of a command-line parsing error (clap's), made safe to show, then its `hint: …`
/// (for `--help` and `--version`, the text clap prints).
pub fn clap_lines(e: &clap::Error) -> Vec<String> {
    use clap::error::ErrorKind;
    if !e.use_stderr() {
        return e.render().to_string().lines().map(str::to_owned).collect();
    }
    let text = e.render().to_string();
    let text = text
        .trim_end()
        .trim_end_matches("For more information, try '--help'.")
        .trim_end();
    let mut lines: Vec<String> = text.lines().map(untrusted).collect();
    let hint = match e.kind() {
        ErrorKind::InvalidValue | ErrorKind::ValueValidation | ErrorKind::InvalidUtf8 => {
            "`memwall <command> --help` lists every flag with its accepted values"
        }
        ErrorKind::UnknownArgument => "`memwall <command> --help` lists the flags of a command",
        ErrorKind::InvalidSubcommand | ErrorKind::MissingSubcommand => {
            "`memwall --help` lists the commands"
        }
        _ => "`memwall <command> --help` shows how to call a command",
    };
    lines.push(format!("hint: {hint}"));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_fields_become_flags() {
        let e = CoreError::invalid_value(
            "seq",
            7,
            "sequence parallelism splits the sequence over `tp` = 8 ranks",
            "use a `seq` that is a multiple of 8, or drop `sequence_parallel`",
        );
        let u = from_core(&e);
        assert_eq!(
            u.message,
            "invalid --seq/-s 7: sequence parallelism splits the sequence over --tp = 8 ranks"
        );
        assert_eq!(
            u.hint,
            "use a --seq/-s that is a multiple of 8, or drop --sequence-parallel"
        );
        let e = CoreError::invalid("num_hidden_layers", "the model has no layers");
        assert!(from_core(&e)
            .message
            .starts_with("invalid model field `num_hidden_layers`"));
    }

    #[test]
    fn every_core_field_a_flag_maps_to_is_unique() {
        let mut fields: Vec<&str> = FLAGS.iter().map(|(f, _)| *f).collect();
        fields.sort_unstable();
        fields.dedup();
        assert_eq!(fields.len(), FLAGS.len());
    }

    #[test]
    fn unbalanced_backticks_are_kept() {
        assert_eq!(to_flags("a `tp b"), "a `tp b");
        assert_eq!(to_flags("`x` and `tp`"), "`x` and --tp");
    }
}
