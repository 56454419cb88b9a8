//! SGLang's rules for EAGLE settings, where they live: each rule by name, and a proptest
//! that validation accepts exactly the settings the rules allow.

use kbench_core::experiment::{validate_speculative, Algorithm, SpeculativeSection};
use proptest::prelude::*;

fn eagle(
    steps: Option<u32>,
    topk: Option<u32>,
    tokens: Option<u32>,
    v2: bool,
) -> SpeculativeSection {
    SpeculativeSection {
        algorithm: Algorithm::Eagle3,
        num_steps: steps,
        eagle_topk: topk,
        num_draft_tokens: tokens,
        spec_v2: v2,
        ..SpeculativeSection::default()
    }
}

fn rule(s: &SpeculativeSection) -> &'static str {
    validate_speculative(s)
        .map(|_| "ok")
        .unwrap_or_else(|v| v.rule)
}

#[test]
fn each_rule_by_name() {
    assert_eq!(rule(&eagle(Some(2), Some(1), Some(3), true)), "ok");
    assert_eq!(rule(&eagle(Some(3), Some(4), Some(8), false)), "ok");
    assert!(rule(&eagle(Some(2), Some(1), Some(5), false)).contains("eagle_topk == 1 forces"));
    assert!(rule(&eagle(Some(2), Some(2), Some(6), false))
        .contains("num_draft_tokens <= eagle_topk * num_steps + 1"));
    assert!(rule(&eagle(Some(3), Some(4), Some(8), true))
        .contains("spec v2 (overlap) requires eagle_topk == 1"));
    assert!(rule(&eagle(Some(2), None, Some(3), false)).contains("together"));
    assert!(rule(&eagle(Some(0), Some(1), Some(1), false)).contains("positive"));
    // none set: SGLang's default chain
    let d = validate_speculative(&eagle(None, None, None, false)).unwrap();
    assert_eq!(
        (d.shape.num_steps, d.shape.topk, d.shape.num_draft_tokens),
        (3, 1, 4)
    );
    // steps and topk 1 alone: the chain's draft tokens follow
    let c = validate_speculative(&eagle(Some(4), Some(1), None, false)).unwrap();
    assert_eq!(c.shape.num_draft_tokens, 5);
    // v2 with a tree is a what-if when allowed, recorded as unsupported
    let mut what_if = eagle(Some(3), Some(4), Some(8), true);
    what_if.allow_unsupported = true;
    assert_eq!(validate_speculative(&what_if).unwrap().unsupported.len(), 1);
    // no algorithm: no speculative keys
    let mut plain = eagle(Some(2), Some(1), Some(3), false);
    plain.algorithm = Algorithm::None;
    assert!(rule(&plain).contains("without an algorithm"));
    assert_eq!(
        rule(&SpeculativeSection {
            verify: Some("maybe".into()),
            ..SpeculativeSection::default()
        }),
        "speculative.verify"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn validation_accepts_exactly_what_the_rules_allow(steps in 0u32..7, topk in 0u32..9, tokens in 0u32..60, v2 in any::<bool>()) {
        let got = validate_speculative(&eagle(Some(steps), Some(topk), Some(tokens), v2));
        let allowed = steps >= 1
            && topk >= 1
            && tokens >= 2
            && (topk != 1 || tokens == steps + 1)
            && tokens <= topk * steps + 1
            && !(v2 && topk > 1);
        prop_assert_eq!(got.is_ok(), allowed, "{:?}", got);
        if let Ok(c) = got {
            prop_assert_eq!((c.shape.num_steps, c.shape.topk, c.shape.num_draft_tokens, c.spec_v2), (steps, topk, tokens, v2));
            prop_assert!(c.num_candidates() + 1 >= c.shape.num_draft_tokens);
        }
    }
}

fn nextn_file(model: &str, speculative: &str) -> String {
    format!(
        "name = \"t\"\n[model]\npreset = \"{model}\"\n[hardware]\npreset = \"8x-h200\"\n\
         [server]\ntp_size = 8\n[speculative]\nalgorithm = \"NEXTN\"\n{speculative}\n\
         [workload]\naccept_length = 1.8\nmax_tokens = 64\ninput_len = 64\n\
         [benchmark]\nconcurrency = [1]\nrequests_per_level = 4\n"
    )
}

fn load_nextn(
    model: &str,
    speculative: &str,
) -> Result<kbench_core::experiment::Experiment, kbench_core::experiment::ExperimentError> {
    kbench_core::experiment::load_experiment_str(
        &nextn_file(model, speculative),
        std::path::Path::new("t.toml"),
        &[],
    )
    .map(|mut v| v.remove(0).experiment)
}

/// SGLang's NEXTN (its DeepSeek MTP) is EAGLE with the model's own NextN layer as the
/// draft: EAGLE's shape rules, no [draft], and a model that has the layer.
#[test]
fn nextn_drafts_with_the_models_own_mtp_layer_under_eagles_rules() {
    let exp = load_nextn(
        "deepseek-v3",
        "num_steps = 1\neagle_topk = 1\nnum_draft_tokens = 2",
    )
    .unwrap();
    assert_eq!(exp.speculative.algorithm, Algorithm::Mtp);
    assert_eq!(exp.speculative.algorithm.sglang_name(), Some("NEXTN"));
    assert!(exp.draft.is_none());
    // SGLang caps running requests at 48 with any EAGLE-style speculation
    assert_eq!(exp.max_running_requests, 48);
    let e = load_nextn(
        "deepseek-v3",
        "num_steps = 2\neagle_topk = 1\nnum_draft_tokens = 5",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("eagle_topk == 1 forces"), "{e}");
    let e = load_nextn(
        "kimi-k2.5",
        "num_steps = 1\neagle_topk = 1\nnum_draft_tokens = 2",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("speculative.algorithm") && e.contains("kimi-k2.5 has none"),
        "{e}"
    );
}
