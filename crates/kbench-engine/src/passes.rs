//! The device passes the speculative loop (`crate::speculative`) and the backend scheduler
//! (`crate::session`) run on: [`SpeculativeModel`], implemented by the CPU reference
//! ([`crate::cpu`]) and by the CUDA path (`crate::cuda::passes`).
//!
//! The loop is written once over this trait so that the CPU and the GPU take the same
//! decisions (tree building, verification, commits, draft extends); what the trait hides is
//! where KV entries live. The CPU hands each pass references to a sequence's own caches and
//! commits entries it gets back; the GPU addresses fixed cache slots and commits rows of its
//! pass buffer, which only holds one pass, so a pass's entries must be committed before the
//! next pass runs.

use kbench_core::tree::TreeShape;

use crate::error::Result;

/// One sequence's tokens in a batched target pass.
#[derive(Debug, Clone)]
pub struct TargetSeg {
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    /// Per token, the segment tokens it attends to (its tree ancestors and itself); `None`:
    /// causal.
    pub tree: Option<Vec<Vec<usize>>>,
    /// Logits for every token (verify, decode) or only the last (prefill).
    pub all_logits: bool,
}

/// A target pass's result for one segment.
#[derive(Debug, Clone)]
pub struct TargetOut<K> {
    /// `[n or 1, vocab]`.
    pub logits: Vec<f32>,
    /// `[n, capture_width]`: the capture layers' outputs.
    pub captured: Vec<f32>,
    /// The segment's new KV entries, not yet in the sequence's cache.
    pub kv: K,
}

/// One sequence's tokens in a draft pass: they attend to the draft cache, then to the
/// entries of this round's draft path in `extra`, then causally to each other.
#[derive(Debug, Clone)]
pub struct DraftSeg {
    /// Candidates of this round whose entries were stored with [`SpeculativeModel::store_path`].
    pub extra: Vec<usize>,
    pub tokens: Vec<u32>,
    /// `[n, capture_width]` captured target states (extend) or `[n, h]` draft hidden
    /// (draft step).
    pub hidden_in: Vec<f32>,
    pub positions: Vec<u32>,
}

/// A draft pass's result for one segment.
#[derive(Debug, Clone)]
pub struct DraftOut<K> {
    /// `[n, draft_vocab]`.
    pub logits: Vec<f32>,
    /// `[n, h]`: the pre-norm hidden state fed to the next draft step.
    pub aux: Vec<f32>,
    /// The segment's new draft K/V entries, not yet in the sequence's draft cache.
    pub kv: K,
}

/// A target (and optional EAGLE-3 draft) that runs batched passes over sequences.
pub trait SpeculativeModel {
    /// A sequence's target and draft caches (or where on the device they are).
    type Caches;
    /// Where a target pass leaves a segment's new KV entries until they are committed.
    type TargetKv;
    /// Where a draft pass leaves a segment's new K/V entries.
    type DraftKv;

    fn vocab(&self) -> usize;
    /// Floats of captured hidden state per token (capture layers x hidden).
    fn capture_width(&self) -> usize;
    /// Target id of each draft id; `None` without a draft.
    fn d2t(&self) -> Option<&[u32]>;
    /// Most tokens one pass holds; `None`: no bound (every phase runs as one batched pass).
    fn pass_limit(&self) -> Option<usize>;
    /// Sequences that can hold caches at once; `None`: caches are allocated per sequence.
    fn kv_slots(&self) -> Option<usize>;
    /// Rejects round shapes the device cannot hold.
    fn check_shape(&self, shape: &TreeShape) -> Result<()>;
    /// Empty caches for a sequence in KV slot `slot` (< `kv_slots()`; ignored without slots).
    fn new_caches(&self, slot: usize) -> Self::Caches;

    /// One batched target pass; `caches[i]` is segment i's sequence.
    fn target_pass(
        &mut self,
        caches: &[&Self::Caches],
        segs: Vec<TargetSeg>,
    ) -> Result<Vec<TargetOut<Self::TargetKv>>>;
    /// Appends the entries of segment tokens `rows` (in order) to the target cache; must run
    /// before the next target pass.
    fn target_commit(
        &mut self,
        caches: &mut Self::Caches,
        kv: &Self::TargetKv,
        rows: &[usize],
    ) -> Result<()>;
    /// One batched draft pass; `caches[i]` is segment i's sequence.
    fn draft_pass(
        &mut self,
        caches: &[&Self::Caches],
        segs: Vec<DraftSeg>,
    ) -> Result<Vec<DraftOut<Self::DraftKv>>>;
    /// Appends a segment's `n` entries to the draft cache; must run before the next draft
    /// pass.
    fn draft_commit(
        &mut self,
        caches: &mut Self::Caches,
        kv: Self::DraftKv,
        n: usize,
    ) -> Result<()>;
    /// Keeps a one-token draft step's entry as candidate `cand` of this round's draft path,
    /// for its descendants' `extra`.
    fn store_path(
        &mut self,
        caches: &mut Self::Caches,
        cand: usize,
        kv: Self::DraftKv,
    ) -> Result<()>;
}

/// A session holds its device by mutable borrow (the GPU model belongs to its backend).
impl<M: SpeculativeModel + ?Sized> SpeculativeModel for &mut M {
    type Caches = M::Caches;
    type TargetKv = M::TargetKv;
    type DraftKv = M::DraftKv;

    fn vocab(&self) -> usize {
        (**self).vocab()
    }
    fn capture_width(&self) -> usize {
        (**self).capture_width()
    }
    fn d2t(&self) -> Option<&[u32]> {
        (**self).d2t()
    }
    fn pass_limit(&self) -> Option<usize> {
        (**self).pass_limit()
    }
    fn kv_slots(&self) -> Option<usize> {
        (**self).kv_slots()
    }
    fn check_shape(&self, shape: &TreeShape) -> Result<()> {
        (**self).check_shape(shape)
    }
    fn new_caches(&self, slot: usize) -> Self::Caches {
        (**self).new_caches(slot)
    }
    fn target_pass(
        &mut self,
        caches: &[&Self::Caches],
        segs: Vec<TargetSeg>,
    ) -> Result<Vec<TargetOut<Self::TargetKv>>> {
        (**self).target_pass(caches, segs)
    }
    fn target_commit(
        &mut self,
        caches: &mut Self::Caches,
        kv: &Self::TargetKv,
        rows: &[usize],
    ) -> Result<()> {
        (**self).target_commit(caches, kv, rows)
    }
    fn draft_pass(
        &mut self,
        caches: &[&Self::Caches],
        segs: Vec<DraftSeg>,
    ) -> Result<Vec<DraftOut<Self::DraftKv>>> {
        (**self).draft_pass(caches, segs)
    }
    fn draft_commit(
        &mut self,
        caches: &mut Self::Caches,
        kv: Self::DraftKv,
        n: usize,
    ) -> Result<()> {
        (**self).draft_commit(caches, kv, n)
    }
    fn store_path(
        &mut self,
        caches: &mut Self::Caches,
        cand: usize,
        kv: Self::DraftKv,
    ) -> Result<()> {
        (**self).store_path(caches, cand, kv)
    }
}
