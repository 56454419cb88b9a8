//! The router: every endpoint, the API-key check, the request log, and OpenAI-shaped
//! answers for unknown paths and methods.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::error::ApiError;
use crate::state::AppState;
use crate::{openai, reqlog, sglang};

/// Open without the API key, as SGLang leaves `/health*` and `/metrics` open: load
/// balancers' probes and Prometheus scrapers carry no key. Nothing here generates for a
/// client or changes the server's state.
const OPEN_PATHS: [&str; 3] = ["/health", "/health_generate", "/metrics"];

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/generate", post(sglang::generate))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/models", get(openai::models))
        .route("/health", get(sglang::health))
        .route("/health_generate", get(sglang::health_generate))
        .route("/get_model_info", get(sglang::get_model_info))
        .route("/model_info", get(sglang::get_model_info))
        .route("/get_server_info", get(sglang::get_server_info))
        .route("/server_info", get(sglang::get_server_info))
        .route(
            "/flush_cache",
            get(sglang::flush_cache).post(sglang::flush_cache),
        )
        // vLLM's name for it (POST only, as vLLM routes it)
        .route("/reset_prefix_cache", post(sglang::reset_prefix_cache))
        .route("/metrics", get(sglang::metrics))
        .fallback(|| async { ApiError::not_found("this endpoint").into_response() })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed().into_response() })
        .layer(middleware::from_fn_with_state(state.clone(), require_key))
        // outermost, so a refused key is logged too
        .layer(middleware::from_fn_with_state(
            state.clone(),
            reqlog::log_requests,
        ))
        .with_state(state)
}

/// With `--api-key`, every request but [`OPEN_PATHS`] must carry `Authorization: Bearer KEY`.
async fn require_key(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.answering.api_key {
        if !OPEN_PATHS.contains(&request.uri().path()) {
            let given = request
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            if !given.is_some_and(|g| same(g.as_bytes(), key.as_bytes())) {
                return ApiError::unauthorized().into_response();
            }
        }
    }
    next.run(request).await
}

/// Compares `given` with `key` in time that depends on the key's length alone: every key
/// byte is compared whatever the given length, so neither the bytes nor the length of a
/// wrong key show in the answer's timing.
fn same(given: &[u8], key: &[u8]) -> bool {
    let mut diff = u64::from(given.len() != key.len());
    for (i, k) in key.iter().enumerate() {
        let g = given.get(i).copied().unwrap_or(!k);
        diff |= u64::from(std::hint::black_box(g ^ k));
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::same;

    #[test]
    fn only_the_key_itself_passes() {
        assert!(same(b"secret", b"secret"));
        for wrong in [
            &b""[..],
            b"s",
            b"secreT",
            b"secret!",
            b"secretsecret",
            b"xecret",
        ] {
            assert!(!same(wrong, b"secret"), "{wrong:?}");
        }
        assert!(same(b"", b""));
    }
}
