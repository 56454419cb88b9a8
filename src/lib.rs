//! The `kbench` command line: parses arguments, wires the library crates, renders results
//! and errors. All the work lives in crates/.

pub mod cli;
