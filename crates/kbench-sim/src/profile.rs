//! Hardware profiles: what a box can do, each number with where it came from.
//!
//! A profile is TOML (format in docs/cost-model.md). Every numeric value is a [`Param`]
//! carrying its provenance (`datasheet`, `measured`, `fitted`, `prior`) and a source
//! string, so a report can say which parts of a prediction are physics, which are
//! measurements and which were fitted to the very numbers it is compared with.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::SimError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provenance {
    /// A vendor's number (a lead, not a measurement).
    Datasheet,
    /// Measured on the hardware (op tables, microbenchmarks).
    Measured,
    /// Fitted by `kbench calibrate` to end-to-end measurements.
    Fitted,
    /// A stated guess, not yet calibrated on this box.
    Prior,
}

/// One value of a profile with its provenance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Param {
    pub value: f64,
    pub source: Provenance,
    /// Where the value comes from (datasheet, file, fit).
    #[serde(rename = "ref")]
    pub reference: String,
}

impl Param {
    pub fn new(value: f64, source: Provenance, reference: impl Into<String>) -> Param {
        Param {
            value,
            source,
            reference: reference.into(),
        }
    }
}

/// One list of a profile's dotted keys and the fields they name, from which the key list
/// (`$keys`, in file order) and `param` / `param_mut` are derived, so a new value is added in
/// one place.
macro_rules! param_table {
    ($(#[$doc:meta])* $ty:ty, $keys:ident, { $($key:literal => $first:ident $(. $rest:ident)*,)* }) => {
        $(#[$doc])*
        pub const $keys: &[&str] = &[$($key),*];

        impl $ty {
            pub fn param(&self, key: &str) -> Option<&Param> {
                Some(match key {
                    $($key => &self.$first$(.$rest)*,)*
                    _ => return None,
                })
            }

            pub fn param_mut(&mut self, key: &str) -> Option<&mut Param> {
                Some(match key {
                    $($key => &mut self.$first$(.$rest)*,)*
                    _ => return None,
                })
            }
        }
    };
}
pub(crate) use param_table;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSection {
    pub name: String,
    /// GPUs in the box (the tensor-parallel group is the experiment's tp_size <= count).
    pub count: u32,
    pub memory_gib: Param,
    /// Per-GPU memory bandwidth, GB/s (1e9 bytes/s).
    pub mem_bandwidth_gbs: Param,
    /// Dense BF16 tensor throughput, TFLOP/s.
    pub bf16_tflops: Param,
    /// Effective W4A16 (INT4 weights, BF16 math) tensor throughput, TFLOP/s.
    pub int4_tflops: Param,
    /// Dense FP8 tensor throughput, TFLOP/s (FP8 and MXFP8 checkpoints' GEMMs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8_tflops: Option<Param>,
    /// Dense FP4 tensor throughput, TFLOP/s (NVFP4 / MXFP4 with FP4 activations; Blackwell).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp4_tflops: Option<Param>,
    /// Shortest time a kernel takes on this GPU (launch + tail), microseconds: the floor of
    /// every roofline-priced operator.
    pub min_kernel_us: Param,
    /// CUDA compute capability (9.0 for Hopper, 10.0 for B200): what engines choose kernels
    /// by, such as the block-scaled MXFP8 GEMMs vLLM runs only at 10.0 and up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<Param>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterconnectSection {
    /// Name for reports (`PCIe Gen5, no NVLink`).
    pub name: String,
    /// All-reduce roofline used when no NCCL table is given: latency (us) ...
    pub all_reduce_latency_us: Param,
    /// ... plus bytes / bus bandwidth (GB/s, NCCL's busbw convention).
    pub all_reduce_bus_gbs: Param,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EfficiencySection {
    /// Fraction of memory bandwidth a roofline-priced operator reaches.
    pub mem_bw: Param,
    /// Fraction of tensor throughput a roofline-priced operator reaches.
    pub flops: Param,
    /// Multiplier on the summed GPU time of a forward pass: what a whole model sees and
    /// isolated microbenchmarks do not (cold L2 between layers, inter-kernel gaps in a graph).
    pub in_model: Param,
    /// Fraction of the routed experts a batch's tokens spread over: 1 = independent uniform
    /// routing (E * (1 - (1 - k/E)^T) distinct experts); below 1, tokens of a batch share
    /// popular experts (routing skew), so fewer distinct experts are read. Batch-1 cost is
    /// unaffected (one token always reads k experts).
    pub moe_expert_spread: Param,
}

/// Where measured operator tables come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpTablesSection {
    /// One of the systems shipped in the binary (`rtx_pro_6000_server`, `h200_sxm`) ...
    #[serde(default)]
    pub system: Option<String>,
    /// ... or a directory of op-table CSVs, relative to the profile file.
    #[serde(default)]
    pub dir: Option<String>,
    /// What the tables were measured with, for reports.
    #[serde(default)]
    pub provenance: String,
    /// The hardware preset whose GPU and interconnect the tables were measured on, where it
    /// is not this profile's: every table time is then moved to this GPU per operator
    /// (docs/cost-model.md, "Op tables on another GPU"). A shipped `system` knows its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_on: Option<String>,
}

impl OpTablesSection {
    /// The hardware preset the tables were measured on.
    pub fn measured_on(&self) -> Option<&str> {
        self.measured_on
            .as_deref()
            .or(match self.system.as_deref() {
                Some("h200_sxm") => Some("8x-h200"),
                Some("rtx_pro_6000_server") => Some("8x-rtx-pro-6000-server"),
                _ => None,
            })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareProfile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub gpu: GpuSection,
    pub interconnect: InterconnectSection,
    pub efficiency: EfficiencySection,
    #[serde(default)]
    pub optables: Option<OpTablesSection>,
    /// How the profile was produced (set by calibration).
    #[serde(default)]
    pub calibration: Option<CalibrationStamp>,
    /// Where the profile was read from (not part of the file).
    #[serde(skip)]
    pub origin: String,
    /// Directory relative paths resolve against (not part of the file).
    #[serde(skip)]
    pub base_dir: Option<PathBuf>,
}

/// Recorded in a calibrated profile: what it was fitted to and how well.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalibrationStamp {
    pub measurements: String,
    pub base_profile: String,
    pub method: String,
    pub rms_log_error: f64,
    pub max_abs_rel_error: f64,
    pub loo_rms_rel_error: f64,
}

param_table!(
    /// Dotted names of every parameter, in file order (for calibration and reports).
    HardwareProfile, PARAM_KEYS, {
    "gpu.memory_gib" => gpu.memory_gib,
    "gpu.mem_bandwidth_gbs" => gpu.mem_bandwidth_gbs,
    "gpu.bf16_tflops" => gpu.bf16_tflops,
    "gpu.int4_tflops" => gpu.int4_tflops,
    "gpu.min_kernel_us" => gpu.min_kernel_us,
    "interconnect.all_reduce_latency_us" => interconnect.all_reduce_latency_us,
    "interconnect.all_reduce_bus_gbs" => interconnect.all_reduce_bus_gbs,
    "efficiency.mem_bw" => efficiency.mem_bw,
    "efficiency.flops" => efficiency.flops,
    "efficiency.in_model" => efficiency.in_model,
    "efficiency.moe_expert_spread" => efficiency.moe_expert_spread,
});

/// Profiles written before engine profiles existed carried the engine's terms: say where
/// they went rather than only that the keys are unknown.
fn moved_sections(text: &str, origin: &str) -> Result<(), SimError> {
    let Ok(table) = text.parse::<toml::Table>() else {
        return Ok(());
    };
    let moved: Vec<&str> = ["launch", "host"]
        .into_iter()
        .filter(|k| table.contains_key(*k))
        .collect();
    if moved.is_empty() {
        return Ok(());
    }
    Err(SimError::Profile {
        origin: origin.into(),
        message: format!(
            "[{}] belongs to the serving engine, not the hardware: move it into an engine profile (experiments/engines/, docs/cost-model.md) and name that in the experiment's [engine] section",
            moved.join("] and [")
        ),
    })
}

impl HardwareProfile {
    pub fn from_toml_str(text: &str, origin: &str) -> Result<HardwareProfile, SimError> {
        moved_sections(text, origin)?;
        let mut p: HardwareProfile = toml::from_str(text).map_err(|e| SimError::Profile {
            origin: origin.into(),
            message: e.to_string().trim().to_string(),
        })?;
        p.origin = origin.into();
        p.validate()?;
        Ok(p)
    }

    pub fn from_file(path: &Path) -> Result<HardwareProfile, SimError> {
        let text = kbench_core::input::read_text(path).map_err(|source| SimError::Read {
            what: "hardware profile",
            path: path.into(),
            source,
        })?;
        let mut p = Self::from_toml_str(&text, &path.display().to_string())?;
        p.base_dir = path.parent().map(Path::to_path_buf);
        Ok(p)
    }

    pub fn to_toml_string(&self) -> Result<String, SimError> {
        toml::to_string(self).map_err(|e| SimError::Profile {
            origin: self.origin.clone(),
            message: format!("cannot serialize: {e}"),
        })
    }

    /// Physical sanity: a negative bandwidth or an efficiency above 1 is a typo, not a box.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |message: String| SimError::Profile {
            origin: self.origin.clone(),
            message,
        };
        if self.gpu.count == 0 {
            return Err(bad("gpu.count must be at least 1".into()));
        }
        for key in PARAM_KEYS {
            let v = self.param(key).map(|p| p.value).unwrap_or(f64::NAN);
            if !v.is_finite() || v < 0.0 {
                return Err(bad(format!(
                    "{key} = {v} is not a finite non-negative number"
                )));
            }
        }
        for key in [
            "gpu.mem_bandwidth_gbs",
            "gpu.bf16_tflops",
            "gpu.int4_tflops",
            "interconnect.all_reduce_bus_gbs",
        ] {
            if self.param(key).map(|p| p.value).unwrap_or(0.0) <= 0.0 {
                return Err(bad(format!("{key} must be positive")));
            }
        }
        for key in [
            "efficiency.mem_bw",
            "efficiency.flops",
            "efficiency.moe_expert_spread",
        ] {
            let v = self.param(key).map(|p| p.value).unwrap_or(0.0);
            if !(v > 0.0 && v <= 1.0) {
                return Err(bad(format!("{key} = {v} must be in (0, 1]")));
            }
        }
        if self.efficiency.in_model.value < 0.5 || self.efficiency.in_model.value > 5.0 {
            return Err(bad(format!(
                "efficiency.in_model = {} is outside the physical range [0.5, 5]",
                self.efficiency.in_model.value
            )));
        }
        for (key, rate) in [
            ("gpu.fp8_tflops", &self.gpu.fp8_tflops),
            ("gpu.fp4_tflops", &self.gpu.fp4_tflops),
        ] {
            if let Some(p) = rate {
                if !(p.value.is_finite() && p.value > 0.0) {
                    return Err(bad(format!("{key} = {} must be positive", p.value)));
                }
            }
        }
        if let Some(t) = &self.optables {
            if t.system.is_some() == t.dir.is_some() {
                return Err(bad(
                    "[optables] needs exactly one of `system` or `dir`".into()
                ));
            }
        }
        Ok(())
    }
}
