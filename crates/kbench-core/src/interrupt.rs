//! Ctrl-C as a request to stop: the CLI's signal handler raises it, the harness and the
//! backends that wait on a wall clock look at it, so a run stops between requests and the
//! levels finished so far are still reported (and a launched server is still stopped).

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// Asks every running level to stop at its next chance.
pub fn request() {
    REQUESTED.store(true, Ordering::SeqCst);
}

pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}
