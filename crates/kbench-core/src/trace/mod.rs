//! Acceptance traces (docs/trace-format.md): what the draft proposed at each position and
//! depth of real or synthetic requests, replayable for any `num_steps <= depth` and
//! `eagle_topk <= topk`. Format v2 adds `observed`: a trace recorded from a live server's
//! rounds, replayable only within what the server showed.

mod binary;
mod error;
mod io;
mod jsonl;
mod live;
mod presets;
mod quant;
mod replay;
mod stats;
mod synth;

pub use binary::{from_binary, to_binary, MAGIC};
pub use error::TraceError;
pub use io::{convert, read, read_bytes, write, TraceForm};
pub use jsonl::{from_jsonl, to_jsonl};
pub use live::{from_rounds, live_provenance, LiveRequest};
pub use presets::{preset, Preset, PRESETS};
pub use quant::ProbEncoding;
pub use replay::{replay_commit, replay_commit_reference, OffPath, TraceAcceptance};
pub use stats::{accept_length, standard_shapes, stats, AcceptLength, DepthStats, TraceStats};
pub use synth::{calibrate, synth, SynthParams, GENERATOR};

use serde::{Deserialize, Serialize};
use std::path::Path;

pub const FORMAT_NAME: &str = "kbench-acceptance-trace";
/// The newest format this kbench reads and writes. A trace without `observed` is written as
/// version 1, which older readers read.
pub const FORMAT_VERSION: u32 = 2;
pub const FULLY_OBSERVED_VERSION: u32 = 1;
/// Ranks are bytes and trees deeper or wider than this are not SGLang configurations.
pub const MAX_DEPTH: u32 = 32;
pub const MAX_TOPK: u32 = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceKind {
    Synthetic,
    Engine,
    Imported,
}

/// Where the trace came from; `params` keeps the recorder's or generator's settings in
/// the order they were written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    pub kind: TraceKind,
    pub target: String,
    pub draft: String,
    pub dataset: String,
    pub temperature: f64,
    /// Recorder (engine, importer) or generator name.
    pub generator: String,
    pub params: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceHeader {
    /// Always [`FORMAT_NAME`].
    pub format: String,
    /// [`TraceHeader::written_version`] when written by this kbench.
    pub version: u32,
    pub provenance: Provenance,
    /// Recorded depth D: ranks and probabilities for depths 0..D at every position.
    pub depth: u32,
    /// Recorded K: the draft's top-K probabilities; rank K means "not in the top-K".
    pub topk: u32,
    pub prob_encoding: ProbEncoding,
    /// Number of sequences that follow.
    pub sequences: u32,
    /// Set (format v2) when the trace was recorded from a live server's verify rounds rather
    /// than from the draft's distributions: what the server showed bounds what it replays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<Observed>,
}

/// What a trace recorded from a live server saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observed {
    pub kind: ObservedKind,
    /// The server's speculative settings.
    pub num_steps: u32,
    pub eagle_topk: u32,
    pub num_draft_tokens: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ObservedKind {
    /// A chain server's rounds: depths below `num_steps` are exact accept/miss at each
    /// round's start; deeper ones were never drafted and read as misses. Replays chains of
    /// up to `num_steps`.
    ChainRounds,
    /// A tree server's rounds: only how many tokens each round committed. Replays that
    /// one configuration.
    AcceptLengths,
}

impl TraceHeader {
    /// The format version this header is written as.
    pub fn written_version(&self) -> u32 {
        if self.observed.is_some() {
            FORMAT_VERSION
        } else {
            FULLY_OBSERVED_VERSION
        }
    }
}

/// One recorded request. For position p (tokens already committed when a round starts)
/// and depth d < D: `ranks[p*D + d]` is the rank of the target's next-but-d token among
/// the draft's top-K after the draft followed the target's tokens up to there, and
/// `probs[(p*D + d)*K ..][..K]` are the codes of those top-K probabilities, descending.
#[derive(Debug, Clone, PartialEq)]
pub struct Sequence {
    pub id: u64,
    pub ranks: Vec<u8>,
    pub probs: Vec<u16>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    pub header: TraceHeader,
    pub sequences: Vec<Sequence>,
}

impl TraceHeader {
    pub fn new(
        provenance: Provenance,
        depth: u32,
        topk: u32,
        prob_encoding: ProbEncoding,
    ) -> TraceHeader {
        TraceHeader {
            format: FORMAT_NAME.into(),
            version: FULLY_OBSERVED_VERSION,
            provenance,
            depth,
            topk,
            prob_encoding,
            sequences: 0,
            observed: None,
        }
    }

    /// Checks what the body layout depends on; `path` only labels the error.
    pub fn validate(&self, path: &Path) -> Result<(), TraceError> {
        let bad = |message: String| TraceError::Header {
            path: path.to_path_buf(),
            message,
        };
        if self.format != FORMAT_NAME {
            return Err(bad(format!(
                "format is `{}`, expected `{FORMAT_NAME}`",
                self.format
            )));
        }
        if !(FULLY_OBSERVED_VERSION..=FORMAT_VERSION).contains(&self.version) {
            return Err(TraceError::UnsupportedVersion {
                path: path.to_path_buf(),
                version: u64::from(self.version),
                supported: FORMAT_VERSION,
            });
        }
        if self.observed.is_some() && self.version < FORMAT_VERSION {
            return Err(bad(format!(
                "`observed` needs format version {FORMAT_VERSION}, the header says {}",
                self.version
            )));
        }
        if self.depth == 0 || self.depth > MAX_DEPTH {
            return Err(bad(format!(
                "depth {} is outside 1..={MAX_DEPTH}",
                self.depth
            )));
        }
        if self.topk == 0 || self.topk > MAX_TOPK {
            return Err(bad(format!("topk {} is outside 1..={MAX_TOPK}", self.topk)));
        }
        if !self.provenance.temperature.is_finite() || self.provenance.temperature < 0.0 {
            return Err(bad(format!(
                "temperature {} must be finite and >= 0",
                self.provenance.temperature
            )));
        }
        Ok(())
    }
}

impl Sequence {
    /// Positions recorded, given the header's depth.
    pub fn positions(&self, depth: u32) -> usize {
        self.ranks.len() / depth as usize
    }
}

impl Trace {
    pub fn new(header: TraceHeader) -> Trace {
        Trace {
            header: TraceHeader {
                sequences: 0,
                ..header
            },
            sequences: Vec::new(),
        }
    }

    pub fn depth(&self) -> u32 {
        self.header.depth
    }

    pub fn topk(&self) -> u32 {
        self.header.topk
    }

    /// Appends a sequence, quantising `probs` (positions x D x K, each top-K list
    /// descending) with the header's encoding.
    pub fn push_sequence(
        &mut self,
        id: u64,
        ranks: Vec<u8>,
        probs: &[f64],
    ) -> Result<(), TraceError> {
        let enc = self.header.prob_encoding;
        let seq = Sequence {
            id,
            ranks,
            probs: probs.iter().map(|&p| enc.encode(p)).collect(),
        };
        self.validate_sequence(Path::new("<memory>"), self.sequences.len(), &seq)?;
        self.sequences.push(seq);
        self.header.sequences = self.sequences.len() as u32;
        Ok(())
    }

    pub fn positions(&self, sequence: usize) -> usize {
        self.sequences[sequence].positions(self.header.depth)
    }

    pub fn total_positions(&self) -> usize {
        self.sequences
            .iter()
            .map(|s| s.positions(self.header.depth))
            .sum()
    }

    pub fn rank(&self, sequence: usize, position: usize, depth: usize) -> u8 {
        self.sequences[sequence].ranks[position * self.header.depth as usize + depth]
    }

    /// Codes of the draft's top-K probabilities at (sequence, position, depth).
    pub fn prob_codes(&self, sequence: usize, position: usize, depth: usize) -> &[u16] {
        let k = self.header.topk as usize;
        let cell = position * self.header.depth as usize + depth;
        &self.sequences[sequence].probs[cell * k..(cell + 1) * k]
    }

    pub fn probs(&self, sequence: usize, position: usize, depth: usize) -> Vec<f32> {
        let enc = self.header.prob_encoding;
        self.prob_codes(sequence, position, depth)
            .iter()
            .map(|&c| enc.decode(c))
            .collect()
    }

    /// Checks one sequence against the header: lengths, ranks <= K, codes in range,
    /// each top-K list descending.
    pub(crate) fn validate_sequence(
        &self,
        path: &Path,
        index: usize,
        seq: &Sequence,
    ) -> Result<(), TraceError> {
        match self.sequence_problem(seq) {
            None => Ok(()),
            Some(message) => Err(TraceError::Sequence {
                path: path.to_path_buf(),
                sequence: index,
                message,
            }),
        }
    }

    /// The content checks of [`Trace::sequence_problem`] without locating the fault: folds
    /// with no early exit, which the compiler vectorises (the located loop was a third of
    /// a whole `kbench experiment` run). Lengths are checked before this is called.
    fn sequence_is_well_formed(&self, seq: &Sequence) -> bool {
        let k = self.header.topk as usize;
        let enc = self.header.prob_encoding;
        let max_rank = seq.ranks.iter().copied().max().unwrap_or(0);
        let max_code = seq.probs.iter().copied().max().unwrap_or(0);
        if u32::from(max_rank) > self.header.topk || max_code > enc.max_code() {
            return false;
        }
        // Count every rise in probability between neighbouring codes over the whole
        // body, then take back the rises that fall between one cell's list and the next.
        let rises = |probs: &[u16]| -> usize {
            let order = |c: u16| enc.probability_order(c);
            let all: usize = probs
                .windows(2)
                .map(|w| usize::from(order(w[1]) > order(w[0])))
                .sum();
            let across_cells: usize = (k..probs.len())
                .step_by(k)
                .map(|i| usize::from(order(probs[i]) > order(probs[i - 1])))
                .sum();
            all - across_cells
        };
        rises(&seq.probs) == 0
    }

    pub(crate) fn sequence_problem(&self, seq: &Sequence) -> Option<String> {
        let d = self.header.depth as usize;
        let k = self.header.topk as usize;
        if seq.ranks.is_empty() {
            return Some("has no positions".into());
        }
        // `%` rather than is_multiple_of: the workspace's MSRV is 1.85.
        #[allow(clippy::manual_is_multiple_of)]
        if seq.ranks.len() % d != 0 {
            return Some(format!(
                "{} ranks is not a multiple of depth {d}",
                seq.ranks.len()
            ));
        }
        if seq.probs.len() != seq.ranks.len() * k {
            return Some(format!(
                "{} probabilities for {} ranks, expected {} (topk {k})",
                seq.probs.len(),
                seq.ranks.len(),
                seq.ranks.len() * k
            ));
        }
        if self.sequence_is_well_formed(seq) {
            return None;
        }
        self.located_content_problem(seq)
    }

    /// The first cell whose rank or codes are wrong, named.
    fn located_content_problem(&self, seq: &Sequence) -> Option<String> {
        let d = self.header.depth as usize;
        let k = self.header.topk as usize;
        let enc = self.header.prob_encoding;
        for (cell, &r) in seq.ranks.iter().enumerate() {
            let (p, depth) = (cell / d, cell % d);
            if u32::from(r) > self.header.topk {
                return Some(format!(
                    "position {p} depth {depth}: rank {r} exceeds topk {k} (the not-in-top-K sentinel)"
                ));
            }
            let mut prev = i32::MAX;
            for &c in &seq.probs[cell * k..(cell + 1) * k] {
                if c > enc.max_code() {
                    return Some(format!(
                        "position {p} depth {depth}: probability code {c} is out of range for {}",
                        enc.name()
                    ));
                }
                let prob = enc.probability_order(c);
                if prob > prev {
                    return Some(format!(
                        "position {p} depth {depth}: top-{k} probabilities are not in descending order"
                    ));
                }
                prev = prob;
            }
        }
        None
    }
}

#[cfg(test)]
mod content_check_tests {
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::{synth, ProbEncoding, SynthParams};

    /// The vectorised check and the located one agree on every sequence, faults included.
    #[test]
    fn the_fast_check_finds_exactly_what_the_located_one_does() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for enc in [ProbEncoding::Log8, ProbEncoding::Linear16] {
            let params = SynthParams {
                seed: 3,
                sequences: 4,
                positions: 6,
                depth: 3,
                topk: 4,
                accept: vec![0.8, 0.7, 0.6],
                easy_fraction: 0.5,
                stickiness: 0.5,
                contrast: 0.0,
                sibling_decay: 0.5,
                miss_top_k: 0.3,
                prob_encoding: enc,
                target: "t".into(),
                draft: "d".into(),
                dataset: "test".into(),
                temperature: 0.0,
            };
            let trace = synth(&params).unwrap();
            let mut faults = 0;
            for round in 0..400 {
                let mut seq = trace.sequences[round % 4].clone();
                match rng.random_range(0..4) {
                    0 => {
                        let i = rng.random_range(0..seq.ranks.len());
                        seq.ranks[i] = rng.random_range(0..=6);
                    }
                    1 => {
                        let i = rng.random_range(0..seq.probs.len());
                        seq.probs[i] = rng.random_range(0..=u16::MAX);
                    }
                    2 => {
                        let i = rng.random_range(0..seq.probs.len());
                        seq.probs[i] = rng.random_range(0..=enc.max_code());
                    }
                    _ => {}
                }
                let located = trace.located_content_problem(&seq);
                faults += usize::from(located.is_some());
                assert_eq!(
                    trace.sequence_is_well_formed(&seq),
                    located.is_none(),
                    "{located:?}"
                );
            }
            assert!(faults > 50, "the mutations made {faults} faults");
        }
    }
}
