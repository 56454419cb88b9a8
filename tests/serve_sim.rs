//! `kbench serve --sim`: an experiment's modelled deployment played out in wall time. Each
//! chunk carries the tokens the simulator's round committed, released at the virtual time
//! the cost model gives divided by `--speed`.

mod serve_support;

use std::sync::Arc;
use std::time::Duration;

use kbench_core::backend::{Backend, Request};
use kbench_core::experiment::load_experiment;
use kbench_core::trace::{self, TraceAcceptance};
use serde_json::json;
use serve_support::*;

/// The stated tolerance: a chunk reaches the client within this of its scheduled release
/// (the virtual timeline / speed), measured from the request's first chunk.
const RELEASE_TOLERANCE: Duration = Duration::from_millis(30);

fn experiment() -> String {
    format!("{}/experiments/topk1_v2.toml", env!("CARGO_MANIFEST_DIR"))
}

/// The simulator's own record of request 0 served alone: (virtual time, tokens) per chunk.
fn offline_chunks(input_len: u32, max_tokens: u32) -> Vec<(u64, u32)> {
    let exp = load_experiment(std::path::Path::new(&experiment()), &[])
        .unwrap()
        .remove(0)
        .experiment;
    let t = trace::read(exp.trace.as_ref().unwrap()).unwrap();
    let acc = TraceAcceptance::for_spec(Arc::new(t), exp.file.seed, &exp.speculative).unwrap();
    let mut backend = kbench_sim::SimBackend::new(&exp, Some(Arc::new(acc))).unwrap();
    let mut session = backend.start_level(1).unwrap();
    session
        .submit(Request {
            id: 0,
            input_len,
            max_tokens,
            warmup: false,
            ..Request::default()
        })
        .unwrap();
    let r = session.run_until_completion().unwrap().remove(0);
    let mut chunks = vec![(r.token_times_ns[0], 1)];
    let mut at = 1usize;
    for &c in &r.round_commits {
        at += c as usize;
        chunks.push((r.token_times_ns[at - 1], c));
    }
    assert_eq!(at, max_tokens as usize);
    chunks
}

fn prompt(words: usize) -> String {
    (0..words)
        .map(|i| format!("w{}", 100 + i))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn chunks_follow_the_simulated_timeline() {
    let speed = 1.0;
    let server = ServerProc::start(&["--sim", &experiment(), "--speed", &speed.to_string()]);
    let want = offline_chunks(128, 40);
    let body = json!({"text": prompt(128), "stream": true,
        "sampling_params": {"max_new_tokens": 40, "temperature": 0, "ignore_eos": true}});
    let r = post(&server.addr, "/generate", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let chunks = r.event_json();
    assert_eq!(chunks.len(), want.len());
    let last = &chunks.last().unwrap()["meta_info"];
    assert_eq!(last["prompt_tokens"], 128);
    assert_eq!(last["spec_verify_ct"], json!(want.len() - 1));
    let mut seen = 0;
    let v0 = chunks[0]["meta_info"]["kbench_virtual_ns"]
        .as_u64()
        .unwrap();
    let (times, _): (Vec<_>, Vec<_>) = r
        .events
        .iter()
        .filter(|(_, e)| e != "[DONE]")
        .cloned()
        .unzip();
    let mut worst = Duration::ZERO;
    for (i, (c, (want_v, want_n))) in chunks.iter().zip(&want).enumerate() {
        let n = c["meta_info"]["completion_tokens"].as_u64().unwrap();
        assert_eq!(
            n - seen,
            *want_n as u64,
            "chunk {i}: the replayed round's tokens"
        );
        seen = n;
        // exactly the simulator's timeline, shifted to the request's arrival
        let v = c["meta_info"]["kbench_virtual_ns"].as_u64().unwrap();
        assert_eq!(v - v0, want_v - want[0].0, "chunk {i}: virtual time");
        // released at virtual time / speed
        let scheduled = Duration::from_secs_f64((v - v0) as f64 / 1e9 / speed);
        let actual = times[i].duration_since(times[0]);
        let off = actual.abs_diff(scheduled);
        worst = worst.max(off);
    }
    eprintln!(
        "worst release error over {} chunks: {worst:?}",
        chunks.len()
    );
    assert!(
        worst <= RELEASE_TOLERANCE,
        "a chunk was {worst:?} off its release time"
    );
    // the rounds took as long as the model says: more than 0.3 s of wall time at speed 1
    assert!(times.last().unwrap().duration_since(times[0]) > Duration::from_millis(300));

    // the modelled deployment
    let info = get(&server.addr, "/get_server_info").json();
    assert_eq!(info["kbench"]["mode"], "sim");
    assert_eq!(info["tp_size"], 8);
    assert_eq!(info["speculative_num_steps"], 2);
    assert_eq!(info["speculative_num_draft_tokens"], 3);
    assert_eq!(info["kbench"]["hardware"], "8x-rtx-pro-6000-server");
    let avg = info["internal_states"][0]["avg_spec_accept_length"]
        .as_f64()
        .unwrap();
    assert!((avg - 39.0 / (want.len() - 1) as f64).abs() < 1e-9);
}

#[test]
fn sim_serves_openai_and_concurrent_streams_at_speed() {
    let server = ServerProc::start(&["--sim", &experiment(), "--speed", "50"]);
    let r = post(
        &server.addr,
        "/v1/completions",
        &json!({"prompt": prompt(16), "max_tokens": 30,
        "stream": true, "ignore_eos": true, "stream_options": {"include_usage": true}})
        .to_string(),
    );
    assert_eq!(r.status, 200);
    assert!(r.done());
    let usage = r.event_json().last().unwrap()["usage"].clone();
    assert_eq!(usage["completion_tokens"], 30);
    // a served request has no shared prefix, so the modelled prefix cache serves none of it
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    let handles: Vec<_> = (0..12)
        .map(|i| {
            let addr = server.addr.clone();
            std::thread::spawn(move || {
                let body = json!({"text": prompt(8 + i), "stream": true,
                    "sampling_params": {"max_new_tokens": 20 + i, "ignore_eos": true}});
                post(&addr, "/generate", &body.to_string())
            })
        })
        .collect();
    let (mut rounds, mut tokens) = (0, 0);
    for h in handles {
        let meta = &finished_meta(&h.join().unwrap());
        rounds += meta["spec_verify_ct"].as_u64().unwrap();
        tokens += meta["completion_tokens"].as_u64().unwrap() - 1;
    }
    // the OpenAI request's rounds: its content chunks but the first (usage chunk aside)
    let openai_rounds = r.event_json().len() as u64 - 2;
    let metrics = get(&server.addr, "/metrics").text();
    let drafts = format!(
        "vllm:spec_decode_num_drafts_total{{model_name=\"kimi-k2.5\",engine=\"0\"}} {}",
        rounds + openai_rounds
    );
    assert!(metrics.contains(&drafts), "{drafts} not in\n{metrics}");
    let info = get(&server.addr, "/get_server_info").json();
    let avg = info["internal_states"][0]["avg_spec_accept_length"]
        .as_f64()
        .unwrap();
    let want = (tokens + 29) as f64 / (rounds + openai_rounds) as f64;
    assert!((avg - want).abs() < 1e-9, "{avg} vs {want}");
}

#[test]
fn sim_accepts_the_model_by_its_served_name_or_its_path() {
    let server = ServerProc::start(&[
        "--sim",
        &experiment(),
        "--speed",
        "50",
        "--served-model-name",
        "kimi-served",
    ]);
    // with --sim the model's path is its name in the experiment
    for model in ["kimi-served", "kimi-k2.5"] {
        let r = post(
            &server.addr,
            "/v1/completions",
            &json!({"model": model, "prompt": prompt(4), "max_tokens": 3}).to_string(),
        );
        assert_eq!(r.status, 200, "{model}: {}", r.text());
        assert_eq!(r.json()["model"], "kimi-served");
        assert_eq!(
            r.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
            0
        );
    }
    let r = post(
        &server.addr,
        "/v1/completions",
        &json!({"model": "kimi", "prompt": prompt(4), "max_tokens": 3}).to_string(),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    let models = get(&server.addr, "/v1/models").json();
    assert_eq!(models["data"].as_array().unwrap().len(), 1);
    assert_eq!(models["data"][0]["id"], "kimi-served");
    assert_eq!(models["data"][0]["root"], "kimi-k2.5");
}

/// kbench's own http client against the served simulator at speed 1 measures the TTFT the
/// simulator predicts for the same experiment: closed-loop clients reach the scheduler
/// after their last chunk, one after another, and wait for the forward in progress
/// (docs/cost-model.md, "The client"). Plain decoding, so both run the same rounds.
#[test]
fn real_clients_measure_the_ttft_the_simulator_predicts() {
    let path = format!("{}/experiments/baseline.toml", env!("CARGO_MANIFEST_DIR"));
    let set = [
        "benchmark.concurrency=[1, 2, 4, 8]",
        "benchmark.requests_per_level=16",
        "benchmark.warmup_requests=2",
        "workload.max_tokens=16",
    ];
    let mut args = vec!["--sim", path.as_str(), "--speed", "1"];
    for s in &set {
        args.extend(["--set", s]);
    }
    let server = ServerProc::start(&args);
    let mut sets: Vec<String> = set.iter().map(|s| s.to_string()).collect();
    let offline_exp = load_experiment(std::path::Path::new(&path), &sets)
        .unwrap()
        .remove(0)
        .experiment;
    sets.push(format!("backend.http.url=\"http://{}\"", server.addr));
    sets.push("backend.http.flush_cache=false".into());
    let served_exp = load_experiment(std::path::Path::new(&path), &sets)
        .unwrap()
        .remove(0)
        .experiment;
    let plan = kbench_core::harness::LoadPlan::from_experiment(&offline_exp);
    let mut progress = kbench_core::harness::NoProgress;
    let mut http = kbench_http::open(&served_exp).unwrap();
    let served = kbench_core::harness::run_levels(http.as_mut(), &plan, &mut progress).unwrap();
    let mut sim = kbench_sim::SimBackend::new(&offline_exp, None).unwrap();
    let offline = kbench_core::harness::run_levels(&mut sim, &plan, &mut progress).unwrap();
    for (s, o) in served.iter().zip(&offline) {
        assert_eq!(s.metrics.failed, 0, "{:?}", s.metrics.errors);
        let (measured, predicted) = (s.metrics.mean_ttft_ms, o.metrics.mean_ttft_ms);
        let error = predicted / measured - 1.0;
        assert!(
            error.abs() < 0.10,
            "C={}: served mean TTFT {measured:.1} ms, simulated {predicted:.1} ms ({:+.1}%)",
            s.concurrency,
            error * 100.0
        );
    }
}
