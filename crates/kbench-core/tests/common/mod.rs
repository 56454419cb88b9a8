//! Small random traces for the trace tests.
#![allow(dead_code)]

use kbench_core::seed::rng_for;
use kbench_core::trace::{ProbEncoding, Provenance, Trace, TraceHeader, TraceKind};
use rand::RngExt;

pub fn provenance() -> Provenance {
    let mut params = serde_json::Map::new();
    params.insert("zeta".into(), 1.into());
    params.insert("alpha".into(), "kept in written order".into());
    Provenance {
        kind: TraceKind::Engine,
        target: "tiny-target".into(),
        draft: "tiny-draft".into(),
        dataset: "unit".into(),
        temperature: 0.7,
        generator: "test".into(),
        params,
    }
}

/// Arbitrary ranks (0..=K) and descending top-K probabilities; `hit` is P(rank 0).
pub fn random_trace(
    seed: u64,
    depth: u32,
    topk: u32,
    seqs: usize,
    positions: usize,
    enc: ProbEncoding,
    hit: f64,
) -> Trace {
    let mut t = Trace::new(TraceHeader::new(provenance(), depth, topk, enc));
    for s in 0..seqs {
        let mut rng = rng_for(seed, "test-trace", s as u64);
        let cells = positions * depth as usize;
        let mut ranks = Vec::with_capacity(cells);
        let mut probs = Vec::with_capacity(cells * topk as usize);
        for _ in 0..cells {
            let r = if rng.random::<f64>() < hit {
                0
            } else {
                rng.random_range(0..=topk) as u8
            };
            ranks.push(r);
            let mut ps: Vec<f64> = (0..topk)
                .map(|_| rng.random::<f64>() / f64::from(topk))
                .collect();
            // Coarse values make equal probabilities (ties) common; rounded down, so the
            // vector stays a distribution (each entry under 1/topk), which the replay's
            // bounds assume.
            if rng.random::<bool>() {
                ps.iter_mut().for_each(|p| *p = (*p * 8.0).floor() / 8.0);
            }
            ps.sort_by(|a, b| b.total_cmp(a));
            probs.extend(ps);
        }
        t.push_sequence(1000 + s as u64, ranks, &probs).unwrap();
    }
    t
}
