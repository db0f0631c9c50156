//! `roundup_power2_divisions`: the single-value and the array form (`[K:D,...,>:D]`) with torch's
//! newest rules, and the canonical way to write a table back.

use alloc::format;
use alloc::string::String;
use core::fmt::Write;

use crate::ROUNDUP_BUCKETS;
use crate::lex::{self, NumError};

/// The 16 bucket values.
pub(crate) type Table = [u32; ROUNDUP_BUCKETS];

/// Reads a `roundup_power2_divisions` value; the error is the message of one `invalid_value`.
pub(crate) fn parse(value: &str) -> Result<Table, String> {
    match value.strip_prefix('[') {
        Some(rest) => parse_array(rest),
        None => {
            let n = number(value, "divisions")?;
            if !n.is_power_of_two() {
                return Err(format!(
                    "For roundups, the divisions has to be power of 2, got {n}"
                ));
            }
            Ok([fits_u32(n)?; ROUNDUP_BUCKETS])
        }
    }
}

/// The array form after its `[`.
fn parse_array(rest: &str) -> Result<Table, String> {
    let Some(inner) = rest.strip_suffix(']') else {
        return Err(String::from(
            "Expected closing bracket ']' while parsing roundup_power2_divisions",
        ));
    };
    if inner.contains(['[', ']']) {
        return Err(String::from(
            "unexpected bracket inside roundup_power2_divisions list",
        ));
    }
    if inner.trim().is_empty() {
        return Err(String::from("roundup_power2_divisions list is empty"));
    }
    let mut table = [0; ROUNDUP_BUCKETS];
    let mut first = true;
    let mut last_index = 0;
    for entry in inner.split(',') {
        let Some((interval, divisions)) = entry.split_once(':') else {
            return Err(format!(
                "roundup_power2_divisions entry '{}' is not of the form size:divisions",
                entry.trim()
            ));
        };
        let (interval, divisions) = (interval.trim(), divisions.trim());
        let d = number(divisions, "divisions")?;
        if d != 0 && !d.is_power_of_two() {
            return Err(format!(
                "For roundups, the divisions has to be power of 2 or 0 to disable roundup, got {d}"
            ));
        }
        let d = fits_u32(d)?;
        if interval == ">" {
            // Newest torch: `>` fills the buckets after the last listed one.
            for slot in table.iter_mut().skip(last_index + 1) {
                *slot = d;
            }
            continue;
        }
        let k = number(interval, "interval")?;
        if !k.is_power_of_two() {
            return Err(format!(
                "For roundups, the intervals have to be power of 2, got {k}"
            ));
        }
        let index = (k.ilog2() as usize).min(ROUNDUP_BUCKETS - 1);
        if first {
            table[..index].fill(d);
            first = false;
        }
        table[index] = d;
        last_index = index;
    }
    Ok(table)
}

/// A decimal integer inside the value, with a message naming `what` it is.
fn number(s: &str, what: &str) -> Result<u64, String> {
    lex::integer(s).map_err(|e| match e {
        NumError::Syntax => {
            format!("roundup_power2_divisions {what} '{s}' is not a decimal integer")
        }
        NumError::Overflow => format!("roundup_power2_divisions {what} {s} is too large"),
    })
}

/// Divisions are stored as `u32`.
fn fits_u32(d: u64) -> Result<u32, String> {
    u32::try_from(d).map_err(|_| format!("roundup_power2_divisions divisions {d} is too large"))
}

/// Writes `table` as a value [`parse`] reads back to the same table; `None` for all zeros.
///
/// All buckets equal: the single value. Otherwise an array whose first entry covers the leading
/// run, then each non-zero bucket, then `>` for a non-zero trailing run.
pub(crate) fn canonical(table: &Table) -> Option<String> {
    if table.iter().all(|&d| d == 0) {
        return None;
    }
    if table.iter().all(|&d| d == table[0]) {
        return Some(format!("{}", table[0]));
    }
    let lead_end = table.iter().take_while(|&&d| d == table[0]).count() - 1;
    let last = table[ROUNDUP_BUCKETS - 1];
    let trail_start = ROUNDUP_BUCKETS - table.iter().rev().take_while(|&&d| d == last).count();
    let mut out = format!("[{}:{}", 1u64 << lead_end, table[lead_end]);
    let middle_end = if last == 0 {
        ROUNDUP_BUCKETS
    } else {
        trail_start
    };
    for (i, &d) in table.iter().enumerate().take(middle_end).skip(lead_end + 1) {
        // With a `>` entry the bucket just before the trailing run must be listed, even at 0.
        if d != 0 || (last != 0 && i + 1 == trail_start) {
            let _ = write!(out, ",{}:{d}", 1u64 << i);
        }
    }
    if last != 0 {
        let _ = write!(out, ",>:{last}");
    }
    out.push(']');
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MIB;
    use crate::conf::AllocConf;

    fn conf(value: &str) -> AllocConf {
        AllocConf {
            roundup_power2_divisions: parse(value).unwrap(),
            ..AllocConf::default()
        }
    }

    fn check(value: &str, expect: &[(u64, u32)]) {
        let c = conf(value);
        for &(mib, d) in expect {
            assert_eq!(c.roundup_divisions(mib * MIB), d, "{value} at {mib} MiB");
        }
    }

    #[test]
    fn torch_cpp_test_arrays() {
        check(
            "[64:8,128:2,256:4,512:2,1024:4,>:1]",
            &[
                (32, 8),
                (64, 8),
                (128, 2),
                (256, 4),
                (512, 2),
                (1024, 4),
                (2048, 1),
                (4096, 1),
                (8192, 1),
            ],
        );
        check(
            "[128:8,256:16,512:1,2048:8,>:2]",
            &[
                (64, 8),
                (128, 8),
                (256, 16),
                (512, 1),
                (1024, 0),
                (2048, 8),
                (4096, 2),
            ],
        );
        check("4", &[(64, 4), (256, 4), (2048, 4)]);
        assert_eq!(parse("4"), Ok([4; ROUNDUP_BUCKETS]));
    }

    #[test]
    fn seed_example_uses_the_newest_greater_than_rule() {
        let t = parse("[256:1,512:2,1024:4,>:8]").unwrap();
        assert_eq!(t, [1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 8, 8, 8, 8, 8]);
    }

    #[test]
    fn first_entry_fills_below_and_gaps_stay_zero() {
        let t = parse("[4:2,64:8]").unwrap();
        assert_eq!(t, [2, 2, 2, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        // `>` alone starts after bucket 0.
        let t = parse("[>:4]").unwrap();
        assert_eq!(t, [0, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4]);
        // Entries apply in order, as in torch: a first `K:D` after `>` still fills below it,
        // and a second `>` starts after the entry before it.
        let t = parse("[>:4,64:8]").unwrap();
        assert_eq!(t, [8, 8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 4, 4]);
        let t = parse("[2:1,>:4,256:2,>:16]").unwrap();
        assert_eq!(t, [1, 1, 4, 4, 4, 4, 4, 4, 2, 16, 16, 16, 16, 16, 16, 16]);
        // Intervals beyond 32 GiB clamp to bucket 15; 1 MiB is bucket 0.
        let t = parse("[1:2,65536:4]").unwrap();
        assert_eq!(t[0], 2);
        assert_eq!(t[15], 4);
        // Whitespace around entries is ignored; 0 disables a bucket.
        let t = parse("[ 2 : 0 , > : 16 ]").unwrap();
        assert_eq!(t[0], 0);
        assert_eq!(t[1], 0);
        assert_eq!(t[2], 16);
    }

    #[test]
    fn single_value_rules() {
        assert_eq!(parse("1"), Ok([1; ROUNDUP_BUCKETS]));
        assert_eq!(parse("2147483648"), Ok([1 << 31; ROUNDUP_BUCKETS]));
        assert!(parse("0").unwrap_err().contains("has to be power of 2"));
        assert!(parse("3").unwrap_err().contains("has to be power of 2"));
        assert!(parse("4294967296").unwrap_err().contains("too large"));
        assert!(parse("four").is_err());
        assert!(parse("").is_err());
    }

    #[test]
    fn bad_arrays() {
        for bad in [
            "[",
            "[]",
            "[ ]",
            "[64:8",
            "64:8]",
            "[64:8]x",
            "[[64:8]]",
            "[64]",
            "[64:8,]",
            "[,64:8]",
            "[63:8]",
            "[0:8]",
            "[64:3]",
            "[64:-1]",
            "[64:4294967296]",
            "[64:x]",
            "[x:8]",
            "[>:3]",
            "[64=8]",
            "[99999999999999999999:2]",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(
            parse("[63:8]")
                .unwrap_err()
                .starts_with("For roundups, the intervals have to be power of 2")
        );
        assert!(
            parse("[64:3]")
                .unwrap_err()
                .starts_with("For roundups, the divisions has to be power of 2 or 0")
        );
        assert!(parse("[64:8").unwrap_err().contains("']'"));
    }

    #[test]
    fn canonical_forms() {
        assert_eq!(canonical(&[0; ROUNDUP_BUCKETS]), None);
        assert_eq!(canonical(&[4; ROUNDUP_BUCKETS]).as_deref(), Some("4"));
        let t = parse("[256:1,512:2,1024:4,>:8]").unwrap();
        assert_eq!(canonical(&t).as_deref(), Some("[256:1,512:2,1024:4,>:8]"));
        let t = parse("[128:8,256:16,512:1,2048:8,>:2]").unwrap();
        assert_eq!(
            canonical(&t).as_deref(),
            Some("[128:8,256:16,512:1,2048:8,>:2]")
        );
        let t = parse("[128:8,256:0,512:0,>:2]").unwrap();
        assert_eq!(canonical(&t).as_deref(), Some("[128:8,512:0,>:2]"));
        let t = parse("[4:2,64:8]").unwrap();
        assert_eq!(canonical(&t).as_deref(), Some("[4:2,64:8]"));
        for t in [
            parse("[>:4]").unwrap(),
            parse("[1:2,65536:4]").unwrap(),
            parse("[1:0,2:4,32768:0]").unwrap(),
        ] {
            assert_eq!(parse(&canonical(&t).unwrap()), Ok(t));
        }
    }
}
