//! `--log-requests` (SGLang's flag): one line on stderr per finished request, written when
//! its response body is dropped, so a stream is logged when it ends or its client goes away
//! and the duration covers the whole answer, not only its headers.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use hyper::body::{Frame, SizeHint};

use crate::state::AppState;

/// What a handler learns about its request that the log line reports. Shared with the
/// [`crate::gen::Generation`] that fills in the token counts as chunks arrive.
#[derive(Debug, Default)]
pub struct RequestLog {
    id: Mutex<Option<String>>,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
}

impl RequestLog {
    /// The id the client sees (`rid`, or the OpenAI response's `id`).
    pub fn set_id(&self, id: &str) {
        *self.id.lock().unwrap_or_else(|p| p.into_inner()) = Some(id.to_string());
    }

    pub fn set_tokens(&self, prompt: usize, completion: usize) {
        self.prompt_tokens.store(prompt as u64, Ordering::Relaxed);
        self.completion_tokens
            .store(completion as u64, Ordering::Relaxed);
    }
}

/// The middleware: a [`RequestLog`] in the request's extensions, and the line once the
/// response body is done with.
pub async fn log_requests(
    State(state): State<Arc<AppState>>,
    mut request: Request,
    next: Next,
) -> Response {
    if !state.answering.log_requests {
        return next.run(request).await;
    }
    let started = Instant::now();
    let log = Arc::new(RequestLog::default());
    let method = request.method().to_string();
    let endpoint = request.uri().path().to_string();
    request.extensions_mut().insert(log.clone());
    let response = next.run(request).await;
    let status = response.status().as_u16();
    response.map(|inner| {
        Body::new(Logged {
            inner,
            line: Some(Pending {
                log,
                method,
                endpoint,
                status,
                started,
            }),
        })
    })
}

struct Pending {
    log: Arc<RequestLog>,
    method: String,
    endpoint: String,
    status: u16,
    started: Instant,
}

impl Pending {
    fn line(&self) -> String {
        let id = self
            .log
            .id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        line(&Line {
            id: id.as_deref(),
            method: &self.method,
            endpoint: &self.endpoint,
            status: self.status,
            prompt_tokens: self.log.prompt_tokens.load(Ordering::Relaxed),
            completion_tokens: self.log.completion_tokens.load(Ordering::Relaxed),
            duration_ms: self.started.elapsed().as_secs_f64() * 1e3,
        })
    }
}

/// A response body that writes its request's line when dropped.
struct Logged {
    inner: Body,
    line: Option<Pending>,
}

impl HttpBody for Logged {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    // forwarded so a JSON answer keeps its Content-Length when logging is on
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        if let Some(p) = self.line.take() {
            eprintln!("{}", p.line());
        }
    }
}

/// One request's facts, as the line reports them.
pub struct Line<'a> {
    pub id: Option<&'a str>,
    pub method: &'a str,
    pub endpoint: &'a str,
    pub status: u16,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub duration_ms: f64,
}

/// `key=value` pairs (logfmt), so the line splits on spaces whatever the client sent.
pub fn line(l: &Line<'_>) -> String {
    format!(
        "kbench serve: request id={} method={} endpoint={} status={} prompt_tokens={} \
         completion_tokens={} duration_ms={:.3}",
        value(l.id.unwrap_or("-")),
        value(l.method),
        value(l.endpoint),
        l.status,
        l.prompt_tokens,
        l.completion_tokens,
        l.duration_ms,
    )
}

/// A value as is when it cannot break the line apart, else quoted and escaped: a client's
/// `rid` may hold spaces, quotes or newlines.
fn value(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_graphic() && c != '"' && c != '=' && c != '\\');
    if plain {
        s.to_string()
    } else {
        serde_json::Value::String(s.to_string()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_names_every_field_and_quotes_what_could_split_it() {
        let l = Line {
            id: Some("cmpl-0000000000000003"),
            method: "POST",
            endpoint: "/v1/completions",
            status: 200,
            prompt_tokens: 5,
            completion_tokens: 12,
            duration_ms: 34.2714,
        };
        assert_eq!(
            line(&l),
            "kbench serve: request id=cmpl-0000000000000003 method=POST \
             endpoint=/v1/completions status=200 prompt_tokens=5 completion_tokens=12 \
             duration_ms=34.271"
        );
        let l = Line {
            id: Some("a b\n\"c\"=d"),
            ..l
        };
        assert!(
            line(&l).contains(r#"id="a b\n\"c\"=d" method=POST"#),
            "{}",
            line(&l)
        );
        let l = Line { id: None, ..l };
        assert!(line(&l).contains("id=- method="));
        assert!(!line(&l).contains('\n'));
    }
}
