//! Ctrl-C during a run: the first stops it between requests, so the finished levels are
//! reported (marked partial) and a launched server is stopped; the second quits at once.

use std::sync::atomic::{AtomicBool, Ordering};

use super::exit;

static INSTALLED: AtomicBool = AtomicBool::new(false);

pub fn install() {
    if INSTALLED.swap(true, Ordering::SeqCst) {
        return;
    }
    // Without a handler, Ctrl-C still ends the process, only without the partial report.
    let _ = ctrlc::set_handler(|| {
        if kbench_core::interrupt::requested() {
            eprintln!("\ninterrupted again: quitting now");
            std::process::exit(exit::INTERRUPTED);
        }
        eprintln!("\ninterrupted: stopping the run; finished levels are still reported (Ctrl-C again to quit now)");
        kbench_core::interrupt::request();
    });
}
