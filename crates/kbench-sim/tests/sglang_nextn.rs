//! SGLang's NEXTN on DeepSeek-V3: its draft passes run the model's own MTP layer (the
//! eh_proj over [embedding; hidden], then one more decoder layer with the shared head),
//! and at a good acceptance the overlapped chain beats plain decoding at C=1.

use std::path::Path;

use kbench_core::experiment::{load_experiment_str, Experiment};
use kbench_sim::cost::PassKind;
use kbench_sim::{acceptance_for, SimBackend};

fn deepseek(speculative: &str) -> Experiment {
    let text = format!(
        "name = \"t\"\nseed = 3\n[model]\npreset = \"deepseek-v3\"\n[hardware]\npreset = \"8x-h200\"\n\
         [server]\ntp_size = 8\n[speculative]\n{speculative}\n\
         [workload]\nmax_tokens = 128\ninput_len = 128\n{}\n\
         [benchmark]\nconcurrency = [1]\nrequests_per_level = 6\nwarmup_requests = 0\n",
        if speculative.contains("NEXTN") {
            "accept_length = 1.9"
        } else {
            ""
        }
    );
    load_experiment_str(&text, Path::new("t.toml"), &[])
        .unwrap()
        .remove(0)
        .experiment
}

fn backend(exp: &Experiment) -> SimBackend {
    SimBackend::new(exp, acceptance_for(exp).unwrap()).unwrap()
}

#[test]
fn nextn_drafts_with_one_more_deepseek_layer() {
    let exp = deepseek(
        "algorithm = \"NEXTN\"\nnum_steps = 2\neagle_topk = 1\nnum_draft_tokens = 3\nspec_v2 = true",
    );
    let round = backend(&exp).explain_round(1, 256.0).unwrap();
    let kinds: Vec<PassKind> = round.passes.iter().map(|p| p.kind).collect();
    assert_eq!(
        kinds,
        [
            PassKind::DraftDecode,
            PassKind::TargetVerify,
            PassKind::DraftExtend
        ]
    );
    let plain = backend(&deepseek("algorithm = \"none\""))
        .explain_round(1, 256.0)
        .unwrap();
    for draft in round
        .passes
        .iter()
        .filter(|p| p.kind != PassKind::TargetVerify)
    {
        assert!(draft.gpu_us.contains_key("mtp.eh_proj"), "{draft:?}");
        // one decoder layer of the target's 61 (plus the eh_proj and the shared head):
        // far less than a target pass, far more than nothing
        assert!(
            draft.gpu_total_us > plain.gpu_us / 200.0 && draft.gpu_total_us < plain.gpu_us / 4.0,
            "draft {} us against a plain step's {} us",
            draft.gpu_total_us,
            plain.gpu_us
        );
    }
}

#[test]
fn nextn_at_its_published_acceptance_beats_plain_decoding_at_c1() {
    let throughput = |exp: &Experiment| {
        let (_, p) = kbench_sim::predict::run(exp, &mut backend(exp)).unwrap();
        p.output_throughput[0].1
    };
    let plain = throughput(&deepseek("algorithm = \"none\""));
    let nextn = throughput(&deepseek(
        "algorithm = \"NEXTN\"\nnum_steps = 1\neagle_topk = 1\nnum_draft_tokens = 2\nspec_v2 = true",
    ));
    assert!(
        nextn > 1.2 * plain && nextn < 1.9 * plain,
        "{nextn} tok/s against {plain}"
    );
}

/// Drafting with MTP loads the checkpoint's MTP layer: one more DeepSeek decoder layer of
/// weights on every rank, and one more layer of KV per token.
#[test]
fn nextn_loads_the_mtp_layer_and_its_cache() {
    let nextn = backend(&deepseek(
        "algorithm = \"NEXTN\"\nnum_steps = 1\neagle_topk = 1\nnum_draft_tokens = 2",
    ));
    let plain = backend(&deepseek("algorithm = \"none\""));
    let (n, p) = (nextn.kv_pool(), plain.kv_pool());
    assert_eq!(
        n.target_bytes_per_token * 61,
        p.target_bytes_per_token * 62,
        "the MTP layer's latent KV beside the target's 61 layers"
    );
    // one MLA + 256-expert FP8 MoE layer, sharded over 8 ranks (about 1.4 GB), and its
    // replicated BF16 eh_proj, 2 x 7168 x 7168 x 2 bytes, with three norms
    let extra = n.weight_bytes - p.weight_bytes;
    let eh_proj = (2.0 * 7168.0 * 7168.0 + 3.0 * 7168.0) * 2.0;
    let layer = extra - eh_proj;
    assert!(
        (1.0e9..2.0e9).contains(&layer),
        "{} GB per GPU",
        layer / 1e9
    );
    let without_projection = {
        let exp =
            deepseek("algorithm = \"NEXTN\"\nnum_steps = 1\neagle_topk = 1\nnum_draft_tokens = 2");
        kbench_sim::memory::weight_footprint(
            &kbench_sim::memory::as_loaded(&exp.model, &exp.speculative),
            None,
            8,
        )
        .per_gpu_bytes
    };
    assert!((n.weight_bytes - without_projection - eh_proj).abs() < 1.0);
}

#[test]
fn the_mtp_layer_attends_to_a_chunks_cached_prompt_too() {
    // a later chunk of a long prompt attends to the chunks before it in every layer, the MTP
    // layer among them: what the cache adds to the chunk grows by one layer in 61 with it
    let chunk_after = |speculative: &str, cached: u32| {
        let exp = deepseek(speculative);
        let b = backend(&exp);
        let part = kbench_sim::cost::PrefillPart {
            new_tokens: 8192,
            cached,
        };
        b.cost_model()
            .prefill_parts_ns(&[part], exp.speculative.is_speculative())
            .unwrap() as f64
    };
    let nextn = "algorithm = \"NEXTN\"\nnum_steps = 2\neagle_topk = 1\nnum_draft_tokens = 3\nspec_v2 = true";
    let plain = "algorithm = \"none\"";
    let with_mtp = chunk_after(nextn, 65536) - chunk_after(nextn, 0);
    let without = chunk_after(plain, 65536) - chunk_after(plain, 0);
    let ratio = with_mtp / without;
    assert!(
        (ratio - 62.0 / 61.0).abs() < 0.002,
        "the cache adds {with_mtp} ns with the MTP layer, {without} ns without"
    );
}
