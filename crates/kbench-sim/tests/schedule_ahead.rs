//! Engines that choose the next forward's batch while the current one runs (SGLang's overlap
//! scheduler, vLLM's async scheduling): a request that reaches the scheduler during forward
//! k joins forward k + 2, never k + 1; one that finds the engine idle starts at once.

use std::path::Path;

use kbench_core::backend::RequestRecord;
use kbench_core::experiment::{load_experiment_str, Experiment};
use kbench_core::harness::{run_levels, NoProgress};
use kbench_sim::predict::load_plan;
use kbench_sim::{acceptance_for, SimBackend};

fn experiment(engine: &str, speculative: &str, concurrency: u32) -> Experiment {
    let trace = if speculative.is_empty() {
        String::new()
    } else {
        format!(
            "trace = \"{}/../../traces/kimi-k2.5-eagle3-chat.synth.kbt\"\n",
            env!("CARGO_MANIFEST_DIR")
        )
    };
    let text = format!(
        "name = \"t\"\nseed = 5\n[model]\npreset = \"kimi-k2.5\"\n{speculative}\n[hardware]\n\
         preset = \"8x-h200\"\n[engine]\nname = \"{engine}\"\n[server]\ntp_size = 8\n\
         [workload]\n{trace}max_tokens = 24\ninput_len = 300\noutput_len_range = [8, 24]\n\
         [benchmark]\nconcurrency = [{concurrency}]\nrequests_per_level = 12\nwarmup_requests = 0\n"
    );
    load_experiment_str(&text, Path::new("t.toml"), &[])
        .unwrap()
        .remove(0)
        .experiment
}

fn records(exp: &Experiment) -> Vec<RequestRecord> {
    let mut b = SimBackend::new(exp, acceptance_for(exp).unwrap()).unwrap();
    let mut levels =
        run_levels(&mut b, &load_plan(exp).keeping_records(), &mut NoProgress).unwrap();
    levels.remove(0).records
}

/// For each request that reached a busy engine: how many forwards ended after it was sent
/// and before its first token (the forward in progress counts as the first).
fn forwards_waited(records: &[RequestRecord]) -> Vec<usize> {
    let mut ends: Vec<u64> = records
        .iter()
        .flat_map(|r| r.token_times_ns.iter().copied())
        .collect();
    ends.sort_unstable();
    ends.dedup();
    records
        .iter()
        .filter(|r| {
            // another request was decoding when this one was sent
            records.iter().any(|o| {
                o.id != r.id
                    && o.token_times_ns
                        .first()
                        .is_some_and(|&t| t < r.submitted_ns)
                    && o.token_times_ns.last().is_some_and(|&t| t > r.submitted_ns)
            })
        })
        .map(|r| {
            let first = r.token_times_ns[0];
            ends.iter()
                .filter(|&&e| e > r.submitted_ns && e < first)
                .count()
        })
        .collect()
}

#[test]
fn an_overlapped_scheduler_admits_a_request_two_forwards_after_it_arrives() {
    for engine in ["vllm", "sglang"] {
        let waited = forwards_waited(&records(&experiment(engine, "", 3)));
        assert!(!waited.is_empty(), "{engine}: no request met a busy engine");
        // the forward in progress, then the one already chosen, then its own prefill
        assert!(
            waited.iter().all(|&n| n >= 2),
            "{engine}: forwards between a request's arrival and its first token: {waited:?}"
        );
    }
}

#[test]
fn a_scheduler_that_does_not_overlap_admits_at_the_next_boundary() {
    // SGLang's spec v1 runs with the overlap scheduler off
    let spec = "[draft]\npreset = \"kimi-k2.5-eagle3\"\n[speculative]\nalgorithm = \"EAGLE3\"\n\
                num_steps = 3\neagle_topk = 1\nnum_draft_tokens = 4\nspec_v2 = false\n";
    let waited = forwards_waited(&records(&experiment("sglang", spec, 3)));
    assert!(!waited.is_empty(), "no request met a busy engine");
    assert!(
        waited.contains(&1),
        "forwards between a request's arrival and its first token: {waited:?}"
    );
}
