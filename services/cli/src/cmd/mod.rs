//! One module per group of subcommands.

pub mod access;
pub mod agent;
pub mod audit;
pub mod bench;
pub mod data_dir;
pub mod db;
pub mod dev;
pub mod gpu;
pub mod job;
pub mod node;
pub mod server;
pub mod tenant;
pub mod token;
pub mod usage;
pub mod volume;

use std::path::Path;

use anyhow::Context;

/// Writes a secret to a file only its owner can read.
pub fn write_secret(path: &Path, secret: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    allot_pki::write_private(path, &format!("{secret}\n"))
        .with_context(|| format!("writing {}", path.display()))
}

/// Reads a secret file written by [`write_secret`], if present.
pub use allot_client::read_secret_file as read_secret;

pub fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// A time in tables, to the minute (UTC); `-` when absent.
pub fn when(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    opt(t.map(|t| t.format("%Y-%m-%d %H:%M").to_string()))
}

/// A decimal count of whole units (GPUs, CPUs) in milli: `7.5` is 7500, `0.25` is 250.
pub fn parse_milli(s: &str) -> Result<u64, String> {
    let bad = || format!("`{s}` is not a number with at most three decimals, like 2 or 0.25");
    let (whole, frac) = s.trim().split_once('.').unwrap_or((s.trim(), ""));
    if whole.is_empty() && frac.is_empty() || frac.len() > 3 {
        return Err(bad());
    }
    let digits = |d: &str| d.chars().all(|c| c.is_ascii_digit());
    if !digits(whole) || !digits(frac) {
        return Err(bad());
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| bad())?
    };
    let frac: u64 = format!("{frac:0<3}").parse().map_err(|_| bad())?;
    whole
        .checked_mul(1000)
        .and_then(|w| w.checked_add(frac))
        .ok_or_else(bad)
}

/// Milli of a unit as a decimal: 7500 is `7.5`, 250 is `0.25`.
pub use allot_domain::format_gpus as show_gpus;
pub use allot_domain::format_milli as show_milli;

/// Seconds from `90s`, `15m`, `12h`, `30d` or a bare number of seconds.
pub(crate) fn parse_duration(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.char_indices().last() {
        Some((i, 's')) => (&s[..i], 1),
        Some((i, 'm')) => (&s[..i], 60),
        Some((i, 'h')) => (&s[..i], 3600),
        Some((i, 'd')) => (&s[..i], 86_400),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("`{s}` is not a duration such as 90m, 12h or 30d"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milli_round_trips() {
        assert_eq!(parse_milli("7.5"), Ok(7500));
        assert_eq!(parse_milli("0.25"), Ok(250));
        assert_eq!(parse_milli("3"), Ok(3000));
        assert_eq!(parse_milli(".5"), Ok(500));
        for bad in ["", ".", "1.2345", "-1", "x", "1e3"] {
            assert!(parse_milli(bad).is_err(), "{bad}");
        }
        assert_eq!(show_milli(7500), "7.5");
        assert_eq!(show_milli(250), "0.25");
        assert_eq!(show_milli(3000), "3");
    }
}
