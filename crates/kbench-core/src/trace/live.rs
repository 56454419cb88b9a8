//! Traces from a live server's verify rounds (format v2, `observed`): what a round at
//! position p that committed c tokens says is that the draft's first c - 1 tokens matched
//! the target and, when c - 1 < num_steps, the next one did not. Inside the committed run
//! (positions p + i) the same tokens stand: the draft from there is taken to match up to
//! the same token and miss the same one. What the server never drafted (past num_steps)
//! reads as a miss, so replay is exact at round starts and, inside runs, errs short.

use serde_json::json;

use super::{
    Observed, ObservedKind, ProbEncoding, Provenance, Sequence, Trace, TraceHeader, TraceKind,
    FORMAT_VERSION,
};

/// One request's rounds as the http backend recovered them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveRequest {
    pub id: u64,
    /// Tokens each verify round committed, bonus included, in order.
    pub round_commits: Vec<u32>,
}

/// The trace of `requests` from a server running `(num_steps, eagle_topk,
/// num_draft_tokens)`; a request without rounds is left out.
pub fn from_rounds(
    requests: &[LiveRequest],
    server: (u32, u32, u32),
    provenance: Provenance,
) -> Trace {
    let (num_steps, eagle_topk, num_draft_tokens) = server;
    let depth = num_steps.max(1);
    let kind = if eagle_topk == 1 {
        ObservedKind::ChainRounds
    } else {
        ObservedKind::AcceptLengths
    };
    let mut header = TraceHeader::new(provenance, depth, 1, ProbEncoding::Linear16);
    header.version = FORMAT_VERSION;
    header.observed = Some(Observed {
        kind,
        num_steps,
        eagle_topk,
        num_draft_tokens,
    });
    header.provenance.params.insert(
        "probabilities".into(),
        json!("not observed over HTTP: written as 0"),
    );
    let mut trace = Trace::new(header);
    let d = depth as usize;
    for r in requests.iter().filter(|r| !r.round_commits.is_empty()) {
        let positions: usize = r.round_commits.iter().map(|&c| c as usize).sum();
        // rank 1 with top-1 recorded: "not the draft's top-1"
        let mut ranks = vec![1u8; positions * d];
        let mut p = 0usize;
        for &c in &r.round_commits {
            let accepted = (c as usize).saturating_sub(1).min(d);
            for i in 0..c as usize {
                for depth in 0..d {
                    if i + depth < accepted {
                        ranks[(p + i) * d + depth] = 0;
                    }
                }
            }
            p += c as usize;
        }
        trace.sequences.push(Sequence {
            id: r.id,
            codes: vec![0; ranks.len() * ProbEncoding::Linear16.bytes()].into(),
            ranks: ranks.into(),
        });
    }
    trace.header.sequences = trace.sequences.len() as u32;
    trace
}

/// What a live recording's provenance says by default.
pub fn live_provenance(target: &str, draft: &str, dataset: &str, temperature: f64) -> Provenance {
    Provenance {
        kind: TraceKind::Imported,
        target: target.into(),
        draft: draft.into(),
        dataset: dataset.into(),
        temperature,
        generator: "kbench-http-rounds".into(),
        params: serde_json::Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::TreeShape;

    fn prov() -> Provenance {
        live_provenance("t", "d", "test", 0.0)
    }

    #[test]
    fn a_chain_servers_rounds_replay_to_the_same_commits_at_round_starts() {
        let commits = vec![3, 1, 2, 4, 4, 1, 3];
        let t = from_rounds(
            &[LiveRequest {
                id: 7,
                round_commits: commits.clone(),
            }],
            (3, 1, 4),
            prov(),
        );
        assert_eq!(
            t.header.observed.as_ref().unwrap().kind,
            ObservedKind::ChainRounds
        );
        let shape = TreeShape::new(3, 1, 4).unwrap();
        let mut p = 0;
        for &c in &commits {
            assert_eq!(
                super::super::replay_commit(&t, 0, p, &shape, Default::default()),
                c
            );
            p += c as usize;
        }
        // a shorter chain commits what the longer one accepted, capped
        let two = TreeShape::new(2, 1, 3).unwrap();
        assert_eq!(
            super::super::replay_commit(&t, 0, 0, &two, Default::default()),
            3
        );
        assert_eq!(
            super::super::replay_commit(&t, 0, 6, &two, Default::default()),
            3
        );
        // inside a run: the draft from position 1 matches the one token left of that round
        assert_eq!(
            super::super::replay_commit(&t, 0, 1, &shape, Default::default()),
            2
        );
    }

    #[test]
    fn round_trips_with_what_the_server_showed() {
        let t = from_rounds(
            &[LiveRequest {
                id: 1,
                round_commits: vec![2, 3],
            }],
            (4, 4, 8),
            prov(),
        );
        let bytes = super::super::to_binary(&t);
        assert_eq!(&bytes[8..12], &super::super::FORMAT_VERSION.to_le_bytes());
        let back = super::super::from_binary(std::path::Path::new("x.kbt"), &bytes).unwrap();
        assert_eq!(back, t);
        assert_eq!(
            back.header.observed.unwrap().kind,
            ObservedKind::AcceptLengths
        );
        let jsonl = super::super::to_jsonl(&t);
        assert!(
            jsonl.starts_with('{') && jsonl.contains("\"version\":3"),
            "{jsonl}"
        );
    }
}
