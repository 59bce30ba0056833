//! Human output: aligned tables; `-o json` prints the API's JSON instead.

use clap::ValueEnum;
use serde::Serialize;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A readable table.
    #[default]
    Table,
    /// The API's JSON, for scripts.
    Json,
}

/// Prints `value` as the API's JSON, or as the text `human` renders from it.
pub fn print<T: Serialize>(
    format: Format,
    value: &T,
    human: impl FnOnce(&T) -> String,
) -> anyhow::Result<()> {
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(value)?),
        Format::Table => println!("{}", human(value)),
    }
    Ok(())
}

/// Renders rows under headers with columns padded to their widest cell.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| terminal_safe(c).into_owned()).collect())
        .collect();
    let rows = rows.as_slice();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.trim_end().to_owned()
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push('\n');
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// Key/value lines for a single object.
/// `s` safe to show on a terminal: control characters other than newline and tab, and
/// text-direction controls, written as `\u{…}` escapes, so nothing a job or another tenant
/// wrote (an OSC 52 clipboard write, a cursor move, a right-to-left override) acts on the
/// terminal of whoever reads it.
pub fn terminal_safe(s: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| {
        (c.is_control() && c != '\n' && c != '\t') || allot_domain::job::is_bidi_control(c)
    };
    if !s.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

pub fn fields(pairs: &[(&str, String)]) -> String {
    // Keys are followed by a colon, so columns line up one past the longest key.
    let width = pairs.iter().map(|(k, _)| k.len() + 1).max().unwrap_or(0);
    pairs
        .iter()
        .map(|(k, v)| {
            format!("{:<width$}  {}", format!("{k}:"), terminal_safe(v))
                .trim_end()
                .to_owned()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod terminal_tests {
    #[test]
    fn escapes_reach_the_terminal_as_text() {
        let osc52 = "done\n\u{1b}]52;c;ZXZpbA==\u{7}\tok";
        assert_eq!(
            super::terminal_safe(osc52),
            "done\n\\u{1b}]52;c;ZXZpbA==\\u{7}\tok"
        );
        assert_eq!(
            super::terminal_safe("train\u{202e}gnp.exe"),
            "train\\u{202e}gnp.exe"
        );
        assert!(matches!(
            super::terminal_safe("plain"),
            std::borrow::Cow::Borrowed(_)
        ));
        let t = super::table(&["NAME"], &[vec!["a\u{1b}[2J".into()]]);
        assert!(!t.contains('\u{1b}'), "{t}");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn aligns_columns() {
        let t = super::table(
            &["ID", "STATE"],
            &[
                vec!["abc".into(), "running".into()],
                vec!["a".into(), "x".into()],
            ],
        );
        assert_eq!(t, "ID   STATE\nabc  running\na    x");
    }
}
