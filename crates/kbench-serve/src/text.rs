//! Text to token ids and back: the model's own tokenizer for the engine; for the simulator,
//! which has no tokenizer, one token per whitespace-separated word.

use crate::error::ApiError;

pub enum TextCodec {
    Tokenizer {
        tokenizer: Box<tokenizers::Tokenizer>,
    },
    /// `w<id>` words stand for ids; any other word hashes to an id (FNV-1a), so a prompt's
    /// token count is its word count.
    Words { vocab: u32 },
}

/// Ids below this are special (`<unk>`, `<s>`, `</s>` in the engine's tokenizers); words
/// never map to them.
const FIRST_WORD_ID: u32 = 3;

impl TextCodec {
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        match self {
            TextCodec::Tokenizer { tokenizer } => tokenizer
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| ApiError::bad_request(format!("could not tokenize the prompt: {e}"))),
            TextCodec::Words { vocab } => Ok(text
                .split_whitespace()
                .map(|w| word_id(w, *vocab))
                .collect()),
        }
    }

    /// The text of `ids`, special tokens left out.
    pub fn decode(&self, ids: &[u32]) -> String {
        match self {
            TextCodec::Tokenizer { tokenizer } => tokenizer.decode(ids, true).unwrap_or_default(),
            TextCodec::Words { .. } => {
                let mut s = String::with_capacity(ids.len() * 5);
                for (i, id) in ids.iter().filter(|&&id| id >= FIRST_WORD_ID).enumerate() {
                    if i > 0 {
                        s.push(' ');
                    }
                    s.push('w');
                    s.push_str(&id.to_string());
                }
                s
            }
        }
    }

    /// Decoding is a concatenation of per-token pieces: text can grow by decoding only the
    /// new tokens.
    pub fn decodes_per_token(&self) -> bool {
        matches!(self, TextCodec::Words { .. })
    }

    pub fn is_tokenizer(&self) -> bool {
        matches!(self, TextCodec::Tokenizer { .. })
    }
}

fn word_id(word: &str, vocab: u32) -> u32 {
    let span = vocab.saturating_sub(FIRST_WORD_ID).max(1);
    if let Some(n) = word.strip_prefix('w').and_then(|d| d.parse::<u32>().ok()) {
        if (FIRST_WORD_ID..vocab).contains(&n) {
            return n;
        }
    }
    let mut h: u64 = 0xcbf29ce484222325;
    for b in word.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    FIRST_WORD_ID + (h % span as u64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_stay_in_vocab() {
        let c = TextCodec::Words { vocab: 1000 };
        let ids = c.encode("w17 hello  w999 w5000 w1").unwrap();
        assert_eq!(ids.len(), 5);
        assert_eq!(ids[0], 17);
        assert_eq!(ids[2], 999);
        assert!(ids.iter().all(|&i| (FIRST_WORD_ID..1000).contains(&i)));
        assert_eq!(c.decode(&[17, 2, 999]), "w17 w999");
    }
}
