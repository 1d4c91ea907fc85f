//! Errors of the config parsers. Every message names the offending field (as written in
//! `config.json`, nested fields as `text_config.hidden_size`) and ends with a `hint:` line.
//! Text taken from the config (values, keys, serde's messages that quote them) is shown through
//! [`memwall_core::error::untrusted`]: escaped and cut, so a hostile config cannot drive the
//! terminal or flood it.

use memwall_core::error::untrusted;
use std::fmt;
use thiserror::Error;

/// Why a `config.json` could not be turned into a [`memwall_core::ModelDesc`].
#[derive(Debug, Error, Clone, PartialEq)]
pub enum FormatError {
    /// The text is not JSON at all.
    Json {
        /// 1-based line of the syntax error.
        line: usize,
        /// 1-based column of the syntax error.
        column: usize,
        /// serde_json's description.
        message: String,
    },
    /// No `model_type` key.
    MissingModelType,
    /// `model_type` names a family memwall does not know.
    UnknownModelType {
        /// The value found.
        model_type: String,
        /// Comma-separated list of supported types.
        supported: String,
    },
    /// A field every real config of this family has is absent.
    MissingField {
        /// Field name.
        field: String,
        /// Family.
        model_type: String,
        /// What to do.
        hint: String,
    },
    /// A field has a JSON type transformers would reject.
    WrongType {
        /// Field name.
        field: String,
        /// What serde found and expected.
        message: String,
        /// What to do.
        hint: String,
    },
    /// A size or probability is zero, negative or absurdly large.
    OutOfRange {
        /// Field name.
        field: String,
        /// The value as found.
        value: String,
        /// The accepted range.
        reason: String,
        /// What to do.
        hint: String,
    },
    /// Two or more fields contradict each other.
    Inconsistent {
        /// The fields involved, e.g. "`hidden_size`, `num_attention_heads`".
        fields: String,
        /// What is wrong.
        reason: String,
        /// What to do.
        hint: String,
    },
    /// A value transformers accepts but memwall cannot describe (or transformers cannot run).
    Unsupported {
        /// Field name.
        field: String,
        /// The value as found.
        value: String,
        /// Why.
        reason: String,
        /// What to do.
        hint: String,
    },
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}\nhint: {}", self.message(), self.hint())
    }
}

impl FormatError {
    /// The message without its hint, with text from the config made safe to show.
    pub fn message(&self) -> String {
        let u = |s: &str| untrusted(s);
        match self {
            FormatError::Json {
                line,
                column,
                message,
            } => format!(
                "config.json is not valid JSON (line {line}, column {column}): {}",
                u(message)
            ),
            FormatError::MissingModelType => "config.json has no `model_type`".into(),
            FormatError::UnknownModelType { model_type, .. } => {
                format!("unknown `model_type` \"{}\"", u(model_type))
            }
            FormatError::MissingField {
                field, model_type, ..
            } => format!(
                "missing required field `{}` (model_type \"{}\")",
                u(field),
                u(model_type)
            ),
            FormatError::WrongType { field, message, .. } => {
                format!("field `{}` has the wrong type: {}", u(field), u(message))
            }
            FormatError::OutOfRange {
                field,
                value,
                reason,
                ..
            } => format!(
                "field `{}` = {} is out of range: {reason}",
                u(field),
                u(value)
            ),
            FormatError::Inconsistent { fields, reason, .. } => {
                format!("inconsistent fields {fields}: {}", u(reason))
            }
            FormatError::Unsupported {
                field,
                value,
                reason,
                ..
            } => format!(
                "field `{}` = {} is not supported: {reason}",
                u(field),
                u(value)
            ),
        }
    }

    /// What to do about it.
    pub fn hint(&self) -> String {
        match self {
            FormatError::Json { .. } => {
                "pass the `config.json` of a Hugging Face model repository, unmodified".into()
            }
            FormatError::MissingModelType => "every transformers config.json names its architecture in `model_type` (e.g. \"llama\"); add it, or check that this is a model config and not a tokenizer or generation config".into(),
            FormatError::UnknownModelType { supported, .. } => {
                format!("supported model types: {supported}")
            }
            FormatError::MissingField { hint, .. }
            | FormatError::WrongType { hint, .. }
            | FormatError::OutOfRange { hint, .. }
            | FormatError::Inconsistent { hint, .. }
            | FormatError::Unsupported { hint, .. } => hint.clone(),
        }
    }

    /// The field this error is about, when it is about one field.
    pub fn field(&self) -> Option<&str> {
        match self {
            FormatError::MissingField { field, .. }
            | FormatError::WrongType { field, .. }
            | FormatError::OutOfRange { field, .. }
            | FormatError::Unsupported { field, .. } => Some(field),
            FormatError::MissingModelType | FormatError::UnknownModelType { .. } => {
                Some("model_type")
            }
            FormatError::Json { .. } | FormatError::Inconsistent { .. } => None,
        }
    }
}
