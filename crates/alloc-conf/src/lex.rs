//! Lexing: splitting a config string into items and items into key and value, and reading the
//! scalar value types (booleans, decimal integers, plain decimal floats).
//!
//! Kept apart from the key table so the grammar can be tested on its own.

/// One item of a config string, whitespace already trimmed from its parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Item<'a> {
    /// `key:value` or `key=value` (the value may be empty).
    Pair { key: &'a str, value: &'a str },
    /// A word with neither `:` nor `=`.
    Bare(&'a str),
}

/// The non-empty items of `s`: split on `,` outside `[...]`, each trimmed, empty ones skipped.
pub(crate) fn items(s: &str) -> impl Iterator<Item = Item<'_>> {
    let mut rest = Some(s);
    core::iter::from_fn(move || {
        loop {
            let text = rest?;
            let mut depth = 0usize;
            let mut end = None;
            for (i, c) in text.char_indices() {
                match c {
                    '[' => depth += 1,
                    ']' => depth = depth.saturating_sub(1),
                    ',' if depth == 0 => {
                        end = Some(i);
                        break;
                    }
                    _ => {}
                }
            }
            let item = match end {
                Some(i) => {
                    rest = Some(&text[i + 1..]);
                    &text[..i]
                }
                None => {
                    rest = None;
                    text
                }
            };
            let item = item.trim();
            if !item.is_empty() {
                return Some(split_item(item));
            }
        }
    })
}

/// Splits a trimmed, non-empty item at its first `:` or `=`.
fn split_item(item: &str) -> Item<'_> {
    match item.find([':', '=']) {
        Some(i) => Item::Pair {
            key: item[..i].trim(),
            value: item[i + 1..].trim(),
        },
        None => Item::Bare(item),
    }
}

/// `True`/`true` or `False`/`false`; anything else is `None`.
pub(crate) fn boolean(s: &str) -> Option<bool> {
    match s {
        "True" | "true" => Some(true),
        "False" | "false" => Some(false),
        _ => None,
    }
}

/// Why a number was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NumError {
    /// Not of the number's form (sign, suffix, empty, ...).
    Syntax,
    /// Of the right form but too large.
    Overflow,
}

/// A decimal integer: ASCII digits only, no sign or suffix.
pub(crate) fn integer(s: &str) -> Result<u64, NumError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(NumError::Syntax);
    }
    s.parse::<u64>().map_err(|_| NumError::Overflow)
}

/// A plain decimal float: `digits[.digits][e[+-]digits]`, where the integer or the fraction part
/// may be empty but not both (`0.6`, `.6`, `6.`, `1e-1`). No sign, `inf` or `nan`.
pub(crate) fn float(s: &str) -> Result<f64, NumError> {
    let b = s.as_bytes();
    let digits = |mut i: usize| {
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        (i, i - start)
    };
    let (mut i, int_digits) = digits(0);
    let mut frac_digits = 0;
    if i < b.len() && b[i] == b'.' {
        (i, frac_digits) = digits(i + 1);
    }
    if int_digits + frac_digits == 0 {
        return Err(NumError::Syntax);
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
            i += 1;
        }
        let (j, exp_digits) = digits(i);
        if exp_digits == 0 {
            return Err(NumError::Syntax);
        }
        i = j;
    }
    if i != b.len() {
        return Err(NumError::Syntax);
    }
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        Ok(_) => Err(NumError::Overflow),
        Err(_) => Err(NumError::Syntax),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    fn all(s: &str) -> Vec<Item<'_>> {
        items(s).collect()
    }

    #[test]
    fn items_split_on_commas_outside_brackets() {
        assert_eq!(
            all(" a:1 , b = 2 ,,c:[1:2,>:3], "),
            [
                Item::Pair {
                    key: "a",
                    value: "1"
                },
                Item::Pair {
                    key: "b",
                    value: "2"
                },
                Item::Pair {
                    key: "c",
                    value: "[1:2,>:3]"
                },
            ]
        );
        assert_eq!(all(""), []);
        assert_eq!(all(" ,\t, "), []);
        assert_eq!(all("word"), [Item::Bare("word")]);
        assert_eq!(
            all("k:"),
            [Item::Pair {
                key: "k",
                value: ""
            }]
        );
        assert_eq!(
            all(":5"),
            [Item::Pair {
                key: "",
                value: "5"
            }]
        );
    }

    #[test]
    fn first_colon_or_equals_ends_the_key() {
        assert_eq!(
            all("k=a:b"),
            [Item::Pair {
                key: "k",
                value: "a:b"
            }]
        );
        assert_eq!(
            all("k:a=b"),
            [Item::Pair {
                key: "k",
                value: "a=b"
            }]
        );
    }

    #[test]
    fn unbalanced_brackets_never_panic() {
        assert_eq!(
            all("a:[1:2,b:3"),
            [Item::Pair {
                key: "a",
                value: "[1:2,b:3"
            }]
        );
        assert_eq!(all("]],a:1").len(), 2);
    }

    #[test]
    fn booleans() {
        assert_eq!(boolean("True"), Some(true));
        assert_eq!(boolean("true"), Some(true));
        assert_eq!(boolean("False"), Some(false));
        assert_eq!(boolean("false"), Some(false));
        for bad in ["TRUE", "1", "yes", "", "True "] {
            assert_eq!(boolean(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn integers() {
        assert_eq!(integer("0"), Ok(0));
        assert_eq!(integer("0040"), Ok(40));
        assert_eq!(integer("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(integer("18446744073709551616"), Err(NumError::Overflow));
        for bad in ["", "+1", "-1", "40abc", "4 0", "0x10", "1.0", "1e3", "٣"] {
            assert_eq!(integer(bad), Err(NumError::Syntax), "{bad:?}");
        }
    }

    #[test]
    fn floats() {
        assert_eq!(float("0.6"), Ok(0.6));
        assert_eq!(float(".6"), Ok(0.6));
        assert_eq!(float("6."), Ok(6.0));
        assert_eq!(float("1e-1"), Ok(0.1));
        assert_eq!(float("1E+2"), Ok(100.0));
        assert_eq!(float("0"), Ok(0.0));
        assert_eq!(float("1e400"), Err(NumError::Overflow));
        for bad in [
            "", ".", "e1", "1e", "1e+", "-0.5", "+0.5", "inf", "NaN", "0.5x", "0,5", "0x1p3",
            "1.2.3",
        ] {
            assert_eq!(float(bad), Err(NumError::Syntax), "{bad:?}");
        }
    }
}
