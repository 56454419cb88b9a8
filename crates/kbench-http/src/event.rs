//! One server-sent event's JSON, read into only what the client uses: the fields are typed
//! and everything else (the text, logprobs) is skipped without being built, which is most
//! of the client's cost per chunk at thousands of chunks per second.

use serde::de::IgnoredAny;
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
pub struct Event {
    #[serde(default)]
    pub meta_info: Option<Meta>,
    #[serde(default)]
    pub choices: Option<Vec<Choice>>,
    #[serde(default)]
    pub usage: Option<Usage>,
    #[serde(default)]
    pub metrics: Option<Metrics>,
    /// A server's mid-stream error: a string or `{"message": ...}`.
    #[serde(default)]
    pub error: Option<serde_json::Value>,
}

/// SGLang's `meta_info`.
#[derive(Debug, Default, Deserialize)]
pub struct Meta {
    pub completion_tokens: Option<u64>,
    /// Non-null once the request finished.
    pub finish_reason: Option<IgnoredAny>,
    /// Verify rounds of the request, in the finished chunk (the name every SGLang release
    /// since 0.5.10 uses).
    pub spec_verify_ct: Option<u64>,
    /// `kbench serve --sim`: when the chunk left the server.
    pub kbench_sent_unix_ns: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Choice {
    pub finish_reason: Option<IgnoredAny>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
}

/// vLLM's per-request `metrics`.
#[derive(Debug, Default, Deserialize)]
pub struct Metrics {
    pub speculative_decoding: Option<SpecDecoding>,
}

#[derive(Debug, Default, Deserialize)]
pub struct SpecDecoding {
    pub num_spec_steps: Option<u64>,
    pub num_accepted_draft_tokens: Option<u64>,
    pub num_draft_tokens: Option<u64>,
    pub per_step_accepted: Option<Vec<u32>>,
    pub per_step_drafted: Option<Vec<u32>>,
}

impl Event {
    pub fn error_message(&self) -> Option<String> {
        let e = self.error.as_ref()?;
        Some(
            e["message"]
                .as_str()
                .or(e.as_str())
                .unwrap_or("(no message)")
                .to_string(),
        )
    }
}
