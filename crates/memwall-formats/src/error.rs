//! Errors of the config parsers. Every message names the offending field (as written in
//! `config.json`, nested fields as `text_config.hidden_size`) and ends with a `hint:` line.

use thiserror::Error;

/// Why a `config.json` could not be turned into a [`memwall_core::ModelDesc`].
#[derive(Debug, Error, Clone, PartialEq)]
pub enum FormatError {
    /// The text is not JSON at all.
    #[error("config.json is not valid JSON (line {line}, column {column}): {message}\nhint: pass the `config.json` of a Hugging Face model repository, unmodified")]
    Json {
        /// 1-based line of the syntax error.
        line: usize,
        /// 1-based column of the syntax error.
        column: usize,
        /// serde_json's description.
        message: String,
    },
    /// No `model_type` key.
    #[error("config.json has no `model_type`\nhint: every transformers config.json names its architecture in `model_type` (e.g. \"llama\"); add it, or check that this is a model config and not a tokenizer or generation config")]
    MissingModelType,
    /// `model_type` names a family memwall does not know.
    #[error("unknown `model_type` \"{model_type}\"\nhint: supported model types: {supported}")]
    UnknownModelType {
        /// The value found.
        model_type: String,
        /// Comma-separated list of supported types.
        supported: String,
    },
    /// A field every real config of this family has is absent.
    #[error("missing required field `{field}` (model_type \"{model_type}\")\nhint: {hint}")]
    MissingField {
        /// Field name.
        field: String,
        /// Family.
        model_type: String,
        /// What to do.
        hint: String,
    },
    /// A field has a JSON type transformers would reject.
    #[error("field `{field}` has the wrong type: {message}\nhint: {hint}")]
    WrongType {
        /// Field name.
        field: String,
        /// What serde found and expected.
        message: String,
        /// What to do.
        hint: String,
    },
    /// A size or probability is zero, negative or absurdly large.
    #[error("field `{field}` = {value} is out of range: {reason}\nhint: {hint}")]
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
    #[error("inconsistent fields {fields}: {reason}\nhint: {hint}")]
    Inconsistent {
        /// The fields involved, e.g. "`hidden_size`, `num_attention_heads`".
        fields: String,
        /// What is wrong.
        reason: String,
        /// What to do.
        hint: String,
    },
    /// A value transformers accepts but memwall cannot describe (or transformers cannot run).
    #[error("field `{field}` = {value} is not supported: {reason}\nhint: {hint}")]
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

impl FormatError {
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
