//! Byte counts.

use serde::Serialize;
use std::fmt;

/// A number of bytes. Arithmetic on sizes in this crate is checked (see [`checked_mul`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
#[serde(transparent)]
pub struct Bytes(pub u64);

impl Bytes {
    /// Zero bytes.
    pub const ZERO: Bytes = Bytes(0);

    /// Gibibytes as a float, for display.
    pub fn gib(self) -> f64 {
        self.0 as f64 / (1u64 << 30) as f64
    }
}

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0 as f64;
        const KIB: f64 = 1024.0;
        if b >= KIB * KIB * KIB {
            write!(f, "{:.2} GiB", b / (KIB * KIB * KIB))
        } else if b >= KIB * KIB {
            write!(f, "{:.2} MiB", b / (KIB * KIB))
        } else if b >= KIB {
            write!(f, "{:.2} KiB", b / KIB)
        } else {
            write!(f, "{} B", self.0)
        }
    }
}

/// Multiplies all factors, failing with [`crate::CoreError::Overflow`] naming `what`.
pub fn checked_mul(factors: &[u64], what: &'static str) -> Result<u64, crate::CoreError> {
    factors
        .iter()
        .try_fold(1u64, |acc, &f| acc.checked_mul(f))
        .ok_or(crate::CoreError::Overflow { what })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_picks_unit() {
        assert_eq!(Bytes(512).to_string(), "512 B");
        assert_eq!(Bytes(3 << 30).to_string(), "3.00 GiB");
        assert_eq!(Bytes(1536 << 10).to_string(), "1.50 MiB");
    }

    #[test]
    fn checked_mul_detects_overflow() {
        assert_eq!(checked_mul(&[2, 3, 4], "x"), Ok(24));
        assert!(checked_mul(&[u64::MAX, 2], "x").is_err());
    }
}
