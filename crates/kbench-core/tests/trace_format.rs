//! Trace files: both forms round-trip, conversion is lossless, bad files are named.

mod common;

use std::path::Path;

use common::random_trace;
use kbench_core::trace::{
    convert, from_binary, from_jsonl, read, read_bytes, to_binary, to_jsonl, write, ProbEncoding,
    TraceError, TraceForm,
};
use proptest::prelude::*;

fn enc() -> impl Strategy<Value = ProbEncoding> {
    prop_oneof![Just(ProbEncoding::Log8), Just(ProbEncoding::Linear16)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn both_forms_round_trip(seed in any::<u64>(), d in 1u32..=8, k in 1u32..=8, seqs in 1usize..4, pos in 1usize..12, e in enc()) {
        let t = random_trace(seed, d, k, seqs, pos, e, 0.5);
        let p = Path::new("mem.kbt");
        let bin = to_binary(&t);
        prop_assert_eq!(&from_binary(p, &bin).unwrap(), &t);
        let text = to_jsonl(&t);
        let back = from_jsonl(Path::new("mem.jsonl"), &text).unwrap();
        prop_assert_eq!(&back, &t);
        // Binary -> JSONL -> binary is byte-identical.
        prop_assert_eq!(to_binary(&back), bin);
    }

    #[test]
    fn quantisation_is_idempotent(p in 0.0f64..=1.0, e in enc()) {
        let c = e.encode(p);
        prop_assert_eq!(e.encode(f64::from(e.decode(c))), c);
        if e == ProbEncoding::Log8 && p > 1e-4 {
            prop_assert!((f64::from(e.decode(c)) / p - 1.0).abs() < 0.023);
        }
        if e == ProbEncoding::Linear16 {
            prop_assert!((f64::from(e.decode(c)) - p).abs() < 1e-5);
        }
    }
}

#[test]
fn files_sniff_convert_and_write_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let t = random_trace(1, 4, 3, 2, 5, ProbEncoding::Log8, 0.6);
    let bin = dir.path().join("a.kbt");
    let json = dir.path().join("a.jsonl");
    let bin2 = dir.path().join("b.kbt");
    write(&t, &bin, TraceForm::Binary).unwrap();
    convert(&bin, &json, TraceForm::from_path(&json)).unwrap();
    assert!(std::fs::read_to_string(&json)
        .unwrap()
        .starts_with("{\"format\":\"kbench-acceptance-trace\",\"version\":3,"));
    convert(&json, &bin2, TraceForm::Binary).unwrap();
    assert_eq!(std::fs::read(&bin).unwrap(), std::fs::read(&bin2).unwrap());
    assert_eq!(read(&json).unwrap(), t);
    // Nothing but the three traces is left behind (no temporary files).
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, vec!["a.jsonl", "a.kbt", "b.kbt"]);
    // The params map keeps its written order.
    assert!(std::fs::read_to_string(&json)
        .unwrap()
        .contains("\"params\":{\"zeta\":1,\"alpha\""));
    let err = write(&t, &dir.path().join("no/such/dir/x.kbt"), TraceForm::Binary).unwrap_err();
    assert!(matches!(err, TraceError::Write { .. }), "{err}");
}

fn sample_bytes() -> Vec<u8> {
    to_binary(&random_trace(2, 2, 2, 1, 3, ProbEncoding::Log8, 0.5))
}

fn err(bytes: &[u8]) -> String {
    read_bytes(Path::new("traces/bad.kbt"), bytes)
        .unwrap_err()
        .to_string()
}

#[test]
fn missing_file_is_named() {
    let e = read(Path::new("/nonexistent/kbench/x.kbt")).unwrap_err();
    assert!(matches!(e, TraceError::Read { .. }));
    assert_eq!(e.to_string(), "cannot read trace /nonexistent/kbench/x.kbt");
    let source = std::error::Error::source(&e).expect("the I/O error as the source");
    let io = source
        .downcast_ref::<std::io::Error>()
        .expect("an I/O error");
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
}

#[test]
fn binary_errors() {
    let good = sample_bytes();
    insta::assert_snapshot!("bad_magic", err(b"PK\x03\x04 zip file"));
    insta::assert_snapshot!("empty", err(b""));
    let mut v4 = good.clone();
    v4[8] = 4;
    insta::assert_snapshot!("version", err(&v4));
    let cut = &good[..good.len() - 20];
    insta::assert_snapshot!("truncated_body", err(cut));
    insta::assert_snapshot!("truncated_magic", err(&good[..5]));
    let mut flipped = good.clone();
    let n = flipped.len();
    flipped[n - 8] ^= 0x01;
    let msg = err(&flipped);
    assert!(
        msg.starts_with("traces/bad.kbt: checksum mismatch: stored CRC-32 0x"),
        "{msg}"
    );
    let mut trailing = good.clone();
    trailing.extend_from_slice(b"xx");
    insta::assert_snapshot!("trailing", err(&trailing));
    // Every proper prefix is rejected, never accepted or panicking.
    for len in 0..good.len() {
        assert!(
            read_bytes(Path::new("p.kbt"), &good[..len]).is_err(),
            "prefix {len}"
        );
    }
}

#[test]
fn jsonl_errors_name_the_line() {
    let t = random_trace(3, 2, 2, 2, 2, ProbEncoding::Linear16, 0.5);
    let text = to_jsonl(&t);
    let lines: Vec<&str> = text.lines().collect();
    let p = Path::new("traces/bad.jsonl");
    let broken = format!(
        "{}\n{}\n{{\"id\": 3, \"ranks\": [[0, 9]]\n",
        lines[0], lines[1]
    );
    insta::assert_snapshot!(
        "jsonl_malformed_line",
        from_jsonl(p, &broken).unwrap_err().to_string()
    );
    let short = format!("{}\n{}\n", lines[0], lines[1]);
    insta::assert_snapshot!(
        "jsonl_missing_sequence",
        from_jsonl(p, &short).unwrap_err().to_string()
    );
    let bad_rank = format!(
        "{}\n{}\n{{\"id\":3,\"ranks\":[[0,3],[0,0]],\"probs\":[[[0.5,0.25],[0.5,0.25]],[[0.5,0.25],[0.5,0.25]]]}}\n",
        lines[0], lines[1]
    );
    insta::assert_snapshot!(
        "jsonl_rank_out_of_range",
        from_jsonl(p, &bad_rank).unwrap_err().to_string()
    );
    let bad_header = text.replacen("\"version\":3", "\"version\":7", 1);
    insta::assert_snapshot!(
        "jsonl_version",
        from_jsonl(p, &bad_header).unwrap_err().to_string()
    );
    let unsorted = format!(
        "{}\n{}\n{{\"id\":3,\"ranks\":[[0,1],[0,0]],\"probs\":[[[0.25,0.5],[0.5,0.25]],[[0.5,0.25],[0.5,0.25]]]}}\n",
        lines[0], lines[1]
    );
    insta::assert_snapshot!(
        "jsonl_unsorted",
        from_jsonl(p, &unsorted).unwrap_err().to_string()
    );
}

/// What cannot be memory-mapped (an empty file, a pipe) is read instead, with the same
/// checks and the same result.
#[test]
fn unmappable_files_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.kbt");
    std::fs::write(&empty, b"").unwrap();
    let e = read(&empty).unwrap_err().to_string();
    assert!(e.contains("nothing (empty file)"), "{e}");
    #[cfg(unix)]
    {
        let t = random_trace(4, 3, 2, 2, 4, ProbEncoding::Log8, 0.5);
        let bytes = to_binary(&t);
        let fifo = dir.path().join("pipe.kbt");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let path = fifo.clone();
            let writer = std::thread::spawn(move || std::fs::write(path, bytes));
            let back = read(&fifo).unwrap();
            writer.join().unwrap().unwrap();
            assert_eq!(back, t);
        }
    }
}

/// A trace truncated by another process while kbench holds it used to kill the process
/// with SIGBUS (the file was mapped): a trace this size is read once, so its sequences
/// stay whole.
#[test]
fn a_trace_truncated_while_in_use_stays_whole() {
    let dir = tempfile::tempdir().unwrap();
    let shipped =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces/kimi-k2.5-eagle3-chat.synth.kbt");
    let path = dir.path().join("t.kbt");
    std::fs::copy(&shipped, &path).unwrap();
    assert!(std::fs::metadata(&path).unwrap().len() <= kbench_core::trace::MAP_ABOVE_BYTES);
    let t = read(&path).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    // every sequence's bytes are touched after the truncation
    assert_eq!(to_binary(&t), to_binary(&read(&shipped).unwrap()));
}
