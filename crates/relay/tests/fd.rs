//! File descriptor accounting: each test counts /proc/self/fd before and after, so they run one
//! at a time (a lock) on a runtime of their own, and this file holds nothing else.

mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::*;
use kp_relay::{RelayConfig, raise_fd_limit};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `test` alone on a fresh two-worker runtime.
fn serial<F: std::future::Future<Output = ()>>(test: impl FnOnce() -> F) {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(test());
}

/// Waits until the fd count is back to `baseline` (or below: an earlier test's runtime may
/// still be shutting down); returns the last count seen.
async fn settle(baseline: usize) -> usize {
    let mut n = fd_count();
    for _ in 0..200 {
        if n <= baseline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        n = fd_count();
    }
    n
}

/// Proves: 1,000 concurrent connections are all relayed at once, and every socket and pipe is
/// closed afterwards.
#[test]
fn a_thousand_concurrent_connections_leave_no_fd_behind() {
    serial(|| async {
        let limit = raise_fd_limit().unwrap();
        assert!(limit >= 9_000, "RLIMIT_NOFILE hard limit too low: {limit}");
        let echo = Backend::start("echo", Mode::NameEcho).await;
        let relay = relay(RelayConfig::default());
        let port = apply_one(&relay, "web", tcp(&[echo.addr])).await;
        let baseline = fd_count();

        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(1000));
        let tasks: Vec<_> = (0..1000)
            .map(|i| {
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    let mut s = TcpStream::connect(local(port)).await.unwrap();
                    assert_eq!(read_line(&mut s).await.unwrap(), "echo");
                    round_trip(&mut s, format!("client {i}").as_bytes()).await;
                    // Hold every connection open until all 1,000 are relayed.
                    barrier.wait().await;
                    round_trip(&mut s, b"bye").await;
                })
            })
            .collect();
        let waiter = async {
            for t in tasks {
                t.await.unwrap();
            }
        };
        let done = tokio::time::timeout(Duration::from_secs(20), waiter).await;
        let stats = &relay.listeners()[0];
        assert!(
            done.is_ok(),
            "1,000 connections did not complete: {stats:?}"
        );
        assert_eq!(stats.accepted_total, 1000);
        assert_eq!(stats.rejected_total, 0);
        assert!(eventually(Duration::from_secs(5), || relay.open_connections() == 0).await);
        let after = settle(baseline).await;
        assert!(
            after <= baseline,
            "fd leak: {baseline} before, {after} after"
        );
    });
}

/// Proves: a backend that accepts and resets closes the client's connection, and nothing leaks.
#[test]
fn a_resetting_backend_closes_the_client_without_leaking() {
    serial(|| async {
        let rst = Backend::start("rst", Mode::Reset).await;
        let relay = relay(RelayConfig::default());
        let port = apply_one(&relay, "web", tcp(&[rst.addr])).await;
        let baseline = fd_count();
        for _ in 0..50 {
            let mut s = match TcpStream::connect(local(port)).await {
                Ok(s) => s,
                // The reset can come back before the connect is seen complete.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => continue,
                Err(e) => panic!("connect: {e}"),
            };
            let _ = s.write_all(b"hello").await;
            assert!(closed_within(&mut s, Duration::from_secs(2)).await);
        }
        assert!(eventually(Duration::from_secs(2), || relay.open_connections() == 0).await);
        let after = settle(baseline).await;
        assert!(
            after <= baseline,
            "fd leak: {baseline} before, {after} after"
        );
    });
}

/// Proves: a slow reader gets all 8 MiB intact (backpressure instead of buffering), and the
/// connection's fds are closed at the end.
#[test]
fn a_slow_reader_gets_everything_intact() {
    serial(|| async {
        const N: usize = 8 << 20;
        let sender = Backend::start("send", Mode::Send(N)).await;
        let relay = relay(RelayConfig::default());
        let port = apply_one(&relay, "web", tcp(&[sender.addr])).await;
        let baseline = fd_count();
        let mut s = TcpStream::connect(local(port)).await.unwrap();
        // Stall first so that every buffer on the way fills up, then read in small sips.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut sum = Checksum::default();
        let mut buf = vec![0u8; 32 * 1024];
        let mut reads = 0usize;
        loop {
            let n = s.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            sum.update(&buf[..n]);
            reads += 1;
            if reads.is_multiple_of(8) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        assert_eq!(sum.len, N);
        assert_eq!(sum.finish(), pattern_checksum(N, 7));
        drop(s);
        assert!(eventually(Duration::from_secs(2), || relay.open_connections() == 0).await);
        let after = settle(baseline).await;
        assert!(
            after <= baseline,
            "fd leak: {baseline} before, {after} after"
        );
    });
}
