//! Behaviour of the relay over loopback: balancing, retries, updates, half-close, limits, UDP
//! flows and bulk transfer. File descriptor accounting lives in `fd.rs`, which runs its tests
//! one at a time.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use kp_relay::{Protocol, RelayConfig, RelayError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

fn counts(names: &[String]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for n in names {
        *m.entry(n.clone()).or_insert(0) += 1;
    }
    m
}

/// Proves: new connections go round robin over the endpoints, each exactly as often.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_gives_each_backend_an_equal_share() {
    let backends = [
        Backend::start("a", Mode::NameEcho).await,
        Backend::start("b", Mode::NameEcho).await,
        Backend::start("c", Mode::NameEcho).await,
    ];
    let eps: Vec<SocketAddr> = backends.iter().map(|b| b.addr).collect();
    let relay = relay(RelayConfig::default());
    let port = apply_one(&relay, "web", tcp(&eps)).await;
    let mut names = Vec::new();
    for _ in 0..30 {
        names.push(name_via(port).await);
    }
    let c = counts(&names);
    assert_eq!(c.len(), 3, "{c:?}");
    assert!(c.values().all(|&n| n == 10), "{c:?}");
    for b in &backends {
        assert_eq!(b.accepted.load(std::sync::atomic::Ordering::SeqCst), 10);
    }
    let stats = &relay.listeners()[0];
    assert_eq!(stats.key, "web");
    assert_eq!(stats.name, "default/web:http");
    assert_eq!(stats.protocol, Protocol::Tcp);
    assert_eq!(stats.port, port);
    assert_eq!(stats.endpoints, eps);
    assert_eq!(stats.accepted_total, 30);
    assert_eq!(stats.dial_failures_total, 0);
    // Counted just after each splice, which may trail the client's read by a moment.
    assert!(
        eventually(Duration::from_secs(1), || relay.listeners()[0].bytes_total
            >= 30 * 2)
        .await,
        "{:?}",
        relay.listeners()
    );
}

/// Proves: a refused endpoint is skipped within the same client connection, so every client
/// reaches the live one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_endpoint_is_retried_on_the_next() {
    let live = Backend::start("live", Mode::NameEcho).await;
    let relay = relay(RelayConfig::default());
    let port = apply_one(&relay, "web", tcp(&[closed_port(), live.addr])).await;
    for _ in 0..20 {
        assert_eq!(name_via(port).await, "live");
    }
    let stats = &relay.listeners()[0];
    // The index advances per attempt, so a dead endpoint of two is tried by (almost) every
    // connection: 19 or 20 refusals depending on the shuffle.
    assert!(stats.dial_failures_total >= 19, "{stats:?}");
    assert_eq!(stats.no_endpoint_total, 0);
}

/// Proves: an endpoint that does not answer is abandoned after the first timeout (250 ms) and
/// the next endpoint serves the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_endpoint_is_retried_after_the_first_timeout() {
    let hole = BlackHole::start().await;
    // The black hole really swallows connects on this kernel.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(hole.addr))
            .await
            .is_err()
    );
    let live = Backend::start("live", Mode::NameEcho).await;
    let relay = relay(RelayConfig::default());
    let port = apply_one(&relay, "web", tcp(&[hole.addr, live.addr])).await;
    let clients = (0..6).map(|_| async move {
        let start = Instant::now();
        let name = name_via(port).await;
        (name, start.elapsed())
    });
    let results = futures_join_all(clients).await;
    let slowest = results.iter().map(|r| r.1).max().unwrap();
    for (name, _) in &results {
        assert_eq!(name, "live");
    }
    let stats = &relay.listeners()[0];
    assert!(stats.dial_failures_total >= 1, "{stats:?}");
    assert!(
        slowest >= Duration::from_millis(250) && slowest < Duration::from_millis(800),
        "slowest client took {slowest:?}, expected about the first dial timeout (250 ms)"
    );
}

/// Runs futures concurrently (a tiny `join_all`).
async fn futures_join_all<F: std::future::Future + Send + 'static>(
    futs: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

/// Proves: when every endpoint refuses, or there is none, the client is closed quickly and the
/// listener counts it; each endpoint is tried once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_working_endpoint_closes_the_client() {
    let relay = relay(RelayConfig::default());
    let port = apply_one(&relay, "web", tcp(&[closed_port(), closed_port()])).await;
    let start = Instant::now();
    assert!(connect_and_see_closed(port, Duration::from_secs(1)).await);
    assert!(start.elapsed() < Duration::from_secs(1));
    assert!(
        eventually(Duration::from_secs(1), || relay.listeners()[0]
            .no_endpoint_total
            == 1)
        .await
    );
    let stats = &relay.listeners()[0];
    assert_eq!(
        stats.dial_failures_total, 2,
        "each endpoint is tried exactly once"
    );

    // No endpoints at all.
    assert_eq!(apply_one(&relay, "web", tcp(&[])).await, port);
    assert!(connect_and_see_closed(port, Duration::from_secs(1)).await);
    assert!(
        eventually(Duration::from_secs(1), || relay.listeners()[0]
            .no_endpoint_total
            == 2)
        .await
    );
    assert_eq!(relay.listeners()[0].dial_failures_total, 2);
    assert!(eventually(Duration::from_secs(1), || relay.open_connections() == 0).await);
}

/// Proves: with ClientIP affinity one client IP keeps reaching the same endpoint; without it
/// the same client spreads over all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn affinity_pins_a_client_ip_to_one_endpoint() {
    let backends = [
        Backend::start("a", Mode::NameEcho).await,
        Backend::start("b", Mode::NameEcho).await,
        Backend::start("c", Mode::NameEcho).await,
    ];
    let eps: Vec<SocketAddr> = backends.iter().map(|b| b.addr).collect();
    let relay = relay(RelayConfig::default());
    let ports = apply(
        &relay,
        vec![
            (
                "sticky",
                spec("ns/s:p", Protocol::Tcp, Some(Duration::from_secs(10)), &eps),
            ),
            ("spread", spec("ns/t:p", Protocol::Tcp, None, &eps)),
        ],
    )
    .await;
    let sticky = *ports["sticky"].as_ref().unwrap();
    let spread = *ports["spread"].as_ref().unwrap();
    let mut a = Vec::new();
    let mut b = Vec::new();
    for _ in 0..12 {
        a.push(name_via(sticky).await);
        b.push(name_via(spread).await);
    }
    assert_eq!(counts(&a).len(), 1, "{a:?}");
    let spread_counts = counts(&b);
    assert_eq!(spread_counts.len(), 3, "{b:?}");
    assert!(spread_counts.values().all(|&n| n == 4));
    // Sorted by key: spread, sticky.
    let l = relay.listeners();
    assert_eq!((l[0].key.as_str(), l[0].affinity), ("spread", None));
    assert_eq!(
        (l[1].key.as_str(), l[1].affinity),
        ("sticky", Some(Duration::from_secs(10)))
    );
}

/// Proves: apply() with new endpoints keeps the port and the open connection relaying, sends
/// new connections to the new endpoints; removing the key closes the listener (new connects
/// refused, the port free at once) while the old connection still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_updates_and_removal_leave_open_connections_alone() {
    let old = Backend::start("old", Mode::NameEcho).await;
    let new = Backend::start("new", Mode::NameEcho).await;
    let relay = relay(RelayConfig::default());
    let port = apply_one(&relay, "web", tcp(&[old.addr])).await;

    let mut conn = TcpStream::connect(local(port)).await.unwrap();
    assert_eq!(read_line(&mut conn).await.unwrap(), "old");
    round_trip(&mut conn, b"before").await;

    assert_eq!(apply_one(&relay, "web", tcp(&[new.addr])).await, port);
    assert_eq!(relay.listeners()[0].endpoints, vec![new.addr]);
    round_trip(&mut conn, b"after update").await;
    for _ in 0..3 {
        assert_eq!(name_via(port).await, "new");
    }

    let out = apply(&relay, vec![]).await;
    assert!(out.is_empty());
    assert!(relay.listeners().is_empty());
    assert!(
        TcpStream::connect(local(port)).await.is_err(),
        "a removed listener must refuse new connections"
    );
    // The port is free at once, even with a connection accepted on it still open.
    drop(std::net::TcpListener::bind(local(port)).expect("port still held"));
    round_trip(&mut conn, b"after removal").await;
    // The three short connections wind down asynchronously; `conn` stays.
    assert!(eventually(Duration::from_secs(2), || relay.open_connections() == 1).await);
    round_trip(&mut conn, b"still alive").await;
    drop(conn);
    assert!(eventually(Duration::from_secs(2), || relay.open_connections() == 0).await);
}

/// Proves: a client's shutdown(Write) reaches the backend as EOF while the other direction keeps
/// relaying; the client reads the whole echo.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_is_relayed() {
    let echo = Backend::start("echo", Mode::EchoAfterEof).await;
    let relay = relay(RelayConfig::default());
    let port = apply_one(&relay, "web", tcp(&[echo.addr])).await;
    let mut s = TcpStream::connect(local(port)).await.unwrap();
    let msg: Vec<u8> = (0..300_000).map(|i| pattern_byte(i, 1)).collect();
    s.write_all(&msg).await.unwrap();
    s.shutdown().await.unwrap();
    let mut back = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut back))
        .await
        .expect("echo after EOF never came")
        .unwrap();
    assert_eq!(back.len(), msg.len());
    assert!(back == msg);
}

/// Proves: with max_connections 5 the sixth concurrent connection is closed and counted, the
/// five keep working, and a slot freed is usable again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_limit_refuses_the_extra_connection() {
    let echo = Backend::start("echo", Mode::NameEcho).await;
    let relay = relay(RelayConfig {
        max_connections: 5,
        ..RelayConfig::default()
    });
    let port = apply_one(&relay, "web", tcp(&[echo.addr])).await;
    let mut open = Vec::new();
    for _ in 0..5 {
        let mut s = TcpStream::connect(local(port)).await.unwrap();
        assert_eq!(read_line(&mut s).await.unwrap(), "echo");
        open.push(s);
    }
    assert_eq!(relay.open_connections(), 5);
    assert!(connect_and_see_closed(port, Duration::from_secs(1)).await);
    assert_eq!(relay.rejected_total(), 1);
    let stats = &relay.listeners()[0];
    assert_eq!(stats.rejected_total, 1);
    assert_eq!(stats.accepted_total, 5);
    for s in &mut open {
        round_trip(s, b"still here").await;
    }
    drop(open.pop());
    assert!(eventually(Duration::from_secs(2), || relay.open_connections() == 4).await);
    assert_eq!(name_via(port).await, "echo");
    assert_eq!(relay.rejected_total(), 1);
}

/// Proves: 64 MiB each way at once arrive intact (checksums) through the splice relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_transfer_both_ways_is_intact() {
    const N: usize = 64 << 20;
    let duplex = Backend::start("duplex", Mode::Duplex(N)).await;
    let relay = relay(RelayConfig::default());
    let port = apply_one(&relay, "web", tcp(&[duplex.addr])).await;
    let s = TcpStream::connect(local(port)).await.unwrap();
    let (mut r, mut w) = s.into_split();
    let writer = tokio::spawn(async move {
        write_pattern(&mut w, N, 9).await.unwrap();
        w.shutdown().await.unwrap();
        w
    });
    let expect_down = tokio::task::spawn_blocking(|| pattern_checksum(N, 3));
    let expect_up = tokio::task::spawn_blocking(|| pattern_checksum(N, 9));
    let mut received = Vec::new();
    r.read_to_end(&mut received).await.unwrap();
    let _w = writer.await.unwrap();
    // The backend's N bytes, then the checksum it computed of ours.
    assert_eq!(received.len(), N + 8);
    let mut down = Checksum::default();
    down.update(&received[..N]);
    assert_eq!(
        down.finish(),
        expect_down.await.unwrap(),
        "backend → client corrupted"
    );
    let up = u64::from_le_bytes(received[N..].try_into().unwrap());
    assert_eq!(up, expect_up.await.unwrap(), "client → backend corrupted");
    let stats = &relay.listeners()[0];
    assert_eq!(stats.bytes_total, (2 * N + 8) as u64);
}

/// Proves: an IPv6 relay (bind ::) works over ::1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv6_relay_serves_ipv6_clients() {
    let Ok(listener) = tokio::net::TcpListener::bind("[::1]:0").await else {
        return; // no IPv6 loopback here
    };
    let backend = Backend::serve(listener, "six", Mode::NameEcho);
    let relay = kp_relay::Relay::new(
        RelayConfig {
            bind: std::net::Ipv6Addr::UNSPECIFIED.into(),
            ..RelayConfig::default()
        },
        tokio::runtime::Handle::current(),
    );
    let port = apply_one(&relay, "web", tcp(&[backend.addr])).await;
    let mut s = TcpStream::connect(("::1", port)).await.unwrap();
    assert_eq!(read_line(&mut s).await.unwrap(), "six");
    // V6ONLY: the IPv4 port of the same number is not ours.
    assert!(TcpStream::connect(local(port)).await.is_err());
}

/// Proves: ports come from --proxy-port-range, distinct, and a full range is an error for that
/// key only; a protocol change for a key reopens it; shutdown closes everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_range_protocol_change_and_shutdown() {
    // Four consecutive ports below the ephemeral range that are free now.
    let lo = (20_000..30_000u16)
        .step_by(7)
        .find(|&lo| (lo..lo + 4).all(|p| std::net::TcpListener::bind(local(p)).is_ok()))
        .unwrap();
    let relay = relay(RelayConfig {
        port_range: Some((lo, lo + 3)),
        ..RelayConfig::default()
    });
    let backend = Backend::start("x", Mode::NameEcho).await;
    let specs: Vec<(String, _)> = (0..5)
        .map(|i| (format!("k{i}"), tcp(&[backend.addr])))
        .collect();
    let out = apply(
        &relay,
        specs.iter().map(|(k, s)| (k.as_str(), s.clone())).collect(),
    )
    .await;
    let ports: Vec<u16> = out
        .values()
        .filter_map(|r| r.as_ref().ok().copied())
        .collect();
    assert_eq!(ports.len(), 4, "{out:?}");
    let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), 4);
    assert!(ports.iter().all(|p| (lo..=lo + 3).contains(p)));
    let failed: Vec<_> = out.values().filter_map(|r| r.as_ref().err()).collect();
    assert!(matches!(
        failed[..],
        [RelayError::PortRangeExhausted { protocol: Protocol::Tcp, range }] if *range == (lo, lo + 3)
    ));
    assert_eq!(relay.listeners().len(), 4);
    for p in &ports {
        assert_eq!(name_via(*p).await, "x");
    }

    // k0 becomes UDP: its TCP listener is closed and a UDP socket opened.
    let mut specs2: Vec<(&str, _)> = specs[..4]
        .iter()
        .map(|(k, s)| (k.as_str(), s.clone()))
        .collect();
    specs2[0].1.protocol = Protocol::Udp;
    let out2 = apply(&relay, specs2).await;
    let l = relay.listeners();
    assert_eq!(l[0].key, "k0");
    assert_eq!(l[0].protocol, Protocol::Udp);
    assert_eq!(*out2["k0"].as_ref().unwrap(), l[0].port);

    relay.shutdown();
    assert!(relay.listeners().is_empty());
    for p in &ports {
        assert!(TcpStream::connect(local(*p)).await.is_err());
    }
}

/// Proves: UDP request/response through the relay; the reply comes from the listener's own
/// address and port; two clients get two flows (two sockets towards the backend).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_flows_relay_replies_through_the_listener() {
    let backend = UdpBackend::start("u").await;
    let relay = relay(RelayConfig {
        udp_timeout: Duration::from_secs(5),
        ..RelayConfig::default()
    });
    let port = apply_one(
        &relay,
        "dns",
        spec("kube-system/dns:dns", Protocol::Udp, None, &[backend.addr]),
    )
    .await;
    let c1 = UdpSocket::bind(local(0)).await.unwrap();
    let c2 = UdpSocket::bind(local(0)).await.unwrap();
    let (reply, from) = udp_ask(&c1, port, b"hello").await;
    assert_eq!(reply, b"u:hello");
    assert_eq!(
        from,
        local(port),
        "the reply must come from the listener's address"
    );
    let (reply, from) = udp_ask(&c2, port, b"there").await;
    assert_eq!(reply, b"u:there");
    assert_eq!(from, local(port));
    // A second datagram of c1 reuses its flow.
    assert_eq!(udp_ask(&c1, port, b"again").await.0, b"u:again");
    let big = vec![0x5a; 60_000];
    let (reply, _) = udp_ask(&c1, port, &big).await;
    assert_eq!(reply.len(), 2 + big.len());

    let stats = &relay.listeners()[0];
    assert_eq!(stats.protocol, Protocol::Udp);
    assert_eq!(stats.accepted_total, 2);
    assert_eq!(stats.active, 2);
    assert_eq!(relay.open_connections(), 2);
    let peers = backend.peers.lock().unwrap().clone();
    let distinct: std::collections::BTreeSet<_> = peers.iter().collect();
    assert_eq!(peers.len(), 4);
    assert_eq!(distinct.len(), 2, "one flow socket per client: {peers:?}");
}

/// Proves: a UDP flow ends after udp_timeout without traffic (active drops to 0, the slot is
/// freed) and the next datagram creates a new flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_flows_expire_when_idle() {
    let backend = UdpBackend::start("u").await;
    let relay = relay(RelayConfig {
        udp_timeout: Duration::from_millis(200),
        ..RelayConfig::default()
    });
    let port = apply_one(
        &relay,
        "dns",
        spec("ns/dns:dns", Protocol::Udp, None, &[backend.addr]),
    )
    .await;
    let c = UdpSocket::bind(local(0)).await.unwrap();
    // Traffic every 100 ms keeps the flow alive past the timeout.
    for _ in 0..4 {
        udp_ask(&c, port, b"ping").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(relay.listeners()[0].accepted_total, 1);
    assert_eq!(relay.listeners()[0].active, 1);
    assert!(eventually(Duration::from_secs(2), || relay.listeners()[0].active == 0).await);
    assert_eq!(relay.open_connections(), 0);
    udp_ask(&c, port, b"ping").await;
    assert_eq!(relay.listeners()[0].accepted_total, 2);
    assert_eq!(relay.listeners()[0].active, 1);
}

/// Proves: UDP without endpoints drops and counts; UDP flows count towards max_connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_without_endpoints_and_at_the_limit_drops() {
    let backend = UdpBackend::start("u").await;
    let relay = relay(RelayConfig {
        max_connections: 1,
        udp_timeout: Duration::from_secs(5),
        ..RelayConfig::default()
    });
    let out = apply(
        &relay,
        vec![
            ("empty", spec("ns/a:p", Protocol::Udp, None, &[])),
            ("full", spec("ns/b:p", Protocol::Udp, None, &[backend.addr])),
        ],
    )
    .await;
    let empty = *out["empty"].as_ref().unwrap();
    let full = *out["full"].as_ref().unwrap();
    let c1 = UdpSocket::bind(local(0)).await.unwrap();
    let c2 = UdpSocket::bind(local(0)).await.unwrap();
    c1.send_to(b"x", local(empty)).await.unwrap();
    assert!(
        eventually(Duration::from_secs(1), || relay.listeners()[0]
            .no_endpoint_total
            == 1)
        .await
    );
    assert_eq!(udp_ask(&c1, full, b"a").await.0, b"u:a");
    c2.send_to(b"b", local(full)).await.unwrap();
    assert!(eventually(Duration::from_secs(1), || relay.rejected_total() == 1).await);
    let mut buf = [0u8; 16];
    assert!(
        tokio::time::timeout(Duration::from_millis(200), c2.recv_from(&mut buf))
            .await
            .is_err(),
        "a refused flow gets no reply"
    );
    assert_eq!(relay.listeners()[1].rejected_total, 1);
}

/// Proves: a UDP flow whose endpoint answers "port unreachable" ends (counted as a dial
/// failure), and the client's next datagram starts a flow on another endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_flow_to_a_dead_endpoint_moves_on() {
    let live = UdpBackend::start("live").await;
    let dead = {
        let s = std::net::UdpSocket::bind(local(0)).unwrap();
        s.local_addr().unwrap()
    };
    let relay = relay(RelayConfig {
        udp_timeout: Duration::from_secs(5),
        ..RelayConfig::default()
    });
    let port = apply_one(
        &relay,
        "u",
        spec("ns/u:p", Protocol::Udp, None, &[dead, live.addr]),
    )
    .await;
    // Round robin over two endpoints: of four clients, some start on the dead one.
    for _ in 0..4 {
        let c = UdpSocket::bind(local(0)).await.unwrap();
        let mut answer = None;
        for _ in 0..3 {
            c.send_to(b"q", local(port)).await.unwrap();
            let mut buf = [0u8; 64];
            if let Ok(Ok((n, _))) =
                tokio::time::timeout(Duration::from_millis(200), c.recv_from(&mut buf)).await
            {
                answer = Some(buf[..n].to_vec());
                break;
            }
        }
        assert_eq!(answer.as_deref(), Some(&b"live:q"[..]));
    }
    let stats = &relay.listeners()[0];
    assert!(stats.dial_failures_total >= 1, "{stats:?}");
    // Every refused flow ended: only the four live flows remain.
    assert!(eventually(Duration::from_secs(1), || relay.listeners()[0].active == 4).await);
}

/// Proves: `Relay::new` and `apply` work from a plain thread (no runtime context), with the
/// runtime's handle only.
#[test]
fn apply_works_from_a_plain_thread() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let backend = rt.block_on(Backend::start("plain", Mode::NameEcho));
    let handle = rt.handle().clone();
    let addr = backend.addr;
    let port = std::thread::spawn(move || {
        let relay = kp_relay::Relay::new(
            RelayConfig {
                bind: std::net::Ipv4Addr::LOCALHOST.into(),
                ..RelayConfig::default()
            },
            handle,
        );
        let specs = BTreeMap::from([("k".to_owned(), tcp(&[addr]))]);
        let port = *relay.apply(&specs)["k"].as_ref().unwrap();
        // A blocking client on this plain thread.
        let mut s = std::net::TcpStream::connect(local(port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut line = [0u8; 6];
        std::io::Read::read_exact(&mut s, &mut line).unwrap();
        assert_eq!(&line, b"plain\n");
        relay.apply(&BTreeMap::new());
        assert!(std::net::TcpStream::connect(local(port)).is_err());
        port
    })
    .join()
    .unwrap();
    assert_ne!(port, 0);
    drop(backend);
}

/// Proves: `visit_listeners` shows every listener once, in key order, a batch at a time
/// from the key it returned, without copying the endpoints; a listener opened between two
/// batches after the position is seen, one before it is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_are_visited_in_batches_from_a_position() {
    let relay = relay(RelayConfig::default());
    let eps = [local(1), local(2)];
    let specs: Vec<(String, _)> = (0..5).map(|i| (format!("k{i}"), tcp(&eps))).collect();
    let out = apply(
        &relay,
        specs.iter().map(|(k, s)| (k.as_str(), s.clone())).collect(),
    )
    .await;
    assert!(out.values().all(Result::is_ok), "{out:?}");
    let mut seen = Vec::new();
    let mut after = relay.visit_listeners(None, 2, &mut |l| {
        assert_eq!(l.endpoints, eps);
        seen.push(l.key.to_owned());
    });
    assert_eq!(after.as_deref(), Some("k1"));
    // Between two batches: one listener before the position, one after it.
    let mut more: Vec<(&str, _)> = specs.iter().map(|(k, s)| (k.as_str(), s.clone())).collect();
    more.push(("a-before", tcp(&eps)));
    more.push(("k9", tcp(&eps)));
    apply(&relay, more).await;
    while let Some(position) = after {
        after = relay.visit_listeners(Some(&position), 2, &mut |l| seen.push(l.key.to_owned()));
    }
    assert_eq!(seen, ["k0", "k1", "k2", "k3", "k4", "k9"]);
    assert_eq!(relay.listeners().len(), 7);
}
