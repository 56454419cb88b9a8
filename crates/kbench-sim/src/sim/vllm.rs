//! vLLM V1's scheduler in the simulator: every step spends one token budget
//! (`max_num_batched_tokens`) on the running requests' decodes first, then on prefill
//! chunks of the requests still prefilling, then on new requests, all in one forward. KV
//! slots are taken as tokens are computed, with no reservation for output; when a decode
//! cannot get its slot the most recently admitted request is preempted (its KV freed, to be
//! recomputed from the front of the queue), as vLLM's FCFS policy does.

use kbench_core::backend::BackendError;

use super::{fail, record_chunk, Live, SimSession};
use crate::cost::PrefillPart;

impl SimSession<'_> {
    /// The latest admitted request goes back to the front of the queue, its cache freed.
    fn preempt_latest(&mut self) -> bool {
        let victim = match self.partial.pop() {
            Some(v) => Some(v),
            None if self.running.len() > 1 => self.running.pop(),
            None => None,
        };
        let Some(mut v) = victim else {
            return false;
        };
        self.kv.give_back(v.kv_tokens);
        v.kv_tokens = 0;
        v.prefilled = 0;
        v.retractions += 1;
        self.waiting.push_front(v);
        true
    }

    pub(super) fn vllm_step(&mut self) -> Result<(), BackendError> {
        while self.free_slots() < self.running.len() as u64 {
            if !self.preempt_latest() {
                break;
            }
        }
        let mut budget = self.b.max_num_batched_tokens;
        let decode_bs = (self.running.len() as u32).min(budget);
        budget -= decode_bs;
        // slots the decodes will take at the end of the step
        let mut free = self.free_slots().saturating_sub(decode_bs as u64);
        let mut parts = Vec::new();
        let mut take = 0u32;
        for r in self.partial.iter_mut() {
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
        while budget > 0 && self.running.len() + self.partial.len() < self.b.max_running as usize {
            let Some(next) = self.waiting.front() else {
                break;
            };
            let hit = self.prefix_hit(next);
            let extend = next.fill_len() - hit;
            let n = extend.min(budget);
            let need = n as u64 + (n == extend) as u64;
            if need > free {
                break;
            }
            let Some(mut r) = self.waiting.pop_front() else {
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
            self.partial.push(r);
        }
        self.kv.take(take);
        if decode_bs == 0 && parts.is_empty() {
            return Err(BackendError::msg(
                "sim",
                format!(
                    "the KV cache ({} tokens, {} in use) cannot admit the next request",
                    self.b.kv.tokens, self.kv.used
                ),
            ));
        }
        let decoding = &self.running[..decode_bs as usize];
        let ctx = decoding
            .iter()
            .map(|r| (r.req.input_len + r.output()) as f64)
            .sum::<f64>()
            / decode_bs.max(1) as f64;
        let t = self
            .b
            .cost
            .mixed_step_ns(decode_bs, ctx, &parts)
            .map_err(fail)?;
        self.now += t;
        let (done, still): (Vec<Live>, Vec<Live>) = std::mem::take(&mut self.partial)
            .into_iter()
            .partition(|r| r.prefilled == r.fill_len());
        self.partial = still;
        let visible = self.deliver(decode_bs + done.len() as u32);
        for r in self.running[..decode_bs as usize].iter_mut() {
            r.token_times.push(visible);
            r.kv_tokens += 1;
            record_chunk(&mut self.chunks, r, visible, 1, false);
        }
        self.kv.take(decode_bs);
        for mut r in done {
            self.prompt_done(&mut r);
            r.token_times.push(visible);
            r.kv_tokens += 1;
            self.kv.take(1);
            record_chunk(&mut self.chunks, &r, visible, 1, false);
            self.running.push(r);
        }
        self.retire_finished();
        Ok(())
    }
}
