//! JSON bodies for the errors hyper answers by itself.
//!
//! A request hyper cannot parse (a malformed request line or header, a URI or a header block
//! over its limits) never reaches the router: hyper writes a bare `400`, `414` or `431` head
//! with no body and closes the connection, and offers no hook to shape that answer. Clients
//! that parse every error as OpenAI's `{"error": ...}` then fail on an empty body. This
//! wrapper sits between hyper and the socket and, when hyper writes such an automatic head,
//! sends the same status with an OpenAI-shaped JSON body instead.
//!
//! An automatic head is recognised by what the router's answers never have together: a
//! `400`/`414`/`431` status, `content-length: 0` and no `content-type`. Every answer the
//! router writes is JSON (or an SSE stream) with its content type.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use axum::http::StatusCode;

use crate::error::ApiError;

/// Wraps a connection's IO (hyper's [`hyper::rt::Read`] / [`hyper::rt::Write`]).
pub struct JsonProtocolErrors<T> {
    inner: T,
    /// The replacement answer and how much of it the socket took.
    replacement: Option<(Vec<u8>, usize)>,
}

impl<T> JsonProtocolErrors<T> {
    pub fn new(inner: T) -> JsonProtocolErrors<T> {
        JsonProtocolErrors {
            inner,
            replacement: None,
        }
    }
}

/// The status of an automatic error head at the start of `buf`, if it is one.
fn automatic_error(buf: &[u8]) -> Option<StatusCode> {
    let rest = buf.strip_prefix(b"HTTP/1.1 ")?;
    let status = match rest.get(..4)? {
        b"400 " => StatusCode::BAD_REQUEST,
        b"414 " => StatusCode::URI_TOO_LONG,
        b"431 " => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        _ => return None,
    };
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let mut headers = head.split("\r\n").skip(1);
    let no_body = headers
        .clone()
        .any(|h| h.replace(' ', "") == "content-length:0");
    let typed = headers.any(|h| h.starts_with("content-type:"));
    (no_body && !typed).then_some(status)
}

fn message(status: StatusCode) -> &'static str {
    match status {
        StatusCode::URI_TOO_LONG => "the request's URI is too long",
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => {
            "the request's headers are too large or too many"
        }
        _ => "the request is not valid HTTP/1.1: its request line or a header is malformed",
    }
}

/// The whole answer: the same status, an OpenAI-shaped body, and the connection closed (as
/// hyper closes it after an automatic answer).
fn replacement(status: StatusCode) -> Vec<u8> {
    let kind = match status {
        StatusCode::URI_TOO_LONG => "UriTooLongError",
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => "RequestHeaderFieldsTooLargeError",
        _ => "BadRequestError",
    };
    let error = ApiError {
        status,
        kind,
        message: message(status).into(),
        param: None,
        code: None,
    };
    let body = error.body().to_string();
    let mut out = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

impl<T: hyper::rt::Write + Unpin> JsonProtocolErrors<T> {
    /// Writes what is left of the replacement; ready once it is all written.
    fn drive_replacement(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, sent)) = &mut self.replacement {
            if *sent == bytes.len() {
                break;
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *sent += n;
        }
        Poll::Ready(Ok(()))
    }

    /// Called with the first bytes of a write: starts the replacement if they are an
    /// automatic error head. Whether hyper's bytes are to be taken as written and dropped.
    fn intercept(&mut self, first: &[u8]) -> bool {
        if self.replacement.is_some() {
            // hyper closes after its automatic answer; nothing it writes after it is sent
            return true;
        }
        match automatic_error(first) {
            Some(status) => {
                self.replacement = Some((replacement(status), 0));
                true
            }
            None => false,
        }
    }
}

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for JsonProtocolErrors<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for JsonProtocolErrors<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.intercept(buf) {
            // hyper's bytes are taken whole; what is left of ours goes out on flush
            let _ = this.drive_replacement(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let first = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| b);
        if this.intercept(first) {
            let _ = this.drive_replacement(cx)?;
            return Poll::Ready(Ok(bufs.iter().map(|b| b.len()).sum()));
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drive_replacement(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drive_replacement(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bare_error_heads_are_replaced() {
        let bare =
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        assert_eq!(
            automatic_error(bare),
            Some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        );
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(automatic_error(ours), None);
        let with_body = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\n";
        assert_eq!(automatic_error(with_body), None);
        assert_eq!(
            automatic_error(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"),
            None
        );
        assert_eq!(automatic_error(b"{\"error\": 1}"), None);
        // a head cut short is not judged
        assert_eq!(
            automatic_error(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n"),
            None
        );
    }

    #[test]
    fn the_replacement_is_a_whole_json_answer() {
        let r = String::from_utf8(replacement(StatusCode::URI_TOO_LONG)).unwrap();
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 414 URI Too Long\r\n"), "{head}");
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert!(head.contains("connection: close"));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], 414);
        assert_eq!(v["error"]["type"], "UriTooLongError");
    }
}
