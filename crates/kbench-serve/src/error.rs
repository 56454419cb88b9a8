//! Errors: [`ServeError`] for what stops the server from starting, [`ApiError`] for what a
//! request gets back (OpenAI's error shape, the status SGLang or vLLM would send).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Io(String, #[source] std::io::Error),
    #[error("loading the model")]
    Engine(#[source] kbench_engine::EngineError),
    #[error("the simulator")]
    Sim(#[source] kbench_sim::SimError),
    #[error("{0}")]
    Worker(String),
}

/// A request's failure, rendered as `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<&'static str>,
    /// OpenAI's string code where it has one (`invalid_api_key`, `context_length_exceeded`);
    /// otherwise the status number.
    pub code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "BadRequestError", message)
    }

    pub fn with_param(mut self, param: &'static str) -> ApiError {
        self.param = Some(param);
        self
    }

    pub fn context_length(limit: usize, prompt: usize, completion: usize) -> ApiError {
        ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::bad_request(format!(
                "This model's maximum context length is {limit} tokens. However, you requested \
                 {} tokens ({prompt} in the messages, {completion} in the completion). Please \
                 reduce the length of the messages or completion.",
                prompt + completion
            ))
        }
    }

    /// Beyond what the server prefills in bounded time, though the context may hold it.
    pub fn prompt_too_long(prompt: usize, max: usize) -> ApiError {
        ApiError {
            code: Some("prompt_too_long"),
            param: Some("prompt"),
            ..ApiError::bad_request(format!(
                "The prompt has {prompt} tokens; this server accepts prompts of at most {max} \
                 tokens (its --max-prompt-tokens: by default what the engine prefills in {} s \
                 on this machine). Shorten the prompt, or restart the server with a larger \
                 --max-prompt-tokens.",
                crate::engine::PREFILL_BUDGET.as_secs()
            ))
        }
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(
                StatusCode::UNAUTHORIZED,
                "AuthenticationError",
                "Incorrect API key provided. Send it as `Authorization: Bearer KEY`.",
            )
        }
    }

    pub fn not_found(what: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            format!("{what} not found"),
        )
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowedError",
            "method not allowed on this endpoint",
        )
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestTooLargeError",
            format!("request body larger than {limit} bytes"),
        )
    }

    pub fn timeout(what: &str) -> ApiError {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "RequestTimeoutError",
            format!("{what} did not arrive in time"),
        )
    }

    pub fn too_many(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "RateLimitError",
            format!("server busy: {limit} requests are already running or queued"),
        )
    }

    pub fn rate_limited() -> ApiError {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "RateLimitError",
            "Rate limit reached (injected fault)",
        )
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerError",
            message,
        )
    }

    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailableError",
            message,
        )
    }

    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": match self.code {
                    Some(c) => json!(c),
                    None => json!(self.status.as_u16()),
                },
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}
