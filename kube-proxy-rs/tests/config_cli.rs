//! `--config` and `--write-config-to` with upstream's KubeProxyConfiguration format, and
//! what `--dry-run` says about the flags it was given (a `--hostname-override` naming no Node).

mod common;

use common::{SEED_MANIFEST as SEED, run};

#[test]
fn write_config_to_writes_loadable_upstream_format() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.conf");
    let (ok, _, err) = run(&[
        "--write-config-to",
        path.to_str().unwrap(),
        "--cluster-cidr=10.244.0.0/16",
        "--masquerade-all",
    ]);
    assert!(ok, "{err}");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("apiVersion: kubeproxy.config.k8s.io/v1alpha1"),
        "{text}"
    );
    assert!(text.contains("kind: KubeProxyConfiguration"));
    assert!(text.contains("clusterCIDR: 10.244.0.0/16"), "{text}");
    assert!(text.contains("masqueradeAll: true"), "{text}");
    assert!(
        text.contains("syncPeriod: 30s") && text.contains("minSyncPeriod: 1s"),
        "{text}"
    );
    // And it is accepted back.
    let (ok, out, err) = run(&[
        "--config",
        path.to_str().unwrap(),
        "--manifests",
        SEED,
        "--dry-run",
        "--hostname-override=k8s-master",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("-A KUBE-SVC-HL5LMXD5JFHQZ6LN -d 10.96.138.71/32"),
        "masquerade-all from the file: {out}"
    );
}

#[test]
fn config_values_apply_and_flags_override_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.conf");
    std::fs::write(
        &path,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: 10.0.0.0/16\nhostnameOverride: k8s-master\niptables:\n  masqueradeBit: 5\n",
    )
    .unwrap();
    let (ok, out, err) = run(&[
        "--config",
        path.to_str().unwrap(),
        "--manifests",
        SEED,
        "--dry-run",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("! -s 10.0.0.0/16"),
        "clusterCIDR from the file: {out}"
    );
    assert!(
        out.contains("--set-xmark 0x20/0x20"),
        "masqueradeBit from the file: {out}"
    );
    let (ok, out, _) = run(&[
        "--config",
        path.to_str().unwrap(),
        "--manifests",
        SEED,
        "--dry-run",
        "--iptables-masquerade-bit=14",
    ]);
    assert!(ok);
    assert!(
        out.contains("--set-xmark 0x4000/0x4000"),
        "the command line wins: {out}"
    );
}

#[test]
fn unknown_fields_are_rejected_with_their_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.conf");
    std::fs::write(&path, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\niptables:\n  masqueradeBitt: 14\n").unwrap();
    let (ok, _, err) = run(&[
        "--config",
        path.to_str().unwrap(),
        "--manifests",
        SEED,
        "--dry-run",
    ]);
    assert!(!ok);
    assert!(
        err.contains("iptables") && err.contains("masqueradeBitt"),
        "{err}"
    );
}

/// A `--hostname-override` that names no Node of the manifest is warned about once, not once
/// per IP family.
#[test]
fn a_missing_own_node_is_warned_about_once() {
    let (ok, _, err) = run(&["--manifests", SEED, "--dry-run", "--hostname-override=vm"]);
    assert!(ok, "{err}");
    assert_eq!(
        err.matches("no Node object named \"vm\"").count(),
        1,
        "{err}"
    );
}

/// The file kubeadm generates works as docs/deploy.md says: checked with `--dry-run` against
/// manifests (its kubeconfig does not count as a second source then), and its zero values
/// are upstream's defaults in the effective configuration.
#[test]
fn kubeadms_generated_config_checks_with_dry_run() {
    let kubeadm = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/kubeadm-config.conf"
    );
    let (ok, out, err) = run(&[
        "--config",
        kubeadm,
        "--manifests",
        SEED,
        "--dry-run",
        "--hostname-override=k8s-master",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("-A KUBE-SVC-HL5LMXD5JFHQZ6LN"), "{out}");
    let dir = tempfile::tempdir().unwrap();
    let written = dir.path().join("effective.conf");
    let (ok, _, err) = run(&[
        "--config",
        kubeadm,
        "--write-config-to",
        written.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let text = std::fs::read_to_string(&written).unwrap();
    for line in [
        "healthzBindAddress: 0.0.0.0:10256",
        "metricsBindAddress: 127.0.0.1:10249",
        "  syncPeriod: 30s",
        "  minSyncPeriod: 1s",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
    }
}

/// Upstream's validation allows one cluster CIDR per IP family; a second IPv4 CIDR used to be
/// ignored (its pods' traffic masqueraded). Refused at start, before any rule is printed or
/// written, on the command line and in a `--config` file; one IPv4 plus one IPv6 is fine.
#[test]
fn more_than_one_cluster_cidr_per_family_is_refused() {
    for args in [
        vec!["--cluster-cidr=10.0.0.0/16,10.1.0.0/16"],
        vec![
            "--cluster-cidr",
            "10.0.0.0/16",
            "--cluster-cidr",
            "10.1.0.0/16",
        ],
        vec!["--cluster-cidr=fd00:1::/64,10.0.0.0/16,fd00:2::/64"],
    ] {
        let mut argv = args.clone();
        argv.extend([
            "--manifests",
            SEED,
            "--dry-run",
            "--hostname-override=k8s-master",
        ]);
        let (ok, out, err) = run(&argv);
        assert!(!ok, "{args:?} accepted: {out}");
        assert!(out.is_empty(), "{args:?}: nothing is printed: {out}");
        assert!(
            err.contains("--cluster-cidr:") && err.contains("are both IPv"),
            "{args:?}: {err}"
        );
    }
    let (ok, _, err) = run(&[
        "--cluster-cidr=10.0.0.0/16,10.1.0.0/16",
        "--write-config-to=/dev/null",
    ]);
    assert!(!ok && err.contains("--cluster-cidr:"), "{err}");
    let (_, _, err) = run(&[
        "--cluster-cidr=10.0.0.0/16,10.1.0.0/16",
        "--manifests",
        SEED,
        "--dry-run",
    ]);
    assert!(
        err.contains(
            "\"10.0.0.0/16\" and \"10.1.0.0/16\" are both IPv4; give at most one CIDR per IP \
             family (one IPv4 and one IPv6 CIDR for a dual-stack cluster)"
        ),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.conf");
    std::fs::write(
        &path,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: 10.0.0.0/16,10.1.0.0/16\n",
    )
    .unwrap();
    let (ok, out, err) = run(&[
        "--config",
        path.to_str().unwrap(),
        "--manifests",
        SEED,
        "--dry-run",
    ]);
    assert!(!ok && out.is_empty(), "{out}");
    assert!(
        err.contains("clusterCIDR:") && err.contains("are both IPv4"),
        "{err}"
    );

    // Dual-stack: one of each family.
    let (ok, out, err) = run(&[
        "--cluster-cidr=10.0.0.0/16,fd00:10:244::/64",
        "--manifests",
        SEED,
        "--dry-run",
        "--hostname-override=k8s-master",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("! -s 10.0.0.0/16"), "{out}");
}

/// Writes `text` as a manifest file in a new temporary directory.
fn manifest(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, text).unwrap();
    let path = path.to_str().unwrap().to_string();
    (dir, path)
}

/// An IPv4 address with leading zeros is read as upstream reads it (decimal) and programmed,
/// with a warning naming the object, the field and both spellings; the rules carry only the
/// parsed address.
#[test]
fn leading_zero_addresses_are_programmed_as_decimal() {
    let (_dir, path) = manifest(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  clusterIP: 172.30.0.041\n  \
         externalIPs: [192.168.056.020]\n  ports:\n  - port: 80\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  labels:\n    \
         kubernetes.io/service-name: web\naddressType: IPv4\nendpoints:\n- addresses: [10.180.00.001]\n\
         ports:\n- port: 8080\n",
    );
    let (ok, out, err) = run(&["--manifests", &path, "--dry-run", "--hostname-override=n1"]);
    assert!(ok, "{err}");
    assert!(out.contains("-d 172.30.0.41/32"), "{out}");
    assert!(out.contains("-d 192.168.56.20/32"), "{out}");
    assert!(out.contains("--to-destination 10.180.0.1:8080"), "{out}");
    for sloppy in ["041", "056.020", "00.001"] {
        assert!(!out.contains(sloppy), "{sloppy} in the rules: {out}");
    }
    assert!(
        err.contains(
            "Service default/web: spec.clusterIP: \"172.30.0.041\" has leading zeros; read as \
             172.30.0.41"
        ),
        "{err}"
    );
    assert!(
        err.contains("EndpointSlice default/web-1: endpoints[0].addresses[0]: \"10.180.00.001\""),
        "{err}"
    );
}

/// A name holding a newline or a terminal escape is rejected, and its error is one line with
/// the characters escaped: a manifest cannot forge a log line.
#[test]
fn manifest_text_cannot_forge_log_lines() {
    let (_dir, path) = manifest(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: \"x\\nERROR forged log line\"\nspec:\n  \
         ports:\n  - port: 80\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  \
         namespace: \"\\e[2J\\e[31mred\"\nspec:\n  ports:\n  - port: 80\n",
    );
    let (ok, _, err) = run(&["--manifests", &path, "--dry-run", "--hostname-override=n1"]);
    assert!(!ok, "an object was skipped: {err}");
    assert!(
        !err.lines().any(|l| l.starts_with("ERROR forged")),
        "forged line: {err}"
    );
    assert!(!err.contains('\u{1b}'), "raw escape: {err:?}");
    assert!(
        err.contains("Service default/x\\nERROR forged log line: metadata.name:"),
        "{err}"
    );
    assert!(
        err.contains("Service \\u{1b}[2J\\u{1b}[31mred/web"),
        "{err}"
    );
}

/// A `--manifests` path that cannot be read is reported with the system's reason: a
/// symbolic-link loop is not "no such file or directory". The same inside a directory.
#[test]
fn an_unreadable_manifest_path_names_the_real_reason() {
    let dir = tempfile::tempdir().unwrap();
    let lp = dir.path().join("loop.yaml");
    std::os::unix::fs::symlink(&lp, &lp).unwrap();
    let (ok, _, err) = run(&["--manifests", lp.to_str().unwrap(), "--dry-run"]);
    assert!(!ok);
    assert!(
        err.contains("symbolic links") && !err.to_lowercase().contains("no such file"),
        "{err}"
    );
    let missing = dir.path().join("missing.yaml");
    let (ok, _, err) = run(&["--manifests", missing.to_str().unwrap(), "--dry-run"]);
    assert!(!ok);
    assert!(err.contains("No such file or directory"), "{err}");
    // A loop inside a manifest directory: that file's error says so; the rest is read.
    let m = dir.path().join("m");
    std::fs::create_dir(&m).unwrap();
    std::fs::copy(SEED, m.join("10-seed.yaml")).unwrap();
    let inner = m.join("20-loop.yaml");
    std::os::unix::fs::symlink(&inner, &inner).unwrap();
    let (_, out, err) = run(&["--manifests", m.to_str().unwrap(), "--dry-run"]);
    assert!(
        err.contains("20-loop.yaml") && err.contains("symbolic links"),
        "{err}"
    );
    assert!(out.contains("default/nginx-svc"), "{out}");
}
