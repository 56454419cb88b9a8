//! Weight footprints from the architecture, against the checkpoint sizes in
//! reference/kimi-k2.5.md, and the refusal of configurations whose weights do not fit.

use kbench_core::arch::{DraftArch, ModelArch};
use kbench_core::experiment::SpeculativeConfig;
use kbench_sim::memory::{check_weights_fit, weight_footprint};
use kbench_sim::presets::preset;

fn within(x: f64, reference: f64, rel: f64) -> bool {
    (x / reference - 1.0).abs() <= rel
}

#[test]
fn kimi_footprint_matches_the_published_checkpoint() {
    let m = ModelArch::preset("kimi-k2.5").unwrap();
    let f = weight_footprint(&m, None, 8);
    // reference/kimi-k2.5.md: ~594 GB in all, routed INT4 with scales ~571 GB, ~74 GB (594 / 8)
    // per GPU at TP8; a rank also holds the replicated q_a / kv_a / router, a few GB
    assert!(within(f.total_bytes, 594e9, 0.02), "{f:?}");
    assert!(within(f.routed_expert_bytes, 571e9, 0.02), "{f:?}");
    let even = f.total_bytes / 8.0;
    assert!(
        f.per_gpu_bytes > even && f.per_gpu_bytes < even + 4e9,
        "{f:?}"
    );
}

#[test]
fn more_ranks_hold_less_each_and_the_draft_adds_a_little() {
    let m = ModelArch::preset("kimi-k2.5").unwrap();
    let d = DraftArch::preset("kimi-k2.5-eagle3").unwrap();
    let mut last = f64::INFINITY;
    for tp in [1, 2, 4, 8] {
        let f = weight_footprint(&m, None, tp);
        assert!(f.per_gpu_bytes < last, "tp {tp}: {f:?}");
        last = f.per_gpu_bytes;
        let with_draft = weight_footprint(&m, Some(&d), tp);
        let extra = with_draft.total_bytes - f.total_bytes;
        assert!(extra > 0.5e9 && extra < 5e9, "draft adds {extra}");
    }
}

#[test]
fn weights_that_do_not_fit_are_refused_with_the_tp_that_would() {
    let m = ModelArch::preset("kimi-k2.5").unwrap();
    let box8 = preset("8x-rtx-pro-6000-server").unwrap();
    let none = SpeculativeConfig::none();
    assert!(check_weights_fit(&box8, &m, &none, None, 8).is_ok());
    let e = check_weights_fit(&box8, &m, &none, None, 4)
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not fit"), "{e}");
    assert!(e.contains("it fits at tp_size 8"), "{e}");
    let one = preset("h200").unwrap();
    let e = check_weights_fit(&one, &m, &none, None, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("fits at no tp_size"), "{e}");
    assert!(check_weights_fit(&preset("8x-h200").unwrap(), &m, &none, None, 8).is_ok());
}
