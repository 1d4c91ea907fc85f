//! A plain table of text cells, and its CSV (RFC 4180) and GitHub-flavoured Markdown writers.

use std::io::{self, Write};

/// Column alignment in Markdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text.
    Left,
    /// Numbers.
    Right,
}

/// Rows of cells under named columns.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// Column names and alignments.
    pub columns: Vec<(&'static str, Align)>,
    /// Rows, each with one cell per column.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with these columns.
    pub fn new(columns: &[(&'static str, Align)]) -> Self {
        Table {
            columns: columns.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Appends a row.
    pub fn push(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    /// Writes the table as CSV: a header line, then one line per row; a field holding a comma,
    /// a quote or a line break is quoted, its quotes doubled (RFC 4180 §2).
    pub fn write_csv(&self, w: &mut dyn Write) -> io::Result<()> {
        let header: Vec<String> = self.columns.iter().map(|(c, _)| (*c).to_owned()).collect();
        for row in std::iter::once(&header).chain(&self.rows) {
            let line: Vec<String> = row.iter().map(|c| csv_field(c)).collect();
            writeln!(w, "{}", line.join(","))?;
        }
        Ok(())
    }

    /// Writes the table as a GitHub-flavoured Markdown table.
    pub fn write_markdown(&self, w: &mut dyn Write) -> io::Result<()> {
        let header: Vec<String> = self.columns.iter().map(|(c, _)| md_cell(c)).collect();
        writeln!(w, "| {} |", header.join(" | "))?;
        let rule: Vec<&str> = self
            .columns
            .iter()
            .map(|(_, a)| match a {
                Align::Left => "---",
                Align::Right => "---:",
            })
            .collect();
        writeln!(w, "|{}|", rule.join("|"))?;
        for row in &self.rows {
            let cells: Vec<String> = row.iter().map(|c| md_cell(c)).collect();
            writeln!(w, "| {} |", cells.join(" | "))?;
        }
        Ok(())
    }
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// Text safe inside a Markdown table cell: pipes escaped, line breaks as spaces.
pub fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace(['\n', '\r'], " ")
}

/// Text safe as inline Markdown: backslash-escapes the characters that start emphasis, code,
/// links or HTML.
pub fn md_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(
            c,
            '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '|' | '#'
        ) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The breakdown at a peak as a table (category, bytes, share of the peak); zero lines left out.
pub fn at_peak_table(at_peak: &super::text::NamedBytes, peak_bytes: u64) -> Table {
    let mut t = Table::new(&[
        ("at the peak", Align::Left),
        ("bytes", Align::Right),
        ("share", Align::Right),
    ]);
    for (k, b) in &at_peak.0 {
        if *b > 0 {
            t.push(vec![
                (*k).to_owned(),
                memwall_core::Bytes(*b).to_string(),
                format!("{:.1}%", super::text::percent(*b, peak_bytes)),
            ]);
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_only_what_needs_it() {
        let mut t = Table::new(&[("a", Align::Left), ("b", Align::Right)]);
        t.push(vec!["x,y".into(), "1".into()]);
        t.push(vec!["say \"hi\"".into(), "2".into()]);
        let mut out = Vec::new();
        t.write_csv(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "a,b\n\"x,y\",1\n\"say \"\"hi\"\"\",2\n"
        );
    }

    #[test]
    fn markdown_escapes_pipes_and_aligns_numbers() {
        let mut t = Table::new(&[("name", Align::Left), ("n", Align::Right)]);
        t.push(vec!["a|b".into(), "3".into()]);
        let mut out = Vec::new();
        t.write_markdown(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "| name | n |\n|---|---:|\n| a\\|b | 3 |\n"
        );
    }
}
