//! End-to-end tests of the `kube-proxy-rs` binary's lifecycle with the real kernel, in both
//! proxy modes: what it programs (golden rules, `--dry-run` against the kernel), resync and
//! `--cleanup`, real traffic through ClusterIP and NodePort with endpoint removal and REJECT,
//! a failed sync and its retry, rules flushed by someone else and repaired within the sync
//! period (and only checked, never rewritten, while intact), switching modes, bad manifests,
//! and the sandbox (its report,
//! the ping line, Services without endpoints, Ctrl-C, `--keep`; in IPVS mode the README's
//! command as a newcomer types it, which runs in a qemu guest where this kernel lacks IPVS).
//!
//! A check that holds in both modes is written once, as a function taking the [`Mode`], with
//! one `#[test]` per mode (`…_iptables`, `…_nftables`); checks of one mode only are in
//! `match`/`if` branches or in tests named after their mode. Each test creates its own network
//! namespaces (root required; CI runs them as root); nothing here touches the root namespace.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{
    BIN, Daemon, Mode, NODE_ARGS, SEED_EXTRA_SERVICES, answered, counts, feed, nft_table, run_in,
    save, seed_topology, tempdir, which, write,
};
use kp_netlink::NfacctOps;
use kp_testkit::golden::{SEED_CLUSTER, assert_contains_in_chain_order, seed_expected_lines};
use kp_testkit::{ClientError, Netns, http_get, http_get_many, require_root, wait_for};

// ---------------------------------------------------------------------------------------
// What the binary programs
// ---------------------------------------------------------------------------------------

/// iptables only: the seed's golden `iptables-save` lines, on the nf_tables and the legacy
/// iptables backends, and upstream's empty `KUBE-PROXY-CANARY` in mangle, nat and filter.
#[test]
fn iptables_seed_golden_in_a_fresh_namespace_with_both_backends() {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let manifest = write(dir.path(), "cluster.yaml", SEED_CLUSTER);
    // The last run also zeroes the counters first (`-Z`, the iptables-nft speed-up): the
    // same rules must result.
    for (backend, save_cmd, zero) in [
        ("auto", "iptables-save", false),
        ("legacy", "iptables-legacy-save", false),
        ("auto", "iptables-save", true),
    ] {
        let ns = Netns::new("golden").unwrap();
        let mut args = vec!["--manifests", manifest.to_str().unwrap(), "--once"];
        args.extend(NODE_ARGS);
        let backend_flag = format!("--iptables-backend={backend}");
        args.push(&backend_flag);
        if zero {
            args.push("--iptables-zero-counters-on-full-sync");
            let mut dry = args.clone();
            dry.retain(|a| *a != "--once");
            dry.push("--dry-run");
            let (ok, out, err) = run_in(&ns, &Mode::Iptables.args(&dry));
            assert!(ok, "{err}");
            let ipv4 = out.split("# IPv6").next().unwrap();
            assert_eq!(
                ipv4.lines().filter(|l| *l == "-Z").count(),
                2,
                "one -Z per table:\n{out}"
            );
        }
        let (ok, _, err) = run_in(&ns, &Mode::Iptables.args(&args));
        assert!(ok, "--once failed with {backend}:\n{err}");
        let saved = save(&ns, save_cmd);
        assert_contains_in_chain_order(&squeeze(&saved), &seed_expected_on(&ns));
        // Upstream's canary chain, empty, in the three tables (as `iptables-save` of a node
        // run by upstream shows it).
        for table in ["mangle", "nat", "filter"] {
            let block = saved
                .split(&format!("*{table}\n"))
                .nth(1)
                .and_then(|rest| rest.split("COMMIT\n").next())
                .unwrap_or_else(|| panic!("no {table} table with {backend}:\n{saved}"));
            assert!(
                block.contains(":KUBE-PROXY-CANARY - [0:0]\n"),
                "{backend}: no canary in {table}:\n{saved}"
            );
        }
        assert!(!saved.contains("-j KUBE-PROXY-CANARY") && !saved.contains("-A KUBE-PROXY-CANARY"));
        // route_localnet was set inside the namespace (localhost NodePorts), not outside.
        assert_eq!(
            ns.read_sysctl("net.ipv4.conf.all.route_localnet")
                .unwrap()
                .trim(),
            "1"
        );
    }
}

/// The seed's INVALID drop: upstream's on a node without nfacct, where the seed was
/// captured.
const SEED_INVALID_DROP: &str = "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP";
/// The same rule on a node with nfacct (upstream's proxier tests and nodes).
const NFACCT_INVALID_DROP: &str = "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP";

/// Whether the kernel gives `ns` nfacct counters (this one does; the daemon then writes
/// upstream's `-m nfacct` matches).
fn has_nfacct(ns: &Netns) -> bool {
    ns.in_ns(kp_netlink::Nfacct::new).unwrap().is_ok()
}

/// The seed's expected lines as upstream writes them on `ns`'s kernel: with nfacct, the
/// INVALID drop counts into `ct_state_invalid_dropped_pkts` (the seed has no NodePort, so
/// no localhost counting rule).
fn seed_expected_on(ns: &Netns) -> Vec<(String, String)> {
    let nfacct = has_nfacct(ns);
    seed_expected_lines()
        .into_iter()
        .map(|(table, line)| match line.as_str() {
            SEED_INVALID_DROP if nfacct => (table, NFACCT_INVALID_DROP.to_string()),
            _ => (table, line),
        })
        .collect()
}

/// `iptables-save` text with runs of spaces squeezed: `xt_nfacct` prints two spaces after
/// `--nfacct-name` (no rule of ours has a double space otherwise, comments included).
fn squeeze(save: &str) -> String {
    save.lines()
        .map(|l| {
            let mut out = String::with_capacity(l.len());
            for w in l.split(' ').filter(|w| !w.is_empty()) {
                if !out.is_empty() {
                    out.push(' ');
                }
                out.push_str(w);
            }
            out.push('\n');
            out
        })
        .collect()
}

/// The seed plus [`SEED_EXTRA_SERVICES`], as one manifest in `dir`.
fn seed_and_extra_manifest(dir: &std::path::Path) -> String {
    write(
        dir,
        "cluster.yaml",
        &format!("{SEED_CLUSTER}\n---\n{SEED_EXTRA_SERVICES}"),
    )
    .to_str()
    .unwrap()
    .to_string()
}

/// Runs `--dry-run` with `args` in `ns`, a namespace without our rules, and checks that it
/// succeeds without touching the kernel; returns the IPv4 section of its output (the
/// `iptables-restore` or `nft -f` input a fresh node gets), without its header.
fn dry_run_ipv4(mode: Mode, ns: &Netns, args: &[&str]) -> String {
    let mut dry = mode.args(args);
    dry.push("--dry-run");
    let (ok, output, err) = run_in(ns, &dry);
    assert!(ok, "{err}");
    match mode {
        Mode::Ipvs | Mode::Userspace => {
            unreachable!(
                "IPVS and userspace modes are tested in tests/ipvs.rs and tests/userspace.rs"
            )
        }
        Mode::Iptables => assert!(
            save(ns, "iptables-save")
                .lines()
                .all(|l| !l.contains("KUBE")),
            "--dry-run must not touch the kernel"
        ),
        Mode::Nftables => assert!(
            mode.ruleset(ns).is_empty(),
            "--dry-run must not touch the kernel"
        ),
    }
    // The dry run prints one section per family, each after a header naming its input.
    let (v4, v6) = match mode {
        Mode::Ipvs | Mode::Userspace => {
            unreachable!(
                "IPVS and userspace modes are tested in tests/ipvs.rs and tests/userspace.rs"
            )
        }
        Mode::Iptables => (
            "# IPv4: iptables-restore input\n",
            "# IPv6: ip6tables-restore input",
        ),
        Mode::Nftables => ("# IPv4: nft -f input\n", "# IPv6: nft -f input"),
    };
    output
        .split(v6)
        .next()
        .unwrap()
        .strip_prefix(v4)
        .unwrap_or_else(|| panic!("no IPv4 section first:\n{output}"))
        .to_string()
}

/// Parses `--probability P` in a rule line so 10- and 11-decimal forms compare equal.
fn normalise(line: &str) -> String {
    let mut out = Vec::new();
    // Runs of spaces squeezed too: `xt_nfacct` prints two after `--nfacct-name`.
    let mut words = line.split(' ').filter(|w| !w.is_empty()).peekable();
    while let Some(w) = words.next() {
        out.push(w.to_string());
        if w == "--probability"
            && let Some(p) = words.next()
        {
            let v: f64 = p.parse().unwrap();
            out.push(format!("{v:.9}"));
        }
    }
    out.join(" ")
}

/// iptables only: after `--once`, `iptables-save` holds every rule `--dry-run` rendered and
/// no other rule of ours.
#[test]
fn iptables_kernel_holds_exactly_the_rendered_rules() {
    if !require_root() {
        return;
    }
    let mode = Mode::Iptables;
    let dir = tempdir();
    let manifest = seed_and_extra_manifest(dir.path());
    let mut args = vec!["--manifests", manifest.as_str()];
    args.extend(NODE_ARGS);
    let ns = Netns::new("render").unwrap();
    let payload = dry_run_ipv4(mode, &ns, &args);
    let mut once = mode.args(&args);
    once.push("--once");
    let (ok, _, err) = run_in(&ns, &once);
    assert!(ok, "{err}");
    let saved: Vec<String> = save(&ns, "iptables-save").lines().map(normalise).collect();
    let mut rules = 0;
    for line in payload
        .lines()
        .filter(|l| l.starts_with("-A ") || l.starts_with("-I "))
    {
        // `-I CHAIN 1 spec` lands as `-A CHAIN spec`.
        let line = if let Some(rest) = line.strip_prefix("-I ") {
            let mut parts = rest.splitn(3, ' ');
            let chain = parts.next().unwrap();
            let _pos = parts.next();
            format!("-A {chain} {}", parts.next().unwrap())
        } else {
            line.to_string()
        };
        assert!(
            saved.contains(&normalise(&line)),
            "the kernel does not print back: {line}\n{}",
            saved.join("\n")
        );
        rules += 1;
    }
    let ours = saved
        .iter()
        .filter(|l| l.starts_with("-A ") && l.contains("KUBE-"))
        .count();
    assert_eq!(rules, ours, "the kernel holds rules we did not render");
}

/// iptables only, on a kernel with nfacct (this one): the daemon creates upstream's two
/// counters in its namespace and its rules count into them (`iptables-save`), `--dry-run`
/// prints the same matches without creating anything, `/metrics` reports what the kernel
/// counts, and connections to the localhost NodePort increment
/// `kubeproxy_iptables_localhost_nodeports_accepted_packets_total` (one packet each: nat
/// rules see a connection's first packet). `--cleanup` leaves the counters, as upstream's.
#[test]
fn iptables_nfacct_counters_rules_and_metrics() {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let (topology, _servers) = seed_topology();
    let node = topology.node();
    if !has_nfacct(node) {
        eprintln!("skipped: this kernel has no nfacct");
        return;
    }
    let manifest = seed_and_extra_manifest(dir.path());
    let mut args = vec![
        "--manifests",
        manifest.as_str(),
        "--metrics-bind-address=127.0.0.1:10249",
    ];
    args.extend(NODE_ARGS);
    let localhost_rule = "-A KUBE-NODEPORTS -d 127.0.0.0/8 -p tcp -m comment --comment \"default/web\" -m tcp --dport 30080 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-";

    // The dry run, before the daemon created anything: the matches, and still no counter.
    let dry = dry_run_ipv4(Mode::Iptables, node, &args);
    assert!(dry.lines().any(|l| l == NFACCT_INVALID_DROP), "{dry}");
    assert!(dry.lines().any(|l| l.starts_with(localhost_rule)), "{dry}");
    let mut nfacct = node.in_ns(kp_netlink::Nfacct::new).unwrap().unwrap();
    for name in [
        "ct_state_invalid_dropped_pkts",
        "localhost_nps_accepted_pkts",
    ] {
        assert_eq!(nfacct.get(name).unwrap(), None, "a dry run created {name}");
    }

    let mut proxy = Daemon::start(Mode::Iptables, node, dir.path(), &args, None);
    proxy.wait_programmed(node);
    let saved = squeeze(&save(node, "iptables-save"));
    assert!(saved.lines().any(|l| l == NFACCT_INVALID_DROP), "{saved}");
    let lines: Vec<&str> = saved.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with(localhost_rule))
        .unwrap_or_else(|| panic!("no localhost counting rule:\n{saved}"));
    assert!(
        lines[at + 1].starts_with("-A KUBE-NODEPORTS -p tcp -m comment --comment \"default/web\" -m tcp --dport 30080 -j KUBE-EXT-"),
        "{saved}"
    );

    let metrics = || {
        node.run(
            "curl",
            ["-s", "--max-time", "5", "http://127.0.0.1:10249/metrics"],
        )
        .unwrap_or_default()
    };
    let value = |text: &str, name: &str| -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .map(|v| v.trim().parse().unwrap())
    };
    const INVALID: &str = "kubeproxy_iptables_ct_state_invalid_dropped_packets_total";
    const LOCALHOST: &str = "kubeproxy_iptables_localhost_nodeports_accepted_packets_total";
    proxy.wait_until("/metrics never showed the nfacct counters", || {
        let m = metrics();
        value(&m, INVALID).is_some() && value(&m, LOCALHOST).is_some()
    });
    let kernel = |n: &mut kp_netlink::Nfacct, name: &str| n.get(name).unwrap().unwrap().packets;
    let before = kernel(&mut nfacct, "localhost_nps_accepted_pkts");
    let m = metrics();
    assert_eq!(value(&m, LOCALHOST), Some(before), "{m}");
    assert_eq!(
        value(&m, INVALID),
        Some(kernel(&mut nfacct, "ct_state_invalid_dropped_pkts")),
        "{m}"
    );

    // Five connections from the node to its localhost NodePort.
    for i in 0..5 {
        let r = http_get(
            node,
            "127.0.0.1:30080".parse().unwrap(),
            Duration::from_secs(2),
        );
        assert!(r.is_ok(), "connection {i}: {r:?}\n{}", proxy.log());
    }
    let after = kernel(&mut nfacct, "localhost_nps_accepted_pkts");
    assert_eq!(after, before + 5);
    let m = metrics();
    assert_eq!(value(&m, LOCALHOST), Some(after), "{m}");
    // Connections to the node's address do not count as localhost ones.
    let r = http_get(
        node,
        "192.168.56.10:30080".parse().unwrap(),
        Duration::from_secs(2),
    );
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(kernel(&mut nfacct, "localhost_nps_accepted_pkts"), after);
    drop(proxy);

    // --cleanup removes the rules and leaves the counters.
    let (ok, _, err) = run_in(node, &["--cleanup"]);
    assert!(ok, "{err}");
    assert!(!save(node, "iptables-save").contains("nfacct"));
    assert_eq!(kernel(&mut nfacct, "localhost_nps_accepted_pkts"), after);
}

/// nftables only: applying the IPv4 section of `--dry-run` by hand to a fresh namespace
/// gives the same `ip kube-proxy` table as `--once` does.
#[test]
fn nftables_dry_run_is_what_a_fresh_node_gets() {
    if !require_root() {
        return;
    }
    let mode = Mode::Nftables;
    let dir = tempdir();
    let manifest = seed_and_extra_manifest(dir.path());
    let mut args = vec!["--manifests", manifest.as_str()];
    args.extend(NODE_ARGS);
    let fresh = Netns::new("nft-dry").unwrap();
    let v4 = dry_run_ipv4(mode, &fresh, &args);
    assert!(
        feed(&fresh, "nft", &["-f", "-"], &v4),
        "nft -f rejected:\n{v4}"
    );

    let ns = Netns::new("nft-once").unwrap();
    let mut once = mode.args(&args);
    once.push("--once");
    let (ok, _, err) = run_in(&ns, &once);
    assert!(ok, "{err}");
    assert_eq!(
        kp_netfilter::canonical_listing(&nft_table(&fresh, "ip").unwrap()),
        kp_netfilter::canonical_listing(&nft_table(&ns, "ip").unwrap())
    );
}

// ---------------------------------------------------------------------------------------
// Resync, cleanup and switching modes
// ---------------------------------------------------------------------------------------

/// Drops tables that hold nothing but built-in chains with policy ACCEPT and no rules.
fn without_empty_tables(save: &str) -> String {
    let mut out = String::new();
    let mut table = String::new();
    let mut empty = true;
    for line in save.lines() {
        table.push_str(line);
        table.push('\n');
        if line.starts_with('*') {
            empty = true;
        } else if line == "COMMIT" {
            if !empty {
                out.push_str(&table);
            }
            table.clear();
        } else if line.starts_with("-A") || (line.starts_with(':') && !line.contains(" ACCEPT ")) {
            empty = false;
        }
    }
    out
}

/// Installs rules of other software in `ns`, which every run of the proxy must keep.
fn add_foreign_rules(mode: Mode, ns: &Netns) {
    let ok = match mode {
        Mode::Ipvs | Mode::Userspace => {
            unreachable!(
                "IPVS and userspace modes are tested in tests/ipvs.rs and tests/userspace.rs"
            )
        }
        Mode::Iptables => feed(
            ns,
            "iptables-restore",
            &["--noflush"],
            "*filter\n:FOREIGN - [0:0]\n-A INPUT -j FOREIGN\n-A FOREIGN -p tcp --dport 22 -j ACCEPT\nCOMMIT\n\
             *nat\n:FOREIGN-NAT - [0:0]\n-A POSTROUTING -o eth9 -j MASQUERADE\n-A FOREIGN-NAT -j RETURN\nCOMMIT\n",
        ),
        Mode::Nftables => feed(ns, "nft", &["-f", "-"], NFT_FOREIGN),
    };
    assert!(ok, "installing the foreign rules");
}

/// Another program's nftables table, with a rule `--cleanup` must leave alone.
const NFT_FOREIGN: &str = "add table inet other\nadd chain inet other input { type filter hook input priority 0 ; }\nadd rule inet other input tcp dport 22 accept\n";

/// A second `--once` (a restart: full resync) leaves the ruleset byte-for-byte identical;
/// `--cleanup` then removes everything we created and nothing else, and a second cleanup is
/// a no-op.
fn resync_is_identical_and_cleanup_restores_the_tables(mode: Mode) {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let manifest = seed_and_extra_manifest(dir.path());
    let ns = Netns::new("cleanup").unwrap();
    add_foreign_rules(mode, &ns);
    let pristine = mode.ruleset(&ns);
    let pristine6 = save(&ns, "ip6tables-save");

    let mut once = mode.args(&["--manifests", manifest.as_str(), "--once"]);
    once.extend(NODE_ARGS);
    let (ok, _, err) = run_in(&ns, &once);
    assert!(ok, "{err}");
    let first = mode.ruleset(&ns);
    assert_ne!(first, pristine);
    if mode == Mode::Nftables {
        // One table per family.
        assert!(first.contains("table ip kube-proxy") && first.contains("table ip6 kube-proxy"));
    }
    let (ok, _, err) = run_in(&ns, &once);
    assert!(ok, "{err}");
    assert_eq!(
        mode.ruleset(&ns),
        first,
        "a resync without changes must not change the ruleset"
    );

    let (ok, _, err) = run_in(&ns, &["--cleanup"]);
    assert!(ok, "{err}");
    match mode {
        Mode::Ipvs | Mode::Userspace => {
            unreachable!(
                "IPVS and userspace modes are tested in tests/ipvs.rs and tests/userspace.rs"
            )
        }
        Mode::Iptables => {
            // A table that did not exist before may remain as an empty table (iptables
            // cannot delete tables): the mangle table, which held only the canary, and
            // often ip6tables' filter and nat. That is the same state for the kernel.
            let after = save(&ns, "iptables-save");
            assert!(!after.contains("KUBE-"), "{after}");
            assert_eq!(
                without_empty_tables(&after),
                without_empty_tables(&pristine),
                "--cleanup must remove everything we created and nothing else"
            );
            assert_eq!(
                without_empty_tables(&save(&ns, "ip6tables-save")),
                without_empty_tables(&pristine6)
            );
        }
        Mode::Nftables => {
            let after = mode.ruleset(&ns);
            assert!(
                nft_table(&ns, "ip").is_none() && nft_table(&ns, "ip6").is_none(),
                "{after}"
            );
            assert!(after.contains("tcp dport 22 accept"), "{after}");
            assert_eq!(
                after, pristine,
                "--cleanup must remove everything we created and nothing else"
            );
            assert!(!save(&ns, "iptables-save").contains("KUBE-"));
        }
    }
    let (ok, _, err) = run_in(&ns, &["--cleanup"]);
    assert!(ok, "a second cleanup is a no-op: {err}");
    // --cleanup programs nothing, so what --cluster-cidr would change is not its concern.
    assert!(!err.contains("--cluster-cidr"), "{err}");
}

/// The daemon stops cleanly on SIGTERM (a Pod deletion) and SIGINT: exit status 0, no
/// panic, and the programmed rules stay in place for the next instance.
fn daemon_stops_cleanly_on_signals(mode: Mode) {
    if !require_root() {
        return;
    }
    for signal in ["TERM", "INT"] {
        let dir = tempdir();
        let manifest = seed_and_extra_manifest(dir.path());
        let ns = Netns::new("signal").unwrap();
        let mut args = vec!["--manifests", manifest.as_str()];
        args.extend(NODE_ARGS);
        let mut proxy = Daemon::start(mode, &ns, dir.path(), &args, None);
        proxy.wait_programmed(&ns);
        let programmed = mode.ruleset(&ns);
        let pid = proxy.guard.id().to_string();
        let sent = Command::new("kill")
            .args([format!("-{signal}").as_str(), pid.as_str()])
            .status()
            .unwrap();
        assert!(sent.success());
        let started = Instant::now();
        let status = loop {
            if let Some(status) = proxy.guard.try_wait().unwrap() {
                break status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "SIG{signal}: still running after 10 s\n{}",
                proxy.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let log = proxy.log();
        assert!(
            status.success() && !log.contains("panicked"),
            "SIG{signal}: {status}\n{log}"
        );
        // Said once, however many families were programmed.
        assert_eq!(
            log.matches("shutting down; the programmed rules stay in place")
                .count(),
            1,
            "SIG{signal}:\n{log}"
        );
        assert_eq!(
            mode.ruleset(&ns),
            programmed,
            "SIG{signal}: the rules stay in place"
        );
    }
}

/// The daemon runs with one glibc malloc arena: started without `MALLOC_ARENA_MAX`, it
/// re-executes itself with `MALLOC_ARENA_MAX=1` (the same PID, arguments and rules); an
/// operator's own value is kept.
#[test]
fn the_daemon_runs_with_one_malloc_arena_unless_told_otherwise() {
    if !require_root() {
        return;
    }
    for (given, expected) in [(None, "1"), (Some("3"), "3")] {
        let dir = tempdir();
        let manifest = seed_and_extra_manifest(dir.path());
        let ns = Netns::new("arena").unwrap();
        let mut args = vec!["--manifests", manifest.as_str()];
        args.extend(NODE_ARGS);
        let env = [("MALLOC_ARENA_MAX", given), ("GLIBC_TUNABLES", None)];
        let mut proxy = Daemon::start_with_env(Mode::Iptables, &ns, dir.path(), &args, None, &env);
        proxy.wait_programmed(&ns);
        let environ = std::fs::read(format!("/proc/{}/environ", proxy.guard.id())).unwrap();
        let value = environ
            .split(|b| *b == 0)
            .find_map(|v| v.strip_prefix(b"MALLOC_ARENA_MAX="))
            .map(|v| String::from_utf8_lossy(v).into_owned());
        assert_eq!(
            value.as_deref(),
            Some(expected),
            "given {given:?}\n{}",
            proxy.log()
        );
        // The arguments survived the re-execution.
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", proxy.guard.id())).unwrap();
        assert!(
            cmdline.split(|b| *b == 0).any(|a| a == manifest.as_bytes()),
            "{}",
            String::from_utf8_lossy(&cmdline)
        );
    }
}

#[test]
fn daemon_stops_cleanly_on_signals_iptables() {
    daemon_stops_cleanly_on_signals(Mode::Iptables);
}

#[test]
fn daemon_stops_cleanly_on_signals_nftables() {
    daemon_stops_cleanly_on_signals(Mode::Nftables);
}

// ---------------------------------------------------------------------------------------
// The daemon's memory
// ---------------------------------------------------------------------------------------

/// Measures the daemon (this test binary's `kube-proxy-rs`) in `mode`, fed by the test API
/// server, at `services` Services × 10 endpoints: its `VmHWM` after the first sync. (The API
/// source, because the debug build the tests run parses 2,000 Services of manifests in about
/// 80 s on the 2-core development machine, against 10 s for the API server's JSON.)
fn daemon_hwm(mode: kp_testkit::rss::DaemonMode, services: usize) -> kp_testkit::rss::Measurement {
    use kp_testkit::rss::{MeasureOptions, Source, measure};
    let mut opts = MeasureOptions::new(std::path::Path::new(BIN), mode, Source::Api, services);
    opts.timeout = Duration::from_secs(40);
    opts.settle = Duration::from_millis(500);
    measure(&opts).unwrap_or_else(|e| panic!("{} at {services} Services: {e}", mode.label()))
}

/// The growth of the daemon's peak memory per Service, from 200 to 2,000 Services × 10
/// endpoints (one EndpointSlice each, from the API server), must stay within 1.5× `measured_kib`
/// (KiB per Service, measured when the test was written; see the callers). A proportion, not
/// an absolute number, so the daemon's fixed part (binary, threads, runtime) does not count.
///
/// Checked against deliberate leaks in `SyncLoop::sync_once` (deep copies of every Service and
/// endpoint list of the snapshot, kept forever): three copies added about 3.5 KiB per Service
/// (18.3 iptables, 16.4 nftables) and passed; eight copies (22.4 and 21.6) failed both tests.
/// It catches a growth of the per-Service peak by half, not smaller ones: the runs spread by
/// about ±10%.
fn daemon_memory_per_service_stays_bounded(mode: kp_testkit::rss::DaemonMode, measured_kib: f64) {
    if !require_root() {
        return;
    }
    let small = daemon_hwm(mode, 200);
    let large = daemon_hwm(mode, 2000);
    let per_service = kp_testkit::rss::hwm_kib_per_service((200, &small), (2000, &large));
    let bound = 1.5 * measured_kib;
    eprintln!(
        "{}: VmHWM {} KiB at 200, {} KiB at 2,000 Services: {per_service:.2} KiB per Service (bound {bound:.2})",
        mode.label(),
        small.hwm_kib,
        large.hwm_kib
    );
    assert!(
        per_service <= bound,
        "{}: the daemon's peak grows by {per_service:.2} KiB per Service (VmHWM {} KiB at 200, \
         {} KiB at 2,000 Services), more than 1.5 × the {measured_kib} KiB measured before",
        mode.label(),
        small.hwm_kib,
        large.hwm_kib
    );
}

/// iptables mode (legacy backend). MEASURED_KIB_PER_SERVICE_IPTABLES: see its comment.
#[test]
fn daemon_memory_per_service_stays_bounded_iptables() {
    daemon_memory_per_service_stays_bounded(
        kp_testkit::rss::DaemonMode::IptablesLegacy,
        MEASURED_KIB_PER_SERVICE_IPTABLES,
    );
}

/// nftables mode. MEASURED_KIB_PER_SERVICE_NFTABLES: see its comment.
#[test]
fn daemon_memory_per_service_stays_bounded_nftables() {
    daemon_memory_per_service_stays_bounded(
        kp_testkit::rss::DaemonMode::Nftables,
        MEASURED_KIB_PER_SERVICE_NFTABLES,
    );
}

/// userspace mode (its relay's proxy sockets, and a `/metrics` scrape every 100 ms while the
/// first sync runs). MEASURED_KIB_PER_SERVICE_USERSPACE: see its comment.
#[test]
fn daemon_memory_per_service_stays_bounded_userspace() {
    daemon_memory_per_service_stays_bounded(
        kp_testkit::rss::DaemonMode::Userspace,
        MEASURED_KIB_PER_SERVICE_USERSPACE,
    );
}

/// The daemon's peak growth per Service in iptables mode (legacy backend), KiB:
/// `(HWM(2000) - HWM(200)) / 1800` of the debug binary `cargo test` builds, from the API
/// source, with `kp-bench daemon-rss --sizes 200,2000 --modes iptables-legacy,nftables --sources
/// api,manifests --settle 0.5 --proxy-binary target/debug/kube-proxy-rs` on the 2-core
/// development machine. Since full syncs stream their payload into `iptables-restore`: 11.15
/// from the API server (VmHWM 39.1 → 58.7 MiB), 9.9 from manifests (36.5 → 53.9). Before that
/// (the payload built whole): 14.96 and 14.62 from the API server, 16.9, 15.4 and 16.6 from
/// manifests.
const MEASURED_KIB_PER_SERVICE_IPTABLES: f64 = 11.2;

/// The same in nftables mode, KiB per Service, from the API server, since the full sync
/// streams its payload into `nft` and keeps a compact state: 8.84, 8.89 and 8.89 with
/// `kp-bench daemon-rss --sizes 200,2000 --modes nftables,userspace --sources api --settle
/// 0.5 --proxy-binary target/debug/kube-proxy-rs` (VmHWM 41.6 → 57.2, 41.9 → 57.5, 41.8 →
/// 57.5 MiB); 10.64, 9.56, 9.29 and 9.14 in this test's printout; 8.61, 10.82 and 10.26 in
/// it alternated with the debug binary of main at ff71b98 (the test pointed at each binary in
/// turn), which gave 13.16, 13.26 and 13.26 (12.12 and 13.67 with kp-bench, alternated too).
/// 9.5 is the mean of the ten runs. The binary from before is 1.38× that, inside the 1.5×
/// bound: this guard catches a growth by half, not that change (crates/bench/tests/
/// sync_memory.rs, which measures the sync alone, does). When the test was written: 12.63
/// and 14.5 from the API server, 14.7, 11.6 and 11.4 from manifests.
const MEASURED_KIB_PER_SERVICE_NFTABLES: f64 = 9.5;

/// The same in userspace mode (its proxy sockets, and the test's `/metrics` scrapes while
/// the first sync runs), KiB per Service, from the API server, since the portal rules are
/// streamed into `iptables-restore` and kept as a digest, `/metrics` is written in pieces,
/// and a listener's endpoints are shared with the relay: 9.89, 10.47 and 9.86 with the
/// kp-bench command above (VmHWM 41.9 → 59.3, 42.5 → 60.9, 42.1 → 59.4 MiB); 11.55, 10.16,
/// 10.34 and 10.82 in this test's printout; 9.93, 10.99 and 10.43 alternated with main's
/// debug binary, which gave 14.97, 15.75 and 15.81 (15.25 and 15.41 with kp-bench). 10.4 is
/// the mean of the ten runs; the binary from before is 1.48× that, at the bound (two of its
/// five runs would fail this test, three pass).
const MEASURED_KIB_PER_SERVICE_USERSPACE: f64 = 10.4;

#[test]
fn resync_is_identical_and_cleanup_restores_the_tables_iptables() {
    resync_is_identical_and_cleanup_restores_the_tables(Mode::Iptables);
}

#[test]
fn resync_is_identical_and_cleanup_restores_the_tables_nftables() {
    resync_is_identical_and_cleanup_restores_the_tables(Mode::Nftables);
}

/// nftables only (it is the mode that cleans up after the other): iptables → nftables →
/// iptables on one node without a reboot, then `--cleanup` after both modes ran.
#[test]
fn nftables_switching_modes_without_a_reboot_and_cleanup_of_both() {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let manifest = write(dir.path(), "cluster.yaml", SEED_CLUSTER);
    let m = manifest.to_str().unwrap();
    let ns = Netns::new("nft-switch").unwrap();
    add_foreign_rules(Mode::Nftables, &ns);
    let node_args = [
        "--hostname-override=k8s-master",
        "--cluster-cidr=10.0.0.0/16",
        "--manifests",
        m,
        "--once",
    ];
    // Explicit `--proxy-mode` for both: this is what an operator switching modes passes.
    let once = |ns: &Netns, mode: &str| {
        let mut a = vec![mode];
        a.extend(node_args);
        let (ok, _, err) = run_in(ns, &a);
        assert!(ok, "{err}");
        err
    };
    let iptables_save = |ns: &Netns| save(ns, "iptables-save");

    // iptables → nftables: the KUBE- chains go away.
    once(&ns, "--proxy-mode=iptables");
    assert!(iptables_save(&ns).contains("-A KUBE-SERVICES"));
    let log = once(&ns, "--proxy-mode=nftables");
    assert!(
        !iptables_save(&ns).contains("KUBE-"),
        "{}\n{log}",
        iptables_save(&ns)
    );
    assert!(nft_table(&ns, "ip").is_some() && nft_table(&ns, "ip6").is_some());
    assert!(
        log.contains("removed the iptables-mode and IPVS-mode rules"),
        "{log}"
    );

    // nftables → iptables: both kube-proxy tables go away.
    once(&ns, "--proxy-mode=iptables");
    assert!(nft_table(&ns, "ip").is_none() && nft_table(&ns, "ip6").is_none());
    assert!(iptables_save(&ns).contains("-A KUBE-SERVICES"));

    // --cleanup removes the rules of both modes.
    once(&ns, "--proxy-mode=nftables");
    let (ok, _, err) = run_in(&ns, &["--cleanup"]);
    assert!(ok, "{err}");
    assert!(nft_table(&ns, "ip").is_none() && nft_table(&ns, "ip6").is_none());
    assert!(!iptables_save(&ns).contains("KUBE-"));
    let (ok, _, err) = run_in(&ns, &["--cleanup"]);
    assert!(ok, "a second cleanup is a no-op: {err}");
    let ruleset = Mode::Nftables.ruleset(&ns);
    assert!(ruleset.contains("tcp dport 22 accept"), "{ruleset}");
}

/// How many Services the mode-switch probe test programs: enough that a start and a first
/// sync take a while (the gap the old order left grew with them: 0.6 s at 5,000 Services from
/// iptables to nftables mode in a release build).
const SWITCH_SERVICES: usize = 2000;

/// A mode switch leaves no moment without rules: a client connects to the seed's ClusterIP
/// over and over (a new connection each time, 300 ms timeout) while the daemon is stopped and
/// started in the other mode, iptables → nftables → iptables, on the seed plus 2,000 Services.
/// The new mode writes its rules before it removes the old mode's (crate::takeover), so not
/// one connection fails; the old mode's rules are gone afterwards.
#[test]
fn switching_between_iptables_and_nftables_mode_drops_no_connection() {
    if !require_root() {
        return;
    }
    let (topology, _servers) = seed_topology();
    let (node, client) = (topology.node(), topology.client());
    let dir = tempdir();
    let manifest = write(
        dir.path(),
        "cluster.yaml",
        &format!(
            "{SEED_CLUSTER}\n{}",
            common::filler_services(SWITCH_SERVICES)
        ),
    );
    let mut args = vec!["--manifests", manifest.to_str().unwrap()];
    args.extend(NODE_ARGS);
    let vip: SocketAddr = "10.96.138.71:8080".parse().unwrap();
    let mut proxy = Daemon::start(Mode::Iptables, node, dir.path(), &args, None);
    proxy.wait_programmed(node);
    proxy.wait_nat_rules_contain(node, "10.97.7.250");
    let iptables_gone = || !save(node, "iptables-save").contains("KUBE-SERVICES");
    let nftables_gone = || nft_table(node, "ip").is_none() && nft_table(node, "ip6").is_none();
    let mut failures = Vec::new();
    for (to, old_gone) in [
        (Mode::Nftables, &iptables_gone as &dyn Fn() -> bool),
        (Mode::Iptables, &nftables_gone),
    ] {
        let (log, probes) = common::probe_during(
            client,
            vip,
            Duration::from_millis(300),
            Duration::from_millis(10),
            || {
                std::thread::sleep(Duration::from_millis(300));
                drop(std::mem::replace(
                    &mut proxy,
                    Daemon::start(to, node, dir.path(), &args, None),
                ));
                proxy.wait_programmed(node);
                proxy.wait_until("the old mode's rules removed", old_gone);
                std::thread::sleep(Duration::from_millis(300));
                proxy.log()
            },
        );
        let (failed, span) = common::failures(&probes);
        if !failed.is_empty() {
            failures.push(format!(
                "switching to {to:?}: {} of {} connections failed over {span:?}; first: {:?}",
                failed.len(),
                probes.len(),
                failed[0]
            ));
        }
        assert!(probes.len() >= 20, "only {} probes", probes.len());
        assert!(
            log.contains(if to == Mode::Nftables {
                "removed the iptables-mode and IPVS-mode rules of an earlier run"
            } else {
                "removed the nftables-mode tables of an earlier run"
            }),
            "{log}"
        );
    }
    assert!(failures.is_empty(), "{failures:#?}\n{}", proxy.log());
}

// ---------------------------------------------------------------------------------------
// Real traffic
// ---------------------------------------------------------------------------------------

/// The seed's EndpointSlice entry for 10.0.1.2 (be1), which the traffic test removes.
const SEED_BE1_ENDPOINT: &str = "- addresses:\n  - 10.0.1.2\n  conditions:\n    ready: true\n    serving: true\n    terminating: false\n  nodeName: k8s-worker\n  targetRef:\n    kind: Pod\n    name: nginx-deployment-54bcfc567b-6r7wm\n    namespace: default\n";

/// The daemon on the seed and [`SEED_EXTRA_SERVICES`]: ClusterIP traffic from the client
/// and the node is balanced and masqueraded, the NodePort answers, a Service without
/// endpoints is refused at once, and an endpoint removed while it runs stops getting
/// connections within 2 s.
fn real_traffic_cluster_ip_nodeport_endpoint_removal_and_reject(mode: Mode) {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let (topology, servers) = seed_topology();
    let manifest_dir = dir.path().join("manifests");
    std::fs::create_dir(&manifest_dir).unwrap();
    write(&manifest_dir, "seed.yaml", SEED_CLUSTER);
    write(&manifest_dir, "extra.yaml", SEED_EXTRA_SERVICES);
    let mut args = vec!["--manifests", manifest_dir.to_str().unwrap()];
    args.extend(NODE_ARGS);
    let node = topology.node();
    let client = topology.client();
    let mut proxy = Daemon::start(mode, node, dir.path(), &args, None);
    proxy.wait_programmed(node);
    if mode == Mode::Nftables {
        // nftables mode leaves iptables alone and never sets route_localnet.
        assert!(!save(node, "iptables-save").contains("KUBE-"));
        assert_eq!(
            node.read_sysctl("net.ipv4.conf.all.route_localnet")
                .unwrap()
                .trim(),
            "0"
        );
    }

    // ClusterIP from the client and from the node itself: both backends answer.
    let vip: SocketAddr = "10.96.138.71:8080".parse().unwrap();
    for (who, ns) in [("client", client), ("node", node)] {
        let c = counts(http_get_many(ns, vip, 100, Duration::from_secs(2)));
        assert_eq!(
            answered(&c, "be0") + answered(&c, "be1"),
            100,
            "{who}: {c:?}\n{}",
            proxy.log()
        );
        assert!(
            c["be0"] >= 15 && c["be1"] >= 15,
            "{who}: not balanced: {c:?}"
        );
    }
    // The client is outside the cluster CIDR: its connections were masqueraded to the
    // node's address; the node's own connections come from the node's address too.
    let node_ip: IpAddr = "192.168.56.10".parse().unwrap();
    for s in &servers {
        assert!(
            s.peer_ips().iter().all(|ip| *ip == node_ip),
            "{}: {:?}",
            s.name(),
            s.peer_ips()
        );
    }

    // NodePort on the node's address (in nftables mode, the default `primary` NodePort
    // address, from the seed's Node object).
    let node_port = SocketAddr::new(node_ip, 30080);
    let c = counts(http_get_many(client, node_port, 60, Duration::from_secs(2)));
    assert!(
        answered(&c, "be0") >= 5 && answered(&c, "be1") >= 5,
        "NodePort: {c:?}\n{}\n{}",
        proxy.log(),
        mode.ruleset(node)
    );
    if mode == Mode::Nftables {
        // Not on loopback: nftables mode does not serve localhost NodePorts.
        let lo = http_get(
            node,
            "127.0.0.1:30080".parse().unwrap(),
            Duration::from_millis(500),
        );
        assert!(lo.is_err(), "{lo:?}");
    }

    // A Service without endpoints is refused at once, from the client and the node.
    let mut refused = vec![(client, "10.96.0.99:80"), (node, "10.96.0.99:80")];
    if mode == Mode::Nftables {
        // nftables mode also refuses a port of a ClusterIP that no Service uses
        // (cluster-ips-check); iptables mode has no such rule.
        refused.push((client, "10.96.138.71:9999"));
    }
    for (ns, target) in refused {
        let start = Instant::now();
        let r = http_get(ns, target.parse().unwrap(), Duration::from_secs(3));
        assert!(
            matches!(r, Err(ClientError::Refused)),
            "expected refused from {} to {target}, got {r:?}\n{}",
            ns.name(),
            mode.ruleset(node)
        );
        assert!(
            start.elapsed() < Duration::from_millis(500),
            "refusal took {:?}",
            start.elapsed()
        );
    }

    // Remove 10.0.1.2 from the seed's EndpointSlice while the daemon runs: within 2 s no new
    // connection reaches it.
    let without = SEED_CLUSTER.replace(SEED_BE1_ENDPOINT, "");
    assert_ne!(
        without, SEED_CLUSTER,
        "the test's edit must remove the endpoint"
    );
    let changed_at = Instant::now();
    write(&manifest_dir, "seed.yaml", &without);
    let mut gone_after = None;
    while changed_at.elapsed() < Duration::from_secs(2) {
        // 30 answers in a row from be0: by chance only once in 10^9 while be1 still serves
        // (10 in a row happened by chance about once in a hundred runs).
        let c = counts(http_get_many(client, vip, 30, Duration::from_secs(1)));
        if c.get("be0") == Some(&30) {
            gone_after = Some(changed_at.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let gone_after = gone_after
        .unwrap_or_else(|| panic!("endpoint still used 2 s after the change\n{}", proxy.log()));
    let c = counts(http_get_many(client, vip, 100, Duration::from_secs(2)));
    assert_eq!(c.get("be0"), Some(&100), "after removal: {c:?}");
    assert!(proxy.is_running(), "the daemon keeps running");
    eprintln!("endpoint removal took effect after {gone_after:?}");
    let log = proxy.log();
    assert!(log.contains(mode.synced_message()), "{log}");
    if mode == Mode::Nftables {
        // nftables mode applies an endpoint change with a partial transaction.
        assert!(
            log.contains("full=false"),
            "the change was applied by a partial sync: {log}"
        );
    }
    drop(servers);
}

#[test]
fn real_traffic_cluster_ip_nodeport_endpoint_removal_and_reject_iptables() {
    real_traffic_cluster_ip_nodeport_endpoint_removal_and_reject(Mode::Iptables);
}

#[test]
fn real_traffic_cluster_ip_nodeport_endpoint_removal_and_reject_nftables() {
    real_traffic_cluster_ip_nodeport_endpoint_removal_and_reject(Mode::Nftables);
}

// ---------------------------------------------------------------------------------------
// Failures
// ---------------------------------------------------------------------------------------

/// While a fake `iptables-restore` (or `nft -f`) fails, as a kernel or lock error would, the
/// daemon logs the failure, keeps running and leaves the kernel's rules as they were; once it
/// works again, the periodic retry applies the pending change.
fn a_failed_sync_keeps_the_rules_and_is_retried(mode: Mode) {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    // The fake fails while a flag file exists and runs the real program otherwise.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let flag = dir.path().join("fail");
    let (program, fails_when, message) = match mode {
        Mode::Ipvs | Mode::Userspace => {
            unreachable!(
                "IPVS and userspace modes are tested in tests/ipvs.rs and tests/userspace.rs"
            )
        }
        // `--iptables-backend auto` picks nf_tables in a fresh namespace and runs its
        // binaries by name.
        Mode::Iptables => (
            "iptables-nft-restore",
            "",
            "iptables-restore: injected failure (line 3 failed)",
        ),
        // Only `nft -f` (the transaction) fails: the proxy also runs `nft --version`/`list`.
        Mode::Nftables => ("nft", " && [ \"$1\" = \"-f\" ]", "Error: injected failure"),
    };
    let script = format!(
        "#!/bin/sh\nif [ -e {flag} ]{fails_when}; then cat >/dev/null; echo '{message}' >&2; exit 1; fi\nexec {real} \"$@\"\n",
        flag = flag.display(),
        real = which(program).display()
    );
    std::fs::write(bin.join(program), script).unwrap();
    Command::new("chmod")
        .arg("+x")
        .arg(bin.join(program))
        .status()
        .unwrap();

    let manifest = write(dir.path(), "cluster.yaml", SEED_CLUSTER);
    let ns = Netns::new("retry").unwrap();
    let mut args = vec![
        "--manifests",
        manifest.to_str().unwrap(),
        "--iptables-sync-period=1s",
    ];
    args.extend(NODE_ARGS);
    let mut proxy = Daemon::start(mode, &ns, dir.path(), &args, Some(&bin));
    proxy.wait_programmed(&ns);
    let before = mode.ruleset(&ns);
    assert!(before.contains(&mode.endpoint_in_rules("10.0.1.2:80")));

    std::fs::write(&flag, "").unwrap();
    write(
        dir.path(),
        "cluster.yaml",
        &SEED_CLUSTER.replace("  - 10.0.1.2\n", "  - 10.0.0.5\n"),
    );
    wait_for(
        || proxy.log().contains("injected failure"),
        Duration::from_secs(5),
    )
    .unwrap_or_else(|_| panic!("no failure logged\n{}", proxy.log()));
    assert!(proxy.log().contains("sync failed"), "{}", proxy.log());
    assert_eq!(
        mode.ruleset(&ns),
        before,
        "a failed sync must leave the kernel's rules in place"
    );
    assert!(proxy.is_running(), "a failed sync is not fatal");

    std::fs::remove_file(&flag).unwrap();
    wait_for(
        || {
            mode.ruleset(&ns)
                .contains(&mode.endpoint_in_rules("10.0.0.5:80"))
        },
        Duration::from_secs(5),
    )
    .unwrap_or_else(|_| panic!("the retry did not apply the change\n{}", proxy.log()));
    assert!(
        !mode
            .ruleset(&ns)
            .contains(&mode.endpoint_in_rules("10.0.1.2:80"))
    );
    if mode == Mode::Nftables {
        // After a failed transaction nftables mode no longer trusts its view of the kernel:
        // the retry, the first IPv4 sync after the last failure, rewrites everything. (Wait
        // for its log line: the kernel may show the change before the line is written.)
        let retry = || {
            let log = proxy.log();
            let after_failure = log.rsplit("sync failed").next().unwrap_or_default();
            after_failure
                .lines()
                .find(|l| l.contains("synced nftables rules") && l.contains("family=IPv4"))
                .map(str::to_string)
        };
        wait_for(|| retry().is_some(), Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("no IPv4 sync after the failure\n{}", proxy.log()));
        let retry = retry().unwrap();
        assert!(
            retry.contains("full=true"),
            "the retry is a full sync: {retry}\n{}",
            proxy.log()
        );
    }
}

#[test]
fn a_failed_sync_keeps_the_rules_and_is_retried_iptables() {
    a_failed_sync_keeps_the_rules_and_is_retried(Mode::Iptables);
}

#[test]
fn a_failed_sync_keeps_the_rules_and_is_retried_nftables() {
    a_failed_sync_keeps_the_rules_and_is_retried(Mode::Nftables);
}

/// Opens `fifo` for writing without blocking when the test ends, so that a fake blocked
/// opening it for reading (a daemon that never killed it) ends instead of staying behind.
struct Unblock(std::path::PathBuf);

impl Drop for Unblock {
    fn drop(&mut self) {
        use std::os::unix::fs::OpenOptionsExt as _;
        // ENXIO when nobody reads it: nothing to unblock.
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(&self.0);
    }
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(needle))
        .collect()
}

/// SIGTERM while a restore does not finish (a fake `iptables-nft-restore`, or `nft -f`, that
/// takes its payload and then blocks): the daemon says what is in flight (the IPv4 sync and
/// the command), waits the 10 s bound (well inside Kubernetes' 30 s grace period), kills the
/// command and exits 0; the kernel holds the previous complete rules, none of the new ones.
fn sigterm_during_a_restore_that_does_not_finish_is_bounded(mode: Mode) {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let flag = dir.path().join("hang");
    let fifo = dir.path().join("never");
    let hanging = dir.path().join("hanging");
    let payload = dir.path().join("hung-payload");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let _unblock = Unblock(fifo.clone());
    let (program, when) = match mode {
        Mode::Iptables => ("iptables-nft-restore", ""),
        Mode::Nftables => ("nft", " && [ \"$1\" = \"-f\" ]"),
        Mode::Ipvs | Mode::Userspace => unreachable!("iptables and nftables modes only"),
    };
    // Blocked in `read < fifo` (opening a FIFO nobody writes): the shell itself waits, with
    // no process of its own that a kill would leave behind.
    let script = format!(
        "#!/bin/sh\nif [ -e {flag} ]{when}; then\n  cat > {payload}\n  : > {hanging}\n  read -r _ < {fifo}\n  exit 1\nfi\nexec {real} \"$@\"\n",
        flag = flag.display(),
        payload = payload.display(),
        hanging = hanging.display(),
        fifo = fifo.display(),
        real = which(program).display()
    );
    std::fs::write(bin.join(program), script).unwrap();
    assert!(
        Command::new("chmod")
            .arg("+x")
            .arg(bin.join(program))
            .status()
            .unwrap()
            .success()
    );
    let manifest = write(dir.path(), "cluster.yaml", SEED_CLUSTER);
    let ns = Netns::new("sigterm").unwrap();
    let mut args = vec!["--manifests", manifest.to_str().unwrap()];
    args.extend(NODE_ARGS);
    let mut proxy = Daemon::start(mode, &ns, dir.path(), &args, Some(&bin));
    proxy.wait_programmed(&ns);
    let before = mode.ruleset(&ns);
    assert!(before.contains("10.0.1.2"), "{before}");

    // The next restore takes its payload and blocks.
    std::fs::write(&flag, "").unwrap();
    write(
        dir.path(),
        "cluster.yaml",
        &SEED_CLUSTER.replace("  - 10.0.1.2\n", "  - 10.0.0.5\n"),
    );
    wait_for(|| hanging.exists(), Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("no restore started\n{}", proxy.log()));
    let sent = std::fs::read_to_string(&payload).unwrap();
    assert!(
        sent.contains("10.0.0.5"),
        "the new rules were on their way:\n{sent}"
    );

    let pid = proxy.guard.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", pid.as_str()])
            .status()
            .unwrap()
            .success()
    );
    let started = Instant::now();
    let status = loop {
        if let Some(status) = proxy.guard.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "still running 20 s after SIGTERM\n{}",
            proxy.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = started.elapsed();
    let log = proxy.log();
    assert!(status.success(), "{status}\n{log}");
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(14),
        "exited {took:?} after SIGTERM; the bound is 10 s\n{log}"
    );
    assert!(
        log.contains("SIGTERM: waiting up to 10 s for the IPv4 "),
        "what is in flight is said:\n{log}"
    );
    let named = log
        .lines()
        .find(|l| l.contains("SIGTERM: waiting up to 10 s"))
        .unwrap();
    assert!(
        named.contains(program) && named.contains("(pid "),
        "{named}"
    );
    assert!(
        log.contains("still running after 10 s: exiting with the IPv4 ")
            && log.contains(&format!("killing /bin/sh {}", bin.join(program).display())),
        "{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    assert_eq!(
        mode.ruleset(&ns),
        before,
        "the kernel keeps the previous complete rules"
    );
    assert!(
        processes_mentioning(&bin.display().to_string()).is_empty(),
        "the blocked restore was left running: {:?}",
        processes_mentioning(&bin.display().to_string())
    );
}

#[test]
fn sigterm_during_a_restore_that_does_not_finish_is_bounded_iptables() {
    sigterm_during_a_restore_that_does_not_finish_is_bounded(Mode::Iptables);
}

#[test]
fn sigterm_during_a_restore_that_does_not_finish_is_bounded_nftables() {
    sigterm_during_a_restore_that_does_not_finish_is_bounded(Mode::Nftables);
}

// ---------------------------------------------------------------------------------------
// Rules removed by someone else
// ---------------------------------------------------------------------------------------

/// Waits up to `limit` for a request to the seed's ClusterIP from `client` to be answered;
/// returns how long it took, or `None`.
fn cluster_ip_answers_within(client: &Netns, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let vip: SocketAddr = "10.96.138.71:8080".parse().unwrap();
    while start.elapsed() < limit {
        if http_get(client, vip, Duration::from_millis(300)).is_ok() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Both seed backends answer the seed's ClusterIP from `client`.
fn assert_seed_cluster_ip_works(client: &Netns, what: &str, proxy: &Daemon) {
    let vip: SocketAddr = "10.96.138.71:8080".parse().unwrap();
    let c = counts(http_get_many(client, vip, 40, Duration::from_secs(2)));
    assert!(
        answered(&c, "be0") >= 5 && answered(&c, "be1") >= 5 && c.len() == 2,
        "{what}: {c:?}\n{}",
        proxy.log()
    );
}

/// A way of removing the rules: what it is, and the commands (argv) that do it.
type Breakage = (&'static str, Vec<Vec<&'static str>>);

/// Rules flushed or deleted by someone else inside the node's namespace (an operator's
/// `iptables -t nat -F; iptables -t nat -X`, a firewall reload flushing every table, `nft
/// delete table ip kube-proxy`, `nft flush table ip kube-proxy`) are noticed by the check
/// that runs every `--iptables-sync-period` (2 s here) and rewritten by a full sync at once:
/// the ClusterIP answers again within a few seconds, with a warning in the log, instead of
/// staying broken until a Service changes or the hourly full sync.
fn flushed_rules_are_repaired_within_the_sync_period(mode: Mode) {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let (topology, servers) = seed_topology();
    let manifest = write(dir.path(), "cluster.yaml", SEED_CLUSTER);
    let mut args = vec![
        "--manifests",
        manifest.to_str().unwrap(),
        "--iptables-sync-period=2s",
    ];
    args.extend(NODE_ARGS);
    let node = topology.node();
    let client = topology.client();
    let mut proxy = Daemon::start(mode, node, dir.path(), &args, None);
    proxy.wait_programmed(node);
    assert_seed_cluster_ip_works(client, "before", &proxy);
    // What must come back: iptables-save as it was; in nftables mode each family's table
    // (a re-created table is listed after the other family's by `nft list ruleset`).
    let state = |node: &Netns| match mode {
        Mode::Nftables => ["ip", "ip6"]
            .map(|f| {
                nft_table(node, f)
                    .map(|t| kp_netfilter::canonical_listing(&t))
                    .unwrap_or_default()
            })
            .join("\n"),
        _ => mode.ruleset(node),
    };
    let good = state(node);

    let (breakages, warning): (Vec<Breakage>, &str) = match mode {
        Mode::Iptables => (
            vec![
                (
                    "iptables -t nat -F; iptables -t nat -X",
                    vec![
                        vec!["iptables", "-t", "nat", "-F"],
                        vec!["iptables", "-t", "nat", "-X"],
                    ],
                ),
                (
                    "a firewall reload: -F and -X of filter, nat and mangle",
                    ["filter", "nat", "mangle"]
                        .iter()
                        .flat_map(|t| {
                            [
                                vec!["iptables", "-t", t, "-F"],
                                vec!["iptables", "-t", t, "-X"],
                            ]
                        })
                        .collect(),
                ),
            ],
            "iptables rules were flushed by something else (KUBE-PROXY-CANARY missing in table nat); resyncing everything",
        ),
        Mode::Nftables => (
            vec![
                (
                    "nft delete table ip kube-proxy",
                    vec![vec!["nft", "delete", "table", "ip", "kube-proxy"]],
                ),
                (
                    "nft flush table ip kube-proxy",
                    vec![vec!["nft", "flush", "table", "ip", "kube-proxy"]],
                ),
            ],
            "nftables rules were removed by something else (table ip kube-proxy: its chain nat-prerouting (or the whole table) is gone); resyncing everything",
        ),
        Mode::Ipvs | Mode::Userspace => {
            unreachable!("tested in tests/ipvs.rs and tests/userspace.rs")
        }
    };
    for (what, commands) in breakages {
        for argv in &commands {
            node.run(argv[0], &argv[1..])
                .unwrap_or_else(|e| panic!("{what}: {argv:?}: {e}"));
        }
        let took =
            cluster_ip_answers_within(client, Duration::from_secs(10)).unwrap_or_else(|| {
                panic!(
                    "{what}: the ClusterIP still does not answer 10 s later\n{}\n{}",
                    mode.ruleset(node),
                    proxy.log()
                )
            });
        eprintln!("{mode:?}: after `{what}` the ClusterIP answered again after {took:?}");
        assert!(
            took < Duration::from_secs(6),
            "{what}: repaired only after {took:?} (sync period 2 s)"
        );
        // The repair sync may still be writing the other family: wait for the ruleset.
        proxy.wait_until(&format!("{what}: the ruleset is not back"), || {
            state(node) == good
        });
        assert_seed_cluster_ip_works(client, what, &proxy);
    }
    let log = proxy.log();
    assert!(log.contains(warning), "{log}");
    if mode == Mode::Nftables {
        assert!(
            log.contains("nftables rules were removed by something else (table ip kube-proxy: its chain nat-prerouting lost its rule (the table was flushed)); resyncing everything"),
            "{log}"
        );
    } else {
        // Upstream's chain name, back in the three tables.
        for table in ["mangle", "nat", "filter"] {
            let saved = node.run("iptables-save", ["-t", table]).unwrap();
            assert!(
                saved.contains(":KUBE-PROXY-CANARY - [0:0]"),
                "{table}:\n{saved}"
            );
        }
    }
    assert!(proxy.is_running());
    drop(servers);
}

#[test]
fn flushed_rules_are_repaired_within_the_sync_period_iptables() {
    flushed_rules_are_repaired_within_the_sync_period(Mode::Iptables);
}

#[test]
fn flushed_rules_are_repaired_within_the_sync_period_nftables() {
    flushed_rules_are_repaired_within_the_sync_period(Mode::Nftables);
}

/// The check is cheap and writes nothing while the rules are intact: with
/// `--iptables-sync-period=1s` for about 6 s, every run of the mode's tool (recorded by a
/// wrapper on `PATH`) after the first syncs is a listing of one chain (`iptables -w 5 -t
/// TABLE -S KUBE-PROXY-CANARY`, or `nft list chain ip kube-proxy nat-prerouting`): no
/// `iptables-save`, no restore, no `nft -f`, and no further sync in the log.
fn an_intact_dataplane_is_checked_not_rewritten(mode: Mode) {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let calls = dir.path().join("calls");
    // `--iptables-backend auto` picks nf_tables in a fresh namespace and runs its binaries by
    // name.
    let programs: &[&str] = match mode {
        Mode::Iptables => &[
            "iptables-nft",
            "ip6tables-nft",
            "iptables-nft-save",
            "ip6tables-nft-save",
            "iptables-nft-restore",
            "ip6tables-nft-restore",
        ],
        Mode::Nftables => &["nft"],
        Mode::Ipvs | Mode::Userspace => {
            unreachable!("tested in tests/ipvs.rs and tests/userspace.rs")
        }
    };
    for program in programs {
        let script = format!(
            "#!/bin/sh\necho \"{program} $*\" >> {calls}\nexec {real} \"$@\"\n",
            calls = calls.display(),
            real = which(program).display()
        );
        std::fs::write(bin.join(program), script).unwrap();
        Command::new("chmod")
            .arg("+x")
            .arg(bin.join(program))
            .status()
            .unwrap();
    }
    let manifest = write(dir.path(), "cluster.yaml", SEED_CLUSTER);
    let ns = Netns::new("canary").unwrap();
    let mut args = vec![
        "--manifests",
        manifest.to_str().unwrap(),
        "--iptables-sync-period=1s",
    ];
    args.extend(NODE_ARGS);
    let mut proxy = Daemon::start(mode, &ns, dir.path(), &args, Some(&bin));
    proxy.wait_programmed(&ns);
    // Both families' first syncs are logged once they are done.
    wait_for(
        || proxy_syncs(&proxy.log(), mode) >= 2,
        Duration::from_secs(10),
    )
    .unwrap_or_else(|_| panic!("no sync of both families\n{}", proxy.log()));
    std::thread::sleep(Duration::from_millis(300));
    let syncs = proxy_syncs(&proxy.log(), mode);
    let good = mode.ruleset(&ns);
    let before = std::fs::read_to_string(&calls).unwrap().lines().count();
    std::thread::sleep(Duration::from_secs(6));
    let all = std::fs::read_to_string(&calls).unwrap();
    let after: Vec<&str> = all.lines().skip(before).collect();
    let checks: Vec<&str> = match mode {
        Mode::Iptables => after
            .iter()
            .filter(|l| l.ends_with(" -S KUBE-PROXY-CANARY"))
            .copied()
            .collect(),
        _ => after
            .iter()
            .filter(|l| {
                l.starts_with("nft list chain ip") && l.ends_with(" kube-proxy nat-prerouting")
            })
            .copied()
            .collect(),
    };
    assert_eq!(
        checks.len(),
        after.len(),
        "only cheap listings between the periods:\n{}",
        after.join("\n")
    );
    // Six periods of three tables (iptables) or one chain (nftables), per family; a slow
    // machine may fit fewer.
    let per_period = if mode == Mode::Iptables { 6 } else { 2 };
    assert!(
        checks.len() >= 3 * per_period,
        "too few checks in 6 s: {checks:?}\n{}",
        proxy.log()
    );
    if mode == Mode::Iptables {
        for family in ["iptables", "ip6tables"] {
            for table in ["mangle", "nat", "filter"] {
                let line = format!("{family}-nft -w 5 -t {table} -S KUBE-PROXY-CANARY");
                assert!(checks.contains(&line.as_str()), "no `{line}`: {checks:?}");
            }
        }
    } else {
        assert!(checks.contains(&"nft list chain ip kube-proxy nat-prerouting"));
        assert!(checks.contains(&"nft list chain ip6 kube-proxy nat-prerouting"));
    }
    assert_eq!(proxy_syncs(&proxy.log(), mode), syncs, "{}", proxy.log());
    assert!(!proxy.log().contains("resyncing everything"));
    assert_eq!(mode.ruleset(&ns), good);
}

/// Successful syncs in a daemon's log.
fn proxy_syncs(log: &str, mode: Mode) -> usize {
    log.lines()
        .filter(|l| l.contains(mode.synced_message()))
        .count()
}

#[test]
fn an_intact_dataplane_is_checked_not_rewritten_iptables() {
    an_intact_dataplane_is_checked_not_rewritten(Mode::Iptables);
}

#[test]
fn an_intact_dataplane_is_checked_not_rewritten_nftables() {
    an_intact_dataplane_is_checked_not_rewritten(Mode::Nftables);
}

/// Mode-independent: bad objects in the manifests are reported with their place and
/// skipped (checked with the default mode).
#[test]
fn bad_objects_are_reported_and_skipped() {
    // Needs no root: --dry-run touches no kernel state.
    let dir = tempdir();
    let manifests = dir.path().join("m");
    std::fs::create_dir(&manifests).unwrap();
    write(&manifests, "seed.yaml", SEED_CLUSTER);
    write(
        &manifests,
        "bad.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: bad-port, namespace: default}\nspec:\n  clusterIP: 10.96.0.7\n  ports: [{port: 70000}]\n\
         ---\napiVersion: v1\nkind: Service\nmetadata: {name: bad-ip, namespace: default}\nspec:\n  clusterIP: 10.96.0.300\n  ports: [{port: 80}]\n\
         ---\nthis: is: not: yaml\n\
         ---\napiVersion: v1\nkind: Service\nmetadata: {name: good, namespace: default}\nspec:\n  clusterIP: 10.96.0.8\n  ports: [{port: 80}]\n",
    );
    let out = Command::new(BIN)
        .args([
            "--manifests",
            manifests.to_str().unwrap(),
            "--dry-run",
            "--hostname-override=k8s-master",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "--dry-run fails when objects were skipped: {stderr}"
    );
    assert!(
        stderr.contains("3 manifest problem(s) reported above"),
        "{stderr}"
    );
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains("bad.yaml"))
        .collect();
    assert_eq!(errors.len(), 3, "{stderr}");
    assert!(
        errors
            .iter()
            .any(|l| l.contains("bad.yaml:1: Service default/bad-port: spec.ports[0].port")),
        "{stderr}"
    );
    assert!(
        errors
            .iter()
            .any(|l| l.contains("Service default/bad-ip: spec.clusterIP")),
        "{stderr}"
    );
    assert!(
        errors
            .iter()
            .any(|l| l.contains("document 3") && l.contains("YAML")),
        "{stderr}"
    );
    assert!(stdout.contains("default/nginx-svc cluster IP"));
    assert!(stdout.contains("default/good has no endpoints"));
    assert!(!stdout.contains("bad-port") && !stdout.contains("bad-ip"));
}

// ---------------------------------------------------------------------------------------
// The sandbox
// ---------------------------------------------------------------------------------------

/// `kube-proxy-rs sandbox` in `mode`: the client and the node reach both seed backends, it
/// prints latencies and (`--show-rules`) the mode's rules, and it deletes its namespaces.
fn the_sandbox_reports_both_backends_and_cleans_up(mode: Mode) {
    if !require_root() {
        return;
    }
    let before = kp_testkit::netns::list_namespaces().unwrap();
    let mut args = vec!["sandbox"];
    args.extend(mode.flags());
    args.extend(["-n", "40", "--show-rules"]);
    let out = Command::new(BIN).args(&args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for who in ["client", "node  "] {
        let line = stdout
            .lines()
            .find(|l| l.contains(&format!("{who} -> 10.96.138.71:8080")))
            .unwrap_or_else(|| panic!("no {who} line:\n{stdout}"));
        assert!(
            line.contains("10.0.0.4:80 (nodeName k8s-master)")
                && line.contains("10.0.1.2:80 (nodeName k8s-worker)"),
            "{line}"
        );
        assert!(line.contains("p50") && line.contains("p99"), "{line}");
    }
    assert!(
        stdout.contains(&format!("--proxy-mode {}", mode.name())),
        "{stdout}"
    );
    // A ClusterIP is no address of any interface outside IPVS mode: a ping gets no answer.
    assert!(
        stdout.contains("  ping 10.96.138.71: no answer"),
        "{stdout}"
    );
    assert!(!stdout.contains("ipvs: "), "{stdout}");
    // On the bundled example the proxy has nothing to warn about (no machine-wide settings
    // attempted from inside the sandbox).
    assert!(
        !stdout.lines().any(|l| l.starts_with("proxy log:")
            && (l.contains(" WARN ") || l.contains(" ERROR "))),
        "{stdout}"
    );
    // The seed Service's chain: iptables and nftables mode hash its name differently.
    let chain = match mode {
        Mode::Ipvs => unreachable!("IPVS mode is tested in tests/ipvs.rs"),
        Mode::Userspace => {
            "-A KUBE-PORTALS-CONTAINER -d 10.96.138.71/32 -p tcp -m comment --comment \"default/nginx-svc\" -m tcp --dport 8080 -j REDIRECT --to-ports"
        }
        Mode::Iptables => "-A KUBE-SVC-HL5LMXD5JFHQZ6LN",
        Mode::Nftables => "chain service-O4TPQO6D-default/nginx-svc/tcp/",
    };
    assert!(
        stdout.contains(chain),
        "--show-rules prints the rules:\n{stdout}"
    );
    let after = kp_testkit::netns::list_namespaces().unwrap();
    let leaked: Vec<_> = after
        .iter()
        .filter(|n| !before.contains(n) && n.starts_with(&format!("kp{}", out_pid_hint(&stdout))))
        .collect();
    assert!(leaked.is_empty(), "namespaces left behind: {leaked:?}");
}

/// The `kp<pid>` prefix the sandbox printed (its namespaces' names).
fn out_pid_hint(stdout: &str) -> String {
    stdout
        .lines()
        .find_map(|l| {
            l.split_whitespace()
                .find(|w| w.starts_with("kp") && w.contains('x'))
        })
        .and_then(|w| w.split('x').next())
        .map(|p| p.trim_start_matches("kp").to_string())
        .unwrap_or_default()
}

#[test]
fn the_sandbox_reports_both_backends_and_cleans_up_iptables() {
    the_sandbox_reports_both_backends_and_cleans_up(Mode::Iptables);
}

#[test]
fn the_sandbox_reports_both_backends_and_cleans_up_nftables() {
    the_sandbox_reports_both_backends_and_cleans_up(Mode::Nftables);
}

/// Userspace mode: the README's `sandbox --proxy-mode userspace` shows round robin through
/// the proxy sockets.
#[test]
fn the_sandbox_reports_both_backends_and_cleans_up_userspace() {
    the_sandbox_reports_both_backends_and_cleans_up(Mode::Userspace);
}

/// Namespaces named with the sandbox's `kp<pid>x` prefix that still exist.
fn sandbox_namespaces_left(pid: u32) -> Vec<String> {
    let prefix = format!("kp{pid}x");
    kp_testkit::netns::list_namespaces()
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

/// A sandbox over the seed plus a Service without endpoints (`default/empty`, a REJECT):
/// every probe of it is answered "refused" at once (the node's ICMP rate limits are lifted,
/// and an address that keeps failing is given up), so `-n 200` takes seconds, not the
/// minutes of one SYN retransmission per rate-limited ICMP error.
#[test]
fn the_sandbox_reports_a_service_without_endpoints_as_refused_quickly() {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let manifest = seed_and_extra_manifest(dir.path());
    let started = Instant::now();
    let out = Command::new(BIN)
        .args(["sandbox", "--manifests", &manifest, "-n", "200"])
        .output()
        .unwrap();
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(took < Duration::from_secs(20), "took {took:?}:\n{stdout}");
    for who in ["client", "node  "] {
        let line = stdout
            .lines()
            .find(|l| l.contains(&format!("{who} -> 10.96.0.99:80")))
            .unwrap_or_else(|| panic!("no {who} line for default/empty:\n{stdout}"));
        assert!(
            line.contains("refused") && !line.contains("timed out") && !line.contains("p50"),
            "{line}"
        );
        assert!(line.contains("of 200 requests"), "{line}");
    }
    // The Services with endpoints still get all their requests.
    let web = stdout
        .lines()
        .find(|l| l.contains("client -> 10.96.0.80:80"))
        .unwrap_or_else(|| panic!("no line for default/web:\n{stdout}"));
    assert!(
        web.contains(" 200 requests:") && !web.contains("refused"),
        "{web}"
    );
    assert!(stdout.contains("sandbox removed"), "{stdout}");
    assert!(stdout.contains("proxy log: /"), "{stdout}");
    assert!(sandbox_namespaces_left(out_pid(&stdout)).is_empty());
}

/// Services for the sandbox's words and its "not probed" lines: `guarded`, a LoadBalancer
/// open to 203.0.113.0/24 only (the client, 192.168.56.100, is outside it) with a
/// load-balancer IP outside the service CIDR, 192.0.2.50, and a second one with
/// `ipMode: Proxy`; `dual`, dual-stack; `headless`; `alias`, an ExternalName.
const SANDBOX_WORDS_SERVICES: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: guarded, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.50
  loadBalancerSourceRanges: [203.0.113.0/24]
  ports: [{port: 80, targetPort: 80, nodePort: 30050, protocol: TCP}]
status:
  loadBalancer:
    ingress: [{ip: 192.0.2.50}, {ip: 192.0.2.60, ipMode: Proxy}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: guarded-1
  namespace: default
  labels: {kubernetes.io/service-name: guarded}
addressType: IPv4
endpoints:
- addresses: [10.0.0.4]
  nodeName: k8s-master
ports: [{name: "", port: 80, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: dual, namespace: default}
spec:
  ipFamilyPolicy: PreferDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 10.96.0.40
  clusterIPs: [10.96.0.40, "fd00:10:96::40"]
  ports: [{port: 80, targetPort: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: dual-1
  namespace: default
  labels: {kubernetes.io/service-name: dual}
addressType: IPv4
endpoints:
- addresses: [10.0.1.2]
  nodeName: k8s-worker
ports: [{name: "", port: 80, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: headless, namespace: default}
spec:
  clusterIP: None
  ports: [{port: 80, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: alias, namespace: default}
spec:
  type: ExternalName
  externalName: example.com
"#;

/// A client outside loadBalancerSourceRanges reads `timed out` (a DROP) on every request, in
/// every mode alike: the node routes the load-balancer IP onward, as a node with a default
/// route does, so iptables mode's filter DROP is reached instead of the node's "no route"
/// ICMP error (which read `unreachable` on most requests before). The sandbox also names
/// what it does not probe, with the reason, and prints its legend.
fn the_sandbox_reports_a_client_outside_source_ranges_alike(mode: Mode) {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let manifest = write(
        dir.path(),
        "cluster.yaml",
        &format!("{SEED_CLUSTER}\n---\n{SANDBOX_WORDS_SERVICES}"),
    );
    let mut args = vec!["sandbox".to_string(), "--manifests".to_string()];
    args.push(manifest.to_str().unwrap().to_string());
    args.extend(mode.flags().iter().map(|s| s.to_string()));
    args.extend(["-n".to_string(), "20".to_string()]);
    let out = Command::new(BIN).args(&args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |needle: &str| {
        stdout
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?}:\n{stdout}"))
            .to_string()
    };
    let lb = line("client -> 192.0.2.50:80 (load balancer)");
    assert!(
        lb.ends_with("(the first 10 all failed; the rest were not sent): timed out 10"),
        "{lb}"
    );
    // The rest of the Service works: its ClusterIP from the client.
    let vip = line("client -> 10.96.0.50:80");
    assert!(vip.contains(" 20 requests: 10.0.0.4:80"), "{vip}");
    assert!(
        line("not probed: 192.0.2.60").contains("ipMode: Proxy"),
        "{stdout}"
    );
    assert!(
        line("not probed: fd00:10:96::40").contains("IPv6 ClusterIP of a dual-stack Service"),
        "{stdout}"
    );
    assert!(line("client -> 10.96.0.40:80").contains(" 20 requests: 10.0.1.2:80"));
    assert!(line("default/headless  not probed: headless").contains("clusterIP: None"));
    assert!(line("default/alias  not probed: type ExternalName").contains("DNS alias"));
    // The legend names the words.
    assert!(line("  timed out: no answer within 1 s: a DROP rule").starts_with("          "));
    assert!(line("  not probed: …: a Service or address the sandbox does not").starts_with("  "));
    assert!(sandbox_namespaces_left(out_pid(&stdout)).is_empty());
}

#[test]
fn the_sandbox_reports_a_client_outside_source_ranges_alike_iptables() {
    the_sandbox_reports_a_client_outside_source_ranges_alike(Mode::Iptables);
}

#[test]
fn the_sandbox_reports_a_client_outside_source_ranges_alike_nftables() {
    the_sandbox_reports_a_client_outside_source_ranges_alike(Mode::Nftables);
}

#[test]
fn the_sandbox_reports_a_client_outside_source_ranges_alike_userspace() {
    the_sandbox_reports_a_client_outside_source_ranges_alike(Mode::Userspace);
}

/// `sandbox --node` with a name the bundled example lacks names the example and its Nodes, not
/// the temporary copy the sandbox reads (gone when it exits).
#[test]
fn the_sandbox_names_the_bundled_example_for_an_unknown_node() {
    if !require_root() {
        return;
    }
    let out = Command::new(BIN)
        .args(["sandbox", "--node", "nosuchnode"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--node nosuchnode: no Node of that name in the bundled example (examples/seed-nginx/cluster.yaml)")
            && stderr.contains("k8s-master")
            && !stderr.contains("kube-proxy-rs-sandbox-"),
        "{stderr}"
    );
}

/// The sandbox's pid, from the `kp<pid>x…` namespace names it printed.
fn out_pid(stdout: &str) -> u32 {
    out_pid_hint(stdout)
        .parse()
        .expect("namespace names printed")
}

/// Waits (up to 30 s) until the file holds `needle`; returns its text.
fn wait_for_text(path: &std::path::Path, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) || Instant::now() > deadline {
            return text;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends SIGINT to `child` and waits for it; returns how long it took to exit.
fn interrupt(child: &mut std::process::Child) -> Duration {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let sent = Instant::now();
    let deadline = sent + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the sandbox did not exit within 30 s of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    sent.elapsed()
}

/// Ctrl-C while the sandbox probes an address that drops every request (a NodePort with
/// `externalTrafficPolicy: Local` and no local endpoint): it exits within seconds, removes
/// its namespaces and says so.
#[test]
fn the_sandbox_exits_quickly_on_sigint_while_probing_and_says_it_cleaned_up() {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let manifest = write(
        dir.path(),
        "cluster.yaml",
        r#"
apiVersion: v1
kind: Node
metadata: {name: k8s-master}
status:
  addresses: [{type: InternalIP, address: 192.168.56.10}]
---
apiVersion: v1
kind: Service
metadata: {name: local, namespace: default}
spec:
  type: NodePort
  externalTrafficPolicy: Local
  clusterIP: 10.96.0.81
  ports: [{port: 80, targetPort: 80, nodePort: 30081, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: local-1
  namespace: default
  labels: {kubernetes.io/service-name: local}
addressType: IPv4
endpoints:
- addresses: [10.0.1.2]
  nodeName: k8s-worker
ports: [{name: "", port: 80, protocol: TCP}]
"#,
    );
    let out_path = dir.path().join("stdout");
    let mut child = Command::new(BIN)
        .args([
            "sandbox",
            "--manifests",
            manifest.to_str().unwrap(),
            "-n",
            "50",
        ])
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The ClusterIP lines come first; then it probes the NodePort, which times out.
    let text = wait_for_text(&out_path, "node   -> 10.96.0.81:80");
    assert!(text.contains("node   -> 10.96.0.81:80"), "{text}");
    std::thread::sleep(Duration::from_millis(1500));
    let took = interrupt(&mut child);
    let stdout = std::fs::read_to_string(&out_path).unwrap();
    assert!(
        took < Duration::from_secs(8),
        "took {took:?} to exit:\n{stdout}"
    );
    assert!(stdout.contains("sandbox removed"), "{stdout}");
    assert!(sandbox_namespaces_left(child.id()).is_empty());
}

/// `--keep`: a live manifest error of the proxy appears on the sandbox's output (not only in
/// its log file, whose path it prints), and Ctrl-C removes everything and says so.
#[test]
fn the_sandbox_keep_shows_the_proxys_errors_and_cleans_up_on_sigint() {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let manifest = write(dir.path(), "cluster.yaml", SEED_CLUSTER);
    let out_path = dir.path().join("stdout");
    let mut child = Command::new(BIN)
        .args(["sandbox", "--manifests", manifest.to_str().unwrap()])
        .args(["-n", "5", "--keep"])
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let text = wait_for_text(&out_path, "Ctrl-C removes it");
    assert!(text.contains("Ctrl-C removes it"), "{text}");
    assert!(text.contains("kube-proxy-rs.log"), "{text}");
    write(
        dir.path(),
        "cluster.yaml",
        &SEED_CLUSTER.replace("10.96.138.71", "10.96.0.999"),
    );
    let text = wait_for_text(&out_path, "10.96.0.999");
    let line = text
        .lines()
        .find(|l| l.contains("10.96.0.999"))
        .unwrap_or_else(|| panic!("the proxy's error is not shown:\n{text}"));
    assert!(
        line.starts_with("proxy log: ") && line.contains("ERROR"),
        "{line}"
    );
    let took = interrupt(&mut child);
    let stdout = std::fs::read_to_string(&out_path).unwrap();
    assert!(
        took < Duration::from_secs(8),
        "took {took:?} to exit:\n{stdout}"
    );
    assert!(stdout.contains("warning/error line"), "{stdout}");
    assert!(stdout.contains("sandbox removed"), "{stdout}");
    assert!(sandbox_namespaces_left(child.id()).is_empty());
}

/// `--proxy-mode ipvs` on a kernel without IPVS (this one; the qemu guest tests have it):
/// the daemon logs what is missing, runs iptables mode (the Service works), and says so in
/// /proxyMode and `kube_proxy_rs_proxy_mode_fallback`; it does not exit.
#[test]
fn ipvs_mode_without_ipvs_falls_back_to_iptables_mode() {
    if !require_root() {
        return;
    }
    let (topology, _servers) = seed_topology();
    let node = topology.node();
    let dir = tempdir();
    let manifest = seed_and_extra_manifest(dir.path());
    let mut args = vec![
        "--proxy-mode=ipvs",
        "--manifests",
        manifest.as_str(),
        "--metrics-bind-address=127.0.0.1:10249",
        "--healthz-bind-address=127.0.0.1:10256",
    ];
    args.extend(NODE_ARGS);
    let has_ipvs = kp_testkit::vm::host_has_ipvs();
    // An ipset an earlier IPVS-mode run left: a fallback keeps it.
    node.run("ipset", ["create", "KUBE-CLUSTER-IP", "hash:ip,port"])
        .unwrap();
    // `--proxy-mode=ipvs` in `args` comes after the iptables default.
    let mut proxy = Daemon::start(Mode::Iptables, node, dir.path(), &args, None);
    let get = |path: &str| {
        node.run(
            "curl",
            [
                "-s",
                "--max-time",
                "5",
                &format!("http://127.0.0.1:10249{path}"),
            ],
        )
        .unwrap_or_default()
    };
    proxy.wait_until("/proxyMode answered", || !get("/proxyMode").is_empty());
    let running = get("/proxyMode");
    let metrics = get("/metrics");
    if has_ipvs {
        assert_eq!(running.trim(), "ipvs", "{}", proxy.log());
        assert!(
            !metrics.contains("kube_proxy_rs_proxy_mode_fallback{"),
            "{metrics}"
        );
        return;
    }
    proxy.wait_programmed(node);
    assert_eq!(running.trim(), "iptables", "{}", proxy.log());
    assert!(
        metrics.contains(
            "kube_proxy_rs_proxy_mode_fallback{requested=\"ipvs\",running=\"iptables\"} 1"
        ),
        "{metrics}"
    );
    let log = proxy.log();
    assert!(
        log.contains("IPVS mode cannot run on this node: falling back to iptables mode")
            && log.contains("the kernel's IPVS (ip_vs)"),
        "{log}"
    );
    assert!(log.contains("left in place"), "{log}");
    assert!(
        node.run("ipset", ["list", "-n"])
            .unwrap_or_default()
            .contains("KUBE-CLUSTER-IP"),
        "the fallback removed IPVS mode's ipset"
    );
    // iptables mode serves the seed's Service.
    let c = counts(http_get_many(
        topology.client(),
        "10.96.138.71:8080".parse().unwrap(),
        10,
        Duration::from_secs(2),
    ));
    assert_eq!(c.values().sum::<usize>(), 10);
    assert!(c.keys().all(|k| !k.starts_with("error")), "{c:?}");
    assert!(proxy.is_running());
}

/// Runs `cmd` (stdout and stderr captured) and waits up to `limit` for it; kills it (and so,
/// through its death signal, any qemu it started) and panics when it takes longer. Returns
/// the output and the child's pid.
fn output_within(cmd: &mut Command, limit: Duration) -> (std::process::Output, u32) {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let out = child.wait_with_output();
        let _ = tx.send(());
        out
    });
    if rx.recv_timeout(limit).is_err() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let out = waiter.join().unwrap().unwrap();
        panic!(
            "still running after {limit:?}:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    (waiter.join().unwrap().unwrap(), pid)
}

/// The qemu processes the sandbox with pid `pid` started that still run (their run
/// directory, `kp-vm-<pid>-<n>`, is on their command line).
fn qemu_left_by(pid: u32) -> Vec<String> {
    let needle = format!("kp-vm-{pid}-");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("qemu") && c.contains(&needle))
        .collect()
}

/// The README's IPVS command exactly as a newcomer types it, `kube-proxy-rs sandbox
/// --proxy-mode ipvs` (with `-n 20`): on this kernel (no IPVS) the sandbox says it runs in a
/// qemu guest and does; both backends answer in turn from the client and from the node, the
/// virtual server is listed with kube-ipvs0 holding the ClusterIP, the ClusterIP answers
/// ping, everything is removed, and no qemu is left. On a kernel with IPVS the same command
/// runs on the host.
#[test]
fn the_sandbox_in_ipvs_mode_runs_the_readme_command_end_to_end() {
    if !require_root() {
        return;
    }
    let started = Instant::now();
    let mut cmd = Command::new(BIN);
    cmd.args(["sandbox", "--proxy-mode", "ipvs", "-n", "20"]);
    let (out, pid) = output_within(&mut cmd, Duration::from_secs(300));
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let guest = !kp_testkit::vm::host_has_ipvs();
    if guest {
        let first = stdout.lines().next().unwrap_or_default();
        assert!(
            first.contains("this kernel has no IPVS")
                && first.contains("qemu guest")
                && first.contains("about 10 s"),
            "the first line says where it runs: {first}"
        );
        assert!(stdout.contains("qemu guest: booted in "), "{stdout}");
    }
    assert!(stdout.contains("--proxy-mode ipvs"), "{stdout}");
    for who in ["client", "node  "] {
        let line = stdout
            .lines()
            .find(|l| l.contains(&format!("{who} -> 10.96.138.71:8080")))
            .unwrap_or_else(|| panic!("no {who} line:\n{stdout}"));
        // Round robin: 10 each, give or take a retried connection.
        for backend in [
            "10.0.0.4:80 (nodeName k8s-master) ",
            "10.0.1.2:80 (nodeName k8s-worker) ",
        ] {
            let n: usize = line
                .split(backend)
                .nth(1)
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{backend} did not answer: {line}"));
            assert!((8..=12).contains(&n), "unbalanced: {line}");
        }
        assert!(line.contains(" 20 requests: "), "{line}");
    }
    assert!(
        stdout.contains(
            "  ipvs: TCP 10.96.138.71:8080 rr -> 10.0.0.4:80 (w 1), 10.0.1.2:80 (w 1); \
             kube-ipvs0 holds 10.96.138.71"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("  ping 10.96.138.71: answered ("),
        "{stdout}"
    );
    assert!(
        stdout.contains("sandbox removed: proxy stopped, 5 namespaces deleted"),
        "{stdout}"
    );
    assert!(
        !stdout.lines().any(|l| l.starts_with("proxy log:")
            && (l.contains(" WARN ") || l.contains(" ERROR "))),
        "{stdout}"
    );
    let left = qemu_left_by(pid);
    assert!(left.is_empty(), "qemu left behind: {left:?}");
    eprintln!("the IPVS sandbox took {took:?}");
}

/// Ctrl-C (SIGINT to the sandbox alone, as a `kill -INT` would) while the IPVS sandbox runs
/// in the qemu guest: it stops qemu at once, says everything is gone, and no qemu is left.
/// `--keep` is refused there, with the reason. On a kernel with IPVS the sandbox runs on the
/// host and removes its namespaces instead.
#[test]
fn the_sandbox_in_ipvs_mode_stops_qemu_on_sigint_and_refuses_keep_in_the_guest() {
    if !require_root() {
        return;
    }
    let guest = !kp_testkit::vm::host_has_ipvs();
    if guest {
        let out = Command::new(BIN)
            .args(["sandbox", "--proxy-mode", "ipvs", "--keep"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            stderr.contains("--keep does not work with --proxy-mode ipvs")
                && stderr.contains("qemu guest"),
            "{stderr}"
        );
    }
    let dir = tempdir();
    let out_path = dir.path().join("stdout");
    let mut child = Reaped(
        Command::new(BIN)
            .args(["sandbox", "--proxy-mode", "ipvs", "-n", "200"])
            .stdout(std::fs::File::create(&out_path).unwrap())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    // Interrupted once it is busy (in the guest: booted and building the namespaces).
    let text = wait_for_text_within(&out_path, "building namespaces", Duration::from_secs(120));
    assert!(text.contains("building namespaces"), "{text}");
    if guest {
        assert!(!qemu_left_by(pid).is_empty(), "no qemu while it runs?");
    }
    let took = interrupt(&mut child.0);
    let stdout = std::fs::read_to_string(&out_path).unwrap();
    assert!(
        took < Duration::from_secs(8),
        "took {took:?} to exit:\n{stdout}"
    );
    assert!(stdout.contains("sandbox removed"), "{stdout}");
    if guest {
        assert!(stdout.contains("qemu stopped"), "{stdout}");
        let left = qemu_left_by(pid);
        assert!(left.is_empty(), "qemu left behind: {left:?}");
    } else {
        assert!(sandbox_namespaces_left(pid).is_empty());
    }
}

/// A child killed (SIGKILL: its qemu dies with it) and reaped on drop, e.g. when an assertion
/// fails before it exited.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Like [`wait_for_text`], with a limit of its own (the qemu guest boots first).
fn wait_for_text_within(path: &std::path::Path, needle: &str, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) || Instant::now() > deadline {
            return text;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A manifest rewritten in place (`(sleep 1.5; cat good.yaml) > dir/80-probe.yaml`: the shell
/// truncates the file at once and writes it 1.5 s later) takes no Service down: every
/// request during the rewrite is answered, and the log says why. A file emptied for good
/// (`: > file`) loses its Service after `--manifest-grace-period`.
#[test]
fn a_manifest_rewritten_in_place_keeps_its_service() {
    if !require_root() {
        return;
    }
    let (topology, _servers) = seed_topology();
    let node = topology.node();
    let dir = tempdir();
    let manifests = dir.path().join("m");
    std::fs::create_dir(&manifests).unwrap();
    write(&manifests, "10-seed.yaml", SEED_CLUSTER);
    let probe = write(&manifests, "80-probe.yaml", SEED_EXTRA_SERVICES);
    let mut args = vec![
        "--manifests",
        manifests.to_str().unwrap(),
        "--manifest-grace-period=3s",
    ];
    args.extend(NODE_ARGS);
    let mut proxy = Daemon::start(Mode::Iptables, node, dir.path(), &args, None);
    proxy.wait_nat_rules_contain(node, "default/web");
    let web: SocketAddr = "10.96.0.80:80".parse().unwrap();
    let writer = {
        let probe = probe.clone();
        std::thread::spawn(move || {
            let mut f = std::fs::File::create(&probe).unwrap();
            std::thread::sleep(Duration::from_millis(1500));
            use std::io::Write as _;
            f.write_all(SEED_EXTRA_SERVICES.as_bytes()).unwrap();
        })
    };
    // One request every 100 ms over 2.5 s: before, during and after the rewrite.
    let results: Vec<_> = (0..25)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            http_get(topology.client(), web, Duration::from_secs(2))
        })
        .collect();
    writer.join().unwrap();
    let c = counts(results);
    assert_eq!(
        answered(&c, "be0") + answered(&c, "be1"),
        25,
        "every request during the rewrite is answered: {c:?}\n{}",
        proxy.log()
    );
    assert!(proxy.log().contains("keeping its"), "{}", proxy.log());
    // Emptied for good: the Service goes after the grace period.
    std::fs::write(&probe, "").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(Mode::Iptables.nat_rules(node).contains("default/web"));
    proxy.wait_until(
        "the emptied file's Service was removed after the grace period",
        || !Mode::Iptables.nat_rules(node).contains("default/web"),
    );
    assert!(
        proxy.log().contains("after the grace period"),
        "{}",
        proxy.log()
    );
}

/// A file broken while the daemon runs keeps its Service, and still does after a restart:
/// the restarted daemon serves it from the file's last good copy in `--state-dir`, and the
/// error names the file, the copy and the Service.
#[test]
fn a_broken_manifest_is_served_from_its_last_good_copy_after_a_restart() {
    if !require_root() {
        return;
    }
    let (topology, _servers) = seed_topology();
    let node = topology.node();
    let dir = tempdir();
    let manifests = dir.path().join("m");
    std::fs::create_dir(&manifests).unwrap();
    write(&manifests, "10-seed.yaml", SEED_CLUSTER);
    let probe = write(&manifests, "80-probe.yaml", SEED_EXTRA_SERVICES);
    let state = format!("--state-dir={}", dir.path().join("state").display());
    let mut args = vec!["--manifests", manifests.to_str().unwrap(), state.as_str()];
    args.extend(NODE_ARGS);
    let web: SocketAddr = "10.96.0.80:80".parse().unwrap();
    let mut proxy = Daemon::start(Mode::Iptables, node, dir.path(), &args, None);
    proxy.wait_nat_rules_contain(node, "default/web");
    std::fs::write(&probe, "kind: Service\nthis: is: not: yaml\n").unwrap();
    proxy.wait_until("the broken file was reported", || {
        proxy_log(dir.path()).contains("80-probe.yaml")
    });
    drop(proxy);
    // A fresh node namespace has no rules: the restarted daemon's are all it has.
    node.run("iptables", ["-t", "nat", "-F"]).unwrap();
    let mut proxy = Daemon::start(Mode::Iptables, node, dir.path(), &args, None);
    proxy.wait_nat_rules_contain(node, "default/web");
    assert!(http_get(topology.client(), web, Duration::from_secs(2)).is_ok());
    let log = proxy.log();
    let line = log
        .lines()
        .find(|l| l.contains("80-probe.yaml") && l.contains("last good copy"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        line.contains("(Services: default/empty, default/web)"),
        "the error names the Services served from the copy: {line}"
    );
}

fn proxy_log(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.join("proxy.log")).unwrap_or_default()
}

/// Deleting a subdirectory of the manifest directory deletes its Services, and the log says
/// nothing alarming about it (notify's "Unable to remove the path from the watches: ...
/// WatchNotFound" is an expected double removal, filtered out).
#[test]
fn a_deleted_manifest_subdirectory_removes_its_services_quietly() {
    if !require_root() {
        return;
    }
    let (topology, _servers) = seed_topology();
    let node = topology.node();
    let dir = tempdir();
    let manifests = dir.path().join("m");
    let sub = manifests.join("team-a");
    std::fs::create_dir_all(&sub).unwrap();
    write(&manifests, "10-seed.yaml", SEED_CLUSTER);
    write(&sub, "80-probe.yaml", SEED_EXTRA_SERVICES);
    let mut args = vec!["--manifests", manifests.to_str().unwrap()];
    args.extend(NODE_ARGS);
    let mut proxy = Daemon::start(Mode::Iptables, node, dir.path(), &args, None);
    proxy.wait_nat_rules_contain(node, "default/web");
    std::fs::remove_dir_all(&sub).unwrap();
    proxy.wait_until("the deleted subdirectory's Service was removed", || {
        !Mode::Iptables.nat_rules(node).contains("default/web")
    });
    // A moment for any late log line.
    std::thread::sleep(Duration::from_millis(500));
    let log = proxy.log();
    assert!(
        !log.contains("WatchNotFound") && !log.contains("Unable to remove"),
        "{log}"
    );
    assert!(
        !log.lines()
            .any(|l| l.contains(" WARN ") && l.to_lowercase().contains("watch")),
        "nothing to warn about the watches:\n{log}"
    );
}
