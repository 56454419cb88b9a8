//! A level's latencies, summarised in memory that does not grow with the level: every value
//! is kept (and the percentiles are exact) up to [`EXACT_LIMIT`] values; past it they move
//! into a log-linear histogram whose percentiles are within [`SKETCH_RELATIVE_ERROR`] of the
//! exact ones. The mean and the count are exact either way.
//!
//! The histogram buckets a value by the top bits of its IEEE-754 representation (its
//! exponent and the first [`MANTISSA_BITS`] bits of its mantissa), so it needs no logarithm,
//! its buckets do not depend on the order values arrive in, and a bucket's midpoint is
//! within half a bucket, 2^-(MANTISSA_BITS + 1) relatively, of every value in it.

/// Values kept exactly before the histogram takes over: 32 MiB of f64 per distribution.
/// A level of 64 requests x 200 tokens pools about 13,000 gaps between chunks; a level of
/// 10,000,000 requests pools billions.
pub const EXACT_LIMIT: usize = 1 << 22;

/// Mantissa bits a bucket keeps: 1,024 buckets per power of two.
const MANTISSA_BITS: u32 = 10;
const DROPPED_BITS: u32 = 52 - MANTISSA_BITS;

/// The most a histogram percentile differs from the exact one, relatively.
pub const SKETCH_RELATIVE_ERROR: f64 = 1.0 / (1u64 << (MANTISSA_BITS + 1)) as f64;

/// Non-negative values (latencies in milliseconds, per-request rates).
#[derive(Debug, Clone)]
pub struct Distribution {
    exact: Vec<f64>,
    sketch: Option<Histogram>,
    count: u64,
    /// Running sum in arrival order; the mean once the histogram holds the values.
    sum: f64,
    limit: usize,
    /// Keeps no values: the mean (summed in arrival order) is all it reports.
    means_only: bool,
}

impl Default for Distribution {
    fn default() -> Self {
        Distribution::with_exact_limit(EXACT_LIMIT)
    }
}

/// What a level reports of one distribution.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub mean: f64,
    pub median: f64,
    pub p99: f64,
    /// Whether the percentiles are exact (otherwise within [`SKETCH_RELATIVE_ERROR`]).
    pub exact: bool,
}

impl Distribution {
    /// One that keeps `limit` values exactly before it switches to the histogram (tests use
    /// a small limit to reach the histogram quickly).
    pub fn with_exact_limit(limit: usize) -> Distribution {
        Distribution {
            exact: Vec::new(),
            sketch: None,
            count: 0,
            sum: 0.0,
            limit,
            means_only: false,
        }
    }

    /// One that keeps only the count and the sum, for callers that read the mean alone (a
    /// fit's objective): no values stored, nothing sorted. Its percentiles are NaN.
    pub fn means_only() -> Distribution {
        Distribution {
            means_only: true,
            ..Distribution::with_exact_limit(0)
        }
    }

    // always inlined: a level pushes every output token's gap, and a fit's means-only
    // evaluations do nothing else per token
    #[inline(always)]
    pub fn push(&mut self, value: f64) {
        self.count += 1;
        self.sum += value;
        if !self.means_only {
            self.keep(value);
        }
    }

    fn keep(&mut self, value: f64) {
        match &mut self.sketch {
            Some(h) => h.add(value),
            None if self.exact.len() < self.limit => self.exact.push(value),
            None => {
                let mut h = Histogram::default();
                for &v in &self.exact {
                    h.add(v);
                }
                h.add(value);
                self.sketch = Some(h);
                self.exact = Vec::new();
            }
        }
    }

    pub fn len(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Mean, median and p99, the percentiles interpolated between the closest ranks
    /// (numpy's default, as SGLang's and vLLM's benchmark scripts compute them); all 0 when
    /// empty.
    /// With no values every statistic is NaN: there is no latency to report (a report
    /// writes it as null), where 0 would read as a measured one.
    pub fn summary(mut self) -> Summary {
        if self.count == 0 {
            return Summary {
                mean: f64::NAN,
                median: f64::NAN,
                p99: f64::NAN,
                exact: !self.means_only,
            };
        }
        if self.means_only {
            return Summary {
                mean: if self.count == 0 {
                    0.0
                } else {
                    self.sum / self.count as f64
                },
                median: f64::NAN,
                p99: f64::NAN,
                exact: false,
            };
        }
        match &self.sketch {
            None => {
                sort_total_order(&mut self.exact);
                let v = &self.exact;
                Summary {
                    // summed in sorted order, as it always was, so reports keep their bytes
                    mean: if v.is_empty() {
                        0.0
                    } else {
                        v.iter().sum::<f64>() / v.len() as f64
                    },
                    median: percentile(v, 50.0),
                    p99: percentile(v, 99.0),
                    exact: true,
                }
            }
            Some(h) => Summary {
                mean: self.sum / self.count as f64,
                median: h.percentile(self.count, 50.0),
                p99: h.percentile(self.count, 99.0),
                exact: false,
            },
        }
    }
}

/// Sorts by `f64::total_cmp`. Values equal under it are the same bits, so an unstable sort
/// gives the stable sort's sequence (and the mean summed over it the same bytes) in about
/// half the time.
fn sort_total_order(values: &mut [f64]) {
    values.sort_unstable_by(f64::total_cmp);
}

/// Linear interpolation between closest ranks (numpy's default), on sorted input.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    interpolate(sorted.len() as u64, p, |rank| sorted[rank as usize])
}

/// The percentile `p` of `n` values, given the value at each 0-based rank.
fn interpolate(n: u64, p: f64, at: impl Fn(u64) -> f64) -> f64 {
    match n {
        0 => 0.0,
        1 => at(0),
        n => {
            let rank = p / 100.0 * (n - 1) as f64;
            let lo = rank.floor() as u64;
            let hi = rank.ceil() as u64;
            let low = at(lo);
            low + (at(hi) - low) * (rank - lo as f64)
        }
    }
}

/// Counts per bucket, densely from the lowest bucket seen to the highest.
#[derive(Debug, Clone, Default)]
struct Histogram {
    /// Values that are zero (or, which the callers never give, negative or NaN).
    zeros: u64,
    /// The bucket of `counts[0]`.
    first: u64,
    counts: Vec<u64>,
}

impl Histogram {
    fn add(&mut self, value: f64) {
        // zero, and (which callers never give) negatives and NaN
        if value.is_nan() || value <= 0.0 {
            self.zeros += 1;
            return;
        }
        let bucket = value.to_bits() >> DROPPED_BITS;
        if self.counts.is_empty() {
            self.first = bucket;
            self.counts.push(0);
        } else if bucket < self.first {
            let grow = (self.first - bucket) as usize;
            self.counts
                .splice(0..0, std::iter::repeat_n(0, grow))
                .for_each(drop);
            self.first = bucket;
        } else if bucket - self.first >= self.counts.len() as u64 {
            self.counts.resize((bucket - self.first + 1) as usize, 0);
        }
        self.counts[(bucket - self.first) as usize] += 1;
    }

    fn percentile(&self, n: u64, p: f64) -> f64 {
        interpolate(n, p, |rank| self.value_at(rank))
    }

    /// The midpoint of the bucket that holds the value of 0-based `rank`.
    fn value_at(&self, rank: u64) -> f64 {
        if rank < self.zeros {
            return 0.0;
        }
        let mut below = self.zeros;
        for (i, &c) in self.counts.iter().enumerate() {
            below += c;
            if rank < below {
                let bucket = self.first + i as u64;
                let low = f64::from_bits(bucket << DROPPED_BITS);
                let high = f64::from_bits((bucket + 1) << DROPPED_BITS);
                return low + (high - low) / 2.0;
            }
        }
        // rank >= n: callers ask for ranks below the count
        f64::from_bits((self.first + self.counts.len() as u64) << DROPPED_BITS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngExt;
    use rand::SeedableRng;

    #[test]
    fn percentile_interpolates() {
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 50.0), 2.5);
        assert_eq!(percentile(&[5.0], 99.0), 5.0);
        assert_eq!(percentile(&[], 99.0), 0.0);
    }

    #[test]
    fn below_the_limit_everything_is_exact() {
        let mut d = Distribution::with_exact_limit(4);
        for v in [4.0, 1.0, 3.0, 2.0] {
            d.push(v);
        }
        let s = d.summary();
        assert!(s.exact);
        assert_eq!((s.mean, s.median), (2.5, 2.5));
        assert!((s.p99 - 3.97).abs() < 1e-12, "{s:?}");
        // no values, no statistic: NaN, which a report writes as null
        let empty = Distribution::default().summary();
        assert!(empty.mean.is_nan() && empty.median.is_nan() && empty.p99.is_nan());
        assert!(Distribution::means_only().summary().mean.is_nan());
    }

    #[test]
    fn the_unstable_sort_orders_as_the_stable_one_does() {
        let mut rng_state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng_state ^= rng_state << 13;
            rng_state ^= rng_state >> 7;
            rng_state ^= rng_state << 17;
            rng_state
        };
        let mut v: Vec<f64> = (0..20_000)
            .map(|i| match i % 7 {
                0 => -((next() % 1000) as f64) / 7.0,
                1 => 0.0,
                2 => -0.0,
                3 => f64::from_bits(next() >> 2),
                _ => (next() % 100_000) as f64 / 13.0,
            })
            .collect();
        let mut want = v.clone();
        want.sort_by(f64::total_cmp);
        super::sort_total_order(&mut v);
        let bits = |x: &[f64]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&v), bits(&want));
    }

    /// Latency-like values over six decades, in an order that is not sorted.
    fn values(n: usize, seed: u64) -> Vec<f64> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|i| {
                if i % 97 == 0 {
                    0.0
                } else {
                    10f64.powf(rng.random_range(-3.0..3.0))
                }
            })
            .collect()
    }

    #[test]
    fn past_the_limit_percentiles_stay_within_the_stated_error() {
        for seed in 0..4 {
            let v = values(20_000, seed);
            let mut sketched = Distribution::with_exact_limit(1_000);
            let mut exact = Distribution::with_exact_limit(usize::MAX);
            for &x in &v {
                sketched.push(x);
                exact.push(x);
            }
            assert_eq!(sketched.len(), 20_000);
            let (s, e) = (sketched.summary(), exact.summary());
            assert!(!s.exact && e.exact);
            assert!((s.mean - e.mean).abs() <= 1e-12 * e.mean, "{s:?} {e:?}");
            for (got, want) in [(s.median, e.median), (s.p99, e.p99)] {
                let err = (got - want).abs() / want;
                assert!(err <= SKETCH_RELATIVE_ERROR, "{got} vs {want}: {err}");
            }
        }
    }

    #[test]
    fn every_percentile_of_the_histogram_is_within_the_error() {
        let v = values(5_000, 9);
        let mut sorted = v.clone();
        sorted.sort_by(f64::total_cmp);
        let mut h = Histogram::default();
        for &x in &v {
            h.add(x);
        }
        for p in [0.0, 1.0, 10.0, 33.3, 50.0, 90.0, 99.0, 99.9, 100.0] {
            let (got, want) = (h.percentile(5_000, p), percentile(&sorted, p));
            assert!(
                (got - want).abs() <= SKETCH_RELATIVE_ERROR * want,
                "p{p}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn the_histogram_does_not_depend_on_arrival_order() {
        let v = values(3_000, 2);
        let mut forward = Distribution::with_exact_limit(10);
        let mut backward = Distribution::with_exact_limit(10);
        v.iter().for_each(|&x| forward.push(x));
        v.iter().rev().for_each(|&x| backward.push(x));
        let (f, b) = (forward.summary(), backward.summary());
        assert_eq!((f.median, f.p99), (b.median, b.p99));
    }
}
