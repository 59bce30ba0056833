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
pub fn fields(pairs: &[(&str, String)]) -> String {
    // Keys are followed by a colon, so columns line up one past the longest key.
    let width = pairs.iter().map(|(k, _)| k.len() + 1).max().unwrap_or(0);
    pairs
        .iter()
        .map(|(k, v)| {
            format!("{:<width$}  {v}", format!("{k}:"))
                .trim_end()
                .to_owned()
        })
        .collect::<Vec<_>>()
        .join("\n")
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
