//! What a user meets at the edges of the command line: negative values to flags, a reader
//! that closes stdout early, output folders that do not exist, a missing source, and how a
//! draft-tree shape is named in a message.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{kbench, repo_root, BASE};

/// Runs kbench with stdout a pipe whose reader has already gone, as `| head` leaves it
/// once it has its lines, but every time rather than when the race goes that way.
fn kbench_into_closed_pipe(dir: &Path, args: &[&str]) -> (i32, String) {
    let mut reader = Command::new("true")
        .stdin(Stdio::piped())
        .spawn()
        .expect("`true` runs");
    let pipe = reader.stdin.take().expect("piped");
    reader.wait().expect("`true` exits");
    let out = Command::new(env!("CARGO_BIN_EXE_kbench"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .stdout(Stdio::from(pipe))
        .stderr(Stdio::piped())
        .output()
        .expect("the kbench binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn with_experiment() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("exp.toml"), BASE).unwrap();
    dir
}

/// clap used to stop at "unexpected argument '-1'" with a tip that makes -1 a positional;
/// the value reaches its own check, which says what is wrong with it.
#[test]
fn negative_values_reach_their_flags_own_check() {
    let dir = with_experiment();
    let d = dir.path();
    let cases: [(&[&str], i32, &str); 4] = [
        (
            &["experiment", "exp.toml", "--request-rate", "-1"],
            2,
            "error: --request-rate -1: ",
        ),
        (
            &["experiment", "exp.toml", "--burstiness", "-1"],
            2,
            "error: --burstiness -1: ",
        ),
        (
            &[
                "model",
                "init",
                "--preset",
                "tiny",
                "--draft-quality",
                "-1",
                "--out",
                "m",
            ],
            2,
            "error: --draft-quality -1: must be between 0.0 and 1.0",
        ),
        (
            &["trace", "synth", "--stickiness", "-1", "-o", "t.kbt"],
            2,
            "error: --stickiness -1: must be between 0 and 1",
        ),
    ];
    for (args, want, message) in cases {
        let (code, _, stderr) = kbench(d, args);
        assert_eq!(code, want, "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("unexpected argument"),
            "{args:?}: {stderr}"
        );
    }
    assert!(!d.join("m").exists() && !d.join("t.kbt").exists());
}

/// A reader that closes stdout early is not a failure: exit 0, nothing said, and the files
/// asked for are still written.
#[test]
fn a_closed_stdout_ends_quietly_and_still_writes_the_files() {
    let (code, stderr) = kbench_into_closed_pipe(&repo_root(), &["fidelity"]);
    assert_eq!((code, stderr.as_str()), (0, ""), "fidelity");

    let dir = with_experiment();
    let d = dir.path();
    let (code, stderr) =
        kbench_into_closed_pipe(d, &["experiment", "exp.toml", "--json", "r.json"]);
    assert_eq!((code, stderr.as_str()), (0, ""), "experiment");
    assert!(d.join("r.json").is_file(), "the report is written");

    // a one-line `println!` used to panic here
    let (code, stderr) = kbench_into_closed_pipe(d, &["trace", "synth", "-o", "t.kbt"]);
    assert_eq!((code, stderr.as_str()), (0, ""), "trace synth");
    let (code, stderr) = kbench_into_closed_pipe(d, &["trace", "stats", "t.kbt"]);
    assert_eq!((code, stderr.as_str()), (0, ""), "trace stats");
}

/// Every command refuses an output folder that is not there, the same way, and makes none.
#[test]
fn a_missing_output_folder_is_refused_alike() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (code, _, stderr) = kbench(d, &["trace", "synth", "-o", "t.kbt"]);
    assert_eq!(code, 0, "{stderr}");

    let (code, _, stderr) = kbench(d, &["trace", "synth", "-o", "nodir/a.kbt"]);
    assert_eq!(code, 5, "{stderr}");
    assert_eq!(
        stderr,
        "error: cannot write nodir/a.kbt: the directory nodir does not exist\n"
    );
    let (code, _, stderr) = kbench(d, &["trace", "convert", "t.kbt", "nodir/b.jsonl"]);
    assert_eq!(code, 5, "{stderr}");
    assert_eq!(
        stderr,
        "error: cannot write nodir/b.jsonl: the directory nodir does not exist\n"
    );
    assert!(!d.join("nodir").exists());

    let (code, _, stderr) = kbench(d, &["calibrate", "--out-dir", "missing/dir"]);
    assert_eq!(code, 5, "{stderr}");
    assert_eq!(
        stderr,
        "error: --out-dir missing/dir: the directory does not exist\n"
    );
}

#[test]
fn trace_record_without_a_source_names_both() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, stderr) = kbench(dir.path(), &["trace", "record", "-o", "x.kbt"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--model DIR") && stderr.contains("--experiment FILE"),
        "{stderr}"
    );
}

/// A shape reaches the user by its fields, not as Rust's Debug form of the struct.
#[test]
fn an_invalid_config_is_named_by_its_fields() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (code, _, stderr) = kbench(d, &["trace", "synth", "-o", "t.kbt"]);
    assert_eq!(code, 0, "{stderr}");
    let (code, _, stderr) = kbench(d, &["trace", "stats", "t.kbt", "--config", "3/1/9"]);
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stderr.starts_with(
            "error: --config 3/1/9: tree shape (num_steps 3, topk 1, num_draft_tokens 9) is invalid: "
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("TreeShape"), "{stderr}");
}

/// `-` is not stdout for an output file, and a plot is SVG under any name it is given: both
/// refused before the run, nothing written.
#[test]
fn a_dash_for_a_file_and_a_plot_named_png_are_refused() {
    let dir = with_experiment();
    let d = dir.path();
    let (code, _, stderr) = kbench(d, &["experiment", "exp.toml", "--json", "-"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("`-` names a file here, not stdout"),
        "{stderr}"
    );
    assert!(!d.join("-").exists());
    for args in [
        &["experiment", "exp.toml", "--plot", "x.png"][..],
        &["fidelity", "--plot", "x.png"][..],
        &["experiment", "exp.toml", "--plot", "x"][..],
    ] {
        let (code, _, stderr) = kbench(d, args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(
            stderr.contains("kbench draws SVG; name the file .svg"),
            "{stderr}"
        );
    }
    assert!(!d.join("x.png").exists() && !d.join("x").exists());
    let (code, _, stderr) = kbench(d, &["experiment", "exp.toml", "--plot", "x.SVG"]);
    assert_eq!(code, 0, "{stderr}");
}
