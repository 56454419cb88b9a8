//! Per-pass calibration from a GPU layer-stack profile (`kbench-gpu stack`, written by
//! scripts/gpu-check.sh as `profile.toml`): the measured time of full-width Kimi-K2.5 decoder
//! layers per decode / verify pass, set beside the cost model's per-layer GPU time for the same
//! pass, and one factor (`efficiency.in_model`) fitted so the simulator predicts that GPU.
//!
//! Per-layer prediction: the cost model prices whole passes (embedding, layers, final norm,
//! logits head). Pricing is affine in the layer count, so the model is priced at L and 2L layers
//! and the difference divided by L; that isolates exactly the operators the stack runs, without
//! a second operator list that could drift from the first.
//!
//! The fit minimises sum ln(s * pred_i / meas_i)^2 over the passes, whose closed form is the
//! geometric mean of meas / pred; leave-one-out refits without each pass and predicts it.

use std::collections::BTreeMap;
use std::path::Path;

use kbench_core::arch::ModelArch;
use serde::Serialize;

use crate::calibrate::round_sig;
use crate::cost::{CostModel, PassKind};
use crate::error::SimError;
use crate::presets::load_tables;
use crate::profile::{CalibrationStamp, HardwareProfile, Provenance};

pub use kbench_core::stack_profile::{StackDevice, StackInfo, StackPass, StackProfile};

/// One pass: measured and predicted GPU time per layer.
#[derive(Debug, Clone, Serialize)]
pub struct PassRow {
    pub kind: String,
    pub batch: u32,
    pub tokens: u32,
    pub measured_us_per_layer: f64,
    /// The base profile's prediction, before the fit.
    pub predicted_us_per_layer: f64,
    /// predicted / measured - 1, before the fit.
    pub error: f64,
    /// After the fit.
    pub calibrated_error: f64,
    /// Predicted by a fit without this pass.
    pub loo_error: f64,
    /// The base prediction per operator group, microseconds per layer.
    pub predicted_breakdown_us: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PassCalibration {
    pub measured: String,
    pub device: String,
    pub base_profile: String,
    pub layers: u32,
    pub context: u32,
    pub dense_linears: String,
    /// efficiency.in_model before and after.
    pub in_model_before: f64,
    pub in_model_after: f64,
    pub rows: Vec<PassRow>,
    pub rms_error_before: f64,
    pub rms_error_after: f64,
    pub loo_rms_error: f64,
    pub out_profile: Option<String>,
}

impl std::fmt::Display for PassCalibration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "per-pass calibration: {} ({}), {} Kimi-K2.5 layers, context {}, dense linears {}",
            self.measured, self.device, self.layers, self.context, self.dense_linears
        )?;
        writeln!(f, "  base profile: {}", self.base_profile)?;
        writeln!(
            f,
            "  {:<7} {:>5} {:>6} {:>12} {:>12} {:>8} {:>10} {:>8}  largest predicted groups",
            "kind", "batch", "tokens", "measured us", "predicted us", "error", "calibrated", "LOO"
        )?;
        for r in &self.rows {
            let mut groups: Vec<(&String, &f64)> = r.predicted_breakdown_us.iter().collect();
            groups.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
            let top: Vec<String> = groups
                .iter()
                .take(3)
                .map(|(k, v)| format!("{k} {v:.0}"))
                .collect();
            writeln!(
                f,
                "  {:<7} {:>5} {:>6} {:>12.1} {:>12.1} {:>+7.1}% {:>+9.1}% {:>+7.1}%  {}",
                r.kind,
                r.batch,
                r.tokens,
                r.measured_us_per_layer,
                r.predicted_us_per_layer,
                r.error * 100.0,
                r.calibrated_error * 100.0,
                r.loo_error * 100.0,
                top.join(", ")
            )?;
        }
        writeln!(
            f,
            "  efficiency.in_model {:.4} -> {:.4}; rms error {:.1}% -> {:.1}%, leave-one-out {:.1}%",
            self.in_model_before,
            self.in_model_after,
            self.rms_error_before * 100.0,
            self.rms_error_after * 100.0,
            self.loo_rms_error * 100.0
        )?;
        Ok(())
    }
}

fn bad(path: &Path, message: impl Into<String>) -> SimError {
    SimError::StackProfile {
        path: path.into(),
        message: message.into(),
    }
}

/// Reads and checks a stack profile: known pass kinds, token counts that match the batch,
/// positive finite times.
pub fn read_stack_profile(path: &Path) -> Result<StackProfile, SimError> {
    let text = kbench_core::input::read_text(path).map_err(|source| SimError::Read {
        what: "GPU stack profile",
        path: path.into(),
        source,
    })?;
    let p: StackProfile =
        toml::from_str(&text).map_err(|e| bad(path, e.to_string().trim().to_string()))?;
    if p.stack.layers == 0 {
        return Err(bad(path, "[stack] layers must be at least 1"));
    }
    if p.pass.len() < 2 {
        return Err(bad(
            path,
            format!(
                "{} [[pass]] entries: a fit and its leave-one-out check need at least 2",
                p.pass.len()
            ),
        ));
    }
    for (i, r) in p.pass.iter().enumerate() {
        let per_request = match r.kind.as_str() {
            "decode" => 1,
            "verify" => p.stack.verify_tokens_per_request,
            other => {
                return Err(bad(
                    path,
                    format!(
                        "pass {}: kind `{other}` (expected `decode` or `verify`)",
                        i + 1
                    ),
                ))
            }
        };
        let expected = r.batch.checked_mul(per_request);
        if r.batch == 0 || expected != Some(r.tokens) {
            return Err(bad(
                path,
                format!(
                    "pass {}: {} tokens for batch {} of `{}` (expected {})",
                    i + 1,
                    r.tokens,
                    r.batch,
                    r.kind,
                    expected.map_or("more than u32".into(), |e| e.to_string())
                ),
            ));
        }
        if !(r.ms.is_finite() && r.ms > 0.0) {
            return Err(bad(
                path,
                format!("pass {}: ms = {} is not a positive time", i + 1, r.ms),
            ));
        }
    }
    Ok(p)
}

/// The Kimi-K2.5 architecture cut to the stack's layers (every layer MoE, as the stack runs
/// them), after checking the stack measured that architecture.
fn stack_arch(path: &Path, s: &StackInfo, layers: u32) -> Result<ModelArch, SimError> {
    let mut arch = ModelArch::preset("kimi-k2.5").map_err(|e| SimError::Model(e.to_string()))?;
    let moe = arch
        .moe
        .as_mut()
        .ok_or_else(|| SimError::Model("kimi-k2.5 preset without MoE".into()))?;
    let mla = arch
        .mla
        .as_ref()
        .ok_or_else(|| SimError::Model("kimi-k2.5 preset without MLA".into()))?;
    let checks = [
        ("hidden", s.hidden, arch.hidden_size),
        ("n_routed_experts", s.n_routed_experts, moe.n_routed_experts),
        ("top_k", s.top_k, moe.num_experts_per_tok),
        (
            "moe_intermediate",
            s.moe_intermediate,
            moe.moe_intermediate_size,
        ),
        ("heads", s.heads, arch.num_heads),
        ("kv_lora_rank", s.kv_lora_rank, mla.kv_lora_rank),
    ];
    for (key, measured, model) in checks {
        if measured != model {
            return Err(bad(
                path,
                format!("[stack] {key} = {measured}, but Kimi-K2.5 has {model}: this profile measured another architecture"),
            ));
        }
    }
    moe.first_k_dense_replace = 0;
    arch.num_layers = layers;
    Ok(arch)
}

/// One pass's predicted time per layer, and its per-group breakdown.
type PassPrediction = (f64, BTreeMap<String, f64>);

/// Base prediction per layer for every pass, with the per-group breakdown.
fn predict(
    path: &Path,
    stack: &StackProfile,
    base: &HardwareProfile,
) -> Result<Vec<PassPrediction>, SimError> {
    let l = stack.stack.layers;
    let tables = load_tables(base)?;
    // Graph or eager only changes launch cost, which the per-layer GPU time leaves out, so
    // the generic profile's launch terms do (it adds no kernel-boundary time: the stack's
    // per-layer times are measured whole).
    let engine = crate::presets::engine_preset("sglang")?;
    let one = CostModel::new(
        base.clone(),
        engine.clone(),
        tables.clone(),
        stack_arch(path, &stack.stack, l)?,
        None,
        1,
        0,
    )?;
    let two = CostModel::new(
        base.clone(),
        engine,
        tables,
        stack_arch(path, &stack.stack, 2 * l)?,
        None,
        1,
        0,
    )?;
    let ctx = stack.stack.context as f64;
    stack
        .pass
        .iter()
        .map(|r| {
            let kind = if r.kind == "decode" {
                PassKind::TargetDecode
            } else {
                PassKind::TargetVerify
            };
            let a = one.explain_pass(kind, r.tokens, r.batch, ctx)?;
            let b = two.explain_pass(kind, r.tokens, r.batch, ctx)?;
            let per_layer = (b.gpu_total_us - a.gpu_total_us) / l as f64;
            let groups = b
                .gpu_us
                .iter()
                .map(|(k, vb)| {
                    let va = a.gpu_us.get(k).copied().unwrap_or(0.0);
                    (k.clone(), (vb - va) / l as f64)
                })
                .filter(|(_, v)| v.abs() > 1e-9)
                .collect();
            Ok((per_layer, groups))
        })
        .collect()
}

fn rms(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x * x, n + 1));
    if n == 0 {
        0.0
    } else {
        (s / n as f64).sqrt()
    }
}

/// Compares the stack's passes with the base profile's predictions and fits
/// `efficiency.in_model`; [`write_calibrated_profile`] writes the result.
pub fn calibrate_passes(
    measured_path: &Path,
    base: &HardwareProfile,
) -> Result<PassCalibration, SimError> {
    let stack = read_stack_profile(measured_path)?;
    let preds = predict(measured_path, &stack, base)?;
    let measured: Vec<f64> = stack
        .pass
        .iter()
        .map(|r| r.ms * 1000.0 / stack.stack.layers as f64)
        .collect();
    if let Some((i, _)) = preds
        .iter()
        .enumerate()
        .find(|(_, p)| !(p.0.is_finite() && p.0 > 0.0))
    {
        return Err(SimError::Calibration(format!(
            "pass {} predicts no per-layer time",
            i + 1
        )));
    }
    let logs: Vec<f64> = measured
        .iter()
        .zip(&preds)
        .map(|(m, p)| (m / p.0).ln())
        .collect();
    let n = logs.len() as f64;
    let sum: f64 = logs.iter().sum();
    let scale = (sum / n).exp();
    let rows: Vec<PassRow> = stack
        .pass
        .iter()
        .zip(&preds)
        .zip(&measured)
        .zip(&logs)
        .map(|(((r, (pred, groups)), meas), lg)| {
            let loo_scale = ((sum - lg) / (n - 1.0)).exp();
            PassRow {
                kind: r.kind.clone(),
                batch: r.batch,
                tokens: r.tokens,
                measured_us_per_layer: *meas,
                predicted_us_per_layer: *pred,
                error: pred / meas - 1.0,
                calibrated_error: pred * scale / meas - 1.0,
                loo_error: pred * loo_scale / meas - 1.0,
                predicted_breakdown_us: groups.clone(),
            }
        })
        .collect();
    let before = base.efficiency.in_model.value;
    let after = round_sig(before * scale);
    let report = PassCalibration {
        measured: measured_path.display().to_string(),
        device: stack.device.name.clone(),
        base_profile: base.origin.clone(),
        layers: stack.stack.layers,
        context: stack.stack.context,
        dense_linears: stack
            .stack
            .dense_linears
            .clone()
            .unwrap_or_else(|| "unrecorded".into()),
        in_model_before: before,
        in_model_after: after,
        rms_error_before: rms(rows.iter().map(|r| r.error)),
        rms_error_after: rms(rows.iter().map(|r| r.calibrated_error)),
        loo_rms_error: rms(rows.iter().map(|r| r.loo_error)),
        rows,
        out_profile: None,
    };
    Ok(report)
}

/// Writes `base` with the fitted `efficiency.in_model` of `report` to `out`, atomically. A
/// factor the profile cannot hold (outside its physical range) is refused and nothing is
/// written; the comparison in `report` stands either way.
pub fn write_calibrated_profile(
    report: &mut PassCalibration,
    base: &HardwareProfile,
    out: &Path,
) -> Result<(), SimError> {
    let before = report.in_model_before;
    let after = report.in_model_after;
    let scale = after / before;
    let mut p = base.clone();
    p.efficiency.in_model.value = after;
    p.efficiency.in_model.source = Provenance::Fitted;
    p.efficiency.in_model.reference = format!(
        "fitted by kbench calibrate-passes to {} ({}, {} passes of {} layers of kbench's own kernels; prior {before})",
        report.measured,
        report.device,
        report.rows.len(),
        report.layers
    );
    p.calibration = Some(CalibrationStamp {
        measurements: report.measured.clone(),
        base_profile: base.origin.clone(),
        method: "per-pass GPU time per layer; efficiency.in_model = geometric mean of measured / predicted".into(),
        rms_log_error: rms(report.rows.iter().map(|r| (1.0 + r.calibrated_error).ln())),
        max_abs_rel_error: report
            .rows
            .iter()
            .map(|r| r.calibrated_error.abs())
            .fold(0.0, f64::max),
        loo_rms_rel_error: report.loo_rms_error,
    });
    p.validate().map_err(|e| {
        SimError::Calibration(format!(
            "measured passes are {scale:.2}x the prediction, so efficiency.in_model would be {after}, which a profile does not accept; {} not written ({e})",
            out.display()
        ))
    })?;
    let text = format!(
        "# Hardware profile written by `kbench calibrate-passes` from {} and {}\n# (do not edit by hand; rerun it, see docs/gpu.md).\n{}",
        base.origin,
        report.measured,
        p.to_toml_string()?
    );
    kbench_core::atomic::write_atomic(out, text.as_bytes()).map_err(|source| SimError::Write {
        path: out.into(),
        source,
    })?;
    report.out_profile = Some(out.display().to_string());
    Ok(())
}
