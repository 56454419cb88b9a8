//! SGLang's rules for EAGLE settings (server_args.py), each error naming the rule and a fix.

use serde::Serialize;

use super::file::{Algorithm, SpeculativeSection};
use crate::tree::TreeShape;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VerifyMethod {
    /// Accept the child equal to the target's argmax.
    Greedy,
    /// SGLang's `tree_speculative_sampling_target_only`.
    TargetOnly,
    /// Leviathan/Chen speculative sampling: lossless.
    Exact,
}

impl VerifyMethod {
    /// The names files and flags spell them with.
    pub const NAMES: [&'static str; 3] = ["greedy", "target_only", "exact"];

    /// The method named `name` (one of [`VerifyMethod::NAMES`]).
    pub fn parse(name: &str) -> Option<VerifyMethod> {
        match name {
            "greedy" => Some(VerifyMethod::Greedy),
            "target_only" => Some(VerifyMethod::TargetOnly),
            "exact" => Some(VerifyMethod::Exact),
            _ => None,
        }
    }
}

/// Validated speculative settings. For `Algorithm::None` the tree's counts are 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SpeculativeConfig {
    pub algorithm: Algorithm,
    /// SGLang's `num_steps`, `eagle_topk`, `num_draft_tokens`.
    #[serde(flatten)]
    pub shape: TreeShape,
    pub spec_v2: bool,
    pub disable_batch_threshold: Option<u32>,
    /// Settings SGLang itself rejects, run because the file allowed it.
    pub unsupported: Vec<String>,
    pub verify: VerifyMethod,
    /// vLLM `ngram`: the prompt-lookup window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ngram: Option<NgramWindow>,
}

/// The suffix lengths vLLM's n-gram proposer looks up (`prompt_lookup_min..=max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct NgramWindow {
    pub min: u32,
    pub max: u32,
}

impl SpeculativeConfig {
    pub fn none() -> SpeculativeConfig {
        SpeculativeConfig {
            algorithm: Algorithm::None,
            shape: TreeShape {
                num_steps: 0,
                topk: 0,
                num_draft_tokens: 0,
            },
            spec_v2: false,
            disable_batch_threshold: None,
            unsupported: Vec::new(),
            verify: VerifyMethod::Greedy,
            ngram: None,
        }
    }

    pub fn eagle(num_steps: u32, eagle_topk: u32, num_draft_tokens: u32) -> SpeculativeConfig {
        SpeculativeConfig {
            algorithm: Algorithm::Eagle3,
            shape: TreeShape {
                num_steps,
                topk: eagle_topk,
                num_draft_tokens,
            },
            ..SpeculativeConfig::none()
        }
    }

    pub fn is_speculative(&self) -> bool {
        self.algorithm != Algorithm::None
    }

    /// Candidates scored per request per round (0 without speculation).
    pub fn num_candidates(&self) -> u32 {
        if self.shape.num_steps == 0 {
            return 0;
        }
        self.shape.num_candidates() as u32
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleViolation {
    pub rule: &'static str,
    pub message: String,
    pub fix: String,
}

pub(super) fn violation(
    rule: &'static str,
    message: String,
    fix: impl Into<String>,
) -> RuleViolation {
    RuleViolation {
        rule,
        message,
        fix: fix.into(),
    }
}

/// Applies SGLang's rules; `allow_unsupported` turns the ones kbench can still simulate
/// (v2 with trees) into recorded notes instead of errors.
pub fn validate_speculative(s: &SpeculativeSection) -> Result<SpeculativeConfig, RuleViolation> {
    if let Some(keys) = keys_set(&[
        ("method", s.method.is_some()),
        ("num_speculative_tokens", s.num_speculative_tokens.is_some()),
        ("prompt_lookup_min", s.prompt_lookup_min.is_some()),
        ("prompt_lookup_max", s.prompt_lookup_max.is_some()),
    ]) {
        return Err(violation(
            "speculative settings for SGLang",
            format!("{keys} vLLM's --speculative-config keys; this file simulates SGLang"),
            "set [engine] name = \"vllm\", or use SGLang's algorithm = \"EAGLE3\" with num_steps, eagle_topk, num_draft_tokens",
        ));
    }
    if s.algorithm == Algorithm::Ngram {
        // SGLang's NGRAM drafts a tree from a trie of earlier tokens (ngram_worker.py);
        // its tree building and match rates have no model here yet
        return Err(violation(
            "speculative.algorithm",
            "SGLang's NGRAM is not simulated yet (vLLM's n-gram prompt lookup is)".into(),
            "set [engine] name = \"vllm\" with method = \"ngram\" and num_speculative_tokens = K, or use algorithm = \"EAGLE3\"",
        ));
    }
    let verify = match s.verify.as_deref() {
        None => VerifyMethod::Greedy,
        Some(name) => VerifyMethod::parse(name).ok_or_else(|| {
            violation(
                "speculative.verify",
                format!("unknown verification method `{name}`"),
                "use \"greedy\", \"target_only\" (SGLang's tree sampling) or \"exact\" (lossless)",
            )
        })?,
    };
    if s.algorithm == Algorithm::None {
        let set: Vec<&str> = [
            ("num_steps", s.num_steps.is_some()),
            ("eagle_topk", s.eagle_topk.is_some()),
            ("num_draft_tokens", s.num_draft_tokens.is_some()),
            ("spec_v2", s.spec_v2),
        ]
        .into_iter()
        .filter_map(|(k, on)| on.then_some(k))
        .collect();
        if !set.is_empty() {
            return Err(violation(
                "speculative settings without an algorithm",
                format!("{} set while algorithm = \"none\"", set.join(", ")),
                "set algorithm = \"EAGLE3\", or remove those keys",
            ));
        }
        return Ok(SpeculativeConfig {
            verify,
            ..SpeculativeConfig::none()
        });
    }

    // Rule 1: all three or none (none = SGLang's auto choice for non-llama targets).
    let (steps, topk, draft_tokens) = match (s.num_steps, s.eagle_topk, s.num_draft_tokens) {
        (None, None, None) => (3, 1, 4),
        (Some(a), Some(b), Some(c)) => (a, b, c),
        (Some(a), Some(1), None) => (a, 1, a + 1),
        _ => {
            return Err(violation(
                "SGLang rule: set num_steps, eagle_topk and num_draft_tokens together",
                format!(
                    "got num_steps={}, eagle_topk={}, num_draft_tokens={}",
                    shown(s.num_steps),
                    shown(s.eagle_topk),
                    shown(s.num_draft_tokens)
                ),
                "set all three (e.g. 3, 1, 4), or none for SGLang's default (3, 1, 4)",
            ))
        }
    };
    if steps == 0 || topk == 0 || draft_tokens == 0 {
        return Err(violation(
            "SGLang rule: positive speculative counts",
            format!("num_steps={steps}, eagle_topk={topk}, num_draft_tokens={draft_tokens}"),
            "use num_steps >= 1, eagle_topk >= 1, num_draft_tokens >= 2",
        ));
    }
    // Rule 2: a chain verifies exactly its drafted tokens plus the root.
    if topk == 1 && draft_tokens != steps + 1 {
        return Err(violation(
            "SGLang rule: eagle_topk == 1 forces num_draft_tokens = num_steps + 1",
            format!("num_steps={steps}, eagle_topk=1, num_draft_tokens={draft_tokens}"),
            format!("set num_draft_tokens = {}", steps + 1),
        ));
    }
    // Rule 3: cannot verify more nodes than the tree has.
    let max_nodes = topk * steps + 1;
    if draft_tokens > max_nodes {
        return Err(violation(
            "SGLang rule: num_draft_tokens <= eagle_topk * num_steps + 1",
            format!("num_draft_tokens={draft_tokens} exceeds {topk} * {steps} + 1 = {max_nodes}"),
            format!("use num_draft_tokens between 2 and {max_nodes}"),
        ));
    }
    if draft_tokens < 2 {
        return Err(violation(
            "SGLang rule: num_draft_tokens includes the root",
            format!("num_draft_tokens={draft_tokens} leaves no drafted token"),
            "use num_draft_tokens >= 2",
        ));
    }
    let mut unsupported = Vec::new();
    // Rule 4: the overlap scheduler only handles chains.
    if s.spec_v2 && topk > 1 {
        if s.allow_unsupported {
            unsupported.push(format!(
                "spec_v2 with eagle_topk={topk}: SGLang supports v2 only with eagle_topk == 1"
            ));
        } else {
            return Err(violation(
                "SGLang rule: spec v2 (overlap) requires eagle_topk == 1",
                format!("spec_v2 = true with eagle_topk = {topk}"),
                "set eagle_topk = 1 (and num_draft_tokens = num_steps + 1), or spec_v2 = false, or allow_unsupported = true for a what-if study",
            ));
        }
    }
    if let Some(t) = s.disable_batch_threshold {
        if t == 0 {
            return Err(violation(
                "speculative.disable_batch_threshold",
                "a threshold of 0 disables speculation for every batch".into(),
                "use algorithm = \"none\" instead, or a threshold >= 1",
            ));
        }
        unsupported.push(format!(
            "disable_batch_threshold={t}: not upstream SGLang (the seed's fork)"
        ));
    }
    Ok(SpeculativeConfig {
        algorithm: s.algorithm,
        shape: TreeShape {
            num_steps: steps,
            topk,
            num_draft_tokens: draft_tokens,
        },
        spec_v2: s.spec_v2,
        disable_batch_threshold: s.disable_batch_threshold,
        unsupported,
        verify,
        ngram: None,
    })
}

/// The keys that are set, as "a, b are" (or "a is"); None when none is.
pub(super) fn keys_set(keys: &[(&str, bool)]) -> Option<String> {
    let set: Vec<&str> = keys.iter().filter_map(|&(k, on)| on.then_some(k)).collect();
    match set.len() {
        0 => None,
        1 => Some(format!("{} is", set[0])),
        _ => Some(format!("{} are", set.join(", "))),
    }
}

fn shown(v: Option<u32>) -> String {
    v.map(|x| x.to_string()).unwrap_or_else(|| "unset".into())
}
