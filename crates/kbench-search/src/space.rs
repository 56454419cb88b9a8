//! The search space: axes of values for dotted experiment keys, expanded into candidates.
//!
//! Every axis is a key `--set` can reach. `speculative.num_draft_tokens = "auto"` is every
//! value SGLang accepts for each candidate's steps and topk. A candidate without
//! speculation drops the speculative keys (as a sweep variant setting `algorithm = "none"`
//! does), so the plain configuration is one candidate however many speculative values the
//! space lists. Where the space never turns speculation off, the plain configurations are
//! still run, as the baseline each candidate's margin is taken over.

use std::collections::BTreeSet;

use serde::Serialize;

/// Range axes longer than this are refused as a likely typo.
const MAX_AXIS_VALUES: i64 = 100_000;

const ALGORITHM: &str = "speculative.algorithm";
const NUM_STEPS: &str = "speculative.num_steps";
const EAGLE_TOPK: &str = "speculative.eagle_topk";
const NUM_DRAFT_TOKENS: &str = "speculative.num_draft_tokens";

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Axis {
    pub key: String,
    pub values: AxisValues,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AxisValues {
    List(Vec<toml::Value>),
    /// Every `num_draft_tokens` SGLang accepts for the candidate's steps and topk.
    Auto,
}

impl AxisValues {
    /// A list, a range (`{ min, max }` with `step` or `factor`, or `"A..B"`), `"auto"`
    /// (num_draft_tokens only), or one value.
    pub fn parse(key: &str, value: &toml::Value) -> Result<AxisValues, String> {
        match value {
            toml::Value::Array(items) => {
                if items.is_empty() {
                    return Err("an empty list leaves nothing to try".into());
                }
                let mut seen = Vec::with_capacity(items.len());
                for v in items {
                    if !seen.contains(v) {
                        seen.push(v.clone());
                    }
                }
                Ok(AxisValues::List(seen))
            }
            toml::Value::Table(t) => range_from_table(t).map(AxisValues::List),
            toml::Value::String(s) if s.eq_ignore_ascii_case("auto") => {
                if key == NUM_DRAFT_TOKENS {
                    Ok(AxisValues::Auto)
                } else {
                    Err(format!(
                        "\"auto\" is only for {NUM_DRAFT_TOKENS} (every value SGLang accepts for the steps and topk)"
                    ))
                }
            }
            toml::Value::String(s) if s.contains("..") => {
                let (a, b) = s.split_once("..").unwrap_or((s, s));
                let b = b.trim_start_matches('=');
                match (a.trim().parse::<i64>(), b.trim().parse::<i64>()) {
                    (Ok(min), Ok(max)) => {
                        integer_range(min, max, Step::Add(1)).map(AxisValues::List)
                    }
                    _ => Err(format!(
                        "`{s}`: a range is two integers, `MIN..MAX` (both included)"
                    )),
                }
            }
            one => Ok(AxisValues::List(vec![one.clone()])),
        }
    }

    fn len(&self) -> usize {
        match self {
            AxisValues::List(v) => v.len(),
            AxisValues::Auto => 0,
        }
    }
}

enum Step {
    Add(i64),
    Multiply(i64),
}

fn range_from_table(t: &toml::Table) -> Result<Vec<toml::Value>, String> {
    for k in t.keys() {
        if !["min", "max", "step", "factor"].contains(&k.as_str()) {
            return Err(format!(
                "unknown range key `{k}`: a range is {{ min, max }} with `step` (default 1) or `factor`"
            ));
        }
    }
    let int = |k: &str| -> Result<Option<i64>, String> {
        match t.get(k) {
            None => Ok(None),
            Some(toml::Value::Integer(i)) => Ok(Some(*i)),
            Some(other) => Err(format!(
                "range `{k}` must be an integer, not {}",
                other.type_str()
            )),
        }
    };
    let (Some(min), Some(max)) = (int("min")?, int("max")?) else {
        return Err("a range needs both `min` and `max`".into());
    };
    let step = match (int("step")?, int("factor")?) {
        (Some(_), Some(_)) => return Err("give `step` or `factor`, not both".into()),
        (Some(s), None) => Step::Add(s),
        (None, Some(f)) => Step::Multiply(f),
        (None, None) => Step::Add(1),
    };
    integer_range(min, max, step)
}

fn integer_range(min: i64, max: i64, step: Step) -> Result<Vec<toml::Value>, String> {
    if min > max {
        return Err(format!("contradictory range: min {min} is above max {max}"));
    }
    let mut out = Vec::new();
    match step {
        Step::Add(s) if s < 1 => return Err(format!("step {s} must be 1 or more")),
        Step::Multiply(f) if f < 2 => return Err(format!("factor {f} must be 2 or more")),
        Step::Multiply(_) if min < 1 => {
            return Err(format!("a geometric range starts at 1 or more, not {min}"))
        }
        Step::Add(s) => {
            if (max - min) / s >= MAX_AXIS_VALUES {
                return Err(format!(
                    "{min}..{max} in steps of {s} is over {MAX_AXIS_VALUES} values"
                ));
            }
            let mut v = min;
            while v <= max {
                out.push(toml::Value::Integer(v));
                v += s;
            }
        }
        Step::Multiply(f) => {
            let mut v = min;
            while v <= max {
                out.push(toml::Value::Integer(v));
                v = match v.checked_mul(f) {
                    Some(n) => n,
                    None => break,
                };
            }
        }
    }
    Ok(out)
}

/// The file's own speculative settings, where the space does not set them.
#[derive(Debug, Clone, Copy)]
pub struct BaseSpeculative {
    pub speculating: bool,
    pub num_steps: Option<u32>,
    pub eagle_topk: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Candidate {
    /// `(key, value)` in axis order: what `--set` would be given.
    pub overrides: Vec<(String, String)>,
    /// false for a plain baseline the space itself does not contain.
    pub in_space: bool,
}

impl Candidate {
    /// As `--set` arguments.
    pub fn set_arguments(&self) -> Vec<String> {
        self.overrides
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect()
    }

    pub fn value(&self, key: &str) -> Option<&str> {
        self.overrides
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

fn speculates(algorithm: Option<&toml::Value>, base: &BaseSpeculative) -> bool {
    match algorithm {
        Some(toml::Value::String(a)) => !a.eq_ignore_ascii_case("none"),
        Some(_) => true,
        None => base.speculating,
    }
}

fn as_u32(v: Option<&toml::Value>) -> Option<u32> {
    v.and_then(|v| v.as_integer())
        .and_then(|i| u32::try_from(i).ok())
}

/// Every num_draft_tokens SGLang accepts for (steps, topk): steps + 1 for a chain, else
/// 2 ..= topk * steps + 1.
pub fn auto_draft_tokens(steps: u32, topk: u32) -> Vec<u32> {
    match (steps, topk) {
        (0, _) | (_, 0) => Vec::new(),
        (s, 1) => vec![s + 1],
        (s, k) => (2..=k.saturating_mul(s).saturating_add(1)).collect(),
    }
}

fn effective_steps_topk(
    steps: Option<&toml::Value>,
    topk: Option<&toml::Value>,
    base: &BaseSpeculative,
) -> (u32, u32) {
    let topk = as_u32(topk).or(base.eagle_topk).unwrap_or(1);
    let steps = as_u32(steps).or(base.num_steps).unwrap_or(3);
    (steps, topk)
}

/// How many candidates the space expands to, before any rule is applied (plain
/// configurations counted once), without expanding it.
pub fn count(axes: &[Axis], base: &BaseSpeculative) -> u128 {
    let is_spec = |a: &&Axis| a.key.starts_with("speculative.") && a.key != ALGORITHM;
    let plain_axes: u128 = axes
        .iter()
        .filter(|a| !a.key.starts_with("speculative."))
        .map(|a| a.values.len() as u128)
        .product();
    let algorithms: Vec<Option<&toml::Value>> = match axes.iter().find(|a| a.key == ALGORITHM) {
        Some(Axis {
            values: AxisValues::List(v),
            ..
        }) => v.iter().map(Some).collect(),
        _ => vec![None],
    };
    let axis = |key: &str| axes.iter().find(|a| a.key == key);
    let list = |key: &str| -> Vec<Option<&toml::Value>> {
        match axis(key) {
            Some(Axis {
                values: AxisValues::List(v),
                ..
            }) => v.iter().map(Some).collect(),
            _ => vec![None],
        }
    };
    let other_spec: u128 = axes
        .iter()
        .filter(is_spec)
        .filter(|a| ![NUM_STEPS, EAGLE_TOPK, NUM_DRAFT_TOKENS].contains(&a.key.as_str()))
        .map(|a| a.values.len() as u128)
        .product();
    let mut per_plain_combination: u128 = 0;
    let mut plain_counted = false;
    for algorithm in algorithms {
        if !speculates(algorithm, base) {
            if !plain_counted {
                per_plain_combination += 1;
                plain_counted = true;
            }
            continue;
        }
        let mut shapes: u128 = 0;
        for steps in list(NUM_STEPS) {
            for topk in list(EAGLE_TOPK) {
                shapes += match axis(NUM_DRAFT_TOKENS).map(|a| &a.values) {
                    Some(AxisValues::Auto) => {
                        let (s, k) = effective_steps_topk(steps, topk, base);
                        auto_draft_tokens(s, k).len() as u128
                    }
                    Some(AxisValues::List(v)) => v.len() as u128,
                    None => 1,
                };
            }
        }
        per_plain_combination += shapes * other_spec;
    }
    plain_axes.saturating_mul(per_plain_combination)
}

/// The candidates, in a fixed order: the space's axes in key order, each varying slowest
/// first; duplicates (the plain configuration reached through many speculative values)
/// once. Baselines the space lacks come last.
pub fn expand(axes: &[Axis], base: &BaseSpeculative) -> Vec<Candidate> {
    let mut partials: Vec<Vec<(String, toml::Value)>> = vec![Vec::new()];
    for axis in axes {
        let AxisValues::List(values) = &axis.values else {
            continue;
        };
        partials = partials
            .into_iter()
            .flat_map(|p| {
                values.iter().map(move |v| {
                    let mut next = p.clone();
                    next.push((axis.key.clone(), v.clone()));
                    next
                })
            })
            .collect();
    }
    let auto = axes
        .iter()
        .position(|a| a.key == NUM_DRAFT_TOKENS && a.values == AxisValues::Auto);
    let get = |p: &[(String, toml::Value)], key: &str| -> Option<toml::Value> {
        p.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    };
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    let mut push =
        |overrides: Vec<(String, toml::Value)>, in_space: bool, out: &mut Vec<Candidate>| {
            let c = Candidate {
                overrides: overrides
                    .into_iter()
                    .map(|(k, v)| (k, v.to_string()))
                    .collect(),
                in_space,
            };
            if seen.insert(c.overrides.clone()) {
                out.push(c);
            }
        };
    let mut any_plain = false;
    for p in &partials {
        if !speculates(get(p, ALGORITHM).as_ref(), base) {
            any_plain = true;
            push(plain_projection(p), true, &mut out);
            continue;
        }
        match auto {
            Some(at) => {
                let (s, k) = effective_steps_topk(
                    get(p, NUM_STEPS).as_ref(),
                    get(p, EAGLE_TOPK).as_ref(),
                    base,
                );
                for n in auto_draft_tokens(s, k) {
                    let mut c = p.clone();
                    // keep the axis order: the draft tokens sit where the axis is declared
                    let place = axes[..at]
                        .iter()
                        .filter(|a| matches!(a.values, AxisValues::List(_)))
                        .count();
                    c.insert(
                        place.min(c.len()),
                        (
                            NUM_DRAFT_TOKENS.to_string(),
                            toml::Value::Integer(i64::from(n)),
                        ),
                    );
                    push(c, true, &mut out);
                }
            }
            None => push(p.clone(), true, &mut out),
        }
    }
    if !any_plain {
        for p in &partials {
            push(plain_projection(p), false, &mut out);
        }
    }
    out
}

/// The configuration without speculation: the space's other keys, algorithm = none.
fn plain_projection(p: &[(String, toml::Value)]) -> Vec<(String, toml::Value)> {
    let mut out: Vec<(String, toml::Value)> = p
        .iter()
        .filter(|(k, _)| !k.starts_with("speculative."))
        .cloned()
        .collect();
    out.push((ALGORITHM.to_string(), toml::Value::String("none".into())));
    out
}
