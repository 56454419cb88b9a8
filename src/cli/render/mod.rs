//! Report renderings: terminal table, CSV, SVG plots.

pub mod assumptions;
mod chart;
pub mod compare;
pub mod csv;
pub mod fidelity;
pub mod frontier;
mod panel;
pub mod parity;
pub mod plot;
pub mod search;
pub mod table;
