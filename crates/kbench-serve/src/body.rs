//! Request bodies: read within the size and time limits, parsed strictly (an unknown field
//! is an error that names it), and the shapes both APIs share.

use std::sync::Arc;

use axum::body::{Body, HttpBody as _};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::error::ApiError;
use crate::state::AppState;

/// Reads and parses a JSON body.
pub async fn read_json<T: DeserializeOwned + Send + 'static>(
    state: &Arc<AppState>,
    body: Body,
) -> Result<T, ApiError> {
    let limit = state.limits.max_body_bytes;
    // a declared length over the limit is refused at once, before waiting for any of it
    if body.size_hint().lower() > limit as u64 {
        return Err(ApiError::too_large(limit));
    }
    let limited = http_body_util::Limited::new(body, limit);
    let bytes = match tokio::time::timeout(state.limits.read_timeout, limited.collect()).await {
        Err(_) => return Err(ApiError::timeout("the request body")),
        Ok(Err(e)) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                return Err(ApiError::too_large(limit));
            }
            return Err(ApiError::bad_request(format!(
                "could not read the request body: {e}"
            )));
        }
        Ok(Ok(c)) => c.to_bytes(),
    };
    if bytes.is_empty() {
        return Err(ApiError::bad_request(
            "the request body is empty (expected JSON)",
        ));
    }
    crate::offload::parse_json(state, bytes).await
}

/// `stop` as a string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// A prompt as text or token ids (one prompt; batches are refused).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

/// SGLang's `input_ids`: token ids only, never text.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum InputIds {
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

impl From<InputIds> for Prompt {
    fn from(ids: InputIds) -> Prompt {
        match ids {
            InputIds::Ids(v) => Prompt::Ids(v),
            InputIds::IdLists(v) => Prompt::IdLists(v),
        }
    }
}

impl Prompt {
    pub async fn ids(self, state: &Arc<AppState>) -> Result<Vec<u32>, ApiError> {
        match self {
            Prompt::Text(t) => crate::offload::encode(state, t).await,
            Prompt::Ids(ids) => Ok(ids),
            Prompt::Texts(mut v) if v.len() == 1 => {
                crate::offload::encode(state, v.remove(0)).await
            }
            Prompt::IdLists(mut v) if v.len() == 1 => Ok(v.remove(0)),
            _ => Err(ApiError::bad_request(
                "batched prompts are not supported: send one prompt per request",
            )
            .with_param("prompt")),
        }
    }
}

/// Refuses a setting kbench does not implement unless it has its no-op value.
pub fn only<T: PartialEq + std::fmt::Debug>(
    name: &'static str,
    value: Option<T>,
    allowed: T,
) -> Result<(), ApiError> {
    match value {
        Some(v) if v != allowed => Err(ApiError::bad_request(format!(
            "`{name}` = {v:?} is not supported by kbench serve (only {allowed:?})"
        ))
        .with_param(name)),
        _ => Ok(()),
    }
}

/// `top_k` as SGLang and vLLM take it: -1 or 0 mean no cut.
pub fn top_k(value: Option<i64>) -> Result<u32, ApiError> {
    match value {
        None | Some(-1) | Some(0) => Ok(0),
        Some(k) if k > 0 => Ok(k as u32),
        Some(k) => Err(
            ApiError::bad_request(format!("top_k {k} must be -1 or positive")).with_param("top_k"),
        ),
    }
}
