//! vLLM V1's scheduler in the simulator (vllm/v1/core/sched/scheduler.py, v0.11-v0.34):
//! every step spends one token budget (`max_num_batched_tokens`) on the running requests'
//! decodes first (1 + their drafts each with speculation, drafts truncated when the budget
//! runs short), then on prefill chunks of the requests still prefilling, then on new
//! requests, all in one forward; the proposer drafts for the next step after it. KV
//! slots are taken as tokens are computed, with no reservation for output; when a decode
//! cannot get its slot the most recently admitted request is preempted (its KV freed, to be
//! recomputed from the front of the queue), as vLLM's FCFS policy does.

use kbench_core::backend::{BackendError, CudaGraphBound, Nanos};
use kbench_core::experiment::Experiment;

use super::Scheduler;
use crate::cost::{PrefillPart, VllmStep};
use crate::profile::HardwareProfile;
use crate::sim::{fail, record_chunk, Live, SimSession};

pub(crate) struct Vllm;

impl Scheduler for Vllm {
    fn step(&self, s: &mut SimSession<'_>) -> Result<(), BackendError> {
        step(s)
    }

    /// Async scheduling (on by default since v0.14; kept with a GPU drafter, off with the
    /// CPU n-gram proposer): `EngineCore.step_with_batch_queue` (vllm/v1/engine/core.py)
    /// schedules and submits the next batch before it blocks on the running one's output,
    /// and reads new requests from its input queue only between those steps.
    fn schedules_ahead(&self, spec: &kbench_core::experiment::SpeculativeConfig) -> bool {
        !spec.is_speculative() || spec.spec_v2
    }

    /// vLLM captures graphs by tokens: a uniform decode of n requests with K drafts each is
    /// n x (1 + K) tokens.
    fn graph_bound(&self, exp: &Experiment, profile: &HardwareProfile) -> CudaGraphBound {
        CudaGraphBound::Tokens(crate::vllm_defaults::cudagraph_capture_size(exp, profile))
    }
}

/// The latest admitted request goes back to the front of the queue, its cache freed.
fn preempt_latest(s: &mut SimSession<'_>) -> bool {
    let victim = match s.prefilling.pop() {
        Some(v) => Some(v),
        None if s.running.len() > 1 => s.running.pop(),
        None => None,
    };
    let Some(mut v) = victim else {
        return false;
    };
    s.kv.give_back(v.kv_tokens);
    v.kv_tokens = 0;
    v.prefilled = 0;
    v.retractions += 1;
    s.waiting.push_front(v);
    true
}

/// Forwards that only decode the running batch, one token each, run here as a window:
/// nothing waiting, prefilling or arriving, no request finishing, the token budget and the
/// KV cache enough for all, no speculation (a speculative round's commits differ by
/// request and round). Each forward is priced and timed as `step` would
/// (the same batch, context, budget and front end), the window ends where `step` would do
/// something else, and the tokens are committed together. Long outputs spend most of
/// their steps here. Returns whether it ran any forward.
fn steady_decodes(s: &mut SimSession<'_>) -> Result<bool, BackendError> {
    let bs = s.running.len() as u32;
    // a batch over the budget would be cut short in `step` (every prefill that admitted a
    // request spent budget on it, so this is a guard, not a case that arises)
    if s.b.step_by_step
        || s.b.spec.is_speculative()
        || bs == 0
        || bs > s.b.max_num_batched_tokens
        || !s.waiting.is_empty()
        || !s.prefilling.is_empty()
        || s.chunks.is_some()
    {
        return Ok(false);
    }
    // the forward that finishes a request runs in `step`, which retires it
    let Some(left) = s
        .running
        .iter()
        .map(|r| r.req.output_len() - r.output())
        .min()
    else {
        return Ok(false);
    };
    let per_request = s.b.kv.decode_slots_per_request as u64;
    let slots_for_the_batch = bs as u64 * per_request;
    if left < 2 || s.free_slots() < slots_for_the_batch {
        return Ok(false);
    }
    // integers, so the f64 sum `step` takes over the batch is exact and equal to this one
    let mut context_tokens: u64 = s
        .running
        .iter()
        .map(|r| u64::from(r.req.input_len + r.output()))
        .sum();
    let mut visible_times: Vec<Nanos> = Vec::new();
    loop {
        let t =
            s.b.cost
                .vllm_step_ns(
                    &VllmStep {
                        decode_requests: bs,
                        decode_tokens: bs,
                        drafting_requests: bs,
                        ctx: context_tokens as f64 / bs as f64,
                    },
                    &[],
                    None,
                )
                .map_err(fail)?;
        s.now += t;
        visible_times.push(s.deliver(bs));
        context_tokens += u64::from(bs);
        s.kv.used += u64::from(bs);
        s.kv.peak = s.kv.peak.max(s.kv.used);
        if visible_times.len() as u32 == left - 1
            || s.free_slots() < slots_for_the_batch
            || !s.next_forward_is_quiet()
        {
            break;
        }
    }
    let steps = visible_times.len() as u32;
    for r in &mut s.running {
        r.token_times.extend_from_slice(&visible_times);
        r.kv_tokens += steps;
    }
    Ok(true)
}

fn step(s: &mut SimSession<'_>) -> Result<(), BackendError> {
    if steady_decodes(s)? {
        return Ok(());
    }
    // Each running request needs its slots for this step (1 + K drafts, plus K lookahead
    // for a GPU drafter); without them the latest admitted is preempted, and a step that
    // preempted admits nobody (vLLM's `preempted_reqs` check).
    let per_request = s.b.kv.decode_slots_per_request as u64;
    let mut preempted = false;
    while s.free_slots() < s.running.len() as u64 * per_request {
        if !preempt_latest(s) {
            break;
        }
        preempted = true;
    }
    let speculate = s.b.speculates_at(s.running.len() as u32);
    let mut budget = s.b.max_num_batched_tokens;
    // Running requests first, in order, each asking for 1 + its drafts; a short budget
    // truncates the drafts of the last one scheduled.
    let mut scheduled: Vec<u32> = Vec::with_capacity(s.running.len());
    for r in &s.running {
        if budget == 0 {
            break;
        }
        let drafts = match (&s.b.acceptance, speculate) {
            (Some(a), true) => a
                .round_proposal(r.req.id, r.output(), &s.b.spec)
                .min(s.b.spec.shape.num_steps),
            _ => 0,
        };
        let n = (1 + drafts).min(budget);
        scheduled.push(n);
        budget -= n;
    }
    let decode_bs = scheduled.len() as u32;
    let decode_tokens: u32 = scheduled.iter().sum();
    // slots the decodes will take at the end of the step
    let mut free = s
        .free_slots()
        .saturating_sub(decode_bs as u64 * per_request);
    let mut parts = Vec::new();
    let mut take = 0u32;
    for r in s.prefilling.iter_mut() {
        let left = r.fill_len() - r.prefilled;
        // a chunk that ends the prompt also needs the slot of its first token
        let n = if (left as u64) < free {
            left.min(budget)
        } else {
            (free.saturating_sub(1).min(u32::MAX as u64) as u32).min(budget)
        };
        if n == 0 {
            break;
        }
        parts.push(PrefillPart {
            new_tokens: n,
            cached: r.prefilled,
        });
        r.prefilled += n;
        r.kv_tokens += n;
        take += n;
        free -= n as u64 + (r.prefilled == r.fill_len()) as u64;
        budget -= n;
    }
    while !preempted
        && budget > 0
        && s.running.len() + s.prefilling.len() < s.b.max_running as usize
    {
        let Some(next) = s.waiting.front() else {
            break;
        };
        let hit = s.prefix_hit(next);
        let extend = next.fill_len() - hit;
        let n = extend.min(budget);
        let need = n as u64 + (n == extend) as u64;
        // the whole prompt must fit what is free, though only its first chunk is taken now
        // (`scheduler_reserve_full_isl`, vLLM 0.32's default: `KVCacheManager.allocate_slots`
        // with `full_sequence_must_fit`), so a long prompt is not admitted to be preempted
        if need > free || extend as u64 > free {
            break;
        }
        let Some(mut r) = s.waiting.pop_front() else {
            break;
        };
        parts.push(PrefillPart {
            new_tokens: n,
            cached: hit,
        });
        r.prefilled = hit + n;
        r.kv_tokens += n;
        take += n;
        free -= need;
        budget -= n;
        s.prefilling.push(r);
    }
    s.kv.take(take);
    if decode_bs == 0 && parts.is_empty() {
        return Err(s.cannot_admit());
    }
    let decoding = &s.running[..decode_bs as usize];
    let ctx = decoding
        .iter()
        .map(|r| (r.req.input_len + r.output()) as f64)
        .sum::<f64>()
        / decode_bs.max(1) as f64;
    let (done, still): (Vec<Live>, Vec<Live>) = std::mem::take(&mut s.prefilling)
        .into_iter()
        .partition(|r| r.prefilled == r.fill_len());
    s.prefilling = still;
    let spec = speculate.then_some(&s.b.spec);
    let t =
        s.b.cost
            .vllm_step_ns(
                &VllmStep {
                    decode_requests: decode_bs,
                    decode_tokens,
                    drafting_requests: decode_bs + parts.len() as u32,
                    ctx,
                },
                &parts,
                spec,
            )
            .map_err(fail)?;
    s.now += t;
    // accepted drafts + 1 (the bonus or the corrected token), within what was scheduled
    let commits: Vec<u32> = s.running[..decode_bs as usize]
        .iter()
        .zip(&scheduled)
        .map(|(r, &n)| {
            let want = match (&s.b.acceptance, n > 1) {
                (Some(a), true) => a.round_commit(r.req.id, r.output(), &s.b.spec).clamp(1, n),
                _ => 1,
            };
            want.min(r.req.output_len() - r.output())
        })
        .collect();
    let visible = s.deliver(decode_bs + done.len() as u32);
    let speculative = s.b.spec.is_speculative();
    for ((r, &n), &sched) in s.running[..decode_bs as usize]
        .iter_mut()
        .zip(&commits)
        .zip(&scheduled)
    {
        r.token_times
            .extend(std::iter::repeat_n(visible, n as usize));
        r.kv_tokens += n;
        s.kv.used += n as u64;
        if speculative {
            r.round_commits.push(n);
            r.undrafted_rounds += u32::from(sched == 1);
        }
        record_chunk(&mut s.chunks, r, visible, n, sched > 1);
    }
    s.kv.peak = s.kv.peak.max(s.kv.used);
    for mut r in done {
        s.first_token(&mut r, visible);
        s.running.push(r);
    }
    s.retire_finished();
    Ok(())
}
