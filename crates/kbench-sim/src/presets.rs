//! Hardware and engine presets compiled into the binary (so `kbench` works from any
//! directory), and resolution of an experiment's [`HardwareRef`] to a profile plus its op
//! tables, and of its `[engine]` to an engine profile.

use crate::memo::Memo;
use kbench_core::experiment::{EngineProfileRef, Experiment, HardwareRef};

use crate::engine_profile::EngineProfile;
use crate::error::SimError;
use crate::optable::OpTables;
use crate::profile::HardwareProfile;

/// (preset name, file it was compiled from, contents).
const PRESETS: &[(&str, &str, &str)] = &[
    (
        "8x-rtx-pro-6000-server",
        "experiments/hardware/8x-rtx-pro-6000-server.toml",
        include_str!("../../../experiments/hardware/8x-rtx-pro-6000-server.toml"),
    ),
    (
        "8x-h200",
        "experiments/hardware/8x-h200.toml",
        include_str!("../../../experiments/hardware/8x-h200.toml"),
    ),
    (
        "h200",
        "experiments/hardware/h200.toml",
        include_str!("../../../experiments/hardware/h200.toml"),
    ),
    (
        "8x-h100",
        "experiments/hardware/8x-h100.toml",
        include_str!("../../../experiments/hardware/8x-h100.toml"),
    ),
    (
        "8x-b200",
        "experiments/hardware/8x-b200.toml",
        include_str!("../../../experiments/hardware/8x-b200.toml"),
    ),
    (
        "8x-b300",
        "experiments/hardware/8x-b300.toml",
        include_str!("../../../experiments/hardware/8x-b300.toml"),
    ),
];

/// (preset name, file it was compiled from, contents).
const ENGINE_PRESETS: &[(&str, &str, &str)] = &[
    (
        "sglang",
        "experiments/engines/sglang.toml",
        include_str!("../../../experiments/engines/sglang.toml"),
    ),
    (
        "sglang-8x-rtx-pro-6000-server",
        "experiments/engines/sglang-8x-rtx-pro-6000-server.toml",
        include_str!("../../../experiments/engines/sglang-8x-rtx-pro-6000-server.toml"),
    ),
    (
        "vllm",
        "experiments/engines/vllm.toml",
        include_str!("../../../experiments/engines/vllm.toml"),
    ),
    (
        "vllm-8x-rtx-pro-6000-server",
        "experiments/engines/vllm-8x-rtx-pro-6000-server.toml",
        include_str!("../../../experiments/engines/vllm-8x-rtx-pro-6000-server.toml"),
    ),
    (
        "vllm-8x-h200",
        "experiments/engines/vllm-8x-h200.toml",
        include_str!("../../../experiments/engines/vllm-8x-h200.toml"),
    ),
    (
        "vllm-0.20-8x-h200",
        "experiments/engines/vllm-0.20-8x-h200.toml",
        include_str!("../../../experiments/engines/vllm-0.20-8x-h200.toml"),
    ),
    (
        "vllm-minimax-m3-h200",
        "experiments/engines/vllm-minimax-m3-h200.toml",
        include_str!("../../../experiments/engines/vllm-minimax-m3-h200.toml"),
    ),
];

pub fn engine_preset_names() -> Vec<&'static str> {
    ENGINE_PRESETS.iter().map(|p| p.0).collect()
}

pub fn engine_preset(name: &str) -> Result<EngineProfile, SimError> {
    let (_, file, text) = ENGINE_PRESETS.iter().find(|p| p.0 == name).ok_or_else(|| {
        SimError::UnknownEnginePreset {
            name: name.into(),
            known: engine_preset_names().join(", "),
            at: None,
        }
    })?;
    static PARSED: Memo<EngineProfile> = Memo::new();
    PARSED.get_or_try(name, || {
        EngineProfile::from_toml_str(text, &format!("engine preset `{name}` ({file}, embedded)"))
    })
}

/// The experiment's engine profile: the one it names, else the engine's profile for its
/// hardware (`<engine>-<hardware name>`) where one ships, else the engine's generic priors.
pub fn resolve_engine_profile(
    exp: &Experiment,
    hardware: &HardwareProfile,
) -> Result<EngineProfile, SimError> {
    let kind = exp.engine.kind.name();
    let profile = match &exp.engine.profile {
        Some(EngineProfileRef::Preset(name)) => engine_preset(name)?,
        Some(EngineProfileRef::Profile(path)) => EngineProfile::from_file(path)?,
        None => {
            let for_box = format!("{kind}-{}", hardware.name);
            if engine_preset_names().contains(&for_box.as_str()) {
                engine_preset(&for_box)?
            } else {
                engine_preset(kind)?
            }
        }
    };
    if profile.engine != kind {
        return Err(SimError::EngineProfile {
            origin: profile.origin.clone(),
            message: format!(
                "the profile describes {}, but {} runs [engine] name = \"{kind}\"",
                profile.engine,
                exp.path.display()
            ),
        });
    }
    Ok(profile)
}

pub fn preset_names() -> Vec<&'static str> {
    PRESETS.iter().map(|p| p.0).collect()
}

pub fn preset(name: &str) -> Result<HardwareProfile, SimError> {
    let (_, file, text) =
        PRESETS
            .iter()
            .find(|p| p.0 == name)
            .ok_or_else(|| SimError::UnknownPreset {
                name: name.into(),
                known: preset_names().join(", "),
                at: None,
            })?;
    static PARSED: Memo<HardwareProfile> = Memo::new();
    PARSED.get_or_try(name, || {
        HardwareProfile::from_toml_str(text, &format!("preset `{name}` ({file}, embedded)"))
    })
}

pub fn resolve_profile(hw: &HardwareRef) -> Result<HardwareProfile, SimError> {
    match hw {
        HardwareRef::Preset(name) => preset(name),
        HardwareRef::Profile(path) => HardwareProfile::from_file(path),
    }
}

/// The box a profile's op tables were measured on, where its GPU is not the profile's own
/// (a datasheet-only profile borrowing another GPU's tables).
pub fn tables_measured_on(profile: &HardwareProfile) -> Result<Option<HardwareProfile>, SimError> {
    let Some(name) = profile.optables.as_ref().and_then(|t| t.measured_on()) else {
        return Ok(None);
    };
    let home = preset(name).map_err(|e| SimError::Profile {
        origin: profile.origin.clone(),
        message: format!("[optables] measured_on: {e}"),
    })?;
    Ok(
        (home.gpu.name != profile.gpu.name || home.interconnect.name != profile.interconnect.name)
            .then_some(home),
    )
}

/// The op tables a profile points at (None: roofline only).
pub fn load_tables(profile: &HardwareProfile) -> Result<Option<OpTables>, SimError> {
    let Some(t) = &profile.optables else {
        return Ok(None);
    };
    match (&t.system, &t.dir) {
        (Some(system), None) => OpTables::embedded(system).map(Some),
        (None, Some(dir)) => {
            let base = profile.base_dir.clone().unwrap_or_else(|| ".".into());
            OpTables::from_dir(&base.join(dir)).map(Some)
        }
        _ => Err(SimError::Profile {
            origin: profile.origin.clone(),
            message: "[optables] needs exactly one of `system` or `dir`".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_parses_and_has_tables() {
        for name in preset_names() {
            let p = preset(name).unwrap();
            assert!(load_tables(&p).unwrap().is_some(), "{name}");
        }
    }

    #[test]
    fn every_engine_preset_parses() {
        for name in engine_preset_names() {
            let p = engine_preset(name).unwrap();
            assert_eq!(p.name, name);
        }
    }

    #[test]
    fn unknown_preset_lists_known_ones() {
        let e = preset("nope").unwrap_err().to_string();
        assert!(e.contains("8x-rtx-pro-6000-server"), "{e}");
    }
}
