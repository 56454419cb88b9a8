//! What a run took for granted where its source is silent (`experiment.assumptions` in the
//! JSON), printed once for all the variants of a sweep so a reader of the table sees it
//! without opening the JSON.

use std::collections::BTreeMap;
use std::io::{self, Write};

use kbench_core::report::Report;

use super::table::wrap;

pub fn write_assumptions(out: &mut dyn Write, reports: &[Report]) -> io::Result<()> {
    // each assumption once, in the order first met, with the variants that make it
    let mut order: Vec<&str> = Vec::new();
    let mut made_by: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for r in reports {
        let name = r
            .experiment
            .variant
            .clone()
            .unwrap_or_else(|| r.experiment.name.clone());
        for a in &r.experiment.assumptions {
            let by = made_by.entry(a.as_str()).or_default();
            if by.is_empty() {
                order.push(a);
            }
            by.push(name.clone());
        }
    }
    if order.is_empty() {
        return Ok(());
    }
    writeln!(out, "== assumed (where the experiment's source is silent)")?;
    for a in order {
        let by = &made_by[a];
        let text = if reports.len() > 1 && by.len() < reports.len() {
            format!("{a} [{}]", by.join(", "))
        } else {
            a.to_string()
        };
        for (i, line) in wrap(&text, 94).iter().enumerate() {
            let bullet = if i == 0 { "- " } else { "  " };
            writeln!(out, "   {bullet}{line}")?;
        }
    }
    writeln!(out)
}
