//! The harness shared by the end-to-end tests of the binary: running it to completion
//! ([`run`], [`run_in`]) for the CLI tests (`config_cli.rs`, `trace_cli.rs`,
//! `upstream_flags.rs`), and for the network-namespace tests (`netns.rs`, `features.rs`) the
//! proxy mode under test and the flags it implies, the daemon guard with its log and a
//! mode-aware readiness wait, the seed and feature topologies with their manifests, and
//! request tallies.
//!
//! Everything runs inside namespaces the tests create; nothing here touches the root namespace.

// Each test crate uses a part of the harness.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use kp_testkit::netns::topology::FamilyPlan;
use kp_testkit::{
    ChildGuard, ClientError, HttpBackend, HttpReply, Netns, Topology, UdpEchoBackend,
};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_kube-proxy-rs");

/// The node every IPv4 test programs: `k8s-master` with the Pods in 10.0.0.0/16, logging
/// each sync (`-v=2`).
pub const NODE_ARGS: [&str; 3] = [
    "--hostname-override=k8s-master",
    "--cluster-cidr=10.0.0.0/16",
    "-v=2",
];

/// How long a daemon may take to program its first rules.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// The same under qemu's software emulation, where everything is 10-30 times slower.
const GUEST_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The proxy mode a test runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `--proxy-mode iptables`, the binary's default.
    Iptables,
    /// `--proxy-mode nftables`.
    Nftables,
    /// `--proxy-mode ipvs` (run in the qemu guest where the host kernel has no IPVS).
    Ipvs,
    /// `--proxy-mode userspace` (its own tests are in `tests/userspace.rs`).
    Userspace,
}

impl Mode {
    /// The name `--proxy-mode` takes.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Iptables => "iptables",
            Mode::Nftables => "nftables",
            Mode::Ipvs => "ipvs",
            Mode::Userspace => "userspace",
        }
    }

    /// The flags that select this mode. iptables mode is the default and passes none, so the
    /// iptables tests also pin the default.
    pub fn flags(self) -> &'static [&'static str] {
        match self {
            Mode::Iptables => &[],
            Mode::Nftables => &["--proxy-mode=nftables"],
            Mode::Ipvs => &["--proxy-mode=ipvs"],
            Mode::Userspace => &["--proxy-mode=userspace"],
        }
    }

    /// The mode's flags followed by `rest`.
    pub fn args<'a>(self, rest: &[&'a str]) -> Vec<&'a str> {
        let mut args = self.flags().to_vec();
        args.extend_from_slice(rest);
        args
    }

    /// Everything this mode's tool prints for the namespace: `iptables-save` without its
    /// comment lines, or `nft list ruleset`.
    pub fn ruleset(self, ns: &Netns) -> String {
        match self {
            Mode::Iptables | Mode::Userspace => save(ns, "iptables-save"),
            Mode::Nftables => ns.run("nft", ["list", "ruleset"]).unwrap(),
            Mode::Ipvs => format!(
                "{}{}{}",
                save(ns, "iptables-save"),
                ns.run("ipset", ["save"]).unwrap_or_default(),
                ns.run("ipvsadm", ["-S", "-n"]).unwrap_or_default()
            ),
        }
    }

    /// The IPv4 NAT rules the proxy programs (empty before its first sync):
    /// `iptables-save -t nat`, or `nft list table ip kube-proxy`.
    pub fn nat_rules(self, ns: &Netns) -> String {
        match self {
            Mode::Iptables | Mode::Userspace => ns.run("iptables-save", ["-t", "nat"]),
            Mode::Nftables => ns.run("nft", ["list", "table", "ip", "kube-proxy"]),
            // The virtual servers stand in for the NAT rules.
            Mode::Ipvs => ns.run("ipvsadm", ["-S", "-n"]),
        }
        .unwrap_or_default()
    }

    /// Whether the first sync has programmed both families: the postrouting chain jumps to
    /// masquerading in `iptables-save -t nat` and `ip6tables-save -t nat`, or in the `ip` and
    /// `ip6` `kube-proxy` tables. (Each family is a transaction of its own, IPv4 first.)
    pub fn programmed(self, ns: &Netns) -> bool {
        match self {
            Mode::Iptables => ["iptables-save", "ip6tables-save"].iter().all(|save| {
                ns.run(save, ["-t", "nat"])
                    .is_ok_and(|s| s.contains("-A KUBE-POSTROUTING"))
            }),
            Mode::Nftables => ["ip", "ip6"].iter().all(|family| {
                nft_table(ns, family).is_some_and(|s| s.contains("jump masquerading"))
            }),
            Mode::Userspace => ["iptables-save", "ip6tables-save"].iter().all(|save| {
                ns.run(save, ["-t", "nat"])
                    .is_ok_and(|s| s.contains(":KUBE-PORTALS-CONTAINER"))
            }),
            Mode::Ipvs => {
                ["iptables-save", "ip6tables-save"].iter().all(|save| {
                    ns.run(save, ["-t", "filter"])
                        .is_ok_and(|s| s.contains("-A KUBE-IPVS-FILTER"))
                }) && ns
                    .run("ipvsadm", ["-S", "-n"])
                    .is_ok_and(|s| s.contains("-A "))
            }
        }
    }

    /// How an IPv4 endpoint `ip:port` a Service DNATs to shows in [`Mode::ruleset`]:
    /// `--to-destination 10.0.1.2:80`, `-r 10.0.1.2:80`, or an element of nftables mode's
    /// `dnat ip to numgen random mod N map { 0 : 10.0.1.2 . 80, … }`.
    pub fn endpoint_in_rules(self, endpoint: &str) -> String {
        match (self, endpoint.rsplit_once(':')) {
            (Mode::Nftables, Some((ip, port))) => format!("{ip} . {port}"),
            _ => endpoint.to_string(),
        }
    }

    /// The log message of a successful sync (with `-v=2`).
    pub fn synced_message(self) -> &'static str {
        match self {
            Mode::Iptables => "synced iptables rules",
            Mode::Nftables => "synced nftables rules",
            Mode::Ipvs => "synced IPVS rules",
            Mode::Userspace => "synced userspace portals",
        }
    }
}

/// A temporary directory for one test's manifests, logs and fake programs.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("kp-e2e-")
        .tempdir()
        .unwrap()
}

/// Writes `dir/name` through a temporary name and a rename, as editors and ConfigMap
/// updates do, so that a watching daemon never reads half a file.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &p).unwrap();
    p
}

/// The bundled seed cluster's manifest (`examples/seed-nginx/cluster.yaml`).
pub const SEED_MANIFEST: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../examples/seed-nginx/cluster.yaml"
);

/// Runs `cmd` to completion; returns (exit code, stdout, stderr).
fn outcome(cmd: &mut std::process::Command) -> (Option<i32>, String, String) {
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// Runs the binary to completion inside `ns`; returns (success, stdout, stderr).
pub fn run_in(ns: &Netns, args: &[&str]) -> (bool, String, String) {
    let (code, out, err) = outcome(ns.command(BIN).args(args));
    (code == Some(0), out, err)
}

/// Runs the binary to completion in the test's own namespace (for commands that touch no
/// kernel state: `--help`, `--dry-run`, `--write-config-to`, `trace --rules`); returns
/// (success, stdout, stderr).
pub fn run(args: &[&str]) -> (bool, String, String) {
    let (code, out, err) = run_code(args);
    (code == Some(0), out, err)
}

/// As [`run`], with the exit code (`None` when a signal ended it).
pub fn run_code(args: &[&str]) -> (Option<i32>, String, String) {
    outcome(std::process::Command::new(BIN).args(args))
}

/// The output of an `iptables-save`-like `program` in `ns`, without its "# Generated by ...
/// on <date>" lines.
pub fn save(ns: &Netns, program: &str) -> String {
    ns.run(program, Vec::<&str>::new())
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// `nft list table <family> kube-proxy`, or `None` without that table.
pub fn nft_table(ns: &Netns, family: &str) -> Option<String> {
    ns.run("nft", ["list", "table", family, "kube-proxy"]).ok()
}

/// Runs `program args` in `ns` with `input` on its stdin; returns whether it succeeded.
pub fn feed(ns: &Netns, program: &str, args: &[&str], input: &str) -> bool {
    let mut cmd = ns.command(program);
    cmd.args(args).stdin(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), input.as_bytes()).unwrap();
    drop(child.stdin.take());
    child.wait().unwrap().success()
}

/// The path of `program` on this process's `PATH`.
pub fn which(program: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(program))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| panic!("{program} not found"))
}

/// The proxy running as a daemon in a namespace, with its log in a file; stopped on drop.
pub struct Daemon {
    /// The running process.
    pub guard: ChildGuard,
    log: PathBuf,
    mode: Mode,
}

impl Daemon {
    /// Starts `kube-proxy-rs <mode flags> <args>` in `ns`, logging to `dir/proxy.log`.
    /// `path_prefix` goes in front of `PATH` (fake programs that inject failures).
    pub fn start(
        mode: Mode,
        ns: &Netns,
        dir: &Path,
        args: &[&str],
        path_prefix: Option<&Path>,
    ) -> Daemon {
        Daemon::start_with_env(mode, ns, dir, args, path_prefix, &[])
    }

    /// [`Daemon::start`] with `env` added to the daemon's environment (a value of `None`
    /// removes the variable).
    pub fn start_with_env(
        mode: Mode,
        ns: &Netns,
        dir: &Path,
        args: &[&str],
        path_prefix: Option<&Path>,
        env: &[(&str, Option<&str>)],
    ) -> Daemon {
        let log = dir.join("proxy.log");
        let file = std::fs::File::create(&log).unwrap();
        let mut cmd = ns.command(BIN);
        let state = format!("--state-dir={}", dir.join("state").display());
        let mut args = args.to_vec();
        if !args.iter().any(|a| a.starts_with("--state-dir")) && !args.contains(&"sandbox") {
            args.push(&state);
        }
        cmd.args(mode.args(&args))
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
        for (key, value) in env {
            match value {
                Some(v) => cmd.env(key, v),
                None => cmd.env_remove(key),
            };
        }
        let guard = ChildGuard::spawn(&mut cmd, "kube-proxy-rs").unwrap();
        Daemon { guard, log, mode }
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the daemon still runs.
    pub fn is_running(&mut self) -> bool {
        self.guard.try_wait().unwrap().is_none()
    }

    /// Waits up to 20 s for `condition`; panics with the log if the daemon exits or the
    /// time runs out (`what` says what was awaited).
    pub fn wait_until(&mut self, what: &str, condition: impl FnMut() -> bool) {
        let timeout = if kp_testkit::vm::in_guest() {
            GUEST_READY_TIMEOUT
        } else {
            READY_TIMEOUT
        };
        if let Err(e) = self.guard.wait_for(condition, timeout) {
            panic!("{what}: {e}\n{}", self.log());
        }
    }

    /// Waits until the first sync has programmed `ns` (see [`Mode::programmed`]).
    pub fn wait_programmed(&mut self, ns: &Netns) {
        let mode = self.mode;
        self.wait_until("the proxy did not program its rules", || {
            mode.programmed(ns)
        });
    }

    /// Waits until the IPv4 NAT rules of `ns` mention `needle`.
    pub fn wait_nat_rules_contain(&mut self, ns: &Netns, needle: &str) {
        let mode = self.mode;
        self.wait_until(&format!("the rules never mentioned {needle}"), || {
            mode.nat_rules(ns).contains(needle)
        });
    }
}

/// The Pod network of both topologies: IPv4, Pods in 10.0.0.0/16, node 192.168.56.10,
/// client 192.168.56.100.
fn ipv4_plan() -> FamilyPlan {
    FamilyPlan {
        pod_cidr: "10.0.0.0/16".parse().unwrap(),
        ..FamilyPlan::ipv4()
    }
}

/// Node, client and two backend Pods at `be0` and `be1`.
fn two_backends(be0: &str, be1: &str) -> Topology {
    Topology::builder()
        .family(ipv4_plan())
        .backend(vec![be0.parse().unwrap()])
        .backend(vec![be1.parse().unwrap()])
        .build()
        .unwrap()
}

/// The seed topology (`SEED_CLUSTER`): node 192.168.56.10 (k8s-master), client
/// 192.168.56.100, backends be0 10.0.0.4 and be1 10.0.1.2 serving HTTP on port 80.
pub fn seed_topology() -> (Topology, Vec<HttpBackend>) {
    let topology = two_backends("10.0.0.4", "10.0.1.2");
    let servers = topology.start_http(80).unwrap();
    (topology, servers)
}

/// More Services on the seed's Pods for the traffic tests: `web`, NodePort 30080 on
/// ClusterIP 10.96.0.80, and `empty` (10.96.0.99), a Service without endpoints.
pub const SEED_EXTRA_SERVICES: &str = r#"
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

/// The feature topology: node `k8s-master` 192.168.56.10, client 192.168.56.100, backends
/// be0 10.0.1.4 (on this node) and be1 10.0.2.5 (nodeName node-b). No servers yet.
pub fn feature_topology() -> Topology {
    two_backends("10.0.1.4", "10.0.2.5")
}

/// A UDP echo server on `port` in every backend, answering with the backend's name.
pub fn start_udp_echo(topology: &Topology, port: u16) -> Vec<UdpEchoBackend> {
    topology
        .backends()
        .iter()
        .map(|b| {
            UdpEchoBackend::start(b.ns(), SocketAddr::new(b.ips()[0], port), b.name()).unwrap()
        })
        .collect()
}

/// The Node object of `k8s-master`, as a List item. nftables mode needs it: its default
/// `--nodeport-addresses primary` accepts NodePorts on the Node's first InternalIP only.
const FEATURE_NODE: &str = r#"
- apiVersion: v1
  kind: Node
  metadata: {name: k8s-master}
  status:
    addresses: [{type: InternalIP, address: 192.168.56.10}]"#;

/// The feature Services, as List items: `sticky` (ClientIP affinity, 10.96.0.90:80),
/// `local` (externalTrafficPolicy Local, NodePort 30070), `fw` (LoadBalancer 10.99.0.3
/// open to 192.168.56.100/32 only, NodePort 30060) and `dns` (UDP 10.96.0.53:53 → 5353).
const FEATURE_SERVICES: &str = r#"
- apiVersion: v1
  kind: Service
  metadata: {name: sticky, namespace: default}
  spec:
    clusterIP: 10.96.0.90
    sessionAffinity: ClientIP
    sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}
    ports: [{port: 80, targetPort: 80}]
- apiVersion: v1
  kind: Service
  metadata: {name: local, namespace: default}
  spec:
    type: NodePort
    clusterIP: 10.96.0.70
    externalTrafficPolicy: Local
    ports: [{port: 80, targetPort: 80, nodePort: 30070}]
- apiVersion: v1
  kind: Service
  metadata: {name: fw, namespace: default}
  spec:
    type: LoadBalancer
    clusterIP: 10.96.0.60
    loadBalancerSourceRanges: [192.168.56.100/32]
    ports: [{port: 80, targetPort: 80, nodePort: 30060}]
  status:
    loadBalancer:
      ingress: [{ip: 10.99.0.3}]
- apiVersion: v1
  kind: Service
  metadata: {name: dns, namespace: default}
  spec:
    clusterIP: 10.96.0.53
    ports: [{name: dns, port: 53, targetPort: 5353, protocol: UDP}]
"#;

/// The feature cluster for `mode`: the Services above, each with both backends as
/// endpoints. Only nftables mode gets the Node object (see [`FEATURE_NODE`]); iptables
/// mode runs without one, as a manifest-only node would.
pub fn feature_cluster(mode: Mode) -> String {
    let node = match mode {
        Mode::Iptables => "",
        Mode::Nftables | Mode::Ipvs | Mode::Userspace => FEATURE_NODE,
    };
    let mut out = format!("apiVersion: v1\nkind: List\nitems:{node}{FEATURE_SERVICES}");
    for (svc, port, proto, pname) in [
        ("sticky", 80, "TCP", ""),
        ("local", 80, "TCP", ""),
        ("fw", 80, "TCP", ""),
        ("dns", 5353, "UDP", "dns"),
    ] {
        out.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {svc}-1\n  namespace: default\n  labels: {{kubernetes.io/service-name: {svc}}}\naddressType: IPv4\nendpoints:\n- addresses: [10.0.1.4]\n  nodeName: k8s-master\n- addresses: [10.0.2.5]\n  nodeName: node-b\nports: [{{name: \"{pname}\", port: {port}, protocol: {proto}}}]\n"
        ));
    }
    out
}

/// The `dns` Service alone (UDP 10.96.0.53:53 → 5353) with one endpoint, `ip` on `node`.
pub fn dns_cluster(ip: &str, node: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: dns, namespace: default}}\nspec:\n  clusterIP: 10.96.0.53\n  ports: [{{name: dns, port: 53, targetPort: 5353, protocol: UDP}}]\n\
         ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: dns-1\n  namespace: default\n  labels: {{kubernetes.io/service-name: dns}}\naddressType: IPv4\nendpoints:\n- addresses: [{ip}]\n  nodeName: {node}\nports: [{{name: dns, port: 5353, protocol: UDP}}]\n"
    )
}

/// How many requests each backend answered; failures count under `error: <reason>`.
pub fn counts(results: Vec<Result<HttpReply, ClientError>>) -> BTreeMap<String, usize> {
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

/// How many requests `backend` answered in `counts`.
pub fn answered(counts: &BTreeMap<String, usize>, backend: &str) -> usize {
    counts.get(backend).copied().unwrap_or(0)
}

/// The name of the backend that answered each request; panics on a failed one (`what`
/// says which requests).
pub fn names(results: Vec<Result<HttpReply, ClientError>>, what: &str) -> Vec<String> {
    results
        .into_iter()
        .map(|r| match r {
            Ok(reply) => reply.name().to_string(),
            Err(e) => panic!("{what}: {e:?}"),
        })
        .collect()
}

/// An IPv6-only node: ClusterIP and NodePort (on the Node's primary address, which nftables
/// mode's default `--nodeport-addresses primary` and iptables mode's "all" both include)
/// reach both backends through the ip6tables or `ip6 kube-proxy` rules, or IPv6 virtual
/// servers and `KUBE-6-` sets in IPVS mode.
pub fn ipv6_cluster_ip_and_node_port(mode: Mode) {
    if !kp_testkit::require_root() {
        return;
    }
    let topology = kp_testkit::Topology::builder()
        .ipv6_only()
        .backends(2)
        .build()
        .unwrap();
    let http = topology.start_http(8080).unwrap();
    let be: Vec<IpAddr> = topology
        .backends()
        .iter()
        .map(|b| b.ip(kp_model::IpFamily::V6).unwrap())
        .collect();
    let manifest = format!(
        r#"apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata: {{name: k8s-master}}
  status:
    addresses: [{{type: InternalIP, address: "fd00:56::10"}}]
- apiVersion: v1
  kind: Service
  metadata: {{name: web6, namespace: default}}
  spec:
    type: NodePort
    clusterIP: "fd00:10:96::a"
    ipFamilies: [IPv6]
    ports: [{{port: 80, targetPort: 8080, nodePort: 30090}}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: web6-1
    namespace: default
    labels: {{kubernetes.io/service-name: web6}}
  addressType: IPv6
  endpoints:
  - addresses: ["{}"]
    nodeName: k8s-master
  - addresses: ["{}"]
    nodeName: node-b
  ports: [{{name: "", port: 8080, protocol: TCP}}]
"#,
        be[0], be[1]
    );
    let dir = tempdir();
    let path = write(dir.path(), "cluster.yaml", &manifest);
    let node = topology.node();
    let mut proxy = Daemon::start(
        mode,
        node,
        dir.path(),
        &[
            "--hostname-override=k8s-master",
            "--cluster-cidr=fd00:10:244::/64",
            "-v=2",
            "--manifests",
            path.to_str().unwrap(),
        ],
        None,
    );
    proxy.wait_until(
        "the proxy did not program the IPv6 Service",
        || match mode {
            Mode::Ipvs => node
                .run("ipvsadm", ["-S", "-n"])
                .is_ok_and(|s| s.contains("[fd00:10:96::a]:80")),
            Mode::Iptables | Mode::Userspace => node
                .run("ip6tables-save", ["-t", "nat"])
                .is_ok_and(|s| s.contains("-d fd00:10:96::a/128 -p tcp")),
            Mode::Nftables => {
                nft_table(node, "ip6").is_some_and(|s| s.contains("fd00:10:96::a . tcp . 80"))
            }
        },
    );
    for (what, target) in [
        ("ClusterIP", "[fd00:10:96::a]:80"),
        ("NodePort", "[fd00:56::10]:30090"),
    ] {
        let seen: BTreeSet<String> = names(
            kp_testkit::http_get_many(
                topology.client(),
                target.parse().unwrap(),
                40,
                if kp_testkit::vm::in_guest() {
                    Duration::from_secs(5)
                } else {
                    Duration::from_secs(2)
                },
            ),
            &format!("{what}\n{}", proxy.log()),
        )
        .into_iter()
        .collect();
        assert_eq!(seen.len(), 2, "{what}: both backends answer: {seen:?}");
    }
    if mode == Mode::Iptables {
        // As upstream: an empty KUBE-FIREWALL in ip6tables' filter table (the localnet drop
        // is IPv4's), its jumps first in INPUT and OUTPUT.
        let filter = node.run("ip6tables", ["-S"]).unwrap();
        assert!(filter.contains("-N KUBE-FIREWALL\n"), "{filter}");
        assert!(!filter.contains("-A KUBE-FIREWALL"), "{filter}");
        for chain in ["INPUT", "OUTPUT"] {
            let first = filter
                .lines()
                .find(|l| l.starts_with(&format!("-A {chain} ")));
            assert_eq!(
                first,
                Some(format!("-A {chain} -j KUBE-FIREWALL").as_str()),
                "{filter}"
            );
        }
    }
    drop(http);
}

/// `n` more Services for a node's worth of rules (so that a start and a first sync take a
/// while): `default/filler-<i>`, ClusterIP `10.97.<i/250>.<i%250+1>:80`, one endpoint each at
/// `10.1.<i/250>.<i%250+1>:8080` that nothing serves, as `---` documents to append to a
/// manifest.
pub fn filler_services(n: usize) -> String {
    let mut out = String::new();
    for i in 0..n {
        let (a, b) = (i / 250, i % 250 + 1);
        out.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: filler-{i}, namespace: default}}\n\
             spec:\n  clusterIP: 10.97.{a}.{b}\n  ports: [{{port: 80, targetPort: 8080, protocol: TCP}}]\n\
             ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata:\n  name: filler-{i}-x\n  namespace: default\n  labels: {{kubernetes.io/service-name: filler-{i}}}\n\
             addressType: IPv4\nendpoints:\n- addresses: [10.1.{a}.{b}]\n  nodeName: k8s-worker\n\
             ports: [{{name: \"\", port: 8080, protocol: TCP}}]\n"
        ));
    }
    out
}

/// One probe of [`probe_during`]: when it ended, and the answering backend or the error.
#[derive(Debug, Clone)]
pub struct Probe {
    /// When the request ended.
    pub at: std::time::Instant,
    /// The backend's name, or the error.
    pub outcome: Result<String, String>,
}

/// Runs `work` while a client in `ns` sends HTTP requests to `target` one after another, each
/// a new connection with `timeout` (a pause of `pace` between them); returns `work`'s result
/// and every probe.
pub fn probe_during<T>(
    ns: &Netns,
    target: SocketAddr,
    timeout: Duration,
    pace: Duration,
    work: impl FnOnce() -> T,
) -> (T, Vec<Probe>) {
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let prober = s.spawn(|| {
            let mut probes = Vec::new();
            kp_testkit::http_get_while(ns, target, 100_000, timeout, |r| {
                probes.push(Probe {
                    at: std::time::Instant::now(),
                    outcome: match r {
                        Ok(reply) => Ok(reply.name().to_string()),
                        Err(e) => Err(format!("{e:?}")),
                    },
                });
                std::thread::sleep(pace);
                !stop.load(std::sync::atomic::Ordering::Relaxed)
            });
            probes
        });
        let result = work();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (result, prober.join().unwrap())
    })
}

/// The failed probes of `probes`, and the time from the first failure to the last (zero
/// without failures), for an assertion message.
pub fn failures(probes: &[Probe]) -> (Vec<&Probe>, Duration) {
    let failed: Vec<&Probe> = probes.iter().filter(|p| p.outcome.is_err()).collect();
    let span = match (failed.first(), failed.last()) {
        (Some(a), Some(b)) => b.at - a.at,
        _ => Duration::ZERO,
    };
    (failed, span)
}
