//! Commands served by the native engine: `model init`, `generate`, `trace record`, the
//! `engine` backend, and `kbench kernels check`.

use std::path::{Path, PathBuf};

use kbench_core::experiment::{variant_files, VerifyMethod};
use kbench_core::trace::{self as ktrace, ProbEncoding, TraceForm};
use kbench_engine::{Device, GenerateOptions, Model, Preset, SpeculativeSettings, TraceOptions};

use super::args::{GenerateArgs, KernelsCommand, ModelCommand, ModelInitArgs, TraceRecordArgs};
use super::error::{spec_error, CliError, CliResult};
use super::exit;

fn engine_err(e: kbench_engine::EngineError) -> CliError {
    CliError::from_error(&e)
}

/// Creates any model an experiment asks for with `[model] init` and does not have yet,
/// so an engine experiment runs from a fresh clone.
pub fn prepare_models(path: &Path, overrides: &[String]) -> CliResult<()> {
    prepare_models_flagged(path, overrides, &|e| spec_error(&e))
}

/// [`prepare_models`] with the caller's rendering of a file error (naming its flags).
pub fn prepare_models_flagged(
    path: &Path,
    overrides: &[String],
    spec_error: &dyn Fn(kbench_core::experiment::ExperimentError) -> CliError,
) -> CliResult<()> {
    let files = variant_files(path, overrides).map_err(spec_error)?;
    let base = path.parent().unwrap_or(Path::new("."));
    for (_, file) in files {
        let (Some(config), Some(init)) = (&file.model.config, &file.model.init) else {
            continue;
        };
        let config = base.join(config);
        if config.exists() {
            continue;
        }
        let dir = config.parent().unwrap_or(Path::new(".")).to_path_buf();
        let preset = Preset::parse(&init.preset).map_err(engine_err)?;
        eprintln!(
            "creating the {} model in {} (seed {}, draft quality {}) ...",
            init.preset,
            dir.display(),
            init.seed,
            init.draft_quality
        );
        kbench_engine::init_model(preset, init.layers, init.seed, init.draft_quality, &dir)
            .map_err(engine_err)?;
    }
    Ok(())
}

pub fn model_command(cmd: ModelCommand) -> CliResult<()> {
    match cmd {
        ModelCommand::Init(a) => model_init(a),
    }
}

fn model_init(a: ModelInitArgs) -> CliResult<()> {
    let preset = Preset::parse(&a.preset).map_err(engine_err)?;
    if !(0.0..=1.0).contains(&a.draft_quality) {
        return Err(CliError::new(
            exit::USAGE,
            format!(
                "--draft-quality {}: must be between 0.0 and 1.0",
                a.draft_quality
            ),
        ));
    }
    if a.layers == Some(0) {
        return Err(CliError::new(
            exit::INVALID_INPUT,
            "--layers 0: a model needs at least one layer",
        ));
    }
    kbench_engine::init_model(preset, a.layers, a.seed, a.draft_quality, &a.out)
        .map_err(|e| CliError::from_error(&e))?;
    super::output::outln!(
        "wrote {} model to {} (draft in {})",
        a.preset,
        a.out.display(),
        a.out.join("draft").display()
    )?;
    Ok(())
}

pub(super) fn verify_method(name: Option<&str>, temperature: f32) -> CliResult<VerifyMethod> {
    match name {
        None if temperature > 0.0 => Ok(VerifyMethod::TargetOnly),
        None => Ok(VerifyMethod::Greedy),
        Some(name) => VerifyMethod::parse(name).ok_or_else(|| {
            CliError::new(
                exit::INVALID_INPUT,
                format!(
                    "--verify {name}: use {} or {}",
                    VerifyMethod::NAMES[..2].join(", "),
                    VerifyMethod::NAMES[2]
                ),
            )
        }),
    }
}

/// SGLang's rules applied to command-line speculative settings.
pub(super) fn spec_settings(
    steps: Option<u32>,
    topk: Option<u32>,
    draft_tokens: Option<u32>,
    verify: VerifyMethod,
) -> CliResult<SpeculativeSettings> {
    let section = kbench_core::experiment::SpeculativeSection {
        algorithm: kbench_core::experiment::Algorithm::Eagle3,
        num_steps: steps,
        eagle_topk: topk,
        num_draft_tokens: draft_tokens,
        ..Default::default()
    };
    let s = kbench_core::experiment::validate_speculative(&section).map_err(|v| {
        CliError::new(
            exit::INVALID_INPUT,
            format!("{}: {}\n  fix: {}", v.rule, v.message, v.fix),
        )
    })?;
    Ok(SpeculativeSettings {
        shape: s.shape,
        verify,
    })
}

pub fn generate(a: GenerateArgs) -> CliResult<()> {
    if a.max_tokens == 0 {
        return Err(CliError::new(
            exit::INVALID_INPUT,
            "--max-tokens 0 generates nothing",
        ));
    }
    if !(a.temperature.is_finite() && a.temperature >= 0.0) {
        return Err(CliError::new(
            exit::USAGE,
            format!(
                "--temperature {}: must be 0 (greedy) or above, as in SGLang's and vLLM's sampling parameters",
                a.temperature
            ),
        ));
    }
    let speculative = a.draft.is_some()
        || a.num_steps.is_some()
        || a.eagle_topk.is_some()
        || a.num_draft_tokens.is_some();
    let spec = if speculative {
        let verify = verify_method(a.verify.as_deref(), a.temperature)?;
        Some(spec_settings(
            a.num_steps,
            a.eagle_topk,
            a.num_draft_tokens,
            verify,
        )?)
    } else {
        None
    };
    let opts = GenerateOptions {
        prompt: a.prompt.clone(),
        max_tokens: a.max_tokens as usize,
        temperature: a.temperature,
        seed: a.seed,
        spec,
    };
    let model = kbench_engine::generate::load(&a.model, a.draft.as_deref(), speculative)
        .map_err(engine_err)?;
    let prompt = kbench_engine::generate::encode_prompt(&model, &a.prompt).map_err(engine_err)?;
    if let Some(unknown) = &prompt.unknown {
        eprintln!("warning: {unknown}");
    }
    // The flag asked for more than the model holds: a usage error, as `experiment
    // --max-tokens` refuses it, before a run that would not end.
    kbench_engine::generate::check_context(&model, prompt.ids.len(), opts.max_tokens).map_err(
        |e| {
            let room = model
                .target
                .arch
                .max_position_embeddings
                .saturating_sub(prompt.ids.len() as u64);
            let fix = if room == 0 {
                "shorten the prompt: it fills the context alone".to_string()
            } else {
                format!("lower --max-tokens to {room} or less, or shorten the prompt")
            };
            CliError::new(
                exit::USAGE,
                format!("--max-tokens {}: {e}\n  fix: {fix}", a.max_tokens),
            )
        },
    )?;
    let result =
        kbench_engine::generate::generate_prompt(&model, prompt.ids, &opts).map_err(engine_err)?;
    if a.json {
        super::output::outln!(
            "{}",
            serde_json::to_string_pretty(&result).expect("result serializes")
        )?;
    } else {
        super::output::outln!("{}", result.text)?;
        let accept = result
            .accept_length
            .map(|x| format!(", accept length {x:.2}"))
            .unwrap_or_default();
        eprintln!(
            "{} tokens in {:.1} ms ({:.1} tok/s){accept}",
            result.tokens.len(),
            result.elapsed_ms,
            result.tokens_per_s
        );
    }
    Ok(())
}

pub fn record_trace(a: TraceRecordArgs) -> CliResult<()> {
    let Some(model_dir) = &a.model else {
        return Err(CliError::new(
            exit::USAGE,
            "trace record needs --model or --experiment",
        ));
    };
    let draft_dir: PathBuf = a.draft.clone().unwrap_or_else(|| model_dir.join("draft"));
    let model = Model::load(model_dir, Some(&draft_dir), Device::Cpu).map_err(engine_err)?;
    if a.prompts == 0 || a.prompt_len == 0 {
        return Err(CliError::new(
            exit::INVALID_INPUT,
            "--prompts and --prompt-len must be 1 or more",
        ));
    }
    // Prompts are random token ids, reproducible from the seed and the prompt's index.
    let prompts = kbench_engine::trace::random_prompts(
        &model,
        a.seed,
        a.prompts as usize,
        a.prompt_len as usize,
    );
    let opts = TraceOptions {
        depth: a.depth,
        topk: a.topk,
        max_new: a.max_tokens as usize,
        dataset: format!(
            "{} random-token prompts of {} tokens (seed {})",
            a.prompts, a.prompt_len, a.seed
        ),
        prob_encoding: ProbEncoding::Linear16,
    };
    let t = kbench_engine::record_trace(&model, &prompts, &opts).map_err(engine_err)?;
    ktrace::write(&t, &a.out, TraceForm::from_path(&a.out))
        .map_err(|e| CliError::from_error(&e))?;
    super::output::outln!(
        "recorded {} sequences x {} positions (depth {}, top-{}) to {}",
        t.sequences.len(),
        a.max_tokens,
        a.depth,
        a.topk,
        a.out.display()
    )?;
    Ok(())
}

pub fn kernels_command(cmd: KernelsCommand) -> CliResult<()> {
    let KernelsCommand::Check(a) = cmd;
    let archs: Vec<&str> = a
        .arch
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .collect();
    if let Some(bad) = archs
        .iter()
        .find(|a| !(a.starts_with("sm_") && a[3..].chars().all(|c| c.is_ascii_digit() || c == 'a')))
    {
        return Err(CliError::new(
            exit::INVALID_INPUT,
            format!("--arch {bad}: expected a compute capability like sm_90 or sm_120"),
        ));
    }
    match kbench_cuda::nvrtc_info() {
        Ok(info) => super::output::outln!("{info}")?,
        Err(why) => {
            return Err(CliError::new(
                exit::CHECK_FAILED,
                format!("NVRTC not found: {why}\n  fix: pip install -r scripts/cuda-wheels.txt (or set KBENCH_NVRTC_LIB / KBENCH_CUDA_INCLUDE)"),
            ))
        }
    }
    let results = kbench_cuda::check_kernels(&archs);
    let mut failed = 0;
    for r in &results {
        super::output::outln!(
            "{:<8} {:<20} {:<4} {:>8.1} ms",
            r.arch,
            r.file,
            if r.ok { "ok" } else { "FAIL" },
            r.millis
        )?;
        if !r.ok {
            failed += 1;
            for line in r.log.lines() {
                super::output::outln!("    {line}")?;
            }
        }
    }
    super::output::outln!(
        "{} kernels compiled, {failed} failed",
        results.len() - failed
    )?;
    if failed > 0 {
        return Err(CliError::new(
            exit::CHECK_FAILED,
            format!("{failed} of {} kernel compilations failed", results.len()),
        ));
    }
    Ok(())
}
