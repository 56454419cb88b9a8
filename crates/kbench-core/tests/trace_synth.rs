//! The synthetic generator: parameters recorded and validated, rates honoured,
//! burstiness controlled by stickiness, summaries stable.

use kbench_core::trace::{
    accept_length, calibrate, read_bytes, standard_shapes, stats, synth, to_binary, ProbEncoding,
    SynthParams, TraceError,
};
use kbench_core::tree::TreeShape;

fn small(seed: u64) -> SynthParams {
    SynthParams {
        seed,
        sequences: 8,
        positions: 256,
        depth: 4,
        topk: 4,
        accept: vec![0.8, 0.75, 0.7, 0.65],
        easy_fraction: 0.5,
        stickiness: 0.9,
        contrast: 0.0,
        sibling_decay: 0.5,
        miss_top_k: 0.3,
        prob_encoding: ProbEncoding::Log8,
        target: "t".into(),
        draft: "d".into(),
        dataset: "synthetic test".into(),
        temperature: 0.0,
        match_rate: None,
    }
}

#[test]
fn header_records_every_parameter_in_order() {
    let p = small(1);
    let t = synth(&p).unwrap();
    let keys: Vec<&str> = t
        .header
        .provenance
        .params
        .keys()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(
        keys,
        vec![
            "seed",
            "sequences",
            "positions",
            "depth",
            "topk",
            "accept",
            "easy_fraction",
            "stickiness",
            "contrast",
            "sibling_decay",
            "miss_top_k",
            "prob_encoding"
        ]
    );
    assert_eq!(t.header.provenance.generator, "kbench-synth-v1");
    assert_eq!(
        SynthParams::from_provenance(&t.header.provenance).unwrap(),
        p
    );
    // Same parameters, same bytes; another seed, other bytes.
    assert_eq!(to_binary(&t), to_binary(&synth(&p).unwrap()));
    assert_ne!(to_binary(&t), to_binary(&synth(&small(2)).unwrap()));
    let back = read_bytes(std::path::Path::new("mem.kbt"), &to_binary(&t)).unwrap();
    assert_eq!(back, t);
}

#[test]
fn rates_and_probabilities_are_honoured() {
    // Without regime contrast, depths are independent: conditional rate = accept[d].
    let p = SynthParams {
        sequences: 16,
        positions: 1024,
        ..small(3)
    };
    let s = stats(&synth(&p).unwrap(), &[]).unwrap();
    for (d, ds) in s.per_depth.iter().enumerate() {
        assert!(
            (ds.top1 - p.accept[d]).abs() < 0.015,
            "depth {d}: {}",
            ds.top1
        );
        assert!(
            (ds.conditional - p.accept[d]).abs() < 0.03,
            "depth {d}: {}",
            ds.conditional
        );
        // Misses outside the top-K happen at rate (1 - a) * miss_top_k.
        let out = 1.0 - ds.in_top_k;
        assert!(
            (out - (1.0 - p.accept[d]) * p.miss_top_k).abs() < 0.015,
            "depth {d}: {out}"
        );
    }
    // The draft is more confident where it is right.
    let t = synth(&p).unwrap();
    let (mut hit, mut nhit, mut miss, mut nmiss) = (0.0, 0, 0.0, 0);
    for pos in 0..1024 {
        let top = f64::from(t.probs(0, pos, 0)[0]);
        if t.rank(0, pos, 0) == 0 {
            hit += top;
            nhit += 1;
        } else {
            miss += top;
            nmiss += 1;
        }
    }
    assert!(hit / f64::from(nhit) > miss / f64::from(nmiss) + 0.2);
}

/// Correlation of "depth 0 accepted" between neighbouring positions.
fn lag1(p: &SynthParams) -> f64 {
    let t = synth(p).unwrap();
    let mut xs = Vec::new();
    for s in 0..t.sequences.len() {
        let v: Vec<f64> = (0..t.positions(s))
            .map(|q| f64::from(u8::from(t.rank(s, q, 0) == 0)))
            .collect();
        xs.push(v);
    }
    let all: Vec<f64> = xs.iter().flatten().copied().collect();
    let mean = all.iter().sum::<f64>() / all.len() as f64;
    let var = all.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / all.len() as f64;
    let mut cov = 0.0;
    let mut n = 0;
    for v in &xs {
        for w in v.windows(2) {
            cov += (w[0] - mean) * (w[1] - mean);
            n += 1;
        }
    }
    cov / n as f64 / var
}

#[test]
fn stickiness_makes_acceptance_bursty() {
    // Regimes 0.725 / 0.275 around 0.5: lag-1 correlation ~ 0.95 * 0.05 / 0.25.
    let base = SynthParams {
        sequences: 16,
        positions: 512,
        contrast: 0.9,
        accept: vec![0.5; 4],
        ..small(4)
    };
    let iid = lag1(&SynthParams {
        stickiness: 0.0,
        ..base.clone()
    });
    let sticky = lag1(&SynthParams {
        stickiness: 0.95,
        ..base.clone()
    });
    assert!(
        iid.abs() < 0.03,
        "independent positions: lag-1 correlation {iid}"
    );
    assert!(sticky > 0.1, "sticky regimes: lag-1 correlation {sticky}");
    // Contrast 0 removes the effect even when sticky.
    let flat = lag1(&SynthParams {
        contrast: 0.0,
        ..base
    });
    assert!(flat.abs() < 0.03, "no contrast: {flat}");
}

#[test]
fn calibration_hits_its_target() {
    let p = SynthParams {
        sequences: 4,
        positions: 128,
        ..small(5)
    };
    let shape = TreeShape::chain(3).unwrap();
    let cal = calibrate(&p, &shape, 2.5).unwrap();
    let got = accept_length(&synth(&cal).unwrap(), &shape)
        .unwrap()
        .per_round;
    assert!((got - 2.5).abs() < 0.01, "{got}");
    assert!(matches!(
        calibrate(&p, &shape, 4.5),
        Err(TraceError::Synth { .. })
    ));
}

#[test]
fn bad_parameters_are_named() {
    let mut p = small(6);
    p.accept.pop();
    insta::assert_snapshot!("synth_accept_len", synth(&p).unwrap_err().to_string());
    let p = SynthParams {
        stickiness: 1.5,
        ..small(6)
    };
    insta::assert_snapshot!("synth_stickiness", synth(&p).unwrap_err().to_string());
    let p = SynthParams {
        depth: 9,
        accept: vec![0.5; 9],
        ..small(6)
    };
    insta::assert_snapshot!("synth_depth", synth(&p).unwrap_err().to_string());
}

#[test]
fn summary_snapshot() {
    let p = SynthParams {
        sequences: 4,
        positions: 64,
        ..small(7)
    };
    let t = synth(&p).unwrap();
    let s = stats(&t, &standard_shapes(t.depth(), t.topk())).unwrap();
    insta::assert_json_snapshot!("synth_small_stats", s);
}
