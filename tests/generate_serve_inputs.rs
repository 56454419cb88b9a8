//! `kbench generate` and `kbench serve` on inputs they cannot or should not take as given:
//! each is refused (or warned about) with one clear message, before any long run.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{kbench, repo_root};

/// The tiny model (target + draft), made once per test binary under cargo's scratch folder
/// for tests (a static TempDir would never be dropped, leaving a model in /tmp per run).
fn tiny() -> &'static Path {
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("generate_serve_inputs_tiny");
        let _ = std::fs::remove_dir_all(&d);
        let out = d.to_str().unwrap();
        let (code, _, err) = kbench(
            &repo_root(),
            &["model", "init", "--preset", "tiny", "--out", out],
        );
        assert_eq!(code, 0, "{err}");
        d
    })
    .as_path()
}

/// Runs `kbench ARGS`, killing it after `limit`: the bugs these tests guard against were
/// runs that never ended. Returns (exit code, stdout, stderr).
fn kbench_within(args: &[&str], limit: Duration) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kbench"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the kbench binary runs");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "kbench {args:?} still ran after {limit:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn generate_refuses_more_tokens_than_the_context_holds() {
    let m = tiny().to_str().unwrap();
    let (code, out, err) = kbench_within(
        &[
            "generate",
            "--model",
            m,
            "--prompt",
            "fabo",
            "--max-tokens",
            "300000",
        ],
        LIMIT,
    );
    // a usage error, as `kbench experiment --max-tokens 300000` refuses it
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty(), "{out}");
    for says in [
        "--max-tokens 300000",
        "300001 positions",
        "maximum context of 262144 tokens",
        "lower --max-tokens to 262143 or less",
    ] {
        assert!(err.contains(says), "{says}: {err}");
    }
}

#[test]
fn generate_warns_once_about_words_the_tokenizer_does_not_know() {
    let m = tiny().to_str().unwrap();
    let run = |prompt: &str| {
        kbench_within(
            &[
                "generate",
                "--model",
                m,
                "--prompt",
                prompt,
                "--max-tokens",
                "2",
                "--json",
            ],
            LIMIT,
        )
    };
    let (code, out, err) = run("hello world");
    assert_eq!(code, 0, "{err}");
    assert_eq!(err.matches("warning:").count(), 1, "{err}");
    for says in [
        "2 of the prompt's 2 tokens",
        "\"hello\", \"world\"",
        "<unk> (id 0)",
        "such as bo bu da",
    ] {
        assert!(err.contains(says), "{says}: {err}");
    }
    // the tokens are what they were; only stderr says so
    let v: serde_json::Value = serde_json::from_str(&out).expect(&out);
    assert_eq!(v["prompt_tokens"], serde_json::json!([0, 0]));

    let (code, _, err) = run("fabo bo");
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("warning"), "{err}");
}

#[test]
fn generate_names_a_target_folder_given_as_the_draft() {
    let m = tiny().to_str().unwrap();
    let (code, _, err) = kbench_within(
        &["generate", "--model", m, "--draft", m, "--prompt", "fabo"],
        LIMIT,
    );
    assert_eq!(code, 3, "{err}");
    for says in [
        &format!("{m} is not an EAGLE-3 draft checkpoint"),
        "found a target model's config",
        "kimi_k25",
        "caused by: ",
        "`hidden_size`",
    ] {
        assert!(err.contains(says), "{says}: {err}");
    }
}

#[test]
fn serve_refuses_a_batch_cap_of_zero() {
    let m = tiny().to_str().unwrap();
    // before the fix it served (until killed), reporting a cap of 1
    let (code, _, err) = kbench_within(
        &[
            "serve",
            "--model",
            m,
            "--port",
            "0",
            "--max-running-requests",
            "0",
        ],
        LIMIT,
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--max-running-requests 0: max_running_requests must be at least 1"),
        "{err}"
    );
}

#[test]
fn serve_without_a_source_names_both() {
    let (code, _, err) = kbench_within(&["serve"], LIMIT);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--model DIR") && err.contains("--sim FILE"),
        "{err}"
    );
}

/// A negative number reaches the flag's own check (clap would take `-1` for a flag) and is
/// refused there: no sampler has a temperature below 0, and no replay runs backwards.
#[test]
fn negative_temperature_and_speed_are_refused_by_their_own_checks() {
    let model = tiny().to_str().unwrap();
    let (code, _, err) = kbench_within(
        &[
            "generate",
            "--model",
            model,
            "--prompt",
            "fabo",
            "--temperature",
            "-1",
        ],
        LIMIT,
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--temperature -1: must be 0"), "{err}");
    let exp = repo_root().join("experiments/topk1_v2.toml");
    let (code, _, err) = kbench_within(
        &["serve", "--sim", exp.to_str().unwrap(), "--speed", "-1"],
        LIMIT,
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--speed -1 must be between"), "{err}");
}
