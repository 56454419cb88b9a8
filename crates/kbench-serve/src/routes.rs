//! The router: every endpoint, the API-key check, and OpenAI-shaped answers for unknown
//! paths and methods.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::error::ApiError;
use crate::state::AppState;
use crate::{openai, sglang};

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
        .route("/metrics", get(sglang::metrics))
        .fallback(|| async { ApiError::not_found("this endpoint").into_response() })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed().into_response() })
        .layer(middleware::from_fn_with_state(state.clone(), require_key))
        .with_state(state)
}

/// With `--api-key`, every request but `/health` (load balancers' probe) must carry
/// `Authorization: Bearer KEY`.
async fn require_key(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        if request.uri().path() != "/health" {
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
