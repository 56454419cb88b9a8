//! The shipped presets' rates are what `calibrate` gives from the documented base shape
//! (slow in debug builds, so ignored by default):
//! `cargo test -p kbench-core --test trace_calibrate -- --ignored`.
//! To recalibrate, change the base or the target, run this, and paste the printed rates
//! into src/trace/presets.rs and docs/trace-format.md.

use kbench_core::trace::{calibrate, preset, SynthParams, PRESETS};
use kbench_core::tree::TreeShape;

/// Per-depth shape the calibration scales (gently falling with depth).
const BASE: [f64; 8] = [0.80, 0.78, 0.77, 0.76, 0.75, 0.74, 0.73, 0.72];

#[test]
#[ignore = "slow: 32 synth + replay runs per preset"]
fn presets_are_calibrated_from_the_base_shape() {
    let shape = TreeShape::chain(3).unwrap();
    for p in PRESETS {
        let shipped = preset(p.name).unwrap();
        let base = SynthParams {
            accept: BASE.to_vec(),
            ..shipped.clone()
        };
        let cal = calibrate(&base, &shape, p.target_accept_length).unwrap();
        println!("{}: accept = {:?}", p.name, cal.accept);
        assert_eq!(cal, shipped, "{}: recalibration gives other rates", p.name);
    }
}
