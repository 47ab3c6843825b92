//! The limits over real sockets: a client slow to send its headers is cut
//! off and cannot hold a shutdown, connections past the cap are closed,
//! and requests are served meanwhile.

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use tidings_http::{ServeLimits, serve_with};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Serves a router answering `GET /` with `ok` within `limits`; returns
/// its address, the server and what stops it.
async fn start(
    limits: ServeLimits,
) -> (
    std::net::SocketAddr,
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Sender<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let app = Router::new().route("/", get(|| async { "ok" }));
    let server = tokio::spawn(serve_with(
        listener,
        app,
        async move {
            let _ = stopped.await;
        },
        limits,
    ));
    (addr, server, stop)
}

/// Sends `GET /` on `stream` and reads the answer's first line.
async fn get_root(stream: &mut TcpStream) -> String {
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    let mut answer = vec![0; 256];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut answer))
        .await
        .expect("an answer within 5 s")
        .unwrap();
    String::from_utf8_lossy(&answer[..n])
        .lines()
        .next()
        .unwrap_or("")
        .to_owned()
}

#[tokio::test]
async fn a_client_slow_to_send_its_headers_is_cut_off_and_cannot_hold_a_shutdown() {
    let limits = ServeLimits {
        header_timeout: Duration::from_millis(500),
        max_connections: 8,
        shutdown_grace: Duration::from_secs(1),
    };
    let (addr, server, stop) = start(limits).await;

    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: test\r\n").await.unwrap();
    let mut fine = TcpStream::connect(addr).await.unwrap();
    assert_eq!(get_root(&mut fine).await, "HTTP/1.1 200 OK", "served meanwhile");
    let mut rest = Vec::new();
    let cut = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut rest)).await;
    assert!(
        cut.is_ok(),
        "the connection is still open 5 s after the 500 ms header timeout"
    );

    // Another one, then a shutdown: the server ends within its grace.
    let mut held = TcpStream::connect(addr).await.unwrap();
    held.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _ = stop.send(());
    let ended = tokio::time::timeout(Duration::from_secs(3), server).await;
    assert!(ended.is_ok(), "the server did not end within its 1 s grace");
}

#[tokio::test]
async fn connections_past_the_cap_are_closed() {
    let limits = ServeLimits {
        header_timeout: Duration::from_secs(10),
        max_connections: 1,
        shutdown_grace: Duration::from_secs(1),
    };
    let (addr, server, stop) = start(limits).await;
    let mut first = TcpStream::connect(addr).await.unwrap();
    assert_eq!(get_root(&mut first).await, "HTTP/1.1 200 OK");
    // The first, kept alive, holds the only place.
    let mut second = TcpStream::connect(addr).await.unwrap();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), second.read_to_end(&mut rest)).await;
    assert!(
        matches!(closed, Ok(Ok(0))),
        "the second connection is closed unanswered: {closed:?}"
    );
    drop(first);
    let _ = stop.send(());
    server.await.unwrap();
}
