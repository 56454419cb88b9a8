//! Whatever bytes arrive as a trace, and whatever document arrives as an experiment file,
//! reading them returns a value or a typed error: it never panics.

mod common;

use std::path::Path;

use common::random_trace;
use kbench_core::experiment::load_experiment_str;
use kbench_core::trace::{read_bytes, to_binary, to_jsonl, ProbEncoding, MAGIC};
use proptest::prelude::*;

const SECTIONS: &[&str] = &[
    "",
    "model",
    "draft",
    "hardware",
    "server",
    "speculative",
    "workload",
    "benchmark",
    "backend",
    "engine",
    "reference",
    "sweep",
    "search",
];
const KEYS: &[&str] = &[
    "name",
    "seed",
    "preset",
    "profile",
    "config",
    "tp_size",
    "max_running_requests",
    "cuda_graph_max_bs",
    "mem_fraction_static",
    "algorithm",
    "num_steps",
    "eagle_topk",
    "num_draft_tokens",
    "spec_v2",
    "trace",
    "max_tokens",
    "input_len",
    "input_len_range",
    "temperature",
    "range_ratio",
    "concurrency",
    "request_rate",
    "requests_per_level",
    "burstiness",
    "kind",
    "points",
    "variants",
    "context_len",
    "kv_cache_dtype",
];

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|i| i.to_string()),
        any::<f64>().prop_map(|f| if f.is_nan() {
            "nan".into()
        } else if f.is_infinite() {
            if f > 0.0 {
                "inf".into()
            } else {
                "-inf".into()
            }
        } else {
            format!("{f:?}")
        }),
        Just("nan".to_string()),
        Just("inf".to_string()),
        any::<bool>().prop_map(|b| b.to_string()),
        "[a-zA-Z0-9_./-]{0,12}".prop_map(|s| format!("{s:?}")),
        proptest::collection::vec(-3i64..100000, 0..4).prop_map(|v| format!(
            "[{}]",
            v.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    ]
}

/// Documents made of the file's own sections and keys with values of any type: they reach
/// far past the TOML parser, into resolution and SGLang's rules.
fn document() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        (
            0..SECTIONS.len(),
            proptest::collection::vec((0..KEYS.len(), value()), 0..6),
        ),
        0..9,
    )
    .prop_map(|tables| {
        let mut out = String::from("name = \"p\"\n");
        let mut seen = std::collections::BTreeSet::new();
        for (s, entries) in tables {
            if !SECTIONS[s].is_empty() && seen.insert(s) {
                out.push_str(&format!("[{}]\n", SECTIONS[s]));
            } else if !SECTIONS[s].is_empty() {
                continue;
            }
            let mut keys = std::collections::BTreeSet::new();
            for (k, v) in entries {
                if keys.insert(k) {
                    out.push_str(&format!("{} = {v}\n", KEYS[k]));
                }
            }
        }
        out
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_bytes_as_a_trace(bytes in proptest::collection::vec(any::<u8>(), 0..512), magic in any::<bool>()) {
        let mut b = if magic { MAGIC.to_vec() } else { Vec::new() };
        b.extend_from_slice(&bytes);
        let _ = read_bytes(Path::new("t.kbt"), &b);
    }

    #[test]
    fn a_damaged_trace(seed in any::<u64>(), flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6), cut in any::<prop::sample::Index>(), jsonl in any::<bool>()) {
        let t = random_trace(seed, 3, 3, 2, 5, ProbEncoding::Log8, 0.6);
        let mut b = if jsonl { to_jsonl(&t).into_bytes() } else { to_binary(&t) };
        for (at, byte) in flips {
            let i = at.index(b.len());
            b[i] = byte;
        }
        let _ = read_bytes(Path::new("t"), &b);
        let cut = cut.index(b.len());
        let _ = read_bytes(Path::new("t"), &b[..cut]);
    }

    #[test]
    fn any_text_as_an_experiment(text in "\\PC{0,300}") {
        let _ = load_experiment_str(&text, Path::new("e.toml"), &[]);
    }

    #[test]
    fn any_document_of_the_files_own_keys(doc in document(), set in proptest::collection::vec((0..KEYS.len(), 0..SECTIONS.len(), value()), 0..3)) {
        let overrides: Vec<String> = set
            .into_iter()
            .map(|(k, s, v)| if SECTIONS[s].is_empty() { format!("{}={v}", KEYS[k]) } else { format!("{}.{}={v}", SECTIONS[s], KEYS[k]) })
            .collect();
        let _ = load_experiment_str(&doc, Path::new("e.toml"), &overrides);
    }
}
