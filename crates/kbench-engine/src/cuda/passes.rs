//! The GPU's [`SpeculativeModel`]: a sequence's caches are a KV slot of [`CudaModel`] and their fill
//! levels. A pass leaves new entries in the model's pass buffer, and commits copy rows of it
//! (by index from the segment's first row) into the slot; the buffer holds `max_tokens`
//! tokens, so `crate::speculative` splits bounded phases into several passes.

use kbench_core::tree::TreeShape;
use rand_chacha::ChaCha8Rng;

use super::model::{CudaModel, GpuDraftSegment, GpuSegment};
use crate::error::{EngineError, Result};
use crate::passes::{DraftOut, DraftSeg, SpeculativeModel, TargetOut, TargetSeg};
use crate::speculative::Seq;

/// Where a sequence's caches live on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuCaches {
    /// KV cache slot (< max_batch).
    pub slot: usize,
    /// Entries in the slot's target / draft caches.
    pub tlen: usize,
    pub dlen: usize,
}

impl GpuCaches {
    /// Slot `slot`, both caches empty.
    pub fn empty(slot: usize) -> GpuCaches {
        GpuCaches {
            slot,
            tlen: 0,
            dlen: 0,
        }
    }
}

/// One request on the GPU.
pub type GpuSequence = Seq<GpuCaches>;

impl Seq<GpuCaches> {
    pub fn new(
        id: u64,
        slot: usize,
        prompt: Vec<u32>,
        max_new: usize,
        temperature: f32,
        rng: ChaCha8Rng,
    ) -> GpuSequence {
        Seq::with_caches(
            id,
            prompt,
            max_new,
            temperature,
            rng,
            GpuCaches::empty(slot),
        )
    }
}

impl SpeculativeModel for CudaModel {
    type Caches = GpuCaches;
    /// The segment's first row in the pass buffer.
    type TargetKv = usize;
    type DraftKv = usize;

    fn vocab(&self) -> usize {
        CudaModel::vocab(self)
    }

    fn capture_width(&self) -> usize {
        self.capture_layers().len() * self.hidden()
    }

    fn d2t(&self) -> Option<&[u32]> {
        self.has_draft().then_some(&self.d2t[..])
    }

    fn pass_limit(&self) -> Option<usize> {
        Some(self.opts.max_tokens)
    }

    fn kv_slots(&self) -> Option<usize> {
        Some(self.opts.max_batch)
    }

    fn check_shape(&self, shape: &TreeShape) -> Result<()> {
        if shape.num_candidates() > self.max_draft_candidates() {
            return Err(EngineError::Invalid(format!(
                "{} draft candidates per round > the pool's {}",
                shape.num_candidates(),
                self.max_draft_candidates()
            )));
        }
        Ok(())
    }

    fn new_caches(&self, slot: usize) -> GpuCaches {
        GpuCaches::empty(slot)
    }

    fn target_pass(
        &mut self,
        caches: &[&GpuCaches],
        segs: Vec<TargetSeg>,
    ) -> Result<Vec<TargetOut<usize>>> {
        let segs: Vec<GpuSegment> = caches
            .iter()
            .zip(segs)
            .map(|(c, s)| GpuSegment {
                slot: c.slot,
                cache_len: c.tlen,
                tokens: s.tokens,
                positions: s.positions,
                tree: s.tree,
                all_logits: s.all_logits,
            })
            .collect();
        Ok(self
            .forward_target(&segs, false)?
            .into_iter()
            .map(|o| TargetOut {
                logits: o.logits,
                captured: o.captured,
                kv: o.row0,
            })
            .collect())
    }

    fn target_commit(
        &mut self,
        caches: &mut GpuCaches,
        row0: &usize,
        rows: &[usize],
    ) -> Result<()> {
        self.commit_target(caches.slot, caches.tlen, *row0, rows)?;
        caches.tlen += rows.len();
        Ok(())
    }

    fn draft_pass(
        &mut self,
        caches: &[&GpuCaches],
        segs: Vec<DraftSeg>,
    ) -> Result<Vec<DraftOut<usize>>> {
        let segs: Vec<GpuDraftSegment> = caches
            .iter()
            .zip(segs)
            .map(|(c, s)| GpuDraftSegment {
                slot: c.slot,
                cache_len: c.dlen,
                extra: s.extra,
                tokens: s.tokens,
                hidden_in: s.hidden_in,
                positions: s.positions,
            })
            .collect();
        Ok(self
            .forward_draft(&segs)?
            .into_iter()
            .map(|o| DraftOut {
                logits: o.logits,
                aux: o.aux,
                kv: o.row0,
            })
            .collect())
    }

    fn draft_commit(&mut self, caches: &mut GpuCaches, row0: usize, n: usize) -> Result<()> {
        self.commit_draft(caches.slot, caches.dlen, row0, n)?;
        caches.dlen += n;
        Ok(())
    }

    fn store_path(&mut self, caches: &mut GpuCaches, cand: usize, row0: usize) -> Result<()> {
        self.pool_store(caches.slot, cand, row0)
    }
}
