//! What `generate` is given: a target folder as the draft, a prompt the tokenizer does not
//! know, a request longer than the model's context. Each is named before anything runs.

use std::error::Error;

use kbench_core::arch::ArchError;
use kbench_engine::generate::{self, GenerateOptions};
use kbench_engine::init::{init_model, Preset};
use kbench_engine::{Device, EngineError, Model};

fn tiny_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    init_model(Preset::Tiny, Some(2), 3, 0.8, dir.path()).unwrap();
    dir
}

#[test]
fn a_target_folder_given_as_the_draft_is_named_as_not_a_draft() {
    let dir = tiny_dir();
    let err = Model::load(dir.path(), Some(dir.path()), Device::Cpu)
        .err()
        .expect("a target is no draft");
    assert!(matches!(err, EngineError::NotADraft { .. }), "{err:?}");
    let message = err.to_string();
    for says in [
        "is not an EAGLE-3 draft checkpoint",
        "LlamaForCausalLMEagle3",
        "a target model's config",
        "kimi_k25",
    ] {
        assert!(message.contains(says), "{says}: {message}");
    }
    // the field it lacks stays the cause
    let source = err.source().expect("a source");
    assert!(
        matches!(
            source.downcast_ref::<ArchError>(),
            Some(ArchError::Field { field, .. }) if field == "hidden_size"
        ),
        "{source}"
    );
    // the real draft still loads
    Model::load(dir.path(), Some(&dir.path().join("draft")), Device::Cpu).unwrap();
}

#[test]
fn unknown_prompt_words_are_counted_and_kept() {
    let dir = tiny_dir();
    let model = Model::load(dir.path(), None, Device::Cpu).unwrap();
    let p = generate::encode_prompt(&model, "hello bo world").unwrap();
    assert_eq!(p.ids, vec![0, 3, 0], "the tokens are unchanged");
    let u = p.unknown.expect("two unknown words");
    assert_eq!((u.count, u.of), (2, 3));
    assert_eq!(u.words, ["hello", "world"]);
    assert_eq!((u.unk_token.as_str(), u.unk_id), ("<unk>", 0));
    assert_eq!(u.vocab_size, 256);
    // ordinary words, not the special tokens
    assert_eq!(u.known[..3], ["bo", "bu", "da"]);
    let shown = u.to_string();
    assert!(shown.contains("2 of the prompt's 3 tokens"), "{shown}");
    assert!(shown.contains("\"hello\", \"world\""), "{shown}");
    assert!(shown.contains("bo bu da"), "{shown}");

    assert!(generate::encode_prompt(&model, "bo fabo da")
        .unwrap()
        .unknown
        .is_none());
    // the unknown token written out is meant
    assert!(generate::encode_prompt(&model, "<unk> bo")
        .unwrap()
        .unknown
        .is_none());
}

#[test]
fn a_request_beyond_the_context_is_refused_before_generating() {
    let dir = tiny_dir();
    let model = Model::load(dir.path(), None, Device::Cpu).unwrap();
    let context = model.target.arch.max_position_embeddings as usize;
    let opts = GenerateOptions {
        prompt: "bo bu".into(),
        max_tokens: context - 1,
        temperature: 0.0,
        seed: 0,
        spec: None,
    };
    // a run of this length would not end in the test's lifetime: refused up front
    let err = generate::generate_with(&model, &opts).expect_err("refused");
    assert!(
        matches!(
            err,
            EngineError::ContextLength { prompt_tokens: 2, max_tokens, context: c }
                if max_tokens == context - 1 && c == context as u64
        ),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains(&format!("need {} positions", context + 1))
            && message.contains(&format!("maximum context of {context} tokens")),
        "{message}"
    );
    generate::check_context(&model, 2, context - 2).expect("exactly the context fits");
}
