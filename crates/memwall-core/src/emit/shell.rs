//! POSIX shell quoting for the launch scripts.

/// `s` as one shell word: unchanged when it has only safe characters, else single-quoted.
pub(super) fn quote(s: &str) -> String {
    let safe = !s.is_empty()
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(c, '-' | '_' | '.' | '/' | ':' | '=' | ',' | '+' | '@')
        });
    if safe {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// A bash array assignment, one element (or flag with its value) per line:
/// `NAME=(\n  --flag value\n  --switch\n)`.
pub(super) fn array(name: &str, args: &[(String, Option<String>)]) -> String {
    let mut s = format!("{name}=(\n");
    for (flag, value) in args {
        match value {
            Some(v) => s.push_str(&format!("  {} {}\n", quote(flag), quote(v))),
            None => s.push_str(&format!("  {}\n", quote(flag))),
        }
    }
    s.push_str(")\n");
    s
}

/// `$VAR` with a default, quoted for the shell: `"${VAR:-default}"`.
pub(super) fn var(name: &str, default: &str) -> String {
    format!("\"${{{name}:-{}}}\"", default.replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote("meta-llama/Llama-3.1-8B"), "meta-llama/Llama-3.1-8B");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote(""), "''");
    }
}
