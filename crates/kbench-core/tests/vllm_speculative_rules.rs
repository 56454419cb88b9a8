//! vLLM's `--speculative-config` rules (vllm/config/speculative.py), each by name, and the
//! chain each method becomes.

use kbench_core::experiment::{validate_vllm_speculative, Algorithm, SpeculativeSection};

fn method(m: &str, k: Option<u32>) -> SpeculativeSection {
    SpeculativeSection {
        method: Some(m.into()),
        num_speculative_tokens: k,
        ..SpeculativeSection::default()
    }
}

fn rule(s: &SpeculativeSection, mtp_layers: u32) -> String {
    validate_vllm_speculative(s, mtp_layers)
        .map(|_| "ok".to_string())
        .unwrap_or_else(|v| format!("{}: {}", v.rule, v.message))
}

#[test]
fn methods_become_chains_of_k() {
    let c = validate_vllm_speculative(&method("eagle3", Some(3)), 0).unwrap();
    assert_eq!(c.algorithm, Algorithm::Eagle3);
    assert_eq!(
        (c.shape.num_steps, c.shape.topk, c.shape.num_draft_tokens),
        (3, 1, 4)
    );
    assert!(c.spec_v2, "async scheduling is vLLM's default for EAGLE");
    let n = validate_vllm_speculative(&method("ngram", Some(4)), 0).unwrap();
    assert_eq!(n.algorithm, Algorithm::Ngram);
    assert!(
        !n.spec_v2,
        "the CPU n-gram proposer turns async scheduling off"
    );
    let w = n.ngram.unwrap();
    assert_eq!((w.min, w.max), (5, 5), "vLLM's default window");
    // MTP defaults K to the checkpoint's n_predict; per-model names are aliases
    let m = validate_vllm_speculative(&method("deepseek_mtp", None), 1).unwrap();
    assert_eq!((m.algorithm, m.shape.num_steps), (Algorithm::Mtp, 1));
}

#[test]
fn each_rule_by_name() {
    assert!(rule(&method("eagle3", None), 0).contains("num_speculative_tokens must be provided"));
    assert!(rule(&method("eagle3", Some(0)), 0).contains("greater than zero"));
    assert!(rule(&method("medusa", Some(2)), 0).contains("not simulated"));
    assert!(rule(&method("bogus", Some(2)), 0).contains("Unknown speculative method 'bogus'"));
    assert!(rule(&method("mtp", Some(2)), 0).contains("no MTP layers"));
    assert!(rule(&method("mtp", Some(3)), 2).contains("must be divisible by n_predict=2"));
    let mut lookup = method("ngram", Some(3));
    lookup.prompt_lookup_min = Some(4);
    lookup.prompt_lookup_max = Some(2);
    assert!(rule(&lookup, 0).contains("prompt_lookup_min=4 must be <= prompt_lookup_max=2"));
    lookup.prompt_lookup_max = None;
    assert_eq!(rule(&lookup, 0), "ok", "one bound copies to the other");
    let mut eagle_lookup = method("eagle3", Some(3));
    eagle_lookup.prompt_lookup_min = Some(2);
    assert!(rule(&eagle_lookup, 0).contains("only for ngram"));
    let sglang = SpeculativeSection {
        algorithm: Algorithm::Eagle3,
        num_steps: Some(3),
        ..SpeculativeSection::default()
    };
    assert!(rule(&sglang, 0).contains("SGLang's"));
    let k_only = SpeculativeSection {
        num_speculative_tokens: Some(3),
        ..SpeculativeSection::default()
    };
    assert!(rule(&k_only, 0).contains("without speculative model"));
    assert_eq!(rule(&method("none", None), 0), "ok");
}

#[test]
fn sglang_refuses_vllm_keys() {
    let v = kbench_core::experiment::validate_speculative(&method("eagle3", Some(3))).unwrap_err();
    assert!(v.message.contains("vLLM's"), "{}", v.message);
}
