//! Chunked prefill in the batcher (`kbench serve`'s engine): a long prompt prefilled a chunk
//! per forward gives the tokens of a one-forward prefill, lets the running requests' rounds
//! run between its chunks, and can be cancelled part-way.

mod common;

use std::collections::BTreeMap;

use kbench_core::experiment::VerifyMethod;
use kbench_core::verify::SamplingParams;
use kbench_engine::batcher::{Batcher, Commit, SeqParams};
use kbench_engine::speculative::SpeculativeSettings;

fn greedy(max_new: usize) -> SeqParams {
    SeqParams {
        max_new,
        sampling: SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
        },
        seed: 7,
        stream: 0,
        stop_token_ids: Vec::new(),
    }
}

/// Steps until idle (bounded), returning every forward's commits.
fn drain<M: kbench_engine::passes::SpeculativeModel>(b: &mut Batcher<M>) -> Vec<Vec<Commit>> {
    let mut forwards = Vec::new();
    for _ in 0..10_000 {
        if b.is_idle() {
            return forwards;
        }
        forwards.push(b.step().expect("forward"));
    }
    panic!("the batcher did not finish in 10,000 forwards");
}

fn outputs(forwards: &[Vec<Commit>]) -> BTreeMap<u64, Vec<u32>> {
    let mut out: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for c in forwards.iter().flatten() {
        out.entry(c.id).or_default().extend(&c.tokens);
    }
    out
}

#[test]
fn chunked_prefill_gives_the_one_forward_tokens() {
    let model = common::micro_model(11, 0.8, 2, 96);
    for spec in [
        None,
        Some(SpeculativeSettings::new(3, 1, 4, VerifyMethod::Greedy).unwrap()),
    ] {
        let long = common::prompt(1, 45, 96);
        let short = common::prompt(2, 5, 96);
        let run = |chunk: Option<usize>| {
            let mut b = Batcher::new(model.models(), spec, 4).with_prefill_chunk(chunk);
            b.submit(1, short.clone(), greedy(12)).unwrap();
            b.submit(2, long.clone(), greedy(12)).unwrap();
            outputs(&drain(&mut b))
        };
        let whole = run(None);
        let chunked = run(Some(8));
        assert_eq!(whole[&2].len(), 12);
        assert_eq!(whole, chunked, "speculating: {}", spec.is_some());
    }
}

#[test]
fn running_requests_get_rounds_between_a_long_prompts_chunks() {
    let model = common::micro_model(12, 0.8, 2, 96);
    let mut b = Batcher::new(model.models(), None, 4).with_prefill_chunk(Some(8));
    b.submit(1, common::prompt(3, 4, 96), greedy(40)).unwrap();
    // request 1 prefills, then the 41-token prompt arrives: 6 chunks
    assert_eq!(b.step().unwrap().len(), 1);
    b.submit(2, common::prompt(4, 41, 96), greedy(3)).unwrap();
    let mut order = Vec::new();
    while !b.step().unwrap().iter().any(|c| c.id == 2) {
        order.push(b.running_len());
        assert!(
            order.len() < 50,
            "the long prompt never finished its prefill"
        );
    }
    // request 1's step that admits it, then 5 chunks before the last, each followed by one
    // decode step of request 1
    assert_eq!(
        order.len(),
        11,
        "forwards before the long prompt's first token"
    );
    assert!(order.iter().all(|&n| n == 2), "both hold a slot throughout");
    assert_eq!(b.running_len(), 2);
}

#[test]
fn a_long_prompt_cancelled_part_way_frees_its_slot() {
    let model = common::micro_model(13, 0.8, 2, 96);
    let mut b = Batcher::new(model.models(), None, 1).with_prefill_chunk(Some(8));
    b.submit(1, common::prompt(5, 40, 96), greedy(3)).unwrap();
    assert!(b.step().unwrap().is_empty(), "a chunk commits nothing");
    assert_eq!(b.running_len(), 1);
    assert!(b.cancel(1));
    assert!(b.is_idle());
    // the one slot is free again
    b.submit(2, common::prompt(6, 4, 96), greedy(3)).unwrap();
    let out = outputs(&drain(&mut b));
    assert_eq!(out[&2].len(), 3);
    assert!(!out.contains_key(&1));
}
