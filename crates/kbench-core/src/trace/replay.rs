//! Trace replay: how many tokens a round commits at a recorded position.
//!
//! Chains (topk 1) replay exactly: the round commits 1 + the number of leading depths
//! whose target token was the draft's top-1. Trees rebuild SGLang's selection with
//! tokens named by their rank: everything on the target's path and its siblings is
//! recorded; the draft distributions below off-path nodes are not, and [`OffPath`]
//! says what stands in for them (docs/tree-replay.md bounds the error).

use std::sync::Arc;

use super::{Trace, TraceError};
use crate::acceptance::AcceptanceModel;
use crate::experiment::SpeculativeConfig;
use crate::seed::derive_seed;
use crate::tree::{DraftTree, TreeBuilder, TreeShape};
use crate::verify::verify_greedy;

/// Stand-in for the unrecorded draft distributions after an off-path token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OffPath {
    /// The on-path distribution recorded at the same position and depth (the default).
    #[default]
    Proxy,
    /// Probability 0: off-path subtrees never compete (an upper bound on commits).
    Optimistic,
    /// The j-th child gets 1/(j+1), the most any sorted distribution can give it
    /// (a lower bound on commits).
    Pessimistic,
}

/// Token id the target's choice gets when it is outside the drafted top-k: no tree
/// token (ranks are 0..topk) equals it.
const MISS: u32 = u32::MAX;

/// The shape clamped to what the trace recorded (num_steps <= D, topk <= K), so replay
/// never reads past a record; callers that must refuse instead use
/// `TraceAcceptance::check`.
fn fit(trace: &Trace, shape: &TreeShape) -> Option<TreeShape> {
    let steps = shape.num_steps.min(trace.depth());
    let topk = shape.topk.min(trace.topk());
    let candidates = topk + (steps.max(1) - 1) * topk * topk;
    TreeShape::new(steps, topk, shape.num_draft_tokens.min(candidates + 1)).ok()
}

/// Tokens committed (1..=num_steps+1) by a round starting at `position` (wrapped
/// around the sequence) of sequence `sequence` (which must exist). A shape beyond the
/// recording is clamped to it.
pub fn replay_commit(
    trace: &Trace,
    sequence: usize,
    position: usize,
    shape: &TreeShape,
    off_path: OffPath,
) -> u32 {
    let Some(shape) = &fit(trace, shape) else {
        return 1;
    };
    let len = trace.positions(sequence);
    let pos = position % len;
    if shape.topk == 1 {
        let drafted = shape.num_steps.min(shape.num_draft_tokens - 1) as usize;
        let lead = (0..drafted)
            .take_while(|&d| trace.rank(sequence, pos, d) == 0)
            .count();
        return 1 + lead as u32;
    }
    match path_ranks(trace, sequence, pos, shape.num_steps, shape.topk, off_path) {
        Some(ranks) => commit_from_ranks(&ranks, shape.num_draft_tokens),
        None => 1,
    }
}

/// Where the target's own path falls in SGLang's selection order (score descending, ties
/// to the earlier candidate) of a (steps, topk) tree's candidates: `ranks[d]` for the
/// on-path candidate at depth d + 1, [`OFF_TREE`] from where the path leaves the
/// candidates. The candidates do not depend on num_draft_tokens, which only cuts the
/// order: every draft-token count of one shape is answered by one set of ranks.
fn path_ranks(
    trace: &Trace,
    sequence: usize,
    pos: usize,
    steps: u32,
    topk: u32,
    off_path: OffPath,
) -> Option<Vec<u16>> {
    let shape = TreeShape::new(steps, topk, 2).ok()?;
    let b = replay_candidates(trace, sequence, pos, &shape, off_path)?;
    let cands = b.candidates();
    let mut ranks = vec![OFF_TREE; steps as usize];
    let mut parent_on_path: Option<usize> = None;
    for (depth, rank) in ranks.iter_mut().enumerate() {
        let target = u32::from(trace.rank(sequence, pos, depth));
        // parents precede their children, so the on-path candidate at this depth comes
        // after the one above it
        let from = parent_on_path.map_or(0, |p| p + 1);
        let Some(c) = (from..cands.len()).find(|&i| {
            cands[i].depth as usize == depth + 1
                && cands[i].parent == parent_on_path
                && cands[i].token == target
        }) else {
            break;
        };
        let score = cands[c].score;
        // its place in the order: every candidate that sorts before it
        let before = cands
            .iter()
            .enumerate()
            .filter(|(j, o)| match o.score.total_cmp(&score) {
                std::cmp::Ordering::Greater => true,
                std::cmp::Ordering::Equal => *j < c,
                std::cmp::Ordering::Less => false,
            })
            .count();
        *rank = u16::try_from(before).unwrap_or(OFF_TREE);
        parent_on_path = Some(c);
    }
    Some(ranks)
}

/// A path rank past every selection.
const OFF_TREE: u16 = u16::MAX;

/// Tokens a round commits when it verifies the first `num_draft_tokens - 1` candidates:
/// the bonus token plus the on-path candidates selected, which are a prefix of the path
/// (a parent never sorts after its child: its score is at least the child's, and ties go
/// to the earlier index).
fn commit_from_ranks(ranks: &[u16], num_draft_tokens: u32) -> u32 {
    let selected = num_draft_tokens.saturating_sub(1);
    1 + ranks
        .iter()
        .take_while(|&&r| u32::from(r) < selected)
        .count() as u32
}

/// Reference for tests: the same round through the generic tree builder and greedy
/// verification, with the target's argmax at every node, for chains and trees alike.
pub fn replay_commit_reference(
    trace: &Trace,
    sequence: usize,
    position: usize,
    shape: &TreeShape,
    off_path: OffPath,
) -> u32 {
    let Some(shape) = &fit(trace, shape) else {
        return 1;
    };
    let pos = position % trace.positions(sequence);
    let Some(tree) = build_replay_tree(trace, sequence, pos, shape, off_path) else {
        return 1;
    };
    let argmax: Vec<u32> = (0..tree.len())
        .map(|i| {
            let path = tree.path_to(i);
            let depth = path.len() - 1;
            let on_path = path
                .iter()
                .skip(1)
                .enumerate()
                .all(|(d, &n)| u32::from(trace.rank(sequence, pos, d)) == tree.nodes[n].token);
            if !on_path || depth >= trace.depth() as usize {
                // Off the target's path the walk never arrives; past the recorded depth
                // the bonus token is all that is left.
                return MISS;
            }
            let r = u32::from(trace.rank(sequence, pos, depth));
            if r < shape.topk {
                r
            } else {
                MISS
            }
        })
        .collect();
    verify_greedy(&tree, &argmax)
        .map(|o| o.accept_length())
        .unwrap_or(1)
}

fn build_replay_tree(
    trace: &Trace,
    sequence: usize,
    pos: usize,
    shape: &TreeShape,
    off_path: OffPath,
) -> Option<DraftTree> {
    replay_candidates(trace, sequence, pos, shape, off_path)?
        .finish()
        .ok()
}

/// Every step of SGLang's tree drafting at a recorded position, up to the selection.
fn replay_candidates(
    trace: &Trace,
    sequence: usize,
    pos: usize,
    shape: &TreeShape,
    off_path: OffPath,
) -> Option<TreeBuilder> {
    let k = shape.topk as usize;
    let enc = trace.header.prob_encoding;
    let recorded = |depth: usize| -> Vec<(u32, f32)> {
        trace
            .prob_codes(sequence, pos, depth)
            .take(k)
            .enumerate()
            .map(|(j, c)| (j as u32, enc.decode(c)))
            .collect()
    };
    let unrecorded_at = |depth: usize| -> Vec<(u32, f32)> {
        match off_path {
            OffPath::Proxy => recorded(depth),
            OffPath::Optimistic => (0..k).map(|j| (j as u32, 0.0)).collect(),
            // Through the trace's own encoding: the quantiser is monotone, so no decoded
            // entry of a valid descending vector exceeds its bound's code, while the bare
            // 1/(j+1) can sit just under a neighbour's code.
            OffPath::Pessimistic => (0..k)
                .map(|j| (j as u32, enc.decode(enc.encode(1.0 / (j as f64 + 1.0)))))
                .collect(),
        }
    };
    let mut b = TreeBuilder::new(*shape, 0).ok()?;
    b.first_step(&recorded(0)).ok()?;
    // Whether each candidate lies on the target's path, extended step by step (a
    // candidate is on it when its parent is and its rank-token is the target's rank).
    let mut on_path: Vec<bool> = Vec::with_capacity(shape.num_candidates());
    for step in 1..shape.num_steps as usize {
        for c in &b.candidates()[on_path.len()..] {
            let parent_on = c.parent.is_none_or(|p| on_path[p]);
            let depth = c.depth as usize - 1;
            on_path.push(parent_on && u32::from(trace.rank(sequence, pos, depth)) == c.token);
        }
        let (rec, off) = (recorded(step), unrecorded_at(step));
        let lists: Vec<Vec<(u32, f32)>> = b
            .beams()
            .iter()
            .map(|beam| {
                if on_path[beam.candidate] {
                    rec.clone()
                } else {
                    off.clone()
                }
            })
            .collect();
        b.expand(&lists).ok()?;
    }
    Some(b)
}

/// A trace as the simulator's acceptance source.
#[derive(Debug, Clone)]
pub struct TraceAcceptance {
    trace: Arc<Trace>,
    seed: u64,
    off_path: OffPath,
    /// Path ranks already replayed for the (steps, topk) `for_spec` was given. Every
    /// request starts at position 0 of its sequence, so requests on one sequence walk the
    /// same positions: a tree is rebuilt once per (sequence, position), not once per
    /// request and round, and once for every num_draft_tokens of its shape. Clones share
    /// it (a search's candidates that differ in draft tokens or scheduling do).
    memo: Option<Arc<PathRankMemo>>,
    /// An n-gram trace's share of steps that find a prompt match (its synth `match_rate`).
    match_rate: Option<f64>,
}

/// Per recorded (sequence, position): whether its ranks are in, and the ranks. Replay is a
/// pure function of its key, so threads racing on a cell write the same values; the flag
/// is published with release and read with acquire so a reader that sees it set sees the
/// ranks.
#[derive(Debug)]
struct PathRankMemo {
    steps: u32,
    topk: u32,
    first_cell: Vec<usize>,
    known: Vec<std::sync::atomic::AtomicBool>,
    ranks: Vec<std::sync::atomic::AtomicU16>,
}

impl PathRankMemo {
    fn new(trace: &Trace, steps: u32, topk: u32) -> PathRankMemo {
        let mut first_cell = Vec::with_capacity(trace.sequences.len());
        let mut total = 0;
        for s in 0..trace.sequences.len() {
            first_cell.push(total);
            total += trace.positions(s);
        }
        PathRankMemo {
            steps,
            topk,
            first_cell,
            known: (0..total)
                .map(|_| std::sync::atomic::AtomicBool::new(false))
                .collect(),
            ranks: (0..total * steps as usize)
                .map(|_| std::sync::atomic::AtomicU16::new(OFF_TREE))
                .collect(),
        }
    }

    /// The fitted shape's commit, `None` where replay cannot build the tree.
    fn commit(
        &self,
        trace: &Trace,
        sequence: usize,
        position: usize,
        num_draft_tokens: u32,
        off_path: OffPath,
    ) -> u32 {
        use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
        let pos = position % trace.positions(sequence);
        let cell = self.first_cell[sequence] + pos;
        let steps = self.steps as usize;
        let slots = &self.ranks[cell * steps..(cell + 1) * steps];
        if !self.known[cell].load(Acquire) {
            match path_ranks(trace, sequence, pos, self.steps, self.topk, off_path) {
                Some(ranks) => {
                    for (slot, r) in slots.iter().zip(ranks) {
                        slot.store(r, Relaxed);
                    }
                }
                // no tree: the round commits its bonus token only, as with no ranks
                None => slots.iter().for_each(|slot| slot.store(OFF_TREE, Relaxed)),
            }
            self.known[cell].store(true, Release);
        }
        let selected = num_draft_tokens.saturating_sub(1);
        1 + slots
            .iter()
            .take_while(|r| u32::from(r.load(Relaxed)) < selected)
            .count() as u32
    }
}

/// A trace recorded from a live server replays only what the server showed.
fn check_observed(o: &super::Observed, spec: &SpeculativeConfig) -> Result<(), TraceError> {
    let server = format!(
        "({}, {}, {})",
        o.num_steps, o.eagle_topk, o.num_draft_tokens
    );
    let asked = format!(
        "({}, {}, {})",
        spec.shape.num_steps, spec.shape.topk, spec.shape.num_draft_tokens
    );
    match o.kind {
        super::ObservedKind::ChainRounds => {
            if spec.shape.topk != 1 {
                return Err(TraceError::Config {
                    message: format!(
                        "eagle_topk = {} but the trace was recorded from a chain server {server}: a chain's rounds say nothing of the draft's other candidates; use eagle_topk = 1",
                        spec.shape.topk
                    ),
                });
            }
            if spec.shape.num_steps > o.num_steps {
                return Err(TraceError::Config {
                    message: format!(
                        "num_steps = {} but the trace was recorded from a server drafting {} steps {server}: deeper positions were never observed; use num_steps <= {}",
                        spec.shape.num_steps, o.num_steps, o.num_steps
                    ),
                });
            }
            TreeShape::new(spec.shape.num_steps, 1, spec.shape.num_draft_tokens)
                .map(|_| ())
                .map_err(|e| TraceError::Config {
                    message: e.to_string(),
                })
        }
        super::ObservedKind::AcceptLengths => {
            if asked != server {
                return Err(TraceError::Config {
                    message: format!(
                        "the trace holds the accept lengths of a tree server {server} only; it replays that configuration, not {asked}"
                    ),
                });
            }
            Ok(())
        }
    }
}

impl TraceAcceptance {
    /// `seed` is the experiment seed: it picks each request's sequence.
    pub fn new(trace: Arc<Trace>, seed: u64) -> Result<TraceAcceptance, TraceError> {
        if trace.sequences.is_empty() {
            return Err(TraceError::Config {
                message: "the trace has no sequences".into(),
            });
        }
        let match_rate = trace
            .header
            .provenance
            .params
            .get("match_rate")
            .and_then(serde_json::Value::as_f64);
        Ok(TraceAcceptance {
            trace,
            seed,
            off_path: OffPath::Proxy,
            memo: None,
            match_rate,
        })
    }

    /// `new` followed by `check(spec)`.
    pub fn for_spec(
        trace: Arc<Trace>,
        seed: u64,
        spec: &SpeculativeConfig,
    ) -> Result<TraceAcceptance, TraceError> {
        let mut t = TraceAcceptance::new(trace, seed)?;
        t.check(spec)?;
        if let Some(shape) = fit(&t.trace, &spec.shape).filter(|s| s.topk > 1) {
            t.memo = Some(Arc::new(PathRankMemo::new(
                &t.trace,
                shape.num_steps,
                shape.topk,
            )));
        }
        Ok(t)
    }

    pub fn with_off_path(mut self, off_path: OffPath) -> TraceAcceptance {
        self.off_path = off_path;
        // the ranks remembered so far were replayed with the old stand-in
        self.memo = self
            .memo
            .map(|m| Arc::new(PathRankMemo::new(&self.trace, m.steps, m.topk)));
        self
    }

    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    /// Whether the trace recorded enough to replay `spec`; callers check before a run.
    pub fn check(&self, spec: &SpeculativeConfig) -> Result<(), TraceError> {
        if !spec.is_speculative() {
            return Ok(());
        }
        let h = &self.trace.header;
        self.check_drafter(spec)?;
        if let Some(o) = &h.observed {
            return check_observed(o, spec);
        }
        if spec.shape.num_steps > h.depth {
            return Err(TraceError::Config {
                message: format!(
                    "num_steps = {} but the trace recorded depth {} ({}); use num_steps <= {}",
                    spec.shape.num_steps, h.depth, h.provenance.dataset, h.depth
                ),
            });
        }
        if spec.shape.topk > h.topk {
            return Err(TraceError::Config {
                message: format!(
                    "eagle_topk = {} but the trace recorded the draft's top-{} ({}); use eagle_topk <= {}",
                    spec.shape.topk, h.topk, h.provenance.dataset, h.topk
                ),
            });
        }
        TreeShape::new(
            spec.shape.num_steps,
            spec.shape.topk,
            spec.shape.num_draft_tokens,
        )
        .map(|_| ())
        .map_err(|e| TraceError::Config {
            message: e.to_string(),
        })
    }

    /// An n-gram trace (one that says how often a prompt lookup matches) is not an EAGLE
    /// or MTP head's acceptance. The converse is not judged: a trace's `draft` is free
    /// text (a live recording names the file's `[draft]` even under n-gram), so a head's
    /// name in it proves nothing.
    fn check_drafter(&self, spec: &SpeculativeConfig) -> Result<(), TraceError> {
        let draft = &self.trace.header.provenance.draft;
        if self.match_rate.is_some() && spec.algorithm.drafts_on_gpu() {
            return Err(TraceError::Config {
                message: format!(
                    "the trace is n-gram prompt lookup's (draft: {draft}; it records how often a lookup matches), and the file drafts with {}: use a trace of that draft",
                    spec.algorithm.vllm_method().unwrap_or("a model")
                ),
            });
        }
        Ok(())
    }

    /// The sequence a request replays: a pure function of (seed, request id).
    pub fn sequence_for(&self, request_id: u64) -> usize {
        (derive_seed(self.seed, "trace", request_id) % self.trace.sequences.len() as u64) as usize
    }
}

impl AcceptanceModel for TraceAcceptance {
    /// With a `match_rate` (n-gram traces) a step matches with that probability, drawn from
    /// (seed, request, position); a match proposes the full K.
    fn round_proposal(&self, request_id: u64, position: u32, spec: &SpeculativeConfig) -> u32 {
        let k = spec.shape.num_steps;
        match self.match_rate {
            Some(rate) if spec.algorithm == crate::experiment::Algorithm::Ngram => {
                let draw = derive_seed(
                    self.seed,
                    "ngram-match",
                    (request_id << 32) ^ position as u64,
                );
                let u = (draw >> 11) as f64 / (1u64 << 53) as f64;
                if u < rate {
                    k
                } else {
                    0
                }
            }
            _ => k,
        }
    }

    /// A spec that `check` would reject is clamped to the recorded depth and topk rather
    /// than failing mid-run.
    fn round_commit(&self, request_id: u64, position: u32, spec: &SpeculativeConfig) -> u32 {
        if !spec.is_speculative() {
            return 1;
        }
        // replay_commit clamps what `check` would have refused.
        let shape = spec.shape;
        let sequence = self.sequence_for(request_id);
        let fitted = fit(&self.trace, &shape);
        match (&self.memo, fitted) {
            (Some(memo), Some(f)) if (memo.steps, memo.topk) == (f.num_steps, f.topk) => memo
                .commit(
                    &self.trace,
                    sequence,
                    position as usize,
                    f.num_draft_tokens,
                    self.off_path,
                ),
            _ => replay_commit(
                &self.trace,
                sequence,
                position as usize,
                &shape,
                self.off_path,
            ),
        }
    }

    fn describe(&self) -> String {
        let h = &self.trace.header;
        let p = &h.provenance;
        format!(
            "{} trace `{}` ({}; target {}, draft {}; {} sequences, depth {}, top-{})",
            match p.kind {
                super::TraceKind::Synthetic => "synthetic",
                super::TraceKind::Engine => "engine-recorded",
                super::TraceKind::Imported => "imported",
            },
            p.generator,
            p.dataset,
            p.target,
            p.draft,
            self.trace.sequences.len(),
            h.depth,
            h.topk
        )
    }
}
