//! Open-loop arrivals for `request_rate` levels, as `vllm bench serve --request-rate R
//! --burstiness B` draws them: inter-arrival gaps from a gamma distribution with shape B and
//! mean 1/R (B = 1 is a Poisson process; smaller is burstier), seeded per level so a level's
//! arrivals do not depend on which levels ran before it. Times are integer nanoseconds.

use rand::RngExt;
use rand_chacha::ChaCha8Rng;

use crate::backend::Nanos;
use crate::seed::rng_for;

/// When each of `n` requests arrives, from 0: the first at its first gap (as vLLM's
/// generator sleeps before each request), all at 0 for an infinite rate.
pub fn arrival_times(seed: u64, level: u64, n: u32, rate: f64, burstiness: f64) -> Vec<Nanos> {
    Arrivals::new(seed, level, n, rate, burstiness).collect()
}

/// [`arrival_times`] drawn one at a time, so a level of millions of requests does not hold
/// them all.
pub struct Arrivals {
    rng: ChaCha8Rng,
    left: u32,
    /// `None` for an infinite rate: every request arrives at 0.
    scale: Option<f64>,
    burstiness: f64,
    t: f64,
}

impl Arrivals {
    pub fn new(seed: u64, level: u64, n: u32, rate: f64, burstiness: f64) -> Arrivals {
        Arrivals {
            rng: rng_for(seed, "arrivals", level),
            left: n,
            scale: (!rate.is_infinite()).then(|| 1.0 / (rate * burstiness)),
            burstiness,
            t: 0.0,
        }
    }
}

impl Iterator for Arrivals {
    type Item = Nanos;

    fn next(&mut self) -> Option<Nanos> {
        self.left = self.left.checked_sub(1)?;
        let Some(scale) = self.scale else {
            return Some(0);
        };
        self.t += gamma(&mut self.rng, self.burstiness) * scale;
        Some((self.t * 1e9).round() as Nanos)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

/// A gamma(shape, 1) draw (Marsaglia and Tsang; shape < 1 by the boost u^(1/shape)).
fn gamma(rng: &mut ChaCha8Rng, shape: f64) -> f64 {
    if shape < 1.0 {
        let u: f64 = open01(rng);
        return gamma(rng, shape + 1.0) * u.powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = normal(rng);
        let v = (1.0 + c * x).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u = open01(rng);
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v;
        }
    }
}

fn open01(rng: &mut ChaCha8Rng) -> f64 {
    loop {
        let u: f64 = rng.random();
        if u > 0.0 {
            return u;
        }
    }
}

/// Box-Muller: one standard normal draw.
fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let (u1, u2) = (open01(rng), open01(rng));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_have_the_asked_rate_and_burstiness() {
        for (rate, b) in [(2.0, 1.0), (10.0, 0.5), (0.5, 4.0)] {
            let t = arrival_times(7, 1, 20_000, rate, b);
            let gaps: Vec<f64> = std::iter::once(t[0])
                .chain(t.windows(2).map(|w| w[1] - w[0]))
                .map(|g| g as f64 / 1e9)
                .collect();
            let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
            let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
            // gamma(b, 1/(r b)): mean 1/r, coefficient of variation 1/sqrt(b)
            assert!(
                (mean * rate - 1.0).abs() < 0.03,
                "rate {rate}: mean gap {mean}"
            );
            let cv = var.sqrt() / mean;
            assert!(
                (cv * b.sqrt() - 1.0).abs() < 0.05,
                "burstiness {b}: cv {cv}"
            );
        }
        assert_eq!(arrival_times(7, 1, 3, f64::INFINITY, 1.0), vec![0, 0, 0]);
        assert_eq!(
            arrival_times(7, 1, 50, 3.0, 1.0),
            arrival_times(7, 1, 50, 3.0, 1.0)
        );
        assert_ne!(
            arrival_times(7, 1, 50, 3.0, 1.0),
            arrival_times(7, 2, 50, 3.0, 1.0)
        );
    }
}
