//! `Micros`: an exact amount of money in integer micro-units, parsed from and written as decimal strings.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Micro-units per unit (six decimal places, NUMERIC(12,6)).
pub const SCALE: i64 = 1_000_000;
/// Largest magnitude NUMERIC(12,6) holds: 999999.999999.
pub const MAX_MICROS: i64 = 999_999_999_999;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    #[error("money must be a decimal string like \"10.000000\"")]
    Syntax,
    #[error("money has more than 6 decimal places")]
    Precision,
    #[error("money is out of range (at most 999999.999999)")]
    Overflow,
}

/// An exact amount of money: a count of micro-units (may be negative only as a stored anomaly).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Micros(i64);

impl Micros {
    pub const ZERO: Micros = Micros(0);

    pub const fn from_micros(micros: i64) -> Micros {
        Micros(micros)
    }

    pub const fn micros(self) -> i64 {
        self.0
    }

    pub fn is_positive(self) -> bool {
        self.0 > 0
    }

    pub fn is_negative(self) -> bool {
        self.0 < 0
    }

    /// `self * n`, or `None` when the result leaves the NUMERIC(12,6) range.
    pub fn checked_mul(self, n: i64) -> Option<Micros> {
        self.0.checked_mul(n).and_then(in_range)
    }

    pub fn checked_add(self, other: Micros) -> Option<Micros> {
        self.0.checked_add(other.0).and_then(in_range)
    }

    pub fn checked_sub(self, other: Micros) -> Option<Micros> {
        self.0.checked_sub(other.0).and_then(in_range)
    }

    /// Parses `-?digits(.digits{1,6})?` exactly: no exponent, no sign `+`, no spaces, no excess precision.
    pub fn parse(s: &str) -> Result<Micros, MoneyError> {
        let (negative, body) = match s.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let (int, frac) = match body.split_once('.') {
            Some((i, f)) => (i, Some(f)),
            None => (body, None),
        };
        let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        if !digits(int) || frac.is_some_and(|f| !digits(f)) {
            return Err(MoneyError::Syntax);
        }
        let frac = frac.unwrap_or("");
        if frac.len() > 6 {
            return Err(MoneyError::Precision);
        }
        let int_part = int.trim_start_matches('0');
        if int_part.len() > 6 {
            return Err(MoneyError::Overflow);
        }
        let whole: i64 = if int_part.is_empty() { 0 } else { int_part.parse().map_err(|_| MoneyError::Overflow)? };
        let mut frac_val: i64 = if frac.is_empty() { 0 } else { frac.parse().map_err(|_| MoneyError::Syntax)? };
        for _ in frac.len()..6 {
            frac_val *= 10;
        }
        let v = whole * SCALE + frac_val;
        Ok(Micros(if negative { -v } else { v }))
    }
}

impl fmt::Display for Micros {
    /// Always six decimal places: `10.000000`, `-0.050000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0 { "-" } else { "" };
        let abs = self.0.unsigned_abs();
        let scale = SCALE as u64;
        write!(f, "{sign}{}.{:06}", abs / scale, abs % scale)
    }
}

impl FromStr for Micros {
    type Err = MoneyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Micros::parse(s)
    }
}

/// A decimal string with at most 6 decimal places (`"10.000000"`): never a JSON number.
impl schemars::JsonSchema for Micros {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Micros".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string", "pattern": "^-?[0-9]+(\\.[0-9]{1,6})?$" })
    }
}

impl Serialize for Micros {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Micros {
    /// Only from a string: a JSON or TOML number (possibly a float) is refused.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Micros, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Micros;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a decimal string with at most 6 decimal places, like \"10.000000\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Micros, E> {
                Micros::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

/// `v` as money when it is within the NUMERIC(12,6) range (`unsigned_abs`: `i64::MIN` has no `abs`).
fn in_range(v: i64) -> Option<Micros> {
    (v.unsigned_abs() <= MAX_MICROS.unsigned_abs()).then_some(Micros(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_leaving_the_range_is_none_even_at_i64_min() {
        // -2^39 * 2^24 is exactly i64::MIN, whose absolute value does not exist.
        assert_eq!(Micros(-(1 << 39)).checked_mul(1 << 24), None);
        assert_eq!(Micros(MAX_MICROS).checked_add(Micros(1)), None);
        assert_eq!(Micros(-MAX_MICROS).checked_sub(Micros(1)), None);
        assert_eq!(Micros(-MAX_MICROS).checked_mul(1), Some(Micros(-MAX_MICROS)));
        assert_eq!(Micros(3).checked_mul(-2), Some(Micros(-6)));
    }

    #[test]
    fn parses_and_formats_exactly() {
        let ok = [
            ("10.000000", 10_000_000),
            ("10", 10_000_000),
            ("0.05", 50_000),
            ("0.050000", 50_000),
            ("0.000001", 1),
            ("999999.999999", MAX_MICROS),
            ("-1.5", -1_500_000),
            ("007.1", 7_100_000),
        ];
        for (s, v) in ok {
            assert_eq!(Micros::parse(s), Ok(Micros(v)), "{s}");
        }
        assert_eq!(Micros(10_000_000).to_string(), "10.000000");
        assert_eq!(Micros(50_000).to_string(), "0.050000");
        assert_eq!(Micros(-1).to_string(), "-0.000001");
        assert_eq!(Micros(0).to_string(), "0.000000");
        for v in [0, 1, 49_999, 123_456_789, -7, MAX_MICROS] {
            assert_eq!(Micros::parse(&Micros(v).to_string()), Ok(Micros(v)));
        }
    }

    #[test]
    fn refuses_floats_excess_precision_and_overflow() {
        for s in ["", "-", ".5", "1.", "+1", "1e3", "1.5e2", " 1", "1 ", "1,5", "0x10", "NaN", "inf", "1.2.3", "--1"] {
            assert_eq!(Micros::parse(s), Err(MoneyError::Syntax), "{s:?}");
        }
        assert_eq!(Micros::parse("0.0000001"), Err(MoneyError::Precision));
        assert_eq!(Micros::parse("1000000"), Err(MoneyError::Overflow));
        assert_eq!(Micros::parse("99999999999999999999999"), Err(MoneyError::Overflow));
        assert_eq!(Micros(MAX_MICROS).checked_add(Micros(1)), None);
        assert_eq!(Micros(50_000).checked_mul(i64::MAX), None);
        assert_eq!(Micros(50_000).checked_mul(3), Some(Micros(150_000)));
    }

    #[test]
    fn serde_takes_strings_only() {
        let m: Micros = serde_json::from_str("\"0.050000\"").unwrap();
        assert_eq!(m, Micros(50_000));
        assert!(serde_json::from_str::<Micros>("0.05").is_err());
        assert!(serde_json::from_str::<Micros>("5").is_err());
        assert!(serde_json::from_str::<Micros>("\"0.0500001\"").is_err());
        assert_eq!(serde_json::to_string(&Micros(10_000_000)).unwrap(), "\"10.000000\"");
    }
}
