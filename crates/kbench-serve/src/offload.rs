//! CPU-heavy work of one request (parsing a large body, tokenizing a long prompt) runs on
//! tokio's blocking pool, a few at a time, so that the runtime's threads stay free to answer
//! `/health` and to write the other requests' streams: a 4 MB prompt takes the tokenizer
//! seconds, and the runtime has one thread per core.

use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::AppState;

/// Below these sizes the work takes microseconds: done in place, saving the thread hop.
const INLINE_JSON_BYTES: usize = 64 << 10;
const INLINE_TEXT_BYTES: usize = 16 << 10;

/// Runs `work` on the blocking pool once one of the server's heavy-work permits is free.
async fn off_runtime<T: Send + 'static>(
    state: &Arc<AppState>,
    work: impl FnOnce(&AppState) -> T + Send + 'static,
) -> Result<T, ApiError> {
    let _permit = state
        .heavy_work
        .acquire()
        .await
        .map_err(|_| ApiError::unavailable("the server is shutting down"))?;
    let state = state.clone();
    tokio::task::spawn_blocking(move || work(&state))
        .await
        .map_err(|_| ApiError::internal("the request's preparation failed"))
}

pub async fn parse_json<T: DeserializeOwned + Send + 'static>(
    state: &Arc<AppState>,
    bytes: bytes::Bytes,
) -> Result<T, ApiError> {
    let parse = move |bytes: &[u8]| {
        serde_json::from_slice(bytes)
            .map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))
    };
    if bytes.len() <= INLINE_JSON_BYTES {
        return parse(&bytes);
    }
    off_runtime(state, move |_| parse(&bytes)).await?
}

pub async fn encode(state: &Arc<AppState>, text: String) -> Result<Vec<u32>, ApiError> {
    if text.len() <= INLINE_TEXT_BYTES {
        return state.codec.encode(&text);
    }
    off_runtime(state, move |s| s.codec.encode(&text)).await?
}
