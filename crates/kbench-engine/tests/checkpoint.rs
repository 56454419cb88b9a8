//! On-disk checkpoints: init_model writes the real format, Model::load reads it, bad input
//! is an error (named), never a panic; the kimi-slice plan has Kimi-K2.5's config and names.

use std::path::Path;

use kbench_core::arch::{ArchFamily, ModelArch};
use kbench_core::experiment::VerifyMethod;
use kbench_engine::generate::{generate, GenerateOptions};
use kbench_engine::init::{init_model, plan_checkpoint, InitOptions, Preset};
use kbench_engine::{Device, EngineError, Model, SpeculativeSettings};

fn tiny_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    init_model(Preset::Tiny, Some(4), 5, 0.8, dir.path()).unwrap();
    dir
}

fn load(dir: &Path) -> Result<Model, EngineError> {
    Model::load(dir, Some(&dir.join("draft")), Device::Cpu)
}

#[test]
fn tiny_model_round_trips_through_disk() {
    let dir = tiny_dir();
    let d = dir.path();
    for f in [
        "config.json",
        "tokenizer.json",
        "model.safetensors.index.json",
        "draft/config.json",
        "draft/model.safetensors",
    ] {
        assert!(d.join(f).exists(), "{f}");
    }
    let arch = ModelArch::from_config_file(&d.join("config.json")).unwrap();
    assert_eq!(arch.tensor_prefix, "language_model.");
    assert_eq!(arch.quant.as_ref().unwrap().group_size, 32);
    let model = load(d).unwrap();
    // Same weights as the in-memory builder: same tokens.
    let mem = kbench_engine::build_model(&InitOptions::new(Preset::Tiny, Some(4), 5, 0.8)).unwrap();
    let prompts = vec![(0u64, vec![5u32, 9, 77, 3])];
    let a = kbench_engine::generate::run_batch(&model, prompts.clone(), 16, 0.0, 0, None).unwrap();
    let b = kbench_engine::generate::run_batch(&mem, prompts, 16, 0.0, 0, None).unwrap();
    assert_eq!(a[0].output(), b[0].output());
    // generate(): text through the tokenizer, spec tokens equal plain tokens.
    let words: Vec<String> = (10..16).map(kbench_engine::init::word).collect();
    let mut opts = GenerateOptions {
        prompt: words.join(" "),
        max_tokens: 24,
        temperature: 0.0,
        seed: 1,
        spec: None,
    };
    let plain = generate(d, None, &opts).unwrap();
    opts.spec = Some(SpeculativeSettings::new(3, 1, 4, VerifyMethod::Greedy).unwrap());
    let spec = generate(d, None, &opts).unwrap();
    assert_eq!(plain.tokens, spec.tokens);
    assert_eq!(plain.prompt_tokens, (10..16).collect::<Vec<u32>>());
    assert_eq!(spec.text.split(' ').count(), 24);
    assert!(spec.accept_length.unwrap() >= 1.0);
    let json = serde_json::to_value(&spec).unwrap();
    assert!(json.get("round_commits").is_some());
}

#[test]
fn kimi_slice_plan_matches_kimi_k25() {
    let plan = plan_checkpoint(&InitOptions::new(Preset::KimiSlice, Some(3), 0, 0.7)).unwrap();
    let arch =
        ModelArch::from_config_value(&plan.config, Path::new("kimi-slice/config.json")).unwrap();
    let real = ModelArch::preset("kimi-k2.5").unwrap();
    assert_eq!(arch.family, ArchFamily::MlaMoe);
    assert_eq!(arch.hidden_size, real.hidden_size);
    assert_eq!(arch.mla, real.mla);
    assert_eq!(arch.vocab_size, real.vocab_size);
    assert_eq!(arch.num_layers, 3);
    let (m, rm) = (arch.moe.unwrap(), real.moe.unwrap());
    assert_eq!(
        (
            m.n_routed_experts,
            m.num_experts_per_tok,
            m.moe_intermediate_size
        ),
        (384, 8, 2048)
    );
    assert_eq!(m.routed_scaling_factor, rm.routed_scaling_factor);
    assert_eq!(arch.quant, real.quant);
    assert_eq!(arch.rope_scaling, real.rope_scaling);
    assert_eq!(arch.tensor_prefix, "language_model.");
    let w = &plan.weight_map;
    let e = "language_model.model.layers.1.mlp.experts.383.down_proj";
    assert!(w.contains_key(&format!("{e}.weight_packed")));
    let down = plan
        .shards
        .iter()
        .flat_map(|s| &s.1)
        .find(|t| t.name == format!("{e}.weight_packed"))
        .unwrap();
    assert_eq!(down.shape, vec![7168, 2048 / 8]);
    let scale = plan
        .shards
        .iter()
        .flat_map(|s| &s.1)
        .find(|t| t.name == format!("{e}.weight_scale"))
        .unwrap();
    assert_eq!(scale.shape, vec![7168, 2048 / 32]);
    assert!(w.contains_key("language_model.model.layers.0.mlp.down_proj.weight"));
    assert!(w.contains_key("language_model.model.layers.2.self_attn.kv_b_proj.weight"));
    assert!(w.contains_key("language_model.lm_head.weight"));
    // 2 MoE layers of 384 experts x 3 INT4 matrices (0.5625 B/param): ~19 GB, plus BF16
    // embeddings and lm_head (4.7 GB), the dense layer and attention: ~25.3 GB.
    let gb = plan.total_size as f64 / 1e9;
    assert!((24.0..27.0).contains(&gb), "{gb} GB");
    assert!(plan
        .draft_tensors
        .iter()
        .any(|t| t.name == "d2t" && t.shape == vec![32000]));
    assert_eq!(
        plan.draft_config["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
        serde_json::json!([1, 0, 0])
    );
}

// ---- bad input ----

fn rewrite_shard(
    path: &Path,
    edit: impl Fn(&str, &mut safetensors::Dtype, &mut Vec<usize>, &mut Vec<u8>) -> bool,
) {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut kept = Vec::new();
    for (name, view) in st.tensors() {
        let (mut dt, mut shape, mut data) =
            (view.dtype(), view.shape().to_vec(), view.data().to_vec());
        if edit(&name, &mut dt, &mut shape, &mut data) {
            kept.push((name, dt, shape, data));
        }
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = kept
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn shard_of(dir: &Path, tensor: &str) -> std::path::PathBuf {
    let idx: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    dir.join(idx["weight_map"][tensor].as_str().unwrap())
}

#[test]
fn missing_tensor_is_named() {
    let dir = tiny_dir();
    let name = "language_model.model.layers.2.self_attn.kv_b_proj.weight";
    rewrite_shard(&shard_of(dir.path(), name), |n, _, _, _| n != name);
    let err = load(dir.path()).err().expect("must fail");
    assert!(
        matches!(&err, EngineError::MissingTensor { name: n, .. } if n == name),
        "{err}"
    );
}

#[test]
fn misshaped_tensor_is_named() {
    let dir = tiny_dir();
    let name = "language_model.model.layers.1.mlp.experts.3.up_proj.weight_packed";
    rewrite_shard(&shard_of(dir.path(), name), |n, _, shape, data| {
        if n == name {
            shape[0] /= 2;
            data.truncate(data.len() / 2);
        }
        true
    });
    let err = load(dir.path()).err().expect("must fail");
    assert!(err.to_string().contains(name), "{err}");
    assert!(matches!(err, EngineError::Shape { .. }));
}

#[test]
fn wrong_dtype_is_named() {
    let dir = tiny_dir();
    let name = "language_model.model.layers.0.self_attn.o_proj.weight";
    rewrite_shard(&shard_of(dir.path(), name), |n, dt, _, data| {
        if n == name {
            *dt = safetensors::Dtype::I16;
            assert_eq!(data.len() % 2, 0);
        }
        true
    });
    let err = load(dir.path()).err().expect("must fail");
    assert!(
        matches!(&err, EngineError::Dtype { name: n, .. } if n == name),
        "{err}"
    );
}

#[test]
fn truncated_and_corrupt_files_are_errors() {
    let dir = tiny_dir();
    let shard = shard_of(dir.path(), "language_model.model.layers.1.mlp.gate.weight");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 100]).unwrap();
    let err = load(dir.path()).err().expect("truncated must fail");
    assert!(matches!(err, EngineError::Safetensors { .. }), "{err}");
    let mut garbage = bytes.clone();
    garbage[8..40].copy_from_slice(&[b'#'; 32]);
    std::fs::write(&shard, &garbage).unwrap();
    assert!(matches!(
        load(dir.path()).err().unwrap(),
        EngineError::Safetensors { .. }
    ));
    std::fs::write(&shard, &bytes[..4]).unwrap();
    assert!(matches!(
        load(dir.path()).err().unwrap(),
        EngineError::Safetensors { .. }
    ));
}

#[test]
fn config_disagreeing_with_weights_is_an_error() {
    let dir = tiny_dir();
    let path = dir.path().join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg["text_config"]["moe_intermediate_size"] = serde_json::json!(64);
    std::fs::write(&path, cfg.to_string()).unwrap();
    let err = load(dir.path()).err().expect("must fail");
    assert!(
        matches!(
            err,
            EngineError::Shape { .. } | EngineError::ConfigMismatch(_)
        ),
        "{err}"
    );
    cfg["text_config"]["moe_intermediate_size"] = serde_json::json!(32);
    cfg["text_config"]["num_hidden_layers"] = serde_json::json!(6);
    std::fs::write(&path, cfg.to_string()).unwrap();
    let err = load(dir.path()).err().expect("must fail");
    assert!(matches!(err, EngineError::MissingTensor { .. }), "{err}");
    // A draft whose hidden size differs from the target's.
    cfg["text_config"]["num_hidden_layers"] = serde_json::json!(4);
    std::fs::write(&path, cfg.to_string()).unwrap();
    let dpath = dir.path().join("draft/config.json");
    let mut dcfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&dpath).unwrap()).unwrap();
    dcfg["hidden_size"] = serde_json::json!(96);
    std::fs::write(&dpath, dcfg.to_string()).unwrap();
    assert!(matches!(
        load(dir.path()).err().unwrap(),
        EngineError::ConfigMismatch(_)
    ));
}

#[test]
fn missing_tokenizer_and_files_are_errors() {
    let dir = tiny_dir();
    std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    let opts = GenerateOptions {
        prompt: "ba be".into(),
        max_tokens: 4,
        temperature: 0.0,
        seed: 0,
        spec: None,
    };
    let err = generate(dir.path(), None, &opts).expect_err("must fail");
    assert!(matches!(err, EngineError::Tokenizer(_)), "{err}");
    std::fs::write(dir.path().join("tokenizer.json"), "{not json").unwrap();
    assert!(matches!(
        generate(dir.path(), None, &opts).err().unwrap(),
        EngineError::Tokenizer(_)
    ));
    let empty = tempfile::tempdir().unwrap();
    assert!(Model::load(empty.path(), None, Device::Cpu).is_err());
    std::fs::remove_file(shard_of(dir.path(), "language_model.lm_head.weight")).unwrap();
    assert!(matches!(
        load(dir.path()).err().unwrap(),
        EngineError::Io { .. }
    ));
}

#[test]
fn cuda_device_without_a_gpu_says_why() {
    if kbench_cuda::device::device_count() > 0 {
        eprintln!("skipped: a CUDA device is present");
        return;
    }
    let dir = tiny_dir();
    let err = Model::load(dir.path(), None, Device::parse("cuda:0").unwrap())
        .err()
        .unwrap();
    assert!(err.to_string().contains("cuda:0"), "{err}");
    assert!(err.to_string().contains("use device = \"cpu\""), "{err}");
    assert!(Device::parse("tpu").is_err());
}
