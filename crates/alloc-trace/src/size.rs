//! Byte sizes as traces and the `replay` command line write them: `4096`, `2M`, `1.5GiB`.
//!
//! The `.trace` format and the `--capacity` / `--pad` options share one grammar, so it lives
//! here rather than inside the trace parser: decimal digits, optionally a `.` and more digits,
//! then an optional binary suffix `K`/`KiB` (2^10), `M`/`MiB` (2^20) or `G`/`GiB` (2^30). A
//! fractional value is accepted only when it names a whole number of bytes, and the result must
//! fit in a `u64`. The arithmetic is exact (integers only, no floating point).

use core::fmt;

/// Why a size token was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeError {
    /// Not a decimal number (empty, a sign, a stray character, `1.`, `.5`, `1.2.3`, ...).
    Invalid,
    /// A number followed by a suffix other than `K`, `KiB`, `M`, `MiB`, `G`, `GiB`.
    UnknownSuffix,
    /// A fractional value that is not a whole number of bytes (`1.3K`, `0.5`).
    NotWhole,
    /// The value does not fit in 64 bits.
    TooLarge,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SizeError::Invalid => {
                "expected a number of bytes with an optional K, KiB, M, MiB, G or GiB suffix"
            }
            SizeError::UnknownSuffix => "unknown suffix (use K, KiB, M, MiB, G or GiB)",
            SizeError::NotWhole => "not a whole number of bytes",
            SizeError::TooLarge => "does not fit in 64 bits",
        })
    }
}

impl std::error::Error for SizeError {}

/// The multiplier of a size suffix, or `None` if the suffix is not one of ours.
fn suffix_shift(suffix: &str) -> Option<u32> {
    match suffix {
        "" => Some(0),
        "K" | "KiB" => Some(10),
        "M" | "MiB" => Some(20),
        "G" | "GiB" => Some(30),
        _ => None,
    }
}

/// Parses a size such as `4096`, `64K`, `1.5M` or `2GiB` into bytes.
pub fn parse_size(token: &str) -> Result<u64, SizeError> {
    let num_len = token
        .bytes()
        .position(|b| !(b.is_ascii_digit() || b == b'.'))
        .unwrap_or(token.len());
    let (number, suffix) = token.split_at(num_len);
    let (int, frac) = match number.split_once('.') {
        Some((int, frac)) => (int, Some(frac)),
        None => (number, None),
    };
    let valid_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !valid_digits(int) || frac.is_some_and(|f| !valid_digits(f)) {
        return Err(SizeError::Invalid);
    }
    let shift = suffix_shift(suffix).ok_or(SizeError::UnknownSuffix)?;

    let mut bytes: u128 = 0;
    for d in int.bytes() {
        bytes = bytes
            .checked_mul(10)
            .and_then(|v| v.checked_add(u128::from(d - b'0')))
            .filter(|&v| v <= u128::from(u64::MAX))
            .ok_or(SizeError::TooLarge)?;
    }
    bytes <<= shift; // < 2^64 * 2^30, fits in u128
    if let Some(frac) = frac {
        bytes += frac_bytes(frac.trim_end_matches('0'), shift)?;
    }
    u64::try_from(bytes).map_err(|_| SizeError::TooLarge)
}

/// The exact byte count of `0.<digits> * 2^shift`, or `NotWhole` if it is not an integer.
/// `digits` has no trailing zeros.
fn frac_bytes(digits: &str, shift: u32) -> Result<u128, SizeError> {
    if digits.is_empty() {
        return Ok(0);
    }
    // 0.<digits> * 2^shift = f * 2^shift / (2^k * 5^k) with k = digits.len(). The last digit is
    // not 0, so f is not a multiple of 10. If k > shift the quotient needs 2 | f and 5 | f, which
    // is impossible; so k <= shift <= 30, and the quotient is whole exactly when 5^k divides f.
    let k = digits.len() as u32;
    if k > shift {
        return Err(SizeError::NotWhole);
    }
    let f: u128 = digits.bytes().fold(0, |v, d| v * 10 + u128::from(d - b'0')); // < 10^30
    let five_k = 5u128.pow(k);
    if !f.is_multiple_of(five_k) {
        return Err(SizeError::NotWhole);
    }
    Ok((f / five_k) << (shift - k)) // < 2^k * 2^(shift - k) = 2^shift
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_bytes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("007"), Ok(7));
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_size("2.0"), Ok(2));
        assert_eq!(parse_size("2.000"), Ok(2));
    }

    #[test]
    fn suffixes_are_binary() {
        assert_eq!(parse_size("1K"), Ok(1 << 10));
        assert_eq!(parse_size("1KiB"), Ok(1 << 10));
        assert_eq!(parse_size("3M"), Ok(3 << 20));
        assert_eq!(parse_size("3MiB"), Ok(3 << 20));
        assert_eq!(parse_size("64G"), Ok(64 << 30));
        assert_eq!(parse_size("64GiB"), Ok(64 << 30));
        assert_eq!(parse_size("0G"), Ok(0));
    }

    #[test]
    fn fractions_must_be_whole() {
        assert_eq!(parse_size("1.5M"), Ok(3 << 19));
        assert_eq!(parse_size("0.5K"), Ok(512));
        assert_eq!(parse_size("1.25KiB"), Ok(1280));
        assert_eq!(parse_size("0.0009765625M"), Ok(1024));
        assert_eq!(parse_size("0.000000000931322574615478515625G"), Ok(1));
        assert_eq!(parse_size("0.5"), Err(SizeError::NotWhole));
        assert_eq!(parse_size("1.3K"), Err(SizeError::NotWhole));
        assert_eq!(
            parse_size("0.0000000009313225746154785156251G"),
            Err(SizeError::NotWhole)
        );
        assert_eq!(
            parse_size("0.0000000000000000000000000000000000000001G"),
            Err(SizeError::NotWhole)
        );
        assert_eq!(
            parse_size("1.10000000000000000000000000000000000000000000M"),
            Err(SizeError::NotWhole)
        );
        assert_eq!(
            parse_size("1.50000000000000000000000000000000000000000000M"),
            Ok(3 << 19)
        );
    }

    #[test]
    fn too_large() {
        assert_eq!(parse_size("18446744073709551616"), Err(SizeError::TooLarge));
        assert_eq!(
            parse_size("99999999999999999999999999999999999999999"),
            Err(SizeError::TooLarge)
        );
        assert_eq!(parse_size("17179869184G"), Err(SizeError::TooLarge)); // 2^34 * 2^30
        assert_eq!(parse_size("17179869183G"), Ok(17179869183 << 30));
        assert_eq!(
            parse_size("17179869183.999999999068677425384521484375G"),
            Ok(u64::MAX)
        );
        assert_eq!(parse_size("17179869184.0G"), Err(SizeError::TooLarge));
    }

    #[test]
    fn invalid() {
        for bad in [
            "", ".", "1.", ".5", "1.2.3", "-1", "+1", " 1", "1 ", "0x10", "1e3", "1_000",
        ] {
            assert!(
                matches!(
                    parse_size(bad),
                    Err(SizeError::Invalid | SizeError::UnknownSuffix)
                ),
                "{bad:?}"
            );
        }
        assert_eq!(parse_size("K"), Err(SizeError::Invalid));
        assert_eq!(parse_size("-1"), Err(SizeError::Invalid));
        assert_eq!(parse_size("1."), Err(SizeError::Invalid));
        assert_eq!(parse_size("1.K"), Err(SizeError::Invalid));
    }

    #[test]
    fn unknown_suffixes() {
        for bad in [
            "1k", "1m", "1MB", "1Mi", "1B", "1T", "1TiB", "1 M", "1KiBs", "1é",
        ] {
            let got = parse_size(bad);
            assert!(
                matches!(got, Err(SizeError::UnknownSuffix | SizeError::Invalid)),
                "{bad:?}: {got:?}"
            );
        }
        assert_eq!(parse_size("1MB"), Err(SizeError::UnknownSuffix));
        assert_eq!(parse_size("1k"), Err(SizeError::UnknownSuffix));
    }

    #[test]
    fn messages() {
        assert_eq!(
            SizeError::NotWhole.to_string(),
            "not a whole number of bytes"
        );
        assert_eq!(SizeError::TooLarge.to_string(), "does not fit in 64 bits");
    }
}
