//! Answering with a generation: as server-sent events (`data: {json}` per chunk, then
//! `data: [DONE]`) or as one JSON body, with the injected stream faults applied.

use std::collections::VecDeque;

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde_json::Value;

use crate::faults::FaultKind;
use crate::gen::{Delta, Generation};

/// How one endpoint writes its chunks.
pub trait Format: Send + 'static {
    /// The events for one chunk.
    fn chunk(&mut self, gen: &Generation, delta: &Delta) -> Vec<Value>;
    /// Events after the last chunk (a usage chunk), before `[DONE]`.
    fn end(&mut self, _gen: &Generation) -> Vec<Value> {
        Vec::new()
    }
    /// The whole answer of a non-streaming request.
    fn whole(&mut self, gen: &Generation) -> Value;
}

/// A stream fault in effect for this request.
#[derive(Debug, Clone, Copy)]
pub enum StreamFault {
    Drop,
    Stall(Duration),
    Malformed,
}

impl StreamFault {
    pub fn of(kind: Option<FaultKind>, stall: Duration) -> Option<StreamFault> {
        match kind {
            Some(FaultKind::Drop) => Some(StreamFault::Drop),
            Some(FaultKind::Stall) => Some(StreamFault::Stall(stall)),
            Some(FaultKind::Malformed) => Some(StreamFault::Malformed),
            _ => None,
        }
    }
}

struct Sse<F> {
    gen: Generation,
    format: F,
    queue: VecDeque<Bytes>,
    closing: bool,
    fault: Option<StreamFault>,
    sent: usize,
}

fn event(payload: &str) -> Bytes {
    Bytes::from(format!("data: {payload}\n\n"))
}

impl<F: Format> Sse<F> {
    async fn next(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        loop {
            if let Some(b) = self.queue.pop_front() {
                self.sent += 1;
                return Some(Ok(b));
            }
            if self.closing {
                return None;
            }
            if self.sent > 0 {
                match self.fault {
                    Some(StreamFault::Drop) => {
                        // the connection drops when the next chunk would have been sent; a
                        // pending poll first lets the connection flush what it holds
                        let _ = self.gen.next().await;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        self.closing = true;
                        return Some(Err(std::io::Error::other(
                            "injected fault: connection dropped",
                        )));
                    }
                    Some(StreamFault::Malformed) => {
                        self.queue
                            .push_back(event("{\"meta_info\": {\"completion_tokens\": "));
                        self.queue.push_back(event("[DONE]"));
                        self.closing = true;
                        continue;
                    }
                    Some(StreamFault::Stall(d)) => {
                        tokio::time::sleep(d).await;
                        self.closing = true;
                        return Some(Err(std::io::Error::other("injected fault: stream stalled")));
                    }
                    None => {}
                }
            }
            match self.gen.next().await {
                Some(Ok(delta)) => {
                    for v in self.format.chunk(&self.gen, &delta) {
                        self.queue.push_back(event(&v.to_string()));
                    }
                    if delta.finish.is_some() {
                        self.finish();
                    }
                }
                Some(Err(e)) => {
                    self.queue.push_back(event(&e.body().to_string()));
                    self.queue.push_back(event("[DONE]"));
                    self.closing = true;
                }
                None => self.finish(),
            }
        }
    }

    fn finish(&mut self) {
        for v in self.format.end(&self.gen) {
            self.queue.push_back(event(&v.to_string()));
        }
        self.queue.push_back(event("[DONE]"));
        self.closing = true;
    }
}

/// Streams `gen` as server-sent events.
pub fn sse<F: Format>(gen: Generation, format: F, fault: Option<StreamFault>) -> Response {
    let state = Sse {
        gen,
        format,
        queue: VecDeque::new(),
        closing: false,
        fault,
        sent: 0,
    };
    let body = stream::unfold(state, |mut s| async move {
        s.next().await.map(|item| (item, s))
    });
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// Runs `gen` to its end and answers with one JSON body.
pub async fn whole<F: Format>(
    mut gen: Generation,
    mut format: F,
    fault: Option<StreamFault>,
) -> Response {
    if let Some(StreamFault::Malformed) = fault {
        return (
            StatusCode::OK,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            "{\"text\": ",
        )
            .into_response();
    }
    if let Some(f) = fault {
        if let StreamFault::Stall(d) = f {
            tokio::time::sleep(d).await;
        }
        let broken =
            stream::once(async { Err::<Bytes, _>(std::io::Error::other("injected fault")) });
        return (StatusCode::OK, Body::from_stream(broken)).into_response();
    }
    loop {
        match gen.next().await {
            Some(Ok(d)) if d.finish.is_some() => break,
            Some(Ok(_)) => {}
            Some(Err(e)) => return e.into_response(),
            None => break,
        }
    }
    axum::Json(format.whole(&gen)).into_response()
}
