//! The DURATION syntax of the command line: a whole number and a unit.

use std::time::Duration;

/// The syntax, for error messages.
const EXPECTED: &str =
    "give a whole number with a unit: ms, s, m or h (like 500ms, 30s, 2m, 1h), or 0";

/// Parses `500ms`, `30s`, `2m`, `1h`, or a bare `0`.
///
/// Rejects signs, fractions, spaces, missing or unknown units, and values whose
/// millisecond count does not fit in 64 bits.
pub fn parse(text: &str) -> Result<Duration, String> {
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.starts_with('-') {
        return Err(format!("{text:?} is negative; {EXPECTED}"));
    }
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!("{text:?} does not start with a number; {EXPECTED}"));
    }
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "" => return Err(format!("{text:?} has no unit; {EXPECTED}")),
        _ => return Err(format!("{text:?} has an unknown unit {unit:?}; {EXPECTED}")),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(millis_per_unit))
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_every_unit_and_a_bare_zero() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse("007s"), Ok(Duration::from_secs(7)));
    }

    #[test]
    fn accepts_the_largest_millisecond_count() {
        assert_eq!(
            parse("18446744073709551615ms"),
            Ok(Duration::from_millis(u64::MAX))
        );
    }

    #[test]
    fn rejects_negatives_with_a_clear_message() {
        let err = parse("-1s").unwrap_err();
        assert!(err.contains("negative"), "{err}");
        assert!(parse("-0").is_err());
    }

    #[test]
    fn rejects_junk() {
        for bad in [
            "", "s", "5", "10", "5x", "5 s", " 5s", "5s ", "1.5s", "+5s", "5S", "5sec", "1h30m",
            "ms", "0x10s", "５s", "5µs",
        ] {
            let err = parse(bad).expect_err(bad);
            assert!(
                err.contains("unit") || err.contains("number"),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn rejects_overflow() {
        for bad in [
            "18446744073709551616ms",
            "18446744073709552s",
            "99999999999999999999999h",
        ] {
            let err = parse(bad).expect_err(bad);
            assert!(err.contains("too large"), "{bad:?}: {err}");
        }
    }
}
