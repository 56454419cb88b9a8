//! The synthetic Kimi-K2.5 EAGLE-3 traces shipped in traces/: their exact generator
//! parameters, so `kbench trace synth --preset NAME` rebuilds them byte for byte.
//! Rates were fitted with `calibrate` at (num_steps 3, topk 1, num_draft_tokens 4)
//! (tests/trace_calibrate.rs) to the published accept lengths of
//! lightseekorg/kimi-k2.5-eagle3 (shared/reference/kimi-k2.5.md).

use super::{ProbEncoding, SynthParams};

pub struct Preset {
    pub name: &'static str,
    /// File under traces/.
    pub file: &'static str,
    /// Published accept length at (3, 1, 4) the preset is calibrated to.
    pub target_accept_length: f64,
}

pub const PRESETS: [Preset; 2] = [
    Preset {
        name: "kimi-k2.5-eagle3-chat",
        file: "kimi-k2.5-eagle3-chat.synth.kbt",
        target_accept_length: 2.687,
    },
    Preset {
        name: "kimi-k2.5-eagle3-math",
        file: "kimi-k2.5-eagle3-math.synth.kbt",
        target_accept_length: 3.243,
    },
];

pub fn preset(name: &str) -> Option<SynthParams> {
    let base = |seed: u64,
                accept: &[f64],
                easy_fraction,
                stickiness,
                contrast,
                sibling_decay,
                miss_top_k,
                dataset: &str| SynthParams {
        seed,
        sequences: 128,
        positions: 512,
        depth: 8,
        topk: 8,
        accept: accept.to_vec(),
        easy_fraction,
        stickiness,
        contrast,
        sibling_decay,
        miss_top_k,
        prob_encoding: ProbEncoding::Log8,
        target: "moonshotai/Kimi-K2.5 (INT4)".into(),
        draft: "lightseekorg/kimi-k2.5-eagle3".into(),
        dataset: dataset.into(),
        temperature: 0.0,
        match_rate: None,
    };
    if let Some(c) = CHAIN_PRESETS.iter().find(|c| c.name == name) {
        return Some(c.params());
    }
    match name {
        "kimi-k2.5-eagle3-chat" => Some(base(
            0x6b62_6368_6174,
            &[0.750702, 0.731935, 0.722551, 0.713167, 0.703784, 0.6944, 0.685016, 0.675632],
            0.6,
            0.85,
            0.5,
            0.5,
            0.4,
            "synthetic, MT-Bench-like: calibrated to accept length 2.687 at (3,1,4) (lightseekorg/kimi-k2.5-eagle3 on MT-Bench)",
        )),
        "kimi-k2.5-eagle3-math" => Some(base(
            0x6b62_6d61_7468,
            &[0.877346, 0.855412, 0.844445, 0.833478, 0.822512, 0.811545, 0.800578, 0.789611],
            0.7,
            0.9,
            0.6,
            0.5,
            0.35,
            "synthetic, GSM8K/HumanEval-like: calibrated to accept length 3.243 at (3,1,4) (mean of lightseekorg/kimi-k2.5-eagle3 on GSM8K 3.201 and HumanEval 3.285)",
        )),
        _ => None,
    }
}

/// Chain traces from measured accept-length curves: a chain's accept length at every K
/// fixes its per-depth acceptance, so these traces replay any chain up to depth 8 with a
/// real provenance (vLLM chains, SGLang with eagle_topk = 1; not trees: they record the
/// draft's top-1 only).
pub struct ChainPreset {
    pub name: &'static str,
    pub file: &'static str,
    /// Mean accept length (bonus token included) at num_speculative_tokens = 1..=8.
    pub curve: [f64; 8],
    pub target: &'static str,
    pub draft: &'static str,
    pub temperature: f64,
    /// Where the curve was measured.
    pub source: &'static str,
    /// vLLM n-gram: the share of steps whose lookup matches (none for EAGLE and MTP).
    pub match_rate: Option<f64>,
}

pub const CHAIN_PRESETS: [ChainPreset; 3] = [
    ChainPreset {
        name: "kimi-k2.5-eagle3-speedbench-coding",
        file: "kimi-k2.5-eagle3-speedbench-coding.synth.kbt",
        curve: [1.80, 2.33, 2.75, 3.06, 3.25, 3.43, 3.46, 3.51],
        target: "moonshotai/Kimi-K2.5 (NVFP4)",
        draft: "EAGLE-3 (InferenceX kimik2.5 fp4 b300 vLLM recipe)",
        temperature: 0.6,
        source: "InferenceX golden AL, SPEED-Bench coding, thinking off, top_p 0.95, vLLM EAGLE3 on B300 (shared/data/validation/acceptance/kimik2.5_eagle3.yaml; run 28122195822)",
        match_rate: None,
    },
    ChainPreset {
        name: "kimi-k2.5-eagle3-speedbench-coding-thinking",
        file: "kimi-k2.5-eagle3-speedbench-coding-thinking.synth.kbt",
        curve: [1.83, 2.43, 2.88, 3.24, 3.46, 3.62, 3.71, 3.77],
        target: "moonshotai/Kimi-K2.5 (NVFP4)",
        draft: "EAGLE-3 (InferenceX kimik2.5 fp4 b300 vLLM recipe)",
        temperature: 1.0,
        source: "InferenceX golden AL, SPEED-Bench coding, thinking on, top_p 0.95, vLLM EAGLE3 on B300 (shared/data/validation/acceptance/kimik2.5_eagle3.yaml; run 28122195822)",
        match_rate: None,
    },
    ChainPreset {
        name: "ngram-illustrative",
        file: "ngram-illustrative.synth.kbt",
        // conditional acceptance 0.6 per depth once a lookup matches
        curve: [1.6, 1.96, 2.176, 2.3056, 2.38336, 2.430016, 2.4580096, 2.47480576],
        target: "any",
        draft: "vLLM ngram prompt lookup",
        temperature: 0.0,
        source: "illustrative, not measured: no public n-gram acceptance for these models is in the corpus; lookups match on half the steps, and a matched draft is accepted at 0.6 per depth",
        match_rate: Some(0.5),
    },
];

impl ChainPreset {
    /// Per-depth conditional acceptance from the curve: P(the first k drafts all accepted)
    /// is AL(k) - AL(k-1), kept non-increasing (measured curves carry noise at depth).
    pub fn conditional_rates(&self) -> Vec<f64> {
        let mut rates = Vec::with_capacity(8);
        let mut prev_al = 1.0;
        let mut prev_p = 1.0_f64;
        for &al in &self.curve {
            let p = (al - prev_al).clamp(0.0, prev_p);
            rates.push(if prev_p > 0.0 {
                (p / prev_p).min(1.0)
            } else {
                0.0
            });
            prev_al = al;
            prev_p = p;
        }
        rates
    }

    pub fn params(&self) -> SynthParams {
        SynthParams {
            seed: crate::seed::derive_seed(0, "chain-preset", self.name.len() as u64)
                ^ self
                    .name
                    .bytes()
                    .fold(0u64, |h, b| h.rotate_left(5) ^ b as u64),
            sequences: 128,
            positions: 512,
            depth: 8,
            topk: 1,
            accept: self.conditional_rates(),
            easy_fraction: 0.5,
            stickiness: 0.0,
            contrast: 0.0,
            sibling_decay: 0.5,
            miss_top_k: 0.0,
            prob_encoding: ProbEncoding::Log8,
            target: self.target.into(),
            draft: self.draft.into(),
            dataset: format!(
                "synthetic chain from a measured accept-length curve {:?}: {}",
                self.curve, self.source
            ),
            temperature: self.temperature,
            match_rate: self.match_rate,
        }
    }
}
