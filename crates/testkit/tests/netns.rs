//! Network-namespace harness tests (run as root; `KP_SKIP_NETNS_TESTS=1` skips them).

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::process::Command;
use std::time::Duration;

use kp_model::IpFamily;
use kp_testkit::{
    ChildGuard, ClientError, Error, HttpBackend, Netns, Topology, UdpClient, UdpEchoBackend,
    cleanup_stale, delete_namespace, http_get, http_get_many, link, list_namespaces, require_root,
    udp_request, wait_for,
};

const T: Duration = Duration::from_secs(3);

fn exists(name: &str) -> bool {
    list_namespaces().unwrap().iter().any(|n| n == name)
}

fn sock(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

/// Root-namespace interface names, to check that nothing leaks into it.
fn root_links() -> Vec<String> {
    let out = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .map(|n| n.trim().split('@').next().unwrap_or_default().to_owned())
        .collect()
}

fn root_sysctl(path: &str) -> String {
    std::fs::read_to_string(path).unwrap().trim().to_owned()
}

#[test]
fn namespace_is_created_with_lo_up_and_deleted_on_drop() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("t-basic").unwrap();
    let name = ns.name().to_owned();
    assert!(
        name.starts_with(&format!("kp{}x", std::process::id())),
        "{name}"
    );
    assert!(name.ends_with("-t-basic"));
    assert!(exists(&name));
    assert!(ns.ip(["link", "show", "lo"]).unwrap().contains("UP"));
    assert_eq!(
        ns.run("cat", ["/proc/sys/net/ipv6/conf/all/accept_dad"])
            .unwrap()
            .trim(),
        "0"
    );
    let err = ns.run("false", [] as [&str; 0]).unwrap_err();
    assert!(matches!(err, Error::Command { .. }), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("ip netns exec {name} false")),
        "{err}"
    );
    drop(ns);
    assert!(!exists(&name));
}

#[test]
fn namespace_is_deleted_when_the_test_body_panics() {
    if !require_root() {
        return;
    }
    let mut names = Vec::new();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let topology = Topology::builder().backends(1).build().unwrap();
        names.extend(
            [
                topology.lan(),
                topology.node(),
                topology.client(),
                topology.backend(0).ns(),
            ]
            .map(|ns| ns.name().to_owned()),
        );
        assert!(names.iter().all(|n| exists(n)));
        panic!("test body panics");
    }));
    assert!(result.is_err());
    assert_eq!(names.len(), 4);
    for name in &names {
        assert!(!exists(name), "{name} left behind");
    }
}

#[test]
fn in_ns_sockets_belong_to_the_namespace_and_sysctls_stay_inside() {
    if !require_root() {
        return;
    }
    let root_forward = root_sysctl("/proc/sys/net/ipv4/ip_forward");
    let a = Netns::new("t-a").unwrap();
    let b = Netns::new("t-b").unwrap();
    let (a_if, b_if) = link(
        &a,
        "10.1.0.1/30".parse().unwrap(),
        &b,
        "10.1.0.2/30".parse().unwrap(),
    )
    .unwrap();
    assert!(a_if.len() <= 15 && b_if.len() <= 15);
    assert!(
        a.ip(["addr", "show", &a_if])
            .unwrap()
            .contains("10.1.0.1/30")
    );
    // 10.1.0.1 exists only in `a`.
    assert!(a.in_ns(|| TcpListener::bind("10.1.0.1:0")).unwrap().is_ok());
    assert!(
        b.in_ns(|| TcpListener::bind("10.1.0.1:0"))
            .unwrap()
            .is_err()
    );
    let handle = b
        .spawn_in(|| TcpListener::bind("10.1.0.2:0").is_ok())
        .unwrap();
    assert!(handle.join().unwrap());

    a.sysctl("net.ipv4.ip_forward", "1").unwrap();
    assert_eq!(a.read_sysctl("net.ipv4.ip_forward").unwrap(), "1");
    assert_eq!(
        a.run("sysctl", ["-n", "net.ipv4.ip_forward"])
            .unwrap()
            .trim(),
        "1"
    );
    assert_eq!(b.read_sysctl("net.ipv4.ip_forward").unwrap(), "0");
    assert_eq!(root_sysctl("/proc/sys/net/ipv4/ip_forward"), root_forward);
    assert!(!root_links().contains(&a_if) && !root_links().contains(&b_if));

    // IPv6 over a plain link, usable at once (nodad).
    let (_, _) = link(
        &a,
        "fd00:1::1/64".parse().unwrap(),
        &b,
        "fd00:1::2/64".parse().unwrap(),
    )
    .unwrap();
    let server = HttpBackend::start(&b, "[fd00:1::2]:8080".parse().unwrap(), "b6").unwrap();
    let reply = http_get(&a, server.local_addr(), T).unwrap();
    assert_eq!(reply.name(), "b6");
    assert_eq!(
        server.peer_ips(),
        vec!["fd00:1::1".parse::<IpAddr>().unwrap()]
    );
}

#[test]
fn client_reaches_backend_through_the_forwarding_node() {
    if !require_root() {
        return;
    }
    let links_before = root_links();
    let root_forward = root_sysctl("/proc/sys/net/ipv4/ip_forward");
    let mut topology = Topology::builder().backends(2).build().unwrap();
    let names: Vec<String> = [topology.lan(), topology.node(), topology.client()]
        .into_iter()
        .chain(topology.backends().iter().map(|b| b.ns()))
        .map(|ns| ns.name().to_owned())
        .collect();
    assert_eq!(
        topology.node().read_sysctl("net.ipv4.ip_forward").unwrap(),
        "1"
    );
    assert_eq!(root_sysctl("/proc/sys/net/ipv4/ip_forward"), root_forward);

    let servers = topology.start_http(8080).unwrap();
    assert_eq!(servers.len(), 2);
    let client_ip = topology.client_ip(IpFamily::V4).unwrap();
    assert_eq!(client_ip, "192.168.56.100".parse::<IpAddr>().unwrap());
    for (i, server) in servers.iter().enumerate() {
        let pod = topology.backend(i).ip(IpFamily::V4).unwrap();
        assert_eq!(
            pod,
            format!("10.244.1.{}", 10 + i).parse::<IpAddr>().unwrap()
        );
        let reply = http_get(topology.client(), sock(pod, 8080), T).unwrap();
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, format!("be{i}\n"));
        assert_eq!(reply.local.ip(), client_ip);
        assert_eq!(server.peers(), vec![reply.local], "client IP preserved");
    }

    // Many requests from one thread.
    let pod0 = topology.backend(0).ip(IpFamily::V4).unwrap();
    let replies = http_get_many(topology.client(), sock(pod0, 8080), 20, T);
    assert_eq!(replies.len(), 20);
    assert!(
        replies
            .iter()
            .all(|r| r.as_ref().is_ok_and(|r| r.name() == "be0")),
        "{replies:?}"
    );
    assert_eq!(servers[0].requests(), 21);

    // The node reaches pods with its own address as source.
    let reply = http_get(topology.node(), sock(pod0, 8080), T).unwrap();
    assert_eq!(reply.local.ip(), topology.node_ip(IpFamily::V4).unwrap());

    // An extra client on the node network, with and without cluster routes.
    let k = topology.add_client(true).unwrap();
    let extra = &topology.clients()[k];
    assert_eq!(
        extra.ip(IpFamily::V4),
        Some("192.168.56.101".parse().unwrap())
    );
    let reply = http_get(extra.ns(), sock(pod0, 8080), T).unwrap();
    assert_eq!(reply.local.ip(), extra.ip(IpFamily::V4).unwrap());
    let k = topology.add_client(false).unwrap();
    let outside = topology.clients()[k].ns();
    assert!(matches!(
        http_get(outside, sock(pod0, 8080), T),
        Err(ClientError::Unreachable)
    ));
    let node_ip = topology.node_ip(IpFamily::V4).unwrap();
    let node_server = HttpBackend::start(topology.node(), sock(node_ip, 30080), "node").unwrap();
    assert_eq!(
        http_get(outside, sock(node_ip, 30080), T).unwrap().name(),
        "node"
    );
    topology.hold(node_server);
    assert!(topology.describe().contains("10.244.1.11"));

    drop(servers);
    drop(topology);
    for name in &names {
        assert!(!exists(name), "{name} left behind");
    }
    let leaked: Vec<_> = root_links()
        .into_iter()
        .filter(|l| !links_before.contains(l))
        .collect();
    assert!(
        leaked
            .iter()
            .all(|l| !l.starts_with("kp") && !l.starts_with("vbe") && !l.starts_with("p-")),
        "{leaked:?}"
    );
}

#[test]
fn dual_stack_topology_serves_ipv6() {
    if !require_root() {
        return;
    }
    let topology = Topology::builder()
        .dual_stack()
        .backends(1)
        .build()
        .unwrap();
    let servers = topology.start_http(8080).unwrap();
    assert_eq!(servers.len(), 2);
    let pod6 = topology.backend(0).ip(IpFamily::V6).unwrap();
    assert_eq!(pod6, "fd00:10:244::1:10".parse::<IpAddr>().unwrap());
    let reply = http_get(topology.client(), sock(pod6, 8080), T).unwrap();
    assert_eq!(reply.name(), "be0");
    assert_eq!(
        servers[1].peer_ips(),
        vec![topology.client_ip(IpFamily::V6).unwrap()]
    );
    let pod4 = topology.backend(0).ip(IpFamily::V4).unwrap();
    assert_eq!(
        http_get(topology.client(), sock(pod4, 8080), T)
            .unwrap()
            .name(),
        "be0"
    );
}

#[test]
fn refused_timeout_and_unreachable_are_told_apart() {
    if !require_root() {
        return;
    }
    let topology = Topology::builder().backends(1).build().unwrap();
    let _servers = topology.start_http(8080).unwrap();
    let pod = topology.backend(0).ip(IpFamily::V4).unwrap();
    let target = sock(pod, 8080);
    let node = topology.node();
    let short = Duration::from_millis(500);
    assert!(http_get(topology.client(), target, T).is_ok());

    // No listener: the backend's RST.
    assert!(matches!(
        http_get(topology.client(), sock(pod, 8081), T),
        Err(ClientError::Refused)
    ));

    let rule = |action: &[&str]| {
        let mut args = vec!["-w", "5", "-I", "FORWARD", "-p", "tcp", "-d", "10.244.1.10"];
        args.extend(["--dport", "8080", "-j"]);
        args.extend(action);
        node.run("iptables", &args).unwrap();
    };
    let flush = || node.run("iptables", ["-w", "5", "-F", "FORWARD"]).unwrap();

    rule(&["REJECT"]);
    assert!(matches!(
        http_get(topology.client(), target, T),
        Err(ClientError::Refused)
    ));
    flush();

    rule(&["DROP"]);
    let started = std::time::Instant::now();
    assert!(matches!(
        http_get(topology.client(), target, short),
        Err(ClientError::Timeout)
    ));
    assert!(started.elapsed() >= short);
    flush();

    rule(&["REJECT", "--reject-with", "icmp-host-unreachable"]);
    assert!(matches!(
        http_get(topology.client(), target, T),
        Err(ClientError::Unreachable)
    ));
    flush();

    // No route at all from the client.
    let nowhere = sock("203.0.113.1".parse().unwrap(), 80);
    assert!(matches!(
        http_get(topology.client(), nowhere, T),
        Err(ClientError::Unreachable)
    ));
    assert!(http_get(topology.client(), target, T).is_ok());
}

#[test]
fn udp_echo_keeps_a_fixed_source_port() {
    if !require_root() {
        return;
    }
    let topology = Topology::builder().backends(1).build().unwrap();
    let pod = topology.backend(0).ip(IpFamily::V4).unwrap();
    let echo = UdpEchoBackend::start(topology.backend(0).ns(), sock(pod, 5353), "be0").unwrap();
    let client_ip = topology.client_ip(IpFamily::V4).unwrap();
    let fixed = sock(client_ip, 40123);

    let reply = udp_request(topology.client(), sock(pod, 5353), b"hello", T, Some(fixed)).unwrap();
    assert_eq!(reply.text(), "be0");
    assert_eq!(reply.local, fixed);
    // Rebinding the same fixed port right away, again and again.
    for _ in 0..5 {
        let reply =
            udp_request(topology.client(), sock(pod, 5353), b"again", T, Some(fixed)).unwrap();
        assert_eq!(reply.local, fixed);
    }

    let client = UdpClient::bind(topology.client(), sock(client_ip, 0)).unwrap();
    let port = client.local_addr().port();
    for _ in 0..3 {
        let reply = client.request(sock(pod, 5353), b"x", T).unwrap();
        assert_eq!((reply.text().as_str(), reply.local.port()), ("be0", port));
    }
    let mut want = vec![fixed; 6];
    want.extend([client.local_addr(); 3]);
    assert_eq!(echo.peers(), want);

    // A closed UDP port answers with ICMP port-unreachable.
    assert!(matches!(
        client.request(sock(pod, 5354), b"x", T),
        Err(ClientError::Refused)
    ));
    // And the socket still works afterwards.
    assert_eq!(
        client.request(sock(pod, 5353), b"x", T).unwrap().text(),
        "be0"
    );
}

#[test]
fn cleanup_stale_removes_namespaces_of_dead_processes_only() {
    if !require_root() {
        return;
    }
    let _live = Netns::new("t-live").unwrap(); // also runs the once-per-process cleanup
    let mut child = Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    // Unique per test process (the counter field holds our pid), so concurrent runs of
    // this test do not collide.
    let me = std::process::id();
    let dead = format!("kp{dead_pid}x{me}-stale");
    let alive = format!("kp1x{me}-alive"); // pid 1 is always alive
    /// Deletes the test's hand-made namespaces even if an assertion fails.
    struct Remove(Vec<String>);
    impl Drop for Remove {
        fn drop(&mut self) {
            for name in &self.0 {
                let _ = Command::new("ip").args(["netns", "del", name]).output();
            }
        }
    }
    let _remove = Remove(vec![dead.clone(), alive.clone()]);
    for name in [&dead, &alive] {
        let status = Command::new("ip")
            .args(["netns", "add", name])
            .status()
            .unwrap();
        assert!(status.success());
    }

    let removed = cleanup_stale("kp").unwrap();
    // (A concurrently running test process may have removed it first.)
    assert!(!exists(&dead), "{dead} kept; removed {removed:?}");
    assert!(exists(&alive));
    assert!(exists(_live.name()), "own namespaces are kept");
    assert!(
        !removed
            .iter()
            .any(|n| n.starts_with(&format!("kp{}x", std::process::id())))
    );
}

#[test]
fn child_guard_stops_the_process_and_reports_early_exit() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("t-child").unwrap();
    let guard = ChildGuard::spawn(ns.command("sleep").arg("1000"), "sleep").unwrap();
    let pid = guard.id();
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    // `ip netns exec` enters the namespace and execs `sleep` shortly after spawn.
    let in_ns = || {
        let pids = Command::new("ip")
            .args(["netns", "pids", ns.name()])
            .output()
            .unwrap();
        String::from_utf8_lossy(&pids.stdout)
            .split_whitespace()
            .any(|p| p == pid.to_string())
    };
    wait_for(in_ns, T).expect("sleep runs inside the namespace");
    drop(guard);
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());

    let mut quick = ChildGuard::spawn(&mut ns.command("true"), "true").unwrap();
    let err = quick
        .wait_for(|| false, Duration::from_secs(5))
        .unwrap_err();
    assert!(matches!(err, Error::ChildExited { .. }), "{err}");

    let mut counter = 0;
    wait_for(
        || {
            counter += 1;
            counter == 3
        },
        T,
    )
    .unwrap();
    assert!(matches!(
        wait_for(|| false, Duration::from_millis(50)),
        Err(Error::Timeout { .. })
    ));
}

/// A namespace another process left (here: forgotten instead of dropped) is deleted by
/// name with the process inside it; a name kp-testkit did not make is refused.
#[test]
fn delete_namespace_removes_a_left_namespace_and_its_processes() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("left").unwrap();
    let name = ns.name().to_string();
    let mut sleeper = ns.command("sleep").arg("600").spawn().unwrap();
    std::mem::forget(ns);
    assert!(exists(&name));
    // A handle attached to it works there and deletes nothing when dropped.
    let attached = Netns::attach(&name).unwrap();
    assert_eq!(attached.role(), "left");
    assert!(attached.ip(["link", "show", "lo"]).unwrap().contains("UP"));
    drop(attached);
    assert!(exists(&name));
    delete_namespace(&name).unwrap();
    assert!(!exists(&name));
    let status = sleeper.wait().unwrap();
    assert!(!status.success(), "killed: {status}");
    delete_namespace(&name).unwrap();
    assert!(Netns::attach(&name).is_err());
    let err = delete_namespace("cni-1234").unwrap_err().to_string();
    assert!(err.contains("not made by kp-testkit"), "{err}");
}
