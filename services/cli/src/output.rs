//! Human output: aligned tables (`-o wide` with every column, `--format` with the columns
//! named); `-o json` and `-o yaml` print the API's own document instead.

use clap::ValueEnum;
use serde::Serialize;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A readable table.
    #[default]
    Table,
    /// A table with every column a list has (`--format` picks them instead).
    Wide,
    /// The API's JSON, for scripts.
    Json,
    /// The API's document as YAML.
    Yaml,
}

impl Format {
    /// Whether the API's document is printed (JSON or YAML) rather than text for people.
    pub fn is_document(self) -> bool {
        matches!(self, Format::Json | Format::Yaml)
    }
}

/// Prints `value` as the API's document (JSON, YAML), or as the text `human` renders.
pub fn print<T: Serialize>(
    format: Format,
    value: &T,
    human: impl FnOnce(&T) -> String,
) -> anyhow::Result<()> {
    print!("{}", render(format, value, human)?);
    Ok(())
}

/// What [`print`] prints, as text (for `--watch`, which prints it again).
pub fn render<T: Serialize>(
    format: Format,
    value: &T,
    human: impl FnOnce(&T) -> String,
) -> anyhow::Result<String> {
    Ok(match format {
        Format::Json => format!("{}\n", serde_json::to_string_pretty(value)?),
        Format::Yaml => serde_yaml_ng::to_string(value)?,
        Format::Table | Format::Wide => format!("{}\n", human(value)),
    })
}

/// One column a list can show: its name for `--format`, its header, whether plain tables
/// show it (`-o wide` and `--format` show any), and its cell.
pub struct Column<T> {
    pub name: &'static str,
    pub header: &'static str,
    pub default: bool,
    pub cell: fn(&T) -> String,
}

impl<T> Column<T> {
    /// A column plain tables show.
    pub const fn new(name: &'static str, header: &'static str, cell: fn(&T) -> String) -> Self {
        Self {
            name,
            header,
            default: true,
            cell,
        }
    }

    /// A column only `-o wide` and `--format` show.
    pub const fn wide(name: &'static str, header: &'static str, cell: fn(&T) -> String) -> Self {
        Self {
            name,
            header,
            default: false,
            cell,
        }
    }
}

/// What `--format help` prints: each column's name, its header and whether plain tables
/// show it.
fn column_help<T>(all: &[Column<T>]) -> String {
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|c| {
            vec![
                c.name.to_owned(),
                c.header.to_owned(),
                if c.default { "table" } else { "wide" }.to_owned(),
            ]
        })
        .collect();
    table(&["COLUMN", "HEADER", "SHOWN BY"], &rows)
}

/// How a list is printed: `-o` and the columns of `--format`.
#[derive(Debug, Clone, clap::Args)]
pub struct ListOutput {
    /// table, wide (every column), json or yaml (the API's document).
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Format,
    /// The columns to show, comma-separated, in this order (e.g. id,name,state,gpus;
    /// `--format help` lists them).
    #[arg(long, value_name = "COLUMNS")]
    pub format: Option<String>,
}

impl ListOutput {
    /// The columns to show, in order; an unknown name is an error naming those there are.
    pub fn columns<'c, T>(&self, all: &'c [Column<T>]) -> anyhow::Result<Vec<&'c Column<T>>> {
        let names = || all.iter().map(|c| c.name).collect::<Vec<_>>().join(", ");
        if self.format.is_some() && self.output.is_document() {
            anyhow::bail!(
                "--format picks a table's columns; -o json and -o yaml print the whole document"
            );
        }
        let Some(format) = &self.format else {
            return Ok(all
                .iter()
                .filter(|c| c.default || self.output == Format::Wide)
                .collect());
        };
        if format.trim().eq_ignore_ascii_case("help") {
            // As `--help` does: what was asked for is the list, and the command is done.
            print!("{}", column_help(all));
            std::process::exit(0);
        }
        let mut picked = Vec::new();
        for name in format.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let wanted = name.to_ascii_lowercase();
            match all.iter().find(|c| c.name == wanted) {
                Some(c) => picked.push(c),
                None => anyhow::bail!(
                    "--format: there is no column `{name}`; the columns are {}",
                    names()
                ),
            }
        }
        if picked.is_empty() {
            anyhow::bail!("--format: name at least one column: {}", names());
        }
        Ok(picked)
    }

    /// `document` as JSON or YAML, or `rows` as a table of the chosen columns.
    pub fn render<D: Serialize, T>(
        &self,
        document: &D,
        rows: &[T],
        all: &[Column<T>],
    ) -> anyhow::Result<String> {
        match self.output {
            Format::Json if self.format.is_none() => {
                Ok(format!("{}\n", serde_json::to_string_pretty(document)?))
            }
            Format::Yaml if self.format.is_none() => Ok(serde_yaml_ng::to_string(document)?),
            _ => {
                let columns = self.columns(all)?;
                let headers: Vec<&str> = columns.iter().map(|c| c.header).collect();
                let cells: Vec<Vec<String>> = rows
                    .iter()
                    .map(|r| columns.iter().map(|c| (c.cell)(r)).collect())
                    .collect();
                Ok(format!("{}\n", table(&headers, &cells)))
            }
        }
    }
}

/// `--watch`: how often a list is fetched and shown again.
#[derive(Debug, Clone, clap::Args)]
pub struct Watch {
    /// Keep showing the list, fetched again every --interval, until interrupted (Ctrl-C).
    /// On a terminal the screen is redrawn; elsewhere each changed listing is printed.
    #[arg(short, long)]
    pub watch: bool,
    /// Seconds between fetches with --watch.
    #[arg(long, default_value_t = 2.0, requires = "watch", value_parser = parse_interval)]
    pub interval: f64,
}

fn parse_interval(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.1..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not a number of seconds from 0.1 to 3600")),
    }
}

impl Watch {
    /// Prints what `fetch` renders; with `--watch`, again every interval while it changes,
    /// until Ctrl-C or SIGTERM. `title` heads each redrawn screen.
    pub async fn run<F, Fut>(&self, title: &str, mut fetch: F) -> anyhow::Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<String>>,
    {
        use std::io::Write;
        if !self.watch {
            print!("{}", fetch().await?);
            return Ok(());
        }
        let terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
        let every = std::time::Duration::from_secs_f64(self.interval);
        let mut last: Option<String> = None;
        let stop = crate::shutdown_signal();
        tokio::pin!(stop);
        loop {
            let text = fetch().await?;
            let mut out = std::io::stdout().lock();
            if terminal {
                // Home, clear: the newest listing replaces the last, as watch(1) shows it.
                write!(
                    out,
                    "\x1b[H\x1b[2J{title}  (every {}s; Ctrl-C stops)  {}\n\n{text}",
                    self.interval,
                    chrono::Utc::now().format("%Y-%m-%d %H:%M:%S UTC")
                )?;
            } else if last.as_deref() != Some(text.as_str()) {
                if last.is_some() {
                    writeln!(out)?;
                }
                write!(out, "{text}")?;
            }
            out.flush()?;
            drop(out);
            last = Some(text);
            tokio::select! {
                () = &mut stop => return Ok(()),
                () = tokio::time::sleep(every) => {}
            }
        }
    }
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
