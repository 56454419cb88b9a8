//! Wiring: parse, dispatch, render, exit.

mod args;
mod backends;
mod calibrate;
mod calibrate_passes;
mod compare;
mod engine;
pub mod error;
pub mod exit;
pub mod experiment;
mod fidelity;
mod interrupt;
mod output;
mod progress;
pub mod render;
pub mod search;
mod serve;
mod trace_cmd;

use clap::Parser;

pub use args::Cli;
use args::Command;
use error::CliResult;
use kbench_core::experiment::ServingEngineKind;

/// Runs the command line and returns the process exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
        }
    };
    match dispatch(cli) {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("error: {}", e.message);
            e.code
        }
    }
}

fn dispatch(cli: Cli) -> CliResult<()> {
    match cli.command {
        Command::Experiment(a) => experiment::run(a),
        Command::Validate(a) => experiment::validate(a),
        Command::Trace(t) => trace_cmd::run(t),
        Command::Calibrate(a) => calibrate::run(a),
        Command::CalibratePasses(a) => calibrate_passes::run(a),
        Command::Model(m) => engine::model_command(m),
        Command::Generate(a) => engine::generate(a),
        Command::Kernels(k) => engine::kernels_command(k),
        Command::Serve(a) => serve::run(a),
        Command::SglangArgs(a) => experiment::launch_args(
            a,
            ServingEngineKind::Sglang,
            kbench_http::launch::sglang_command,
        ),
        Command::VllmArgs(a) => experiment::launch_args(
            a,
            ServingEngineKind::Vllm,
            kbench_http::vllm_args::vllm_command,
        ),
        Command::Compare(a) => compare::run(a),
        Command::Fidelity(a) => fidelity::run(a),
        Command::Search(a) => search::run(a),
    }
}
