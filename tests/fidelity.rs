//! `kbench fidelity` over the shipped corpus: the table is pinned.

mod common;

use common::kbench;

#[test]
fn the_shipped_corpus_table_is_pinned() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("fidelity.json");
    let svg = dir.path().join("parity.svg");
    let (code, stdout, stderr) = kbench(
        root,
        &[
            "fidelity",
            "--json",
            json.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    insta::assert_snapshot!(stdout);
    let widest = stdout.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    assert!(
        widest <= 100,
        "a line of {widest} columns does not fit a terminal"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(v["points"].as_array().unwrap().len() > 60);
    assert!(v["summary"]["check"]["mean_tpot_ms"]["median_abs_pct"].is_number());
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.contains("<circle"));
    // one parity panel per metric, each on its own unit: milliseconds never share an axis
    // with tok/s
    for metric in ["mean_tpot_ms", "output_throughput"] {
        assert!(plot.contains(&format!("{metric}: ")), "{metric}: {plot}");
    }
    assert!(plot.contains("measured ms (log)") && plot.contains("measured tok/s (log)"));
}
