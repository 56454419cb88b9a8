//! Durations read from flags and files: bounded when parsed, so no float-to-`Duration`
//! conversion or `Instant` arithmetic downstream can panic. A year is longer than any run,
//! timeout or stall kbench has a use for, and far inside what `Instant` can add.

use std::time::Duration;

/// The longest duration kbench accepts from a flag or a file, seconds (365 days).
pub const MAX_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DurationError {
    #[error("{} must be a positive number of seconds", show(*.value))]
    NotPositive { value: f64 },
    #[error("{} seconds is longer than the {max} s (365 days) kbench accepts", show(*.value))]
    TooLong { value: f64, max: f64 },
}

/// A number as a person reads it: `1e300`, not three hundred digits.
pub fn show(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-3..1e7).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// A positive, finite number of seconds no longer than [`MAX_SECONDS`].
pub fn checked_seconds(value: f64) -> Result<Duration, DurationError> {
    if !(value.is_finite() && value > 0.0) {
        return Err(DurationError::NotPositive { value });
    }
    if value > MAX_SECONDS {
        return Err(DurationError::TooLong {
            value,
            max: MAX_SECONDS,
        });
    }
    Ok(Duration::from_secs_f64(value))
}

/// Any number of seconds as a duration that cannot panic: NaN and negatives are zero,
/// anything longer is [`MAX_SECONDS`].
pub fn saturating_seconds(value: f64) -> Duration {
    if value.is_nan() || value <= 0.0 {
        return Duration::ZERO;
    }
    Duration::from_secs_f64(value.min(MAX_SECONDS))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn extreme() -> impl Strategy<Value = f64> {
        prop_oneof![
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(f64::MAX),
            Just(f64::MIN_POSITIVE),
            Just(1e300),
            Just(1e19),
            Just(-0.0),
            any::<f64>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn no_number_of_seconds_panics(v in extreme()) {
            let now = std::time::Instant::now();
            if let Ok(d) = checked_seconds(v) {
                prop_assert!(d.as_secs_f64() <= MAX_SECONDS);
                prop_assert!(now.checked_add(d).is_some());
            }
            let d = saturating_seconds(v);
            prop_assert!(d.as_secs_f64() <= MAX_SECONDS);
            prop_assert!(now.checked_add(d).is_some());
        }
    }

    #[test]
    fn the_bound_is_named() {
        let e = checked_seconds(1e300).unwrap_err().to_string();
        assert!(e.contains("365 days"), "{e}");
        assert!(checked_seconds(0.0).is_err());
        assert_eq!(checked_seconds(1.5).unwrap(), Duration::from_millis(1500));
    }
}
