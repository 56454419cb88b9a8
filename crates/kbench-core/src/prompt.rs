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

/// A request's prompt: `shared` leading tokens that every request of the run has (drawn
/// once from the seed, so a server's prefix cache can serve them), then its own.
pub fn request_prompt(seed: u64, id: u64, len: usize, shared: usize, vocab: usize) -> Vec<u32> {
    if shared == 0 {
        return random_prompt(seed, id, len, vocab);
    }
    let shared = shared.min(len.max(1));
    let mut prompt = random_prompt(seed, u64::MAX, shared, vocab);
    let own = len.max(1) - shared;
    if own > 0 {
        prompt.extend(random_prompt(seed, id, own, vocab));
    }
    prompt
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_prefixes_are_shared_and_the_rest_is_each_requests_own() {
        let a = request_prompt(1, 1, 20, 8, 1000);
        let b = request_prompt(1, 2, 20, 8, 1000);
        assert_eq!((a.len(), b.len()), (20, 20));
        assert_eq!(a[..8], b[..8]);
        assert_ne!(a[8..], b[8..]);
        assert_eq!(
            request_prompt(1, 1, 20, 0, 1000),
            random_prompt(1, 1, 20, 1000)
        );
    }
}
