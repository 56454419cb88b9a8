//! Quantisation of draft probabilities in the trace body.
//!
//! `log8` (one byte): code c < 255 means p = 2^(-c/16), c = 255 means p = 0. Relative
//! precision is about 2.2%, uniform over 2^-15.9..1, which is what matters for the
//! products of probabilities SGLang ranks tree candidates by, and it halves the file
//! against 16 bits. `linear16` (two bytes): p = c / 65535, for recordings that want
//! absolute precision.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbEncoding {
    Log8,
    Linear16,
}

const LOG8_ZERO: u16 = 255;
/// Codes per octave of probability.
const LOG8_STEPS: f64 = 16.0;

impl ProbEncoding {
    pub fn bytes(self) -> usize {
        match self {
            ProbEncoding::Log8 => 1,
            ProbEncoding::Linear16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ProbEncoding::Log8 => "log8",
            ProbEncoding::Linear16 => "linear16",
        }
    }

    /// Nearest code; probabilities are clamped into [0, 1].
    pub fn encode(self, p: f64) -> u16 {
        let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
        match self {
            ProbEncoding::Log8 => {
                if p <= 0.0 {
                    return LOG8_ZERO;
                }
                let c = (-p.log2() * LOG8_STEPS).round();
                // Below the smallest code's midpoint towards zero, zero is nearer.
                if c >= f64::from(LOG8_ZERO) {
                    let smallest = (-(f64::from(LOG8_ZERO) - 1.0) / LOG8_STEPS).exp2();
                    if p < smallest / 2.0 {
                        LOG8_ZERO
                    } else {
                        LOG8_ZERO - 1
                    }
                } else {
                    c as u16
                }
            }
            ProbEncoding::Linear16 => (p * 65535.0).round() as u16,
        }
    }

    pub fn decode(self, c: u16) -> f32 {
        match self {
            ProbEncoding::Log8 => {
                if c >= LOG8_ZERO {
                    0.0
                } else {
                    (-f64::from(c) / LOG8_STEPS).exp2() as f32
                }
            }
            ProbEncoding::Linear16 => (f64::from(c) / 65535.0) as f32,
        }
    }

    /// Orders valid codes by the probability they decode to, without decoding: the decode
    /// is strictly monotone (falling for log8, rising for linear16), and the exp2 per code
    /// was most of a trace's load time.
    pub fn probability_order(self, c: u16) -> i32 {
        match self {
            ProbEncoding::Log8 => -i32::from(c),
            ProbEncoding::Linear16 => i32::from(c),
        }
    }

    /// Largest valid code (log8 codes live in a byte).
    pub fn max_code(self) -> u16 {
        match self {
            ProbEncoding::Log8 => LOG8_ZERO,
            ProbEncoding::Linear16 => u16::MAX,
        }
    }

    /// Every code of code bytes, in order.
    pub fn codes(self, bytes: &[u8]) -> impl ExactSizeIterator<Item = u16> + '_ {
        let width = self.bytes();
        bytes.chunks_exact(width).map(|c| match c {
            [lo, hi] => u16::from_le_bytes([*lo, *hi]),
            _ => u16::from(c[0]),
        })
    }

    /// Appends `code` as the binary body stores it (log8 codes are at most 255).
    pub fn push_code(self, out: &mut Vec<u8>, code: u16) {
        match self {
            ProbEncoding::Log8 => out.push(code.min(LOG8_ZERO) as u8),
            ProbEncoding::Linear16 => out.extend_from_slice(&code.to_le_bytes()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ProbEncoding;

    #[test]
    fn probability_order_agrees_with_the_decoded_probabilities() {
        for enc in [ProbEncoding::Log8, ProbEncoding::Linear16] {
            let codes: Vec<u16> = (0..=enc.max_code()).collect();
            for w in codes.windows(2) {
                let by_value = enc.decode(w[0]).total_cmp(&enc.decode(w[1]));
                let by_order = enc
                    .probability_order(w[0])
                    .cmp(&enc.probability_order(w[1]));
                assert_eq!(by_value, by_order, "{} codes {} {}", enc.name(), w[0], w[1]);
            }
        }
    }
}
