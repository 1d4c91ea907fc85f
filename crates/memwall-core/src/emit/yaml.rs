//! The YAML the emitters write: a block-style mapping of scalars, nested mappings and
//! sequences of scalars — what accelerate's and vLLM's config files are.
//!
//! Why not a crate: `serde_yaml` is deprecated and archived, `serde_yml` carries an
//! unsoundness advisory (RUSTSEC-2025-0068), and what is written here is a small, fixed subset.
//! Every string is written as a double-quoted scalar with JSON escapes — valid YAML 1.1 and 1.2
//! (YAML 1.2 §7.3.1; PyYAML reads it the same) — so no plain scalar can be misread (`no`,
//! `on`, `1e3`, `~`). Keys are identifiers and are written plain. Numbers, booleans and null
//! are written as JSON writes them, which YAML's core schema reads back as the same values.

use serde_json::Value;

/// `value` (a mapping) as a YAML document body.
pub(super) fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value, 0);
    out
}

fn key(k: &str) -> String {
    let plain = !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
    if plain {
        k.to_string()
    } else {
        scalar(&Value::String(k.to_string()))
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::Object(m) if m.is_empty() => "{}".to_string(),
        Value::Array(a) if a.is_empty() => "[]".to_string(),
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

fn is_nested(v: &Value) -> bool {
    match v {
        Value::Object(m) => !m.is_empty(),
        Value::Array(a) => !a.is_empty(),
        _ => false,
    }
}

fn write_value(out: &mut String, value: &Value, indent: usize) {
    let pad = " ".repeat(indent);
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                if is_nested(v) {
                    out.push_str(&format!("{pad}{}:\n", key(k)));
                    write_value(out, v, indent + 2);
                } else {
                    out.push_str(&format!("{pad}{}: {}\n", key(k), scalar(v)));
                }
            }
        }
        Value::Array(items) => {
            for v in items {
                // sequences of scalars only (nested values are flow-written as JSON, which is YAML)
                out.push_str(&format!("{pad}- {}\n", scalar(v)));
            }
        }
        other => out.push_str(&format!("{pad}{}\n", scalar(other))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strings_are_quoted_and_structure_is_block_style() {
        let v = json!({
            "mixed_precision": "no",
            "num_processes": 8,
            "fsdp_config": {"fsdp_version": 2, "fsdp_offload_params": false},
            "list": ["a", 1],
            "empty": {},
            "x y": null,
        });
        assert_eq!(
            to_yaml(&v),
            "mixed_precision: \"no\"\nnum_processes: 8\nfsdp_config:\n  fsdp_version: 2\n  \
             fsdp_offload_params: false\nlist:\n  - \"a\"\n  - 1\nempty: {}\n\"x y\": null\n"
        );
    }
}
