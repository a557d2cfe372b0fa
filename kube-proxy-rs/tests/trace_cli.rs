//! `kube-proxy-rs trace` as an operator runs it: on upstream kube-proxy's seed dump, on a
//! hand-written dump, and on live rules in a network namespace.

use std::process::Command;

use kp_testkit::golden::SEED_CLUSTER;
use kp_testkit::{Netns, require_root};

const BIN: &str = env!("CARGO_BIN_EXE_kube-proxy-rs");
const SEED_DUMP: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../examples/seed-nginx/expected-iptables-save.txt"
);

fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

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
