//! Small formatting helpers shared by the renderers.

use memwall_core::memory::{Category, Phase};
use serde::{Serialize, Serializer};

/// An ordered list of named values that serialises as a JSON object in that order
/// (`{"weights": 123, …}`).
#[derive(Debug, Clone, PartialEq)]
pub struct Entries<K, V>(pub Vec<(K, V)>);

impl<K: Serialize, V: Serialize> Serialize for Entries<K, V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// Bytes by name (breakdowns at a peak, peaks by phase).
pub type NamedBytes = Entries<&'static str, u64>;

/// Human-friendly parameter count.
pub fn count(n: u64) -> String {
    let f = n as f64;
    if f >= 1e9 {
        format!("{:.2}B", f / 1e9)
    } else if f >= 1e6 {
        format!("{:.1}M", f / 1e6)
    } else {
        n.to_string()
    }
}

/// A quantity with an SI prefix (`1.23 G`).
pub fn si(v: f64) -> String {
    let (d, u) = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
        .into_iter()
        .find(|(d, _)| v >= *d)
        .unwrap_or((1.0, ""));
    format!("{:.2} {u}", v / d)
}

/// A phase as sentences name it.
pub fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Forward => "forward",
        Phase::Loss => "loss (logits + cross-entropy)",
        Phase::Backward => "backward",
        Phase::Optimizer => "optimizer step",
        Phase::Prefill => "prefill",
        Phase::Decode => "decode",
    }
}

/// A phase in one word (table cells, JSON keys).
pub fn phase_word(p: Phase) -> &'static str {
    phase_name(p).split(' ').next().unwrap_or("")
}

/// A category as the train report names it.
pub fn category_name(c: Category) -> &'static str {
    match c {
        Category::Weights => "weights",
        Category::Buffers => "buffers",
        Category::Gradients => "gradients",
        Category::OptimizerStates => "optimizer_states",
        Category::Activations => "activations",
        Category::LossBuffers => "logits_and_loss",
        Category::Temporaries => "backward_temporaries",
        Category::OptimizerTemporaries => "optimizer_temporaries",
        Category::CommBuffers => "communication_buffers",
    }
}

/// A breakdown at a peak, named as the train report names categories.
pub fn breakdown(at_peak: &[(Category, u64)]) -> NamedBytes {
    Entries(
        at_peak
            .iter()
            .map(|(c, b)| (category_name(*c), *b))
            .collect(),
    )
}

/// The name a unit-like enum serialises to (`"bf16"`, `"sdpa"`), or `?`.
pub fn serde_name<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

/// A percentage of `part` in `whole` (0 when `whole` is 0).
pub fn percent(part: u64, whole: u64) -> f64 {
    100.0 * part as f64 / whole.max(1) as f64
}
