#![allow(dead_code)]
//! Shared helpers for the engine's integration tests.

pub mod gpu;

use kbench_engine::init::{build_model, Dims, InitOptions, Preset};
use kbench_engine::Model;

/// A really tiny model for property tests: hidden 32, 2-3 layers, 8 experts, vocab 64-128.
pub fn micro_dims(layers: usize, vocab: usize, n_group: usize) -> Dims {
    let mut d = Dims::tiny();
    d.hidden = 32;
    d.layers = layers;
    d.heads = 2;
    d.q_lora_rank = Some(32);
    d.kv_lora_rank = 16;
    d.nope = 8;
    d.rope = 8;
    d.v_head = 8;
    d.experts = 8;
    d.experts_per_tok = 2;
    d.moe_inter = 32;
    d.inter = 64;
    d.vocab = vocab;
    d.n_group = n_group;
    d.topk_group = 1.max(n_group / 2);
    d.draft_heads = 2;
    d.draft_kv_heads = 2;
    d.draft_head_dim = 16;
    d.draft_inter = 64;
    d.draft_vocab = vocab * 3 / 4;
    d
}

pub fn micro_model(seed: u64, quality: f32, layers: usize, vocab: usize) -> Model {
    let opts = InitOptions {
        preset: Preset::Tiny,
        dims: micro_dims(layers, vocab, 2),
        seed,
        draft_quality: quality,
    };
    build_model(&opts).expect("micro model builds")
}

pub fn tiny_model(seed: u64, quality: f32) -> Model {
    build_model(&InitOptions::new(Preset::Tiny, None, seed, quality)).expect("tiny model builds")
}

pub fn prompt(seed: u64, len: usize, vocab: usize) -> Vec<u32> {
    use rand::RngExt;
    let mut rng = kbench_core::seed::rng_for(seed, "test-prompt", len as u64);
    (0..len)
        .map(|_| rng.random_range(0..vocab as u32))
        .collect()
}
