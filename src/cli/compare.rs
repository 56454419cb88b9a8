//! `kbench compare A.json B.json [...]`: any reports (sim, engine, http) side by side.

use std::io::Write;

use kbench_core::compare::reports_from_json;
use kbench_core::report::Report;

use super::args::CompareArgs;
use super::error::{io_error, CliError, CliResult};
use super::exit;
use super::output::write_file;
use super::render;

pub fn run(args: CompareArgs) -> CliResult<()> {
    let mut reports: Vec<Report> = Vec::new();
    let mut labels = Vec::new();
    for path in &args.reports {
        let text = std::fs::read_to_string(path).map_err(|e| {
            io_error(
                exit::INVALID_INPUT,
                format!("reading {}", path.display()),
                e,
            )
        })?;
        let file_reports = reports_from_json(&text)
            .map_err(|e| CliError::from_error(&e).prefixed(path.display()))?;
        let file = path.display().to_string();
        for r in file_reports {
            labels.push(render::compare::label(reports.len(), &file, &r));
            reports.push(r);
        }
    }
    super::output::check_output_paths(&args.plot)?;
    super::output::check_plot_path(args.plot.as_ref())?;
    if reports.len() < 2 {
        return Err(CliError::new(
            exit::INVALID_INPUT,
            "compare needs two or more reports (these files hold one)",
        ));
    }
    let mut out = super::output::stdout();
    render::compare::write_comparison(&mut out, &reports, &labels)
        .and_then(|()| render::assumptions::write_assumptions(&mut out, &reports))
        .map_err(|e| io_error(exit::OUTPUT, "writing to stdout", e))?;
    out.flush().ok();
    if let Some(path) = &args.plot {
        let short: Vec<String> = labels
            .iter()
            .map(|l| l.split(": ").nth(1).unwrap_or(l).to_string())
            .enumerate()
            .map(|(i, l)| format!("#{} {l}", i + 1))
            .collect();
        let svg = render::plot::labelled_throughput_svg(&reports, &short, "compare")?;
        write_file(path, svg.as_bytes())?;
    }
    Ok(())
}
