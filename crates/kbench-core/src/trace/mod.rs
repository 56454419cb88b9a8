//! Acceptance traces (docs/trace-format.md): what the draft proposed at each position and
//! depth of real or synthetic requests, replayable for any `num_steps <= depth` and
//! `eagle_topk <= topk`. Format v2 adds `observed`: a trace recorded from a live server's
//! rounds, replayable only within what the server showed. Format v3 changes only the
//! binary form's checksum, to CRC-32.

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

pub use binary::{from_binary, from_shared_binary, to_binary, MAGIC};
pub use error::TraceError;
pub use io::{convert, read, read_bytes, write, TraceForm, MAP_ABOVE_BYTES};
pub use jsonl::{from_jsonl, to_jsonl};
pub use live::{from_rounds, live_provenance, LiveRequest};
pub use presets::{preset, ChainPreset, Preset, CHAIN_PRESETS, PRESETS};
pub use quant::ProbEncoding;
pub use replay::{replay_commit, replay_commit_reference, OffPath, TraceAcceptance};
pub use stats::{accept_length, standard_shapes, stats, AcceptLength, DepthStats, TraceStats};
pub use synth::{calibrate, synth, SynthParams, GENERATOR};

pub use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const FORMAT_NAME: &str = "kbench-acceptance-trace";
/// The format this kbench writes, and the newest it reads.
pub const FORMAT_VERSION: u32 = 3;
/// The oldest format read: it has no `observed`.
pub const FULLY_OBSERVED_VERSION: u32 = 1;
/// The first format with `observed`.
pub const OBSERVED_VERSION: u32 = 2;
/// The first format whose binary form ends in a CRC-32 (before it, FNV-1a 64).
pub const CRC32_VERSION: u32 = 3;
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
    /// [`FORMAT_VERSION`] when written by this kbench.
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

/// One recorded request. For position p (tokens already committed when a round starts)
/// and depth d < D: `ranks[p*D + d]` is the rank of the target's next-but-d token among
/// the draft's top-K after the draft followed the target's tokens up to there, and codes
/// `(p*D + d)*K ..` of `codes` are those top-K probabilities, descending.
///
/// Both are views of the bytes they were read from (a read trace shares its file's mapped
/// pages: a fresh page costs more than reading it), or own what was built.
#[derive(Debug, Clone, PartialEq)]
pub struct Sequence {
    pub id: u64,
    pub ranks: Bytes,
    /// Probability codes as the binary body stores them, `prob_encoding.bytes()` each
    /// (little-endian), so a log8 code cannot be out of range.
    pub codes: Bytes,
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
            version: FORMAT_VERSION,
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
        if self.observed.is_some() && self.version < OBSERVED_VERSION {
            return Err(bad(format!(
                "`observed` needs format version {OBSERVED_VERSION} or later, the header says {}",
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
        let mut codes = Vec::with_capacity(probs.len() * enc.bytes());
        for &p in probs {
            enc.push_code(&mut codes, enc.encode(p));
        }
        let seq = Sequence {
            id,
            ranks: ranks.into(),
            codes: codes.into(),
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
    pub fn prob_codes(
        &self,
        sequence: usize,
        position: usize,
        depth: usize,
    ) -> impl ExactSizeIterator<Item = u16> + '_ {
        let enc = self.header.prob_encoding;
        let cell_bytes = self.header.topk as usize * enc.bytes();
        let cell = position * self.header.depth as usize + depth;
        enc.codes(&self.sequences[sequence].codes[cell * cell_bytes..(cell + 1) * cell_bytes])
    }

    pub fn probs(&self, sequence: usize, position: usize, depth: usize) -> Vec<f32> {
        let enc = self.header.prob_encoding;
        self.prob_codes(sequence, position, depth)
            .map(|c| enc.decode(c))
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
    /// with no early exit over the stored bytes, which the compiler vectorises (the located
    /// loop was a third of a whole `kbench experiment` run). Lengths are checked before.
    fn sequence_is_well_formed(&self, seq: &Sequence) -> bool {
        let k = self.header.topk as usize;
        let max_rank = seq.ranks.iter().copied().max().unwrap_or(0);
        if u32::from(max_rank) > self.header.topk {
            return false;
        }
        // Count every rise in probability between neighbouring codes over the whole
        // body; well formed, they are all between one cell's list and the next.
        fn across_cells<T: Copy>(codes: &[T], k: usize, rise: impl Fn(T, T) -> bool) -> usize {
            (k..codes.len())
                .step_by(k)
                .map(|i| usize::from(rise(codes[i - 1], codes[i])))
                .sum()
        }
        match self.header.prob_encoding {
            // log8 codes fall as probabilities rise
            ProbEncoding::Log8 => {
                falls(&seq.codes) == across_cells(&seq.codes, k, |a: u8, b: u8| b < a)
            }
            ProbEncoding::Linear16 => {
                let codes: Vec<u16> = ProbEncoding::Linear16.codes(&seq.codes).collect();
                let rises = codes.windows(2).filter(|w| w[1] > w[0]).count();
                rises == across_cells(&codes, k, |a: u16, b: u16| b > a)
            }
        }
    }

    pub(crate) fn sequence_problem(&self, seq: &Sequence) -> Option<String> {
        let d = self.header.depth as usize;
        let k = self.header.topk as usize;
        let width = self.header.prob_encoding.bytes();
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
        if seq.codes.len() != seq.ranks.len() * k * width {
            return Some(format!(
                "{} bytes of probability codes for {} ranks, expected {} (topk {k}, {width} bytes a code)",
                seq.codes.len(),
                seq.ranks.len(),
                seq.ranks.len() * k * width,
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
        let cell_bytes = k * enc.bytes();
        for (cell, &r) in seq.ranks.iter().enumerate() {
            let (p, depth) = (cell / d, cell % d);
            if u32::from(r) > self.header.topk {
                return Some(format!(
                    "position {p} depth {depth}: rank {r} exceeds topk {k} (the not-in-top-K sentinel)"
                ));
            }
            let mut prev = i32::MAX;
            for c in enc.codes(&seq.codes[cell * cell_bytes..(cell + 1) * cell_bytes]) {
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

/// How many bytes are below the one before them. Counted in u8 lanes over blocks
/// short enough not to overflow them: a usize per comparison kept the compiler to
/// two lanes a register, and this check to most of a trace's load time.
fn falls(codes: &[u8]) -> usize {
    const BLOCK: usize = u8::MAX as usize;
    let (before, after) = match codes.len() {
        0 => return 0,
        n => (&codes[..n - 1], &codes[1..]),
    };
    before
        .chunks(BLOCK)
        .zip(after.chunks(BLOCK))
        .map(|(b, a)| {
            let n = b.iter().zip(a).fold(0u8, |n, (b, a)| n + u8::from(a < b));
            usize::from(n)
        })
        .sum()
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
                match_rate: None,
            };
            let trace = synth(&params).unwrap();
            let mut faults = 0;
            for round in 0..400 {
                let mut seq = trace.sequences[round % 4].clone();
                let (mut ranks, mut codes) = (seq.ranks.to_vec(), seq.codes.to_vec());
                match rng.random_range(0..4) {
                    0 => {
                        let i = rng.random_range(0..ranks.len());
                        ranks[i] = rng.random_range(0..=6);
                    }
                    1 => {
                        let i = rng.random_range(0..codes.len());
                        codes[i] = rng.random_range(0..=u8::MAX);
                    }
                    2 => {
                        // a whole code, so linear16's high bytes move too
                        let i = rng.random_range(0..codes.len() / enc.bytes());
                        let mut code = Vec::new();
                        enc.push_code(&mut code, rng.random_range(0..=enc.max_code()));
                        codes[i * enc.bytes()..(i + 1) * enc.bytes()].copy_from_slice(&code);
                    }
                    _ => {}
                }
                (seq.ranks, seq.codes) = (ranks.into(), codes.into());
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
