//! End-to-end tests of `kube-proxy-rs --proxy-mode nftables` with the real kernel, each in
//! network namespaces it creates (root required; CI runs them as root). Nothing here touches
//! the root namespace.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kp_testkit::golden::SEED_CLUSTER;
use kp_testkit::netns::topology::FamilyPlan;
use kp_testkit::{
    ChildGuard, ClientError, HttpBackend, Netns, Topology, http_get, http_get_many, require_root,
    wait_for,
};

const BIN: &str = env!("CARGO_BIN_EXE_kube-proxy-rs");
const NFT_ARGS: [&str; 4] = [
    "--proxy-mode=nftables",
    "--hostname-override=k8s-master",
    "--cluster-cidr=10.0.0.0/16",
    "-v=2",
];

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("kp-nft-e2e-")
        .tempdir()
        .unwrap()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &p).unwrap();
    p
}

/// Runs the binary to completion inside `ns`; returns (success, stdout, stderr).
fn run_in(ns: &Netns, args: &[&str]) -> (bool, String, String) {
    let out = ns.command(BIN).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn ruleset(ns: &Netns) -> String {
    ns.run("nft", ["list", "ruleset"]).unwrap()
}

fn table(ns: &Netns, family: &str) -> Option<String> {
    ns.run("nft", ["list", "table", family, "kube-proxy"]).ok()
}

fn iptables_save(ns: &Netns) -> String {
    ns.run("iptables-save", Vec::<&str>::new())
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect()
}

fn programmed(ns: &Netns) -> bool {
    ns.run(
        "nft",
        ["list", "chain", "ip", "kube-proxy", "nat-postrouting"],
    )
    .is_ok_and(|s| s.contains("jump masquerading"))
}

/// The proxy running as a daemon in a namespace, with its log in a file.
struct Daemon {
    guard: ChildGuard,
    log: PathBuf,
}

impl Daemon {
    fn start(ns: &Netns, dir: &Path, args: &[&str], path_prefix: Option<&Path>) -> Daemon {
        let log = dir.join("proxy.log");
        let file = std::fs::File::create(&log).unwrap();
        let mut cmd = ns.command(BIN);
        cmd.args(NFT_ARGS)
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        if let Some(prefix) = path_prefix {
            let path = format!(
                "{}:{}",
                prefix.display(),
                std::env::var("PATH").unwrap_or_default()
            );
            cmd.env("PATH", path);
        }
        let guard = ChildGuard::spawn(&mut cmd, "kube-proxy-rs").unwrap();
        Daemon { guard, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_programmed(&mut self, ns: &Netns) {
        let log = self.log.clone();
        self.guard
            .wait_for(|| programmed(ns), Duration::from_secs(20))
            .unwrap_or_else(|e| {
                panic!(
                    "proxy did not program rules: {e}\n{}",
                    std::fs::read_to_string(log).unwrap_or_default()
                )
            });
    }
}

/// A NodePort Service on the seed's Pods and a Service without endpoints.
const EXTRA_SERVICES: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.80
  ports: [{port: 80, targetPort: 80, nodePort: 30080, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints:
- addresses: [10.0.0.4]
  nodeName: k8s-master
- addresses: [10.0.1.2]
  nodeName: k8s-worker
ports: [{name: "", port: 80, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: default}
spec:
  clusterIP: 10.96.0.99
  ports: [{port: 80, protocol: TCP}]
"#;

fn seed_topology() -> (Topology, Vec<HttpBackend>) {
    let plan = FamilyPlan {
        pod_cidr: "10.0.0.0/16".parse().unwrap(),
        ..FamilyPlan::ipv4()
    };
    let topology = Topology::builder()
        .family(plan)
        .backend(vec!["10.0.0.4".parse().unwrap()])
        .backend(vec!["10.0.1.2".parse().unwrap()])
        .build()
        .unwrap();
    let servers = topology.start_http(80).unwrap();
    (topology, servers)
}

fn counts(results: Vec<Result<kp_testkit::HttpReply, ClientError>>) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in results {
        let key = match r {
            Ok(reply) => reply.name().to_string(),
            Err(e) => format!("error: {e}"),
        };
        *out.entry(key).or_default() += 1;
    }
    out
}

#[test]
fn nft_real_traffic_cluster_ip_nodeport_endpoint_removal_and_reject() {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let (topology, servers) = seed_topology();
    let manifest_dir = dir.path().join("manifests");
    std::fs::create_dir(&manifest_dir).unwrap();
    write(&manifest_dir, "seed.yaml", SEED_CLUSTER);
    write(&manifest_dir, "extra.yaml", EXTRA_SERVICES);
    let node = topology.node();
    let client = topology.client();
    let mut proxy = Daemon::start(
        node,
        dir.path(),
        &["--manifests", manifest_dir.to_str().unwrap()],
        None,
    );
    proxy.wait_programmed(node);
    let log_path = proxy.log.clone();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    // nftables mode leaves iptables alone and never sets route_localnet.
    assert!(!iptables_save(node).contains("KUBE-"));
    assert_eq!(
        node.read_sysctl("net.ipv4.conf.all.route_localnet")
            .unwrap()
            .trim(),
        "0"
    );

    // ClusterIP from the client and from the node itself: both backends answer.
    let vip: SocketAddr = "10.96.138.71:8080".parse().unwrap();
    for (who, ns) in [("client", client), ("node", node)] {
        let c = counts(http_get_many(ns, vip, 100, Duration::from_secs(2)));
        assert_eq!(
            c.get("be0").copied().unwrap_or(0) + c.get("be1").copied().unwrap_or(0),
            100,
            "{who}: {c:?}\n{}",
            log()
        );
        assert!(
            c["be0"] >= 15 && c["be1"] >= 15,
            "{who}: not balanced: {c:?}"
        );
    }
    // Off-cluster sources are masqueraded to the node's address.
    let node_ip: IpAddr = "192.168.56.10".parse().unwrap();
    for s in &servers {
        assert!(
            s.peer_ips().iter().all(|ip| *ip == node_ip),
            "{}: {:?}",
            s.name(),
            s.peer_ips()
        );
    }

    // NodePort on the node's address (the default `primary` NodePort address).
    let node_port = SocketAddr::new(node_ip, 30080);
    let c = counts(http_get_many(client, node_port, 60, Duration::from_secs(2)));
    assert!(
        c.get("be0").is_some_and(|n| *n >= 5) && c.get("be1").is_some_and(|n| *n >= 5),
        "NodePort: {c:?}\n{}\n{}",
        log(),
        ruleset(node)
    );
    // Not on loopback: nftables mode does not serve localhost NodePorts.
    let lo = http_get(
        node,
        "127.0.0.1:30080".parse().unwrap(),
        Duration::from_millis(500),
    );
    assert!(lo.is_err(), "{lo:?}");

    // A Service without endpoints is refused at once, from the client and the node; so is
    // a port of a ClusterIP that no Service uses (cluster-ips-check).
    for (ns, target) in [
        (client, "10.96.0.99:80"),
        (node, "10.96.0.99:80"),
        (client, "10.96.138.71:9999"),
    ] {
        let start = Instant::now();
        let r = http_get(ns, target.parse().unwrap(), Duration::from_secs(3));
        assert!(
            matches!(r, Err(ClientError::Refused)),
            "expected refused from {} to {target}, got {r:?}\n{}",
            ns.name(),
            ruleset(node)
        );
        assert!(
            start.elapsed() < Duration::from_millis(500),
            "refusal took {:?}",
            start.elapsed()
        );
    }

    // Remove 10.0.1.2 from the seed's EndpointSlice while the daemon runs: within 2 s no new
    // connection reaches it.
    let without = SEED_CLUSTER.replace(
        "- addresses:\n  - 10.0.1.2\n  conditions:\n    ready: true\n    serving: true\n    terminating: false\n  nodeName: k8s-worker\n  targetRef:\n    kind: Pod\n    name: nginx-deployment-54bcfc567b-6r7wm\n    namespace: default\n",
        "",
    );
    assert_ne!(without, SEED_CLUSTER, "the edit must remove the endpoint");
    let changed_at = Instant::now();
    write(&manifest_dir, "seed.yaml", &without);
    let mut gone_after = None;
    while changed_at.elapsed() < Duration::from_secs(2) {
        let c = counts(http_get_many(client, vip, 10, Duration::from_secs(1)));
        if c.get("be0") == Some(&10) {
            gone_after = Some(changed_at.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let gone_after =
        gone_after.unwrap_or_else(|| panic!("endpoint still used 2 s after the change\n{}", log()));
    let c = counts(http_get_many(client, vip, 100, Duration::from_secs(2)));
    assert_eq!(c.get("be0"), Some(&100), "after removal: {c:?}");
    assert!(
        proxy.guard.try_wait().unwrap().is_none(),
        "the daemon keeps running"
    );
    eprintln!("endpoint removal took effect after {gone_after:?}");
    let log = log();
    assert!(log.contains("synced nftables rules"), "{log}");
    assert!(
        log.contains("full=false"),
        "the change was applied by a partial sync: {log}"
    );
    drop(servers);
}

#[test]
fn nft_resync_is_identical_and_dry_run_is_what_a_fresh_node_gets() {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let manifest = write(
        dir.path(),
        "cluster.yaml",
        &format!("{SEED_CLUSTER}\n---\n{EXTRA_SERVICES}"),
    );
    let m = manifest.to_str().unwrap();
    let ns = Netns::new("nft-once").unwrap();
    let mut once = NFT_ARGS.to_vec();
    once.extend(["--manifests", m, "--once"]);
    let (ok, _, err) = run_in(&ns, &once);
    assert!(ok, "{err}");
    let first = ruleset(&ns);
    assert!(first.contains("table ip kube-proxy") && first.contains("table ip6 kube-proxy"));
    // A restart resyncs (full) to the very same ruleset.
    let (ok, _, err) = run_in(&ns, &once);
    assert!(ok, "{err}");
    assert_eq!(ruleset(&ns), first, "a resync must not change the ruleset");

    // --dry-run prints exactly what a fresh node gets: applying its IPv4 section by hand
    // gives the same table as --once did.
    let mut dry = NFT_ARGS.to_vec();
    dry.extend(["--manifests", m, "--dry-run"]);
    let fresh = Netns::new("nft-dry").unwrap();
    let (ok, out, err) = run_in(&fresh, &dry);
    assert!(ok, "{err}");
    assert!(
        fresh.run("nft", ["list", "ruleset"]).unwrap().is_empty(),
        "--dry-run changes nothing"
    );
    let v4 = out
        .split("# IPv6: nft -f input")
        .next()
        .unwrap()
        .strip_prefix("# IPv4: nft -f input\n")
        .unwrap_or_else(|| panic!("{out}"));
    let mut apply = fresh.command("nft");
    apply.args(["-f", "-"]).stdin(Stdio::piped());
    let mut child = apply.spawn().unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), v4.as_bytes()).unwrap();
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    assert_eq!(
        kp_netfilter::canonical_listing(&table(&fresh, "ip").unwrap()),
        kp_netfilter::canonical_listing(&table(&ns, "ip").unwrap())
    );
}

#[test]
fn nft_cleanup_and_switching_modes_without_a_reboot() {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let manifest = write(dir.path(), "cluster.yaml", SEED_CLUSTER);
    let m = manifest.to_str().unwrap();
    let ns = Netns::new("nft-switch").unwrap();
    // Rules of other software, which must survive everything.
    let mut other = ns.command("nft");
    other.args(["-f", "-"]).stdin(Stdio::piped());
    let mut child = other.spawn().unwrap();
    std::io::Write::write_all(
        child.stdin.as_mut().unwrap(),
        b"add table inet other\nadd chain inet other input { type filter hook input priority 0 ; }\nadd rule inet other input tcp dport 22 accept\n",
    )
    .unwrap();
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    let common = [
        "--hostname-override=k8s-master",
        "--cluster-cidr=10.0.0.0/16",
        "--manifests",
        m,
        "--once",
    ];
    let iptables_once = |ns: &Netns| {
        let mut a = vec!["--proxy-mode=iptables"];
        a.extend(common);
        let (ok, _, err) = run_in(ns, &a);
        assert!(ok, "{err}");
    };
    let nftables_once = |ns: &Netns| {
        let mut a = vec!["--proxy-mode=nftables"];
        a.extend(common);
        let (ok, _, err) = run_in(ns, &a);
        assert!(ok, "{err}");
        err
    };

    // iptables → nftables: the KUBE- chains go away.
    iptables_once(&ns);
    assert!(iptables_save(&ns).contains("-A KUBE-SERVICES"));
    let log = nftables_once(&ns);
    assert!(
        !iptables_save(&ns).contains("KUBE-"),
        "{}\n{log}",
        iptables_save(&ns)
    );
    assert!(table(&ns, "ip").is_some() && table(&ns, "ip6").is_some());
    assert!(log.contains("removed the iptables-mode rules"), "{log}");

    // nftables → iptables: both kube-proxy tables go away.
    iptables_once(&ns);
    assert!(table(&ns, "ip").is_none() && table(&ns, "ip6").is_none());
    assert!(iptables_save(&ns).contains("-A KUBE-SERVICES"));

    // --cleanup removes the rules of both modes.
    nftables_once(&ns);
    let (ok, _, err) = run_in(&ns, &["--cleanup"]);
    assert!(ok, "{err}");
    assert!(table(&ns, "ip").is_none() && table(&ns, "ip6").is_none());
    assert!(!iptables_save(&ns).contains("KUBE-"));
    let (ok, _, err) = run_in(&ns, &["--cleanup"]);
    assert!(ok, "a second cleanup is a no-op: {err}");
    assert!(
        ruleset(&ns).contains("tcp dport 22 accept"),
        "{}",
        ruleset(&ns)
    );
}

fn which(program: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(program))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| panic!("{program} not found"))
}

#[test]
fn nft_a_failed_transaction_keeps_the_rules_and_is_retried() {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    // An nft that rejects `nft -f` while a flag file exists, as a kernel error would.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let flag = dir.path().join("fail");
    let script = format!(
        "#!/bin/sh\nif [ -e {flag} ] && [ \"$1\" = \"-f\" ]; then cat >/dev/null; echo 'Error: injected failure' >&2; exit 1; fi\nexec {real} \"$@\"\n",
        flag = flag.display(),
        real = which("nft").display()
    );
    std::fs::write(bin.join("nft"), script).unwrap();
    Command::new("chmod")
        .arg("+x")
        .arg(bin.join("nft"))
        .status()
        .unwrap();
    let manifest = write(dir.path(), "cluster.yaml", SEED_CLUSTER);
    let ns = Netns::new("nft-retry").unwrap();
    let mut proxy = Daemon::start(
        &ns,
        dir.path(),
        &[
            "--manifests",
            manifest.to_str().unwrap(),
            "--iptables-sync-period=1s",
        ],
        Some(&bin),
    );
    proxy.wait_programmed(&ns);
    let before = ruleset(&ns);
    assert!(before.contains("10.0.1.2:80"));

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
        ruleset(&ns),
        before,
        "a failed sync must leave the kernel's rules in place"
    );
    assert!(proxy.guard.try_wait().unwrap().is_none(), "not fatal");

    std::fs::remove_file(&flag).unwrap();
    wait_for(
        || ruleset(&ns).contains("10.0.0.5:80"),
        Duration::from_secs(5),
    )
    .unwrap_or_else(|_| panic!("the retry did not apply the change\n{}", proxy.log()));
    assert!(!ruleset(&ns).contains("10.0.1.2:80"));
    let log = proxy.log();
    let retry = log
        .lines()
        .rev()
        .find(|l| l.contains("synced nftables rules") && l.contains("family=IPv4"))
        .unwrap_or_default();
    assert!(
        retry.contains("full=true"),
        "the retry is a full sync: {retry}"
    );
}

#[test]
fn nft_sandbox_reports_both_backends() {
    if !require_root() {
        return;
    }
    let out = Command::new(BIN)
        .args([
            "sandbox",
            "--proxy-mode",
            "nftables",
            "-n",
            "40",
            "--show-rules",
        ])
        .output()
        .unwrap();
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
    }
    assert!(stdout.contains("--proxy-mode nftables"));
    assert!(
        stdout.contains("chain service-O4TPQO6D-default/nginx-svc/tcp/"),
        "--show-rules prints the nftables ruleset:\n{stdout}"
    );
}
