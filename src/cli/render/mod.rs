//! Report renderings: terminal table, CSV, SVG plot.

pub mod compare;
pub mod csv;
pub mod fidelity;
pub mod plot;
pub mod search;
pub mod table;
