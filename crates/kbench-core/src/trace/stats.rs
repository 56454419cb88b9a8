//! Summaries of a trace: per-depth acceptance and accept length per configuration.

use serde::Serialize;

use super::replay::{replay_commit, OffPath};
use super::{Trace, TraceError, TraceKind};
use crate::tree::TreeShape;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DepthStats {
    /// 0-based drafting depth (depth 0 drafts the first token after the root).
    pub depth: u32,
    /// P(target is the draft's top-1 at this depth | it was at every shallower depth).
    pub conditional: f64,
    /// P(target is the draft's top-1 at this and every shallower depth).
    pub cumulative: f64,
    /// P(target is the draft's top-1 at this depth), regardless of shallower depths.
    pub top1: f64,
    /// P(target is anywhere in the recorded top-K).
    pub in_top_k: f64,
    /// Mean draft probability of its top-1 token.
    pub mean_top1_prob: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AcceptLength {
    pub num_steps: u32,
    pub topk: u32,
    pub num_draft_tokens: u32,
    /// Tokens per round along each sequence walked from position 0, advancing by what
    /// each round commits: what SGLang logs as accept length.
    pub per_round: f64,
    /// Mean commit over every recorded position.
    pub per_position: f64,
    /// For trees, `per_position` with the off-path stand-ins at their bounds: a
    /// guaranteed bracket (docs/tree-replay.md); equal to `per_position` for chains.
    /// (Walked per round, the bounds would not bracket: a different commit visits
    /// different positions.)
    pub per_position_lower: f64,
    pub per_position_upper: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceStats {
    pub kind: TraceKind,
    pub generator: String,
    pub dataset: String,
    pub target: String,
    pub draft: String,
    pub temperature: f64,
    pub depth: u32,
    pub topk: u32,
    pub sequences: usize,
    /// Positions over all sequences.
    pub total_positions: usize,
    pub per_depth: Vec<DepthStats>,
    pub accept_length: Vec<AcceptLength>,
}

fn check_shape(trace: &Trace, shape: &TreeShape) -> Result<(), TraceError> {
    shape.validate().map_err(|e| TraceError::Config {
        message: e.to_string(),
    })?;
    if shape.num_steps > trace.depth() || shape.topk > trace.topk() {
        return Err(TraceError::Config {
            message: format!(
                "({}, {}, {}) needs depth {} and top-{}, the trace recorded depth {} and top-{}",
                shape.num_steps,
                shape.topk,
                shape.num_draft_tokens,
                shape.num_steps,
                shape.topk,
                trace.depth(),
                trace.topk()
            ),
        });
    }
    Ok(())
}

fn walk(trace: &Trace, shape: &TreeShape, off_path: OffPath) -> f64 {
    let (mut tokens, mut rounds) = (0u64, 0u64);
    for s in 0..trace.sequences.len() {
        let len = trace.positions(s);
        let mut pos = 0;
        while pos < len {
            let c = replay_commit(trace, s, pos, shape, off_path);
            tokens += u64::from(c);
            rounds += 1;
            pos += c as usize;
        }
    }
    tokens as f64 / rounds.max(1) as f64
}

fn mean_over_positions(trace: &Trace, shape: &TreeShape, off_path: OffPath) -> f64 {
    let mut sum = 0u64;
    for s in 0..trace.sequences.len() {
        for p in 0..trace.positions(s) {
            sum += u64::from(replay_commit(trace, s, p, shape, off_path));
        }
    }
    sum as f64 / trace.total_positions().max(1) as f64
}

/// Accept length of `shape` replayed over the whole trace.
pub fn accept_length(trace: &Trace, shape: &TreeShape) -> Result<AcceptLength, TraceError> {
    check_shape(trace, shape)?;
    let per_position = mean_over_positions(trace, shape, OffPath::Proxy);
    let (lower, upper) = if shape.topk == 1 {
        (per_position, per_position)
    } else {
        (
            mean_over_positions(trace, shape, OffPath::Pessimistic),
            mean_over_positions(trace, shape, OffPath::Optimistic),
        )
    };
    Ok(AcceptLength {
        num_steps: shape.num_steps,
        topk: shape.topk,
        num_draft_tokens: shape.num_draft_tokens,
        per_round: walk(trace, shape, OffPath::Proxy),
        per_position,
        per_position_lower: lower,
        per_position_upper: upper,
    })
}

/// Per-depth acceptance and accept length for each of `shapes`.
pub fn stats(trace: &Trace, shapes: &[TreeShape]) -> Result<TraceStats, TraceError> {
    let d = trace.depth() as usize;
    let k = trace.topk() as u8;
    let enc = trace.header.prob_encoding;
    let mut reached = vec![0u64; d];
    let mut matched = vec![0u64; d];
    let mut top1 = vec![0u64; d];
    let mut in_k = vec![0u64; d];
    let mut top1_prob = vec![0f64; d];
    for (s, seq) in trace.sequences.iter().enumerate() {
        for p in 0..seq.positions(trace.depth()) {
            let mut alive = true;
            for depth in 0..d {
                let r = trace.rank(s, p, depth);
                top1[depth] += u64::from(r == 0);
                in_k[depth] += u64::from(r < k);
                top1_prob[depth] +=
                    f64::from(enc.decode(trace.prob_codes(s, p, depth).next().unwrap_or(0)));
                if alive {
                    reached[depth] += 1;
                    if r == 0 {
                        matched[depth] += 1;
                    } else {
                        alive = false;
                    }
                }
            }
        }
    }
    let n = trace.total_positions().max(1) as f64;
    let per_depth = (0..d)
        .map(|depth| DepthStats {
            depth: depth as u32,
            conditional: matched[depth] as f64 / reached[depth].max(1) as f64,
            cumulative: matched[depth] as f64 / n,
            top1: top1[depth] as f64 / n,
            in_top_k: in_k[depth] as f64 / n,
            mean_top1_prob: top1_prob[depth] / n,
        })
        .collect();
    let accept_length = shapes
        .iter()
        .map(|s| accept_length(trace, s))
        .collect::<Result<Vec<_>, _>>()?;
    let p = &trace.header.provenance;
    Ok(TraceStats {
        kind: p.kind,
        generator: p.generator.clone(),
        dataset: p.dataset.clone(),
        target: p.target.clone(),
        draft: p.draft.clone(),
        temperature: p.temperature,
        depth: trace.depth(),
        topk: trace.topk(),
        sequences: trace.sequences.len(),
        total_positions: trace.total_positions(),
        per_depth,
        accept_length,
    })
}

/// The configurations `kbench trace stats` reports by default: chains of 1..=5 steps
/// and SGLang's common trees at 3 steps (topk 2/4/8 with 6/8/16 draft tokens), each kept
/// only if the trace recorded enough depth and top-K for it.
pub fn standard_shapes(depth: u32, topk: u32) -> Vec<TreeShape> {
    let chains = (1..=5u32).map(|s| (s, 1, s + 1));
    let trees = [(3, 2, 6), (3, 4, 8), (3, 8, 16)].into_iter();
    chains
        .chain(trees)
        .filter(|&(s, k, _)| s <= depth && k <= topk)
        .filter_map(|(s, k, n)| TreeShape::new(s, k, n).ok())
        .collect()
}
