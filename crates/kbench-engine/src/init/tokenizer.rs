//! The WordLevel tokenizer.json a generated model ships with.

use serde_json::{json, Value};

/// A WordLevel tokenizer.json over `vocab` pronounceable words (`<unk>`, `<s>`, `</s>` first).
pub fn tokenizer_json(vocab: usize) -> Value {
    let mut map = serde_json::Map::new();
    let specials = ["<unk>", "<s>", "</s>"];
    for (i, s) in specials.iter().enumerate().take(vocab) {
        map.insert((*s).into(), json!(i));
    }
    for i in specials.len()..vocab {
        map.insert(word(i), json!(i));
    }
    let added: Vec<Value> = specials
        .iter()
        .enumerate()
        .take(vocab)
        .map(|(i, s)| {
            json!({"id": i, "content": s, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true})
        })
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": map, "unk_token": "<unk>"}
    })
}

/// Word for token id `i`: syllables in base 70, unique per id.
pub fn word(i: usize) -> String {
    const C: &[u8] = b"bdfgklmnprstvz";
    const V: &[u8] = b"aeiou";
    let mut n = i;
    let mut s = String::new();
    loop {
        let syl = n % 70;
        s.push(C[syl / 5] as char);
        s.push(V[syl % 5] as char);
        n /= 70;
        if n == 0 {
            break;
        }
    }
    s
}
