//! vLLM's scheduler runs a window of forwards that only decode the same batch in one go
//! (nothing waiting, prefilling or arriving, nobody finishing): the window must be exact.
//! Every request's token times, and so every metric, equal those of the same run simulated
//! one forward at a time, whatever the load, the cache pressure or the client.

use std::path::Path;

use kbench_core::experiment::{load_experiment_str, Experiment};
use kbench_core::harness::{run_levels, LevelResult, NoProgress};
use kbench_sim::predict::load_plan;
use kbench_sim::{acceptance_for, SimBackend};
use proptest::prelude::*;

fn experiment(
    server: &str,
    engine: &str,
    speculative: &str,
    workload: &str,
    levels: &str,
) -> Experiment {
    let text = format!(
        "name = \"t\"\nseed = 17\n[model]\npreset = \"kimi-k2.5\"\n[hardware]\npreset = \"8x-h200\"\n\
         [engine]\nname = \"vllm\"\n{engine}\n[server]\ntp_size = 8\n{server}\n\
         [draft]\npreset = \"kimi-k2.5-eagle3-mla\"\n[speculative]\n{speculative}\n\
         [workload]\n{workload}\n[benchmark]\n{levels}\n"
    );
    load_experiment_str(&text, Path::new("t.toml"), &[])
        .unwrap()
        .remove(0)
        .experiment
}

fn run(exp: &Experiment, step_by_step: bool) -> Vec<LevelResult> {
    let mut b = SimBackend::new(exp, acceptance_for(exp).unwrap()).unwrap();
    if step_by_step {
        b = b.step_by_step();
    }
    run_levels(&mut b, &load_plan(exp).keeping_records(), &mut NoProgress).unwrap()
}

fn assert_same(exp: &Experiment) {
    let (window, reference) = (run(exp, false), run(exp, true));
    assert_eq!(window.len(), reference.len());
    for (w, r) in window.iter().zip(&reference) {
        assert_eq!(w.records, r.records);
        assert_eq!(format!("{:?}", w.metrics), format!("{:?}", r.metrics));
    }
}

const TRACE: &str = "../../traces/kimi-k2.5-eagle3-speedbench-coding.synth.kbt";

/// `vllm-8x-h200` with a front end that takes 700 us per streamed chunk (the shipped vLLM
/// profiles have none): a finished request then reaches its client after the forward that
/// finished it, so the driving loop's stop at that delivery is what ends a window.
fn slow_front_end_profile(dir: &Path) -> String {
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments/engines/vllm-8x-h200.toml"),
    )
    .unwrap();
    let slow = shipped.replacen(
        "[host.frontend_per_chunk_us]\nvalue = 0.0",
        "[host.frontend_per_chunk_us]\nvalue = 700.0",
        1,
    );
    assert_ne!(slow, shipped, "the profile's front-end term moved");
    let path = dir.join("vllm-slow-front-end.toml");
    std::fs::write(&path, slow).unwrap();
    format!("profile = \"{}\"", path.display())
}

/// Outputs long enough that most forwards fall in windows, at InferenceX's load; lengths
/// that differ, so requests finish, and are replaced, at different forwards.
#[test]
fn long_outputs_give_the_same_token_times_as_step_by_step() {
    for concurrency in [1, 8, 48] {
        let exp = experiment(
            "prefix_caching = false",
            "",
            "method = \"none\"",
            "max_tokens = 1500\ninput_len_range = [64, 1024]\noutput_len_range = [200, 1500]",
            &format!(
                "concurrency = [{concurrency}]\nrequests_per_level = {}\nwarmup_requests = 0",
                concurrency * 3
            ),
        );
        assert_same(&exp);
    }
}

/// A front end slower than the forwards: deliveries lag the forwards that finished them,
/// and a window must stop where the loop would hand a delivery to the client.
#[test]
fn a_slow_front_end_ends_a_window_at_the_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let profile = slow_front_end_profile(dir.path());
    for concurrency in [1, 7, 48] {
        let exp = experiment(
            "prefix_caching = false",
            &profile,
            "method = \"none\"",
            "max_tokens = 900\ninput_len_range = [64, 900]\noutput_len_range = [50, 900]",
            &format!(
                "concurrency = [{concurrency}]\nrequests_per_level = {}\nwarmup_requests = 2",
                concurrency * 4
            ),
        );
        assert_same(&exp);
    }
}

/// An open-loop client's next request is sent at its own time: a window must end at the
/// forward that passes it, as a forward-by-forward run does.
#[test]
fn open_loop_arrivals_cut_a_window_where_step_by_step_would_look() {
    for rate in [0.5, 3.0] {
        let exp = experiment(
            "prefix_caching = false",
            "",
            "method = \"none\"",
            "max_tokens = 1200\ninput_len = 512",
            &format!("request_rate = [{rate}]\nmax_concurrency = 16\nrequests_per_level = 12\nwarmup_requests = 0"),
        );
        assert_same(&exp);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Closed and open loop, a pool that preempts, a short token budget, a shared prefix,
    /// a slow front end, and now and then speculation (whose rounds never run in a window):
    /// the window never changes a token's time.
    #[test]
    fn a_window_is_exact_in_virtual_time(
        clients in 1u32..24,
        input in (1u32..600, 0u32..400),
        output in (1u32..300, 0u32..300),
        pool in proptest::option::of(2500u32..20000),
        budget in 16u32..2048,
        prefix in 0u32..200,
        caching in any::<bool>(),
        rate in proptest::option::of(1.0f64..40.0),
        slow_front_end in any::<bool>(),
        speculative in proptest::bool::weighted(0.2),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let front_end = if slow_front_end {
            slow_front_end_profile(dir.path())
        } else {
            String::new()
        };
        let max_tokens = output.0 + output.1;
        let server = format!(
            "prefix_caching = {caching}\n{}",
            pool.map(|p| format!("max_total_tokens = {p}")).unwrap_or_default()
        );
        let (method, trace) = if speculative {
            (
                "method = \"eagle3\"\nnum_speculative_tokens = 3",
                format!("trace = \"{}/{TRACE}\"\n", env!("CARGO_MANIFEST_DIR")),
            )
        } else {
            ("method = \"none\"", String::new())
        };
        let workload = format!(
            "{trace}max_tokens = {max_tokens}\ninput_len_range = [{}, {}]\noutput_len_range = [{}, {max_tokens}]\nshared_prefix_len = {prefix}",
            input.0, input.0 + input.1, output.0
        );
        let levels = match rate {
            Some(r) => format!("request_rate = [{r}]\nmax_concurrency = {clients}"),
            None => format!("concurrency = [{clients}]"),
        };
        let exp = experiment(
            &server,
            &format!("max_num_batched_tokens = {budget}\n{front_end}"),
            method,
            &workload,
            &format!("{levels}\nrequests_per_level = 20\nwarmup_requests = 1"),
        );
        prop_assume!(pool.is_none_or(|p| exp.input_len.1 + max_tokens + 8 < p));
        let (window, reference) = (run(&exp, false), run(&exp, true));
        for (w, r) in window.iter().zip(&reference) {
            prop_assert_eq!(&w.records, &r.records);
            prop_assert_eq!(format!("{:?}", w.metrics), format!("{:?}", r.metrics));
        }
    }
}
