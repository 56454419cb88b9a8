//! The CPU reference's [`SpeculativeModel`]: every sequence owns its caches, passes read them by
//! reference and hand back the new entries, and nothing bounds a pass.

use kbench_core::tree::TreeShape;
use rand_chacha::ChaCha8Rng;

use crate::draft::{Draft, DraftCache, DraftKv, DraftSegment};
use crate::error::{EngineError, Result};
use crate::passes::{DraftOut, DraftSeg, SpeculativeModel, TargetOut, TargetSeg};
use crate::speculative::Seq;
use crate::target::{Attend, KvCache, Segment, Target};

/// Target and (optional) draft.
#[derive(Clone, Copy)]
pub struct Models<'a> {
    pub target: &'a Target,
    pub draft: Option<&'a Draft>,
}

/// A sequence's caches on the CPU.
#[derive(Debug, Clone, Default)]
pub struct CpuCaches {
    pub target: KvCache,
    pub draft: DraftCache,
    /// Draft K/V of this round's candidates (the GPU keeps them in a per-slot pool). A round
    /// stores every candidate before its descendants read it, so entries left from earlier
    /// rounds are never read.
    path: Vec<Option<DraftKv>>,
}

impl CpuCaches {
    pub fn new(target: &Target) -> CpuCaches {
        CpuCaches {
            target: target.new_cache(),
            draft: DraftCache::default(),
            path: Vec::new(),
        }
    }
}

/// One request on the CPU.
pub type Sequence = Seq<CpuCaches>;

impl Seq<CpuCaches> {
    pub fn new(
        id: u64,
        prompt: Vec<u32>,
        max_new: usize,
        temperature: f32,
        rng: ChaCha8Rng,
        target: &Target,
    ) -> Sequence {
        let caches = CpuCaches::new(target);
        Seq::with_caches(id, prompt, max_new, temperature, rng, caches)
    }
}

impl<'a> Models<'a> {
    fn draft(&self) -> Result<&'a Draft> {
        self.draft
            .ok_or_else(|| EngineError::Invalid("no draft model loaded".into()))
    }
}

impl SpeculativeModel for Models<'_> {
    type Caches = CpuCaches;
    /// Per layer `[n, kv_width]`.
    type TargetKv = Vec<Vec<f32>>;
    /// One entry per segment token.
    type DraftKv = Vec<DraftKv>;

    fn vocab(&self) -> usize {
        self.target.vocab
    }

    fn capture_width(&self) -> usize {
        self.target.capture_layers.len() * self.target.hidden
    }

    fn d2t(&self) -> Option<&[u32]> {
        self.draft.map(|d| &d.d2t[..])
    }

    fn pass_limit(&self) -> Option<usize> {
        None
    }

    fn kv_slots(&self) -> Option<usize> {
        None
    }

    fn check_shape(&self, _shape: &TreeShape) -> Result<()> {
        Ok(())
    }

    fn new_caches(&self, _slot: usize) -> CpuCaches {
        CpuCaches::new(self.target)
    }

    fn target_pass(
        &mut self,
        caches: &[&CpuCaches],
        segs: Vec<TargetSeg>,
    ) -> Result<Vec<TargetOut<Vec<Vec<f32>>>>> {
        let segs: Vec<Segment<'_>> = caches
            .iter()
            .zip(segs)
            .map(|(c, s)| Segment {
                cache: &c.target,
                tokens: s.tokens,
                positions: s.positions,
                attend: s.tree.map_or(Attend::Causal, Attend::Tree),
                all_logits: s.all_logits,
            })
            .collect();
        Ok(self
            .target
            .forward(&segs)?
            .into_iter()
            .map(|o| TargetOut {
                logits: o.logits,
                captured: o.captured,
                kv: o.kv,
            })
            .collect())
    }

    fn target_commit(
        &mut self,
        caches: &mut CpuCaches,
        kv: &Vec<Vec<f32>>,
        rows: &[usize],
    ) -> Result<()> {
        caches.target.append(kv, rows, self.target.kv_width());
        Ok(())
    }

    fn draft_pass(
        &mut self,
        caches: &[&CpuCaches],
        segs: Vec<DraftSeg>,
    ) -> Result<Vec<DraftOut<Vec<DraftKv>>>> {
        let d = self.draft()?;
        let segs: Vec<DraftSegment<'_>> = caches
            .iter()
            .zip(segs)
            .map(|(c, s)| DraftSegment {
                cache: &c.draft,
                extra: s
                    .extra
                    .iter()
                    .map(|&a| c.path[a].as_ref().expect("ancestor beam was fed"))
                    .collect(),
                tokens: s.tokens,
                hidden_in: s.hidden_in,
                positions: s.positions,
            })
            .collect();
        Ok(d.forward(self.target, &segs)?
            .into_iter()
            .map(|o| DraftOut {
                logits: o.logits,
                aux: o.aux,
                kv: o.kv,
            })
            .collect())
    }

    fn draft_commit(&mut self, caches: &mut CpuCaches, kv: Vec<DraftKv>, _n: usize) -> Result<()> {
        for e in &kv {
            caches.draft.push(e);
        }
        Ok(())
    }

    fn store_path(&mut self, caches: &mut CpuCaches, cand: usize, kv: Vec<DraftKv>) -> Result<()> {
        if caches.path.len() <= cand {
            caches.path.resize(cand + 1, None);
        }
        caches.path[cand] = kv.into_iter().next();
        Ok(())
    }
}
