//! kbench-core: what every backend shares. It knows no backend.

pub mod acceptance;
pub mod arch;
pub mod arrivals;
pub mod atomic;
pub mod backend;
pub mod compare;
pub mod distribution;
pub mod duration;
pub mod error_chain;
pub mod experiment;
pub mod footprint;
pub mod harness;
pub mod input;
pub mod interrupt;
pub mod lengths;
pub mod metrics;
pub mod prompt;
pub mod report;
pub mod seed;
pub mod stack_profile;
pub mod trace;
pub mod tree;
pub mod verify;
