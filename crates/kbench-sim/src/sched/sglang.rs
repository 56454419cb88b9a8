//! SGLang's scheduler (scheduler.py's event loop, `get_next_batch_to_run`): prefill first.
//! Whenever a slot is free (running < max_running_requests) and the KV cache can take them,
//! waiting requests are prefilled as their own forward (EAGLE disables mixed chunked
//! prefill), which yields each one's first token; otherwise one decode round runs over
//! every running request (with speculation: draft, verify, draft extend, priced as one
//! round by [`crate::cost::CostModel::round_ns`]).
//!
//! Admission follows SGLang's PrefillAdder: a prompt is admitted when it and its (clipped)
//! output fit what the running requests have not reserved (`new_token_ratio` of their
//! remaining output); prompts longer than `chunked_prefill_size` are prefilled in chunks
//! over consecutive forwards (at most one request is in chunks, SGLang's `chunked_req`); a
//! shared prefix, once prefilled, is served from the prefix cache. A decode round that
//! cannot get its slots retracts requests (fewest output tokens first, then longest prompt)
//! back to the front of the queue; they are prefilled again (prompt + output so far) later.

use kbench_core::backend::{BackendError, CudaGraphBound};
use kbench_core::experiment::Experiment;

use super::Scheduler;
use crate::cost::PrefillPart;
use crate::kv::{
    INIT_NEW_TOKEN_RATIO, MIN_NEW_TOKEN_RATIO_FACTOR, NEW_TOKEN_RATIO_DECAY_STEPS,
    RETRACT_DECODE_STEPS,
};
use crate::profile::HardwareProfile;
use crate::sim::{fail, record_chunk, Live, SimSession};

pub(crate) struct Sglang;

impl Scheduler for Sglang {
    fn step(&self, s: &mut SimSession<'_>) -> Result<(), BackendError> {
        let can_admit = !s.prefilling.is_empty()
            || (!s.waiting.is_empty() && (s.running.len() as u32) < s.b.max_running);
        if can_admit && prefill(s)? {
            return Ok(());
        }
        if s.running.is_empty() {
            // the pool cannot take the next prompt with nothing running: the fit check
            // before the run rules this out, so say so rather than spin
            return Err(s.cannot_admit());
        }
        decode_round(s)
    }

    /// The overlap scheduler (`Scheduler.event_loop_overlap`, sglang/srt/managers/
    /// scheduler.py; on by default, off under spec v1, on again with spec v2): each
    /// iteration receives requests, launches the next batch, then blocks on the previous
    /// batch's result, so requests are read one batch ahead of the GPU.
    fn schedules_ahead(&self, spec: &kbench_core::experiment::SpeculativeConfig) -> bool {
        !spec.is_speculative() || spec.spec_v2
    }

    /// SGLang captures one graph per batch size, for decode and for every speculative pass.
    fn graph_bound(&self, exp: &Experiment, profile: &HardwareProfile) -> CudaGraphBound {
        CudaGraphBound::Requests(crate::sglang_defaults::cuda_graph_max_bs(exp, profile))
    }
}

/// One prefill forward if anything can be admitted (SGLang's get_new_batch_prefill):
/// the chunked request's next chunk first, then waiting requests while slots, the
/// prefill budgets and the KV cache allow. Returns whether a forward ran.
fn prefill(s: &mut SimSession<'_>) -> Result<bool, BackendError> {
    if s.running.is_empty() && s.prefilling.is_empty() {
        s.kv.new_token_ratio = INIT_NEW_TOKEN_RATIO;
    }
    let mut chunk_left = s.b.kv.chunked_prefill_size.unwrap_or(u32::MAX);
    let mut input_left = s.b.max_prefill_tokens;
    let reserved: f64 = s
        .running
        .iter()
        .map(|r| r.reserve() as f64 * s.kv.new_token_ratio)
        .sum();
    let mut rem_total = s.free_slots() as f64 - reserved;
    let mut parts = Vec::new();
    let mut whole: Vec<Live> = Vec::new();
    if let Some(mut c) = s.prefilling.pop() {
        let n = (c.fill_len() - c.prefilled).min(chunk_left);
        parts.push(PrefillPart {
            new_tokens: n,
            cached: c.prefilled,
        });
        c.prefilled += n;
        c.kv_tokens += n;
        s.kv.take(n);
        rem_total -= n as f64;
        chunk_left -= n;
        input_left = input_left.saturating_sub(n);
        if c.prefilled == c.fill_len() {
            rem_total -= c.reserve() as f64;
            whole.push(c);
        } else {
            s.prefilling.push(c);
        }
    }
    while s.prefilling.is_empty() && chunk_left > 0 {
        let Some(next) = s.waiting.front() else {
            break;
        };
        if s.running.len() + whole.len() >= s.b.max_running as usize {
            break;
        }
        let hit = s.prefix_hit(next);
        let extend = next.fill_len() - hit;
        if (extend + next.reserve()) as f64 >= rem_total {
            break;
        }
        // Always admit one prompt, however long; then stay within the token budget.
        if !parts.is_empty() && extend > input_left {
            break;
        }
        let Some(mut r) = s.waiting.pop_front() else {
            break;
        };
        let n = extend.min(chunk_left);
        parts.push(PrefillPart {
            new_tokens: n,
            cached: hit,
        });
        r.prefilled = hit + n;
        r.kv_tokens += n;
        s.kv.take(n);
        chunk_left -= n;
        input_left = input_left.saturating_sub(n);
        if n < extend {
            // SGLang reserves no output for a prompt still in chunks
            rem_total -= n as f64;
            s.prefilling.push(r);
        } else {
            rem_total -= (extend + r.reserve()) as f64;
            whole.push(r);
        }
    }
    if parts.is_empty() {
        return Ok(false);
    }
    let t =
        s.b.cost
            .prefill_parts_ns(&parts, s.b.spec.is_speculative())
            .map_err(fail)?;
    s.now += t;
    let visible = s.deliver(whole.len() as u32);
    for mut r in whole {
        s.first_token(&mut r, visible);
        if r.done() {
            s.kv.give_back(r.kv_tokens);
            s.delivering.push(r.into_record());
        } else {
            s.running.push(r);
        }
    }
    Ok(true)
}

/// SGLang's check_decode_mem and retract_decode: when the pool cannot give every
/// running request its slots for one more step, requests go back to the queue (fewest
/// output tokens first, then the longest prompt) until each survivor has room for
/// RETRACT_DECODE_STEPS steps; at least one goes, and never the last.
fn make_room_for_decode(s: &mut SimSession<'_>) {
    let per_request = s.b.kv.decode_slots_per_request as u64;
    if s.free_slots() >= s.running.len() as u64 * per_request {
        let min_ratio = INIT_NEW_TOKEN_RATIO * MIN_NEW_TOKEN_RATIO_FACTOR;
        let decay = (INIT_NEW_TOKEN_RATIO - min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS;
        s.kv.new_token_ratio = (s.kv.new_token_ratio - decay).max(min_ratio);
        return;
    }
    let spec = if s.b.spec.is_speculative() {
        per_request
    } else {
        0
    };
    let required = |n: usize| n as u64 * (RETRACT_DECODE_STEPS as u64 + spec);
    // victims come off the end: most output first, ties longest prompt last
    s.running.sort_by(|a, b| {
        (b.output(), a.req.input_len, b.req.id).cmp(&(a.output(), b.req.input_len, a.req.id))
    });
    let mut first = true;
    while s.running.len() > 1 && (first || s.free_slots() < required(s.running.len())) {
        first = false;
        let Some(mut victim) = s.running.pop() else {
            break;
        };
        s.kv.give_back(victim.kv_tokens);
        victim.kv_tokens = 0;
        victim.prefilled = 0;
        victim.retractions += 1;
        s.waiting.push_front(victim);
    }
    let decoded: u64 = s.running.iter().map(|r| r.output() as u64).sum();
    let asked: u64 = s.running.iter().map(|r| r.req.max_tokens as u64).sum();
    s.kv.new_token_ratio = ((decoded + RETRACT_DECODE_STEPS as u64 * s.running.len() as u64)
        as f64
        / asked.max(1) as f64)
        .min(1.0);
    s.running.sort_by_key(|r| r.req.id);
}

fn decode_round(s: &mut SimSession<'_>) -> Result<(), BackendError> {
    make_room_for_decode(s);
    let bs = s.running.len() as u32;
    let speculate = s.b.speculates_at(bs);
    let ctx_sum: u64 = s
        .running
        .iter()
        .map(|r| r.req.input_len as u64 + r.token_times.len() as u64)
        .sum();
    let ctx = ctx_sum as f64 / bs as f64;
    let spec = speculate.then_some(&s.b.spec);
    let t = s.b.cost.round_ns(bs, ctx, spec).map_err(fail)?;
    s.now += t;
    let mut commits = Vec::with_capacity(s.running.len());
    for r in &s.running {
        let committed = r.output();
        let want = match (&s.b.acceptance, speculate) {
            (Some(a), true) => a.round_commit(r.req.id, committed, &s.b.spec).max(1),
            _ => 1,
        };
        commits.push(want.min(r.req.output_len() - committed));
    }
    // One streamed chunk per request: a round's accepted tokens travel together.
    let visible = s.deliver(commits.len() as u32);
    for (r, &n) in s.running.iter_mut().zip(&commits) {
        r.token_times
            .extend(std::iter::repeat_n(visible, n as usize));
        r.kv_tokens += n;
        s.kv.used += n as u64;
        // A round that did not speculate (above disable_batch_threshold) is recorded as a
        // round committing one token, so round commits always sum to tokens - 1.
        if s.b.spec.is_speculative() {
            r.round_commits.push(n);
            r.undrafted_rounds += u32::from(!speculate);
        }
        record_chunk(&mut s.chunks, r, visible, n, speculate);
    }
    s.kv.peak = s.kv.peak.max(s.kv.used);
    s.retire_finished();
    Ok(())
}
