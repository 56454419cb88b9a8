//! Engine profiles: which one an experiment gets, what the API server's admission terms
//! do to a request (delay it, not the batch), and that carried terms stay in step.

use std::path::Path;

use kbench_core::experiment::{load_experiment, load_experiment_str, Experiment};
use kbench_core::harness::{run_levels, NoProgress};
use kbench_sim::engine_profile::EngineProfile;
use kbench_sim::predict::load_plan;
use kbench_sim::presets::{engine_preset, load_tables, resolve_engine_profile, resolve_profile};
use kbench_sim::SimBackend;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn engine_of(exp: &Experiment) -> String {
    let hw = resolve_profile(&exp.hardware).unwrap();
    resolve_engine_profile(exp, &hw).unwrap().name
}

fn plain(hardware: &str, engine: &str) -> Experiment {
    let text = format!(
        "name = \"t\"\nseed = 3\n[model]\npreset = \"kimi-k2.5\"\n[hardware]\npreset = \"{hardware}\"\n\
         {engine}\n[server]\ntp_size = 8\n[workload]\nmax_tokens = 8\ninput_len = 1000\n\
         [benchmark]\nconcurrency = [1]\nrequests_per_level = 3\nwarmup_requests = 0\n"
    );
    load_experiment_str(&text, Path::new("t.toml"), &[])
        .unwrap()
        .remove(0)
        .experiment
}

#[test]
fn an_experiment_gets_its_boxs_engine_profile_else_the_generic_one() {
    let seed = load_experiment(&root().join("experiments/topk1_v2.toml"), &[])
        .unwrap()
        .remove(0)
        .experiment;
    assert_eq!(engine_of(&seed), "sglang-8x-rtx-pro-6000-server");
    assert_eq!(engine_of(&plain("8x-h200", "")), "sglang");
    assert_eq!(
        engine_of(&plain("8x-h200", "[engine]\nname = \"vllm\"")),
        "vllm-8x-h200"
    );
    assert_eq!(
        engine_of(&plain(
            "8x-rtx-pro-6000-server",
            "[engine]\nname = \"vllm\""
        )),
        "vllm-8x-rtx-pro-6000-server"
    );
    assert_eq!(
        engine_of(&plain("8x-h100", "[engine]\nname = \"vllm\"")),
        "vllm"
    );
    assert_eq!(
        engine_of(&plain(
            "8x-h200",
            "[engine]\nname = \"sglang\"\npreset = \"sglang-8x-rtx-pro-6000-server\""
        )),
        "sglang-8x-rtx-pro-6000-server"
    );
    let e = engine_preset("sglang-h100").unwrap_err().to_string();
    assert!(e.contains("vllm-8x-h200"), "{e}");
}

/// Mean TTFT at C=1 (one request at a time) with the engine profile given.
fn ttft_ms(exp: &Experiment, engine: EngineProfile) -> f64 {
    let hw = resolve_profile(&exp.hardware).unwrap();
    let tables = load_tables(&hw).unwrap();
    let mut b = SimBackend::with_profiles(exp, hw, engine, tables, None).unwrap();
    let levels = run_levels(&mut b, &load_plan(exp).keeping_records(), &mut NoProgress).unwrap();
    levels[0].metrics.mean_ttft_ms
}

#[test]
fn admission_terms_delay_each_request_by_exactly_their_cost() {
    for engine in ["[engine]\nname = \"vllm\"", ""] {
        let exp = plain("8x-h200", engine);
        let hw = resolve_profile(&exp.hardware).unwrap();
        let mut none = resolve_engine_profile(&exp, &hw).unwrap();
        none.host.admission_per_request_us.value = 0.0;
        none.host.tokenize_per_token_us.value = 0.0;
        let mut some = none.clone();
        some.host.admission_per_request_us.value = 5000.0;
        some.host.tokenize_per_token_us.value = 2.0;
        // one request at a time: nothing else runs while it waits, so the delay adds as is
        let extra = ttft_ms(&exp, some) - ttft_ms(&exp, none);
        let expected = 5.0 + 1000.0 * 2.0 / 1000.0;
        assert!(
            (extra - expected).abs() < 1e-6,
            "{engine}: TTFT grew by {extra} ms, expected {expected}"
        );
    }
}

/// Profiles that carry another's fitted terms hold its current values: a refit of the
/// source would otherwise leave them behind silently.
#[test]
fn carried_terms_match_the_profile_they_come_from() {
    let v016 = engine_preset("vllm-8x-h200").unwrap();
    let v020 = engine_preset("vllm-0.20-8x-h200").unwrap();
    let m3 = engine_preset("vllm-minimax-m3-h200").unwrap();
    for key in [
        "kernels.moe_prefill_scale",
        "kernels.all_reduce_scale",
        "host.admission_per_request_us",
    ] {
        assert_eq!(
            v020.param(key).unwrap().value,
            v016.param(key).unwrap().value,
            "vllm-0.20-8x-h200 carries {key} from vllm-8x-h200"
        );
    }
    let key = "host.admission_per_request_us";
    assert_eq!(
        m3.param(key).unwrap().value,
        v016.param(key).unwrap().value,
        "vllm-minimax-m3-h200 takes {key} from vllm-8x-h200"
    );
}
