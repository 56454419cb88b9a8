//! Prompt and output lengths per request: fixed, uniform over a range (bench_serving's
//! `random` with its range ratio), or drawn from an empirical distribution read from a
//! length file (a histogram of each, or a list of (input, output) pairs) that names its
//! source. A request's lengths are a pure function of (experiment seed, request id).

use std::path::{Path, PathBuf};

use rand::RngExt;
use serde::{Deserialize, Serialize};

use crate::seed::rng_for;

/// Where a request's lengths come from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum LengthDist {
    /// Inclusive ranges for the prompt and the output (equal bounds: fixed).
    Uniform {
        input: (u32, u32),
        output: (u32, u32),
    },
    Empirical(EmpiricalLengths),
}

/// One request's drawn lengths, before the workload adds its context and shared prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drawn {
    pub input: u32,
    pub output: u32,
}

impl LengthDist {
    pub fn draw(&self, seed: u64, id: u64) -> Drawn {
        match self {
            LengthDist::Uniform { input, output } => {
                // The prompt keeps the stream it always had, and draws first, so files
                // without output ranges draw the same prompts as before those existed.
                let mut rng = None;
                let mut pick = |(lo, hi): (u32, u32)| {
                    if lo == hi {
                        lo
                    } else {
                        rng.get_or_insert_with(|| rng_for(seed, "input_len", id))
                            .random_range(lo..=hi)
                    }
                };
                let input = pick(*input);
                let output = pick(*output);
                Drawn { input, output }
            }
            LengthDist::Empirical(e) => e.draw(seed, id),
        }
    }

    /// The smallest and largest prompt any request can draw.
    pub fn input_bounds(&self) -> (u32, u32) {
        match self {
            LengthDist::Uniform { input, .. } => *input,
            LengthDist::Empirical(e) => e.bounds(Side::Input),
        }
    }

    /// The smallest and largest output any request can draw.
    pub fn output_bounds(&self) -> (u32, u32) {
        match self {
            LengthDist::Uniform { output, .. } => *output,
            LengthDist::Empirical(e) => e.bounds(Side::Output),
        }
    }
}

/// `sglang.bench_serving --dataset-name random`: a length is uniform over
/// `[max(1, floor(len * ratio)), len]` (ratio 1: fixed; 0: from 1 to `len`).
pub fn range_ratio_bounds(len: u32, ratio: f64) -> (u32, u32) {
    (((len as f64 * ratio).floor() as u32).clamp(1, len), len)
}

/// A length file's contents, checked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EmpiricalLengths {
    pub name: String,
    /// Where the shape comes from (a dataset, its published statistics, a trace).
    pub source: String,
    pub note: Option<String>,
    pub path: PathBuf,
    pub shape: Shape,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Shape {
    /// Independent histograms of prompt and output lengths.
    Histograms { input: Vec<Bin>, output: Vec<Bin> },
    /// Observed (input, output) pairs, drawn uniformly (keeps their correlation).
    Pairs(Vec<(u32, u32)>),
}

/// An inclusive length range and its share of requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bin {
    pub range: [u32; 2],
    pub weight: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LengthFile {
    name: String,
    source: String,
    #[serde(default)]
    note: Option<String>,
    #[serde(default)]
    input: Vec<Bin>,
    #[serde(default)]
    output: Vec<Bin>,
    #[serde(default)]
    pairs: Vec<[u32; 2]>,
}

#[derive(Clone, Copy)]
enum Side {
    Input,
    Output,
}

#[derive(Debug, thiserror::Error)]
pub enum LengthFileError {
    #[error("cannot read length file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("length file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("length file {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

impl EmpiricalLengths {
    pub fn load(path: &Path) -> Result<EmpiricalLengths, LengthFileError> {
        let text = crate::input::read_text(path).map_err(|source| LengthFileError::Read {
            path: path.into(),
            source,
        })?;
        Self::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<EmpiricalLengths, LengthFileError> {
        if text.trim().is_empty() {
            return Err(LengthFileError::Invalid {
                path: path.into(),
                message: "the file is empty: it needs `name`, `source` and the lengths".into(),
            });
        }
        let file: LengthFile = toml::from_str(text).map_err(|e| {
            let at = e
                .span()
                .map(|r| {
                    let before = &text[..r.start.min(text.len())];
                    format!("line {}: ", before.matches('\n').count() + 1)
                })
                .unwrap_or_default();
            LengthFileError::Parse {
                path: path.into(),
                message: format!("{at}{}", e.message()),
            }
        })?;
        let invalid = |message: String| LengthFileError::Invalid {
            path: path.into(),
            message,
        };
        if file.source.trim().is_empty() {
            return Err(invalid(
                "`source` is empty: say where the lengths come from".into(),
            ));
        }
        let histograms = !file.input.is_empty() || !file.output.is_empty();
        let shape =
            match (histograms, file.pairs.is_empty()) {
                (true, false) => {
                    return Err(invalid(
                        "give histograms ([[input]] and [[output]]) or `pairs`, not both".into(),
                    ))
                }
                (false, true) => return Err(invalid(
                    "no lengths: give [[input]] and [[output]] bins, or `pairs = [[in, out], ...]`"
                        .into(),
                )),
                (true, true) => {
                    check_bins(&file.input, "input").map_err(invalid)?;
                    check_bins(&file.output, "output").map_err(invalid)?;
                    Shape::Histograms {
                        input: file.input,
                        output: file.output,
                    }
                }
                (false, false) => {
                    if let Some(i) = file.pairs.iter().position(|p| p[0] == 0 || p[1] == 0) {
                        return Err(invalid(format!(
                            "pair {} is {:?}: prompts and outputs need at least one token",
                            i + 1,
                            file.pairs[i]
                        )));
                    }
                    Shape::Pairs(file.pairs.iter().map(|p| (p[0], p[1])).collect())
                }
            };
        Ok(EmpiricalLengths {
            name: file.name,
            source: file.source,
            note: file.note,
            path: path.into(),
            shape,
        })
    }

    fn draw(&self, seed: u64, id: u64) -> Drawn {
        let mut rng = rng_for(seed, "lengths", id);
        match &self.shape {
            Shape::Histograms { input, output } => Drawn {
                input: draw_bin(input, &mut rng),
                output: draw_bin(output, &mut rng),
            },
            Shape::Pairs(pairs) => {
                let (input, output) = pairs[rng.random_range(0..pairs.len())];
                Drawn { input, output }
            }
        }
    }

    fn bounds(&self, side: Side) -> (u32, u32) {
        let lens: Vec<u32> = match (&self.shape, side) {
            (Shape::Histograms { input: bins, .. }, Side::Input)
            | (Shape::Histograms { output: bins, .. }, Side::Output) => {
                bins.iter().flat_map(|b| b.range).collect()
            }
            (Shape::Pairs(p), Side::Input) => p.iter().map(|x| x.0).collect(),
            (Shape::Pairs(p), Side::Output) => p.iter().map(|x| x.1).collect(),
        };
        let lo = lens.iter().copied().min().unwrap_or(1);
        (lo, lens.iter().copied().max().unwrap_or(lo))
    }

    /// The mean prompt and output lengths the file describes (uniform within each bin).
    pub fn means(&self) -> (f64, f64) {
        match &self.shape {
            Shape::Histograms { input, output } => (bins_mean(input), bins_mean(output)),
            Shape::Pairs(p) => {
                let n = p.len() as f64;
                (
                    p.iter().map(|x| x.0 as f64).sum::<f64>() / n,
                    p.iter().map(|x| x.1 as f64).sum::<f64>() / n,
                )
            }
        }
    }
}

fn bins_mean(bins: &[Bin]) -> f64 {
    let total: f64 = bins.iter().map(|b| b.weight).sum();
    bins.iter()
        .map(|b| b.weight * (b.range[0] as f64 + b.range[1] as f64) / 2.0)
        .sum::<f64>()
        / total
}

fn check_bins(bins: &[Bin], side: &str) -> Result<(), String> {
    if bins.is_empty() {
        return Err(format!(
            "no [[{side}]] bins: a histogram needs both [[input]] and [[output]]"
        ));
    }
    for (i, b) in bins.iter().enumerate() {
        let [lo, hi] = b.range;
        if lo == 0 || lo > hi {
            return Err(format!(
                "[[{side}]] bin {}: range [{lo}, {hi}] must be 1 <= lo <= hi",
                i + 1
            ));
        }
        if !(b.weight.is_finite() && b.weight >= 0.0) {
            return Err(format!(
                "[[{side}]] bin {}: weight {} must be a finite number >= 0",
                i + 1,
                b.weight
            ));
        }
    }
    // every weight is finite and >= 0 by now
    if bins.iter().map(|b| b.weight).sum::<f64>() <= 0.0 {
        return Err(format!("[[{side}]] bins: the weights sum to 0"));
    }
    Ok(())
}

/// A bin by weight, then a length uniform within it.
fn draw_bin(bins: &[Bin], rng: &mut impl rand::Rng) -> u32 {
    let total: f64 = bins.iter().map(|b| b.weight).sum();
    let mut u = rng.random_range(0.0..total);
    let bin = bins
        .iter()
        .find(|b| {
            if u < b.weight {
                true
            } else {
                u -= b.weight;
                false
            }
        })
        .unwrap_or_else(|| bins.iter().rfind(|b| b.weight > 0.0).unwrap_or(&bins[0]));
    rng.random_range(bin.range[0]..=bin.range[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<EmpiricalLengths, String> {
        EmpiricalLengths::parse(text, Path::new("l.toml")).map_err(|e| e.to_string())
    }

    const HIST: &str = r#"
name = "t"
source = "test"
[[input]]
range = [1, 10]
weight = 3
[[input]]
range = [100, 100]
weight = 1
[[output]]
range = [5, 5]
weight = 1
"#;

    #[test]
    fn histogram_draws_follow_the_weights_and_stay_in_their_bins() {
        let e = parse(HIST).unwrap();
        let d = LengthDist::Empirical(e);
        let n = 4000;
        let mut long = 0;
        for id in 0..n {
            let x = d.draw(7, id);
            assert!((1..=10).contains(&x.input) || x.input == 100, "{x:?}");
            assert_eq!(x.output, 5);
            long += (x.input == 100) as u32;
        }
        // a quarter of the weight: 1000 expected, sd ~27
        assert!((900..1100).contains(&long), "{long}");
        assert_eq!(d.input_bounds(), (1, 100));
        assert_eq!(d.output_bounds(), (5, 5));
        assert_eq!(d.draw(7, 3), d.draw(7, 3));
    }

    #[test]
    fn pairs_keep_inputs_and_outputs_together() {
        let e = parse("name='p'\nsource='s'\npairs=[[10, 1], [20, 2]]").unwrap();
        let d = LengthDist::Empirical(e);
        for id in 0..50 {
            let x = d.draw(1, id);
            assert_eq!(x.input, x.output * 10);
        }
        assert_eq!(d.input_bounds(), (10, 20));
        assert_eq!(d.output_bounds(), (1, 2));
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        for (text, want) in [
            ("name='x'\nsource='s'", "no lengths"),
            ("name='x'\nsource=''\npairs=[[1,1]]", "`source` is empty"),
            ("name='x'\nsource='s'\npairs=[[0,1]]", "at least one token"),
            (
                "name='x'\nsource='s'\n[[input]]\nrange=[1,2]\nweight=1",
                "no [[output]] bins",
            ),
            (
                "name='x'\nsource='s'\n[[input]]\nrange=[3,2]\nweight=1\n[[output]]\nrange=[1,1]\nweight=1",
                "1 <= lo <= hi",
            ),
            (
                "name='x'\nsource='s'\n[[input]]\nrange=[1,2]\nweight=-1\n[[output]]\nrange=[1,1]\nweight=1",
                "weight -1",
            ),
            (
                "name='x'\nsource='s'\n[[input]]\nrange=[1,2]\nweight=0\n[[output]]\nrange=[1,1]\nweight=1",
                "sum to 0",
            ),
            ("name='x'\nsource='s'\nbins=3", "unknown field"),
            ("", "the file is empty"),
            ("name='x'\nsource='s'\npairs=[[1,\n", "line 3"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn range_ratio_follows_bench_serving() {
        assert_eq!(range_ratio_bounds(1024, 0.5), (512, 1024));
        assert_eq!(range_ratio_bounds(1024, 1.0), (1024, 1024));
        assert_eq!(range_ratio_bounds(1024, 0.0), (1, 1024));
        assert_eq!(range_ratio_bounds(1, 0.0), (1, 1));
    }

    #[test]
    fn uniform_prompts_draw_as_they_did_before_output_ranges() {
        let old = |id| rng_for(3, "input_len", id).random_range(10u32..=20);
        let d = LengthDist::Uniform {
            input: (10, 20),
            output: (7, 7),
        };
        for id in 0..20 {
            assert_eq!(d.draw(3, id).input, old(id));
            assert_eq!(d.draw(3, id).output, 7);
        }
    }
}
