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
    };
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
