//! `kbench search`: prepare the space, run it on the simulator, render the answer.

use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kbench_search::report::SearchReport;
use kbench_search::{SearchError, SearchFlags};

use super::args::SearchArgs;
use super::error::{io_error, spec_error, CliError, CliResult};
use super::exit;
use super::output::{write_file, write_json};
use super::render;

pub fn run(args: SearchArgs) -> CliResult<()> {
    super::output::check_output_paths(
        [&args.json, &args.csv, &args.plot, &args.emit]
            .into_iter()
            .flatten(),
    )?;
    super::output::check_plot_path(args.plot.as_ref())?;
    let flags = SearchFlags {
        space: args.space.clone(),
        objective: args.objective.clone(),
        at: args.at.clone(),
        slo: args.slo.clone(),
        top: args.top,
        max_candidates: args.max_candidates,
        allow_unsupported: args.allow_unsupported,
    };
    let mut set = args.set.clone();
    if flags.allow_unsupported {
        set.push("speculative.allow_unsupported=true".into());
    }
    super::engine::prepare_models(&args.file, &set)?;
    let prepared =
        kbench_search::prepare(&args.file, &set, &flags).map_err(|e| search_error(&e))?;
    super::interrupt::install();
    let progress = CandidateProgress::new(args.quiet);
    let evaluated = kbench_search::evaluate(&prepared, args.threads, &|done, total| {
        progress.tick(done, total)
    })
    .map_err(|e| search_error(&e))?;
    progress.finish();
    let report =
        kbench_search::report::build(&prepared, &evaluated).map_err(|e| search_error(&e))?;
    if !args.quiet {
        let mut out = super::output::stdout();
        render::search::write_search(&mut out, &report, prepared.settings.top, args.pareto)
            .map_err(|e| io_error(exit::OUTPUT, "writing to stdout", e))?;
        out.flush().ok();
    }
    write_outputs(&args, &prepared, &evaluated, &report)?;
    if report.ranked.is_empty() {
        return Err(CliError::new(
            exit::CHECK_FAILED,
            format!(
                "{}: no candidate {} ({} ran, {} skipped by rule)",
                args.file.display(),
                if report.slos.is_empty() {
                    "has a value for the objective".to_string()
                } else {
                    format!("meets {}", report.slos.join(", "))
                },
                report.ran,
                report.skipped_by_rule.values().sum::<usize>()
            ),
        ));
    }
    Ok(())
}

fn write_outputs(
    args: &SearchArgs,
    prepared: &kbench_search::Prepared,
    evaluated: &[kbench_search::Evaluated],
    report: &SearchReport,
) -> CliResult<()> {
    if let Some(path) = &args.json {
        write_json(path, report)?;
    }
    if let Some(path) = &args.csv {
        write_file(path, kbench_search::report::csv(report).as_bytes())?;
    }
    if let Some(path) = &args.plot {
        write_file(path, render::frontier::frontier_svg(report)?.as_bytes())?;
    }
    if let Some(path) = &args.emit {
        let Some(&winner) = report.ranked.first() else {
            return Err(CliError::new(
                exit::CHECK_FAILED,
                format!(
                    "--emit {}: no candidate was ranked, so there is no winner to write",
                    path.display()
                ),
            ));
        };
        let note = format!(
            "The best of {} candidates found by `kbench search` ({}{}).",
            report.candidates_total,
            report.objective,
            if report.slos.is_empty() {
                String::new()
            } else {
                format!(" under {}", report.slos.join(", "))
            }
        );
        let text =
            kbench_search::emit::emitted_text(prepared, &evaluated[winner].candidate, path, &note)
                .map_err(|e| search_error(&e))?;
        write_file(path, text.as_bytes())?;
        // what was written must load as the winner did
        kbench_core::experiment::load_experiment(path, &[]).map_err(|e| {
            spec_error(&e).prefixed(format!(
                "--emit wrote {} but it does not load",
                path.display()
            ))
        })?;
    }
    Ok(())
}

/// A search failure as the CLI shows it: an experiment-file error points into the file.
fn search_error(e: &SearchError) -> CliError {
    match e {
        SearchError::Spec(s) => spec_error(s),
        e => CliError::from_error(e),
    }
}

/// A bar on stderr once the search has taken more than a second.
struct CandidateProgress {
    quiet: bool,
    started: Instant,
    bar: Mutex<Option<ProgressBar>>,
}

impl CandidateProgress {
    fn new(quiet: bool) -> CandidateProgress {
        CandidateProgress {
            quiet,
            started: Instant::now(),
            bar: Mutex::new(None),
        }
    }

    fn tick(&self, done: usize, total: usize) {
        if self.quiet || self.started.elapsed() < Duration::from_secs(1) {
            return;
        }
        let Ok(mut bar) = self.bar.lock() else { return };
        let bar = bar.get_or_insert_with(|| {
            let b = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template(
                    "search [{bar:30}] {pos}/{len} candidates ({elapsed}, {eta} left)",
                )
                .expect("static template")
                .progress_chars("=> "),
            );
            b
        });
        bar.set_position(done as u64);
    }

    fn finish(&self) {
        if let Ok(mut bar) = self.bar.lock() {
            if let Some(b) = bar.take() {
                b.finish_and_clear();
            }
        }
    }
}
