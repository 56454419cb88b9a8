//! Seeds derived from stable ids, never from iteration or thread order.

use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// SplitMix64 finaliser: a fixed, well-mixed function of (experiment seed, stream, id).
pub fn derive_seed(experiment_seed: u64, stream: &str, id: u64) -> u64 {
    let mut h = experiment_seed ^ 0x9E37_79B9_7F4A_7C15;
    for b in stream.bytes() {
        h = mix(h ^ b as u64);
    }
    mix(h ^ mix(id))
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub fn rng_for(experiment_seed: u64, stream: &str, id: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(derive_seed(experiment_seed, stream, id))
}
