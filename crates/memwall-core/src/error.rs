//! Errors of the core crate.

use thiserror::Error;

/// An input the core model refuses, with the offending field named.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CoreError {
    /// A field's value is outside what the model can describe.
    #[error("invalid `{field}`: {reason}")]
    Invalid {
        /// The field name as the user wrote it.
        field: &'static str,
        /// Why it is refused.
        reason: String,
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

impl CoreError {
    /// Shorthand for [`CoreError::Invalid`].
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        CoreError::Invalid {
            field,
            reason: reason.into(),
        }
    }
}
