//! Why a candidate wins: one decode round at the objective's concurrency, split into what
//! the target, the draft, the all-reduces, the launches and the host cost.

use kbench_core::backend::Backend;
use kbench_core::experiment::Experiment;
use kbench_sim::{PassKind, RoundBreakdown, SimError};
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decomposition {
    /// What the round is (`speculative round (2, 1, 3) v2`, `plain decode step`).
    pub what: String,
    pub batch: u32,
    pub mean_context: f64,
    /// The target's forward (decode or tree verify), all-reduces excluded, microseconds.
    pub target_us: f64,
    /// Every draft pass of the round (steps and the extend after verify), all-reduces
    /// excluded.
    pub draft_us: f64,
    pub draft_passes: u32,
    pub all_reduce_us: f64,
    /// Launch cost beyond the GPU's own time: graph replays, and eager dispatch that
    /// outruns the kernels.
    pub launch_us: f64,
    /// Passes launched eagerly (beyond cuda_graph_max_bs, or never captured).
    pub eager_passes: u32,
    pub host_us: f64,
    /// `serial` (GPU then host), `overlap` (the larger of the two) or `overlap+sync`.
    pub combine: String,
    pub sync_us: f64,
    pub round_us: f64,
    /// Tokens each request commits per round, at the level (1 without speculation).
    pub accept_length: f64,
    /// The round's time over what it commits: the time per output token of one request.
    pub us_per_token: f64,
}

/// The round `exp` runs over `batch` requests, with the accept length its report measured.
pub fn decompose(
    exp: &Experiment,
    batch: u32,
    accept_length: Option<f64>,
) -> Result<Decomposition, SimError> {
    let backend = crate::evaluate::backend_for(exp)?;
    // the cap the server runs with: under vLLM with the file silent, its default for the GPU
    let cap = backend
        .max_running_requests()
        .unwrap_or(exp.max_running_requests);
    let bs = batch.clamp(1, cap.max(1));
    let (lo, hi) = exp.input_len;
    let ctx = (f64::from(lo) + f64::from(hi)) / 2.0 + f64::from(exp.max_tokens) / 2.0;
    let round = backend.explain_round(bs, ctx)?;
    Ok(from_round(&round, ctx, accept_length.unwrap_or(1.0)))
}

fn from_round(r: &RoundBreakdown, ctx: f64, accept_length: f64) -> Decomposition {
    let mut d = Decomposition {
        what: r.what.clone(),
        batch: r.batch,
        mean_context: ctx,
        target_us: 0.0,
        draft_us: 0.0,
        draft_passes: 0,
        all_reduce_us: 0.0,
        launch_us: 0.0,
        eager_passes: 0,
        host_us: r.host_us,
        combine: r.combine.to_string(),
        sync_us: r.sync_us,
        round_us: r.total_us,
        accept_length,
        us_per_token: r.total_us / accept_length.max(1.0),
    };
    for p in &r.passes {
        let all_reduce = p.gpu_us.get("all_reduce").copied().unwrap_or(0.0);
        d.all_reduce_us += all_reduce;
        let compute = p.gpu_total_us - all_reduce;
        match p.kind {
            PassKind::DraftDecode | PassKind::DraftExtend | PassKind::DraftPrefill => {
                d.draft_us += compute;
                d.draft_passes += 1;
            }
            PassKind::TargetDecode | PassKind::TargetVerify | PassKind::TargetPrefill => {
                d.target_us += compute;
            }
        }
        d.launch_us += (p.time_us - p.gpu_total_us).max(0.0);
        d.eager_passes += u32::from(!p.graph);
    }
    d
}
