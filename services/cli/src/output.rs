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

/// Text arriving in pieces (a followed log) decoded as UTF-8: a character split between
/// two pieces is held until the rest of it comes; bytes that are not UTF-8 become U+FFFD.
#[derive(Debug, Default)]
pub struct Utf8Pieces {
    held: Vec<u8>,
}

impl Utf8Pieces {
    /// The text of what came so far, but an incomplete character at its end.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.held.extend_from_slice(bytes);
        let cut = incomplete_tail(&self.held);
        let rest = self.held.split_off(cut);
        let text = String::from_utf8_lossy(&self.held).into_owned();
        self.held = rest;
        text
    }

    /// Whatever is still held, at the end.
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.held).into_owned();
        self.held.clear();
        text
    }
}

/// Where an incomplete UTF-8 sequence at the end of `b` starts (`b.len()` if none).
fn incomplete_tail(b: &[u8]) -> usize {
    for back in 1..=b.len().min(3) {
        let i = b.len() - back;
        let lead = b[i];
        if lead & 0b1100_0000 == 0b1000_0000 {
            continue; // a continuation byte: look further back
        }
        let needs = match lead {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if needs > back { i } else { b.len() };
    }
    b.len()
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

#[cfg(test)]
mod pieces_tests {
    use super::Utf8Pieces;

    #[test]
    fn a_character_split_between_pieces_comes_whole() {
        let text = "naïve — 日本 🎉\n";
        let bytes = text.as_bytes();
        for cut in 0..=bytes.len() {
            let mut p = Utf8Pieces::default();
            let mut out = p.push(&bytes[..cut]);
            out += &p.push(&bytes[cut..]);
            out += &p.finish();
            assert_eq!(out, text, "cut at {cut}");
        }
    }

    #[test]
    fn bytes_that_are_not_utf8_are_replaced_not_held() {
        let mut p = Utf8Pieces::default();
        assert_eq!(p.push(b"a\xffb"), "a\u{fffd}b");
        assert_eq!(p.push(b"\xe6"), "");
        assert_eq!(p.finish(), "\u{fffd}");
    }
}
