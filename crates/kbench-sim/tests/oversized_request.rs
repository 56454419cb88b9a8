//! A request the modelled KV cache cannot hold even alone (a served client's prompt, which
//! the run's fit check never saw) is refused by itself at submit; the requests beside it
//! run. It used to be admitted and fail every request in flight with "cannot admit".

use std::path::Path;

use kbench_core::backend::{Backend, Request};
use kbench_core::experiment::load_experiment_str;
use kbench_sim::{acceptance_for, SimBackend};

#[test]
fn a_request_larger_than_the_kv_cache_fails_alone() {
    let text = "name = \"t\"\nseed = 5\n[model]\npreset = \"kimi-k2.5\"\n[hardware]\n\
         preset = \"8x-rtx-pro-6000-server\"\n[server]\ntp_size = 8\n\
         [workload]\nmax_tokens = 16\ninput_len = 64\n\
         [benchmark]\nconcurrency = [2]\nrequests_per_level = 2\nwarmup_requests = 0\n";
    let exp = load_experiment_str(text, Path::new("t.toml"), &[])
        .unwrap()
        .remove(0)
        .experiment;
    let mut b = SimBackend::new(&exp, acceptance_for(&exp).unwrap()).unwrap();
    let mut s = b.start_level(2).unwrap();
    let request = |id: u64, input_len: u32| Request {
        id,
        input_len,
        max_tokens: 16,
        ..Request::default()
    };
    s.submit(request(1, 64)).unwrap();
    let e = s.submit(request(2, 5_000_000)).unwrap_err().to_string();
    assert!(
        e.contains("request 2 needs 5000017") && e.contains("the modelled pool holds"),
        "{e}"
    );
    s.submit(request(3, 64)).unwrap();
    // records come back as requests finish: a bounded number of calls collects both
    let mut done = Vec::new();
    for _ in 0..10 {
        if done.len() == 2 {
            break;
        }
        done.extend(s.run_until_completion().unwrap());
    }
    let mut ids: Vec<(u64, usize)> = done
        .iter()
        .map(|r| (r.id, r.token_times_ns.len()))
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![(1, 16), (3, 16)]);
    assert!(done.iter().all(|r| r.error.is_none()));
}
