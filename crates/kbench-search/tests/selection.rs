//! The search's selection over one evaluated space: adding candidates never makes the
//! best worse, a tighter SLO never admits more, the frontier is what nothing beats, and
//! counting the space agrees with expanding it.

use std::path::PathBuf;
use std::sync::OnceLock;

use kbench_search::evaluate::Evaluated;
use kbench_search::objective::{Comparison, Slo};
use kbench_search::select::{frontier, rank};
use kbench_search::space::{count, expand, Axis, AxisValues, BaseSpeculative};
use kbench_search::{evaluate, prepare, Prepared, SearchFlags};
use proptest::prelude::*;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/small.toml")
}

fn evaluated() -> &'static (Prepared, Vec<Evaluated>) {
    static E: OnceLock<(Prepared, Vec<Evaluated>)> = OnceLock::new();
    E.get_or_init(|| {
        let p = prepare(&fixture(), &[], &SearchFlags::default()).unwrap();
        let e = evaluate(&p, 0, &|_, _| {}).unwrap();
        (p, e)
    })
}

fn subset(all: &[Evaluated], mask: &[bool]) -> Vec<Evaluated> {
    all.iter()
        .zip(mask.iter().cycle())
        .filter(|(_, keep)| **keep)
        .map(|(e, _)| e.clone())
        .collect()
}

fn slo(bound: f64) -> Slo {
    Slo {
        metric: "p99_tpot_ms".into(),
        comparison: Comparison::AtMost,
        bound,
    }
}

#[test]
fn the_fixture_space_runs_and_skips_by_rule() {
    let (p, e) = evaluated();
    let r = rank(e, &p.settings.objective, &p.settings.slos);
    assert_eq!(
        p.space_size as usize,
        e.len(),
        "no baseline needed: none is in the space"
    );
    assert!(r.ranked.len() >= 10, "{}", r.ranked.len());
    assert!(
        r.skipped_by_rule.keys().any(|k| k.contains("spec v2")),
        "{:?}",
        r.skipped_by_rule
    );
    assert!(r.baseline.is_some());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn adding_candidates_never_makes_the_best_worse(
        small in proptest::collection::vec(any::<bool>(), 8..40),
        extra in proptest::collection::vec(any::<bool>(), 8..40),
        bound in 5.0f64..80.0,
    ) {
        let (p, all) = evaluated();
        let both: Vec<bool> = small.iter().zip(extra.iter().cycle()).map(|(a, b)| *a || *b).collect();
        let slos = [slo(bound)];
        let o = &p.settings.objective;
        let best_small = rank(&subset(all, &small), o, &slos).best().map(|s| s.value);
        let best_both = rank(&subset(all, &both), o, &slos).best().map(|s| s.value);
        match (best_small, best_both) {
            (Some(a), Some(b)) => prop_assert!(b >= a, "{} < {}", b, a),
            (Some(a), None) => prop_assert!(false, "a superset lost its best ({})", a),
            _ => {}
        }
    }

    #[test]
    fn a_tighter_slo_never_admits_more(tight in 5.0f64..80.0, loosen in 0.0f64..40.0) {
        let (p, all) = evaluated();
        let o = &p.settings.objective;
        let admitted = |b: f64| -> Vec<usize> {
            let mut v: Vec<usize> = rank(all, o, &[slo(b)]).ranked.iter().map(|s| s.candidate).collect();
            v.sort();
            v
        };
        let (a, b) = (admitted(tight), admitted(tight + loosen));
        prop_assert!(a.iter().all(|c| b.contains(c)), "{:?} not within {:?}", a, b);
        prop_assert!(slo(tight).at_least_as_tight_as(&slo(tight + loosen)));
        let fa = frontier(all, &[slo(tight)]);
        for pt in &fa {
            let m = &all[pt.candidate].run().unwrap().report.levels[pt.level];
            prop_assert!(m.p99_tpot_ms <= tight);
        }
    }

    #[test]
    fn nothing_that_meets_the_slos_beats_a_frontier_point(bound in 5.0f64..80.0) {
        let (_, all) = evaluated();
        let f = frontier(all, &[slo(bound)]);
        for e in all.iter().filter_map(|e| e.run()) {
            for m in e.report.levels.iter().filter(|m| m.p99_tpot_ms <= bound) {
                for pt in &f {
                    let dominates = m.output_throughput > pt.output_throughput
                        && m.per_request_output_throughput > pt.per_request_output_throughput;
                    prop_assert!(!dominates);
                }
            }
        }
    }

    #[test]
    fn counting_the_space_agrees_with_expanding_it(
        steps in proptest::collection::vec(1i64..6, 1..4),
        topk in proptest::collection::vec(1i64..5, 1..3),
        auto in any::<bool>(),
        with_none in any::<bool>(),
        v2 in any::<bool>(),
        mrr in proptest::collection::vec(1i64..64, 1..3),
    ) {
        let list = |v: &[i64]| AxisValues::List(v.iter().map(|x| toml::Value::Integer(*x)).collect());
        let mut axes = vec![
            Axis { key: "speculative.num_steps".into(), values: list(&steps) },
            Axis { key: "speculative.eagle_topk".into(), values: list(&topk) },
            Axis { key: "server.max_running_requests".into(), values: list(&mrr) },
        ];
        if auto {
            axes.push(Axis { key: "speculative.num_draft_tokens".into(), values: AxisValues::Auto });
        }
        if with_none {
            axes.push(Axis {
                key: "speculative.algorithm".into(),
                values: AxisValues::List(vec!["none".into(), "EAGLE3".into()]),
            });
        }
        if v2 {
            axes.push(Axis {
                key: "speculative.spec_v2".into(),
                values: AxisValues::List(vec![false.into(), true.into()]),
            });
        }
        axes.sort_by(|a, b| a.key.cmp(&b.key));
        let base = BaseSpeculative { speculating: true, num_steps: Some(2), eagle_topk: Some(1) };
        let candidates = expand(&axes, &base);
        let in_space = candidates.iter().filter(|c| c.in_space).count();
        // duplicate values in a list collapse in expansion only
        let distinct = |v: &[i64]| { let mut d = v.to_vec(); d.sort(); d.dedup(); d.len() == v.len() };
        if distinct(&steps) && distinct(&topk) && distinct(&mrr) {
            prop_assert_eq!(count(&axes, &base), in_space as u128);
        }
        // the plain configuration appears once per combination of the other keys
        let plain = candidates.iter().filter(|c| c.value("speculative.algorithm") == Some("\"none\"")).count();
        let mut m = mrr.clone();
        m.sort();
        m.dedup();
        prop_assert_eq!(plain, m.len());
    }
}
