//! Byte quantities as people write them: `80GiB`, `512MiB`, `16G`, `1073741824`.

/// The largest quantity Allot accepts anywhere (1 PiB): above it a number is a typo.
pub const MAX_BYTES: u64 = 1 << 50;

/// Parses a byte quantity. Binary (`KiB`, `MiB`, `GiB`, `TiB`) and decimal (`KB`, `MB`, `GB`,
/// `TB`, also `K`/`M`/`G`/`T`) suffixes are accepted, case-insensitively; no suffix means bytes.
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
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "t" | "tb" => 1_000_000_000_000,
        "ki" | "kib" => 1 << 10,
        "mi" | "mib" => 1 << 20,
        "gi" | "gib" => 1 << 30,
        "ti" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "unknown unit `{other}` (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"
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

/// A count kept in thousandths (GPU or CPU milli) as a decimal: 7500 is `7.5`, 250 is
/// `0.25`, 2000 is `2`.
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
        assert_eq!(parse_bytes("16G"), Ok(16_000_000_000));
        assert_eq!(parse_bytes("1024"), Ok(1024));
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
