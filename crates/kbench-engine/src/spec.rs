//! Sequences, plain decoding and SGLang's EAGLE-3 round, batched over many sequences.
//!
//! Invariants per sequence: the target KV cache holds every committed token but the last
//! (the next round's root); draft cache entry `t` was computed from (target hidden at t,
//! token t+1), so it also holds one entry per committed token but the last.

use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use kbench_core::spec::VerifyMethod;
use kbench_core::tree::{DraftTree, TreeBuilder, TreeShape};
use kbench_core::verify::{
    sample_from, target_distribution, verify_exact, verify_greedy, verify_target_only,
    SamplingParams, VerifyOutcome,
};

use crate::draft::{Draft, DraftCache, DraftKv, DraftSegment};
use crate::error::{EngineError, Result};
use crate::linalg::{argmax, softmax_inplace, topk};
use crate::target::{Attend, KvCache, Segment, Target};

/// Speculative settings with SGLang's names.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SpecSettings {
    pub num_steps: u32,
    pub eagle_topk: u32,
    pub num_draft_tokens: u32,
    pub verify: VerifyMethod,
}

impl SpecSettings {
    pub fn shape(&self) -> Result<TreeShape> {
        Ok(TreeShape::new(
            self.num_steps,
            self.eagle_topk,
            self.num_draft_tokens,
        )?)
    }
}

/// One request being served.
#[derive(Debug, Clone)]
pub struct Sequence {
    pub id: u64,
    pub prompt_len: usize,
    /// Prompt then output tokens.
    pub tokens: Vec<u32>,
    pub max_new: usize,
    pub temperature: f32,
    pub tcache: KvCache,
    pub dcache: DraftCache,
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

impl Sequence {
    pub fn new(
        id: u64,
        prompt: Vec<u32>,
        max_new: usize,
        temperature: f32,
        rng: ChaCha8Rng,
        target: &Target,
    ) -> Sequence {
        Sequence {
            id,
            prompt_len: prompt.len(),
            tokens: prompt,
            max_new,
            temperature,
            tcache: target.new_cache(),
            dcache: DraftCache::default(),
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
        let p = target_distribution(logits, &SamplingParams::temperature(self.temperature))?;
        sample_from(&p, &mut self.rng)
            .map(|i| i as u32)
            .ok_or_else(|| EngineError::Invalid("empty target distribution".into()))
    }
}

/// Target and (optional) draft.
pub struct Models<'a> {
    pub target: &'a Target,
    pub draft: Option<&'a Draft>,
}

/// Prefill: one target pass over every prompt, the first output token, then (with a draft)
/// one draft extend over the prompt.
pub fn prefill(m: &Models<'_>, seqs: &mut [&mut Sequence]) -> Result<()> {
    for s in seqs.iter() {
        if s.tokens.is_empty() {
            return Err(EngineError::Invalid(format!(
                "request {}: empty prompt",
                s.id
            )));
        }
    }
    let outs = {
        let segs: Vec<Segment<'_>> = seqs
            .iter()
            .map(|s| Segment {
                cache: &s.tcache,
                tokens: s.tokens.clone(),
                positions: (0..s.tokens.len() as u32).collect(),
                attend: Attend::Causal,
                all_logits: false,
            })
            .collect();
        m.target.forward(&segs)?
    };
    let width = m.target.kv_width();
    let mut captured = Vec::with_capacity(seqs.len());
    for (s, out) in seqs.iter_mut().zip(outs) {
        let n = s.tokens.len();
        out.commit(&mut s.tcache, &(0..n).collect::<Vec<_>>(), width);
        let t = s.choose(&out.logits)?;
        s.tokens.push(t);
        captured.push(out.captured);
    }
    if let Some(d) = m.draft {
        let entries: Vec<(Vec<u32>, Vec<f32>, Vec<u32>)> = seqs
            .iter()
            .zip(captured)
            .map(|(s, cap)| {
                let n = s.tokens.len() - 1;
                (s.tokens[1..].to_vec(), cap, (0..n as u32).collect())
            })
            .collect();
        draft_extend(m.target, d, seqs, entries)?;
    }
    Ok(())
}

/// Draft extend: per sequence, entries (captured hidden, next token, position) appended to
/// the draft cache; the last entry seeds the next round.
fn draft_extend(
    target: &Target,
    d: &Draft,
    seqs: &mut [&mut Sequence],
    entries: Vec<(Vec<u32>, Vec<f32>, Vec<u32>)>,
) -> Result<()> {
    let outs = {
        let segs: Vec<DraftSegment<'_>> = seqs
            .iter()
            .zip(entries)
            .map(|(s, (tokens, hidden_in, positions))| DraftSegment {
                cache: &s.dcache,
                extra: Vec::new(),
                tokens,
                hidden_in,
                positions,
            })
            .collect();
        d.forward(target, &segs)?
    };
    let (h, dv) = (d.hidden, d.draft_vocab());
    for (s, o) in seqs.iter_mut().zip(outs) {
        for kv in &o.kv {
            s.dcache.push(kv);
        }
        let n = o.kv.len();
        s.root_logits = o.logits[(n - 1) * dv..n * dv].to_vec();
        s.root_aux = o.aux[(n - 1) * h..n * h].to_vec();
    }
    Ok(())
}

/// One plain decode step for every sequence (baseline without speculation).
pub fn decode_step(m: &Models<'_>, seqs: &mut [&mut Sequence]) -> Result<()> {
    let outs = {
        let segs: Vec<Segment<'_>> = seqs
            .iter()
            .map(|s| Segment {
                cache: &s.tcache,
                tokens: vec![*s.tokens.last().expect("prefilled")],
                positions: vec![s.tokens.len() as u32 - 1],
                attend: Attend::Causal,
                all_logits: true,
            })
            .collect();
        m.target.forward(&segs)?
    };
    let width = m.target.kv_width();
    for (s, out) in seqs.iter_mut().zip(outs) {
        out.commit(&mut s.tcache, &[0], width);
        let t = s.choose(&out.logits)?;
        s.tokens.push(t);
        s.round_commits.push(1);
    }
    Ok(())
}

/// Draft distribution (target vocab) and the step's (token, prob) list for one node.
fn draft_choices(
    d: &Draft,
    logits: &[f32],
    k: usize,
    method: VerifyMethod,
    temperature: f32,
    target_vocab: usize,
    rng: &mut ChaCha8Rng,
) -> (Option<Vec<f32>>, Vec<(u32, f32)>) {
    if method == VerifyMethod::Exact && temperature > 0.0 {
        // Sampled drafting: k tokens drawn independently from q (SpecInfer's assumption).
        let q = d.target_probs(logits, temperature, target_vocab);
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
            .map(|(i, pr)| (d.d2t[i], pr.clamp(0.0, 1.0)))
            .collect();
        let q = (method == VerifyMethod::Exact)
            .then(|| d.target_probs(logits, temperature, target_vocab));
        (q, list)
    }
}

/// One EAGLE-3 round for every sequence: `num_steps - 1` batched draft passes, tree
/// selection, one tree-masked target verify pass, verification, KV commit of the accepted
/// path, and one draft extend over the committed tokens. Returns each sequence's outcome.
pub fn spec_round(
    m: &Models<'_>,
    seqs: &mut [&mut Sequence],
    cfg: &SpecSettings,
) -> Result<Vec<VerifyOutcome>> {
    let d = m
        .draft
        .ok_or_else(|| EngineError::Invalid("speculative decoding needs a draft model".into()))?;
    let shape = cfg.shape()?;
    let k = cfg.eagle_topk as usize;
    let vocab = m.target.vocab;
    let nseq = seqs.len();
    // --- drafting ---
    let mut builders = Vec::with_capacity(nseq);
    // Per sequence, per candidate: draft KV entry, aux hidden, draft distribution.
    let mut cand_kv: Vec<Vec<Option<DraftKv>>> = vec![Vec::new(); nseq];
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
        let (q, list) = draft_choices(d, &logits, k, cfg.verify, temp, vocab, &mut s.rng);
        b.first_step(&list)?;
        root_q.push(q);
        builders.push(b);
    }
    for _step in 1..cfg.num_steps {
        // (sequence, candidate) of every live beam.
        let mut work: Vec<(usize, usize)> = Vec::new();
        for (si, b) in builders.iter().enumerate() {
            let nc = b.candidates().len();
            cand_kv[si].resize(nc, None);
            cand_aux[si].resize(nc, None);
            cand_q[si].resize(nc, None);
            for beam in b.beams() {
                work.push((si, beam.candidate));
            }
        }
        let outs = {
            let mut segs = Vec::with_capacity(work.len());
            for &(si, c) in &work {
                let b = &builders[si];
                let path = b.path_candidates(c);
                let extra: Vec<&DraftKv> = path[..path.len() - 1]
                    .iter()
                    .map(|&a| cand_kv[si][a].as_ref().expect("ancestor beam was fed"))
                    .collect();
                let hidden_in = if path.len() == 1 {
                    seqs[si].root_aux.clone()
                } else {
                    cand_aux[si][path[path.len() - 2]]
                        .clone()
                        .expect("parent was fed")
                };
                let cand = &b.candidates()[c];
                segs.push(DraftSegment {
                    cache: &seqs[si].dcache,
                    extra,
                    tokens: vec![cand.token],
                    hidden_in,
                    positions: vec![(seqs[si].tokens.len() - 1) as u32 + cand.depth - 1],
                });
            }
            d.forward(m.target, &segs)?
        };
        let mut lists: Vec<Vec<Vec<(u32, f32)>>> = vec![Vec::new(); nseq];
        for ((si, c), o) in work.into_iter().zip(outs) {
            let temp = seqs[si].temperature;
            let (q, list) =
                draft_choices(d, &o.logits, k, cfg.verify, temp, vocab, &mut seqs[si].rng);
            cand_q[si][c] = q;
            cand_aux[si][c] = Some(o.aux);
            cand_kv[si][c] = o.kv.into_iter().next();
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
    // --- verify ---
    let outs = {
        let segs: Vec<Segment<'_>> = seqs
            .iter()
            .zip(&trees)
            .map(|(s, t)| Segment {
                cache: &s.tcache,
                tokens: t.tokens(),
                positions: t.positions(s.tokens.len() as u32 - 1),
                attend: Attend::Tree((0..t.len()).map(|i| t.path_to(i)).collect()),
                all_logits: true,
            })
            .collect();
        m.target.forward(&segs)?
    };
    let width = m.target.kv_width();
    let mut outcomes = Vec::with_capacity(nseq);
    let mut extend_entries = Vec::with_capacity(nseq);
    let mut extend_idx = Vec::new();
    let ncap = m.target.capture_layers.len() * m.target.hidden;
    for (si, ((s, tree), out)) in seqs.iter_mut().zip(&trees).zip(outs).enumerate() {
        let n = tree.len();
        let node_logits = |i: usize| &out.logits[i * vocab..(i + 1) * vocab];
        let outcome = match cfg.verify {
            _ if s.temperature <= 0.0 && cfg.verify == VerifyMethod::Greedy => {
                let am: Vec<u32> = (0..n).map(|i| argmax(node_logits(i)) as u32).collect();
                verify_greedy(tree, &am)?
            }
            VerifyMethod::Greedy => {
                // Greedy tree walk on sampled target tokens is not lossless; treat a
                // temperature > 0 with greedy verification as target-only sampling.
                let p = target_probs(&out.logits, n, vocab, s.temperature)?;
                verify_target_only(tree, &p, &mut s.rng)?
            }
            VerifyMethod::TargetOnly => {
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
        out.commit(&mut s.tcache, &nodes, width);
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
            extend_entries.push((
                outcome.tokens.clone(),
                hid,
                (0..nodes.len()).map(|i| (base + i) as u32).collect(),
            ));
            extend_idx.push(si);
        }
        outcomes.push(outcome);
    }
    if !extend_idx.is_empty() {
        let mut sub: Vec<&mut Sequence> = Vec::with_capacity(extend_idx.len());
        for (si, s) in seqs.iter_mut().enumerate() {
            if extend_idx.contains(&si) {
                sub.push(&mut **s);
            }
        }
        draft_extend(m.target, d, &mut sub, extend_entries)?;
    }
    Ok(outcomes)
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

/// Uniform helper so callers need not depend on rand's traits.
pub fn seq_rng(seed: u64, id: u64) -> ChaCha8Rng {
    kbench_core::seed::rng_for(seed, "engine-sampling", id)
}
