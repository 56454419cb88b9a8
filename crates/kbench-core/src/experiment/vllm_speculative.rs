//! vLLM's rules for `--speculative-config` (vllm/config/speculative.py, `SpeculativeConfig`
//! in v0.11.0 and its per-method configs in v0.34.0): the keys a file uses when it
//! simulates `[engine] name = "vllm"`, each error quoting the rule vLLM applies.

use super::file::{Algorithm, SpeculativeSection};
use super::speculative::{
    keys_set, violation, NgramWindow, RuleViolation, SpeculativeConfig, VerifyMethod,
};
use crate::tree::TreeShape;

/// vLLM's default n-gram window when neither bound is set.
pub const DEFAULT_PROMPT_LOOKUP: u32 = 5;

/// Methods vLLM has that kbench does not simulate, and why.
const NOT_SIMULATED: [(&str, &str); 7] = [
    ("draft_model", "a separate small LM as draft"),
    ("medusa", "Medusa heads"),
    ("mlp_speculator", "MLP speculators"),
    ("suffix", "suffix decoding"),
    ("ngram_gpu", "the GPU n-gram kernel (use ngram)"),
    ("dflash", "parallel drafting"),
    ("dspark", "parallel drafting"),
];

/// vLLM's per-model MTP method names, rewritten to `mtp` with a deprecation warning.
const MTP_ALIASES: [&str; 7] = [
    "deepseek_mtp",
    "mimo_mtp",
    "glm4_moe_mtp",
    "ernie_mtp",
    "qwen3_next_mtp",
    "longcat_flash_mtp",
    "qwen3_5_mtp",
];

/// Validates `[speculative]` for vLLM. MTP's default K (the checkpoint's `n_predict`) and
/// its divisibility rule need the model, so `mtp_layers` is the target's MTP layer count.
pub fn validate_vllm_speculative(
    s: &SpeculativeSection,
    mtp_layers: u32,
) -> Result<SpeculativeConfig, RuleViolation> {
    if let Some(keys) = keys_set(&[
        ("algorithm", s.algorithm != Algorithm::None),
        ("num_steps", s.num_steps.is_some()),
        ("eagle_topk", s.eagle_topk.is_some()),
        ("num_draft_tokens", s.num_draft_tokens.is_some()),
        ("spec_v2", s.spec_v2),
        (
            "disable_batch_threshold",
            s.disable_batch_threshold.is_some(),
        ),
    ]) {
        return Err(violation(
            "speculative settings for vLLM",
            format!(
                "{keys} SGLang's; vLLM's --speculative-config names a `method` and `num_speculative_tokens`"
            ),
            "write method = \"eagle3\" (or eagle, mtp, ngram) and num_speculative_tokens = K",
        ));
    }
    let verify = match s.verify.as_deref() {
        None | Some("greedy") => VerifyMethod::Greedy,
        // vLLM's rejection sampler with one-hot drafts: accept with the target's probability
        Some("exact") => VerifyMethod::Exact,
        Some(other) => {
            return Err(violation(
                "speculative.verify",
                format!("verification `{other}` is not vLLM's"),
                "use \"greedy\" (temperature 0) or \"exact\" (vLLM's rejection sampler)",
            ))
        }
    };
    let lookup_set = s.prompt_lookup_min.is_some() || s.prompt_lookup_max.is_some();
    // "none" is kbench's spelling of no method (a baseline variant beside spec ones)
    let method = s
        .method
        .as_deref()
        .filter(|m| !m.eq_ignore_ascii_case("none"));
    let Some(method) = method else {
        if s.num_speculative_tokens.is_some() || lookup_set {
            return Err(violation(
                "vLLM rule: a speculative method",
                "num_speculative_tokens was provided but without speculative model.".into(),
                "set method = \"eagle3\", \"eagle\", \"mtp\" or \"ngram\"",
            ));
        }
        return Ok(SpeculativeConfig {
            verify,
            ..SpeculativeConfig::none()
        });
    };
    let algorithm = match method {
        "eagle3" => Algorithm::Eagle3,
        "eagle" => Algorithm::Eagle,
        "ngram" | "[ngram]" => Algorithm::Ngram,
        "mtp" => Algorithm::Mtp,
        m if MTP_ALIASES.contains(&m) => Algorithm::Mtp,
        m => {
            if let Some((_, what)) = NOT_SIMULATED.iter().find(|(n, _)| *n == m) {
                return Err(violation(
                    "speculative.method",
                    format!("vLLM's `{m}` ({what}) is not simulated"),
                    "use eagle3, eagle, mtp or ngram",
                ));
            }
            return Err(violation(
                "vLLM rule: a known speculative method",
                format!("Unknown speculative method '{m}'"),
                "use eagle3, eagle, mtp or ngram",
            ));
        }
    };
    if lookup_set && algorithm != Algorithm::Ngram {
        return Err(violation(
            "speculative.prompt_lookup_min / prompt_lookup_max",
            format!(
                "prompt lookup bounds set for method `{method}`; vLLM uses them only for ngram"
            ),
            "remove them, or set method = \"ngram\"",
        ));
    }
    let k = match (s.num_speculative_tokens, algorithm) {
        (Some(0), _) => {
            return Err(violation(
                "vLLM rule: num_speculative_tokens > 0",
                "Expected num_speculative_tokens to be greater than zero (0).".into(),
                "set num_speculative_tokens to 1 or more",
            ))
        }
        (Some(k), Algorithm::Mtp) => {
            check_mtp_layers(mtp_layers)?;
            if k > mtp_layers && k % mtp_layers != 0 {
                return Err(violation(
                    "vLLM rule: K a multiple of the MTP layers",
                    format!("num_speculative_tokens:{k} must be divisible by n_predict={mtp_layers}"),
                    format!("use num_speculative_tokens <= {mtp_layers} or a multiple of it"),
                ));
            }
            k
        }
        (Some(k), _) => k,
        (None, Algorithm::Mtp) => {
            check_mtp_layers(mtp_layers)?;
            mtp_layers
        }
        (None, _) => {
            return Err(violation(
                "vLLM rule: num_speculative_tokens",
                "num_speculative_tokens must be provided with speculative model unless the draft model config contains an n_predict parameter.".into(),
                "set num_speculative_tokens = K (e.g. 3)",
            ))
        }
    };
    if k > crate::trace::MAX_DEPTH {
        return Err(violation(
            "speculative.num_speculative_tokens",
            format!(
                "num_speculative_tokens = {k} drafts deeper than any trace records ({})",
                crate::trace::MAX_DEPTH
            ),
            format!("use at most {}", crate::trace::MAX_DEPTH),
        ));
    }
    let ngram = if algorithm == Algorithm::Ngram {
        let (min, max) = match (s.prompt_lookup_min, s.prompt_lookup_max) {
            (None, None) => (DEFAULT_PROMPT_LOOKUP, DEFAULT_PROMPT_LOOKUP),
            (Some(a), None) => (a, a),
            (None, Some(b)) => (b, b),
            (Some(a), Some(b)) => (a, b),
        };
        for (name, v) in [("prompt_lookup_min", min), ("prompt_lookup_max", max)] {
            if v == 0 {
                return Err(violation(
                    "vLLM rule: prompt lookup bounds > 0",
                    format!("{name}={v} must be > 0"),
                    format!("set {name} to 1 or more"),
                ));
            }
        }
        if min > max {
            return Err(violation(
                "vLLM rule: prompt_lookup_min <= prompt_lookup_max",
                format!("prompt_lookup_min={min} must be <= prompt_lookup_max={max}"),
                "swap them, or set one and let vLLM copy it",
            ));
        }
        Some(NgramWindow { min, max })
    } else {
        None
    };
    Ok(SpeculativeConfig {
        algorithm,
        shape: TreeShape {
            num_steps: k,
            topk: 1,
            num_draft_tokens: k + 1,
        },
        // async scheduling: on by default since v0.14 and kept for EAGLE and MTP; the CPU
        // n-gram proposer turns it off (vllm/config/vllm.py)
        spec_v2: algorithm.drafts_on_gpu(),
        disable_batch_threshold: None,
        unsupported: Vec::new(),
        verify,
        ngram,
    })
}

fn check_mtp_layers(mtp_layers: u32) -> Result<(), RuleViolation> {
    if mtp_layers == 0 {
        return Err(violation(
            "speculative.method = \"mtp\"",
            "the target checkpoint has no MTP layers (num_nextn_predict_layers = 0)".into(),
            "use a model with MTP layers (e.g. deepseek-v3), or method = \"eagle3\" with a [draft]",
        ));
    }
    Ok(())
}
