//! Byte sizes written by people: `4096`, `"64KiB"`, `"2 MiB"`, `"80GB"`, `"1.5GiB"`.
//!
//! Binary suffixes (KiB, MiB, GiB, TiB) are powers of 1024; decimal ones (kB/KB, MB, GB, TB)
//! powers of 1000, as hardware vendors quote capacities. `K`, `M`, `G`, `T` alone are binary,
//! as in most ML tooling (`PYTORCH_CUDA_ALLOC_CONF`). A fraction of a unit is rounded to the
//! nearest byte (`"3.12GiB"`, as people read a capacity off `nvidia-smi`); a count written in
//! bytes must be whole (`"1.5B"` is an error).

#![deny(unsafe_code)]

use crate::error::{Error, Result};

/// Parses a size string. Example: `parse_size("1.5KiB") == Ok(1536)`.
pub fn parse_size(text: &str) -> Result<u64> {
    let bad = |why: &str| Error::InvalidSize(format!("cannot read size {text:?}: {why}"));
    let s = text.trim();
    if s.is_empty() {
        return Err(bad("empty"));
    }
    if s.len() > 64 {
        return Err(bad("too long"));
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let num: String = num.chars().filter(|&c| c != '_').collect();
    if num.is_empty() {
        return Err(bad("no number (sizes are not negative)"));
    }
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => return Err(bad(&format!("unknown unit {other:?}"))),
    };
    let (int_part, frac_part) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num.as_str(), ""),
    };
    if frac_part.contains('.') || (int_part.is_empty() && frac_part.is_empty()) {
        return Err(bad("malformed number"));
    }
    let int: u64 = if int_part.is_empty() {
        0
    } else {
        int_part.parse().map_err(|_| bad("number too large"))?
    };
    let whole = int
        .checked_mul(mult)
        .ok_or_else(|| bad("number too large"))?;
    if frac_part.is_empty() {
        return Ok(whole);
    }
    if frac_part.len() > 18 {
        return Err(bad("too many decimals"));
    }
    let frac: u128 = frac_part.parse().map_err(|_| bad("malformed number"))?;
    let denom = 10u128.pow(frac_part.len() as u32);
    let scaled = frac * mult as u128;
    if mult == 1 && scaled % denom != 0 {
        return Err(bad("not a whole number of bytes"));
    }
    // frac / 10^digits of a unit, to the nearest byte (a half rounds up).
    whole
        .checked_add(((scaled + denom / 2) / denom) as u64)
        .ok_or_else(|| bad("number too large"))
}

/// Formats a byte count with the largest binary unit that keeps it readable:
/// `format_size(3 << 20) == "3 MiB"`, `format_size(1536) == "1.5 KiB"`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut value = bytes as f64;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        return format!("{bytes} B");
    }
    let text = format!("{value:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_size("2 MiB").unwrap(), 2 << 20);
        assert_eq!(parse_size("80GB").unwrap(), 80_000_000_000);
        assert_eq!(parse_size("8G").unwrap(), 8 << 30);
        assert_eq!(parse_size("1.5KiB").unwrap(), 1536);
        assert_eq!(parse_size("1_024").unwrap(), 1024);
    }

    #[test]
    fn a_fraction_of_a_unit_is_rounded_to_the_nearest_byte() {
        // 3.12 GiB = 3,350,074,490.88 B; 0.1 KiB = 102.4 B; 0.0005 KiB = 0.512 B.
        assert_eq!(parse_size("3.12GiB").unwrap(), 3_350_074_491);
        assert_eq!(parse_size("0.1KiB").unwrap(), 102);
        assert_eq!(parse_size("0.0005KiB").unwrap(), 1);
        assert_eq!(parse_size("79.6 GB").unwrap(), 79_600_000_000);
        assert_eq!(parse_size("1.5B").ok(), None);
        assert_eq!(parse_size("2.0").unwrap(), 2);
    }

    #[test]
    fn rejects_bad_text() {
        for bad in [
            "",
            "-1",
            "KiB",
            "1.2.3",
            "1.1B",
            "12XB",
            "99999999999999999999",
            "1e9",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_size("20000000TiB").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(3 << 20), "3 MiB");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(80 << 30), "80 GiB");
    }
}
