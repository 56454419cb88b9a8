//! What a batched pass takes and returns per sequence: the GPU twins of the CPU path's
//! `target::Segment` and `draft::DraftSegment`.

/// One sequence's tokens in a batched target pass (the GPU twin of `target::Segment`).
#[derive(Debug, Clone)]
pub struct GpuSegment {
    /// KV cache slot of the sequence (< max_batch).
    pub slot: usize,
    /// Tokens already in the slot's cache.
    pub cache_len: usize,
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    /// Per token, the segment tokens it attends to (its tree ancestors and itself); `None`:
    /// causal.
    pub tree: Option<Vec<Vec<usize>>>,
    /// Logits for every token (verify, decode) or only the last (prefill).
    pub all_logits: bool,
}

#[derive(Debug, Clone)]
pub struct GpuSegmentOut {
    /// `[n or 1, vocab]`.
    pub logits: Vec<f32>,
    /// `[n, ncap * hidden]`: the capture layers' outputs.
    pub captured: Vec<f32>,
    /// First row of this segment in the pass (for [`CudaModel::commit_target`]).
    pub row0: usize,
    /// Per layer `[n, kv_width]` (only when asked for; tests compare it with the CPU's).
    pub kv: Option<Vec<Vec<f32>>>,
}

/// One sequence's tokens in a draft pass (the twin of `draft::DraftSegment`).
#[derive(Debug, Clone)]
pub struct GpuDraftSegment {
    pub slot: usize,
    /// Entries already in the slot's draft cache.
    pub cache_len: usize,
    /// Candidates (indices into this round's pool for the slot) attended after the cache.
    pub extra: Vec<usize>,
    pub tokens: Vec<u32>,
    /// `[n, ncap*h]` captured states (extend) or `[n, h]` draft hidden (decode).
    pub hidden_in: Vec<f32>,
    pub positions: Vec<u32>,
}

#[derive(Debug, Clone)]
pub struct GpuDraftOut {
    /// `[n, draft_vocab]`.
    pub logits: Vec<f32>,
    /// `[n, h]` pre-norm hidden (input of the next draft step).
    pub aux: Vec<f32>,
    pub row0: usize,
}
