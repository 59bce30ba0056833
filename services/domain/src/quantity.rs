//! Byte quantities as people write them: `80GiB`, `512MiB`, `16G`, `1073741824`.

/// The largest quantity Allot accepts anywhere (1 PiB): above it a number is a typo.
pub const MAX_BYTES: u64 = 1 << 50;

/// Parses a byte quantity. Binary suffixes (`KiB`, `MiB`, `GiB`, `TiB`, and the single
/// letters `K`, `M`, `G`, `T` as Slurm's `--mem` and Docker's `-m` read them) and decimal ones
/// (`KB`, `MB`, `GB`, `TB`) are accepted, case-insensitively; no suffix means bytes.
pub fn parse_bytes(input: &str) -> Result<u64, String> {
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    if number.is_empty() {
        return Err(format!("`{input}` is not a quantity such as 80GiB"));
    }
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "t" | "ti" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "unknown unit `{other}` (use B; K, M, G, T or KiB, MiB, GiB, TiB for powers of 1024; KB, MB, GB, TB for powers of 1000)"
            ));
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{number}` is not a number"))?;
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes > MAX_BYTES as f64 {
        return Err(format!("`{input}` is larger than the maximum of 1 PiB"));
    }
    Ok(bytes.round() as u64)
}

/// Below this, a number without a unit given as a memory size is refused: `--memory 16`
/// almost surely meant 16 GiB, not 16 bytes.
pub const MIN_BARE_MEMORY: u64 = 1 << 20;

/// A memory size as people give it (a command-line flag, a form): [`parse_bytes`], except
/// that a bare number below 1 MiB is refused as a unit left out (`16B` says bytes).
pub fn parse_memory(input: &str) -> Result<u64, String> {
    let s = input.trim();
    let bytes = parse_bytes(s)?;
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && bytes < MIN_BARE_MEMORY {
        return Err(format!(
            "`{s}` has no unit and would be {s} bytes: write e.g. {s}GiB or {s}MiB ({s}B if bytes are meant)"
        ));
    }
    Ok(bytes)
}

/// Formats bytes with the largest binary unit that keeps the number at or above one.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else if value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Seconds as D-HH:MM:SS (days only when there are some), as Slurm shows times
/// (negative lengths are none).
pub fn format_clock(secs: i64) -> String {
    let s = secs.max(0);
    let (d, h, m, s) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

/// A length of time in seconds as people say it, to two units: `42s`, `3m 5s`, `2h 10m`,
/// `3d 4h` (negative lengths are none).
pub fn format_duration(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {}m", s / 3600, s / 60 % 60),
        _ => format!("{}d {}h", s / 86_400, s / 3600 % 24),
    }
}

/// A count kept in thousandths (GPU or CPU milli) as a decimal: 7500 is `7.5`, 250 is
/// `0.25`, 2000 is `2`.
/// GPUs to three decimals, trailing zeros dropped: `2`, `0.25`, `0.143`.
pub fn format_gpus(gpus: f64) -> String {
    format_milli((gpus.max(0.0) * 1000.0).round() as u64)
}

pub fn format_milli(m: u64) -> String {
    let (whole, frac) = (m / 1000, m % 1000);
    if frac == 0 {
        whole.to_string()
    } else {
        format!("{whole}.{frac:03}")
            .trim_end_matches('0')
            .to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_and_decimal_units() {
        assert_eq!(parse_bytes("80GiB"), Ok(80 << 30));
        assert_eq!(parse_bytes("80gib"), Ok(80 << 30));
        assert_eq!(parse_bytes("1.5 GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("16G"), Ok(16 << 30), "as Slurm's --mem=16G");
        assert_eq!(parse_bytes("512m"), Ok(512 << 20));
        assert_eq!(parse_bytes("16GB"), Ok(16_000_000_000));
        assert_eq!(parse_bytes("1024"), Ok(1024));
    }

    #[test]
    fn a_memory_size_without_a_unit_must_be_large_enough_to_mean_bytes() {
        let e = parse_memory("16").expect_err("16 bytes is a unit left out");
        assert!(e.contains("16GiB"), "{e}");
        assert_eq!(parse_memory("16B"), Ok(16));
        assert_eq!(parse_memory("16G"), Ok(16 << 30));
        assert_eq!(parse_memory("1073741824"), Ok(1 << 30));
        assert!(parse_memory("twelve").is_err());
    }

    #[test]
    fn an_unknown_unit_is_answered_with_every_unit() {
        let e = parse_bytes("3 parsecs").expect_err("unknown");
        for unit in ["B", "K", "G", "GiB", "GB", "TB"] {
            assert!(e.contains(unit), "{e}");
        }
    }

    #[test]
    fn rejects_nonsense() {
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("GiB").is_err());
        assert!(parse_bytes("-1GiB").is_err());
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("2PiB").is_err());
        assert!(parse_bytes("99999999TiB").is_err());
    }

    #[test]
    fn formats_round_trip() {
        assert_eq!(format_bytes(141 << 30), "141 GiB");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(3 << 29), "1.5 GiB");
    }
}

#[cfg(test)]
mod duration_tests {
    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(super::format_duration(-5), "0s");
        assert_eq!(super::format_duration(42), "42s");
        assert_eq!(super::format_duration(185), "3m 5s");
        assert_eq!(super::format_duration(7_800), "2h 10m");
        assert_eq!(super::format_duration(273_600), "3d 4h");
    }
}
