//! Continuous batching, one forward at a time, on any [`SpeculativeModel`]: the scheduler under the
//! `engine` backend's sessions and under `kbench serve`.
//!
//! Each [`Batcher::step`] runs one forward, as SGLang's scheduler does: while a slot is free
//! and requests wait, a prefill batch (which yields each request's first token); otherwise one
//! decode step or speculative round over every running request. It reports what each request
//! committed in that forward, so a server can stream one chunk per round.
//!
//! With a prefill chunk ([`Batcher::with_prefill_chunk`]), a prompt longer than the chunk is
//! prefilled a chunk per forward, one such prompt at a time, and the running requests get a
//! forward of their own between two chunks: one long prompt delays the others' rounds by a
//! chunk's time, not by its whole prefill, and its client can cancel it between chunks.

use std::collections::VecDeque;

use kbench_core::verify::SamplingParams;

use crate::error::{EngineError, Result};
use crate::passes::SpeculativeModel;
use crate::speculative::{
    decode_step, prefill, prefill_step, seq_rng, spec_round, PrefillProgress, Seq,
    SpeculativeSettings,
};

/// How one request is decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqParams {
    pub max_new: usize,
    pub sampling: SamplingParams,
    /// The request's sampling stream is `seq_rng(seed, stream)`: a server passes the client's
    /// seed and 0, so one seed gives the same tokens whatever order requests arrive in.
    pub seed: u64,
    pub stream: u64,
    /// Token ids that end the request (kept in its output), e.g. the EOS id unless the client
    /// asked to ignore it.
    pub stop_token_ids: Vec<u32>,
}

/// Why a request stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// `max_new` tokens were produced.
    Length,
    /// This stop token was produced.
    Stop(u32),
}

/// What one forward did for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Commit {
    pub id: u64,
    /// Tokens committed by this forward (after a stop token, none).
    pub tokens: Vec<u32>,
    /// Set for a verify round (not for prefill or plain decode): the draft tokens the round
    /// verified and how many of them the committed tokens took.
    pub round: Option<RoundStats>,
    pub finish: Option<Finish>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundStats {
    /// Draft tokens submitted for verification: SGLang's `num_draft_tokens - 1`.
    pub proposed: u32,
    /// Of those, the ones committed (tokens committed minus the bonus token).
    pub accepted: u32,
}

struct Waiting {
    id: u64,
    prompt: Vec<u32>,
    params: SeqParams,
}

struct Running<C> {
    seq: Seq<C>,
    slot: usize,
    /// Sorted and deduplicated: searched once per committed token.
    stop_token_ids: Vec<u32>,
}

/// The prompt being prefilled a chunk at a time.
struct Prefilling<C> {
    run: Running<C>,
    progress: PrefillProgress,
}

pub struct Batcher<M: SpeculativeModel> {
    model: M,
    spec: Option<SpeculativeSettings>,
    max_running: usize,
    waiting: VecDeque<Waiting>,
    running: Vec<Running<M::Caches>>,
    /// KV slots no running request holds; `None` where the device has no slots.
    free_slots: Option<Vec<usize>>,
    /// Most prompt tokens one forward prefills; `None`: every prompt in one forward.
    prefill_chunk: Option<usize>,
    prefilling: Option<Prefilling<M::Caches>>,
    /// The last forward was a chunk: the running requests' forward comes next.
    chunk_ran: bool,
}

impl<M: SpeculativeModel> Batcher<M> {
    pub fn new(model: M, spec: Option<SpeculativeSettings>, max_running: usize) -> Batcher<M> {
        let free_slots = model.kv_slots().map(|n| (0..n).rev().collect());
        Batcher {
            model,
            spec,
            max_running: max_running.max(1),
            waiting: VecDeque::new(),
            running: Vec::new(),
            free_slots,
            prefill_chunk: None,
            prefilling: None,
            chunk_ran: false,
        }
    }

    /// Prefills prompts longer than `chunk` tokens a chunk per forward (SGLang's
    /// `--chunked-prefill-size`); `None` or 0: every prompt in one forward.
    pub fn with_prefill_chunk(mut self, chunk: Option<usize>) -> Batcher<M> {
        self.prefill_chunk = chunk.filter(|&c| c > 0);
        self
    }

    pub fn vocab(&self) -> usize {
        self.model.vocab()
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty() && self.prefilling.is_none()
    }

    /// Requests holding a slot: decoding, or with their prompt part-way into the cache.
    pub fn running_len(&self) -> usize {
        self.running.len() + usize::from(self.prefilling.is_some())
    }

    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    /// Queues a request; it is admitted at a later forward.
    pub fn submit(&mut self, id: u64, prompt: Vec<u32>, params: SeqParams) -> Result<()> {
        if params.max_new == 0 {
            return Err(EngineError::Invalid(format!(
                "request {id} asks for 0 tokens"
            )));
        }
        if prompt.is_empty() {
            return Err(EngineError::Invalid(format!("request {id}: empty prompt")));
        }
        let vocab = self.model.vocab();
        if let Some(t) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::Invalid(format!(
                "request {id}: token id {t} is outside the vocabulary (0..{vocab})"
            )));
        }
        let mut params = params;
        params.stop_token_ids.sort_unstable();
        params.stop_token_ids.dedup();
        self.waiting.push_back(Waiting { id, prompt, params });
        Ok(())
    }

    /// Drops a request, waiting or running; frees its slot. Returns whether it was there.
    pub fn cancel(&mut self, id: u64) -> bool {
        if let Some(i) = self.waiting.iter().position(|w| w.id == id) {
            self.waiting.remove(i);
            return true;
        }
        if let Some(i) = self.running.iter().position(|r| r.seq.id == id) {
            let r = self.running.remove(i);
            self.free(r.slot);
            return true;
        }
        if self.prefilling.as_ref().is_some_and(|p| p.run.seq.id == id) {
            let p = self.prefilling.take().expect("checked");
            self.free(p.run.slot);
            return true;
        }
        false
    }

    /// Drops every request (after a failed forward, whose caches can no longer be trusted).
    pub fn clear(&mut self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.waiting.drain(..).map(|w| w.id).collect();
        let running: Vec<_> = self.running.drain(..).collect();
        for r in running {
            ids.push(r.seq.id);
            self.free(r.slot);
        }
        if let Some(p) = self.prefilling.take() {
            ids.push(p.run.seq.id);
            self.free(p.run.slot);
        }
        ids
    }

    fn free(&mut self, slot: usize) {
        if let Some(free) = &mut self.free_slots {
            free.push(slot);
        }
    }

    /// Takes waiting requests, in arrival order, while the cap and the free slots allow. A
    /// prompt longer than the prefill chunk becomes the one prefilled chunk by chunk, and
    /// stops the taking: the requests behind it keep their turn after it.
    fn admit(&mut self) -> Vec<Running<M::Caches>> {
        let mut admitted = Vec::new();
        while self.running_len() + admitted.len() < self.max_running {
            let Some(head) = self.waiting.front() else {
                break;
            };
            let long = self.prefill_chunk.is_some_and(|c| head.prompt.len() > c);
            if long && (self.prefilling.is_some() || !admitted.is_empty()) {
                break;
            }
            let slot = match &mut self.free_slots {
                Some(free) => match free.pop() {
                    Some(slot) => slot,
                    None => break,
                },
                None => 0,
            };
            let w = self.waiting.pop_front().expect("checked");
            let mut seq = Seq::with_caches(
                w.id,
                w.prompt,
                w.params.max_new,
                w.params.sampling.temperature,
                seq_rng(w.params.seed, w.params.stream),
                self.model.new_caches(slot),
            );
            seq.top_k = w.params.sampling.top_k;
            seq.top_p = w.params.sampling.top_p;
            let run = Running {
                seq,
                slot,
                stop_token_ids: w.params.stop_token_ids,
            };
            if long {
                self.prefilling = Some(Prefilling {
                    run,
                    progress: PrefillProgress::default(),
                });
                break;
            }
            admitted.push(run);
        }
        admitted
    }

    /// The next chunk of the prompt being prefilled; its first token's commit once the
    /// whole prompt is in.
    fn prefill_next_chunk(&mut self) -> Result<Vec<Commit>> {
        let chunk = self.prefill_chunk.unwrap_or(usize::MAX);
        let p = self
            .prefilling
            .as_mut()
            .expect("a prompt is being prefilled");
        match prefill_step(&mut self.model, &mut p.run.seq, &mut p.progress, chunk) {
            Err(e) => {
                let p = self.prefilling.take().expect("checked");
                self.free(p.run.slot);
                Err(e)
            }
            Ok(false) => Ok(Vec::new()),
            Ok(true) => {
                let mut p = self.prefilling.take().expect("checked");
                let commit = take_commit(&mut p.run, 0, None);
                if commit.finish.is_some() {
                    self.free(p.run.slot);
                } else {
                    self.running.push(p.run);
                }
                Ok(vec![commit])
            }
        }
    }

    /// Runs one forward (a prefill batch, else a decode step or speculative round over the
    /// running batch) and reports each request's commits, in batch order. Finished requests
    /// leave the batch. Nothing to do: an empty list. On an error the caller should
    /// [`Batcher::clear`]: the running requests' caches are in an unknown state.
    ///
    /// While a prompt is prefilled chunk by chunk, forwards alternate between its next chunk
    /// and the others' forward (a prefill batch or a round); a chunk's forward reports
    /// nothing until the prompt's last chunk.
    pub fn step(&mut self) -> Result<Vec<Commit>> {
        // a chunk, unless the last forward was one and others are waiting for their round
        let others_turn = self.chunk_ran && !self.running.is_empty();
        if self.prefilling.is_some() && !others_turn {
            self.chunk_ran = true;
            return self.prefill_next_chunk();
        }
        self.chunk_ran = false;
        let mut admitted = self.admit();
        let mut commits;
        if !admitted.is_empty() {
            let mut refs: Vec<&mut Seq<M::Caches>> =
                admitted.iter_mut().map(|r| &mut r.seq).collect();
            if let Err(e) = prefill(&mut self.model, &mut refs) {
                for r in admitted {
                    self.free(r.slot);
                }
                return Err(e);
            }
            commits = Vec::with_capacity(admitted.len());
            for mut r in admitted {
                commits.push(take_commit(&mut r, 0, None));
                self.running.push(r);
            }
        } else if !self.running.is_empty() {
            let before: Vec<usize> = self.running.iter().map(|r| r.seq.output_len()).collect();
            let mut refs: Vec<&mut Seq<M::Caches>> =
                self.running.iter_mut().map(|r| &mut r.seq).collect();
            let proposed = match &self.spec {
                Some(cfg) => {
                    spec_round(&mut self.model, &mut refs, cfg)?;
                    Some(cfg.shape.num_draft_tokens.saturating_sub(1))
                }
                None => {
                    decode_step(&mut self.model, &mut refs)?;
                    None
                }
            };
            commits = Vec::with_capacity(self.running.len());
            for (r, b) in self.running.iter_mut().zip(before) {
                commits.push(take_commit(r, b, proposed));
            }
        } else if self.prefilling.is_some() {
            // admit() has just taken a long prompt, and nobody else runs: its first chunk
            self.chunk_ran = true;
            return self.prefill_next_chunk();
        } else {
            return Ok(Vec::new());
        }
        // The commits belong to the last `commits.len()` running requests, in order (all of
        // them after a round; after a prefill the admitted ones, appended last).
        let finished: Vec<bool> = commits.iter().map(|c| c.finish.is_some()).collect();
        let start = self.running.len() - finished.len();
        let mut freed = Vec::new();
        let mut at = 0;
        self.running.retain(|r| {
            let keep = at < start || !finished[at - start];
            if !keep {
                freed.push(r.slot);
            }
            at += 1;
            keep
        });
        for slot in freed {
            self.free(slot);
        }
        Ok(commits)
    }
}

/// The tokens a forward appended to `r` past `before`, cut after the first stop token.
fn take_commit<C>(r: &mut Running<C>, before: usize, proposed: Option<u32>) -> Commit {
    let start = r.seq.prompt_len + before;
    let new = &r.seq.tokens[start..];
    let stop_at = new
        .iter()
        .position(|t| r.stop_token_ids.binary_search(t).is_ok())
        .map(|i| (i, new[i]));
    if let Some((i, _)) = stop_at {
        r.seq.tokens.truncate(start + i + 1);
        // keep round_commits summing to the output, as the client sees it
        if proposed.is_some() {
            if let Some(last) = r.seq.round_commits.last_mut() {
                *last = (i + 1) as u32;
            }
        }
    }
    let tokens = r.seq.tokens[start..].to_vec();
    let finish = match stop_at {
        Some((_, t)) => Some(Finish::Stop(t)),
        None if r.seq.finished() => Some(Finish::Length),
        None => None,
    };
    Commit {
        id: r.seq.id,
        round: proposed.map(|p| RoundStats {
            proposed: p,
            accepted: (tokens.len() as u32).saturating_sub(1),
        }),
        tokens,
        finish,
    }
}
