//! Kernels, MLA forms, batching invariance, sampling exactness, trace replay.

mod common;

use kbench_core::experiment::VerifyMethod;
use kbench_core::tree::TreeShape;
use kbench_core::verify::{target_distribution, SamplingParams};
use kbench_engine::generate::run_batch;
use kbench_engine::linalg::{Linear, Weight};
use kbench_engine::speculative::{prefill, seq_rng, spec_round, Sequence};
use kbench_engine::st::Slice;
use kbench_engine::target::{Attend, MlaMode, Segment};
use kbench_engine::SpeculativeSettings;
use kbench_numerics::{bf16, int4};
use proptest::prelude::*;
use rand::RngExt;

proptest! {
    #[test]
    fn int4_pack_unpack_round_trip(vals in proptest::collection::vec(-8i8..=7, 8..=256)) {
        let n = vals.len() / 8 * 8;
        let v = &vals[..n];
        let packed = int4::pack(v);
        prop_assert_eq!(int4::unpack(&packed, 1, n), v.to_vec());
    }
}

#[test]
fn int4_quantisation_matches_compressed_tensors_layout() {
    // Value j of word k is column 8k + j at bits 4j, stored +8.
    let packed = int4::pack(&[-8, -7, 0, 1, 2, 3, 7, -1]);
    assert_eq!(packed[0] & 0xF, 0);
    assert_eq!((packed[0] >> 4) & 0xF, 1);
    assert_eq!((packed[0] >> 8) & 0xF, 8);
    assert_eq!((packed[0] >> 24) & 0xF, 15);
    assert_eq!(packed[0] >> 28, 7);
    // Quantise / dequantise error is at most half a step per group (plus the clamp of
    // +absmax to 7 steps when the BF16 scale rounded down).
    let mut rng = kbench_core::seed::rng_for(1, "q", 0);
    let (out, inp) = (8, 64);
    let w: Vec<f32> = (0..out * inp)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let (p, s) = int4::quantize(&w, out, inp, 32);
    let d = int4::dequantize(&p, &s, out, inp, 32);
    for r in 0..out {
        for c in 0..inp {
            let step = bf16::to_f32(s[r * 2 + c / 32]);
            assert!((w[r * inp + c] - d[r * inp + c]).abs() <= step * 0.56 + 1e-6);
        }
    }
    // The INT4 kernel equals a plain matmul over the dequantised weights.
    let lin = Linear {
        out,
        inp,
        w: Weight::Int4 {
            packed: Slice::from_vec(p),
            scales: Slice::from_vec(s),
            group: 32,
        },
    };
    let x: Vec<f32> = (0..3 * inp)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let y = lin.forward(&x, 3);
    for m in 0..3 {
        for r in 0..out {
            let want: f32 = (0..inp).map(|c| d[r * inp + c] * x[m * inp + c]).sum();
            assert!(
                (y[m * out + r] - want).abs() < 1e-4,
                "{} vs {want}",
                y[m * out + r]
            );
        }
    }
}

#[test]
fn matmul_rows_do_not_depend_on_batch_size() {
    // inp 100 takes the portable kernel, 96 and 2048 the SIMD one where the CPU has it.
    for (out, inp) in [(40usize, 100usize), (40, 96), (24, 2048)] {
        let mut rng = kbench_core::seed::rng_for(2, "m", inp as u64);
        let wf: Vec<f32> = (0..out * inp)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        let mut lins = vec![Linear::bf16(
            out,
            inp,
            Slice::from_vec(wf.iter().map(|&v| bf16::from_f32(v)).collect()),
        )];
        if inp % 32 == 0 {
            let (p, s) = int4::quantize(&wf, out, inp, 32);
            lins.push(Linear {
                out,
                inp,
                w: Weight::Int4 {
                    packed: Slice::from_vec(p),
                    scales: Slice::from_vec(s),
                    group: 32,
                },
            });
        }
        let x: Vec<f32> = (0..9 * inp)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        for lin in &lins {
            let all = lin.forward(&x, 9);
            for m in 0..9 {
                let one = lin.forward(&x[m * inp..(m + 1) * inp], 1);
                assert_eq!(&all[m * out..(m + 1) * out], &one[..], "inp {inp} row {m}");
                let three = lin.forward(&x[m.min(6) * inp..(m.min(6) + 3) * inp], 3);
                let k = m - m.min(6);
                assert_eq!(&all[m * out..(m + 1) * out], &three[k * out..(k + 1) * out]);
            }
        }
    }
}

#[test]
fn mla_absorbed_equals_naive() {
    let model = common::tiny_model(11, 0.5);
    let t = &model.target;
    let p = common::prompt(5, 9, t.vocab);
    let cache = t.new_cache();
    let seg = |c| Segment {
        cache: c,
        tokens: p.clone(),
        positions: (0..9).collect(),
        attend: Attend::Causal,
        all_logits: true,
    };
    let a = t.forward_mode(&[seg(&cache)], MlaMode::Absorbed).unwrap();
    let n = t.forward_mode(&[seg(&cache)], MlaMode::Naive).unwrap();
    let max_diff = a[0]
        .logits
        .iter()
        .zip(&n[0].logits)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(
        max_diff < 1e-3,
        "absorbed vs naive logits differ by {max_diff}"
    );
    // And with a populated cache (decode over the latent cache).
    let mut cache = t.new_cache();
    a[0].commit(&mut cache, &(0..9).collect::<Vec<_>>(), t.kv_width());
    let dseg = |c| Segment {
        cache: c,
        tokens: vec![3, 4],
        positions: vec![9, 10],
        attend: Attend::Causal,
        all_logits: true,
    };
    let a2 = t.forward_mode(&[dseg(&cache)], MlaMode::Absorbed).unwrap();
    let n2 = t.forward_mode(&[dseg(&cache)], MlaMode::Naive).unwrap();
    let d2 = a2[0]
        .logits
        .iter()
        .zip(&n2[0].logits)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(d2 < 1e-3, "decode: absorbed vs naive differ by {d2}");
}

#[test]
fn tree_verify_logits_equal_sequential_decode() {
    // A chain verified with the tree mask gives bit-identical logits to decoding it.
    let model = common::tiny_model(12, 0.5);
    let t = &model.target;
    let p = common::prompt(6, 8, t.vocab);
    let mut cache = t.new_cache();
    let pre = t
        .forward(&[Segment {
            cache: &cache,
            tokens: p.clone(),
            positions: (0..8).collect(),
            attend: Attend::Causal,
            all_logits: true,
        }])
        .unwrap();
    pre[0].commit(&mut cache, &(0..8).collect::<Vec<_>>(), t.kv_width());
    // Tree: root 10, children 20 and 30; 30 has child 40.
    let tokens = vec![10, 20, 30, 40];
    let anc = vec![vec![0], vec![0, 1], vec![0, 2], vec![0, 2, 3]];
    let tree = t
        .forward(&[Segment {
            cache: &cache,
            tokens,
            positions: vec![8, 9, 9, 10],
            attend: Attend::Tree(anc),
            all_logits: true,
        }])
        .unwrap();
    let v = t.vocab;
    let mut c2 = cache.clone();
    for (i, (tok, node)) in [(10u32, 0usize), (30, 2), (40, 3)].into_iter().enumerate() {
        let o = t
            .forward(&[Segment {
                cache: &c2,
                tokens: vec![tok],
                positions: vec![8 + i as u32],
                attend: Attend::Causal,
                all_logits: true,
            }])
            .unwrap();
        assert_eq!(
            &o[0].logits[..],
            &tree[0].logits[node * v..(node + 1) * v],
            "node {node}"
        );
        o[0].commit(&mut c2, &[0], t.kv_width());
    }
}

#[test]
fn batching_does_not_change_tokens() {
    let model = common::tiny_model(13, 0.7);
    let prompts: Vec<(u64, Vec<u32>)> = (0..5)
        .map(|i| (i, common::prompt(50 + i, 5 + 3 * i as usize, 256)))
        .collect();
    for (temp, method) in [
        (0.0, VerifyMethod::Greedy),
        (0.8, VerifyMethod::TargetOnly),
        (0.8, VerifyMethod::Exact),
    ] {
        for spec in [
            None,
            Some(SpeculativeSettings::new(3, 2, 5, method).unwrap()),
        ] {
            let together = run_batch(&model, prompts.clone(), 20, temp, 9, spec.as_ref()).unwrap();
            for (i, p) in prompts.iter().enumerate() {
                let alone = run_batch(&model, vec![p.clone()], 20, temp, 9, spec.as_ref()).unwrap();
                assert_eq!(
                    together[i].output(),
                    alone[0].output(),
                    "request {i}, {method:?}, spec {}",
                    spec.is_some()
                );
                assert_eq!(together[i].round_commits, alone[0].round_commits);
            }
        }
    }
}

/// Pearson chi-square of observed counts against expected probabilities, bins with an
/// expected count below 5 pooled.
fn chi_square(counts: &[u64], probs: &[f32], n: u64) -> (f64, usize) {
    let mut stat = 0.0;
    let mut bins = 0;
    let (mut po, mut pe) = (0.0, 0.0);
    for (c, p) in counts.iter().zip(probs) {
        let e = *p as f64 * n as f64;
        if e < 5.0 {
            po += *c as f64;
            pe += e;
            continue;
        }
        stat += (*c as f64 - e).powi(2) / e;
        bins += 1;
    }
    if pe > 0.0 {
        stat += (po - pe).powi(2) / pe.max(1e-9);
        bins += 1;
    }
    (stat, bins - 1)
}

fn first_token_distribution(method: VerifyMethod, topk: u32, steps: u32) {
    let model = common::micro_model(21, 0.6, 2, 64);
    let mut m = model.models();
    let t = &model.target;
    let temp = 1.0f32;
    let mut base = Sequence::new(0, common::prompt(77, 6, 64), 64, 0.0, seq_rng(0, 0), t);
    prefill(&mut m, &mut [&mut base]).unwrap();
    base.temperature = temp;
    // The target's distribution at the root (after the committed prefix).
    let root = *base.tokens.last().unwrap();
    let o = t
        .forward(&[Segment {
            cache: &base.caches.target,
            tokens: vec![root],
            positions: vec![base.tokens.len() as u32 - 1],
            attend: Attend::Causal,
            all_logits: true,
        }])
        .unwrap();
    let p = target_distribution(&o[0].logits, &SamplingParams::temperature(temp)).unwrap();
    let ndt = if topk == 1 {
        steps + 1
    } else {
        topk * steps + 1
    };
    TreeShape::new(steps, topk, ndt).unwrap();
    let cfg = SpeculativeSettings::new(steps, topk, ndt, method).unwrap();
    let n = 3000u64;
    let mut counts = vec![0u64; 64];
    for trial in 0..n {
        let mut s = base.clone();
        s.reseed(kbench_core::seed::rng_for(1234, "chi", trial));
        let out = spec_round(&mut m, &mut [&mut s], &cfg).unwrap();
        counts[out[0].tokens[0] as usize] += 1;
    }
    let (stat, dof) = chi_square(&counts, &p, n);
    // 99.9% quantile of chi-square is below dof + 3.3 sqrt(2 dof) + 10 for these sizes.
    let limit = dof as f64 + 3.3 * (2.0 * dof as f64).sqrt() + 10.0;
    assert!(
        stat < limit,
        "{method:?} topk {topk}: chi-square {stat:.1} with {dof} dof exceeds {limit:.1}"
    );
}

#[test]
fn exact_sampling_preserves_target_distribution_chain() {
    first_token_distribution(VerifyMethod::Exact, 1, 3);
}

#[test]
fn target_only_sampling_preserves_target_distribution_tree() {
    first_token_distribution(VerifyMethod::TargetOnly, 2, 2);
}

#[test]
fn chain_trace_replay_reproduces_engine_accept_lengths() {
    use kbench_core::trace::{replay_commit, OffPath, ProbEncoding};
    use kbench_engine::trace::{record_trace, TraceOptions};
    let model = common::tiny_model(31, 0.8);
    let prompts: Vec<(u64, Vec<u32>)> = (0..3)
        .map(|i| (i, common::prompt(300 + i, 8, 256)))
        .collect();
    let max_new = 40;
    let trace = record_trace(
        &model,
        &prompts,
        &TraceOptions {
            depth: 5,
            topk: 4,
            max_new,
            dataset: "test".into(),
            prob_encoding: ProbEncoding::Linear16,
        },
    )
    .unwrap();
    for steps in 1..=5u32 {
        let cfg = SpeculativeSettings::new(steps, 1, steps + 1, VerifyMethod::Greedy).unwrap();
        let seqs = run_batch(&model, prompts.clone(), max_new, 0.0, 0, Some(&cfg)).unwrap();
        let shape = TreeShape::chain(steps).unwrap();
        for (si, s) in seqs.iter().enumerate() {
            let mut pos = 1usize;
            for &c in &s.round_commits {
                let want = replay_commit(&trace, si, pos, &shape, OffPath::Proxy);
                if pos + want as usize <= max_new {
                    assert_eq!(c, want, "seq {si} steps {steps} position {pos}");
                }
                pos += c as usize;
            }
        }
    }
}

/// Tree replay (trace recorded along the target's path) against the engine's real trees:
/// prints the error figures quoted in docs/engine.md and checks they stay small.
#[test]
fn tree_trace_replay_error_vs_engine() {
    use kbench_core::trace::{replay_commit, OffPath, ProbEncoding};
    use kbench_engine::trace::{record_trace, TraceOptions};
    let max_new = 64;
    for quality in [0.6f32, 0.9] {
        let model = common::tiny_model(41, quality);
        let prompts: Vec<(u64, Vec<u32>)> = (0..6)
            .map(|i| (i, common::prompt(400 + i, 10, 256)))
            .collect();
        let trace = record_trace(
            &model,
            &prompts,
            &TraceOptions {
                depth: 5,
                topk: 4,
                max_new,
                dataset: "test".into(),
                prob_encoding: ProbEncoding::Linear16,
            },
        )
        .unwrap();
        for (steps, topk, ndt) in [(3u32, 2u32, 4u32), (3, 4, 8), (5, 4, 8), (4, 2, 6)] {
            let cfg = SpeculativeSettings::new(steps, topk, ndt, VerifyMethod::Greedy).unwrap();
            let shape = TreeShape::new(steps, topk, ndt).unwrap();
            let seqs = run_batch(&model, prompts.clone(), max_new, 0.0, 0, Some(&cfg)).unwrap();
            let mut line = format!("quality {quality} ({steps},{topk},{ndt}):");
            for off in [OffPath::Proxy, OffPath::Optimistic, OffPath::Pessimistic] {
                let (mut n, mut exact, mut abs, mut eng, mut rep) =
                    (0usize, 0usize, 0i64, 0u64, 0u64);
                for (si, s) in seqs.iter().enumerate() {
                    let mut pos = 1usize;
                    for &c in &s.round_commits {
                        let want = replay_commit(&trace, si, pos, &shape, off);
                        if pos + want as usize <= max_new && pos + c as usize <= max_new {
                            n += 1;
                            exact += (c == want) as usize;
                            abs += (c as i64 - want as i64).abs();
                            eng += c as u64;
                            rep += want as u64;
                        }
                        pos += c as usize;
                    }
                }
                let (al_e, al_r) = (eng as f64 / n as f64, rep as f64 / n as f64);
                line += &format!(
                    " {off:?}: exact {:.1}% mean|err| {:.3} AL engine {al_e:.3} replay {al_r:.3};",
                    100.0 * exact as f64 / n as f64,
                    abs as f64 / n as f64
                );
                if off == OffPath::Proxy {
                    assert!((al_e - al_r).abs() < 0.35, "{line}");
                }
            }
            println!("{line}");
        }
    }
}
