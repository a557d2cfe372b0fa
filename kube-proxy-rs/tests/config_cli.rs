//! `--config` and `--write-config-to` with upstream's KubeProxyConfiguration format, and
//! what `--dry-run` says about the flags it was given (a `--hostname-override` naming no Node).

mod common;

use std::time::{Duration, Instant};

use common::{Daemon, Mode, SEED_MANIFEST as SEED, run};
use kp_testkit::{Netns, require_root};

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

/// With `--config` the file is the configuration, as upstream: an upstream flag given beside
/// it is ignored, with a warning naming the flag and the field to set instead;
/// `--hostname-override` still overrides the file.
#[test]
fn config_values_apply_and_upstream_flags_do_not_override_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.conf");
    std::fs::write(
        &path,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: 10.0.0.0/16\nhostnameOverride: nosuchnode\niptables:\n  masqueradeBit: 5\n",
    )
    .unwrap();
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
        out.contains("! -s 10.0.0.0/16"),
        "clusterCIDR from the file: {out}"
    );
    assert!(
        out.contains("--set-xmark 0x20/0x20"),
        "masqueradeBit from the file: {out}"
    );
    assert!(
        !err.contains("nosuchnode"),
        "--hostname-override overrides the file: {err}"
    );
    let (ok, out, err) = run(&[
        "--config",
        path.to_str().unwrap(),
        "--manifests",
        SEED,
        "--dry-run",
        "--hostname-override=k8s-master",
        "--iptables-masquerade-bit=14",
        "--cluster-cidr=10.99.0.0/16",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("--set-xmark 0x20/0x20") && out.contains("! -s 10.0.0.0/16"),
        "the file wins, as upstream: {out}"
    );
    for (flag, field) in [
        ("--iptables-masquerade-bit", "iptables.masqueradeBit"),
        ("--cluster-cidr", "clusterCIDR"),
    ] {
        assert!(
            err.lines().any(|l| l.contains("WARN")
                && l.contains(&format!("{flag} is ignored: with --config"))
                && l.contains(field)),
            "{flag}: {err}"
        );
    }
}

/// An unknown field is a warning naming its path, and the proxy proceeds, as upstream's
/// lenient decoding of v1alpha1; the name is escaped in the log. A known field with a value
/// of the wrong type stays an error naming the field.
#[test]
fn unknown_fields_are_warnings_naming_their_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.conf");
    std::fs::write(
        &path,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
         iptables:\n  masqueradeBitt: 14\n  masqueradeBit: 5\n\
         \"evil\\nERROR forged\\u001b[31m\": 1\nkubeProxyRs:\n  iptablesDispach: tree\n",
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
        out.contains("--set-xmark 0x20/0x20"),
        "the rest applies: {out}"
    );
    for field in [
        "iptables.masqueradeBitt",
        "evil\\nERROR forged\\u{1b}[31m",
        "kubeProxyRs.iptablesDispach",
    ] {
        assert!(
            err.lines().any(|l| l.contains("WARN")
                && l.contains(&format!(
                    "unknown field \"{field}\" in the configuration file"
                ))),
            "{field}: {err}"
        );
    }
    assert!(!err.lines().any(|l| l.starts_with("ERROR forged")), "{err}");
    assert!(!err.contains('\u{1b}'), "raw escape: {err:?}");

    std::fs::write(
        &path,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nconntrack:\n  min: lots\n",
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
    assert!(err.contains("conntrack.min"), "{err}");
}

/// A file with every field of upstream's newest KubeProxyConfiguration runs: nothing in it
/// is unknown, and the fields without effect here are logged as such.
#[test]
fn the_newest_upstream_file_runs_with_every_field() {
    let full = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/upstream-v1alpha1-full.yaml"
    );
    let (ok, out, err) = run(&["--config", full, "--manifests", SEED, "--dry-run"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("table ip kube-proxy"),
        "mode: nftables from the file: {out}"
    );
    assert!(!err.contains("unknown field"), "{err}");
    for field in [
        "winkernel.networkName",
        "windowsRunAsService",
        "enableProfiling",
        "clientConnection.qps",
    ] {
        assert!(
            err.contains(&format!("config field {field} accepted for compatibility")),
            "{field}: {err}"
        );
    }
}

/// kube-proxy-rs's own flags have fields in the file's `kubeProxyRs` section, so a DaemonSet
/// passing only `--config` can set them; the flag on the command line wins.
#[test]
fn our_own_settings_come_from_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    // More Services than a leaf of the dispatch tree holds (16), so the tree has branches.
    let mut cluster = String::new();
    for i in 1..=40 {
        cluster.push_str(&format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: svc-{i}\nspec:\n  clusterIP: 10.96.1.{i}\n  \
             ports:\n  - port: 80\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  \
             name: svc-{i}-x\n  labels:\n    kubernetes.io/service-name: svc-{i}\naddressType: IPv4\n\
             endpoints:\n- addresses: [10.0.1.{i}]\nports:\n- port: 8080\n---\n"
        ));
    }
    let manifests = dir.path().join("cluster.yaml");
    std::fs::write(&manifests, cluster).unwrap();
    let path = dir.path().join("config.conf");
    std::fs::write(
        &path,
        format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
             hostnameOverride: k8s-master\nkubeProxyRs:\n  manifests: {}\n  iptablesDispatch: tree\n",
            manifests.display()
        ),
    )
    .unwrap();
    let (ok, out, err) = run(&["--config", path.to_str().unwrap(), "--dry-run"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("--to-destination 10.0.1.40:8080"),
        "manifests from the file: {out}"
    );
    assert!(
        out.contains(":KUBE-SVT-"),
        "the dispatch tree from the file: {out}"
    );
    let (ok, out, err) = run(&[
        "--config",
        path.to_str().unwrap(),
        "--dry-run",
        "--iptables-dispatch=upstream",
    ]);
    assert!(ok, "{err}");
    assert!(!out.contains("KUBE-SVT-"), "the command line wins: {out}");
    assert!(!err.contains("is ignored"), "{err}");
}

/// A ConfigMap volume as the kubelet lays it out: `config.conf -> ..data/config.conf`,
/// `..data -> ..<timestamp>`, holding `text`.
fn configmap_volume(dir: &std::path::Path, text: &str) {
    std::fs::create_dir(dir.join("..2026_07_01_00_00_00.000000001")).unwrap();
    std::fs::write(
        dir.join("..2026_07_01_00_00_00.000000001/config.conf"),
        text,
    )
    .unwrap();
    std::os::unix::fs::symlink("..2026_07_01_00_00_00.000000001", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/config.conf", dir.join("config.conf")).unwrap();
}

/// The kubelet's update of a ConfigMap volume: a new timestamped directory, a new `..data`
/// link renamed over the old one, the old directory removed.
fn configmap_update(dir: &std::path::Path, text: &str) {
    let new = "..2026_07_01_00_05_00.000000002";
    std::fs::create_dir(dir.join(new)).unwrap();
    std::fs::write(dir.join(new).join("config.conf"), text).unwrap();
    std::os::unix::fs::symlink(new, dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    std::fs::remove_dir_all(dir.join("..2026_07_01_00_00_00.000000001")).unwrap();
}

/// A DaemonSet that passes only `--config` (and `--hostname-override`), its file in a
/// ConfigMap volume: kube-proxy-rs's own settings come from `kubeProxyRs` (the manifests and
/// the legacy iptables backend, whose rules land in iptables-legacy, not iptables-nft), and
/// a ConfigMap edit makes the daemon exit with status 1 and a line saying why within
/// seconds, so the pod restarts with the new file. A `chmod`/`touch` of the file does not.
#[test]
fn the_daemon_takes_our_settings_from_the_file_and_exits_when_it_changes() {
    if !require_root() {
        return;
    }
    let dir = common::tempdir();
    let volume = dir.path().join("config");
    std::fs::create_dir(&volume).unwrap();
    let text = format!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
         clusterCIDR: 10.0.0.0/16\nkubeProxyRs:\n  manifests: {SEED}\n  iptablesBackend: legacy\n"
    );
    configmap_volume(&volume, &text);
    let conf = volume.join("config.conf");
    let ns = Netns::new("cfgwatch").unwrap();
    let mut daemon = Daemon::start(
        Mode::Iptables,
        &ns,
        dir.path(),
        &[
            "--config",
            conf.to_str().unwrap(),
            "--hostname-override=k8s-master",
            "-v=2",
        ],
        None,
    );
    daemon.wait_until("the rules never reached iptables-legacy", || {
        ns.run("iptables-legacy-save", ["-t", "nat"])
            .is_ok_and(|s| s.contains("-A KUBE-SVC-HL5LMXD5JFHQZ6LN"))
    });
    let nft = ns
        .run("iptables-nft-save", ["-t", "nat"])
        .unwrap_or_default();
    assert!(
        !nft.contains("KUBE-SERVICES"),
        "rules in iptables-nft: {nft}"
    );

    // Metadata only, and the same bytes written again: the daemon keeps running.
    let target = volume.join("..data/config.conf");
    std::fs::set_permissions(&target, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    std::fs::write(&target, &text).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        daemon.is_running(),
        "exited without a change: {}",
        daemon.log()
    );

    let edited = text.replace("clusterCIDR: 10.0.0.0/16", "clusterCIDR: 10.1.0.0/16");
    let swapped = Instant::now();
    configmap_update(&volume, &edited);
    let status = loop {
        if let Some(status) = daemon.guard.try_wait().unwrap() {
            break status;
        }
        assert!(
            swapped.elapsed() < Duration::from_secs(10),
            "still running 10 s after the ConfigMap update: {}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = daemon.log();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.lines().any(|l| l.contains("ERROR")
            && l.contains(conf.to_str().unwrap())
            && l.contains("content of the configuration file was updated")
            && l.contains("the restarted proxy reads the new file")),
        "{log}"
    );
    assert!(log.contains("the programmed rules stay in place"), "{log}");
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
