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
    if let Some(key) = &state.api_key {
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

/// Compares in time that depends on the lengths only.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
