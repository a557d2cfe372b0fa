//! `kube-proxy-rs trace` as an operator runs it: on upstream kube-proxy's seed dump, on a
//! hand-written dump, on `nft list ruleset` dumps (JSON and text), on `--dry-run` output
//! (iptables and nftables mode, one family and dual-stack), on `iptables-save` of both
//! families, on IPVS-mode and userspace-mode dumps, and on live rules (iptables, nftables
//! and userspace mode) in a network namespace.

mod common;

use common::{BIN, run, run_in};
use kp_testkit::golden::SEED_CLUSTER;
use kp_testkit::{Netns, require_root};

const SEED_DUMP: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../examples/seed-nginx/expected-iptables-save.txt"
);

#[test]
fn explains_the_seed_dump_from_upstream_kube_proxy() {
    let (ok, out, err) = run(&[
        "trace",
        "--rules",
        SEED_DUMP,
        "--dst",
        "10.96.138.71",
        "--dport",
        "8080",
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("the dump was partial"), "{err}");
    assert!(
        out.contains("50.0%  -> KUBE-SEP-GS5MQAG4332XHLUZ  DNAT 10.0.0.4:80"),
        "{out}"
    );
    assert!(
        out.contains("50.0%  -> KUBE-SEP-H5CTQI4CMO4ES5BQ  DNAT 10.0.1.2:80"),
        "{out}"
    );
    assert!(
        out.contains("masqueraded"),
        "an external client is masqueraded: {out}"
    );

    // From a pod inside the cluster CIDR: not masqueraded.
    let (ok, out, _) = run(&[
        "trace",
        "--rules",
        SEED_DUMP,
        "--dst",
        "10.96.138.71",
        "--dport",
        "8080",
        "--from",
        "pod",
        "--src",
        "10.0.0.9",
    ]);
    assert!(ok);
    assert!(out.contains("not masqueraded"), "{out}");

    // The classic question: why can't I ping my ClusterIP?
    let (ok, out, _) = run(&[
        "trace",
        "--rules",
        SEED_DUMP,
        "--dst",
        "10.96.138.71",
        "--proto",
        "icmp",
        "--from",
        "pod",
        "--src",
        "10.0.0.9",
    ]);
    assert!(ok);
    assert!(
        out.contains("no DNAT") && out.contains("cannot be pinged"),
        "{out}"
    );

    // JSON for tools.
    let (ok, out, _) = run(&[
        "trace",
        "--rules",
        SEED_DUMP,
        "--dst",
        "10.96.138.71",
        "--dport",
        "8080",
        "--json",
    ]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    assert_eq!(v["outcomes"].as_array().map(Vec::len), Some(2));
}

#[test]
fn reports_bad_input_clearly() {
    let (ok, _, err) = run(&[
        "trace",
        "--rules",
        "/nonexistent",
        "--dst",
        "10.96.0.1",
        "--dport",
        "80",
    ]);
    assert!(!ok && err.contains("/nonexistent"), "{err}");
    let (ok, _, err) = run(&[
        "trace",
        "--rules",
        SEED_DUMP,
        "--dst",
        "10.96.0.1",
        "--from",
        "pod",
        "--dport",
        "80",
    ]);
    assert!(!ok && err.contains("--src"), "{err}");
    let (ok, _, err) = run(&["trace", "--rules", SEED_DUMP, "--dst", "10.96.0.1"]);
    assert!(!ok && err.contains("--dport"), "{err}");
    let (ok, _, err) = run(&[
        "trace",
        "--rules",
        SEED_DUMP,
        "--dst",
        "10.96.0.1",
        "--dport",
        "80",
        "--src",
        "fd00::1",
    ]);
    assert!(!ok && err.contains("different IP families"), "{err}");
}

#[test]
fn traces_live_rules_in_a_namespace() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("cluster.yaml");
    let nodeport = "\n---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec:\n  type: NodePort\n  clusterIP: 10.96.0.80\n  ports: [{port: 80, nodePort: 30080}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nendpoints: [{addresses: [10.0.0.4], nodeName: k8s-master}]\nports: [{name: \"\", port: 80, protocol: TCP}]\n";
    std::fs::write(&manifest, format!("{SEED_CLUSTER}{nodeport}")).unwrap();
    let ns = Netns::new("trace").unwrap();
    let out = ns
        .command(BIN)
        .args([
            "--once",
            "--hostname-override=k8s-master",
            "--cluster-cidr=10.0.0.0/16",
            "--manifests",
        ])
        .arg(&manifest)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ns.run("ip", ["addr", "add", "192.168.56.10/24", "dev", "lo"])
        .unwrap();
    let trace = |args: &[&str]| {
        let out = ns
            .command(BIN)
            .arg("trace")
            .arg("--live")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = trace(&["--dst", "10.96.138.71", "--dport", "8080"]);
    assert!(
        out.contains("DNAT 10.0.0.4:80") && out.contains("DNAT 10.0.1.2:80"),
        "{out}"
    );
    // The node's own address (read from the namespace) makes the NodePort match.
    let out = trace(&["--dst", "192.168.56.10", "--dport", "30080"]);
    assert!(
        out.contains("100.0%") && out.contains("DNAT 10.0.0.4:80"),
        "{out}"
    );
    // localhost NodePort: route_localnet was set by the proxy in this namespace.
    let out = trace(&[
        "--from",
        "node",
        "--src",
        "127.0.0.1",
        "--dst",
        "127.0.0.1",
        "--dport",
        "30080",
    ]);
    assert!(out.contains("DNAT 10.0.0.4:80"), "{out}");
    // Outside traffic to 127.0.0.1 that no NodePort catches hits the localnet guard.
    let out = trace(&["--dst", "127.0.0.1", "--dport", "22"]);
    assert!(out.contains("DROP"), "{out}");
}

/// `nft -j list ruleset` (nft 1.0.6) after loading a trimmed version of upstream
/// kube-proxy's nftables rules for the seed Service `default/nginx-svc` (ClusterIP
/// 10.96.138.71:8080, endpoints 10.0.0.4:80 and 10.0.1.2:80).
const NFT_DUMP: &str = r#"{"nftables": [
{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
{"table": {"family": "ip", "name": "kube-proxy", "handle": 1}},
{"set": {"family": "ip", "name": "cluster-ips", "table": "kube-proxy", "type": "ipv4_addr", "handle": 1, "comment": "Active ClusterIPs", "elem": ["10.96.138.71"]}},
{"map": {"family": "ip", "name": "service-ips", "table": "kube-proxy", "type": ["ipv4_addr", "inet_proto", "inet_service"], "handle": 2, "comment": "ClusterIP, ExternalIP and LoadBalancer IP traffic", "map": "verdict", "elem": [[{"concat": ["10.96.138.71", "tcp", 8080]}, {"goto": {"target": "service-O4TPQO6D-default/nginx-svc/tcp/"}}]]}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "cluster-ips-check", "handle": 3}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "filter-forward", "handle": 4, "type": "filter", "hook": "forward", "prio": 0, "policy": "accept"}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "filter-output", "handle": 5, "type": "filter", "hook": "output", "prio": 0, "policy": "accept"}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "nat-prerouting", "handle": 6, "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "nat-output", "handle": 7, "type": "nat", "hook": "output", "prio": -100, "policy": "accept"}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "services", "handle": 8}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "service-O4TPQO6D-default/nginx-svc/tcp/", "handle": 15}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "endpoint-GS5MQAG4-default/nginx-svc/tcp/__10.0.0.4/80", "handle": 16}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "endpoint-H5CTQI4C-default/nginx-svc/tcp/__10.0.1.2/80", "handle": 17}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "cluster-ips-check", "handle": 9, "comment": "Reject traffic to invalid ports of ClusterIPs", "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "@cluster-ips"}}, {"reject": {"type": "icmp", "expr": "port-unreachable"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "filter-forward", "handle": 10, "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": "new"}}, {"jump": {"target": "cluster-ips-check"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "filter-output", "handle": 11, "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": "new"}}, {"jump": {"target": "cluster-ips-check"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "nat-prerouting", "handle": 12, "expr": [{"jump": {"target": "services"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "nat-output", "handle": 13, "expr": [{"jump": {"target": "services"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "services", "handle": 14, "expr": [{"vmap": {"key": {"concat": [{"payload": {"protocol": "ip", "field": "daddr"}}, {"meta": {"key": "l4proto"}}, {"payload": {"protocol": "th", "field": "dport"}}]}, "data": "@service-ips"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "service-O4TPQO6D-default/nginx-svc/tcp/", "handle": 19, "expr": [{"vmap": {"key": {"numgen": {"mode": "random", "mod": 2, "offset": 0}}, "data": {"set": [[0, {"goto": {"target": "endpoint-GS5MQAG4-default/nginx-svc/tcp/__10.0.0.4/80"}}], [1, {"goto": {"target": "endpoint-H5CTQI4C-default/nginx-svc/tcp/__10.0.1.2/80"}}]]}}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "endpoint-GS5MQAG4-default/nginx-svc/tcp/__10.0.0.4/80", "handle": 20, "expr": [{"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}}, {"dnat": {"addr": "10.0.0.4", "port": 80}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "endpoint-H5CTQI4C-default/nginx-svc/tcp/__10.0.1.2/80", "handle": 21, "expr": [{"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}}, {"dnat": {"addr": "10.0.1.2", "port": 80}}]}}
]}
"#;

/// The same rules as `nft -f` input.
const NFT_RULES: &str = r#"add table ip kube-proxy { comment "rules for kube-proxy" ; }
add set ip kube-proxy cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; }
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }
add chain ip kube-proxy cluster-ips-check
add chain ip kube-proxy filter-forward { type filter hook forward priority 0 ; }
add chain ip kube-proxy filter-output { type filter hook output priority 0 ; }
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }
add chain ip kube-proxy services
add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
add rule ip kube-proxy filter-forward ct state new jump cluster-ips-check
add rule ip kube-proxy filter-output ct state new jump cluster-ips-check
add rule ip kube-proxy nat-prerouting jump services
add rule ip kube-proxy nat-output jump services
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add chain ip kube-proxy service-O4TPQO6D-default/nginx-svc/tcp/
add chain ip kube-proxy endpoint-GS5MQAG4-default/nginx-svc/tcp/__10.0.0.4/80
add chain ip kube-proxy endpoint-H5CTQI4C-default/nginx-svc/tcp/__10.0.1.2/80
add rule ip kube-proxy service-O4TPQO6D-default/nginx-svc/tcp/ numgen random mod 2 vmap { 0 : goto endpoint-GS5MQAG4-default/nginx-svc/tcp/__10.0.0.4/80 , 1 : goto endpoint-H5CTQI4C-default/nginx-svc/tcp/__10.0.1.2/80 }
add rule ip kube-proxy endpoint-GS5MQAG4-default/nginx-svc/tcp/__10.0.0.4/80 meta l4proto tcp dnat to 10.0.0.4:80
add rule ip kube-proxy endpoint-H5CTQI4C-default/nginx-svc/tcp/__10.0.1.2/80 meta l4proto tcp dnat to 10.0.1.2:80
add element ip kube-proxy cluster-ips { 10.96.138.71 }
add element ip kube-proxy service-ips { 10.96.138.71 . tcp . 8080 : goto service-O4TPQO6D-default/nginx-svc/tcp/ }
"#;

#[test]
fn traces_an_nft_json_dump() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ruleset.json");
    std::fs::write(&file, NFT_DUMP).unwrap();
    let file = file.to_str().unwrap();
    let (ok, out, err) = run(&[
        "trace",
        "--rules",
        file,
        "--from",
        "pod",
        "--src",
        "10.0.0.9",
        "--dst",
        "10.96.138.71",
        "--dport",
        "8080",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains(
            "ip kube-proxy services  ip daddr . meta l4proto . th dport vmap @service-ips  \
             (@service-ips: 10.96.138.71 . tcp . 8080 : goto service-O4TPQO6D-default/nginx-svc/tcp/)"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "50.0%  -> endpoint-GS5MQAG4-default/nginx-svc/tcp/__10.0.0.4/80  DNAT 10.0.0.4:80  \
             forwarded, not masqueraded, accepted"
        ),
        "{out}"
    );
    // The ping question, nftables edition.
    let (ok, out, _) = run(&[
        "trace",
        "--rules",
        file,
        "--from",
        "pod",
        "--src",
        "10.0.0.9",
        "--dst",
        "10.96.138.71",
        "--proto",
        "icmp",
    ]);
    assert!(ok);
    assert!(
        out.contains("REJECT icmp port-unreachable in cluster-ips-check")
            && out.contains("Destination Port Unreachable"),
        "{out}"
    );
    // JSON for tools says which rules were traced.
    let (ok, out, _) = run(&[
        "trace",
        "--rules",
        file,
        "--dst",
        "10.96.138.71",
        "--dport",
        "8080",
        "--json",
    ]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    assert_eq!(v["mode"], "Nftables");
    assert_eq!(v["outcomes"].as_array().map(Vec::len), Some(2));
    // --mode must fit the dump.
    let (ok, _, err) = run(&[
        "trace",
        "--rules",
        file,
        "--mode",
        "iptables",
        "--dst",
        "10.96.138.71",
        "--dport",
        "8080",
    ]);
    assert!(!ok && err.contains("--mode iptables"), "{err}");
    let (ok, _, err) = run(&[
        "trace",
        "--rules",
        SEED_DUMP,
        "--mode",
        "nftables",
        "--dst",
        "10.96.138.71",
        "--dport",
        "8080",
    ]);
    assert!(!ok && err.contains("nft -j list ruleset"), "{err}");
    std::fs::write(dir.path().join("bad.json"), "{\"nftables\": 3}").unwrap();
    let (ok, _, err) = run(&[
        "trace",
        "--rules",
        dir.path().join("bad.json").to_str().unwrap(),
        "--dst",
        "10.96.0.1",
        "--dport",
        "80",
    ]);
    assert!(!ok && err.contains("nftables JSON"), "{err}");
}

#[test]
fn traces_live_nftables_rules_in_a_namespace() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("tracenft").unwrap();
    let mut child = ns
        .command("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), NFT_RULES.as_bytes()).unwrap();
    assert!(child.wait().unwrap().success());
    ns.run("ip", ["addr", "add", "192.168.56.10/24", "dev", "lo"])
        .unwrap();
    let trace = |args: &[&str]| {
        let out = ns
            .command(BIN)
            .arg("trace")
            .arg("--live")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // auto: the namespace has table ip kube-proxy, so its nftables rules are traced.
    let out = trace(&["--dst", "10.96.138.71", "--dport", "8080"]);
    assert!(
        out.contains("ip kube-proxy nat-prerouting  jump services")
            && out.contains("DNAT 10.0.0.4:80")
            && out.contains("DNAT 10.0.1.2:80"),
        "{out}"
    );
    // From the node: the output hook; the source defaults to the node's address.
    let out = trace(&["--from", "node", "--dst", "10.96.138.71", "--dport", "8080"]);
    assert!(
        out.starts_with(
            "packet tcp 192.168.56.10:40000 -> 10.96.138.71:8080 from the node (output)"
        ) && out.contains("ip kube-proxy nat-output  jump services"),
        "{out}"
    );
    // --mode iptables traces the (empty) iptables rules instead.
    let out = trace(&[
        "--mode",
        "iptables",
        "--dst",
        "10.96.138.71",
        "--dport",
        "8080",
    ]);
    assert!(out.contains("no DNAT"), "{out}");
}

/// The seed dump without the rules in the built-in chains (PREROUTING, OUTPUT, ...): the
/// `iptables-save | grep KUBE-` kind of paste.
fn seed_without_builtin_jumps() -> String {
    std::fs::read_to_string(SEED_DUMP)
        .unwrap()
        .lines()
        .filter(|l| {
            !["PREROUTING", "OUTPUT", "POSTROUTING", "INPUT", "FORWARD"]
                .iter()
                .any(|c| l.starts_with(&format!("-A {c} ")))
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The outcome lines (`  50.0%  -> ...`) of a trace's text.
fn outcome_lines(out: &str) -> Vec<&str> {
    out.lines().filter(|l| l.starts_with("  ")).collect()
}

#[test]
fn completes_kube_proxys_jumps_missing_from_a_partial_dump() {
    let dir = tempfile::tempdir().unwrap();
    let partial = dir.path().join("partial.txt");
    std::fs::write(&partial, seed_without_builtin_jumps()).unwrap();
    let partial = partial.to_str().unwrap();
    for extra in [
        &["--dport", "8080"][..],
        &["--dport", "8080", "--from", "pod", "--src", "10.0.0.9"],
        &[
            "--dport",
            "8080",
            "--from",
            "node",
            "--node-ip",
            "192.168.56.10",
        ],
        &["--dport", "80"],
        &["--proto", "icmp"],
    ] {
        let mut args = vec!["trace", "--rules", SEED_DUMP, "--dst", "10.96.138.71"];
        args.extend_from_slice(extra);
        let (ok, full, err) = run(&args);
        assert!(ok, "{err}");
        args[2] = partial;
        let (ok, out, err) = run(&args);
        assert!(ok, "{err}");
        assert_eq!(outcome_lines(&full), outcome_lines(&out), "{out}");
        assert!(
            out.contains(
                "note: assumed kube-proxy's jump nat PREROUTING: -A PREROUTING -m comment \
                 --comment \"kubernetes service portals\" -j KUBE-SERVICES, which the dump \
                 does not contain"
            ),
            "{out}"
        );
        assert!(!full.contains("assumed kube-proxy's jump"), "{full}");
        // The same explanation as for the full dump (for port 80, the packet really
        // does not match KUBE-SERVICES' rule for port 8080).
        let no_dnat = |t: &str| {
            t.lines()
                .filter(|l| l.starts_with("note: no DNAT"))
                .map(String::from)
                .collect::<Vec<_>>()
        };
        assert_eq!(no_dnat(&full), no_dnat(&out), "{out}");
    }
    let (ok, out, _) = run(&[
        "trace",
        "--rules",
        partial,
        "--dst",
        "10.96.138.71",
        "--dport",
        "8080",
        "--json",
    ]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    assert_eq!(v["outcomes"].as_array().map(Vec::len), Some(2));
    assert!(
        v["notes"].as_array().unwrap().iter().any(|n| n
            .as_str()
            .unwrap()
            .starts_with("assumed kube-proxy's jump nat PREROUTING")),
        "{out}"
    );

    // Only KUBE-SERVICES and a Service's chains, as in the ticket: DNATed, with the note.
    let kubernetes = dir.path().join("kubernetes.txt");
    std::fs::write(
        &kubernetes,
        "*nat\n\
         -A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment \"default/kubernetes:https cluster IP\" -m tcp --dport 443 -j KUBE-SVC-NPX46M4PTMTKRN6Y\n\
         -A KUBE-SVC-NPX46M4PTMTKRN6Y -m comment --comment \"default/kubernetes:https -> 192.168.56.10:6443\" -j KUBE-SEP-A\n\
         -A KUBE-SEP-A -p tcp -m comment --comment \"default/kubernetes:https\" -m tcp -j DNAT --to-destination 192.168.56.10:6443\n",
    )
    .unwrap();
    let (ok, out, err) = run(&[
        "trace",
        "--rules",
        kubernetes.to_str().unwrap(),
        "--dst",
        "10.96.0.1",
        "--dport",
        "443",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("100.0%  -> KUBE-SEP-A  DNAT 192.168.56.10:6443"),
        "{out}"
    );
    assert!(
        out.contains("assumed kube-proxy's jump nat PREROUTING"),
        "{out}"
    );
    assert!(!out.contains("no DNAT"), "{out}");
}

const HAND_RULES: &str = r#"*nat
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.50/32 -p tcp -m comment --comment "default/web cluster IP" -m tcp --dport 80 -j KUBE-SVC-WEB
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -p tcp -m comment --comment "default/web" -m tcp --dport 30080 -j KUBE-EXT-WEB
-A KUBE-EXT-WEB -j KUBE-SVC-WEB
-A KUBE-SVC-WEB -j KUBE-SEP-WEB
-A KUBE-SEP-WEB -p tcp -m tcp -j DNAT --to-destination 10.0.0.4:8080
*filter
:FORWARD DROP [0:0]
-A FORWARD -d 10.0.0.0/16 -j ACCEPT
COMMIT
"#;

#[test]
fn nodeport_without_node_ip_is_uncertain_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hand.rules");
    std::fs::write(&file, HAND_RULES).unwrap();
    let file = file.to_str().unwrap();
    let args = [
        "trace",
        "--rules",
        file,
        "--dst",
        "192.168.77.10",
        "--dport",
        "30080",
    ];
    let (ok, out, err) = run(&args);
    assert!(ok, "{err}");
    assert!(out.contains("[uncertain]"), "{out}");
    assert!(
        out.contains("unknown: nat KUBE-SERVICES rule index 1: whether 192.168.77.10 is an address of this node"),
        "{out}"
    );
    assert!(out.contains("give them with --node-ip"), "{out}");

    // With --node-ip: DNATed to the endpoint, certain, no hint (as before).
    let mut with = args.to_vec();
    with.extend(["--node-ip", "192.168.77.10"]);
    let (ok, out, err) = run(&with);
    assert!(ok, "{err}");
    assert!(
        out.contains("100.0%  -> KUBE-SEP-WEB  DNAT 10.0.0.4:8080  forwarded, not masqueraded, filter ACCEPT\n"),
        "{out}"
    );
    assert!(
        !out.contains("[uncertain]") && !out.contains("--node-ip"),
        "{out}"
    );

    // A ClusterIP is never a node address: certain without --node-ip.
    let (ok, out, _) = run(&[
        "trace",
        "--rules",
        file,
        "--dst",
        "10.96.0.50",
        "--dport",
        "80",
    ]);
    assert!(ok);
    assert!(
        out.contains("DNAT 10.0.0.4:8080") && !out.contains("[uncertain]"),
        "{out}"
    );
}

#[test]
fn rejects_incomplete_or_contradictory_arguments() {
    // Neither --rules nor --live: the error names both.
    let (ok, _, err) = run(&["trace", "--dst", "10.96.0.1", "--dport", "443"]);
    assert!(
        !ok && err.contains("--rules") && err.contains("--live"),
        "{err}"
    );
    // Both: refused.
    let (ok, _, err) = run(&[
        "trace",
        "--rules",
        SEED_DUMP,
        "--live",
        "--dst",
        "10.96.0.1",
        "--dport",
        "443",
    ]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");
    // An icmp echo has no ports.
    let (ok, _, err) = run(&[
        "trace",
        "--rules",
        SEED_DUMP,
        "--dst",
        "10.96.138.71",
        "--proto",
        "icmp",
        "--dport",
        "80",
    ]);
    assert!(
        !ok && err.contains("--dport") && err.contains("icmp"),
        "{err}"
    );
    // An empty dump is an error, not an ACCEPT.
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "\n# nothing\n").unwrap();
    let empty = empty.to_str().unwrap();
    let (ok, out, err) = run(&[
        "trace",
        "--rules",
        empty,
        "--dst",
        "10.96.0.1",
        "--dport",
        "443",
    ]);
    assert!(
        !ok && err.contains(&format!("no rules found in {empty}")),
        "{out}{err}"
    );
    // From the node without its address: no made-up loopback source.
    let (ok, _, err) = run(&[
        "trace",
        "--rules",
        SEED_DUMP,
        "--from",
        "node",
        "--dst",
        "10.96.138.71",
        "--dport",
        "8080",
    ]);
    assert!(!ok && err.contains("--node-ip"), "{err}");
}

#[test]
fn locally_generated_packets_are_sent_not_forwarded() {
    let (ok, out, err) = run(&[
        "trace",
        "--rules",
        SEED_DUMP,
        "--from",
        "node",
        "--node-ip",
        "192.168.56.10",
        "--dst",
        "10.96.138.71",
        "--dport",
        "8080",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("50.0%  -> KUBE-SEP-GS5MQAG4332XHLUZ  DNAT 10.0.0.4:80  sent out,"),
        "{out}"
    );
    assert!(!out.contains("forwarded"), "{out}");
    // A packet from outside is still forwarded.
    let (ok, out, _) = run(&[
        "trace",
        "--rules",
        SEED_DUMP,
        "--dst",
        "10.96.138.71",
        "--dport",
        "8080",
    ]);
    assert!(ok && out.contains("forwarded"), "{out}");
}

/// The nat section of the seed dump through `grep KUBE`, as docs/trace.md suggests
/// (`iptables-save -t nat | grep KUBE`): the `*nat` line is gone.
fn seed_nat_grepped() -> String {
    let seed = std::fs::read_to_string(SEED_DUMP).unwrap();
    let nat = seed.split("*filter").next().unwrap();
    nat.lines()
        .filter(|l| l.contains("KUBE"))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn grepped_nat_dump_without_its_table_line_is_the_nat_table() {
    let dir = tempfile::tempdir().unwrap();
    let grepped = dir.path().join("grepped.txt");
    let text = format!(":KUBE-EXT-CDGGSHYLG3RE2FKL - [0:0]\n{}", seed_nat_grepped());
    assert!(!text.contains('*'));
    std::fs::write(&grepped, &text).unwrap();
    for extra in [
        &["--dport", "8080"][..],
        &["--dport", "8080", "--from", "pod", "--src", "10.0.0.9"],
        &["--dport", "80"],
    ] {
        let mut args = vec!["trace", "--rules", SEED_DUMP, "--dst", "10.96.138.71"];
        args.extend_from_slice(extra);
        let (ok, full, err) = run(&args);
        assert!(ok, "{err}");
        args[2] = grepped.to_str().unwrap();
        let (ok, out, err) = run(&args);
        assert!(ok, "{err}");
        assert_eq!(outcome_lines(&full), outcome_lines(&out), "{out}");
        assert!(
            out.contains("note: assumed the lines before any *table line are the nat table"),
            "{out}"
        );
        assert!(!full.contains("before any *table line"), "{full}");
    }
    let (ok, out, err) = run(&[
        "trace",
        "--rules",
        grepped.to_str().unwrap(),
        "--dst",
        "10.96.138.71",
        "--dport",
        "8080",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("50.0%  -> KUBE-SEP-GS5MQAG4332XHLUZ  DNAT 10.0.0.4:80"),
        "{out}"
    );
    assert!(
        out.contains("50.0%  -> KUBE-SEP-H5CTQI4CMO4ES5BQ  DNAT 10.0.1.2:80"),
        "{out}"
    );
    // grep kept kube-proxy's jumps (they name KUBE chains): none is assumed.
    assert!(!out.contains("assumed kube-proxy's jump nat"), "{out}");

    // `iptables-save | grep KUBE`: nat and filter rules mixed, without their table lines.
    let mixed = dir.path().join("mixed.txt");
    let all: String = std::fs::read_to_string(SEED_DUMP)
        .unwrap()
        .lines()
        .filter(|l| l.contains("KUBE"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&mixed, all).unwrap();
    let (ok, _, err) = run(&[
        "trace",
        "--rules",
        mixed.to_str().unwrap(),
        "--dst",
        "10.96.138.71",
        "--dport",
        "8080",
    ]);
    assert!(!ok);
    assert!(err.contains("mix filter-table rules"), "{err}");
    assert!(err.contains("keep the `*nat' and `*filter' lines"), "{err}");
}

#[test]
fn nft_text_with_mode_iptables_is_named_and_nftables_suggested() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("ruleset.nft");
    std::fs::write(
        &text,
        "table ip kube-proxy {\n\
         \tchain nat-prerouting {\n\
         \t\ttype nat hook prerouting priority dstnat; policy accept;\n\
         \t\tjump services\n\
         \t}\n\
         \tchain services {\n\
         \t}\n\
         }\n",
    )
    .unwrap();
    let args = |mode: &'static str| {
        vec![
            "trace",
            "--rules",
            text.to_str().unwrap(),
            "--mode",
            mode,
            "--dst",
            "10.96.138.71",
            "--dport",
            "8080",
        ]
    };
    let (ok, _, err) = run(&args("iptables"));
    assert!(!ok);
    assert!(err.contains("nftables text"), "{err}");
    assert!(err.contains("`table ip kube-proxy {'"), "{err}");
    assert!(err.contains("--mode nftables"), "{err}");
    for mode in ["auto", "nftables"] {
        let (ok, out, err) = run(&args(mode));
        assert!(ok, "{mode}: {err}");
        assert!(
            out.contains("ip kube-proxy nat-prerouting  jump services"),
            "{mode}: {out}"
        );
    }
}

/// The fixtures of `crates/trace/tests/data/nft`: the same ruleset as `nft list ruleset`
/// text, `nft -j list ruleset` JSON and the `nft -f` script (`--dry-run` output) loaded.
fn nft_fixture(name: &str) -> String {
    format!(
        "{}/../crates/trace/tests/data/nft/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// Packets for the every-feature ruleset: a ClusterIP with two endpoints (TCP and UDP), a
/// Service without endpoints, a load-balancer IP with source ranges, a NodePort.
const EVERY_FEATURE_PACKETS: [&[&str]; 6] = [
    &[
        "--from",
        "pod",
        "--src",
        "10.0.0.9",
        "--dst",
        "10.96.0.10",
        "--dport",
        "80",
    ],
    &[
        "--from",
        "pod",
        "--src",
        "10.0.0.9",
        "--dst",
        "10.96.0.10",
        "--dport",
        "9125",
        "--proto",
        "udp",
    ],
    &[
        "--from",
        "pod",
        "--src",
        "10.0.0.9",
        "--dst",
        "10.96.0.11",
        "--dport",
        "80",
    ],
    &[
        "--src",
        "203.0.113.7",
        "--dst",
        "198.51.100.7",
        "--dport",
        "80",
    ],
    &[
        "--src",
        "198.18.0.1",
        "--dst",
        "198.51.100.7",
        "--dport",
        "80",
    ],
    &[
        "--node-ip",
        "192.168.56.10",
        "--dst",
        "192.168.56.10",
        "--dport",
        "30080",
    ],
];

#[test]
fn traces_nft_list_ruleset_text_and_scripts_like_json() {
    for packet in EVERY_FEATURE_PACKETS {
        let trace = |file: &str| {
            let mut args = vec!["trace", "--rules", file];
            args.extend_from_slice(packet);
            let (ok, out, err) = run(&args);
            assert!(ok, "{file} {packet:?}: {err}");
            out
        };
        // Without handles (plain `nft list ruleset`, scripts) rules are named by position.
        let json = nft_compare::without_rule_names(&trace(&nft_fixture("every-feature.json")));
        let text = nft_compare::without_rule_names(&trace(&nft_fixture("every-feature.nft")));
        let script = trace(&nft_fixture("every-feature.script.nft"));
        assert_eq!(text, json, "{packet:?}");
        assert_eq!(nft_compare::without_rule_names(&script), json, "{packet:?}");
    }
    // `nft -a list ruleset` has the handles: the very same trace.
    let upstream = [
        "--from",
        "pod",
        "--src",
        "10.0.0.9",
        "--dst",
        "172.30.0.41",
        "--dport",
        "80",
    ];
    let outs: Vec<String> = ["upstream-svc1.nft", "upstream-svc1.json"]
        .iter()
        .map(|f| {
            let (ok, out, err) = trace_file(std::path::Path::new(&nft_fixture(f)), &upstream);
            assert!(ok, "{f}: {err}");
            out
        })
        .collect();
    assert_eq!(outs[0], outs[1]);
    assert!(outs[0].contains("DNAT 10.180.0.1:80"), "{}", outs[0]);
    let mut args = vec!["trace", "--rules"];
    let file = nft_fixture("every-feature.nft");
    args.push(&file);
    args.extend_from_slice(EVERY_FEATURE_PACKETS[0]);
    let (ok, out, err) = run(&args);
    assert!(ok, "{err}");
    assert!(
        out.contains("DNAT 10.0.1.4:8080") && out.contains("DNAT 10.0.2.5:8080"),
        "{out}"
    );
}

/// `kube-proxy-rs --manifests DIR --dry-run` for node k8s-master with `extra` flags: its
/// standard output.
fn dry_run(dir: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "--manifests",
        dir,
        "--dry-run",
        "--hostname-override=k8s-master",
    ];
    args.extend_from_slice(extra);
    let (ok, out, err) = run(&args);
    assert!(ok, "dry run {extra:?}: {err}");
    out
}

const DUAL_STACK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/dual-stack");
const DUAL_CIDRS: &str = "--cluster-cidr=10.0.0.0/16,fd00:10::/48";

/// `trace --rules FILE` with `args`: (ok, stdout, stderr).
fn trace_file(file: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["trace", "--rules", file.to_str().unwrap()];
    all.extend_from_slice(args);
    run(&all)
}

/// `trace --rules FILE ARGS` (`args` split at spaces) that must succeed; its output.
fn traced(file: &std::path::Path, args: &str) -> String {
    let args: Vec<&str> = args.split_whitespace().collect();
    let (ok, out, err) = trace_file(file, &args);
    assert!(ok, "trace {args:?}: {err}");
    out
}

#[test]
fn traces_an_iptables_dry_run_of_one_family() {
    let seed_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/seed-nginx");
    let out = dry_run(seed_dir, &["--cluster-cidr=10.0.0.0/16"]);
    assert!(out.contains("# IPv4: iptables-restore input"), "{out}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dry.txt");
    std::fs::write(&file, &out).unwrap();
    let pod = [
        "--from",
        "pod",
        "--src",
        "10.0.0.9",
        "--dst",
        "10.96.138.71",
        "--dport",
        "8080",
    ];
    let (ok, out, err) = trace_file(&file, &pod);
    assert!(ok, "{err}");
    assert!(
        out.contains("DNAT 10.0.0.4:80") && out.contains("DNAT 10.0.1.2:80"),
        "{out}"
    );
    assert!(out.contains("not masqueraded"), "{out}");
    assert!(
        out.contains("the rules are a --dry-run's IPv4 iptables-restore input"),
        "{out}"
    );
    // Only the IPv4 section: an IPv6 packet is refused, naming what the file has.
    let v4_only: String = std::fs::read_to_string(&file)
        .unwrap()
        .split("# IPv6: ")
        .next()
        .unwrap()
        .to_string();
    std::fs::write(&file, v4_only).unwrap();
    let (ok, _, err) = trace_file(&file, &["--dst", "fd00:96::20", "--dport", "80"]);
    assert!(!ok);
    assert!(err.contains("IPv4 rules only"), "{err}");
    assert!(err.contains("the packet is IPv6"), "{err}");
}

#[test]
fn traces_a_dual_stack_iptables_dry_run_by_the_packets_family() {
    let out = dry_run(DUAL_STACK, &[DUAL_CIDRS]);
    assert!(out.contains("# IPv6: ip6tables-restore input"), "{out}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dry.txt");
    std::fs::write(&file, &out).unwrap();
    let out = traced(
        &file,
        "--from pod --src 10.0.0.9 --dst 10.96.0.20 --dport 80",
    );
    assert!(
        out.contains("100.0%  -> KUBE-SEP-") && out.contains("DNAT 10.0.0.4:8080"),
        "{out}"
    );
    let out = traced(
        &file,
        "--from pod --src fd00:10::9 --dst fd00:96::20 --dport 80",
    );
    assert!(out.contains("DNAT [fd00:10::4]:8080"), "{out}");
    assert!(out.contains("IPv6 iptables-restore input"), "{out}");
    // The NodePort, on each family's node address.
    let out = traced(
        &file,
        "--node-ip fd00:56::10 --dst fd00:56::10 --dport 30080",
    );
    assert!(out.contains("DNAT [fd00:10::4]:8080"), "{out}");
    let out = traced(
        &file,
        "--node-ip 192.168.56.10 --dst 192.168.56.10 --dport 30080",
    );
    assert!(out.contains("DNAT 10.0.0.4:8080"), "{out}");
}

#[test]
fn traces_an_nftables_dry_run_of_both_families() {
    let out = dry_run(DUAL_STACK, &["--proxy-mode=nftables", DUAL_CIDRS]);
    assert!(out.contains("# IPv6: nft -f input"), "{out}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dry.txt");
    std::fs::write(&file, &out).unwrap();
    let out = traced(
        &file,
        "--from pod --src 10.0.0.9 --dst 10.96.0.20 --dport 80",
    );
    assert!(out.contains("ip kube-proxy services"), "{out}");
    assert!(out.contains("DNAT 10.0.0.4:8080"), "{out}");
    let out = traced(
        &file,
        "--from pod --src fd00:10::9 --dst fd00:96::20 --dport 80",
    );
    assert!(out.contains("ip6 kube-proxy services"), "{out}");
    assert!(out.contains("DNAT [fd00:10::4]:8080"), "{out}");
}

/// A small `ip6tables-save` of kube-proxy's rules for one IPv6 ClusterIP.
const IP6_SAVE: &str = "# Generated by ip6tables-save v1.8.9 (nf_tables) on Wed Dec  2 07:00:00 2026
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-V6 - [0:0]
:KUBE-SEP-V6 - [0:0]
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A KUBE-SERVICES -d fd00:96::20/128 -p tcp -m comment --comment \"default/web cluster IP\" -m tcp --dport 80 -j KUBE-SVC-V6
-A KUBE-SVC-V6 -m comment --comment \"default/web -> [fd00:10::4]:8080\" -j KUBE-SEP-V6
-A KUBE-SEP-V6 -p tcp -m comment --comment \"default/web\" -m tcp -j DNAT --to-destination [fd00:10::4]:8080
COMMIT
# Completed on Wed Dec  2 07:00:00 2026
";

#[test]
fn traces_iptables_save_of_both_families_by_the_packets_family() {
    let dir = tempfile::tempdir().unwrap();
    let both = dir.path().join("both.txt");
    let seed = std::fs::read_to_string(SEED_DUMP).unwrap();
    let seed_saved = format!(
        "# Generated by iptables-save v1.8.9 (nf_tables) on Wed Dec  2 07:00:00 2026\n{seed}"
    );
    std::fs::write(&both, format!("{seed_saved}{IP6_SAVE}")).unwrap();
    let (ok, out, err) = trace_file(&both, &["--dst", "10.96.138.71", "--dport", "8080"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("DNAT 10.0.0.4:80") && out.contains("DNAT 10.0.1.2:80"),
        "{out}"
    );
    assert!(out.contains("traced the IPv4 one (part 1 of 2)"), "{out}");
    let v6 = [
        "--from",
        "pod",
        "--src",
        "fd00:10::9",
        "--dst",
        "fd00:96::20",
        "--dport",
        "80",
    ];
    let (ok, out, err) = trace_file(&both, &v6);
    assert!(ok, "{err}");
    assert!(
        out.contains("100.0%  -> KUBE-SEP-V6  DNAT [fd00:10::4]:8080"),
        "{out}"
    );
    assert!(out.contains("traced the IPv6 one (part 2 of 2)"), "{out}");
    // Without the headers the parts are told apart by their addresses (here IPv6 first).
    let bare: String = format!("{IP6_SAVE}{seed}")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&both, bare).unwrap();
    let (ok, out, err) = trace_file(&both, &v6);
    assert!(ok, "{err}");
    assert!(out.contains("DNAT [fd00:10::4]:8080"), "{out}");
    // A plain ip6tables-save, and what is refused.
    let one = dir.path().join("ip6.txt");
    std::fs::write(&one, IP6_SAVE).unwrap();
    let (ok, out, err) = trace_file(&one, &v6);
    assert!(ok, "{err}");
    assert!(out.contains("DNAT [fd00:10::4]:8080"), "{out}");
    let (ok, _, err) = trace_file(&one, &["--dst", "10.96.138.71", "--dport", "8080"]);
    assert!(!ok);
    assert!(
        err.contains("IPv6 rules only (ip6tables-save)") && err.contains("iptables-save"),
        "{err}"
    );
    std::fs::write(&both, format!("{seed_saved}{seed_saved}")).unwrap();
    let (ok, _, err) = trace_file(&both, &v6);
    assert!(!ok);
    assert!(
        err.contains("none of them IPv6") && err.contains("ip6tables-save"),
        "{err}"
    );
}

/// Loads `script` (`nft -f` input) into a fresh namespace; returns `nft list ruleset`,
/// `nft -a list ruleset` and `nft -j list ruleset`.
fn listed(script: &str) -> (String, String, String) {
    use std::io::Write as _;
    let ns = Netns::new("trace-nftxt").unwrap();
    let mut child = ns
        .command("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "nft -f: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = ns.run("nft", ["list", "ruleset"]).unwrap();
    let handles = ns.run("nft", ["-a", "list", "ruleset"]).unwrap();
    let json = ns.run("nft", ["-j", "list", "ruleset"]).unwrap();
    (text, handles, json)
}

#[path = "../../crates/trace/tests/common/nft_compare.rs"]
mod nft_compare;

#[test]
fn nftables_dry_runs_loaded_into_a_kernel_read_the_same_as_text_and_json() {
    if !require_root() {
        return;
    }
    let seed_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/seed-nginx");
    let cases: [(&str, String, Vec<&[&str]>); 3] = [
        (
            "seed",
            dry_run(
                seed_dir,
                &["--proxy-mode=nftables", "--cluster-cidr=10.0.0.0/16"],
            ),
            vec![
                &[
                    "--from",
                    "pod",
                    "--src",
                    "10.0.0.9",
                    "--dst",
                    "10.96.138.71",
                    "--dport",
                    "8080",
                ],
                &["--dst", "10.96.138.71", "--dport", "8080"],
                &[
                    "--from",
                    "pod",
                    "--src",
                    "10.0.0.9",
                    "--dst",
                    "10.96.138.71",
                    "--proto",
                    "icmp",
                ],
            ],
        ),
        (
            "dual-stack",
            dry_run(DUAL_STACK, &["--proxy-mode=nftables", DUAL_CIDRS]),
            vec![
                &[
                    "--from",
                    "pod",
                    "--src",
                    "10.0.0.9",
                    "--dst",
                    "10.96.0.20",
                    "--dport",
                    "80",
                ],
                &[
                    "--from",
                    "pod",
                    "--src",
                    "fd00:10::9",
                    "--dst",
                    "fd00:96::20",
                    "--dport",
                    "80",
                ],
                &[
                    "--node-ip",
                    "fd00:56::10",
                    "--dst",
                    "fd00:56::10",
                    "--dport",
                    "30080",
                ],
            ],
        ),
        (
            "every-feature",
            std::fs::read_to_string(nft_fixture("every-feature.script.nft")).unwrap(),
            EVERY_FEATURE_PACKETS.to_vec(),
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (name, script, packets) in cases {
        let (text, handles, json) = listed(&script);
        let from_json = kp_trace::nft::parse_nft_json(&json).expect("the JSON parses");
        for listing in [&text, &handles] {
            let from_text = kp_trace::nft::parse_nft_text(listing).expect("the listing parses");
            if let Some(d) = nft_compare::first_difference(&from_text, &from_json, false) {
                panic!("{name}: nft list ruleset and nft -j list ruleset read differently: {d}");
            }
        }
        let files = [
            ("script", script),
            ("text", text),
            ("handles", handles),
            ("json", json),
        ];
        for (kind, content) in &files {
            std::fs::write(dir.path().join(format!("{name}.{kind}")), content).unwrap();
        }
        for packet in packets {
            let outs: Vec<String> = files
                .iter()
                .map(|(kind, _)| {
                    let (ok, out, err) =
                        trace_file(&dir.path().join(format!("{name}.{kind}")), packet);
                    assert!(ok, "{name} {kind} {packet:?}: {err}");
                    out
                })
                .collect();
            // `nft -a` text names the rules by handle, as the JSON does; the others by
            // position.
            assert_eq!(outs[2], outs[3], "{name} {packet:?}: nft -a text vs JSON");
            let json = nft_compare::without_rule_names(&outs[3]);
            assert_eq!(
                nft_compare::without_rule_names(&outs[1]),
                json,
                "{name} {packet:?}: text vs JSON"
            );
            assert_eq!(
                nft_compare::without_rule_names(&outs[0]),
                json,
                "{name} {packet:?}: script vs JSON"
            );
        }
    }
}

/// IPVS-mode dumps: `iptables-save`, `ipset save` and `ipvsadm -Sn` text.
fn ipvs_dump(dir: &str, file: &str) -> String {
    format!("{}/tests/data/{dir}/{file}", env!("CARGO_MANIFEST_DIR"))
}

/// `trace --rules R --ipsets S --ipvs V` for the dumps in `dir`, plus `extra` flags.
fn ipvs_trace(dir: &str, extra: &[&str]) -> (bool, String, String) {
    let (r, s, v) = (
        ipvs_dump(dir, "iptables-save.txt"),
        ipvs_dump(dir, "ipset-save.txt"),
        ipvs_dump(dir, "ipvsadm-Sn.txt"),
    );
    let mut args = vec![
        "trace",
        "--rules",
        &r,
        "--ipsets",
        &s,
        "--ipvs",
        &v,
        "--node-ip",
        "192.168.56.10",
    ];
    args.extend_from_slice(extra);
    run(&args)
}

#[test]
fn ipvs_mode_on_our_dump() {
    let pod = ["--from", "pod", "--src", "10.0.0.9"];
    let (ok, out, err) = ipvs_trace(
        "ipvs-ours",
        &[&pod[..], &["--dst", "10.96.138.71", "--dport", "8080"]].concat(),
    );
    assert!(ok, "{err}");
    assert!(
        out.contains(
            "50.0%  -> IPVS TCP 10.96.138.71:8080  DNAT 10.0.0.4:80  forwarded, not masqueraded"
        ),
        "{out}"
    );
    assert!(
        out.contains("50.0%  -> IPVS TCP 10.96.138.71:8080  DNAT 10.0.1.2:80"),
        "{out}"
    );
    assert!(
        out.contains("IPVS virtual server TCP 10.96.138.71:8080 (rr) at LOCAL_IN → 10.0.0.4:80 (1/2), 10.0.1.2:80 (1/2)"),
        "{out}"
    );
    assert!(
        out.contains("took 10.96.138.71 as local addresses"),
        "{out}"
    );

    // Hairpin: the local endpoint reaching itself is masqueraded (KUBE-LOOP-BACK).
    let (ok, out, _) = ipvs_trace(
        "ipvs-ours",
        &[
            "--from",
            "pod",
            "--src",
            "10.0.0.4",
            "--dst",
            "10.96.138.71",
            "--dport",
            "8080",
        ],
    );
    assert!(ok);
    assert!(
        out.contains("DNAT 10.0.0.4:80  forwarded, masqueraded"),
        "{out}"
    );

    // A port no Service uses: KUBE-IPVS-FILTER rejects it.
    let (ok, out, _) = ipvs_trace(
        "ipvs-ours",
        &[&pod[..], &["--dst", "10.96.138.71", "--dport", "22"]].concat(),
    );
    assert!(ok);
    assert!(
        out.contains("rejected") && out.contains("KUBE-IPVS-FILTER"),
        "{out}"
    );

    // JSON says which mode.
    let (ok, out, _) = ipvs_trace(
        "ipvs-ours",
        &["--dst", "10.96.138.71", "--dport", "8080", "--json"],
    );
    assert!(ok);
    assert!(out.contains("\"mode\": \"Ipvs\""), "{out}");
}

#[test]
fn ipvs_mode_on_an_upstream_dump() {
    // From outside: marked by KUBE-MARK-MASQ in nat PREROUTING, masqueraded after IPVS.
    let (ok, out, err) = ipvs_trace(
        "ipvs-upstream",
        &["--dst", "10.96.138.71", "--dport", "8080"],
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("50.0%  -> IPVS TCP 10.96.138.71:8080  DNAT 10.0.1.2:80  forwarded, masqueraded, filter ACCEPT"),
        "{out}"
    );
    // The dump has all of IPVS mode's jumps: none is assumed (iptables mode's are not).
    assert!(!out.contains("assumed kube-proxy's jump"), "{out}");

    // NodePort from the node itself: scheduled at LOCAL_OUT, sent out, masqueraded.
    let (ok, out, _) = ipvs_trace(
        "ipvs-upstream",
        &[
            "--from",
            "node",
            "--dst",
            "192.168.56.10",
            "--dport",
            "30080",
        ],
    );
    assert!(ok);
    assert!(
        out.contains("-> IPVS TCP 192.168.56.10:30080  DNAT 10.0.0.4:80  sent out, masqueraded"),
        "{out}"
    );

    // A Service without endpoints: IPVS answers ICMP port unreachable (ip_vs_leave).
    let (ok, out, _) = ipvs_trace("ipvs-upstream", &["--dst", "10.96.0.50", "--dport", "80"]);
    assert!(ok);
    assert!(
        out.contains("rejected, not masqueraded, REJECT icmp-port-unreachable by IPVS TCP 10.96.0.50:80 (no real server)"),
        "{out}"
    );

    // A real server on the node (the API server): delivered locally after IPVS.
    let (ok, out, _) = ipvs_trace(
        "ipvs-upstream",
        &[
            "--from",
            "pod",
            "--src",
            "10.0.0.9",
            "--dst",
            "10.96.0.1",
            "--dport",
            "443",
        ],
    );
    assert!(ok);
    assert!(
        out.contains("DNAT 192.168.56.10:6443  delivered locally"),
        "{out}"
    );

    // The seeds' question: the ClusterIP is on kube-ipvs0, so the ping reaches the node,
    // and upstream's KUBE-IPVS-FILTER rejects it.
    let (ok, out, _) = ipvs_trace(
        "ipvs-upstream",
        &[
            "--from",
            "pod",
            "--src",
            "10.0.0.9",
            "--dst",
            "10.96.138.71",
            "--proto",
            "icmp",
        ],
    );
    assert!(ok);
    assert!(
        out.contains("rejected") && out.contains("kube-ipvs0"),
        "{out}"
    );
}

#[test]
fn ipvs_mode_ping_to_a_cluster_ip_is_answered_on_our_rules() {
    // kube-proxy-rs lets echo requests through KUBE-IPVS-FILTER: the seeds' observation that
    // a ClusterIP answers ping in IPVS mode holds on our rules.
    let (ok, out, err) = ipvs_trace(
        "ipvs-ours",
        &[
            "--from",
            "pod",
            "--src",
            "10.0.0.9",
            "--dst",
            "10.96.138.71",
            "--proto",
            "icmp",
        ],
    );
    assert!(ok, "{err}");
    assert!(out.contains("delivered locally"), "{out}");
    assert!(out.contains("which answers it"), "{out}");
}

#[test]
fn ipvs_mode_ping_without_the_ipvs_filter_is_answered() {
    // An older upstream dump (before KUBE-IPVS-FILTER): the node answers the ping.
    let dir = std::env::temp_dir().join(format!("kp-trace-ipvs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = std::fs::read_to_string(ipvs_dump("ipvs-upstream", "iptables-save.txt"))
        .unwrap()
        .lines()
        .filter(|l| !l.contains("KUBE-IPVS-FILTER"))
        .collect::<Vec<_>>()
        .join("\n");
    let path = dir.join("iptables-save.txt");
    std::fs::write(&path, rules + "\n").unwrap();
    let (s, v) = (
        ipvs_dump("ipvs-upstream", "ipset-save.txt"),
        ipvs_dump("ipvs-upstream", "ipvsadm-Sn.txt"),
    );
    let (ok, out, err) = run(&[
        "trace",
        "--rules",
        path.to_str().unwrap(),
        "--ipsets",
        &s,
        "--ipvs",
        &v,
        "--local-addresses",
        "192.168.56.10",
        "--from",
        "pod",
        "--src",
        "10.0.0.9",
        "--dst",
        "10.96.138.71",
        "--proto",
        "icmp",
    ]);
    std::fs::remove_dir_all(&dir).ok();
    assert!(ok, "{err}");
    assert!(out.contains("delivered locally"), "{out}");
    assert!(out.contains("which answers it"), "{out}");
}

#[test]
fn ipvs_mode_needs_the_table_for_a_dump() {
    let r = ipvs_dump("ipvs-ours", "iptables-save.txt");
    let (ok, _, err) = run(&[
        "trace",
        "--rules",
        &r,
        "--mode",
        "ipvs",
        "--dst",
        "10.96.138.71",
        "--dport",
        "8080",
    ]);
    assert!(!ok);
    assert!(err.contains("--ipvs FILE"), "{err}");
}

#[test]
fn ipvs_mode_refuses_an_ipvsadm_listing_naming_the_form_it_needs() {
    let dir = std::env::temp_dir().join(format!("kp-trace-ln-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let listing = dir.join("ipvsadm-Ln.txt");
    std::fs::write(
        &listing,
        "IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\nTCP  10.96.138.71:8080 rr\n  -> 10.0.0.4:80                  Masq    1      0          0\n",
    )
    .unwrap();
    let (r, s) = (
        ipvs_dump("ipvs-ours", "iptables-save.txt"),
        ipvs_dump("ipvs-ours", "ipset-save.txt"),
    );
    let (ok, _, err) = run(&[
        "trace",
        "--rules",
        &r,
        "--ipsets",
        &s,
        "--ipvs",
        listing.to_str().unwrap(),
        "--dst",
        "10.96.138.71",
        "--dport",
        "8080",
    ]);
    std::fs::remove_dir_all(&dir).ok();
    assert!(!ok);
    assert!(
        err.contains("ipvsadm -Ln") && err.contains("ipvsadm -Sn"),
        "{err}"
    );
}

/// Userspace-mode dumps: the portal rules (`iptables-save`) and the proxy's table.
fn userspace_dump(file: &str) -> String {
    format!("{}/tests/data/userspace/{file}", env!("CARGO_MANIFEST_DIR"))
}

/// `trace --rules R --userspace T` for the userspace dumps, plus `extra` flags.
fn userspace_trace(extra: &[&str]) -> (bool, String, String) {
    let (r, t) = (
        userspace_dump("iptables-save.txt"),
        userspace_dump("userspace.txt"),
    );
    let mut args = vec!["trace", "--rules", &r, "--userspace", &t];
    args.extend_from_slice(extra);
    run(&args)
}

#[test]
fn userspace_mode_on_a_dump() {
    // From a pod: REDIRECT to the proxy, which connects to an endpoint from the node.
    let (ok, out, err) = userspace_trace(&[
        "--from",
        "pod",
        "--src",
        "10.0.0.9",
        "--dst",
        "10.96.0.10",
        "--dport",
        "80",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains(
            "-j REDIRECT --to-ports 36001  (REDIRECT: destination now 192.168.56.10:36001"
        ),
        "{out}"
    );
    for ep in ["10.0.1.4:80", "10.0.2.5:80"] {
        assert!(
            out.contains(&format!(
                "50.0%  -> userspace proxy TCP 0.0.0.0:36001  connects to {ep}  proxied, masqueraded, filter ACCEPT"
            )),
            "{out}"
        );
    }
    assert!(
        out.contains("round robin, retrying the next one if a connect fails"),
        "{out}"
    );
    // The node's address is taken from KUBE-PORTALS-HOST, with a note.
    assert!(
        out.contains("took 192.168.56.10 as local addresses"),
        "{out}"
    );

    // From the node (its address, from the rules, is the default source): DNAT to the
    // node's address and port, then the proxy.
    let (ok, out, err) =
        userspace_trace(&["--from", "node", "--dst", "10.96.0.10", "--dport", "80"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("packet tcp 192.168.56.10:40000 -> 10.96.0.10:80"),
        "{out}"
    );
    assert!(
        out.contains("--to-destination 192.168.56.10:36001"),
        "{out}"
    );
    assert!(out.contains("connects to 10.0.2.5:80  proxied"), "{out}");

    // A NodePort from outside: the external listener, with its session affinity.
    let (ok, out, _) = userspace_trace(&["--dst", "192.168.56.10", "--dport", "30080"]);
    assert!(ok);
    assert!(
        out.contains("100.0%  -> userspace proxy TCP 0.0.0.0:36002  connects to 10.0.1.4:80"),
        "{out}"
    );
    assert!(
        out.contains("session affinity by client IP (10800 s)"),
        "{out}"
    );

    // No endpoints: the proxy resets the connection.
    let (ok, out, _) = userspace_trace(&["--dst", "10.96.0.20", "--dport", "80"]);
    assert!(ok);
    assert!(
        out.contains("rejected, not masqueraded, REJECT tcp-reset by userspace proxy TCP 0.0.0.0:36004 (no endpoints)"),
        "{out}"
    );

    // JSON says which mode.
    let (ok, out, _) = userspace_trace(&["--dst", "10.96.0.10", "--dport", "80", "--json"]);
    assert!(ok);
    assert!(out.contains("\"mode\": \"Userspace\""), "{out}");
    // `--mode userspace` is the same.
    let (ok, out2, _) = userspace_trace(&[
        "--mode",
        "userspace",
        "--dst",
        "10.96.0.10",
        "--dport",
        "80",
        "--json",
    ]);
    assert!(ok);
    assert_eq!(out, out2);
}

#[test]
fn userspace_rules_without_the_table_are_traced_as_iptables_with_a_hint() {
    let r = userspace_dump("iptables-save.txt");
    let (ok, out, err) = run(&[
        "trace",
        "--rules",
        &r,
        "--dst",
        "10.96.0.10",
        "--dport",
        "80",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("DNAT (incoming interface's address):36001  delivered locally"),
        "{out}"
    );
    assert!(
        out.contains("pass --userspace FILE")
            && out.contains("curl http://127.0.0.1:10249/userspace"),
        "{out}"
    );
    // --mode userspace insists on the table.
    let (ok, _, err) = run(&[
        "trace",
        "--rules",
        &r,
        "--mode",
        "userspace",
        "--dst",
        "10.96.0.10",
        "--dport",
        "80",
    ]);
    assert!(!ok);
    assert!(
        err.contains("--userspace FILE") && err.contains("curl http://127.0.0.1:10249/userspace"),
        "{err}"
    );
}

#[test]
fn userspace_mode_refuses_contradictory_flags_and_bad_tables() {
    let (r, t) = (
        userspace_dump("iptables-save.txt"),
        userspace_dump("userspace.txt"),
    );
    let base = [
        "trace",
        "--rules",
        &r,
        "--userspace",
        &t,
        "--dst",
        "10.96.0.10",
        "--dport",
        "80",
    ];
    let with = |extra: &[&str]| run(&[&base[..], extra].concat());
    let (ok, _, err) = with(&["--mode", "nftables"]);
    assert!(!ok && err.contains("drop --mode nftables"), "{err}");
    let (ok, _, err) = with(&["--mode", "iptables"]);
    assert!(!ok && err.contains("--mode userspace"), "{err}");
    let ipvs = ipvs_dump("ipvs-ours", "ipvsadm-Sn.txt");
    let (ok, _, err) = with(&["--ipvs", &ipvs]);
    assert!(!ok && err.contains("pass one of them"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("table.txt");
    std::fs::write(
        &bad,
        "# header\nTCP 0.0.0.0:36001 default/web:http internal none 10.0.1.4:80\nTCP 0.0.0.0:36002 default/web:http sideways none -\n",
    )
    .unwrap();
    let (ok, _, err) = run(&[
        "trace",
        "--rules",
        &r,
        "--userspace",
        bad.to_str().unwrap(),
        "--dst",
        "10.96.0.10",
        "--dport",
        "80",
    ]);
    assert!(!ok);
    assert!(
        err.contains("table.txt") && err.contains("line 3") && err.contains("field scope"),
        "{err}"
    );
}

#[test]
fn userspace_mode_completes_its_jumps_missing_from_a_partial_dump() {
    let full = std::fs::read_to_string(userspace_dump("iptables-save.txt")).unwrap();
    // `iptables-save | grep -E '^\*|^COMMIT|PORTALS|NODEPORT-(CONTAINER|NON-LOCAL)'`,
    // minus the built-in chains' jumps.
    let partial: String = full
        .lines()
        .filter(|l| !l.starts_with("-A PREROUTING") && !l.starts_with("-A INPUT"))
        .map(|l| format!("{l}\n"))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("partial.txt");
    std::fs::write(&path, partial).unwrap();
    let t = userspace_dump("userspace.txt");
    let (ok, out, err) = run(&[
        "trace",
        "--rules",
        path.to_str().unwrap(),
        "--userspace",
        &t,
        "--dst",
        "192.168.56.10",
        "--dport",
        "30080",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("connects to 10.0.1.4:80  proxied"), "{out}");
    for chain in [
        "KUBE-PORTALS-CONTAINER",
        "KUBE-NODEPORT-CONTAINER",
        "KUBE-NODEPORT-NON-LOCAL",
    ] {
        assert!(
            out.contains("assumed kube-proxy's jump")
                && out.contains(&format!("-j {chain}, which the dump does not contain")),
            "{chain}: {out}"
        );
    }
    // The NodePort jump goes last in PREROUTING, after the portals.
    let pre = out
        .lines()
        .filter(|l| l.starts_with("nat PREROUTING"))
        .collect::<Vec<_>>();
    assert!(pre[0].ends_with("-j KUBE-PORTALS-CONTAINER"), "{out}");
    assert!(pre[1].ends_with("-j KUBE-NODEPORT-CONTAINER"), "{out}");
}

#[test]
fn traces_live_userspace_rules_in_a_namespace() {
    if !require_root() {
        return;
    }
    use std::io::{BufRead as _, BufReader, Write as _};
    let ns = Netns::new("trace-us").unwrap();
    let rules = std::fs::read_to_string(userspace_dump("iptables-save.txt")).unwrap();
    let mut restore = ns
        .command("iptables-restore")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    restore
        .stdin
        .take()
        .unwrap()
        .write_all(rules.as_bytes())
        .unwrap();
    assert!(restore.wait().unwrap().success());
    ns.run("ip", ["addr", "add", "192.168.56.10/24", "dev", "lo"])
        .unwrap();
    let trace = |args: &[&str]| {
        let mut all = vec!["trace", "--live"];
        all.extend_from_slice(args);
        run_in(&ns, &all)
    };
    let pod = [
        "--from",
        "pod",
        "--src",
        "10.0.0.9",
        "--dst",
        "10.96.0.10",
        "--dport",
        "80",
    ];

    // No daemon: `auto` traces the iptables rules alone and says why; `--mode userspace`
    // fails naming the way out.
    let (ok, out, err) = trace(&pod);
    assert!(ok, "{err}");
    assert!(
        err.contains("could not be read from http://127.0.0.1:10249/userspace"),
        "{err}"
    );
    assert!(
        out.contains("DNAT 192.168.56.10:36001  delivered locally"),
        "{out}"
    );
    let (ok, _, err) = trace(&[&["--mode", "userspace"][..], &pod[..]].concat());
    assert!(!ok);
    assert!(err.contains("--userspace FILE"), "{err}");

    // The daemon's table, served where the daemon serves it.
    let table = std::fs::read_to_string(userspace_dump("userspace.txt")).unwrap();
    let listener = ns
        .in_ns(|| std::net::TcpListener::bind("127.0.0.1:10249"))
        .unwrap()
        .unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut request = String::new();
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            while reader.read_line(&mut request).is_ok_and(|n| n > 2) {}
            let (status, body) = if request.starts_with("GET /userspace ") {
                ("200 OK", table.as_str())
            } else {
                ("404 Not Found", "")
            };
            let _ = write!(
                conn,
                "HTTP/1.0 {status}\r\nContent-Type: text/plain\r\n\r\n{body}"
            );
        }
    });
    let (ok, out, err) = trace(&pod);
    assert!(ok, "{err}");
    assert!(err.contains("tracing userspace mode"), "{err}");
    assert!(
        out.contains(
            "50.0%  -> userspace proxy TCP 0.0.0.0:36001  connects to 10.0.1.4:80  proxied"
        ),
        "{out}"
    );
    let (ok, out, err) = trace(&[&["--mode", "userspace"][..], &pod[..]].concat());
    assert!(ok, "{err}");
    assert!(out.contains("connects to 10.0.2.5:80  proxied"), "{out}");
}

/// `n` Services `svc-<i>` (ClusterIP 10.96.<i/200>.<i%200+1>, port 80 -> 8080) with one
/// endpoint each (10.0.<i/200>.<i%200+1>) on another node, as manifest YAML.
fn many_services(n: usize) -> String {
    let mut out = String::new();
    for i in 0..n {
        let (a, b) = (i / 200, i % 200 + 1);
        out.push_str(&format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: svc-{i}\n  namespace: default\n\
             spec:\n  clusterIP: 10.96.{a}.{b}\n  ports:\n  - port: 80\n    protocol: TCP\n    targetPort: 8080\n\
             ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: svc-{i}-x\n  namespace: default\n\
             \x20 labels:\n    kubernetes.io/service-name: svc-{i}\naddressType: IPv4\nendpoints:\n- addresses:\n  - 10.0.{a}.{b}\n\
             \x20 conditions:\n    ready: true\n  nodeName: k8s-worker\nports:\n- port: 8080\n  protocol: TCP\n---\n"
        ));
    }
    out
}

/// `--iptables-dispatch tree` on a dry run: the tracer walks the tree and shows the descent
/// as one line, then the entry and the per-Service chains as in upstream's layout.
#[test]
fn traces_a_tree_layout_dry_run() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    std::fs::write(manifests.join("cluster.yaml"), many_services(300)).unwrap();
    let m = manifests.to_str().unwrap();
    let upstream = dry_run(m, &["--cluster-cidr=10.0.0.0/16"]);
    assert!(!upstream.contains("KUBE-SVT-"));
    let tree = dry_run(
        m,
        &["--cluster-cidr=10.0.0.0/16", "--iptables-dispatch=tree"],
    );
    assert!(tree.contains(":KUBE-SVT-"), "{tree}");
    let file = dir.path().join("tree.txt");
    std::fs::write(&file, &tree).unwrap();
    for (svc, dst, ep) in [
        ("svc-0", "10.96.0.1", "10.0.0.1:8080"),
        ("svc-242", "10.96.1.43", "10.0.1.43:8080"),
    ] {
        let out = traced(
            &file,
            &format!("--from pod --src 10.0.9.9 --dst {dst} --dport 80"),
        );
        assert!(out.contains(&format!("DNAT {ep}")), "{svc}: {out}");
        let descent: Vec<&str> = out
            .lines()
            .filter(|l| l.contains("dispatch tree,"))
            .collect();
        assert_eq!(descent.len(), 1, "{svc}: one line for the descent:\n{out}");
        assert!(
            descent[0].starts_with("nat KUBE-SERVICES  dispatch tree, ")
                && descent[0].contains(" -> KUBE-SVT-"),
            "{svc}: {out}"
        );
        // The entry, upstream's rule in its leaf chain, and upstream's per-Service chains.
        assert!(
            out.lines().any(|l| l.starts_with("nat KUBE-SVT-")
                && l.contains(&format!("-d {dst}/32 -p tcp"))
                && l.contains("-j KUBE-SVC-")),
            "{svc}: {out}"
        );
        assert!(out.contains("KUBE-SEP-"), "{svc}: {out}");
        assert!(out.lines().count() < 25, "{svc}: compact:\n{out}");
    }
    // A ClusterIP nobody has: through part of the tree, back to KUBE-SERVICES, no DNAT.
    let out = traced(
        &file,
        "--from pod --src 10.0.9.9 --dst 10.96.0.250 --dport 80",
    );
    assert!(out.contains("no DNAT"), "{out}");
}

/// Runs the binary with `args`, its standard output a pipe whose reader is gone before
/// anything is written (as `| head -c 100` once head has had its 100 bytes); returns the
/// exit status and stderr.
fn run_into_closed_pipe(args: &[&str]) -> (std::process::ExitStatus, String) {
    use std::io::Read as _;
    use std::process::{Command, Stdio};
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (child.wait().unwrap(), err)
}

/// `trace --json | head -c 100` (and the text output, and `--dry-run`, likewise): a reader
/// that goes away ends the command quietly, with exit status 141 as SIGPIPE gives other Unix
/// tools, not a panic (exit status 101, "failed printing to stdout: Broken pipe").
#[test]
fn a_closed_stdout_ends_trace_and_dry_run_quietly() {
    let trace = [
        "trace",
        "--rules",
        SEED_DUMP,
        "--dst",
        "10.96.138.71",
        "--dport",
        "8080",
    ];
    let mut json = trace.to_vec();
    json.push("--json");
    let dir = common::tempdir();
    let seed = common::write(dir.path(), "cluster.yaml", SEED_CLUSTER);
    let dry = [
        "--dry-run",
        "--manifests",
        seed.to_str().unwrap(),
        "--hostname-override=k8s-master",
    ];
    for args in [&json[..], &trace[..], &dry[..]] {
        let (status, err) = run_into_closed_pipe(args);
        assert_eq!(status.code(), Some(141), "{args:?}: {status}\n{err}");
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe") && !err.contains("error"),
            "{args:?}:\n{err}"
        );
    }
}

/// The seed with the NodePort Service `web` (30080) for IPVS mode's dry run.
const SEED_WITH_NODEPORT: &str = r#"
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
"#;

/// IPVS mode's `--dry-run`, run in a namespace whose only address (198.51.100.7) is not the
/// Node object's (192.168.56.10): the NodePort virtual servers are on the Node object's
/// address, and the header says so; for a node whose Node object is not given, they are on
/// this machine's address, and the header says that. The whole output then traces as IPVS
/// mode with `--rules` alone (its IPVS table and ipsets of the packet's family), and
/// `--ipvs`/`--ipsets` take the same file.
#[test]
fn a_whole_ipvs_dry_run_is_traced_with_its_table_and_the_node_objects_addresses() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("dry-ipvs").unwrap();
    ns.ip(["link", "add", "kp0", "type", "veth", "peer", "name", "kp1"])
        .unwrap();
    ns.ip(["addr", "add", "198.51.100.7/24", "dev", "kp0"])
        .unwrap();
    for dev in ["kp0", "kp1", "lo"] {
        ns.ip(["link", "set", dev, "up"]).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let manifest = common::write(
        dir.path(),
        "cluster.yaml",
        &format!("{SEED_CLUSTER}\n---\n{SEED_WITH_NODEPORT}"),
    );
    let dry = |node: &str| {
        let (ok, out, err) = run_in(
            &ns,
            &[
                "--proxy-mode=ipvs",
                "--dry-run",
                "--manifests",
                manifest.to_str().unwrap(),
                &format!("--hostname-override={node}"),
                "--cluster-cidr=10.0.0.0/16",
            ],
        );
        assert!(ok, "{err}");
        out
    };
    let out = dry("k8s-master");
    assert!(out.contains("-A -t 192.168.56.10:30080 -s rr"), "{out}");
    assert!(!out.contains("198.51.100.7:30080"), "{out}");
    assert!(
        out.contains(
            "# NodePort virtual servers: on the addresses of Node k8s-master (its status.addresses: 192.168.56.10)"
        ),
        "{out}"
    );
    let other = dry("elsewhere");
    assert!(other.contains("-A -t 198.51.100.7:30080 -s rr"), "{other}");
    assert!(
        other.contains("on the addresses of the machine this dry run ran on (198.51.100.7)"),
        "{other}"
    );

    let file = dir.path().join("dry.txt");
    std::fs::write(&file, &out).unwrap();
    let f = file.to_str().unwrap();
    // `--rules` alone: the ClusterIP and the NodePort go through IPVS.
    let out = traced(&file, "--dst 10.96.138.71 --dport 8080");
    assert!(
        out.contains("-> IPVS TCP 10.96.138.71:8080  DNAT 10.0.0.4:80")
            && out.contains("-> IPVS TCP 10.96.138.71:8080  DNAT 10.0.1.2:80"),
        "{out}"
    );
    assert!(
        out.contains(
            "the rules are an IPVS-mode --dry-run: traced with its IPv4 IPVS table and ipsets"
        ),
        "{out}"
    );
    let out = traced(
        &file,
        "--node-ip 192.168.56.10 --dst 192.168.56.10 --dport 30080",
    );
    assert!(
        out.contains("-> IPVS TCP 192.168.56.10:30080  DNAT 10.0.0.4:80"),
        "{out}"
    );
    // `--ipvs` and `--ipsets` on the same file take its sections.
    let (ok, out, err) = run(&[
        "trace",
        "--rules",
        f,
        "--ipvs",
        f,
        "--ipsets",
        f,
        "--dst",
        "10.96.0.80",
        "--dport",
        "80",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("-> IPVS TCP 10.96.0.80:80  DNAT 10.0.1.2:80"),
        "{out}"
    );
    assert!(
        out.contains("the IPVS table is the IPv4 one of the --dry-run output"),
        "{out}"
    );
    // `--mode iptables` traces the iptables part alone (no DNAT: IPVS mode's rules accept).
    let out = traced(&file, "--mode iptables --dst 10.96.138.71 --dport 8080");
    assert!(!out.contains("-> IPVS"), "{out}");
}

/// iptables mode's `--dry-run` says, above the payload, that it is for `iptables-restore
/// --noflush` (a table has several blocks: the canary chains follow the rules) and which nfacct
/// counters it needs. Loaded as it says into a fresh namespace holding a foreign rule (without
/// the counters the restore fails, as the header says; with them it loads), it leaves the
/// foreign rule and holds exactly what the daemon's own `--once` writes into the same.
#[test]
fn an_iptables_dry_run_loads_as_its_header_says_into_what_the_daemon_writes() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let manifest = common::write(
        dir.path(),
        "cluster.yaml",
        &format!("{SEED_CLUSTER}\n---\n{SEED_WITH_NODEPORT}"),
    );
    let args = [
        "--manifests",
        manifest.to_str().unwrap(),
        "--hostname-override=k8s-master",
        "--cluster-cidr=10.0.0.0/16",
    ];
    let foreign = "*filter\n-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\nCOMMIT\n\
                   *nat\n-A POSTROUTING -s 172.17.0.0/16 -j MASQUERADE\nCOMMIT\n";
    let restore = |ns: &Netns, flags: &[&str], input: &str| {
        let mut child = ns
            .command("iptables-restore")
            .args(flags)
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), input.as_bytes()).unwrap();
        drop(child.stdin.take());
        child.wait_with_output().unwrap()
    };
    let fresh = Netns::new("dry-load").unwrap();
    assert!(restore(&fresh, &[], foreign).status.success());
    let mut dry = args.to_vec();
    dry.push("--dry-run");
    let (ok, out, err) = run_in(&fresh, &dry);
    assert!(ok, "{err}");
    let section = out
        .split("# IPv4: iptables-restore input\n")
        .nth(1)
        .and_then(|s| s.split("# IPv6: ").next())
        .unwrap_or_else(|| panic!("no IPv4 section:\n{out}"));
    let header: Vec<&str> = section.lines().take_while(|l| l.starts_with('#')).collect();
    assert!(
        header
            .iter()
            .any(|l| l.contains("for `iptables-restore --noflush` only")),
        "{header:?}"
    );
    // A table with two blocks: what a plain restore would get wrong.
    assert_eq!(
        section.lines().filter(|l| *l == "*nat").count(),
        2,
        "{section}"
    );
    let counters: Vec<String> = section
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split("--nfacct-name ").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_string)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if !counters.is_empty() {
        for c in &counters {
            assert!(
                header
                    .iter()
                    .any(|l| l.contains(&format!("nfacct add {c}"))),
                "the header names {c}: {header:?}"
            );
        }
        let refused = restore(&fresh, &["--noflush"], section);
        assert!(
            !refused.status.success(),
            "a restore without the nfacct counters fails, as the header says"
        );
        let mut nfacct = fresh.in_ns(kp_netlink::Nfacct::new).unwrap().unwrap();
        for c in &counters {
            kp_netlink::NfacctOps::add(&mut nfacct, c).unwrap();
        }
    }
    let loaded = restore(&fresh, &["--noflush"], section);
    assert!(
        loaded.status.success(),
        "iptables-restore --noflush: {}",
        String::from_utf8_lossy(&loaded.stderr)
    );
    let daemon = Netns::new("dry-once").unwrap();
    assert!(restore(&daemon, &[], foreign).status.success());
    let mut once = args.to_vec();
    once.push("--once");
    let (ok, _, err) = run_in(&daemon, &once);
    assert!(ok, "{err}");
    // Both saves, without chain counters and with runs of spaces squeezed (`xt_nfacct`
    // prints two after `--nfacct-name`).
    let rules = |ns: &Netns| -> String {
        common::save(ns, "iptables-save")
            .lines()
            .map(|l| l.split(" [").next().unwrap_or(l).to_string())
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let (from_dry, from_daemon) = (rules(&fresh), rules(&daemon));
    assert!(from_dry.contains("-A KUBE-SVC-"), "{from_dry}");
    assert!(from_dry.contains(":KUBE-PROXY-CANARY"), "{from_dry}");
    assert!(
        from_dry.contains("-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT")
            && from_dry.contains("-A POSTROUTING -s 172.17.0.0/16 -j MASQUERADE"),
        "{from_dry}"
    );
    assert_eq!(
        from_dry, from_daemon,
        "the dry run loads what the daemon writes"
    );
}

/// Userspace mode's whole `--dry-run` output traces through the proxy with `--rules` alone:
/// the proxy table of the packet's family comes with it, as IPVS mode's IPVS table does.
#[test]
fn a_whole_userspace_dry_run_is_traced_through_its_proxy_table() {
    let seed_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/seed-nginx");
    let out = dry_run(
        seed_dir,
        &["--proxy-mode=userspace", "--cluster-cidr=10.0.0.0/16"],
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dry.txt");
    std::fs::write(&file, &out).unwrap();
    let out = traced(&file, "--dst 10.96.138.71 --dport 8080");
    assert!(
        out.contains("connects to 10.0.0.4:80") && out.contains("connects to 10.0.1.2:80"),
        "{out}"
    );
}
