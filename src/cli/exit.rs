//! Process exit codes, one per kind of failure, so scripts can tell them apart.

pub const OK: i32 = 0;
/// Something failed that has no more specific code.
pub const FAILURE: i32 = 1;
/// The command line itself was wrong (clap's own code).
pub const USAGE: i32 = 2;
/// An input file (experiment, trace, model, profile, measurement) is missing or invalid.
pub const INVALID_INPUT: i32 = 3;
/// The backend failed while serving.
pub const BACKEND: i32 = 4;
/// An output file could not be written.
pub const OUTPUT: i32 = 5;
/// A check the command runs did not pass (`kernels check` found a kernel that does not
/// compile; `search` ranked no candidate).
pub const CHECK_FAILED: i32 = 6;
/// Ctrl-C stopped the run (128 + SIGINT, as shells report it); finished levels were written.
pub const INTERRUPTED: i32 = 130;

/// The codes above as `kbench --help` lists them; kept beside them so the two agree.
pub const HELP: &str = "Exit codes:
  0    success
  1    a failure with no more specific code
  2    the command line is wrong
  3    an input (experiment, trace, model, profile, corpus) is missing or invalid
  4    the backend failed while serving (a server that died, an engine error)
  5    an output file could not be written
  6    a check did not pass (kernels check; a search that ranks nothing)
  130  interrupted (Ctrl-C); the levels that finished were written";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_help_lists_every_code() {
        for code in [
            OK,
            FAILURE,
            USAGE,
            INVALID_INPUT,
            BACKEND,
            OUTPUT,
            CHECK_FAILED,
            INTERRUPTED,
        ] {
            let line = format!("\n  {code:<4} ");
            assert!(HELP.contains(&line), "{code} missing from the help");
        }
    }
}
