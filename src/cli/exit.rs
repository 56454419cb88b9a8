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
/// A check the command runs (kernel compilation, calibration quality) did not pass.
pub const CHECK_FAILED: i32 = 6;
/// Ctrl-C stopped the run (128 + SIGINT, as shells report it); finished levels were written.
pub const INTERRUPTED: i32 = 130;
