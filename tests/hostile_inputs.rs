//! Hostile inputs: each refused with one clear message and a non-zero exit (or, where a
//! run still means something, a warning), never a panic, never a half-written file.
//! Messages are pinned.

mod common;

use std::path::Path;

use common::{kbench, BASE};

fn run(dir: &Path, args: &[&str]) -> String {
    let (code, stdout, stderr) = kbench(dir, args);
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    let dir_text = dir.display().to_string();
    format!(
        "exit code: {code}\nstdout:\n{}stderr:\n{}",
        stdout.replace(&dir_text, "DIR"),
        stderr.replace(&dir_text, "DIR")
    )
}

fn with_file(contents: &str, args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("exp.toml"), contents).unwrap();
    run(dir.path(), args)
}

#[test]
fn not_a_number_anywhere_in_the_file_is_refused() {
    let nan = BASE.replace("input_len = 32", "input_len = 32\ntemperature = nan");
    insta::assert_snapshot!(
        "nan_temperature",
        with_file(&nan, &["validate", "exp.toml"])
    );
    let inf = BASE.replace("tp_size = 8", "tp_size = 8\nmem_fraction_static = inf");
    insta::assert_snapshot!(
        "inf_memory_fraction",
        with_file(&inf, &["validate", "exp.toml"])
    );
    // inf is a request rate's meaning (all at once), -inf and nan are not
    let rates = BASE.replace("concurrency = [1, 2]", "request_rate = [1.0, inf, -inf]");
    insta::assert_snapshot!(
        "negative_infinite_rate",
        with_file(&rates, &["validate", "exp.toml"])
    );
    let from_set = with_file(
        BASE,
        &["validate", "exp.toml", "--set", "workload.range_ratio=nan"],
    );
    assert!(
        from_set.contains("`workload.range_ratio` is NaN"),
        "{from_set}"
    );
}

#[test]
fn more_clients_than_requests_is_a_warning() {
    let out = with_file(
        BASE,
        &[
            "validate",
            "exp.toml",
            "--set",
            "benchmark.concurrency=[1, 8]",
        ],
    );
    assert!(out.starts_with("exit code: 0"), "{out}");
    insta::assert_snapshot!(out);
}

#[test]
fn a_saturation_reference_is_not_compared_with_one_level() {
    let with_reference = format!(
        "{BASE}\n[reference]\nsource = \"test\"\n[[reference.points]]\nmetric = \"saturation_output_throughput\"\nvalue = 500.0\n"
    );
    let out = with_file(
        &with_reference,
        &["experiment", "exp.toml", "--concurrency", "1"],
    );
    assert!(out.contains("this run has 1"), "{out}");
    assert!(!out.contains("error -"), "{out}");
    let out = with_file(&with_reference, &["experiment", "exp.toml"]);
    assert!(out.contains("error "), "two levels are compared: {out}");
}

#[test]
fn a_gigabyte_of_garbage_is_refused_from_its_first_bytes() {
    let dir = tempfile::tempdir().unwrap();
    // sparse: a gigabyte on paper, nothing on disk
    let big = |name: &str| {
        let f = std::fs::File::create(dir.path().join(name)).unwrap();
        f.set_len(1 << 30).unwrap();
    };
    big("trace.kbt");
    big("gpu.toml");
    let spec = common::SPEC;
    std::fs::write(dir.path().join("exp.toml"), spec).unwrap();
    let trace = run(dir.path(), &["validate", "exp.toml"]);
    let profile_file = BASE.replace(
        "preset = \"8x-rtx-pro-6000-server\"",
        "profile = \"gpu.toml\"",
    );
    std::fs::write(dir.path().join("profile.toml"), profile_file).unwrap();
    let profile = run(dir.path(), &["validate", "profile.toml"]);
    std::fs::copy(dir.path().join("gpu.toml"), dir.path().join("big-exp.toml")).unwrap();
    let experiment = run(dir.path(), &["validate", "big-exp.toml"]);
    insta::assert_snapshot!(format!(
        "== trace\n{trace}\n== hardware profile\n{profile}\n== experiment file\n{experiment}"
    ));
}

#[test]
fn a_report_path_that_cannot_be_written_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("exp.toml"), BASE).unwrap();
    std::fs::create_dir(dir.path().join("out")).unwrap();
    let to_dir = run(
        dir.path(),
        &["experiment", "exp.toml", "-q", "--json", "out"],
    );
    let no_parent = run(
        dir.path(),
        &[
            "experiment",
            "exp.toml",
            "-q",
            "--csv",
            "missing/dir/levels.csv",
        ],
    );
    insta::assert_snapshot!(format!(
        "== a directory\n{to_dir}\n== a missing directory\n{no_parent}"
    ));
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(std::fs::read_dir(dir.path().join("out"))
        .unwrap()
        .next()
        .is_none());
}

/// Billions of requests a level keep their every token's timestamp until the report is
/// written: refused at load time, naming what they would keep and what the machine has
/// (read from Linux's /proc/meminfo).
#[cfg(target_os = "linux")]
#[test]
fn a_run_larger_than_memory_is_refused_before_it_starts() {
    // a level's statistics no longer grow with its requests: what grows is the requests
    // unfinished at once
    let huge = BASE.replace(
        "concurrency = [1, 2]\nrequests_per_level = 4",
        "concurrency = [1, 4000000000]\nrequests_per_level = 4000000000",
    );
    assert_ne!(huge, BASE, "the base file's levels moved");
    let long = BASE.replace("requests_per_level = 4", "requests_per_level = 4000000000");
    let validate_long = with_file(&long, &["validate", "exp.toml"]);
    assert!(
        validate_long.starts_with("exit code: 0\n"),
        "four billion requests two at a time fit in memory: {validate_long}"
    );
    // what the machine has varies: the snapshot shows it as MACHINE
    let redact = |out: String| -> String {
        let (from, to) = ("more than the ", " this machine has available");
        match (out.find(from), out.find(to)) {
            (Some(a), Some(b)) if a + from.len() <= b => {
                format!("{}MACHINE{}", &out[..a + from.len()], &out[b..])
            }
            _ => out,
        }
    };
    let validate = redact(with_file(&huge, &["validate", "exp.toml"]));
    insta::assert_snapshot!("run_larger_than_memory", validate);
    let experiment = redact(with_file(&huge, &["experiment", "exp.toml"]));
    assert!(experiment.starts_with("exit code: 3\n"), "{experiment}");
    assert!(
        experiment.contains("MACHINE this machine has available"),
        "{experiment}"
    );
}
