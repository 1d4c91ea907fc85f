//! Errors of the core crate, and the one function that makes untrusted text safe to show.
//!
//! Every refusal names the field (as the core model calls it: `batch`, `seq`, `tp`, …), the
//! offending value where there is one, why it is refused, and a hint that fits that refusal.
//! Reasons and hints refer to other fields in backticks (`` `tp` ``), so a front end can map
//! field names to its own spelling (the CLI maps `tp` to `--tp`).

use std::fmt;
use thiserror::Error;

/// An input the core model refuses, with the offending field named.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CoreError {
    /// A field's value is outside what the model can describe.
    #[error("invalid `{field}`{}: {reason}", ValueSuffix(value.as_deref()))]
    Invalid {
        /// The field name, as the core model calls it (`batch`, `tp`, `num_hidden_layers`, …).
        field: &'static str,
        /// The offending value as written (already made safe to show), when one value is at fault.
        value: Option<String>,
        /// Why it is refused.
        reason: String,
        /// What to do instead; `None` falls back to [`CoreError::hint`]'s per-field default.
        hint: Option<String>,
    },
    /// A combination the engine that runs it does not support (its row of
    /// `engine::TABLE`): refused by name, never approximated.
    #[error("{engine} does not support {field} `{value}`: {reason}")]
    Unsupported {
        /// The field as the user wrote it (`optimizer`, `offload`, …).
        field: &'static str,
        /// The refused value, as the user spells it.
        value: String,
        /// The engine, in words (`DeepSpeed ZeRO-2`).
        engine: &'static str,
        /// Why, citing the engine's source.
        reason: &'static str,
        /// What to do instead.
        hint: &'static str,
    },
    /// An arithmetic result does not fit in 64 bits (absurd sizes).
    #[error("size overflow while computing {what}: the model or workload is absurdly large")]
    Overflow {
        /// What was being computed.
        what: &'static str,
    },
}

/// Formats ` = value` when a value is known.
struct ValueSuffix<'a>(Option<&'a str>);

impl fmt::Display for ValueSuffix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(v) => write!(f, " = {v}"),
            None => Ok(()),
        }
    }
}

impl CoreError {
    /// A refusal of `field` without a specific value or hint (the hint falls back to the
    /// field's default, see [`CoreError::hint`]). Prefer [`CoreError::invalid_value`].
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        CoreError::Invalid {
            field,
            value: None,
            reason: reason.into(),
            hint: None,
        }
    }

    /// A refusal of `field` = `value`, with a hint fitting this refusal.
    pub fn invalid_value(
        field: &'static str,
        value: impl fmt::Display,
        reason: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        CoreError::Invalid {
            field,
            value: Some(untrusted(&value.to_string())),
            reason: reason.into(),
            hint: Some(hint.into()),
        }
    }

    /// A refusal of a setting that has no value to show (a switch that was turned on).
    pub fn refused(
        field: &'static str,
        reason: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        CoreError::Invalid {
            field,
            value: None,
            reason: reason.into(),
            hint: Some(hint.into()),
        }
    }

    /// `field` = `value` outside `min..=max`.
    pub fn out_of_range(field: &'static str, value: u64, min: u64, max: u64) -> Self {
        CoreError::invalid_value(
            field,
            value,
            format!("must be in {min}..={max}"),
            format!("set `{field}` between {min} and {max}"),
        )
    }

    /// The field at fault, if the error is about one.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            CoreError::Invalid { field, .. } | CoreError::Unsupported { field, .. } => Some(field),
            CoreError::Overflow { .. } => None,
        }
    }

    /// The offending value, if known.
    pub fn value(&self) -> Option<&str> {
        match self {
            CoreError::Invalid { value, .. } => value.as_deref(),
            CoreError::Unsupported { value, .. } => Some(value),
            CoreError::Overflow { .. } => None,
        }
    }

    /// Why the input is refused (the message without the field and value).
    pub fn reason(&self) -> String {
        match self {
            CoreError::Invalid { reason, .. } => reason.clone(),
            CoreError::Unsupported { engine, reason, .. } => {
                format!("{engine} does not support it: {reason}")
            }
            CoreError::Overflow { what } => format!(
                "a size overflows 64 bits while computing {what}: the model or workload is absurdly large"
            ),
        }
    }

    /// What to do: the hint attached where the error was made, else the field's default.
    pub fn hint(&self) -> String {
        match self {
            CoreError::Invalid {
                hint: Some(h), ..
            } => h.clone(),
            CoreError::Invalid { field, .. } => default_hint(field).to_owned(),
            CoreError::Unsupported { hint, .. } => (*hint).to_owned(),
            CoreError::Overflow { .. } => {
                "reduce `batch`, `seq` or the model's sizes; real models and workloads stay far below 64-bit sizes"
                    .to_owned()
            }
        }
    }
}

/// Hints for refusals made without one ([`CoreError::invalid`]), by field.
fn default_hint(field: &str) -> &'static str {
    match field {
        "num_hidden_layers" => "the model config must describe at least one decoder layer",
        "optimizer" => "pick an optimizer the chosen `strategy` models (adamw or sgd shard their states)",
        "qlora" => "QLoRA is modelled on one GPU or with plain DDP: set `strategy` to ddp",
        "lora_rank" => "drop LoRA, or drop tensor/pipeline parallelism (`tp`, `pp`, `cp`, `ep` = 1)",
        "pp" => "pick `pp` (× `virtual_stages`) that divides the model's number of layers",
        "cp" => "pick `cp` that divides `seq`, or a `seq` that is a multiple of `cp`",
        "tp" => "pick `tp` that divides the model's attention heads (a power of two usually does)",
        "ep" => "pick `ep` that divides the number of experts of a mixture-of-experts model, or leave it at 1",
        "weights" => "use one of the weight formats listed above",
        _ => "check the value against the limits in the documentation",
    }
}

/// Largest number of characters of untrusted text shown in a message.
pub const MAX_SHOWN_CHARS: usize = 200;

/// Makes untrusted text (a value from a config file or the command line) safe to show on a
/// terminal: control characters (escape sequences, newlines, bell) and bidirectional-override
/// characters are written as `\u{…}` escapes, and text past [`MAX_SHOWN_CHARS`] characters is
/// cut with a note of how much was left out. Every message that echoes such text uses this.
pub fn untrusted(text: &str) -> String {
    let mut out = String::new();
    for (shown, (i, c)) in text.char_indices().enumerate() {
        if shown == MAX_SHOWN_CHARS {
            let rest = text.len() - i;
            out.push_str(&format!("… ({rest} more bytes)"));
            return out;
        }
        if c.is_control() || is_bidi_control(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// Unicode bidirectional formatting characters, which can make shown text read differently
/// from what it is (CVE-2021-42574).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' | '\u{061C}')
}

/// `a · b`, or a refusal of `field` = `a` when the product does not fit in 64 bits.
pub fn checked_mul(field: &'static str, a: u64, b: u64) -> Result<u64, CoreError> {
    a.checked_mul(b).ok_or_else(|| {
        CoreError::invalid_value(
            field,
            a,
            format!("× {b} does not fit in 64 bits"),
            format!("use a smaller `{field}`"),
        )
    })
}

/// `a + b`, or a refusal of `field` = `a` when the sum does not fit in 64 bits.
pub fn checked_add(field: &'static str, a: u64, b: u64) -> Result<u64, CoreError> {
    a.checked_add(b).ok_or_else(|| {
        CoreError::invalid_value(
            field,
            a,
            format!("+ {b} does not fit in 64 bits"),
            format!("use a smaller `{field}`"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untrusted_text_is_escaped_and_cut() {
        assert_eq!(untrusted("llama"), "llama");
        assert_eq!(untrusted("a\u{1b}[31mb\n"), "a\\u{1b}[31mb\\u{a}");
        assert_eq!(untrusted("x\u{202e}y"), "x\\u{202e}y");
        let long = "é".repeat(1000);
        let shown = untrusted(&long);
        assert!(shown.starts_with(&"é".repeat(MAX_SHOWN_CHARS)));
        assert!(shown.ends_with("… (1600 more bytes)"), "{shown}");
    }

    #[test]
    fn checked_arithmetic_names_the_field() {
        assert_eq!(checked_mul("batch", 3, 4), Ok(12));
        assert_eq!(checked_add("batch", 3, 4), Ok(7));
        let e = checked_mul("batch", u64::MAX, 2).unwrap_err();
        assert_eq!(e.field(), Some("batch"));
        assert_eq!(e.value(), Some(u64::MAX.to_string().as_str()));
        assert!(e.hint().contains("`batch`"));
        let e = checked_add("seq", u64::MAX, 1).unwrap_err();
        assert_eq!(e.field(), Some("seq"));
    }

    #[test]
    fn every_error_has_a_hint() {
        for e in [
            CoreError::invalid("tp", "x"),
            CoreError::invalid("some_field", "x"),
            CoreError::Overflow { what: "x" },
            CoreError::out_of_range("batch", 0, 1, 8),
        ] {
            assert!(!e.hint().is_empty(), "{e}");
        }
        let e = CoreError::out_of_range("batch", 0, 1, 8);
        assert_eq!(e.to_string(), "invalid `batch` = 0: must be in 1..=8");
    }
}
