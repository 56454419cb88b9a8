//! CPU-side checks of the reference functions and host helpers (no GPU needed).
use kbench_cuda::{bf16, reference as r};

#[test]
fn int4_pack_roundtrip_matches_compressed_tensors_layout() {
    // word j of a row holds k = 8j..8j+7, low nibble first, stored q + 8
    let q: Vec<i8> = (0..64).map(|i| ((i * 7 + 3) % 16) as i8 - 8).collect();
    let w = r::pack_int4(&q, 2, 32);
    assert_eq!(w.len(), 8);
    assert_eq!(w[0] & 0xF, (q[0] + 8) as u32);
    assert_eq!((w[0] >> 28) & 0xF, (q[7] + 8) as u32);
    let s = vec![bf16::from_f32(0.5); 2];
    let d = r::dequant_int4(&w, &s, 2, 32);
    for i in 0..64 {
        assert_eq!(d[i], q[i] as f32 * 0.5);
    }
}

#[test]
fn bf16_rounding_is_nearest_even() {
    assert_eq!(bf16::from_f32(1.0), 0x3F80);
    assert_eq!(bf16::to_f32(bf16::from_f32(1.0 + 1.0 / 256.0)), 1.0); // tie -> even
    assert_eq!(
        bf16::to_f32(bf16::from_f32(1.0 + 3.0 / 256.0)),
        1.0 + 4.0 / 256.0
    );
    assert!(bf16::to_f32(bf16::from_f32(f32::NAN)).is_nan());
}

#[test]
fn yarn_blends_between_original_and_interpolated_frequencies() {
    let y = r::Yarn {
        beta_fast: 32.0,
        beta_slow: 1.0,
        ..r::kimi_k25_yarn()
    };
    let (inv, m) = r::yarn_inv_freq(&y, 64);
    assert_eq!(inv.len(), 32);
    assert!(
        (inv[0] - 1.0).abs() < 1e-6,
        "highest frequency is extrapolated: {}",
        inv[0]
    );
    let base_last = 1.0 / r::KIMI_K25_ROPE_THETA.powf(62.0 / 64.0);
    assert!(
        ((inv[31] as f64) - base_last / y.factor).abs() < 1e-9,
        "lowest frequency is interpolated"
    );
    assert!((m - 1.0).abs() < 1e-6, "mscale == mscale_all_dim -> 1");
    let plain = r::Yarn { factor: 1.0, ..y };
    assert_eq!(r::yarn_inv_freq(&plain, 64).1, 1.0);
    let s = r::mla_softmax_scale(192, &r::kimi_k25_yarn());
    assert!(s > 1.0 / 192f32.sqrt(), "YaRN raises the MLA softmax scale");
}

#[test]
fn routing_reference_picks_biased_top_k_and_renormalises() {
    let e = 8;
    let logits: Vec<f32> = (0..e).map(|i| i as f32 * 0.1).collect();
    let mut bias = vec![0f32; e];
    bias[0] = 10.0; // expert 0 chosen by the bias, weighted by its unbiased score
    let (ids, w) = r::moe_route(&logits, Some(&bias), 1, e, 2, 1, 1, true, 2.0);
    assert_eq!(ids, vec![0, 7]);
    let (s0, s7) = (r::sigmoid(0.0), r::sigmoid(0.7));
    assert!((w[0] - 2.0 * s0 / (s0 + s7)).abs() < 1e-6);
    assert!((w.iter().sum::<f32>() - 2.0).abs() < 1e-5);
    // grouped: 4 groups of 2, keep the best 1 group
    let (ids, _) = r::moe_route(&logits, None, 1, e, 2, 4, 1, false, 1.0);
    assert_eq!(ids, vec![7, 6]);
}

#[test]
fn tree_walk_accepts_matching_children_and_adds_bonus() {
    // root 0 -> 1 (tok 5), 0 -> 2 (tok 6), 1 -> 3 (tok 9)
    let cand = [0, 5, 6, 9];
    let parent = [-1, 0, 0, 1];
    let target = [5, 9, 0, 4];
    let (len, nodes, toks) = r::tree_verify_greedy(&cand, &parent, &target);
    assert_eq!((len, nodes, toks), (3, vec![1, 3], vec![5, 9, 4]));
    let (len, _, toks) = r::tree_verify_greedy(&cand, &parent, &[7, 0, 0, 0]);
    assert_eq!((len, toks), (1, vec![7]));
}

#[test]
fn sampling_distribution_filters() {
    let x = [1.0f32, 3.0, 2.0, 0.0, 3.0];
    let d = r::sampling_distribution(&x, 1.0, 2, 1.0);
    let ids: Vec<usize> = d.iter().map(|p| p.0).collect();
    assert_eq!(ids, vec![1, 4], "top-2 of values keeps both 3.0s");
    let d = r::sampling_distribution(&x, 0.0, 0, 1.0);
    assert_eq!(d, vec![(1, 1.0)], "greedy: first maximum");
    let d = r::sampling_distribution(&x, 1.0, 0, 0.5);
    assert!(d.iter().all(|p| x[p.0] == 3.0));
    assert!((d.iter().map(|p| p.1).sum::<f64>() - 1.0).abs() < 1e-12);
}

#[test]
fn mla_reference_masks_tree_tokens() {
    // 1 head, 2 query tokens, prefix 1: query 1 sees only the prefix and itself (mask 0b10)
    let mut q = vec![0f32; 2 * 576];
    q[0] = 1.0;
    q[576] = 1.0;
    let mut kv = vec![0f32; 3 * 576];
    for t in 0..3 {
        kv[t * 576] = t as f32;
        kv[t * 576 + 1] = 10.0 * t as f32;
    }
    let o = r::mla_attention(&q, &kv, 2, 1, 1, Some(&[0b01, 0b10]), 1.0);
    // query 1 attends over tokens 0 and 2 only: o[1] is a mix of 0 and 20
    let p2 = (2f64).exp() / (1.0 + (2f64).exp());
    assert!((o[512 + 1] as f64 - 20.0 * p2).abs() < 1e-4);
}
