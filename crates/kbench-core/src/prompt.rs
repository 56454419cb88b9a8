//! The prompts every backend sends: token ids that are a pure function of the experiment's
//! seed and the request id, so the simulator, the engine and a live server see the same
//! requests.

use rand::RngExt;

use crate::seed::rng_for;

/// `len` (at least 1) token ids drawn uniformly from `0..vocab`.
pub fn random_prompt(seed: u64, id: u64, len: usize, vocab: usize) -> Vec<u32> {
    let mut rng = rng_for(seed, "prompt", id);
    (0..len.max(1))
        .map(|_| rng.random_range(0..vocab.max(1) as u32))
        .collect()
}
