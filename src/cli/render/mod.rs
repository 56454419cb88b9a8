//! Report renderings: terminal table, CSV, SVG plot.

pub mod csv;
pub mod plot;
pub mod table;
