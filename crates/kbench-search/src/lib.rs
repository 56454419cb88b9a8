//! kbench-search: the best speculative configuration under latency SLOs, over a declared
//! space of experiment keys, on the simulator, with the reasons it wins.
//!
//! - [`settings`]: the `[search]` table and its flags; [`space`]: axes and candidates;
//!   [`prepare`]: from a file to the candidates, bounded and checked.
//! - [`evaluate`]: every candidate run in parallel, deterministically.
//! - [`objective`]: objectives, places (`at`) and SLOs over report metrics;
//!   [`select`]: scores, ranking, margin over plain decoding, the Pareto frontier.
//! - [`explain`]: one round of a candidate, decomposed; [`emit`]: a candidate as a file.
//! - [`report`]: the whole search as JSON and CSV.

pub mod emit;
pub mod error;
pub mod evaluate;
pub mod explain;
pub mod objective;
pub mod prepare;
pub mod report;
pub mod select;
pub mod settings;
pub mod space;

pub use error::SearchError;
pub use evaluate::{evaluate, Evaluated, Outcome};
pub use prepare::{prepare, Prepared};
pub use settings::{SearchFlags, SearchSettings};
