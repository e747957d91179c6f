//! Kubernetes resource quantities (`1Gi`, `500M`, `1e3`, `100m`), parsed by the
//! maintained `kube_quantity` crate (which works on k8s-openapi's `Quantity`).
//!
//! One rule is added on top: `kube_quantity` reads a bare suffix (`Gi`) as zero,
//! while the API server's grammar (`^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$`)
//! requires a number, so a quantity without one is refused here.

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
    ParsedQuantity::try_from(s).ok()
}

/// Whether `q` (surrounding whitespace ignored) is a well-formed quantity greater than
/// zero (`1Gi`, `500M`, `1e3`, `0.5Ki`, `100m`). Zero, negative and malformed quantities
/// are not.
pub fn is_positive(q: &Quantity) -> bool {
    parse(q.0.trim()).is_some_and(|p| p > ParsedQuantity::from(Decimal::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positive_quantities() {
        for ok in [
            "1", "1Gi", "0.5Ki", "100m", "1e3", "2E", "1E+2", "+3M", "0.001", " 1Gi ",
        ] {
            assert!(is_positive(&Quantity(ok.into())), "{ok}");
        }
        for bad in [
            "0", "0.0", "-5", "-1Gi", "Gi", ".", "1.2.3", "1e", "5 Gi", "1GiB", "", "inf",
            "nan",
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
    }
}
