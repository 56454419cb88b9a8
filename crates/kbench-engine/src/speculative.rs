//! Sequences, plain decoding and SGLang's EAGLE-3 round, batched over many sequences, on any
//! [`SpeculativeModel`]: the CPU reference and the GPU run this one loop, so they take the same
//! decisions (draft trees, verification, commits, draft extends).
//!
//! Invariants per sequence: the target KV cache holds every committed token but the last
//! (the next round's root); draft cache entry `t` was computed from (target hidden at t,
//! token t+1), so it also holds one entry per committed token but the last.

use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use kbench_core::experiment::VerifyMethod;
use kbench_core::tree::{DraftTree, TreeBuilder, TreeShape};
use kbench_core::verify::{
    sample_from, target_distribution, verify_exact, verify_greedy, verify_target_only,
    SamplingParams, VerifyOutcome,
};

use crate::draft::target_probs as draft_target_probs;
use crate::error::{EngineError, Result};
use crate::linalg::{argmax, softmax_inplace, topk};
use crate::passes::{DraftSeg, SpeculativeModel, TargetSeg};

pub use crate::cpu::{Models, Sequence};

/// What the engine speculates with: the draft tree (SGLang's `num_steps`, `eagle_topk`,
/// `num_draft_tokens`) and how the target verifies it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SpeculativeSettings {
    pub shape: TreeShape,
    pub verify: VerifyMethod,
}

impl SpeculativeSettings {
    /// Settings whose tree can be built.
    pub fn new(
        num_steps: u32,
        eagle_topk: u32,
        num_draft_tokens: u32,
        verify: VerifyMethod,
    ) -> Result<SpeculativeSettings> {
        Ok(SpeculativeSettings {
            shape: TreeShape::new(num_steps, eagle_topk, num_draft_tokens)?,
            verify,
        })
    }
}

/// One request being served; `caches` are its KV caches on the device that serves it.
#[derive(Debug, Clone)]
pub struct Seq<C> {
    pub id: u64,
    pub prompt_len: usize,
    /// Prompt then output tokens.
    pub tokens: Vec<u32>,
    pub max_new: usize,
    pub temperature: f32,
    /// Target sampling cuts (0 = no top-k cut, 1.0 = no top-p cut), applied with the
    /// temperature wherever the target's distribution is sampled.
    pub top_k: u32,
    pub top_p: f32,
    pub caches: C,
    /// Draft logits (draft vocab) and pre-norm hidden at the last draft-extend entry: they
    /// seed the next round's step 0.
    root_logits: Vec<f32>,
    root_aux: Vec<f32>,
    rng: ChaCha8Rng,
    /// Tokens committed by each verify round (bonus included).
    pub round_commits: Vec<u32>,
    /// Tree sizes and accepted depths of each round (for trace-replay comparisons).
    pub trees: Vec<DraftTree>,
    pub keep_trees: bool,
}

impl<C> Seq<C> {
    pub fn with_caches(
        id: u64,
        prompt: Vec<u32>,
        max_new: usize,
        temperature: f32,
        rng: ChaCha8Rng,
        caches: C,
    ) -> Seq<C> {
        Seq {
            id,
            prompt_len: prompt.len(),
            tokens: prompt,
            max_new,
            temperature,
            top_k: 0,
            top_p: 1.0,
            caches,
            root_logits: Vec::new(),
            root_aux: Vec::new(),
            rng,
            round_commits: Vec::new(),
            trees: Vec::new(),
            keep_trees: false,
        }
    }

    /// Replaces the sampling stream (tests draw many rounds from one state).
    pub fn reseed(&mut self, rng: ChaCha8Rng) {
        self.rng = rng;
    }

    pub fn output(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    pub fn output_len(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    pub fn prefilled(&self) -> bool {
        self.output_len() > 0
    }

    pub fn finished(&self) -> bool {
        self.output_len() >= self.max_new
    }

    fn choose(&mut self, logits: &[f32]) -> Result<u32> {
        if self.temperature <= 0.0 {
            return Ok(argmax(logits) as u32);
        }
        let p = target_distribution(logits, &self.sampling())?;
        sample_from(&p, &mut self.rng)
            .map(|i| i as u32)
            .ok_or_else(|| EngineError::Invalid("empty target distribution".into()))
    }

    pub fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
        }
    }

    /// Seeds the next round from the last of the `n` rows of a draft extend.
    fn set_root(&mut self, logits: &[f32], aux: &[f32], n: usize) {
        let (dv, h) = (logits.len() / n, aux.len() / n);
        self.root_logits = logits[(n - 1) * dv..n * dv].to_vec();
        self.root_aux = aux[(n - 1) * h..n * h].to_vec();
    }
}

fn caches_of<'a, C>(seqs: &'a [&mut Seq<C>]) -> Vec<&'a C> {
    seqs.iter().map(|s| &s.caches).collect()
}

/// Prefill: a target pass over every prompt, the first output token, then (with a draft)
/// one draft extend over the prompt.
pub fn prefill<M: SpeculativeModel>(m: &mut M, seqs: &mut [&mut Seq<M::Caches>]) -> Result<()> {
    for s in seqs.iter() {
        has_prompt(s)?;
    }
    // A bounded pass buffer takes one prompt at a time, in chunks (prompts are long).
    let outs = match m.pass_limit() {
        None => prefill_batched(m, seqs)?,
        Some(limit) => seqs
            .iter_mut()
            .map(|s| prefill_chunked(m, s, limit))
            .collect::<Result<Vec<_>>>()?,
    };
    let mut captured = Vec::with_capacity(seqs.len());
    for (s, (logits, cap)) in seqs.iter_mut().zip(outs) {
        let t = s.choose(&logits)?;
        s.tokens.push(t);
        captured.push(cap);
    }
    if m.d2t().is_some() {
        let entries: Vec<(usize, DraftSeg)> = seqs
            .iter()
            .zip(captured)
            .enumerate()
            .map(|(si, (s, cap))| (si, prompt_draft_seg(s, cap)))
            .collect();
        match m.pass_limit() {
            None => draft_extend(m, seqs, entries)?,
            Some(limit) => {
                for (si, seg) in entries {
                    draft_extend_chunked(m, seqs[si], seg, limit)?;
                }
            }
        }
    }
    Ok(())
}

/// One target pass over every prompt, committed. Returns each prompt's last logits and
/// captured hidden states.
fn prefill_batched<M: SpeculativeModel>(
    m: &mut M,
    seqs: &mut [&mut Seq<M::Caches>],
) -> Result<Vec<(Vec<f32>, Vec<f32>)>> {
    let segs = seqs
        .iter()
        .map(|s| TargetSeg {
            tokens: s.tokens.clone(),
            positions: (0..s.tokens.len() as u32).collect(),
            tree: None,
            all_logits: false,
        })
        .collect();
    let outs = m.target_pass(&caches_of(seqs), segs)?;
    let mut res = Vec::with_capacity(outs.len());
    for (s, out) in seqs.iter_mut().zip(outs) {
        let n = s.tokens.len();
        m.target_commit(&mut s.caches, &out.kv, &(0..n).collect::<Vec<_>>())?;
        res.push((out.logits, out.captured));
    }
    Ok(res)
}

/// Target passes over one prompt in chunks of at most `limit` tokens, each committed before
/// the next. Returns the last token's logits and every token's captured hidden states.
fn prefill_chunked<M: SpeculativeModel>(
    m: &mut M,
    s: &mut Seq<M::Caches>,
    limit: usize,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let mut captured = Vec::new();
    let mut logits = Vec::new();
    let mut done = 0;
    while done < s.tokens.len() {
        logits = target_chunk(m, s, &mut done, limit, &mut captured)?;
    }
    Ok((logits, captured))
}

/// One committed target pass over the next at most `limit` prompt tokens past `done`;
/// appends their captured hidden states and returns the last one's logits.
fn target_chunk<M: SpeculativeModel>(
    m: &mut M,
    s: &mut Seq<M::Caches>,
    done: &mut usize,
    limit: usize,
    captured: &mut Vec<f32>,
) -> Result<Vec<f32>> {
    let at = *done;
    let n = limit.max(1).min(s.tokens.len() - at);
    let seg = TargetSeg {
        tokens: s.tokens[at..at + n].to_vec(),
        positions: (at..at + n).map(|p| p as u32).collect(),
        tree: None,
        all_logits: false,
    };
    let out = m.target_pass(&[&s.caches], vec![seg])?.remove(0);
    m.target_commit(&mut s.caches, &out.kv, &(0..n).collect::<Vec<_>>())?;
    captured.extend(out.captured);
    *done = at + n;
    Ok(out.logits)
}

/// Where a prompt prefilled over several forwards stands: prompt tokens already in the
/// target cache, and their captured hidden states (the draft extend needs all of them).
#[derive(Debug, Clone, Default)]
pub struct PrefillProgress {
    pub done: usize,
    captured: Vec<f32>,
}

/// Prefills the next at most `chunk` prompt tokens of `s`, so that a long prompt takes
/// several forwards and a server can run the other requests' rounds between them (SGLang's
/// chunked prefill). Once the whole prompt is in the cache it does what [`prefill`] does
/// last: the first output token, then the draft extend. Returns whether the prefill is
/// complete. The tokens are those of a one-pass prefill: each chunk attends to the cached
/// prompt before it and causally within itself.
pub fn prefill_step<M: SpeculativeModel>(
    m: &mut M,
    s: &mut Seq<M::Caches>,
    progress: &mut PrefillProgress,
    chunk: usize,
) -> Result<bool> {
    has_prompt(s)?;
    let limit = match m.pass_limit() {
        Some(l) => chunk.min(l),
        None => chunk,
    }
    .max(1);
    let logits = target_chunk(m, s, &mut progress.done, limit, &mut progress.captured)?;
    if progress.done < s.prompt_len {
        return Ok(false);
    }
    let t = s.choose(&logits)?;
    s.tokens.push(t);
    if m.d2t().is_some() {
        let seg = prompt_draft_seg(s, std::mem::take(&mut progress.captured));
        draft_extend_chunked(m, s, seg, limit)?;
    }
    Ok(true)
}

fn has_prompt<C>(s: &Seq<C>) -> Result<()> {
    if s.tokens.is_empty() {
        return Err(EngineError::Invalid(format!(
            "request {}: empty prompt",
            s.id
        )));
    }
    Ok(())
}

/// The draft extend after a prefill: the prompt's captured hidden states, each with the
/// token after it (the prompt's tokens from the second on, then the first output token).
fn prompt_draft_seg<C>(s: &Seq<C>, captured: Vec<f32>) -> DraftSeg {
    let n = s.tokens.len() - 1;
    DraftSeg {
        extra: Vec::new(),
        tokens: s.tokens[1..].to_vec(),
        hidden_in: captured,
        positions: (0..n as u32).collect(),
    }
}

/// Draft extend in one pass: per sequence `seqs[i]`, entries (captured hidden, next token,
/// position) appended to the draft cache; the last entry seeds the next round.
fn draft_extend<M: SpeculativeModel>(
    m: &mut M,
    seqs: &mut [&mut Seq<M::Caches>],
    entries: Vec<(usize, DraftSeg)>,
) -> Result<()> {
    let (idx, segs): (Vec<usize>, Vec<DraftSeg>) = entries.into_iter().unzip();
    let ns: Vec<usize> = segs.iter().map(|s| s.tokens.len()).collect();
    let outs = {
        let caches: Vec<&M::Caches> = idx.iter().map(|&si| &seqs[si].caches).collect();
        m.draft_pass(&caches, segs)?
    };
    for ((si, n), o) in idx.into_iter().zip(ns).zip(outs) {
        let s = &mut *seqs[si];
        m.draft_commit(&mut s.caches, o.kv, n)?;
        s.set_root(&o.logits, &o.aux, n);
    }
    Ok(())
}

/// Draft extend of one sequence in passes of at most `limit` entries.
fn draft_extend_chunked<M: SpeculativeModel>(
    m: &mut M,
    s: &mut Seq<M::Caches>,
    seg: DraftSeg,
    limit: usize,
) -> Result<()> {
    let n = seg.tokens.len();
    let w = seg.hidden_in.len() / n.max(1);
    let mut done = 0;
    while done < n {
        let c = limit.min(n - done);
        let part = DraftSeg {
            extra: Vec::new(),
            tokens: seg.tokens[done..done + c].to_vec(),
            hidden_in: seg.hidden_in[done * w..(done + c) * w].to_vec(),
            positions: seg.positions[done..done + c].to_vec(),
        };
        let o = m.draft_pass(&[&s.caches], vec![part])?.remove(0);
        m.draft_commit(&mut s.caches, o.kv, c)?;
        s.set_root(&o.logits, &o.aux, c);
        done += c;
    }
    Ok(())
}

/// One plain decode step for every sequence (baseline without speculation).
pub fn decode_step<M: SpeculativeModel>(m: &mut M, seqs: &mut [&mut Seq<M::Caches>]) -> Result<()> {
    let segs = seqs
        .iter()
        .map(|s| TargetSeg {
            tokens: vec![*s.tokens.last().expect("prefilled")],
            positions: vec![s.tokens.len() as u32 - 1],
            tree: None,
            all_logits: true,
        })
        .collect();
    let outs = m.target_pass(&caches_of(seqs), segs)?;
    for (s, out) in seqs.iter_mut().zip(outs) {
        m.target_commit(&mut s.caches, &out.kv, &[0])?;
        let t = s.choose(&out.logits)?;
        s.tokens.push(t);
        s.round_commits.push(1);
    }
    Ok(())
}

/// Draft distribution (target vocab) and the step's (token, prob) list for one node.
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
        // Sampled drafting: k tokens drawn independently from q (SpecInfer's assumption).
        let q = draft_target_probs(d2t, logits, temperature, target_vocab);
        let picks = (0..k)
            .map(|_| {
                let t = sample_from(&q, rng).unwrap_or(0);
                (t as u32, q[t])
            })
            .collect();
        (Some(q), picks)
    } else {
        // SGLang: softmax of the draft logits (no temperature), top-k.
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

/// Draft-step passes of at most `limit` one-token segments; each segment's entry is kept on
/// the round's draft path before the next pass. Returns each segment's (logits, aux).
fn draft_steps<M: SpeculativeModel>(
    m: &mut M,
    seqs: &mut [&mut Seq<M::Caches>],
    work: &[(usize, usize)],
    segs: Vec<DraftSeg>,
    limit: usize,
) -> Result<Vec<(Vec<f32>, Vec<f32>)>> {
    let mut res = Vec::with_capacity(work.len());
    let mut segs = segs.into_iter();
    for chunk in work.chunks(limit) {
        let part: Vec<DraftSeg> = segs.by_ref().take(chunk.len()).collect();
        let outs = {
            let caches: Vec<&M::Caches> = chunk.iter().map(|&(si, _)| &seqs[si].caches).collect();
            m.draft_pass(&caches, part)?
        };
        for (&(si, c), o) in chunk.iter().zip(outs) {
            // this beam's K/V becomes an "extra" entry of its descendants
            m.store_path(&mut seqs[si].caches, c, o.kv)?;
            res.push((o.logits, o.aux));
        }
    }
    Ok(res)
}

/// Consecutive groups of segments whose tokens fit one pass of `limit` (a segment larger than
/// `limit` gets a group of its own).
fn pass_groups(segs: &[TargetSeg], limit: usize) -> Vec<(usize, usize)> {
    let mut groups = Vec::new();
    let mut start = 0;
    let mut tokens = 0;
    for (i, sg) in segs.iter().enumerate() {
        if i > start && tokens + sg.tokens.len() > limit {
            groups.push((start, i));
            start = i;
            tokens = 0;
        }
        tokens += sg.tokens.len();
    }
    groups.push((start, segs.len()));
    groups
}

/// One EAGLE-3 round for every sequence: `num_steps - 1` batched draft passes, tree
/// selection, a tree-masked target verify pass, verification, KV commit of the accepted
/// path, and a draft extend over the committed tokens. Returns each sequence's outcome.
pub fn spec_round<M: SpeculativeModel>(
    m: &mut M,
    seqs: &mut [&mut Seq<M::Caches>],
    cfg: &SpeculativeSettings,
) -> Result<Vec<VerifyOutcome>> {
    if m.d2t().is_none() {
        return Err(EngineError::Invalid(
            "speculative decoding needs a draft model".into(),
        ));
    }
    let shape = cfg.shape;
    m.check_shape(&shape)?;
    let k = shape.topk as usize;
    let vocab = m.vocab();
    let limit = m.pass_limit().unwrap_or(usize::MAX);
    let nseq = seqs.len();
    // --- drafting ---
    let mut builders = Vec::with_capacity(nseq);
    // Per sequence, per candidate: aux hidden, draft distribution.
    let mut cand_aux: Vec<Vec<Option<Vec<f32>>>> = vec![Vec::new(); nseq];
    let mut cand_q: Vec<Vec<Option<Vec<f32>>>> = vec![Vec::new(); nseq];
    let mut root_q: Vec<Option<Vec<f32>>> = Vec::with_capacity(nseq);
    {
        let d2t = m.d2t().expect("checked above");
        for s in seqs.iter_mut() {
            let s: &mut Seq<M::Caches> = s;
            if s.root_logits.is_empty() {
                return Err(EngineError::Invalid(format!(
                    "request {}: round before prefill",
                    s.id
                )));
            }
            let root = *s.tokens.last().expect("prefilled");
            let mut b = TreeBuilder::new(shape, root)?;
            let (q, list) = draft_choices(
                d2t,
                &s.root_logits,
                k,
                cfg.verify,
                s.temperature,
                vocab,
                &mut s.rng,
            );
            b.first_step(&list)?;
            root_q.push(q);
            builders.push(b);
        }
    }
    for _step in 1..shape.num_steps {
        // (sequence, candidate) of every live beam.
        let mut work: Vec<(usize, usize)> = Vec::new();
        for (si, b) in builders.iter().enumerate() {
            let nc = b.candidates().len();
            cand_aux[si].resize(nc, None);
            cand_q[si].resize(nc, None);
            for beam in b.beams() {
                work.push((si, beam.candidate));
            }
        }
        let segs: Vec<DraftSeg> = work
            .iter()
            .map(|&(si, c)| {
                let b = &builders[si];
                let path = b.path_candidates(c);
                let hidden_in = if path.len() == 1 {
                    seqs[si].root_aux.clone()
                } else {
                    cand_aux[si][path[path.len() - 2]]
                        .clone()
                        .expect("parent was fed")
                };
                let cand = &b.candidates()[c];
                DraftSeg {
                    extra: path[..path.len() - 1].to_vec(),
                    tokens: vec![cand.token],
                    hidden_in,
                    positions: vec![(seqs[si].tokens.len() - 1) as u32 + cand.depth - 1],
                }
            })
            .collect();
        let outs = draft_steps(m, seqs, &work, segs, limit)?;
        let d2t = m.d2t().expect("checked above");
        let mut lists: Vec<Vec<Vec<(u32, f32)>>> = vec![Vec::new(); nseq];
        for ((si, c), (logits, aux)) in work.into_iter().zip(outs) {
            let s = &mut *seqs[si];
            let (q, list) = draft_choices(
                d2t,
                &logits,
                k,
                cfg.verify,
                s.temperature,
                vocab,
                &mut s.rng,
            );
            cand_q[si][c] = q;
            cand_aux[si][c] = Some(aux);
            lists[si].push(list);
        }
        for (b, l) in builders.iter_mut().zip(lists) {
            b.expand(&l)?;
        }
    }
    let trees: Vec<DraftTree> = builders
        .into_iter()
        .map(|b| b.finish())
        .collect::<std::result::Result<_, _>>()?;
    // --- verify: tree-masked target passes (one unless the pass buffer is bounded) ---
    let segs: Vec<TargetSeg> = seqs
        .iter()
        .zip(&trees)
        .map(|(s, t)| TargetSeg {
            tokens: t.tokens(),
            positions: t.positions(s.tokens.len() as u32 - 1),
            tree: Some((0..t.len()).map(|i| t.path_to(i)).collect()),
            all_logits: true,
        })
        .collect();
    let groups = pass_groups(&segs, limit);
    let ncap = m.capture_width();
    let mut outcomes = Vec::with_capacity(nseq);
    let mut extend: Vec<(usize, DraftSeg)> = Vec::new();
    let mut segs = segs.into_iter();
    for (ga, gb) in groups {
        let part: Vec<TargetSeg> = segs.by_ref().take(gb - ga).collect();
        let outs = m.target_pass(&caches_of(&seqs[ga..gb]), part)?;
        // each group's accepted entries are committed before the next pass
        for (j, out) in outs.into_iter().enumerate() {
            let si = ga + j;
            let s = &mut *seqs[si];
            let tree = &trees[si];
            let outcome = verify(
                cfg.verify,
                s,
                tree,
                &out.logits,
                vocab,
                &root_q[si],
                &cand_q[si],
            )?;
            let mut nodes = vec![0];
            nodes.extend(&outcome.accepted_nodes);
            m.target_commit(&mut s.caches, &out.kv, &nodes)?;
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
                let seg = DraftSeg {
                    extra: Vec::new(),
                    tokens: outcome.tokens.clone(),
                    hidden_in: hid,
                    positions: (0..nodes.len()).map(|i| (base + i) as u32).collect(),
                };
                extend.push((si, seg));
            }
            outcomes.push(outcome);
        }
    }
    // --- draft extend over the committed tokens ---
    if !extend.is_empty() {
        let total: usize = extend.iter().map(|(_, e)| e.tokens.len()).sum();
        if total <= limit {
            draft_extend(m, seqs, extend)?;
        } else {
            for (si, seg) in extend {
                draft_extend_chunked(m, seqs[si], seg, limit)?;
            }
        }
    }
    Ok(outcomes)
}

/// Verifies one sequence's tree against the target's logits at its nodes.
fn verify<C>(
    method: VerifyMethod,
    s: &mut Seq<C>,
    tree: &DraftTree,
    logits: &[f32],
    vocab: usize,
    root_q: &Option<Vec<f32>>,
    cand_q: &[Option<Vec<f32>>],
) -> Result<VerifyOutcome> {
    let n = tree.len();
    Ok(match method {
        _ if s.temperature <= 0.0 && method == VerifyMethod::Greedy => {
            let am: Vec<u32> = (0..n)
                .map(|i| argmax(&logits[i * vocab..(i + 1) * vocab]) as u32)
                .collect();
            verify_greedy(tree, &am)?
        }
        // Greedy tree walk on sampled target tokens is not lossless; treat a temperature > 0
        // with greedy verification as target-only sampling.
        VerifyMethod::Greedy | VerifyMethod::TargetOnly => {
            let p = target_probs(logits, n, vocab, &s.sampling())?;
            verify_target_only(tree, &p, &mut s.rng)?
        }
        VerifyMethod::Exact => {
            let p = target_probs(logits, n, vocab, &s.sampling())?;
            let uniform = vec![1.0 / vocab as f32; vocab];
            let q: Vec<Vec<f32>> = tree
                .nodes
                .iter()
                .map(|node| match node.candidate {
                    None => root_q.clone().unwrap_or_else(|| uniform.clone()),
                    Some(c) => cand_q
                        .get(c)
                        .cloned()
                        .flatten()
                        .unwrap_or_else(|| uniform.clone()),
                })
                .collect();
            verify_exact(tree, &p, &q, &mut s.rng)?
        }
    })
}

fn target_probs(
    logits: &[f32],
    n: usize,
    vocab: usize,
    sampling: &SamplingParams,
) -> Result<Vec<Vec<f32>>> {
    (0..n)
        .map(|i| {
            Ok(target_distribution(
                &logits[i * vocab..(i + 1) * vocab],
                sampling,
            )?)
        })
        .collect()
}

/// Runs a fixed batch of prompts to completion (all prefilled together, then rounds over
/// the unfinished ones). Sequence i holds KV slot i where the device has slots. Returns the
/// finished sequences in input order.
pub fn run_batch<M: SpeculativeModel>(
    m: &mut M,
    prompts: Vec<(u64, Vec<u32>)>,
    max_new: usize,
    temperature: f32,
    seed: u64,
    spec: Option<&SpeculativeSettings>,
) -> Result<Vec<Seq<M::Caches>>> {
    if max_new == 0 {
        return Err(EngineError::Invalid("max_tokens must be at least 1".into()));
    }
    if let Some(slots) = m.kv_slots() {
        if prompts.len() > slots {
            return Err(EngineError::Invalid(format!(
                "{} prompts > max_batch {slots}",
                prompts.len()
            )));
        }
    }
    let mut seqs: Vec<Seq<M::Caches>> = prompts
        .into_iter()
        .enumerate()
        .map(|(slot, (id, p))| {
            let caches = m.new_caches(slot);
            Seq::with_caches(id, p, max_new, temperature, seq_rng(seed, id), caches)
        })
        .collect();
    {
        let mut refs: Vec<&mut Seq<M::Caches>> = seqs.iter_mut().collect();
        prefill(m, &mut refs)?;
    }
    loop {
        let mut live: Vec<&mut Seq<M::Caches>> =
            seqs.iter_mut().filter(|s| !s.finished()).collect();
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

/// Uniform helper so callers need not depend on rand's traits.
pub fn seq_rng(seed: u64, id: u64) -> ChaCha8Rng {
    kbench_core::seed::rng_for(seed, "engine-sampling", id)
}
