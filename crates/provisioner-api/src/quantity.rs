//! Kubernetes resource quantities (`1Gi`, `500M`, `1e3`, `100m`), parsed by the
//! maintained `kube_quantity` crate (which works on k8s-openapi's `Quantity`).
//!
//! Two rules are added on top, where `kube_quantity` 0.9 departs from the API server:
//! * it reads a bare suffix (`Gi`) as zero, while the API server's grammar
//!   (`^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$`) requires a number: refused here;
//! * its number parser takes the `E` of the exa suffixes (`2E`, `1Ei`) for an exponent
//!   without digits and fails: those are parsed as the same amount one suffix lower
//!   (`2E` = 2000 × `P`, `1Ei` = 1024 × `Pi`).

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube_quantity::ParsedQuantity;
use rust_decimal::Decimal;

/// Parse `s` as a Kubernetes quantity (sign, decimal number, optional exponent or
/// binary/decimal SI suffix; no surrounding space). `None` when it does not parse.
pub fn parse(s: &str) -> Option<ParsedQuantity> {
    let number = s.strip_prefix(['+', '-']).unwrap_or(s);
    if !number.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        return None;
    }
    for (suffix, lower, factor) in [("Ei", "Pi", 1024), ("E", "P", 1000)] {
        if let Some(mantissa) = s.strip_suffix(suffix) {
            // Only a plain decimal before the suffix ("1e3E" is not a quantity).
            let plain = mantissa
                .chars()
                .all(|c| c.is_ascii_digit() || ".+-".contains(c));
            let lowered = ParsedQuantity::try_from(format!("{mantissa}{lower}").as_str());
            return lowered
                .ok()
                .filter(|_| plain)
                .map(|q| q * Decimal::from(factor));
        }
    }
    ParsedQuantity::try_from(s).ok()
}

/// Whether `q` (surrounding whitespace ignored) is a well-formed quantity greater than
/// zero (`1Gi`, `500M`, `1e3`, `0.5Ki`, `100m`). Zero, negative and malformed quantities
/// are not.
pub fn is_positive(q: &Quantity) -> bool {
    parse(q.0.trim()).is_some_and(|p| p > ParsedQuantity::from(Decimal::ZERO))
}

/// `q` in whole bytes, rounded up (`1Gi` → 1073741824, `0.5` → 1); `None` when it is not a
/// positive quantity ([`is_positive`]) or does not fit in a `u64`.
pub fn bytes(q: &Quantity) -> Option<u64> {
    let parsed = parse(q.0.trim()).filter(|_| is_positive(q))?;
    let bytes = parsed.to_bytes_f64()?.ceil();
    (bytes < u64::MAX as f64).then_some(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_up() {
        let b = |s: &str| bytes(&Quantity(s.into()));
        assert_eq!(b("1Gi"), Some(1 << 30));
        assert_eq!(b("10M"), Some(10_000_000));
        assert_eq!(b("0.5"), Some(1));
        assert_eq!(b("1e3"), Some(1000));
        assert_eq!(b("0"), None);
        assert_eq!(b("-1Gi"), None);
        assert_eq!(b("x"), None);
    }

    #[test]
    fn positive_quantities() {
        for ok in [
            "1", "1Gi", "0.5Ki", "100m", "1e3", "2E", "1E+2", "+3M", "0.001", " 1Gi ",
        ] {
            assert!(is_positive(&Quantity(ok.into())), "{ok}");
        }
        for bad in [
            "0", "0.0", "-5", "-1Gi", "Gi", ".", "1.2.3", "1e", "5 Gi", "1GiB", "", "inf", "nan",
        ] {
            assert!(!is_positive(&Quantity(bad.into())), "{bad}");
        }
    }

    #[test]
    fn parse_keeps_the_sign_and_refuses_a_bare_suffix() {
        assert!(parse("-1Gi").is_some());
        assert!(parse("Gi").is_none());
        assert!(parse("+Gi").is_none());
        assert_eq!(
            parse("1Ki").and_then(|q| q.to_bytes_i64()),
            Some(1024),
            "binary suffix"
        );
        assert_eq!(parse("1k").and_then(|q| q.to_bytes_i64()), Some(1000));
        assert_eq!(
            parse("2E").and_then(|q| q.to_bytes_i64()),
            Some(2_000_000_000_000_000_000)
        );
        assert_eq!(parse("1Ei").and_then(|q| q.to_bytes_i64()), Some(1 << 60));
        assert!(parse("1e3E").is_none());
        assert!(parse("E").is_none());
    }
}
