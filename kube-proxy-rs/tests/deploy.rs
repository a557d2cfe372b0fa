//! The deployment files in `deploy/` are valid Kubernetes objects shaped like kubeadm's
//! kube-proxy (the ConfigMap's two files at the path kubeadm's `config.conf` names, the
//! command, the labels dashboards select), the ConfigMap's KubeProxyConfiguration is accepted
//! by the binary, and the image (`deploy/Dockerfile`, `deploy/image-rootfs.sh`) holds every
//! program the daemon runs and nothing else: the layout script runs here, and the daemon and
//! each tool run from its result in a chroot, in a network namespace.
//! `deploy_e2e.rs` applies the files to the test API server and runs the daemon as their pod.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};

const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy");
const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
const BIN: &str = env!("CARGO_BIN_EXE_kube-proxy-rs");

/// The memory the DaemonSet requests, MiB: the daemon's peak at 1,000 Services × 10
/// endpoints from the API server in the worst host mode (38.2, iptables-nft) plus the peak
/// of the restore tool it runs during a full sync (48, `nft -f` in nftables mode); the
/// measurements are in docs/deploy.md, "Memory".
const MEMORY_REQUEST_MIB: u64 = 96;

fn docs(file: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(format!("{DEPLOY}/{file}")).unwrap();
    text.split("\n---\n")
        .map(|d| {
            serde_saphyr::from_str::<serde_json::Value>(d).unwrap_or_else(|e| panic!("{file}: {e}"))
        })
        .collect()
}

fn typed<T: serde::de::DeserializeOwned>(v: serde_json::Value, what: &str) -> T {
    serde_path_to_error::deserialize(v)
        .unwrap_or_else(|e| panic!("{what}: {} at {}", e.inner(), e.path()))
}

#[test]
fn rbac_matches_upstream_node_proxier_permissions() {
    let mut sa = None;
    let mut role = None;
    let mut binding = None;
    for d in docs("rbac.yaml") {
        match d["kind"].as_str().unwrap() {
            "ServiceAccount" => sa = Some(typed::<ServiceAccount>(d, "ServiceAccount")),
            "ClusterRole" => role = Some(typed::<ClusterRole>(d, "ClusterRole")),
            "ClusterRoleBinding" => {
                binding = Some(typed::<ClusterRoleBinding>(d, "ClusterRoleBinding"))
            }
            k => panic!("unexpected kind {k}"),
        }
    }
    let (sa, role, binding) = (sa.unwrap(), role.unwrap(), binding.unwrap());
    let rules = role.rules.unwrap();
    let allows = |group: &str, resource: &str, verb: &str| {
        rules.iter().any(|r| {
            r.api_groups
                .as_ref()
                .is_some_and(|g| g.iter().any(|x| x == group))
                && r.resources
                    .as_ref()
                    .is_some_and(|x| x.iter().any(|x| x == resource))
                && r.verbs.iter().any(|x| x == verb)
        })
    };
    for (g, r, v) in [
        ("", "services", "list"),
        ("", "services", "watch"),
        ("", "nodes", "get"),
        ("", "nodes", "watch"),
        ("discovery.k8s.io", "endpointslices", "list"),
        ("discovery.k8s.io", "endpointslices", "watch"),
        ("networking.k8s.io", "servicecidrs", "list"),
        ("networking.k8s.io", "servicecidrs", "watch"),
        ("events.k8s.io", "events", "create"),
    ] {
        assert!(allows(g, r, v), "{v} {g}/{r} missing");
    }
    assert!(
        !allows("", "services", "update"),
        "no write access to Services"
    );
    let subject = &binding.subjects.unwrap()[0];
    assert_eq!(subject.name, sa.metadata.name.unwrap());
    assert_eq!(binding.role_ref.name, role.metadata.name.unwrap());
}

fn daemonset() -> DaemonSet {
    typed(docs("daemonset.yaml").remove(0), "DaemonSet")
}

fn configmap() -> ConfigMap {
    typed(docs("configmap.yaml").remove(0), "ConfigMap")
}

/// The DaemonSet runs kubeadm's command with the ConfigMap where kubeadm mounts its own, and
/// the ConfigMap has kubeadm's two keys, so kubeadm's `config.conf` and `kubeconfig.conf`
/// work in it unchanged: the kubeconfig `config.conf` names is in the volume, and the
/// kubeconfig's credentials are the pod's service account. The shipped `config.conf` is
/// accepted by the binary.
#[test]
fn daemonset_mounts_the_configmap_as_kubeadm_does() {
    let ds = daemonset();
    let pod = ds.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.service_account_name.as_deref(), Some("kube-proxy-rs"));
    let c = &pod.containers[0];
    assert!(
        c.security_context
            .as_ref()
            .and_then(|s| s.privileged)
            .unwrap_or(false)
    );
    assert_eq!(
        c.command.as_deref().unwrap(),
        [
            "/usr/local/bin/kube-proxy-rs",
            "--config=/var/lib/kube-proxy/config.conf",
            "--hostname-override=$(NODE_NAME)"
        ],
        "kubeadm's command"
    );
    let cm = configmap();
    let cm_name = cm.metadata.name.clone().unwrap();
    let volume = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.config_map.as_ref().is_some_and(|c| c.name == cm_name))
        .expect("the ConfigMap is a volume");
    let mount = c
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.name == volume.name)
        .expect("and mounted");
    assert_eq!(
        mount.mount_path, "/var/lib/kube-proxy",
        "where kubeadm mounts it"
    );

    let data = cm.data.unwrap();
    let mut keys: Vec<&String> = data.keys().collect();
    keys.sort();
    assert_eq!(keys, ["config.conf", "kubeconfig.conf"], "kubeadm's keys");
    let conf: serde_json::Value = serde_saphyr::from_str(&data["config.conf"]).unwrap();
    assert_eq!(
        conf["clientConnection"]["kubeconfig"],
        format!("{}/kubeconfig.conf", mount.mount_path),
        "config.conf names the mounted kubeconfig"
    );
    let kubeconfig: serde_json::Value = serde_saphyr::from_str(&data["kubeconfig.conf"]).unwrap();
    let sa = "/var/run/secrets/kubernetes.io/serviceaccount";
    assert_eq!(
        kubeconfig["clusters"][0]["cluster"]["certificate-authority"],
        format!("{sa}/ca.crt")
    );
    assert_eq!(
        kubeconfig["users"][0]["user"]["tokenFile"],
        format!("{sa}/token")
    );
    assert!(
        kubeconfig["clusters"][0]["cluster"]["server"]
            .as_str()
            .unwrap()
            .starts_with("https://"),
        "the control plane, over TLS"
    );

    // The shipped config.conf is accepted (with --manifests the kubeconfig is not read).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.conf");
    std::fs::write(&path, &data["config.conf"]).unwrap();
    let seed = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/seed-nginx/cluster.yaml"
    );
    let out = std::process::Command::new(BIN)
        .args([
            "--config",
            path.to_str().unwrap(),
            "--manifests",
            seed,
            "--dry-run",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What a cluster can run: a pinned image (the workspace version), readiness on /readyz and
/// no liveness probe (as upstream), a memory request from the measured figures and no limit
/// (as upstream), kube-proxy's label on the pods (not in the DaemonSet's selector), and an
/// opt-in node label.
#[test]
fn daemonset_image_probes_resources_and_labels() {
    let ds = daemonset();
    let spec = ds.spec.unwrap();
    let pod = spec.template.spec.unwrap();
    let c = &pod.containers[0];
    let image = c.image.as_deref().unwrap();
    assert_eq!(
        image.rsplit_once(':').map(|(_, tag)| tag),
        Some(format!("v{}", env!("CARGO_PKG_VERSION")).as_str()),
        "the image is pinned to the workspace version: {image}"
    );
    assert!(c.liveness_probe.is_none(), "no liveness probe, as upstream");
    let ready = c
        .readiness_probe
        .as_ref()
        .and_then(|p| p.http_get.as_ref())
        .unwrap();
    assert_eq!(ready.path.as_deref(), Some("/readyz"));
    assert_eq!(
        ready.port,
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(10256)
    );
    let resources = c.resources.as_ref().unwrap();
    assert!(resources.limits.is_none(), "no limits, as upstream");
    let memory = &resources.requests.as_ref().unwrap()["memory"].0;
    let mib: u64 = memory.strip_suffix("Mi").unwrap().parse().unwrap();
    assert_eq!(mib, MEMORY_REQUEST_MIB, "{memory}");

    let labels = spec.template.metadata.unwrap().labels.unwrap();
    assert_eq!(
        labels["k8s-app"], "kube-proxy",
        "what kube-proxy's dashboards select"
    );
    let selector = spec.selector.match_labels.unwrap();
    assert!(
        !selector.contains_key("k8s-app"),
        "the selector is ours alone: {selector:?}"
    );
    assert!(selector.iter().all(|(k, v)| labels.get(k) == Some(v)));

    let affinity = serde_json::to_value(pod.affinity.unwrap()).unwrap();
    assert_eq!(
        affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0],
        serde_json::json!({"key": "kube-proxy-rs/proxy", "operator": "In", "values": ["kube-proxy-rs"]}),
        "nodes opt in"
    );
}

/// The pre-flight Job is the DaemonSet's pod (image, service account, network, ConfigMap at
/// the same path) running the same command with `--dry-run`.
#[test]
fn preflight_job_is_the_daemonsets_pod_with_dry_run() {
    let job: k8s_openapi::api::batch::v1::Job = typed(docs("preflight/job.yaml").remove(0), "Job");
    let job_pod = job.spec.unwrap().template.spec.unwrap();
    let ds_pod = daemonset().spec.unwrap().template.spec.unwrap();
    let (jc, dc) = (&job_pod.containers[0], &ds_pod.containers[0]);
    assert_eq!(jc.image, dc.image);
    assert_eq!(job_pod.service_account_name, ds_pod.service_account_name);
    assert_eq!(job_pod.host_network, Some(true));
    let mut command = dc.command.clone().unwrap();
    command.push("--dry-run".into());
    assert_eq!(jc.command.as_ref(), Some(&command));
    assert_eq!(jc.env, dc.env);
    let config_mount = |c: &k8s_openapi::api::core::v1::Container,
                        p: &k8s_openapi::api::core::v1::PodSpec| {
        let m = c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.mount_path == "/var/lib/kube-proxy")
            .unwrap()
            .clone();
        let v = p
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == m.name)
            .unwrap()
            .clone();
        v.config_map.unwrap().name
    };
    assert_eq!(config_mount(jc, &job_pod), config_mount(dc, &ds_pod));
}

/// The Dockerfile builds the pinned version (VERSION must be the workspace's), from a build
/// context without target/ and .git, onto an empty image laid out by image-rootfs.sh.
#[test]
fn dockerfile_and_build_context() {
    let dockerfile = std::fs::read_to_string(format!("{DEPLOY}/Dockerfile")).unwrap();
    let stages: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(stages.last(), Some(&"FROM scratch"), "{stages:?}");
    assert!(dockerfile.contains("RUN sh /image-rootfs.sh /rootfs /kube-proxy-rs"));
    assert!(dockerfile.contains("COPY --from=rootfs /rootfs/ /"));
    assert!(dockerfile.contains("\"${VERSION}\" != \"${workspace}\""));
    let last = dockerfile.rsplit("FROM scratch").next().unwrap();
    assert!(
        !last.contains("RUN "),
        "nothing runs in the final image: no shell there"
    );

    let ignore = std::fs::read_to_string(format!("{REPO}/.dockerignore")).unwrap();
    let entries: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    for must in ["target", "**/target", ".git"] {
        assert!(
            entries.contains(&must),
            "{must} not in .dockerignore: {entries:?}"
        );
    }
}

/// Every program name the daemon can run: the iptables tools of both families and every
/// backend (as `kp_netfilter::ExecIptables` names them), `nft` and `ipset`.
fn daemon_programs() -> std::collections::BTreeSet<String> {
    use kp_netfilter::{Backend, ExecIptables, IpVersion, Tool};
    let mut out = std::collections::BTreeSet::new();
    for version in [IpVersion::V4, IpVersion::V6] {
        for backend in [Backend::Default, Backend::Nft, Backend::Legacy] {
            for tool in [Tool::Main, Tool::Save, Tool::Restore] {
                out.insert(ExecIptables::new(version, backend).binary(tool));
            }
        }
    }
    out.insert(kp_netfilter::nft::NFT_BINARY.to_string());
    out.insert(kp_netfilter::ipset::IPSET_BINARY.to_string());
    out
}

/// The daemon's code runs programs in one place only (`kp_netfilter`'s `SystemExec`, with
/// the names of [`daemon_programs`]) plus the literal names it passes to `Command::new`; a
/// new way to run something must be added to the image and to this test.
#[test]
fn the_daemon_runs_only_the_programs_the_image_has() {
    let mut literal = std::collections::BTreeSet::new();
    let mut dynamic = Vec::new();
    let mut dirs = vec![std::path::PathBuf::from(format!(
        "{REPO}/kube-proxy-rs/src"
    ))];
    for entry in std::fs::read_dir(format!("{REPO}/crates")).unwrap() {
        let path = entry.unwrap().path();
        // Test and benchmark support, not the daemon.
        if !path.ends_with("testkit") && !path.ends_with("bench") {
            dirs.push(path.join("src"));
        }
    }
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            // The sandbox subcommand (a lab on one machine) is not what the image runs.
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("sandbox.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for (i, line) in text.lines().enumerate() {
                let code = line.trim_start();
                if code.starts_with("//") {
                    continue;
                }
                if let Some(rest) = code.split("Command::new(").nth(1) {
                    match rest.strip_prefix('"') {
                        Some(name) => {
                            literal.insert(name.split('"').next().unwrap().to_string());
                        }
                        None => dynamic.push(format!("{}:{}", path.display(), i + 1)),
                    }
                }
            }
        }
    }
    assert_eq!(dynamic.len(), 1, "one SystemExec: {dynamic:?}");
    assert!(
        dynamic[0].contains("netfilter/src/iptables/runner.rs"),
        "{dynamic:?}"
    );
    let image = daemon_programs();
    for name in literal {
        assert!(
            name == "/proc/self/exe" || image.contains(&name),
            "the daemon runs {name}, which the image does not have"
        );
    }
}

/// Runs `sh -c script` in `ns`; panics with the output when it fails.
fn sh(ns: &kp_testkit::Netns, script: &str) -> String {
    let out = ns.command("sh").args(["-c", script]).output().unwrap();
    assert!(
        out.status.success(),
        "{script}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// deploy/image-rootfs.sh's tree (the image's file system): every program the daemon runs is
/// there and runs from it (in a chroot, so only the tree's libraries are found), nothing
/// provides a shell or a package manager, and the daemon from the tree programs a network
/// namespace in iptables mode (both backends) and nftables mode with the tree's tools.
#[test]
fn image_rootfs_holds_what_the_daemon_runs_and_nothing_else() {
    if !kp_testkit::require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("rootfs");
    let out = std::process::Command::new("sh")
        .arg(format!("{DEPLOY}/image-rootfs.sh"))
        .arg(&root)
        .arg(BIN)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut names = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                dirs.push(path.clone());
            }
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    for absent in [
        "sh", "bash", "dash", "busybox", "apt", "apt-get", "dpkg", "perl",
    ] {
        assert!(
            !names.iter().any(|n| n == absent),
            "{absent} is in the image"
        );
    }

    let chroot = |args: &[&str]| {
        std::process::Command::new("chroot")
            .arg(&root)
            .args(args)
            .output()
            .unwrap()
    };
    for program in daemon_programs() {
        let arg = if program == "ipset" {
            "version"
        } else {
            "--version"
        };
        let out = chroot(&[&format!("/usr/sbin/{program}"), arg]);
        assert!(
            out.status.success(),
            "{program} from the image: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let version = chroot(&["/usr/local/bin/kube-proxy-rs", "--version"]);
    assert!(
        String::from_utf8_lossy(&version.stdout).contains(env!("CARGO_PKG_VERSION")),
        "{version:?}"
    );
    assert!(!chroot(&["/bin/sh", "-c", "true"]).status.success());

    // The daemon from the image, in a namespace, with the image's tools (as the container
    // runtime gives it: /proc, /sys, /dev).
    std::fs::copy(
        format!("{REPO}/examples/seed-nginx/cluster.yaml"),
        root.join("cluster.yaml"),
    )
    .unwrap();
    let ns = kp_testkit::Netns::new("image").unwrap();
    let root_s = root.display().to_string();
    // kube-proxy-rs ARGS from the image.
    let run = |args: &str| {
        sh(
            &ns,
            &format!(
                "mount -t proc proc {root_s}/proc && mount --rbind /sys {root_s}/sys && \
                 mount --rbind /dev {root_s}/dev && exec chroot {root_s} /usr/local/bin/kube-proxy-rs {args} 2>&1"
            ),
        )
    };
    let once = "--once --manifests /cluster.yaml --hostname-override=k8s-master --cluster-cidr=10.0.0.0/16";
    for (backend, save) in [
        ("--iptables-backend=nft", "iptables-nft-save"),
        ("--iptables-backend=legacy", "iptables-legacy-save"),
    ] {
        let log = run(&format!("{once} {backend}"));
        let rules = ns.run(save, ["-t", "nat"]).unwrap();
        assert!(rules.contains("-A KUBE-SVC-"), "{backend}: {rules}\n{log}");
        let log = run(&format!("--cleanup {backend}"));
        assert!(
            !ns.run(save, ["-t", "nat"]).unwrap().contains("KUBE-SVC-"),
            "{log}"
        );
    }
    let log = run(&format!("{once} --proxy-mode=nftables"));
    let table = ns
        .run("nft", ["list", "table", "ip", "kube-proxy"])
        .unwrap_or_default();
    assert!(table.contains("chain service-"), "{table}\n{log}");
}
