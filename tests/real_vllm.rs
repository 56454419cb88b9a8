//! The http backend against a real vLLM: vLLM's CPU build serving a tiny random Llama,
//! plain and with n-gram speculation; and vLLM's own benchmark client against
//! `kbench serve`. `scripts/real-vllm.sh` installs both and runs these
//! (`.ci/run` does); without them they are ignored, never passed. Each test starts its own
//! `vllm serve` on a free loopback port and stops its whole process group.

mod common;
mod serve_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A cold start compiles the model (160-175 s on a loaded 2-core machine, vllm-cpu.md).
const START_LIMIT: Duration = Duration::from_secs(600);
const REQUESTS: u32 = 8;
const INPUT: u32 = 32;
const OUTPUT: u32 = 24;

fn vllm_bin() -> PathBuf {
    PathBuf::from(std::env::var("KBENCH_VLLM").expect("KBENCH_VLLM: the vllm command"))
}

fn model_dir() -> PathBuf {
    PathBuf::from(std::env::var("KBENCH_VLLM_MODEL").expect("KBENCH_VLLM_MODEL: the tiny model"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// One `vllm serve`, stopped (its engine and workers too) when dropped.
struct Vllm {
    child: Child,
    addr: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Vllm {
    fn start(extra: &[&str]) -> Vllm {
        Vllm::start_with(extra, &[])
    }

    fn start_with(extra: &[&str], env: &[(&str, &str)]) -> Vllm {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("vllm.log");
        let port = free_port();
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(vllm_bin())
            .arg("serve")
            .arg(model_dir())
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--max-model-len", "2048", "--seed", "0"])
            .args(extra)
            .env("HF_HUB_OFFLINE", "1")
            .env("VLLM_CPU_KVCACHE_SPACE", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            // its own group, so the engine core and workers it spawns stop with it
            .process_group(0)
            .spawn()
            .expect("vllm starts");
        let mut v = Vllm {
            child,
            addr: format!("127.0.0.1:{port}"),
            log,
            _dir: dir,
        };
        v.wait_healthy();
        v
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    fn wait_healthy(&mut self) {
        let started = Instant::now();
        while started.elapsed() < START_LIMIT {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("vllm serve exited ({status}):\n{}", self.log_tail());
            }
            if get(&self.addr, "/health").0 == 200 {
                eprintln!(
                    "vllm serve healthy at {} after {:.0} s",
                    self.addr,
                    started.elapsed().as_secs_f64()
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        panic!(
            "vllm serve not healthy within {START_LIMIT:?}:\n{}",
            self.log_tail()
        );
    }

    /// The sum of a `/metrics` counter over its label sets.
    fn counter(&self, name: &str) -> f64 {
        let (status, text) = get(&self.addr, "/metrics");
        assert_eq!(status, 200, "{text}");
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| l.split(['{', ' ']).next() == Some(name))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Vllm {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
    }
}

/// A bounded blocking GET: (status, body); status 0 when nothing answered.
fn get(addr: &str, path: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(2))
    else {
        return (0, String::new());
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return (0, String::new());
    }
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_string())
}

/// An experiment on the tiny model: `http` adds `[backend.http]` keys; `ngram`, the
/// file's side of [`NGRAM`] (its trace only feeds `--predict`: the server accepts).
fn experiment(dir: &Path, url: &str, http: &str, ngram: bool) -> PathBuf {
    let m = model_dir().display().to_string();
    let (speculative, trace) = if ngram {
        let trace = common::repo_root().join("traces/ngram-illustrative.synth.kbt");
        (
            "[speculative]\nmethod = \"ngram\"\nnum_speculative_tokens = 3\nprompt_lookup_min = 2\nprompt_lookup_max = 4",
            format!("trace = \"{}\"", trace.display()),
        )
    } else {
        ("", String::new())
    };
    let text = format!(
        r#"name = "real_vllm"
seed = 7
[model]
config = "{m}/config.json"
[hardware]
preset = "h200"
[engine]
name = "vllm"
[server]
tp_size = 1
[workload]
max_tokens = {OUTPUT}
input_len = {INPUT}
{trace}
{speculative}
[benchmark]
concurrency = [1, 4]
requests_per_level = {REQUESTS}
warmup_requests = 0
[backend]
kind = "http"
[backend.http]
url = "{url}"
ready_timeout_s = 30
request_timeout_s = 120
{http}
"#
    );
    // each file its own name: a test keeps several at once
    static WRITTEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = WRITTEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("exp-{n}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// `kbench experiment FILE --json OUT ARGS`: (exit code, stdout + stderr, report).
fn run(dir: &Path, file: &Path, args: &[&str]) -> (i32, String, Option<Value>) {
    let json = dir.join("report.json");
    let _ = std::fs::remove_file(&json);
    let (file, json_s) = (file.display().to_string(), json.display().to_string());
    let mut all = vec!["experiment", file.as_str(), "--json", json_s.as_str()];
    all.extend_from_slice(args);
    let (code, out, err) = common::kbench(dir, &all);
    let report = std::fs::read_to_string(&json)
        .ok()
        .map(|t| serde_json::from_str(&t).unwrap());
    (code, format!("{out}\n{err}"), report)
}

const NGRAM: &str =
    r#"{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4,"prompt_lookup_min":2}"#;
#[test]
#[ignore = "needs a real vLLM: scripts/real-vllm.sh installs it and runs these"]
fn plain_vllm_counts_tokens_exactly_in_both_apis_and_refuses_what_it_does_not_serve() {
    let v = Vllm::start(&[]);
    let dir = tempfile::tempdir().unwrap();

    // no api named: vLLM is found by /version and driven through its completions
    for (api, input_each) in [("", Some(INPUT)), ("openai-chat", None)] {
        let extra = if api.is_empty() {
            String::new()
        } else {
            format!("api = \"{api}\"")
        };
        let file = experiment(dir.path(), &v.url(), &extra, false);
        let (prompt0, gen0) = (
            v.counter("vllm:prompt_tokens_total"),
            v.counter("vllm:generation_tokens_total"),
        );
        let (code, out, report) = run(dir.path(), &file, &[]);
        assert_eq!(code, 0, "{out}");
        let report = report.unwrap();
        let backend = backend_line(&report);
        assert!(backend.contains("vLLM 0.32"), "{backend}");
        if api.is_empty() {
            assert!(
                backend.contains("OpenAI /v1/completions (the server's own"),
                "{backend}"
            );
        }
        let levels = report["levels"].as_array().unwrap();
        let (mut input, mut output) = (0u64, 0u64);
        for l in levels {
            assert_eq!(l["completed"], REQUESTS, "{l}");
            assert_eq!(
                l["total_output_tokens"].as_u64(),
                Some(u64::from(REQUESTS * OUTPUT))
            );
            if let Some(each) = input_each {
                assert_eq!(
                    l["total_input_tokens"].as_u64(),
                    Some(u64::from(REQUESTS * each))
                );
            }
            input += l["total_input_tokens"].as_u64().unwrap();
            output += l["total_output_tokens"].as_u64().unwrap();
        }
        // what kbench counted is what the server counted
        assert_eq!(
            v.counter("vllm:prompt_tokens_total") - prompt0,
            input as f64,
            "{api}"
        );
        assert_eq!(
            v.counter("vllm:generation_tokens_total") - gen0,
            output as f64,
            "{api}"
        );
    }

    // a model the server does not serve: refused before the first request, with its list
    let file = experiment(dir.path(), &v.url(), "model = \"nope\"", false);
    let (code, out, _) = run(dir.path(), &file, &[]);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("does not serve the model `nope`")
            && out.contains(&model_dir().display().to_string()),
        "{out}"
    );

    // SGLang's API against vLLM: every request fails, loudly
    let file = experiment(dir.path(), &v.url(), "api = \"sglang\"", false);
    let (code, out, _) = run(dir.path(), &file, &[]);
    assert_eq!(code, 4, "{out}");
    assert!(
        out.contains("every request failed") && out.contains("HTTP 404"),
        "{out}"
    );

    // a file with speculation against a server without
    let file = experiment(dir.path(), &v.url(), "", true);
    let (code, out, _) = run(dir.path(), &file, &[]);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("the file asks for num_speculative_tokens 3, the server runs no speculation"),
        "{out}"
    );
}

/// The report's backend line: the server as kbench identified it.
fn backend_line(report: &Value) -> &str {
    report["backend"]["description"]
        .as_str()
        .unwrap_or_default()
}

/// kbench's accept length and rounds against vLLM's own counters, over the same requests.
fn assert_counts_equal_the_servers(report: &Value) {
    for l in report["levels"].as_array().unwrap() {
        let server = &l["server_spec"];
        assert!(server.is_object(), "no server counters: {l}");
        assert_eq!(l["completed"], REQUESTS, "{l}");
        assert_eq!(l["verify_rounds"], server["num_drafts"], "{l}");
        assert_eq!(l["accept_length"], server["acceptance_length"], "{l}");
        let al = l["accept_length"].as_f64().unwrap();
        assert!((1.0..=4.0).contains(&al), "{l}");
    }
}

#[test]
#[ignore = "needs a real vLLM: scripts/real-vllm.sh installs it and runs these"]
fn ngram_vllm_with_detailed_metrics_agrees_with_its_counters_and_records_a_trace() {
    let v = Vllm::start(&[
        "--speculative-config",
        NGRAM,
        "--per-request-spec-decode-metrics",
        "detailed",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let file = experiment(dir.path(), &v.url(), "", true);
    let (code, out, report) = run(dir.path(), &file, &[]);
    assert_eq!(code, 0, "{out}");
    let report = report.unwrap();
    assert!(
        backend_line(&report).contains("speculation with num_speculative_tokens 3"),
        "{}",
        backend_line(&report)
    );
    assert_counts_equal_the_servers(&report);

    // the speculative settings are checked both ways
    let plain = experiment(dir.path(), &v.url(), "", false);
    let (code, out, _) = run(dir.path(), &plain, &[]);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("the file asks for no speculation, the server runs num_speculative_tokens 3"),
        "{out}"
    );
    let (code, out, _) = run(
        dir.path(),
        &file,
        &["--set", "speculative.num_speculative_tokens=2"],
    );
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("num_speculative_tokens 2, the server runs num_speculative_tokens 3"),
        "{out}"
    );

    // a trace from the live server: every recorded round is one vLLM verified
    let trace = dir.path().join("live.kbt");
    let (file_s, trace_s) = (file.display().to_string(), trace.display().to_string());
    let (code, out, err) = common::kbench(
        dir.path(),
        &["trace", "record", "--experiment", &file_s, "-o", &trace_s],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(std::fs::metadata(&trace).unwrap().len() > 0);
    let (code, info, err) = common::kbench(dir.path(), &["trace", "stats", &trace_s]);
    assert_eq!(code, 0, "{info}\n{err}");
    eprintln!("{out}\n{info}");
}

#[test]
#[ignore = "needs a real vLLM: scripts/real-vllm.sh installs it and runs these"]
fn ngram_vllm_with_summary_metrics_gives_the_accept_length_of_its_drafted_steps() {
    // development mode also serves vLLM's config (`/server_info`) and `/reset_prefix_cache`
    let v = Vllm::start_with(
        &[
            "--speculative-config",
            NGRAM,
            "--per-request-spec-decode-metrics",
            "summary",
        ],
        &[("VLLM_SERVER_DEV_MODE", "1")],
    );
    let dir = tempfile::tempdir().unwrap();
    let file = experiment(dir.path(), &v.url(), "", true);
    let (code, out, report) = run(dir.path(), &file, &[]);
    assert_eq!(code, 0, "{out}");
    let report = report.unwrap();
    let backend = backend_line(&report);
    assert!(
        backend.contains("ngram with num_speculative_tokens 3"),
        "{backend}"
    );
    assert_counts_equal_the_servers(&report);
}

/// `vllm bench serve`, the client vLLM users run, against `kbench serve --sim`: every
/// request completes with its exact lengths, and it reads the speculative counters kbench
/// serve keeps in vLLM's names.
#[test]
#[ignore = "needs a real vLLM: scripts/real-vllm.sh installs it and runs these"]
fn vllms_benchmark_client_drives_kbench_serve() {
    let exp = common::repo_root().join("experiments/topk1_v2.toml");
    let server =
        serve_support::ServerProc::start(&["--sim", exp.to_str().unwrap(), "--speed", "20"]);
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(vllm_bin())
        .args(["bench", "serve", "--backend", "vllm"])
        .args(["--base-url", &format!("http://{}", server.addr)])
        .arg("--tokenizer")
        .arg(model_dir())
        .args(["--dataset-name", "random", "--random-input-len", "32"])
        .args(["--random-output-len", "16", "--num-prompts", "8"])
        .args([
            "--max-concurrency",
            "2",
            "--ignore-eos",
            "--temperature",
            "0",
        ])
        .args([
            "--save-result",
            "--result-filename",
            "bench.json",
            "--disable-tqdm",
        ])
        .arg("--result-dir")
        .arg(dir.path())
        .env("HF_HUB_OFFLINE", "1")
        .stdin(Stdio::null())
        .output()
        .expect("vllm bench runs");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let result: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("bench.json")).unwrap())
            .unwrap();
    assert_eq!(result["completed"], 8, "{text}");
    assert_eq!(result["failed"], 0, "{text}");
    assert_eq!(result["total_input_tokens"], 8 * 32, "{text}");
    assert_eq!(result["total_output_tokens"], 8 * 16, "{text}");
    let al = result["spec_decode_acceptance_length"]
        .as_f64()
        .unwrap_or(0.0);
    assert!((1.0..=4.0).contains(&al), "{text}");
}

/// What `scripts/vllm_parse_args.py` says of `lines`, run by the vLLM install's python:
/// (exit code, one JSON verdict per line, stderr).
fn vllms_own_parser(lines: &str) -> (i32, Vec<Value>, String) {
    let python = vllm_bin().with_file_name("python");
    let mut child = Command::new(python)
        .arg(common::repo_root().join("scripts/vllm_parse_args.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the vLLM install's python runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(lines.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let verdicts = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (
        out.status.code().unwrap_or(-1),
        verdicts,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every line `kbench vllm-args` prints for the shipped vLLM experiments, the corpus's vLLM
/// deployments and a few settings they leave out (n-gram with its window, graphs off, a
/// token budget) is accepted by vLLM's own `vllm serve` parser, its engine arguments and the
/// cache, parallel and scheduler configs they build, its speculative methods and keys, and
/// its compilation config; a flag vLLM lacks, or a value its configs refuse, is not.
#[test]
#[ignore = "needs a real vLLM: scripts/real-vllm.sh installs it and runs these"]
fn vllm_args_lines_are_what_vllm_serve_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let root = common::repo_root();
    let extra = dir.path().join("more.toml");
    std::fs::write(
        &extra,
        r#"name = "more"
seed = 3
[model]
preset = "llama-3.1-8b"
[hardware]
preset = "h200"
[engine]
name = "vllm"
max_num_batched_tokens = 4096
[server]
tp_size = 1
cuda_graph_max_bs = 0
max_model_len = 8192
[speculative]
method = "ngram"
num_speculative_tokens = 4
prompt_lookup_min = 2
prompt_lookup_max = 4
[workload]
max_tokens = 64
input_len = 512
[benchmark]
concurrency = [1]
requests_per_level = 2
"#,
    )
    .unwrap();
    let mut files = vec![root.join("experiments/vllm_eagle3.toml"), extra];
    let mut corpus: Vec<PathBuf> = std::fs::read_dir(root.join("data/validation/experiments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    corpus.sort();
    files.extend(corpus);
    let mut lines = String::new();
    for file in &files {
        let (code, out, err) = common::kbench(dir.path(), &["vllm-args", file.to_str().unwrap()]);
        assert_eq!(code, 0, "{}: {err}", file.display());
        lines.push_str(&out);
    }
    let (code, verdicts, err) = vllms_own_parser(&lines);
    let rejected: Vec<&Value> = verdicts.iter().filter(|v| v["ok"] != true).collect();
    assert!(rejected.is_empty(), "{rejected:#?}\n{err}");
    assert_eq!(code, 0, "{err}");
    assert!(verdicts.len() >= files.len() + 4, "{verdicts:#?}");
    let (code, verdicts, _) = vllms_own_parser(
        "vllm serve m --max-num-seqs 4 --draft-depth 3\n\
         vllm serve m --gpu-memory-utilization 1.5\n\
         vllm serve m --max-num-batched-tokens 10 --max-num-seqs 128\n",
    );
    assert_eq!(code, 1);
    let errors: Vec<&str> = verdicts
        .iter()
        .map(|v| v["error"].as_str().unwrap())
        .collect();
    assert!(
        errors[0].contains("unrecognized arguments: --draft-depth"),
        "{errors:?}"
    );
    assert!(errors[1].contains("CacheConfig"), "{errors:?}");
    assert!(errors[2].contains("SchedulerConfig"), "{errors:?}");
}
