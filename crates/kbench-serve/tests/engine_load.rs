//! What the engine worker is asked to load is checked before it loads anything.

use kbench_engine::Device;
use kbench_serve::engine::{spawn, EngineLoad};
use kbench_serve::ServeError;

/// A batch cap of 0 is refused, not raised to 1 behind the reported setting's back. The
/// model folder does not exist: the cap is refused before any load is tried.
#[test]
fn a_batch_cap_of_zero_is_refused() {
    let how = EngineLoad {
        model_dir: "no/such/model".into(),
        draft_dir: None,
        device: Device::Cpu,
        spec: None,
        max_running: 0,
        prefill_chunk: None,
        max_prompt_tokens: Some(16),
        context_length: 64,
    };
    match spawn(how) {
        Err(ServeError::Config(m)) => assert!(m.contains("at least 1"), "{m}"),
        Err(e) => panic!("expected the cap refused, got: {e}"),
        Ok(_) => panic!("a cap of 0 was accepted"),
    }
}
