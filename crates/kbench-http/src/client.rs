//! A small HTTP/1.1 client: one connection per request (loopback or a LAN, where connecting
//! costs little next to a generation), the body read frame by frame so every chunk is
//! timestamped when it arrives.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::settings::Target;

pub struct Client {
    pub target: Target,
    api_key: Option<String>,
}

/// A response whose body is read as it arrives.
pub struct Streaming {
    pub status: u16,
    body: Incoming,
}

impl Streaming {
    /// The next piece of the body; `Ok(None)` at its end, `Err` when the connection broke.
    pub async fn next(&mut self) -> Result<Option<Bytes>, String> {
        loop {
            match self.body.frame().await {
                None => return Ok(None),
                Some(Err(e)) => return Err(format!("the connection broke mid-response: {e}")),
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data() {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }

    pub async fn all(mut self, limit: Duration) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        let read = async {
            while let Some(b) = self.next().await? {
                out.extend_from_slice(&b);
            }
            Ok::<(), String>(())
        };
        tokio::time::timeout(limit, read)
            .await
            .map_err(|_| format!("no complete answer within {limit:?}"))??;
        Ok(out)
    }
}

impl Client {
    pub fn new(target: Target, api_key: Option<String>) -> Client {
        Client { target, api_key }
    }

    /// Whether the server's port actively refuses a connection: nothing listens there, as
    /// opposed to a server that is still loading or slow to answer.
    pub async fn refuses_connections(&self) -> bool {
        let t = &self.target;
        let connect = TcpStream::connect((t.host.as_str(), t.port));
        matches!(
            tokio::time::timeout(Duration::from_secs(5), connect).await,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused
        )
    }

    /// Sends a request and returns once its headers have arrived.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        json: Option<&serde_json::Value>,
        limit: Duration,
    ) -> Result<Streaming, String> {
        let t = &self.target;
        let connect = TcpStream::connect((t.host.as_str(), t.port));
        let stream = tokio::time::timeout(limit, connect)
            .await
            .map_err(|_| format!("connecting to {} timed out", t.url))?
            .map_err(|e| format!("cannot connect to {}: {e}", t.url))?;
        let _ = stream.set_nodelay(true);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP handshake with {}: {e}", t.url))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let body = json.map(|v| v.to_string()).unwrap_or_default();
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", t.prefix))
            .header("host", format!("{}:{}", t.host, t.port))
            .header("accept", "application/json, text/event-stream");
        if json.is_some() {
            req = req.header("content-type", "application/json");
        }
        if let Some(k) = &self.api_key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("building the request: {e}"))?;
        let resp = tokio::time::timeout(limit, sender.send_request(req))
            .await
            .map_err(|_| format!("{path}: no response within {:.1} s", limit.as_secs_f64()))?
            .map_err(|e| format!("{path}: {e}"))?;
        Ok(Streaming {
            status: resp.status().as_u16(),
            body: resp.into_body(),
        })
    }

    /// GET or POST and parse the JSON answer; non-2xx statuses are errors with the body.
    pub async fn json(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
        limit: Duration,
    ) -> Result<(u16, serde_json::Value), String> {
        let r = self.send(method, path, body, limit).await?;
        let status = r.status;
        let bytes = r.all(limit).await?;
        let v = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(&bytes).into_owned())
        });
        Ok((status, v))
    }
}
