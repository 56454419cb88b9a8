//! Recording acceptance traces with the engine: for every position of a greedy target
//! continuation, the draft is run D depths along the target's own tokens and the rank of
//! each target token among the draft's top-K is stored with the top-K probabilities.
//!
//! Position p of a sequence is the round that starts when p output tokens are committed
//! (the first output token comes from prefill, so rounds start at p = 1; position 0 repeats
//! position 1 so that wrapped replays stay well defined). At position p and depth d the
//! draft has followed the target's tokens up to output token p+d-1 and the recorded rank
//! is that of output token p+d. Draft states at a position do not depend on how earlier
//! rounds were batched (every kernel is batch-invariant), so chain (topk 1) replay of the
//! trace reproduces the engine's own accept lengths exactly.

use serde_json::json;

use kbench_core::trace::{ProbEncoding, Provenance, Trace, TraceHeader, TraceKind};

use crate::draft::{DraftCache, DraftKv, DraftSegment};
use crate::error::{EngineError, Result};
use crate::linalg::{argmax, softmax_inplace, topk};
use crate::model::Model;
use crate::target::{Attend, Segment};

#[derive(Debug, Clone)]
pub struct TraceOptions {
    /// Recorded depth D (>= the num_steps replayed).
    pub depth: u32,
    /// Recorded K (>= the eagle_topk replayed).
    pub topk: u32,
    /// Positions recorded per sequence (output tokens).
    pub max_new: usize,
    pub dataset: String,
    pub prob_encoding: ProbEncoding,
}

/// `count` prompts of `len` random token ids, ids 0..count, drawn as the engine backend
/// draws its prompts (`rng_for(seed, "prompt", id)`).
pub fn random_prompts(model: &Model, seed: u64, count: usize, len: usize) -> Vec<(u64, Vec<u32>)> {
    (0..count as u64)
        .map(|id| {
            (
                id,
                crate::backend::random_prompt(seed, id, len, model.target.vocab),
            )
        })
        .collect()
}

/// Records a trace over `prompts` (id, token ids) with the model's target and draft.
pub fn record_trace(
    model: &Model,
    prompts: &[(u64, Vec<u32>)],
    opts: &TraceOptions,
) -> Result<Trace> {
    let draft = model
        .draft
        .as_ref()
        .ok_or_else(|| EngineError::Invalid("recording a trace needs a draft model".into()))?;
    let (dd, kk) = (opts.depth as usize, opts.topk as usize);
    if dd == 0 || kk == 0 || opts.max_new < 2 {
        return Err(EngineError::Invalid(
            "trace depth and topk must be >= 1 and max_new >= 2".into(),
        ));
    }
    if kk > draft.draft_vocab() {
        return Err(EngineError::Invalid(format!(
            "topk {kk} exceeds the draft vocabulary {}",
            draft.draft_vocab()
        )));
    }
    let target = &model.target;
    let mut params = serde_json::Map::new();
    params.insert("depth".into(), json!(opts.depth));
    params.insert("topk".into(), json!(opts.topk));
    params.insert("max_new".into(), json!(opts.max_new));
    params.insert("capture_layers".into(), json!(target.capture_layers));
    let header = TraceHeader::new(
        Provenance {
            kind: TraceKind::Engine,
            target: model.dir.display().to_string(),
            draft: draft.arch.name.clone(),
            dataset: opts.dataset.clone(),
            temperature: 0.0,
            generator: "kbench-engine record_trace".into(),
            params,
        },
        opts.depth,
        opts.topk,
        opts.prob_encoding,
    );
    let mut trace = Trace::new(header);
    let ncap = target.capture_layers.len() * target.hidden;
    let dv = draft.draft_vocab();
    let h = draft.hidden;
    for (id, prompt) in prompts {
        // 1. Greedy continuation, max_new + depth tokens, capturing every hidden state.
        let total_new = opts.max_new + dd;
        let mut toks = prompt.clone();
        let mut cache = target.new_cache();
        let width = target.kv_width();
        let mut captured = Vec::new();
        let mut fed = 0;
        while toks.len() < prompt.len() + total_new {
            let seg = Segment {
                cache: &cache,
                tokens: toks[fed..].to_vec(),
                positions: (fed as u32..toks.len() as u32).collect(),
                attend: Attend::Causal,
                all_logits: false,
            };
            let o = target.forward(&[seg])?.remove(0);
            let n = toks.len() - fed;
            o.commit(&mut cache, &(0..n).collect::<Vec<_>>(), width);
            captured.extend_from_slice(&o.captured);
            fed = toks.len();
            toks.push(argmax(&o.logits) as u32);
        }
        let plen = prompt.len();
        // 2. Draft extend over every entry t = 0..N-2: (h_t, x_{t+1}).
        let n_entries = toks.len() - 1;
        let empty = DraftCache::default();
        let ext = draft
            .forward(
                target,
                &[DraftSegment {
                    cache: &empty,
                    extra: Vec::new(),
                    tokens: toks[1..].to_vec(),
                    hidden_in: captured[..n_entries * ncap].to_vec(),
                    positions: (0..n_entries as u32).collect(),
                }],
            )?
            .remove(0);
        let mut full = DraftCache::default();
        for kv in &ext.kv {
            full.push(kv);
        }
        let kvw = ext.kv.first().map(|k| k.k.len()).unwrap_or(0);
        // 3. Per position p >= 1 (n = plen + p committed tokens), D depths along the target.
        let positions = opts.max_new;
        let mut ranks = vec![0u8; positions * dd];
        let mut probs = vec![0f64; positions * dd * kk];
        let caches: Vec<DraftCache> = (1..positions)
            .map(|p| {
                let len = plen + p - 1; // entries 0..n-2
                DraftCache {
                    k: full.k[..len * kvw].to_vec(),
                    v: full.v[..len * kvw].to_vec(),
                    len,
                }
            })
            .collect();
        let mut chain_kv: Vec<Vec<DraftKv>> = vec![Vec::new(); positions];
        let mut aux: Vec<Vec<f32>> = vec![Vec::new(); positions];
        let mut logits: Vec<Vec<f32>> = vec![Vec::new(); positions];
        for p in 1..positions {
            let e = plen + p - 2;
            logits[p] = ext.logits[e * dv..(e + 1) * dv].to_vec();
            aux[p] = ext.aux[e * h..(e + 1) * h].to_vec();
        }
        for d in 0..dd {
            if d > 0 {
                let outs = {
                    let segs: Vec<DraftSegment<'_>> = (1..positions)
                        .map(|p| {
                            let n = plen + p;
                            DraftSegment {
                                cache: &caches[p - 1],
                                extra: chain_kv[p].iter().collect(),
                                tokens: vec![toks[n - 1 + d]],
                                hidden_in: aux[p].clone(),
                                positions: vec![(n - 2 + d) as u32],
                            }
                        })
                        .collect();
                    draft.forward(target, &segs)?
                };
                for (p, o) in (1..positions).zip(outs) {
                    logits[p] = o.logits;
                    aux[p] = o.aux;
                    chain_kv[p].extend(o.kv);
                }
            }
            for p in 1..positions {
                let want = toks[plen + p + d];
                let mut q = logits[p].clone();
                softmax_inplace(&mut q);
                let top = topk(&q, kk);
                let rank = top
                    .iter()
                    .position(|&(i, _)| draft.d2t[i] == want)
                    .unwrap_or(kk);
                ranks[p * dd + d] = rank as u8;
                for (j, &(_, pr)) in top.iter().enumerate() {
                    probs[(p * dd + d) * kk + j] = pr as f64;
                }
            }
        }
        // Position 0 repeats position 1.
        for d in 0..dd {
            ranks[d] = ranks[dd + d];
            for j in 0..kk {
                probs[d * kk + j] = probs[(dd + d) * kk + j];
            }
        }
        trace.push_sequence(*id, ranks, &probs)?;
    }
    Ok(trace)
}
