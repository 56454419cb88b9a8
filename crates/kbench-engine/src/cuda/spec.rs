//! SGLang's EAGLE-3 round on the GPU: the CPU loop of `crate::spec` step for step (same tree
//! builder, draft choices, verification, commits, draft extend), over [`CudaModel`] passes.
//!
//! Invariants per sequence (as on the CPU): the target KV cache holds every committed token
//! but the last (the next round's root); draft cache entry `t` was computed from (target hidden
//! at t, token t+1).

use rand_chacha::ChaCha8Rng;

use kbench_core::spec::VerifyMethod;
use kbench_core::tree::{DraftTree, TreeBuilder};
use kbench_core::verify::{
    sample_from, target_distribution, verify_exact, verify_greedy, verify_target_only,
    SamplingParams, VerifyOutcome,
};

use super::model::{CudaModel, GpuDraftSegment, GpuSegment};
use crate::error::{EngineError, Result};
use crate::linalg::{argmax, softmax_inplace, topk};
use crate::spec::{seq_rng, SpecSettings};

/// One request on the GPU (the twin of `spec::Sequence`; caches live in slot `slot`).
#[derive(Debug, Clone)]
pub struct GpuSequence {
    pub id: u64,
    pub slot: usize,
    pub prompt_len: usize,
    pub tokens: Vec<u32>,
    pub max_new: usize,
    pub temperature: f32,
    /// Entries in the target / draft caches.
    pub tlen: usize,
    pub dlen: usize,
    root_logits: Vec<f32>,
    root_aux: Vec<f32>,
    rng: ChaCha8Rng,
    pub round_commits: Vec<u32>,
    pub trees: Vec<DraftTree>,
    pub keep_trees: bool,
}

impl GpuSequence {
    pub fn new(
        id: u64,
        slot: usize,
        prompt: Vec<u32>,
        max_new: usize,
        temperature: f32,
        rng: ChaCha8Rng,
    ) -> GpuSequence {
        GpuSequence {
            id,
            slot,
            prompt_len: prompt.len(),
            tokens: prompt,
            max_new,
            temperature,
            tlen: 0,
            dlen: 0,
            root_logits: Vec::new(),
            root_aux: Vec::new(),
            rng,
            round_commits: Vec::new(),
            trees: Vec::new(),
            keep_trees: false,
        }
    }

    pub fn output(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }
    pub fn output_len(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
    pub fn finished(&self) -> bool {
        self.output_len() >= self.max_new
    }

    fn choose(&mut self, logits: &[f32]) -> Result<u32> {
        if self.temperature <= 0.0 {
            return Ok(argmax(logits) as u32);
        }
        let p = target_distribution(logits, &SamplingParams::temperature(self.temperature))?;
        sample_from(&p, &mut self.rng)
            .map(|i| i as u32)
            .ok_or_else(|| EngineError::Invalid("empty target distribution".into()))
    }
}

/// Target pass over a whole causal run of `tokens` for one sequence, in chunks of at most
/// `max_tokens`, committing everything. Returns the last token's logits and every token's
/// captured hidden states.
fn extend_target(
    m: &mut CudaModel,
    s: &mut GpuSequence,
    tokens: &[u32],
    first_pos: usize,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let chunk = m.opts.max_tokens;
    let mut captured = Vec::new();
    let mut logits = Vec::new();
    let mut done = 0;
    while done < tokens.len() {
        let n = chunk.min(tokens.len() - done);
        let seg = GpuSegment {
            slot: s.slot,
            cache_len: s.tlen,
            tokens: tokens[done..done + n].to_vec(),
            positions: (first_pos + done..first_pos + done + n)
                .map(|p| p as u32)
                .collect(),
            tree: None,
            all_logits: false,
        };
        let out = m
            .forward_target(std::slice::from_ref(&seg), false)?
            .remove(0);
        m.commit_target(s.slot, s.tlen, out.row0, &(0..n).collect::<Vec<_>>())?;
        s.tlen += n;
        captured.extend(out.captured);
        logits = out.logits;
        done += n;
    }
    Ok((logits, captured))
}

/// Prefill: one target pass over every prompt (chunked), the first output token, then (with a
/// draft) one draft extend over the prompt.
pub fn prefill(m: &mut CudaModel, seqs: &mut [&mut GpuSequence]) -> Result<()> {
    for s in seqs.iter() {
        if s.tokens.is_empty() {
            return Err(EngineError::Invalid(format!(
                "request {}: empty prompt",
                s.id
            )));
        }
    }
    let mut caps = Vec::with_capacity(seqs.len());
    for s in seqs.iter_mut() {
        let toks = s.tokens.clone();
        let (logits, cap) = extend_target(m, s, &toks, 0)?;
        let t = s.choose(&logits)?;
        s.tokens.push(t);
        caps.push(cap);
    }
    if m.has_draft() {
        for (s, cap) in seqs.iter_mut().zip(caps) {
            let n = s.tokens.len() - 1;
            let toks = s.tokens[1..].to_vec();
            draft_extend(m, s, &toks, &cap, 0, n)?;
        }
    }
    Ok(())
}

/// Draft extend of one sequence: entries (captured hidden, next token, position) appended to
/// the draft cache in chunks; the last entry seeds the next round.
fn draft_extend(
    m: &mut CudaModel,
    s: &mut GpuSequence,
    tokens: &[u32],
    hidden: &[f32],
    base: usize,
    n: usize,
) -> Result<()> {
    let w = hidden.len() / n.max(1);
    let chunk = m.opts.max_tokens;
    let mut done = 0;
    while done < n {
        let c = chunk.min(n - done);
        let seg = GpuDraftSegment {
            slot: s.slot,
            cache_len: s.dlen,
            extra: Vec::new(),
            tokens: tokens[done..done + c].to_vec(),
            hidden_in: hidden[done * w..(done + c) * w].to_vec(),
            positions: (base + done..base + done + c).map(|p| p as u32).collect(),
        };
        let o = m.forward_draft(std::slice::from_ref(&seg))?.remove(0);
        m.commit_draft(s.slot, s.dlen, o.row0, c)?;
        s.dlen += c;
        let (dv, h) = (m.draft_vocab(), m.draft_hidden());
        s.root_logits = o.logits[(c - 1) * dv..c * dv].to_vec();
        s.root_aux = o.aux[(c - 1) * h..c * h].to_vec();
        done += c;
    }
    Ok(())
}

/// One plain decode step for every sequence (one batched pass; CUDA graph when it fits).
pub fn decode_step(m: &mut CudaModel, seqs: &mut [&mut GpuSequence]) -> Result<()> {
    let segs: Vec<GpuSegment> = seqs
        .iter()
        .map(|s| GpuSegment {
            slot: s.slot,
            cache_len: s.tlen,
            tokens: vec![*s.tokens.last().expect("prefilled")],
            positions: vec![s.tokens.len() as u32 - 1],
            tree: None,
            all_logits: true,
        })
        .collect();
    let outs = m.forward_target(&segs, false)?;
    for (s, out) in seqs.iter_mut().zip(outs) {
        m.commit_target(s.slot, s.tlen, out.row0, &[0])?;
        s.tlen += 1;
        let t = s.choose(&out.logits)?;
        s.tokens.push(t);
        s.round_commits.push(1);
    }
    Ok(())
}

fn draft_target_probs(
    d2t: &[u32],
    logits: &[f32],
    temperature: f32,
    target_vocab: usize,
) -> Vec<f32> {
    let mut p: Vec<f32> = if temperature > 1e-5 {
        logits.iter().map(|x| x / temperature).collect()
    } else {
        logits.to_vec()
    };
    softmax_inplace(&mut p);
    let mut full = vec![0f32; target_vocab];
    for (i, &pi) in p.iter().enumerate() {
        full[d2t[i] as usize] += pi;
    }
    full
}

/// The CPU's `draft_choices`.
fn draft_choices(
    d2t: &[u32],
    logits: &[f32],
    k: usize,
    method: VerifyMethod,
    temperature: f32,
    target_vocab: usize,
    rng: &mut ChaCha8Rng,
) -> (Option<Vec<f32>>, Vec<(u32, f32)>) {
    if method == VerifyMethod::Exact && temperature > 0.0 {
        let q = draft_target_probs(d2t, logits, temperature, target_vocab);
        let picks = (0..k)
            .map(|_| {
                let t = sample_from(&q, rng).unwrap_or(0);
                (t as u32, q[t])
            })
            .collect();
        (Some(q), picks)
    } else {
        let mut p = logits.to_vec();
        softmax_inplace(&mut p);
        let list = topk(&p, k)
            .into_iter()
            .map(|(i, pr)| (d2t[i], pr.clamp(0.0, 1.0)))
            .collect();
        let q = (method == VerifyMethod::Exact)
            .then(|| draft_target_probs(d2t, logits, temperature, target_vocab));
        (q, list)
    }
}

fn target_probs(logits: &[f32], n: usize, vocab: usize, temperature: f32) -> Result<Vec<Vec<f32>>> {
    (0..n)
        .map(|i| {
            Ok(target_distribution(
                &logits[i * vocab..(i + 1) * vocab],
                &SamplingParams::temperature(temperature),
            )?)
        })
        .collect()
}

/// One EAGLE-3 round for every sequence: `num_steps - 1` batched draft passes, tree
/// selection, one tree-masked target verify pass, verification, KV commit of the accepted
/// path, one draft extend over the committed tokens.
pub fn spec_round(
    m: &mut CudaModel,
    seqs: &mut [&mut GpuSequence],
    cfg: &SpecSettings,
) -> Result<Vec<VerifyOutcome>> {
    if !m.has_draft() {
        return Err(EngineError::Invalid(
            "speculative decoding needs a draft model".into(),
        ));
    }
    let shape = cfg.shape()?;
    if shape.num_candidates() > m.max_draft_candidates() {
        return Err(EngineError::Invalid(format!(
            "{} draft candidates per round > the pool's {}",
            shape.num_candidates(),
            m.max_draft_candidates()
        )));
    }
    let k = cfg.eagle_topk as usize;
    let vocab = m.vocab();
    let nseq = seqs.len();
    let d2t = m.d2t.clone();
    let mut builders = Vec::with_capacity(nseq);
    let mut cand_aux: Vec<Vec<Option<Vec<f32>>>> = vec![Vec::new(); nseq];
    let mut cand_q: Vec<Vec<Option<Vec<f32>>>> = vec![Vec::new(); nseq];
    let mut root_q: Vec<Option<Vec<f32>>> = Vec::with_capacity(nseq);
    for s in seqs.iter_mut() {
        if s.root_logits.is_empty() {
            return Err(EngineError::Invalid(format!(
                "request {}: round before prefill",
                s.id
            )));
        }
        let root = *s.tokens.last().expect("prefilled");
        let mut b = TreeBuilder::new(shape, root)?;
        let logits = s.root_logits.clone();
        let temp = s.temperature;
        let (q, list) = draft_choices(&d2t, &logits, k, cfg.verify, temp, vocab, &mut s.rng);
        b.first_step(&list)?;
        root_q.push(q);
        builders.push(b);
    }
    for _step in 1..cfg.num_steps {
        let mut work: Vec<(usize, usize)> = Vec::new();
        for (si, b) in builders.iter().enumerate() {
            let nc = b.candidates().len();
            cand_aux[si].resize(nc, None);
            cand_q[si].resize(nc, None);
            for beam in b.beams() {
                work.push((si, beam.candidate));
            }
        }
        let mut segs = Vec::with_capacity(work.len());
        for &(si, c) in &work {
            let b = &builders[si];
            let path = b.path_candidates(c);
            let extra: Vec<usize> = path[..path.len() - 1].to_vec();
            let hidden_in = if path.len() == 1 {
                seqs[si].root_aux.clone()
            } else {
                cand_aux[si][path[path.len() - 2]]
                    .clone()
                    .expect("parent was fed")
            };
            let cand = &b.candidates()[c];
            segs.push(GpuDraftSegment {
                slot: seqs[si].slot,
                cache_len: seqs[si].dlen,
                extra,
                tokens: vec![cand.token],
                hidden_in,
                positions: vec![(seqs[si].tokens.len() - 1) as u32 + cand.depth - 1],
            });
        }
        let mut lists: Vec<Vec<Vec<(u32, f32)>>> = vec![Vec::new(); nseq];
        let mut idx = 0;
        for chunk in segs.chunks(m.opts.max_tokens) {
            let outs = m.forward_draft(chunk)?;
            for out in outs {
                let (si, c) = work[idx];
                idx += 1;
                // this beam's K/V becomes an "extra" entry of its descendants
                m.pool_store(seqs[si].slot, c, out.row0)?;
                let temp = seqs[si].temperature;
                let (q, list) = draft_choices(
                    &d2t,
                    &out.logits,
                    k,
                    cfg.verify,
                    temp,
                    vocab,
                    &mut seqs[si].rng,
                );
                cand_q[si][c] = q;
                cand_aux[si][c] = Some(out.aux);
                lists[si].push(list);
            }
        }
        for (b, l) in builders.iter_mut().zip(lists) {
            b.expand(&l)?;
        }
    }
    let trees: Vec<DraftTree> = builders
        .into_iter()
        .map(|b| b.finish())
        .collect::<std::result::Result<_, _>>()?;
    // --- verify: one tree-masked target pass ---
    let segs: Vec<GpuSegment> = seqs
        .iter()
        .zip(&trees)
        .map(|(s, t)| GpuSegment {
            slot: s.slot,
            cache_len: s.tlen,
            tokens: t.tokens(),
            positions: t.positions(s.tokens.len() as u32 - 1),
            tree: Some((0..t.len()).map(|i| t.path_to(i)).collect()),
            all_logits: true,
        })
        .collect();
    // consecutive groups of sequences whose trees fit one pass (usually all of them); each
    // group's accepted entries are committed before the next pass reuses the KV buffer
    let mut groups: Vec<(usize, usize)> = Vec::new();
    let mut start = 0;
    let mut tokens = 0;
    for (i, sg) in segs.iter().enumerate() {
        if i > start && tokens + sg.tokens.len() > m.opts.max_tokens {
            groups.push((start, i));
            start = i;
            tokens = 0;
        }
        tokens += sg.tokens.len();
    }
    groups.push((start, segs.len()));
    let mut outcomes = Vec::with_capacity(nseq);
    let mut extend: Vec<(usize, Vec<u32>, Vec<f32>, usize)> = Vec::new();
    let ncap = m.capture_layers().len() * m.hidden();
    for (ga, gb) in groups {
        let outs = m.forward_target(&segs[ga..gb], false)?;
        for (j, out) in outs.into_iter().enumerate() {
            let si = ga + j;
            let s: &mut GpuSequence = &mut *seqs[si];
            let tree = &trees[si];
            let n = tree.len();
            let node_logits = |i: usize| &out.logits[i * vocab..(i + 1) * vocab];
            let outcome = match cfg.verify {
                _ if s.temperature <= 0.0 && cfg.verify == VerifyMethod::Greedy => {
                    let am: Vec<u32> = (0..n).map(|i| argmax(node_logits(i)) as u32).collect();
                    verify_greedy(tree, &am)?
                }
                VerifyMethod::Greedy | VerifyMethod::TargetOnly => {
                    let p = target_probs(&out.logits, n, vocab, s.temperature)?;
                    verify_target_only(tree, &p, &mut s.rng)?
                }
                VerifyMethod::Exact => {
                    let p = target_probs(&out.logits, n, vocab, s.temperature)?;
                    let uniform = vec![1.0 / vocab as f32; vocab];
                    let q: Vec<Vec<f32>> = tree
                        .nodes
                        .iter()
                        .map(|node| match node.candidate {
                            None => root_q[si].clone().unwrap_or_else(|| uniform.clone()),
                            Some(c) => cand_q[si]
                                .get(c)
                                .cloned()
                                .flatten()
                                .unwrap_or_else(|| uniform.clone()),
                        })
                        .collect();
                    verify_exact(tree, &p, &q, &mut s.rng)?
                }
            };
            let mut nodes = vec![0];
            nodes.extend(&outcome.accepted_nodes);
            m.commit_target(s.slot, s.tlen, out.row0, &nodes)?;
            s.tlen += nodes.len();
            let room = s.max_new - s.output_len();
            let take = outcome.tokens.len().min(room);
            s.tokens.extend_from_slice(&outcome.tokens[..take]);
            s.round_commits.push(take as u32);
            if s.keep_trees {
                s.trees.push(tree.clone());
            }
            if !s.finished() {
                let mut hid = Vec::with_capacity(nodes.len() * ncap);
                for &i in &nodes {
                    hid.extend_from_slice(&out.captured[i * ncap..(i + 1) * ncap]);
                }
                let base = s.tokens.len() - 1 - outcome.tokens.len();
                extend.push((si, outcome.tokens.clone(), hid, base));
            }
            outcomes.push(outcome);
        }
    }
    // --- draft extend over the committed tokens (one batched pass) ---
    if !extend.is_empty() {
        let segs: Vec<GpuDraftSegment> = extend
            .iter()
            .map(|(si, toks, hid, base)| GpuDraftSegment {
                slot: seqs[*si].slot,
                cache_len: seqs[*si].dlen,
                extra: Vec::new(),
                tokens: toks.clone(),
                hidden_in: hid.clone(),
                positions: (0..toks.len()).map(|i| (base + i) as u32).collect(),
            })
            .collect();
        let total: usize = segs.iter().map(|s| s.tokens.len()).sum();
        if total <= m.opts.max_tokens {
            let outs = m.forward_draft(&segs)?;
            let (dv, h) = (m.draft_vocab(), m.draft_hidden());
            for ((si, toks, _, _), o) in extend.iter().zip(outs) {
                let s = &mut seqs[*si];
                let n = toks.len();
                m.commit_draft(s.slot, s.dlen, o.row0, n)?;
                s.dlen += n;
                s.root_logits = o.logits[(n - 1) * dv..n * dv].to_vec();
                s.root_aux = o.aux[(n - 1) * h..n * h].to_vec();
            }
        } else {
            for (si, toks, hid, base) in extend {
                let n = toks.len();
                draft_extend(m, &mut *seqs[si], &toks, &hid, base, n)?;
            }
        }
    }
    Ok(outcomes)
}

/// Runs a fixed batch of prompts to completion on the GPU (all prefilled, then rounds over
/// the unfinished ones), like `generate::run_batch` on the CPU. Slots are the prompt indices.
pub fn run_batch(
    m: &mut CudaModel,
    prompts: Vec<(u64, Vec<u32>)>,
    max_new: usize,
    temperature: f32,
    seed: u64,
    spec: Option<&SpecSettings>,
) -> Result<Vec<GpuSequence>> {
    if max_new == 0 {
        return Err(EngineError::Invalid("max_tokens must be at least 1".into()));
    }
    if prompts.len() > m.opts.max_batch {
        return Err(EngineError::Invalid(format!(
            "{} prompts > max_batch {}",
            prompts.len(),
            m.opts.max_batch
        )));
    }
    let mut seqs: Vec<GpuSequence> = prompts
        .into_iter()
        .enumerate()
        .map(|(slot, (id, p))| {
            GpuSequence::new(id, slot, p, max_new, temperature, seq_rng(seed, id))
        })
        .collect();
    {
        let mut refs: Vec<&mut GpuSequence> = seqs.iter_mut().collect();
        prefill(m, &mut refs)?;
    }
    loop {
        let mut live: Vec<&mut GpuSequence> = seqs.iter_mut().filter(|s| !s.finished()).collect();
        if live.is_empty() {
            break;
        }
        match spec {
            Some(cfg) => {
                spec_round(m, &mut live, cfg)?;
            }
            None => decode_step(m, &mut live)?,
        }
    }
    Ok(seqs)
}
