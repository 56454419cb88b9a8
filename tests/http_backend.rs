//! The `http` backend against `kbench serve`: the same tokens and rounds as the engine
//! backend on the same file, the simulator's throughput through a real server, and failures
//! counted, not fatal.

mod serve_support;

use std::path::{Path, PathBuf};

use kbench_core::experiment::{load_experiment, Experiment};
use kbench_core::harness::{run_levels, LevelResult, LoadPlan, NoProgress};
use serve_support::*;

fn tiny_experiment(dir: &Path, speculative: &str) -> PathBuf {
    let m = tiny_model().display().to_string();
    let text = format!(
        r#"
name = "http_test"
seed = 11
[model]
config = "{m}/config.json"
[hardware]
preset = "h200"
[server]
tp_size = 1
[draft]
config = "{m}/draft/config.json"
{speculative}
[workload]
max_tokens = 20
input_len_range = [8, 24]
[benchmark]
concurrency = [1, 3]
requests_per_level = 6
warmup_requests = 1
[backend]
kind = "engine"
[backend.engine]
model_dir = "{m}"
[backend.http]
ready_timeout_s = 5
request_timeout_s = 60
"#
    );
    let path = dir.join("exp.toml");
    std::fs::write(&path, text).unwrap();
    path
}

const CHAIN: &str =
    "[speculative]\nalgorithm = \"EAGLE3\"\nnum_steps = 3\neagle_topk = 1\nnum_draft_tokens = 4";

fn load(path: &Path, sets: &[String]) -> Experiment {
    load_experiment(path, sets).unwrap().remove(0).experiment
}

fn url(addr: &str) -> String {
    format!("backend.http.url=\"http://{addr}\"")
}

fn run(backend: &mut dyn kbench_core::backend::Backend, exp: &Experiment) -> Vec<LevelResult> {
    run_levels(
        backend,
        &LoadPlan::from_experiment(exp).keeping_records(),
        &mut NoProgress,
    )
    .unwrap()
}

#[test]
fn http_gives_the_engines_tokens_rounds_and_accept_length() {
    let server = spec_server(3, 1, 4, &[]);
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_experiment(dir.path(), CHAIN);
    let exp = load(&path, &[url(&server.addr)]);
    let engine = run(kbench_engine::open(&exp).unwrap().as_mut(), &exp);
    for api in ["sglang", "openai-completions"] {
        let exp = load(
            &path,
            &[url(&server.addr), format!("backend.http.api=\"{api}\"")],
        );
        let mut http = kbench_http::open(&exp).unwrap();
        let levels = run(http.as_mut(), &exp);
        assert!(
            http.describe().contains("EAGLE3 (3, 1, 4)"),
            "{}",
            http.describe()
        );
        for (e, h) in engine.iter().zip(&levels) {
            assert_eq!(h.metrics.failed, 0, "{api}: {:?}", h.metrics.errors);
            assert_eq!(h.metrics.total_output_tokens, e.metrics.total_output_tokens);
            assert_eq!(h.metrics.total_input_tokens, e.metrics.total_input_tokens);
            let mut er: Vec<_> = e
                .records
                .iter()
                .map(|r| (r.id, r.round_commits.clone()))
                .collect();
            let mut hr: Vec<_> = h
                .records
                .iter()
                .map(|r| (r.id, r.round_commits.clone()))
                .collect();
            er.sort();
            hr.sort();
            if api == "sglang" {
                // /generate reports spec_verify_ct: the chunk deltas are the engine's rounds
                assert_eq!(hr, er, "C={}", e.concurrency);
                assert_eq!(h.metrics.accept_length, e.metrics.accept_length);
            } else {
                // OpenAI streams say nothing of rounds: none are invented
                assert!(hr.iter().all(|(_, r)| r.is_empty()));
                assert_eq!(h.metrics.accept_length, None);
            }
        }
    }
    // vLLM's per-request metrics: `detailed` gives every round, `summary` the count
    for detail in ["detailed", "summary"] {
        let server = spec_server(3, 1, 4, &["--per-request-spec-decode-metrics", detail]);
        for api in ["openai-completions", "openai-chat"] {
            let exp = load(
                &path,
                &[url(&server.addr), format!("backend.http.api=\"{api}\"")],
            );
            let levels = run(kbench_http::open(&exp).unwrap().as_mut(), &exp);
            for (e, h) in engine.iter().zip(&levels) {
                assert_eq!(h.metrics.failed, 0, "{api}: {:?}", h.metrics.errors);
                // the server's own /metrics counters, read around the measured requests
                let counted = h.metrics.server_spec.as_ref().expect("vllm counters");
                assert_eq!(
                    counted.num_drafts, h.metrics.verify_rounds,
                    "{api} {detail}"
                );
                assert_eq!(counted.per_position_acceptance_rates.len(), 3);
                if api == "openai-completions" {
                    // the same prompts: the same rounds and accept length as the engine's
                    assert_eq!(h.metrics.verify_rounds, e.metrics.verify_rounds, "{detail}");
                    assert_eq!(h.metrics.accept_length, e.metrics.accept_length, "{detail}");
                } else {
                    // text in a chat template: other prompts, still every round counted
                    assert!(h.metrics.verify_rounds > 0 && h.metrics.accept_length.is_some());
                    assert_ne!(
                        h.metrics.total_input_tokens, e.metrics.total_input_tokens,
                        "the server counts the template and the text"
                    );
                }
                // detailed: from per_step_accepted; summary: from the chunk deltas, as
                // num_spec_steps says there is one chunk per round
                for r in &h.records {
                    assert!(!r.round_commits.is_empty(), "{api} {detail}");
                    if api == "openai-completions" {
                        let mine = &e
                            .records
                            .iter()
                            .find(|x| x.id == r.id)
                            .unwrap()
                            .round_commits;
                        assert_eq!(&r.round_commits, mine, "request {}", r.id);
                    }
                }
            }
        }
    }
}

#[test]
fn http_through_kbench_serve_sim_reproduces_the_simulators_throughput() {
    let exp_file = format!("{}/experiments/topk1_v2.toml", env!("CARGO_MANIFEST_DIR"));
    // 10x real time, not 20x: each chunk's HTTP and scheduling cost is a fixed wall-clock
    // amount, and at 20x (1.2 ms between chunks at C=1) two busy cores made it 6%
    let speed = 10.0;
    let server = ServerProc::start(&["--sim", &exp_file, "--speed", "10"]);
    let sets = [
        "benchmark.concurrency=[1, 8]".to_string(),
        "benchmark.requests_per_level=32".into(),
        "benchmark.warmup_requests=2".into(),
        "workload.max_tokens=120".into(),
    ];
    let sim_exp = load(Path::new(&exp_file), &sets);
    let predicted = run(kbench_sim::open(&sim_exp).unwrap().as_mut(), &sim_exp);
    let mut with_url = sets.to_vec();
    with_url.push(url(&server.addr));
    with_url.push("backend.http.flush_cache=false".into());
    let http_exp = load(Path::new(&exp_file), &with_url);
    let mut http = kbench_http::open(&http_exp).unwrap();
    let measured = run(http.as_mut(), &http_exp);
    // the report says the bound the server reports, here the one the simulator served
    assert_eq!(
        http.cuda_graph_bound(),
        Some(kbench_core::backend::CudaGraphBound::Requests(512))
    );
    for (p, m) in predicted.iter().zip(&measured) {
        let got = m.metrics.output_throughput / speed;
        let want = p.metrics.output_throughput;
        let err = (got - want) / want;
        eprintln!(
            "C={}: simulator {want:.1} tok/s, through the server {got:.1} tok/s ({:+.1}%)",
            p.concurrency,
            err * 100.0
        );
        assert!(
            err.abs() < 0.05,
            "C={}: {got:.1} vs {want:.1}",
            p.concurrency
        );
        let accept = m.metrics.accept_length.unwrap();
        assert!((accept - p.metrics.accept_length.unwrap()).abs() < 0.25);
    }
}

#[test]
fn failed_requests_are_counted_and_the_level_goes_on() {
    let m = tiny_model().display().to_string();
    let server = ServerProc::start(&[
        "--model",
        &m,
        "--fail-rate",
        "0.4",
        "--fail-kinds",
        "rate_limit,server_error,drop,malformed",
        "--fail-seed",
        "3",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_experiment(dir.path(), "");
    let exp = load(
        &path,
        &[url(&server.addr), "benchmark.requests_per_level=12".into()],
    );
    let levels = run(kbench_http::open(&exp).unwrap().as_mut(), &exp);
    let failed: u32 = levels.iter().map(|l| l.metrics.failed).sum();
    let completed: u32 = levels.iter().map(|l| l.metrics.completed).sum();
    assert!(
        failed > 0 && completed > 0,
        "failed {failed}, completed {completed}"
    );
    assert_eq!(failed + completed, 24);
    let errors: Vec<String> = levels
        .iter()
        .flat_map(|l| l.metrics.errors.clone())
        .collect();
    assert!(
        errors.iter().any(|e| e.starts_with("HTTP 429")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("connection broke")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("malformed server-sent event")),
        "{errors:?}"
    );
    for e in &errors {
        assert!(
            e.starts_with("HTTP 429")
                || e.starts_with("HTTP 500")
                || e.contains("connection broke")
                || e.starts_with("malformed server-sent event"),
            "{e}"
        );
    }
    for l in &levels {
        assert!(l
            .records
            .iter()
            .filter(|r| r.error.is_none())
            .all(|r| r.output_tokens() == 20));
    }
}

#[test]
fn a_server_that_runs_other_settings_or_is_not_there_stops_the_run_clearly() {
    let server = spec_server(2, 1, 3, &[]);
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_experiment(dir.path(), CHAIN);
    let exp = load(&path, &[url(&server.addr)]);
    let mut http = kbench_http::open(&exp).unwrap();
    let err = run_levels(
        http.as_mut(),
        &LoadPlan::from_experiment(&exp).keeping_records(),
        &mut NoProgress,
    )
    .unwrap_err();
    let chain = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    insta::assert_snapshot!("http_speculative_mismatch", chain);
    // the override runs it anyway
    let exp = load(
        &path,
        &[
            url(&server.addr),
            "backend.http.allow_mismatch=true".into(),
            "benchmark.concurrency=[1]".into(),
        ],
    );
    assert!(run_levels(
        kbench_http::open(&exp).unwrap().as_mut(),
        &LoadPlan::from_experiment(&exp).keeping_records(),
        &mut NoProgress
    )
    .is_ok());

    // nothing listening: bounded, named
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap().to_string();
    drop(closed);
    let exp = load(
        &path,
        &[url(&addr), "backend.http.ready_timeout_s=1".into()],
    );
    let started = std::time::Instant::now();
    let err = run_levels(
        kbench_http::open(&exp).unwrap().as_mut(),
        &LoadPlan::from_experiment(&exp).keeping_records(),
        &mut NoProgress,
    )
    .unwrap_err();
    let msg = std::error::Error::source(&err).unwrap().to_string();
    assert!(msg.contains("nothing listens at"), "{msg}");
    // refused at once, not after the ready timeout
    assert!(started.elapsed() < std::time::Duration::from_millis(900));

    // a port that accepts and never answers: waited for, announced, bounded, named
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let exp = load(
        &path,
        &[url(&addr), "backend.http.ready_timeout_s=1".into()],
    );
    let mut http = kbench_http::open(&exp).unwrap();
    let said = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = said.clone();
    http.set_notice(Box::new(move |m| sink.lock().unwrap().push(m.to_string())));
    let started = std::time::Instant::now();
    let err = run_levels(
        http.as_mut(),
        &LoadPlan::from_experiment(&exp).keeping_records(),
        &mut NoProgress,
    )
    .unwrap_err();
    let msg = std::error::Error::source(&err).unwrap().to_string();
    assert!(msg.contains("did not answer /health within 1 s"), "{msg}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let said = said.lock().unwrap();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].starts_with("waiting up to 1 s for the server"),
        "{said:?}"
    );
    drop(silent);

    // settings errors name the table
    let exp = load(&path, &["backend.http.api=\"grpc\"".into()]);
    let e = kbench_http::open(&exp).err().unwrap().to_string();
    assert!(e.starts_with("[backend.http]"), "{e}");
    let exp = load(&path, &[]);
    let e = kbench_http::open(&exp).err().unwrap().to_string();
    assert!(e.contains("no `url`"), "{e}");
}

#[test]
fn the_api_key_comes_from_the_environment_and_never_shows() {
    let m = tiny_model().display().to_string();
    let server = ServerProc::start(&["--model", &m, "--api-key", "s3cret-key"]);
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_experiment(dir.path(), "");
    std::env::set_var("KBENCH_HTTP_TEST_KEY", "s3cret-key");
    let sets = [url(&server.addr), "benchmark.concurrency=[2]".into()];
    let mut keyed = sets.to_vec();
    keyed.push("backend.http.api_key_env=\"KBENCH_HTTP_TEST_KEY\"".into());
    let exp = load(&path, &keyed);
    let mut http = kbench_http::open(&exp).unwrap();
    let levels = run(http.as_mut(), &exp);
    assert_eq!(
        levels[0].metrics.failed, 0,
        "{:?}",
        levels[0].metrics.errors
    );
    assert!(!http.describe().contains("s3cret"));
    // without it the server refuses before the level starts, and the run stops saying so
    let exp = load(&path, &sets);
    let err = run_levels(
        kbench_http::open(&exp).unwrap().as_mut(),
        &LoadPlan::from_experiment(&exp).keeping_records(),
        &mut NoProgress,
    )
    .unwrap_err();
    let msg = std::error::Error::source(&err).unwrap().to_string();
    assert!(msg.contains("HTTP 401") && !msg.contains("s3cret"), "{msg}");
    // with flushing off, each request is refused and counted with the server's reason
    let mut no_flush = sets.to_vec();
    no_flush.push("backend.http.flush_cache=false".into());
    let exp = load(&path, &no_flush);
    let levels = run(kbench_http::open(&exp).unwrap().as_mut(), &exp);
    assert_eq!(levels[0].metrics.completed, 0);
    assert!(levels[0]
        .metrics
        .errors
        .iter()
        .all(|e| e.starts_with("HTTP 401") && !e.contains("s3cret")));
    // a variable that is not set is named, the key never
    let mut unset = sets.to_vec();
    unset.push("backend.http.api_key_env=\"KBENCH_HTTP_TEST_UNSET\"".into());
    let e = kbench_http::open(&load(&path, &unset))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("KBENCH_HTTP_TEST_UNSET"), "{e}");
}

#[test]
fn http_tiny_launches_its_server_runs_stops_it_and_predicts() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kbench"))
        .current_dir(root)
        .args(["experiment", "experiments/http_tiny.toml", "--predict"])
        .args(["--set", "benchmark.requests_per_level=4"])
        .args([
            "--set",
            "backend.http.launch.command=[\"kbench-test-placeholder\"]",
        ])
        .output()
        .unwrap();
    // a command that does not exist is named
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot start `kbench-test-placeholder`"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kbench"))
        .current_dir(root)
        .args(["experiment", "experiments/http_tiny.toml", "--predict"])
        .args(["--set", "benchmark.requests_per_level=4"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("launched `"), "{stdout}");
    assert!(
        stdout.contains("measured (http) vs predicted (sim)"),
        "{stdout}"
    );
    // the launched server is gone: its port no longer answers
    let port: u16 = stdout
        .split("http://127.0.0.1:")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .expect("the report names the port");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the server was left running"
    );
    // a run where nothing failed leaves no log behind in the temporary directory
    // the report wraps its lines: the path may start the line after "(log"
    let log = stdout
        .split("(log")
        .nth(1)
        .and_then(|s| s.trim_start().split(',').next())
        .expect("the report names the log");
    assert!(log.ends_with(".server.log"), "{log}");
    assert!(!Path::new(log).exists(), "{log} was left behind");
}

#[test]
fn sglang_args_prints_what_the_file_implies() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = kbench(&[
        "sglang-args",
        root.join("experiments/topk1_v2.toml").to_str().unwrap(),
    ]);
    assert!(
        out.starts_with("SGLANG_ENABLE_SPEC_V2=True python3 -m sglang.launch_server"),
        "{out}"
    );
    assert!(!out.contains("--disable-overlap-schedule"), "{out}");
    for flag in [
        "--tp-size 8",
        "--speculative-algorithm EAGLE3",
        "--speculative-num-steps 2",
        "--speculative-eagle-topk 1",
        "--speculative-num-draft-tokens 3",
        "--model-path moonshotai/Kimi-K2.5",
    ] {
        assert!(out.contains(flag), "{flag} missing: {out}");
    }
    let out = kbench(&[
        "sglang-args",
        root.join("experiments/tree_vs_chain.toml")
            .to_str()
            .unwrap(),
        "--variant",
        "tree-topk4",
    ]);
    assert!(
        out.contains("# variant tree-topk4") && out.contains("--speculative-eagle-topk 4"),
        "{out}"
    );
    assert!(!out.contains("SGLANG_ENABLE_SPEC_V2"), "{out}");
    // v1 also on an SGLang whose default is the overlapped v2 worker
    assert!(out.contains("--disable-overlap-schedule"), "{out}");
    // simulated acceptance: the accept length the simulator replays for (2, 1, 3)
    let file = root.join("experiments/topk1_v2.toml");
    let out = kbench(&[
        "sglang-args",
        file.to_str().unwrap(),
        "--set",
        "backend.http.launch.acceptance=\"simulate\"",
    ]);
    let exp = load(&file, &[]);
    let trace = kbench_core::trace::read(exp.trace.as_ref().unwrap()).unwrap();
    let shape = kbench_core::tree::TreeShape::new(2, 1, 3).unwrap();
    let want = kbench_core::trace::accept_length(&trace, &shape)
        .unwrap()
        .per_round;
    assert!(
        out.contains(&format!(
            "SGLANG_SIMULATE_ACC_LEN={want:.3} SGLANG_SIMULATE_ACC_METHOD=match-expected"
        )),
        "{out}"
    );
    assert!(want > 1.5 && want < 3.0, "{want}");
}

#[test]
fn vllm_args_simulates_acceptance_with_vllms_synthetic_sampler() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let file = root.join("data/validation/experiments/kimi-k2.6-rtx-pro-6000-vllm-decode.toml");
    let sets = [
        "speculative.method=\"eagle3\"",
        "speculative.num_speculative_tokens=3",
        "workload.accept_length=2.155",
    ];
    let args = |extra: &[&str]| {
        let mut a = vec!["vllm-args", file.to_str().unwrap()];
        for s in sets.iter().chain(extra) {
            a.extend(["--set", s]);
        }
        kbench(&a)
    };
    let plain = args(&[]);
    assert!(
        plain.contains(r#""model":"lightseekorg/kimi-k2.5-eagle3-mla""#),
        "{plain}"
    );
    assert!(!plain.contains("synthetic"), "{plain}");
    let out = args(&["backend.http.launch.acceptance=\"simulate\""]);
    assert!(
        out.contains(
            r#""rejection_sample_method":"synthetic","synthetic_acceptance_length":2.155"#
        ),
        "{out}"
    );
}

/// Kills the server once the second level has finished its first two requests.
struct KillMidLevel {
    server: Option<ServerProc>,
    second: u32,
}

impl kbench_core::harness::Progress for KillMidLevel {
    fn request_finished(&mut self, concurrency: u32, done: u32, _total: u32) {
        if concurrency == self.second && done == 2 {
            self.server.take();
        }
    }
}

#[test]
fn a_server_killed_mid_level_stops_the_run_with_the_finished_levels_kept() {
    let server = ServerProc::start(&["--model", tiny_model().to_str().unwrap()]);
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_experiment(dir.path(), "");
    let exp = load(
        &path,
        &[url(&server.addr), "benchmark.requests_per_level=30".into()],
    );
    let mut http = kbench_http::open(&exp).unwrap();
    let started = std::time::Instant::now();
    let run = kbench_core::harness::run_levels_until_stopped(
        http.as_mut(),
        &LoadPlan::from_experiment(&exp).keeping_records(),
        &mut KillMidLevel {
            server: Some(server),
            second: 3,
        },
    );
    assert_eq!(run.levels.len(), 1, "the first level finished");
    assert_eq!(run.levels[0].metrics.failed, 0);
    let err = run.stopped.expect("the run stopped");
    let msg = std::error::Error::source(&err).unwrap().to_string();
    assert!(msg.contains("stopped answering mid-level"), "{msg}");
    assert!(msg.contains("/health: cannot connect"), "{msg}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
}

/// A value from the server's own `/metrics`.
fn server_metric(addr: &str, name: &str) -> u64 {
    get(addr, "/metrics")
        .text()
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

/// `kbench experiment --server-url` against a simulated server in real time (speed 1):
/// level C=1 is two requests of 200 tokens (about 5 s), level C=2 two more at once (about
/// 2.5 s); whatever stops it once the first two are served leaves a report of C=1 alone,
/// marked partial.
fn run_cli_and_stop_it(
    stop: impl FnOnce(&mut std::process::Child, ServerProc) -> Option<ServerProc>,
) -> (i32, String, serde_json::Value) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exp_file = root.join("experiments/topk1_v2.toml");
    let server = ServerProc::start(&["--sim", exp_file.to_str().unwrap(), "--speed", "1"]);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kbench"))
        .args(["experiment", exp_file.to_str().unwrap(), "-q"])
        .args(["--server-url", &format!("http://{}", server.addr)])
        .args(["--concurrency", "1", "--concurrency", "2"])
        .args(["--set", "benchmark.requests_per_level=2"])
        .args(["--set", "benchmark.warmup_requests=0"])
        .args(["--set", "workload.max_tokens=200"])
        .args(["--set", "backend.http.flush_cache=false"])
        .arg("--json")
        .arg(&json)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    // C=1 served, and C=2's requests running (not between levels, where a missing server
    // is waited for as one that is still loading)
    while server_metric(&server.addr, "vllm:request_success_total") < 2
        || server_metric(&server.addr, "sglang:num_running_reqs") == 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "level C=2 never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // a server the stop keeps answers until the client has exited
    let _kept = stop(&mut child, server);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("kbench experiment did not stop");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).unwrap_or_default())
            .unwrap_or_else(|e| panic!("no report ({e}); stderr: {stderr}"));
    (status.code().unwrap_or(-1), stderr, report)
}

#[test]
fn a_dead_server_or_ctrl_c_leaves_a_partial_report_of_the_finished_levels() {
    // the server dies: one clear error, exit code 4
    let (code, stderr, report) = run_cli_and_stop_it(|_, server| {
        drop(server);
        None
    });
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("stopped answering mid-level"), "{stderr}");
    assert!(stderr.contains("marked partial"), "{stderr}");
    let levels: Vec<u64> = report["levels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["concurrency"].as_u64().unwrap())
        .collect();
    assert_eq!(levels, [1]);
    assert!(report["partial"]
        .as_str()
        .unwrap()
        .contains("stopped answering"));
    // Ctrl-C: exit code 130, the same partial report
    let (code, stderr, report) = run_cli_and_stop_it(|child, server| {
        let _ = std::process::Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
        Some(server)
    });
    assert_eq!(code, 130, "{stderr}");
    assert_eq!(report["levels"].as_array().unwrap().len(), 1);
    assert_eq!(report["partial"], "interrupted by Ctrl-C");
}

#[test]
fn trace_record_from_a_live_server_writes_what_its_rounds_showed() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_experiment(dir.path(), CHAIN);
    let server = spec_server(3, 1, 4, &[]);
    let out = dir.path().join("live.kbt");
    let record = |server: &ServerProc, sets: &[&str], out: &Path| {
        let mut args = vec![
            "trace".to_string(),
            "record".into(),
            "--experiment".into(),
            path.display().to_string(),
            "--server-url".into(),
            format!("http://{}", server.addr),
            "-o".into(),
            out.display().to_string(),
        ];
        for s in sets {
            args.push("--set".into());
            args.push(s.to_string());
        }
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_kbench"))
            .args(&args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let said = record(&server, &[], &out);
    assert!(
        said.contains("chain (exact accept/miss per round) server (3, 1, 4)"),
        "{said}"
    );
    let t = kbench_core::trace::read(&out).unwrap();
    let observed = t.header.observed.clone().unwrap();
    assert_eq!(observed.kind, kbench_core::trace::ObservedKind::ChainRounds);
    // every request of both levels (warm-up included), each the engine's 20 tokens after
    // the prefill's first
    assert_eq!(t.sequences.len(), 2 * (6 + 1));
    assert!(t.sequences.iter().all(|s| s.positions(3) >= 19));

    // the simulator replays it within what was observed, and refuses deeper chains
    let exp = load(&path, &[format!("workload.trace=\"{}\"", out.display())]);
    let levels = run(kbench_sim::open(&exp).unwrap().as_mut(), &exp);
    let replayed = levels[0].metrics.accept_length.unwrap();
    let recorded = said
        .split("accept length ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap();
    assert!(
        (replayed - recorded).abs() < 0.4,
        "{replayed} vs {recorded}"
    );
    let deeper = load(
        &path,
        &[
            format!("workload.trace=\"{}\"", out.display()),
            "speculative.num_steps=4".into(),
            "speculative.num_draft_tokens=5".into(),
        ],
    );
    let err = kbench_sim::open(&deeper).err().unwrap();
    insta::assert_snapshot!(
        "live_trace_deeper_than_observed",
        kbench_core::error_chain::Chain(&err)
            .to_string()
            .replace(&out.display().to_string(), "live.kbt")
    );

    // a tree server: accept lengths only, replayed for its own shape alone
    let tree = spec_server(2, 2, 4, &[]);
    let tree_out = dir.path().join("tree.kbt");
    let tree_sets = [
        "speculative.num_steps=2",
        "speculative.eagle_topk=2",
        "speculative.num_draft_tokens=4",
    ];
    let said = record(&tree, &tree_sets, &tree_out);
    assert!(
        said.contains("tree (accept lengths only) server (2, 2, 4)"),
        "{said}"
    );
    let mut same: Vec<String> = tree_sets.iter().map(|s| s.to_string()).collect();
    same.push(format!("workload.trace=\"{}\"", tree_out.display()));
    assert!(kbench_sim::open(&load(&path, &same)).is_ok());
    let other = load(
        &path,
        &[format!("workload.trace=\"{}\"", tree_out.display())],
    );
    let err = kbench_sim::open(&other).err().unwrap();
    let msg = std::error::Error::source(&err).unwrap().to_string();
    assert!(
        msg.contains("replays that configuration, not (3, 1, 4)"),
        "{msg}"
    );
}

#[test]
fn every_http_backend_error_message_is_pinned() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_experiment(dir.path(), CHAIN);
    let file = path.display().to_string();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let http = "backend.kind=\"http\"".to_string();
    let url_of = |u: &str| format!("backend.http.url=\"{u}\"");
    let plain_dir = tempfile::tempdir().unwrap();
    let plain = tiny_experiment(plain_dir.path(), "").display().to_string();
    let cases: Vec<(&str, Vec<String>)> = vec![
        (
            "no url",
            vec![
                "validate".into(),
                file.clone(),
                "--set".into(),
                "backend.kind=\"http\"".into(),
            ],
        ),
        (
            "unknown api",
            vec![
                "validate".into(),
                file.clone(),
                "--set".into(),
                http.clone(),
                "--set".into(),
                url_of(&dead),
                "--set".into(),
                "backend.http.api=\"grpc\"".into(),
            ],
        ),
        (
            "unknown key",
            vec![
                "validate".into(),
                file.clone(),
                "--set".into(),
                http.clone(),
                "--set".into(),
                url_of(&dead),
                "--set".into(),
                "backend.http.timeout=3".into(),
            ],
        ),
        (
            "bad url",
            vec![
                "validate".into(),
                file.clone(),
                "--set".into(),
                http.clone(),
                "--set".into(),
                url_of("https://example.com:x"),
            ],
        ),
        (
            "zero timeout",
            vec![
                "validate".into(),
                file.clone(),
                "--set".into(),
                http.clone(),
                "--set".into(),
                url_of(&dead),
                "--set".into(),
                "backend.http.request_timeout_s=0".into(),
            ],
        ),
        (
            "unset key variable",
            vec![
                "validate".into(),
                file.clone(),
                "--set".into(),
                http.clone(),
                "--set".into(),
                url_of(&dead),
                "--set".into(),
                "backend.http.api_key_env=\"KBENCH_SNAPSHOT_UNSET\"".into(),
            ],
        ),
        (
            "server-url with another backend",
            vec![
                "experiment".into(),
                file.clone(),
                "--server-url".into(),
                dead.clone(),
                "--backend".into(),
                "sim".into(),
            ],
        ),
        (
            "nothing listening",
            vec![
                "experiment".into(),
                file.clone(),
                "--server-url".into(),
                dead.clone(),
                "--set".into(),
                "backend.http.ready_timeout_s=0.5".into(),
            ],
        ),
        (
            "launch command missing",
            vec![
                "experiment".into(),
                file.clone(),
                "--server-url".into(),
                "http://127.0.0.1:0".into(),
                "--set".into(),
                "backend.http.launch.command=[\"kbench-no-such-server\"]".into(),
            ],
        ),
        (
            "simulated acceptance without speculation",
            vec![
                "sglang-args".into(),
                plain.clone(),
                "--set".into(),
                "backend.http.launch.acceptance=\"simulate\"".into(),
            ],
        ),
        (
            "unknown acceptance",
            vec![
                "sglang-args".into(),
                file.clone(),
                "--set".into(),
                "backend.http.launch.acceptance=\"oracle\"".into(),
            ],
        ),
    ];
    let mut pinned = String::new();
    for (label, args) in cases {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kbench"))
            .args(&args)
            .env_remove("KBENCH_SNAPSHOT_UNSET")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr)
            .replace(&dead, "http://127.0.0.1:PORT")
            .replace(&file, "exp.toml")
            .replace(&plain, "plain.toml")
            .replace(&dir.path().display().to_string(), "DIR");
        assert!(!stderr.contains("panicked"), "{label}: {stderr}");
        pinned.push_str(&format!(
            "## {label} (exit {})\n{}\n",
            out.status.code().unwrap_or(-1),
            stderr.trim_end()
        ));
    }
    insta::assert_snapshot!("http_error_messages", pinned);
}

#[test]
fn http_runs_rate_levels_with_drawn_lengths_and_a_shared_prefix() {
    let server = spec_server(3, 1, 4, &[]);
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_experiment(dir.path(), CHAIN);
    let sets = [
        url(&server.addr),
        "benchmark.concurrency=[]".to_string(),
        "benchmark.request_rate=[40.0, inf]".to_string(),
        "benchmark.max_concurrency=2".to_string(),
        "workload.output_len_range=[3, 15]".to_string(),
        "workload.shared_prefix_len=4".to_string(),
    ];
    let exp = load(&path, &sets);
    let plan = LoadPlan::from_experiment(&exp).keeping_records();
    let levels = run(kbench_http::open(&exp).unwrap().as_mut(), &exp);
    assert_eq!(levels.len(), 2);
    for l in &levels {
        let m = &l.metrics;
        assert_eq!(m.failed, 0, "{:?}", m.errors);
        assert_eq!(m.completed, 6);
        assert!(m.request_rate.is_some());
        assert!(m.max_concurrent_requests.unwrap() <= 2);
        for r in &l.records {
            let want = plan.workload.request(plan.seed, r.id);
            // the server generated exactly the drawn length, sent as max_new_tokens with
            // ignore_eos
            assert_eq!(r.output_tokens(), want.max_tokens, "request {}", r.id);
            assert_eq!(r.requested_tokens, want.max_tokens);
            assert_eq!(r.input_len, want.input_len);
        }
    }
    assert!(levels[1].metrics.p99_queue_delay_ms.unwrap() > 0.0);
}

/// A level where every request failed measured nothing: the run says so and exits 4 (a
/// backend failure), after writing the report with the reasons. It used to exit 0 with a
/// report of zeros.
#[test]
fn a_run_where_every_request_failed_exits_as_a_backend_failure() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exp_file = root.join("experiments/topk1_v2.toml");
    let server = ServerProc::start(&[
        "--sim",
        exp_file.to_str().unwrap(),
        "--speed",
        "1000",
        "--fail-rate",
        "1",
        "--fail-kinds",
        "server_error",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kbench"))
        .args(["experiment", exp_file.to_str().unwrap()])
        .args(["--server-url", &format!("http://{}", server.addr)])
        .args(["--concurrency", "1"])
        .args(["--set", "benchmark.requests_per_level=2"])
        .args(["--set", "benchmark.warmup_requests=0"])
        .args(["--set", "backend.http.flush_cache=false"])
        .arg("--no-predict")
        .arg("--json")
        .arg(&json)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("kbench runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains("every request failed at topk1_v2 C=1 (2 failed)")
            && stderr.contains("HTTP 500"),
        "{stderr}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let level = &report["levels"][0];
    assert_eq!(level["failed"], 2, "{report}");
    // nothing completed, so no latency was measured: null, never 0
    for key in [
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_tpot_ms",
        "median_e2e_latency_ms",
    ] {
        assert!(level[key].is_null(), "{key}: {}", level[key]);
    }
    assert_eq!(level["output_throughput"], 0.0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // the table's done column counts the failed ones too
    assert!(
        stdout
            .lines()
            .any(|l| l.trim_start().starts_with("1  0 of 2 ")),
        "{stdout}"
    );
    assert!(
        stdout.contains("saturation: none (no request completed)")
            && stdout.contains("(no request completed at C=1)"),
        "{stdout}"
    );
    // and no reference error is computed from it
    let points = report["reference"]["points"].as_array().unwrap();
    let at_c1: Vec<_> = points.iter().filter(|p| p["concurrency"] == 1).collect();
    assert!(!at_c1.is_empty());
    for p in at_c1 {
        assert!(p["error_pct"].is_null(), "{p}");
        assert_eq!(p["not_compared"], "no request completed at C=1", "{p}");
    }
    // the report reads back, and a comparison shows no difference it cannot know
    let compared = std::process::Command::new(env!("CARGO_BIN_EXE_kbench"))
        .args(["compare", json.to_str().unwrap(), json.to_str().unwrap()])
        .output()
        .expect("kbench runs");
    let table = String::from_utf8_lossy(&compared.stdout);
    assert!(compared.status.success(), "{table}");
    assert!(!table.contains("-100"), "{table}");
}

#[test]
fn sglang_args_launches_nextn_from_the_models_own_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nextn.toml");
    std::fs::write(
        &file,
        "name = \"dsv3\"\n[model]\npreset = \"deepseek-v3\"\n[hardware]\npreset = \"8x-h200\"\n\
         [server]\ntp_size = 8\n[speculative]\nalgorithm = \"NEXTN\"\nnum_steps = 3\n\
         eagle_topk = 1\nnum_draft_tokens = 4\nspec_v2 = true\n[workload]\naccept_length = 2.4\n\
         max_tokens = 64\ninput_len = 64\n[benchmark]\nconcurrency = [1]\nrequests_per_level = 4\n",
    )
    .unwrap();
    let out = kbench(&["sglang-args", file.to_str().unwrap()]);
    for flag in [
        "--model-path deepseek-ai/DeepSeek-V3",
        "--speculative-algorithm NEXTN",
        "--speculative-num-steps 3",
        "--speculative-num-draft-tokens 4",
    ] {
        assert!(out.contains(flag), "{flag} missing: {out}");
    }
    // SGLang takes the draft from the model path for NEXTN
    assert!(!out.contains("--speculative-draft-model-path"), "{out}");
}
