//! Errors of the parsers. Every config message names the offending field (as written in
//! `config.json`, nested fields as `text_config.hidden_size`); every header message names the
//! file format and, where there is one, the tensor or key. All end with a `hint:` line.
//! Text taken from the config (values, keys, serde's messages that quote them) is shown through
//! [`memwall_core::error::untrusted`]: escaped and cut, so a hostile config cannot drive the
//! terminal or flood it.

use memwall_core::error::untrusted;
use std::fmt;
use thiserror::Error;

/// The binary or index formats whose headers memwall reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    /// A `.safetensors` file.
    Safetensors,
    /// A `model.safetensors.index.json`.
    SafetensorsIndex,
    /// A `.gguf` file.
    Gguf,
}

impl std::fmt::Display for FileFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FileFormat::Safetensors => "safetensors",
            FileFormat::SafetensorsIndex => "safetensors index",
            FileFormat::Gguf => "GGUF",
        })
    }
}

/// What is wrong with a safetensors or GGUF header (one variant per class of defect, so
/// tests and callers can tell them apart).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum HeaderProblem {
    /// The file ends before something the header declares.
    #[error("{what} needs bytes up to offset {needed}, but the file has only {file_len} bytes")]
    Truncated {
        /// What was being read.
        what: String,
        /// The end offset it needs.
        needed: u64,
        /// The real file length.
        file_len: u64,
    },
    /// The file has bytes after the last tensor (the safetensors crate refuses these).
    #[error("the tensors end at byte {data_end}, but the file has {file_len} bytes")]
    TrailingBytes {
        /// End of the last tensor's data.
        data_end: u64,
        /// The real file length.
        file_len: u64,
    },
    /// A declared size or count is above memwall's (or the format's) limit.
    #[error("{what} is {value}, above the limit of {max}")]
    TooLarge {
        /// What was declared.
        what: String,
        /// The declared value.
        value: u64,
        /// The limit.
        max: u64,
    },
    /// Text that must be UTF-8 is not.
    #[error("{what} is not valid UTF-8 (byte offset {offset})")]
    InvalidUtf8 {
        /// What was being read.
        what: String,
        /// File offset of the first invalid byte.
        offset: u64,
    },
    /// A JSON header or index is malformed or has the wrong shape.
    #[error("invalid JSON: {message}")]
    Json {
        /// serde_json's description, with line and column.
        message: String,
    },
    /// Two tensors (or keys) share a name.
    #[error("{what} `{name}` appears twice")]
    Duplicate {
        /// "tensor" or "key".
        what: String,
        /// The repeated name.
        name: String,
    },
    /// One tensor's entry is inconsistent (size, offsets, dtype, rank).
    #[error("tensor `{tensor}`: {reason}")]
    Tensor {
        /// Tensor name.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// A metadata key has a value of the wrong type or an invalid value.
    #[error("key `{key}`: {reason}")]
    Value {
        /// Metadata key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The file does not start with the format's magic bytes.
    #[error("the file starts with {found:?}, not the magic {expected:?}")]
    BadMagic {
        /// The first bytes found.
        found: String,
        /// The magic expected.
        expected: String,
    },
    /// A format version this reader does not know.
    #[error("version {version} is not supported (supported: {supported})")]
    Version {
        /// The version found.
        version: u64,
        /// Supported versions.
        supported: String,
    },
}

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
    /// A safetensors or GGUF header (or a safetensors index) is malformed or hostile.
    Header {
        /// Which format.
        format: FileFormat,
        /// What is wrong.
        problem: HeaderProblem,
        /// What to do.
        hint: String,
    },
    /// The bytes passed in end inside the header while the file goes on: read at least
    /// `needed` bytes from the start of the file and parse again. (The readers take a prefix
    /// so they never touch tensor data; the caller decides how much to read.)
    NeedMoreBytes {
        /// Which format.
        format: FileFormat,
        /// Bytes that were passed in.
        have: u64,
        /// Bytes to pass in next time (a lower bound).
        needed: u64,
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
            FormatError::Header {
                format, problem, ..
            } => format!("{format} header: {}", u(&problem.to_string())),
            FormatError::NeedMoreBytes {
                format,
                have,
                needed,
            } => format!(
                "{format} header continues past the first {have} bytes; at least {needed} bytes are needed"
            ),
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
            FormatError::NeedMoreBytes { needed, .. } => {
                format!("read at least {needed} bytes from the start of the file and parse again")
            }
            FormatError::MissingField { hint, .. }
            | FormatError::Header { hint, .. }
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
            FormatError::Json { .. }
            | FormatError::Inconsistent { .. }
            | FormatError::Header { .. }
            | FormatError::NeedMoreBytes { .. } => None,
        }
    }
}
impl FormatError {
    /// A [`FormatError::Header`] with the given parts.
    pub(crate) fn header(format: FileFormat, problem: HeaderProblem, hint: &str) -> FormatError {
        FormatError::Header {
            format,
            problem,
            hint: hint.to_string(),
        }
    }
}
