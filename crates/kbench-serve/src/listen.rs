//! The accept loop: one task per connection (HTTP/1.1 with keep-alive; hyper's own parse errors
//! answered as JSON, [`crate::protocol_errors`]), a deadline on each
//! request's headers so slow or idle clients cannot hold the server, and a graceful stop:
//! no new connections, running requests drained within a bound.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::protocol_errors::JsonProtocolErrors;
use crate::state::AppState;

pub async fn serve(listener: TcpListener, state: Arc<AppState>, mut stop: watch::Receiver<bool>) {
    let app = crate::routes::router(state.clone());
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => break,
        };
        let (socket, _peer): (_, SocketAddr) = match accepted {
            Ok(a) => a,
            // out of descriptors or a reset before accept: keep serving the others
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                continue;
            }
        };
        let _ = socket.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let timeout = state.limits.read_timeout;
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(timeout)
                .keep_alive(true)
                .serve_connection(JsonProtocolErrors::new(TokioIo::new(socket)), service)
                .await;
        });
    }
    drop(listener);
    // Let running requests finish, within the bound.
    let deadline = Instant::now() + state.limits.drain_timeout;
    while state.in_flight() > 0 && Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
