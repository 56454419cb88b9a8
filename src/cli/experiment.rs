//! `kbench experiment` and `kbench validate`.

use std::io::Write;

use kbench_core::experiment::{load_experiment, Variant};
use kbench_core::harness::{run_levels_until_stopped, LoadPlan};
use kbench_core::report::{build_report, Report, SweepReport};

use super::args::{ExperimentArgs, SglangArgsArgs, ValidateArgs};
use super::backends::make_backend;
use super::error::{io_error, spec_error, CliError, CliResult};
use super::exit;
use super::output::{check_output_paths, write_file, write_json};
use super::progress::LevelProgress;
use super::render;

pub fn run(args: ExperimentArgs) -> CliResult<()> {
    check_output_paths([&args.json, &args.csv, &args.plot].into_iter().flatten())?;
    super::output::check_plot_path(args.plot.as_ref())?;
    let (overrides, labels): (Vec<String>, Vec<String>) =
        command_line_overrides(&args)?.into_iter().unzip();
    super::interrupt::install();
    let FileRun {
        mut reports,
        stopped,
    } = run_labelled_file(&args.file, &overrides, &labels, args.quiet)?;
    // a measurement from a real server is worth its prediction: asked for, or by default
    // on the http backend
    let measured_by_http = reports.iter().any(|r| r.backend.name == "http");
    if (args.predict || (measured_by_http && !args.no_predict)) && !reports.is_empty() {
        let mut sim = overrides.clone();
        sim.push("backend.kind=\"sim\"".into());
        match run_file(&args.file, &sim, true) {
            Ok(predicted) => {
                for (m, p) in reports.iter_mut().zip(&predicted) {
                    m.prediction = Some(kbench_core::compare::prediction(m, p));
                }
            }
            Err(e) if !args.predict => {
                eprintln!("note: no prediction beside the measurement: {}", e.message);
            }
            Err(e) => return Err(e.prefixed("--predict")),
        }
    }
    let mut out = super::output::stdout();
    if !args.quiet {
        for report in &reports {
            render::table::write_report(&mut out, report, args.wide)
                .map_err(|e| io_error(exit::OUTPUT, "writing to stdout", e))?;
        }
        if reports.len() > 1 {
            render::table::write_sweep_summary(&mut out, &reports)
                .map_err(|e| io_error(exit::OUTPUT, "writing to stdout", e))?;
        }
        render::assumptions::write_assumptions(&mut out, &reports)
            .map_err(|e| io_error(exit::OUTPUT, "writing to stdout", e))?;
        for report in &reports {
            render::table::write_measured_vs_predicted(&mut out, report, args.wide)
                .map_err(|e| io_error(exit::OUTPUT, "writing to stdout", e))?;
        }
        out.flush().ok();
    }
    if !reports.is_empty() {
        write_outputs(&args, &reports)?;
    }
    match stopped {
        Some(mut e) => {
            let levels: usize = reports.iter().map(|r| r.levels.len()).sum();
            if let (Some(path), true) = (&args.json, levels > 0) {
                e.message.push_str(&format!(
                    "\n  the {levels} level(s) that finished are in {}, marked partial",
                    path.display()
                ));
            }
            Err(e)
        }
        None => match every_request_failed(&reports) {
            Some(e) => Err(e),
            None => Ok(()),
        },
    }
}

/// A level where every measured request failed measured nothing: its zeros are not data,
/// so the run exits as a backend failure (after the report, which lists the reasons).
fn every_request_failed(reports: &[Report]) -> Option<CliError> {
    let empty: Vec<(String, &kbench_core::metrics::LevelMetrics)> = reports
        .iter()
        .flat_map(|r| {
            r.levels
                .iter()
                .filter(|l| l.completed == 0 && l.failed > 0)
                .map(move |l| (r.experiment.name.clone(), l))
        })
        .collect();
    let (_, first) = empty.first()?;
    let levels: Vec<String> = empty
        .iter()
        .map(|(n, l)| format!("{n} C={} ({} failed)", l.concurrency, l.failed))
        .collect();
    let reason = first
        .errors
        .first()
        .map(|e| format!("; the first reason: {e}"))
        .unwrap_or_default();
    Some(CliError::new(
        exit::BACKEND,
        format!("every request failed at {}{reason}", levels.join(", ")),
    ))
}

/// `kbench sglang-args` / `kbench vllm-args`: the launch line of each variant. Every line
/// is made, and its deployment checked (the hardware known, the weights and a KV cache in
/// memory, as the simulator checks them), before any is printed, so a sweep whose
/// third variant cannot launch prints nothing rather than two lines and an error.
pub fn launch_args(
    args: SglangArgsArgs,
    engine: kbench_core::experiment::ServingEngineKind,
    command: fn(&kbench_core::experiment::Experiment) -> Result<String, kbench_http::Error>,
) -> CliResult<()> {
    super::engine::prepare_models(&args.file, &args.set)?;
    let variants = kbench_core::experiment::load_experiment_variant(
        &args.file,
        &args.set,
        args.variant.as_deref(),
    )
    .map_err(|e| spec_error(&e))?;
    if variants.is_empty() {
        let declared = kbench_core::experiment::variant_files(&args.file, &args.set)
            .map_err(|e| spec_error(&e))?;
        let names: Vec<&str> = declared.iter().filter_map(|(n, _)| n.as_deref()).collect();
        return Err(CliError::new(
            exit::INVALID_INPUT,
            format!(
                "{}: no variant `{}` (variants: {})",
                args.file.display(),
                args.variant.as_deref().unwrap_or(""),
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ),
        ));
    }
    let mut lines = Vec::with_capacity(variants.len());
    for v in &variants {
        let named = |e| in_variant(v, e);
        let line = command(&v.experiment)
            .map_err(|e| CliError::from_error(&e))
            .map_err(named)?;
        // the line starts `engine`, whichever engine the file simulates: its start-up rules
        // (vLLM's max_model_len check, its memory default) are the ones to meet
        let mut launched = v.experiment.clone();
        launched.engine.kind = engine;
        kbench_sim::check_deployment(&launched)
            .map_err(|e| CliError::from_error(&e))
            .map_err(named)?;
        lines.push((v.name.as_deref(), line));
    }
    for (name, line) in lines {
        if let Some(name) = name {
            super::output::outln!("# variant {name}")?;
        }
        super::output::outln!("{line}")?;
    }
    if let Some(other) = variants
        .iter()
        .map(|v| v.experiment.engine.kind)
        .find(|&kind| kind != engine)
    {
        // a plain file launches on either engine, but its prediction is the other's
        let display = |kind| match kind {
            kbench_core::experiment::ServingEngineKind::Sglang => "SGLang",
            kbench_core::experiment::ServingEngineKind::Vllm => "vLLM",
        };
        eprintln!(
            "note: the file predicts {}'s serving ([engine] name); this line launches {}: to predict what it launches, set [engine] name = \"{name}\" (--set engine.name={name} on a plain file)",
            display(other),
            display(engine),
            name = engine.name()
        );
        let graph_bound_set = variants
            .iter()
            .any(|v| v.experiment.file.server.cuda_graph_max_bs.is_some());
        if graph_bound_set && engine == kbench_core::experiment::ServingEngineKind::Sglang {
            eprintln!(
                "note: server.cuda_graph_max_bs counts tokens under vLLM (--max-cudagraph-capture-size) and requests under SGLang; the line passes the file's number as SGLang's --cuda-graph-max-bs"
            );
        }
    }
    if engine == kbench_core::experiment::ServingEngineKind::Vllm {
        for key in sglang_only_server_keys(&variants) {
            eprintln!(
                "note: server.{key} is SGLang's and has no `vllm serve` flag; it is not in the line (vLLM sizes its cache from --gpu-memory-utilization and budgets prefill with --max-num-batched-tokens)"
            );
        }
    }
    Ok(())
}

/// A variant's error, named by its variant in a sweep.
fn in_variant(v: &Variant, e: CliError) -> CliError {
    match &v.name {
        Some(name) => e.prefixed(format!("variant `{name}`")),
        None => e,
    }
}

/// The `[server]` keys some chosen variant sets that only SGLang takes.
fn sglang_only_server_keys(variants: &[Variant]) -> Vec<&'static str> {
    let set = |pick: fn(&kbench_core::experiment::ServerSection) -> bool| {
        variants.iter().any(|v| pick(&v.experiment.file.server))
    };
    [
        ("max_total_tokens", set(|s| s.max_total_tokens.is_some())),
        (
            "chunked_prefill_size",
            set(|s| s.chunked_prefill_size.is_some()),
        ),
        (
            "max_prefill_tokens",
            set(|s| s.max_prefill_tokens.is_some()),
        ),
    ]
    .into_iter()
    .filter_map(|(key, is_set)| is_set.then_some(key))
    .collect()
}

/// Runs every variant of an experiment file with `--set`-style overrides: what
/// `kbench experiment` does before rendering. Tests and benchmarks call it directly.
pub fn run_file(
    path: &std::path::Path,
    overrides: &[String],
    quiet: bool,
) -> CliResult<Vec<Report>> {
    let run = run_file_until_stopped(path, overrides, quiet)?;
    match run.stopped {
        Some(e) => Err(e),
        None => Ok(run.reports),
    }
}

/// The reports of the variants that ran (the last one marked partial when the run stopped
/// inside it), and why the run stopped early, if it did.
pub struct FileRun {
    pub reports: Vec<Report>,
    pub stopped: Option<CliError>,
}

pub fn run_file_until_stopped(
    path: &std::path::Path,
    overrides: &[String],
    quiet: bool,
) -> CliResult<FileRun> {
    run_labelled_file(path, overrides, &set_labels(overrides), quiet)
}

/// How `--set` overrides are named in errors.
pub fn set_labels(overrides: &[String]) -> Vec<String> {
    overrides.iter().map(|o| format!("--set {o}")).collect()
}

/// [`run_file_until_stopped`] where `labels[i]` is the flag the `i`th override came from,
/// so an error it alone causes names that flag.
fn run_labelled_file(
    path: &std::path::Path,
    overrides: &[String],
    labels: &[String],
    quiet: bool,
) -> CliResult<FileRun> {
    let flagged =
        |e: kbench_core::experiment::ExperimentError| spec_error(&e.with_flag_labels(labels));
    super::engine::prepare_models_flagged(path, overrides, &flagged)?;
    let variants = load_experiment(path, overrides).map_err(flagged)?;
    let mut reports = Vec::with_capacity(variants.len());
    for v in &variants {
        let (report, stopped) = run_variant(v, quiet)?;
        reports.extend(report);
        if stopped.is_some() {
            return Ok(FileRun { reports, stopped });
        }
    }
    Ok(FileRun {
        reports,
        stopped: None,
    })
}

/// A variant's report, or none when it stopped before its first level finished; and why
/// it stopped.
fn run_variant(variant: &Variant, quiet: bool) -> CliResult<(Option<Report>, Option<CliError>)> {
    let exp = &variant.experiment;
    // in a sweep, say which variant a deployment that cannot start belongs to
    let mut backend = make_backend(exp).map_err(|e| in_variant(variant, e))?;
    if !quiet {
        backend.set_notice(Box::new(|what| eprintln!("{what}")));
    }
    let plan = LoadPlan::from_experiment(exp);
    let label = match &variant.name {
        Some(v) => format!("{} [{v}]", exp.file.name),
        None => exp.file.name.clone(),
    };
    let mut progress = LevelProgress::new(label, quiet);
    let run = run_levels_until_stopped(backend.as_mut(), &plan, &mut progress);
    progress.finish();
    let stopped = run.stopped.map(|e| CliError::from_error(&e));
    if run.levels.is_empty() {
        return Ok((None, stopped));
    }
    let mut report = build_report(exp, variant.name.as_deref(), backend.as_ref(), &run.levels);
    report.partial = stopped
        .as_ref()
        .map(|e| e.message.replace("\n  caused by: ", ": "));
    Ok((Some(report), stopped))
}

/// Command-line flags are `--set` overrides with friendlier names; they win over the file.
fn command_line_overrides(args: &ExperimentArgs) -> CliResult<Vec<(String, String)>> {
    let mut o: Vec<(String, String)> = args
        .set
        .iter()
        .map(|a| (a.clone(), format!("--set {a}")))
        .collect();
    if let Some(b) = &args.backend {
        o.push((format!("backend.kind=\"{b}\""), format!("--backend {b}")));
    }
    if let Some(url) = &args.server_url {
        if args.backend.as_deref().is_some_and(|b| b != "http") {
            return Err(CliError::new(
                exit::USAGE,
                "--server-url drives the http backend; drop --backend or say --backend http",
            ));
        }
        let flag = format!("--server-url {url}");
        o.push(("backend.kind=\"http\"".into(), flag.clone()));
        o.push((
            format!("backend.http.url={}", toml::Value::String(url.clone())),
            flag,
        ));
    }
    if !args.concurrency.is_empty() {
        let list: Vec<String> = args.concurrency.iter().map(|c| c.to_string()).collect();
        o.push((
            format!("benchmark.concurrency=[{}]", list.join(", ")),
            format!("--concurrency {}", list.join(",")),
        ));
    }
    if !args.request_rate.is_empty() {
        let mut rates = Vec::new();
        for r in &args.request_rate {
            let v: f64 = r
                .trim()
                .parse()
                .ok()
                .filter(|v: &f64| *v > 0.0)
                .ok_or_else(|| {
                    CliError::new(
                        exit::USAGE,
                        format!(
                            "--request-rate {r}: a number of requests per second above 0, or inf"
                        ),
                    )
                })?;
            rates.push(if v.is_infinite() {
                "inf".to_string()
            } else {
                format!("{v:?}")
            });
        }
        let flag = format!("--request-rate {}", args.request_rate.join(","));
        o.push((
            format!("benchmark.request_rate=[{}]", rates.join(", ")),
            flag.clone(),
        ));
        if args.concurrency.is_empty() {
            o.push(("benchmark.concurrency=[]".into(), flag));
        }
    }
    if let Some(b) = args.burstiness {
        let toml_float = if b.is_nan() {
            "nan".to_string()
        } else if b.is_infinite() {
            "inf".to_string()
        } else {
            format!("{b:?}")
        };
        o.push((
            format!("benchmark.burstiness={toml_float}"),
            format!("--burstiness {b}"),
        ));
    }
    if let Some(n) = args.max_concurrency {
        o.push((
            format!("benchmark.max_concurrency={n}"),
            format!("--max-concurrency {n}"),
        ));
    }
    if let Some(n) = args.requests_per_level {
        o.push((
            format!("benchmark.requests_per_level={n}"),
            format!("--requests-per-level {n}"),
        ));
    }
    if let Some(n) = args.requests_per_client {
        o.push((
            format!("benchmark.requests_per_client={n}"),
            format!("--requests-per-client {n}"),
        ));
    }
    if let Some(n) = args.warmup_requests {
        o.push((
            format!("benchmark.warmup_requests={n}"),
            format!("--warmup-requests {n}"),
        ));
    }
    if let Some(n) = args.max_tokens {
        if n <= 0 {
            return Err(CliError::new(
                exit::USAGE,
                format!("--max-tokens {n}: must be 1 or more"),
            ));
        }
        if n > u32::MAX as i64 {
            return Err(CliError::new(
                exit::USAGE,
                format!(
                    "--max-tokens {n}: more output tokens than a request can ask (at most {}, and no model's context holds that many)",
                    u32::MAX
                ),
            ));
        }
        o.push((
            format!("workload.max_tokens={n}"),
            format!("--max-tokens {n}"),
        ));
    }
    Ok(o)
}

fn write_outputs(args: &ExperimentArgs, reports: &[Report]) -> CliResult<()> {
    if let Some(path) = &args.json {
        if reports.len() == 1 {
            write_json(path, &reports[0])?;
        } else {
            write_json(
                path,
                &SweepReport {
                    format_version: kbench_core::report::REPORT_FORMAT_VERSION,
                    experiment: reports[0].experiment.name.clone(),
                    variants: reports.to_vec(),
                },
            )?;
        }
    }
    if let Some(path) = &args.csv {
        write_file(path, render::csv::levels_csv(reports).as_bytes())?;
    }
    if let Some(path) = &args.plot {
        write_file(path, render::plot::throughput_svg(reports)?.as_bytes())?;
    }
    Ok(())
}

/// Checks the file and everything its backend will read (trace, profile, op tables,
/// model), without serving a request.
pub fn validate(args: ValidateArgs) -> CliResult<()> {
    super::engine::prepare_models(&args.file, &args.set)?;
    let variants = load_experiment(&args.file, &args.set).map_err(|e| spec_error(&e))?;
    for v in &variants {
        super::backends::check_backend(&v.experiment).map_err(|e| in_variant(v, e))?;
    }
    let mut out = super::output::stdout();
    for v in &variants {
        let e = &v.experiment;
        let name = match &v.name {
            Some(n) => format!("{} [{n}]", e.file.name),
            None => e.file.name.clone(),
        };
        let s = &e.speculative;
        let spec = if s.is_speculative() {
            format!(
                "{} steps={} topk={} draft_tokens={} {}",
                s.algorithm.name_in(e.engine.kind),
                s.shape.num_steps,
                s.shape.topk,
                s.shape.num_draft_tokens,
                if s.spec_v2 { "v2" } else { "v1" }
            )
        } else {
            "no speculation".into()
        };
        writeln!(
            out,
            "ok: {name}: {} on {}, tp {}, {spec}, levels {}",
            e.model.name,
            e.hardware,
            e.tp_size,
            describe_levels(e)
        )
        .map_err(|err| io_error(exit::OUTPUT, "writing to stdout", err))?;
        for note in &e.notes {
            writeln!(out, "  note: {note}").ok();
        }
        for w in &e.warnings {
            writeln!(out, "  warning: {w}").ok();
        }
        for u in &s.unsupported {
            writeln!(out, "  unsupported by SGLang: {u}").ok();
        }
    }
    Ok(())
}

/// The levels a file runs, as `validate` prints them: concurrency, then request rates.
fn describe_levels(e: &kbench_core::experiment::Experiment) -> String {
    let mut parts = Vec::new();
    if !e.concurrency.is_empty() {
        parts.push(format!("{:?}", e.concurrency));
    }
    if !e.request_rates.is_empty() {
        let rates: Vec<String> = e
            .request_rates
            .iter()
            .map(|r| {
                if r.is_infinite() {
                    "inf".into()
                } else {
                    r.to_string()
                }
            })
            .collect();
        let cap = e
            .max_concurrency
            .map(|c| format!(", max_concurrency {c}"))
            .unwrap_or_default();
        parts.push(format!(
            "request rates [{}]/s (burstiness {}{cap})",
            rates.join(", "),
            e.burstiness
        ));
    }
    parts.join(" then ")
}
