//! What the simulator assumes about the benchmark client (`[backend.sim]`): a closed-loop
//! client sends its next request when the last byte of the previous response reaches it,
//! and that request reaches the scheduler `client_to_scheduler_us` later (the client's turn
//! around, loopback, the server's HTTP front end). It then waits for the forward in
//! progress: the scheduler takes new requests only between forwards. Requests a client
//! sends together leave it one after another, `client_send_interval_us` apart, so an idle
//! scheduler starts on the first before the others are there. A live backend measures all
//! of this for real; `kbench serve --sim` gets it from the real client and sets it to 0.

use serde::Deserialize;

use crate::error::SimError;

/// kbench's own http client against `kbench serve --sim` on loopback, this project's 2-core
/// machine (docs/cost-model.md, "The client"): C=1 TTFT 0.95 ms above the simulator's
/// with no client term, both ways of the loopback together; one way is taken as half.
pub const DEFAULT_CLIENT_TO_SCHEDULER_US: f64 = 500.0;

/// The same client sending requests together: 0.05-0.2 ms apart at the served simulator.
pub const DEFAULT_CLIENT_SEND_INTERVAL_US: f64 = 100.0;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimSettings {
    #[serde(default = "default_client")]
    pub client_to_scheduler_us: f64,
    #[serde(default = "default_interval")]
    pub client_send_interval_us: f64,
}

fn default_client() -> f64 {
    DEFAULT_CLIENT_TO_SCHEDULER_US
}

fn default_interval() -> f64 {
    DEFAULT_CLIENT_SEND_INTERVAL_US
}

impl SimSettings {
    pub fn of(exp: &kbench_core::experiment::Experiment) -> Result<SimSettings, SimError> {
        let s: SimSettings = exp
            .file
            .backend
            .parse("sim")
            .map_err(|m| SimError::Model(format!("{}: {m}", exp.path.display())))?;
        for (key, us) in [
            ("client_to_scheduler_us", s.client_to_scheduler_us),
            ("client_send_interval_us", s.client_send_interval_us),
        ] {
            if !(us.is_finite() && (0.0..=60e6).contains(&us)) {
                return Err(SimError::Model(format!(
                    "{}: [backend.sim] {key} = {us} must be between 0 and 60,000,000 (a minute)",
                    exp.path.display()
                )));
            }
        }
        Ok(s)
    }

    pub fn client_to_scheduler_ns(&self) -> u64 {
        (self.client_to_scheduler_us * 1e3).round() as u64
    }

    pub fn client_send_interval_ns(&self) -> u64 {
        (self.client_send_interval_us * 1e3).round() as u64
    }
}
