//! docs/deploy.md's path, end to end, where an operator meets it: `kubectl` runs the page's
//! command blocks as they are written against the test API server (HTTPS with a test CA,
//! requiring a service-account token, holding kubeadm's kube-proxy ConfigMap and DaemonSet),
//! and the daemon runs in a network namespace as the applied DaemonSet's pod would: its
//! command, its environment (with the kubelet's `KUBERNETES_SERVICE_*` pointing at an
//! unreachable ClusterIP), the ConfigMap's files at the volume's mount path and the service
//! account's token and CA at their paths (kp-testkit's `kubelet::Pod`, which the
//! `test-cluster` tool's kubelet runs too). The only substitutions are the ones a
//! real pod would get differently: the binary's path, and the server address kubeadm wrote
//! into its kubeconfig (the test server's).
//!
//! Also: the pre-flight check (the Job's command) fails in bounded time naming the server
//! when the only address is the `kubernetes` ClusterIP, or the shipped ConfigMap's
//! placeholder; the documented fallback (`KUBERNETES_SERVICE_HOST` set to the control plane)
//! works; `--dry-run --master http://127.0.0.1:1` ends in seconds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, PodSpec};
use kp_testkit::apiserver::{ApiKind, ApiServerOptions, TestApiServer, TestCerts};
use kp_testkit::golden::SEED_CLUSTER;
use kp_testkit::kubeadm::kube_proxy_objects;
use kp_testkit::kubelet::{Pod, PodContext, SERVICE_ACCOUNT_DIR, ServiceAccountFiles, schedules};
use kp_testkit::pod::PodFiles;
use kp_testkit::{ChildGuard, Netns, require_root};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_kube-proxy-rs");

/// The service-account token the test server requires, and the pod's token file holds.
const TOKEN: &str = "kp-e2e-service-account-token";

/// What the kubelet gives every container of a kubeadm cluster: the `kubernetes` Service's
/// ClusterIP, unreachable here as on a node without Service rules.
const KUBELET_ENV: [(&str, &str); 3] = [
    ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
    ("KUBERNETES_SERVICE_PORT", "443"),
    ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The test API server, serving HTTPS with `certs` and requiring [`TOKEN`], on a thread
/// inside `ns`; the sender stops it.
fn api_server_in(
    ns: &Netns,
    certs: &TestCerts,
) -> (TestApiServer, tokio::sync::oneshot::Sender<()>) {
    let (tx, rx) = mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let options = ApiServerOptions {
        tls: Some(certs.clone()),
        bearer_token: Some(TOKEN.into()),
    };
    ns.spawn_in(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let server = TestApiServer::start_with(options).await.unwrap();
            tx.send(server).unwrap();
            let _ = stop_rx.await;
        });
    })
    .unwrap();
    (rx.recv_timeout(Duration::from_secs(10)).unwrap(), stop_tx)
}

/// The seed cluster's objects; the Nodes get the label every real node has
/// (`kubernetes.io/os: linux`, which both DaemonSets select).
fn seed_objects() -> Vec<Value> {
    SEED_CLUSTER
        .split("\n---\n")
        .map(|doc| {
            let mut v: Value = serde_saphyr::from_str(doc).unwrap();
            if v["kind"] == "Node" {
                v["metadata"]["labels"]["kubernetes.io/os"] = "linux".into();
            }
            v
        })
        .collect()
}

/// `kubectl` in `ns` as a cluster admin of the test server.
struct Kubectl<'a> {
    ns: &'a Netns,
    kubeconfig: PathBuf,
}

impl Kubectl<'_> {
    fn new<'a>(ns: &'a Netns, dir: &Path, server: &str, ca: &Path) -> Kubectl<'a> {
        let kubeconfig = dir.join("admin.conf");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    \
                 certificate-authority: {}\nusers:\n- name: admin\n  user:\n    token: {TOKEN}\n\
                 contexts:\n- name: admin\n  context:\n    cluster: test\n    user: admin\n\
                 current-context: admin\n",
                ca.display()
            ),
        )
        .unwrap();
        Kubectl { ns, kubeconfig }
    }

    /// `kubectl ARGS`; (success, stdout, stderr).
    fn try_run(&self, args: &[&str]) -> (bool, String, String) {
        let out = self
            .ns
            .command("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run kubectl (scripts/install-deps installs it): {e}")
            });
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn run(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.try_run(args);
        assert!(ok, "kubectl {}: {err}{out}", args.join(" "));
        out
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.extend(["-o", "json"]);
        serde_json::from_str(&self.run(&args)).unwrap()
    }

    /// Runs docs/deploy.md's block tagged `tag` with bash in `cwd`, with `env`.
    fn block(&self, tag: &str, cwd: &Path, env: &[(&str, &str)]) -> String {
        let script = doc_block(tag);
        let out = self
            .ns
            .command("bash")
            .args(["-euo", "pipefail", "-c", &script])
            .current_dir(cwd)
            .env("KUBECONFIG", &self.kubeconfig)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "docs/deploy.md block {tag}:\n{script}\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// docs/deploy.md's ```` ```sh TAG ```` block.
fn doc_block(tag: &str) -> String {
    let doc = read(&repo().join("docs/deploy.md"));
    let mut lines = doc
        .lines()
        .skip_while(|l| l.trim() != format!("```sh {tag}"));
    assert!(
        lines.next().is_some(),
        "docs/deploy.md has no ```sh {tag} block"
    );
    let block: Vec<&str> = lines.take_while(|l| l.trim() != "```").collect();
    block.join("\n") + "\n"
}

/// `ds`'s pod template, typed.
fn template(ds: &Value) -> PodSpec {
    serde_json::from_value::<DaemonSet>(ds.clone())
        .unwrap()
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
}

/// Which proxy each node would run: node name → DaemonSet names.
fn placement(kubectl: &Kubectl) -> BTreeMap<String, Vec<String>> {
    let nodes = kubectl.json(&["get", "nodes"]);
    let daemonsets = kubectl.json(&["-n", "kube-system", "get", "daemonsets"]);
    let mut out = BTreeMap::new();
    for node in nodes["items"].as_array().unwrap() {
        let name = node["metadata"]["name"].as_str().unwrap().to_string();
        let on: Vec<String> = daemonsets["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|ds| {
                let node: Node = serde_json::from_value(node.clone()).unwrap();
                schedules(&template(ds), &node).unwrap()
            })
            .map(|ds| ds["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        out.insert(name, on);
    }
    out
}

fn expect_placement(kubectl: &Kubectl, master: &[&str], worker: &[&str], when: &str) {
    let got = placement(kubectl);
    let want: BTreeMap<String, Vec<String>> = [
        (
            "k8s-master".to_string(),
            master.iter().map(|s| s.to_string()).collect(),
        ),
        (
            "k8s-worker".to_string(),
            worker.iter().map(|s| s.to_string()).collect(),
        ),
    ]
    .into();
    assert_eq!(got, want, "which DaemonSet runs where, {when}");
}

/// The pod of `pod_spec` on node `node`, with the ConfigMaps of `kubectl`'s server, as the
/// kubelet would run it; its program is the image's binary.
fn pod(
    kubectl: &Kubectl,
    pod_spec: &PodSpec,
    node: &str,
    dir: &Path,
    ca: &Path,
    kubelet_env: &[(&str, &str)],
) -> Pod {
    let config_maps: BTreeMap<String, ConfigMap> = Pod::config_map_names(pod_spec)
        .into_iter()
        .map(|name| {
            let cm = kubectl.json(&["-n", "kube-system", "get", "configmap", &name]);
            (name, serde_json::from_value(cm).unwrap())
        })
        .collect();
    let env: Vec<(String, String)> = kubelet_env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let ctx = PodContext {
        namespace: "kube-system",
        pod_name: "kube-proxy-rs-canary",
        node_name: node,
        node_ip: None,
        config_maps: &config_maps,
        service_account: &ServiceAccountFiles {
            token: TOKEN.into(),
            ca_pem: read(ca),
        },
        kubelet_env: &env,
    };
    let pod = Pod::new(pod_spec, &ctx, dir).unwrap();
    assert_eq!(
        pod.program, "/usr/local/bin/kube-proxy-rs",
        "the image's binary"
    );
    pod
}

/// `GET path` on 127.0.0.1:`port` inside `ns`: the status code and the body.
fn http_get(ns: &Netns, port: u16, path: &str) -> (u16, String) {
    let out = ns
        .command("bash")
        .arg("-c")
        .arg(format!(
            "exec 3<>/dev/tcp/127.0.0.1/{port} && printf 'GET {path} HTTP/1.0\\r\\n\\r\\n' >&3 && cat <&3"
        ))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (code, body)
}

/// The nat table of both iptables backends in `ns`.
fn nat_rules(ns: &Netns) -> String {
    ["iptables-save", "iptables-legacy-save"]
        .iter()
        .filter_map(|save| ns.run(save, ["-t", "nat"]).ok())
        .collect()
}

/// Copies `deploy/` (without the image's files) into `dir/deploy`, as an operator's checkout.
fn checkout(dir: &Path) -> PathBuf {
    let work = dir.join("checkout");
    for file in [
        "rbac.yaml",
        "configmap.yaml",
        "daemonset.yaml",
        "preflight/job.yaml",
    ] {
        let to = work.join("deploy").join(file);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(repo().join("deploy").join(file), &to).unwrap();
    }
    work
}

fn kubectl_installed() -> bool {
    let found = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "kubectl is not installed: scripts/install-deps installs it (the deploy tests run it)"
    );
    found
}

#[test]
fn kubeadm_cluster_moves_node_by_node_as_documented() {
    if !require_root() || !kubectl_installed() {
        return;
    }
    let ns = Netns::new("deploy").unwrap();
    let dir = tempfile::Builder::new()
        .prefix("kp-deploy-")
        .tempdir()
        .unwrap();
    let certs_dir = dir.path().join("certs");
    std::fs::create_dir(&certs_dir).unwrap();
    let certs = TestCerts::generate(&certs_dir).unwrap();
    let (api, _stop) = api_server_in(&ns, &certs);
    for object in seed_objects() {
        api.upsert_value(object).unwrap();
    }
    let kubectl = Kubectl::new(&ns, dir.path(), &api.url(), &certs.ca_cert);

    // A kubeadm cluster: its kube-proxy ConfigMap (the kubeconfig's server is the control
    // plane, here the test server) and DaemonSet.
    let kubeadm = dir.path().join("kubeadm.yaml");
    std::fs::write(&kubeadm, kube_proxy_objects(&api.url())).unwrap();
    kubectl.run(&["create", "-f", kubeadm.to_str().unwrap()]);
    expect_placement(
        &kubectl,
        &["kube-proxy"],
        &["kube-proxy"],
        "in kubeadm's cluster",
    );

    // Step 1: kubeadm's files, copied into deploy/configmap.yaml.
    let work = checkout(dir.path());
    kubectl.block("copy-config", &work, &[]);
    let configmap = read(&work.join("deploy/configmap.yaml"));
    assert!(
        configmap.contains(&format!("server: {}", api.url()))
            && configmap.contains("kubeconfig: /var/lib/kube-proxy/kubeconfig.conf"),
        "{configmap}"
    );

    // Step 2: a server-side dry run stores nothing; the documented apply stores everything,
    // and starts nothing (no node is labelled).
    kubectl.run(&[
        "apply",
        "--dry-run=server",
        "-f",
        work.join("deploy").to_str().unwrap(),
    ]);
    let (found, _, err) =
        kubectl.try_run(&["-n", "kube-system", "get", "daemonset", "kube-proxy-rs"]);
    assert!(!found && err.contains("NotFound"), "{err}");
    let applied = kubectl.block("apply", &work, &[]);
    for object in [
        "serviceaccount/kube-proxy-rs",
        "clusterrole.rbac.authorization.k8s.io/kube-proxy-rs",
        "clusterrolebinding.rbac.authorization.k8s.io/kube-proxy-rs",
        "configmap/kube-proxy-rs",
        "daemonset.apps/kube-proxy-rs",
    ] {
        assert!(applied.contains(&format!("{object} created")), "{applied}");
    }
    kubectl.run(&[
        "create",
        "--dry-run=server",
        "-f",
        work.join("deploy/preflight/job.yaml").to_str().unwrap(),
    ]);
    expect_placement(&kubectl, &["kube-proxy"], &["kube-proxy"], "after step 2");

    // Step 3, then the canary (step 4): exactly one proxy on every node at each step.
    kubectl.block("kube-proxy-leaves-labelled-nodes", &work, &[]);
    expect_placement(&kubectl, &["kube-proxy"], &["kube-proxy"], "after step 3");
    kubectl.block("canary", &work, &[("CANARY", "k8s-master")]);
    expect_placement(
        &kubectl,
        &["kube-proxy-rs"],
        &["kube-proxy"],
        "with the canary",
    );

    // The canary's pod, as the kubelet would run it, from the objects the server holds. Its
    // first list is held: not Ready (/readyz 503) while /healthz, upstream's, is 200.
    let ds = kubectl.json(&["-n", "kube-system", "get", "daemonset", "kube-proxy-rs"]);
    let pod_spec = &ds["spec"]["template"]["spec"];
    let pod = pod(
        &kubectl,
        &template(&ds),
        "k8s-master",
        dir.path(),
        &certs.ca_cert,
        &KUBELET_ENV,
    );
    let probe = &pod_spec["containers"][0]["readinessProbe"]["httpGet"];
    let (ready_path, ready_port) = (
        probe["path"].as_str().unwrap().to_string(),
        u16::try_from(probe["port"].as_u64().unwrap()).unwrap(),
    );
    api.hold_lists(true);
    let log_path = dir.path().join("proxy.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut cmd = pod.command(&ns, BIN).unwrap();
    cmd.arg("-v=2")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    let mut proxy = ChildGuard::spawn(&mut cmd, "kube-proxy-rs").unwrap();
    let proxy_log = || read(&log_path);
    proxy
        .wait_for(
            || {
                api.requests()
                    .iter()
                    .any(|r| r.kind == Some(ApiKind::Service) && !r.watch)
                    && http_get(&ns, 10256, "/healthz").0 == 200
            },
            Duration::from_secs(30),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", proxy_log()));
    std::thread::sleep(Duration::from_millis(300));
    let (code, body) = http_get(&ns, ready_port, &ready_path);
    assert_eq!(
        code,
        503,
        "readiness before the first sync: {body}\n{}",
        proxy_log()
    );
    assert!(body.starts_with("first sync not done"), "{body}");
    assert!(
        !nat_rules(&ns).contains("KUBE-SVC-"),
        "nothing programmed yet"
    );

    // Released: the rules, then Ready.
    api.hold_lists(false);
    proxy
        .wait_for(
            || {
                nat_rules(&ns).contains("-A KUBE-SVC-")
                    && http_get(&ns, ready_port, &ready_path).0 == 200
            },
            Duration::from_secs(30),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", proxy_log()));
    let (code, body) = http_get(&ns, 10256, "/healthz");
    assert_eq!(code, 200, "{body}");
    let log = proxy_log();
    assert!(
        log.contains(&format!(
            "API server {} (from --kubeconfig /var/lib/kube-proxy/kubeconfig.conf)",
            api.url()
        )),
        "the start names the server and where it came from:\n{log}"
    );
    assert!(
        !log.contains("ClusterIP"),
        "no in-cluster warning with a kubeconfig:\n{log}"
    );
    drop(proxy);

    // Rolling back the canary, then everything.
    kubectl.block("rollback-node", &work, &[("NODE", "k8s-master")]);
    expect_placement(
        &kubectl,
        &["kube-proxy"],
        &["kube-proxy"],
        "after rolling the canary back",
    );
    kubectl.block("canary", &work, &[("CANARY", "k8s-worker")]);
    expect_placement(
        &kubectl,
        &["kube-proxy"],
        &["kube-proxy-rs"],
        "with another canary",
    );
    kubectl.block("rollback-all", &work, &[]);
    expect_placement(
        &kubectl,
        &["kube-proxy"],
        &["kube-proxy"],
        "after rolling everything back",
    );
    let kube_proxy = kubectl.json(&["-n", "kube-system", "get", "daemonset", "kube-proxy"]);
    assert!(
        kube_proxy["spec"]["template"]["spec"]
            .get("affinity")
            .is_none(),
        "kube-proxy's template is kubeadm's again: {kube_proxy}"
    );
}

/// A pod whose only address for the API server is the in-cluster one (the kubelet's
/// `KUBERNETES_SERVICE_HOST`, the `kubernetes` ClusterIP): the pre-flight check (the Job's
/// command) fails within seconds, naming the address; the daemon says which address it
/// tries and why it will not answer, and is never Ready. The documented fallback (the
/// variables pointed at the control plane) passes the same check; the shipped ConfigMap's
/// placeholder server fails it, named.
#[test]
fn preflight_fails_in_bounded_time_naming_the_server() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("preflight").unwrap();
    let dir = tempfile::Builder::new()
        .prefix("kp-preflight-")
        .tempdir()
        .unwrap();
    let certs_dir = dir.path().join("certs");
    std::fs::create_dir(&certs_dir).unwrap();
    let certs = TestCerts::generate(&certs_dir).unwrap();
    let (api, _stop) = api_server_in(&ns, &certs);
    for object in seed_objects() {
        api.upsert_value(object).unwrap();
    }

    // The shipped ConfigMap's config.conf without its kubeconfig (deploy/ before the
    // kubeconfig was mounted), the Job's command and the DaemonSet's.
    let shipped: Value =
        serde_saphyr::from_str(&read(&repo().join("deploy/configmap.yaml"))).unwrap();
    let config = shipped["data"]["config.conf"].as_str().unwrap();
    let without_kubeconfig: String = config
        .lines()
        .filter(|l| !l.starts_with("clientConnection:") && !l.starts_with("  kubeconfig:"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(config.lines().count(), without_kubeconfig.lines().count());
    let job: Value =
        serde_saphyr::from_str(&read(&repo().join("deploy/preflight/job.yaml"))).unwrap();
    let ds: Value = serde_saphyr::from_str(&read(&repo().join("deploy/daemonset.yaml"))).unwrap();
    let pod_of = |spec: &Value, config: &str, kubeconfig: Option<&str>, env: &[(&str, &str)]| {
        let files_dir = tempfile::tempdir_in(dir.path()).unwrap();
        let mut files = PodFiles::new(files_dir.path());
        files
            .file("/var/lib/kube-proxy/config.conf", config)
            .unwrap();
        if let Some(k) = kubeconfig {
            files
                .file("/var/lib/kube-proxy/kubeconfig.conf", k)
                .unwrap();
        }
        let sa = SERVICE_ACCOUNT_DIR;
        files.file(&format!("{sa}/token"), TOKEN).unwrap();
        files
            .file(&format!("{sa}/ca.crt"), &read(&certs.ca_cert))
            .unwrap();
        files
            .file(&format!("{sa}/namespace"), "kube-system")
            .unwrap();
        let container = &spec["containers"][0];
        let command: Vec<String> = container["command"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().replace("$(NODE_NAME)", "k8s-master"))
            .collect();
        (
            Pod {
                image: container["image"].as_str().unwrap().to_string(),
                program: command[0].clone(),
                files,
                args: command[1..].to_vec(),
                env: env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            },
            files_dir,
        )
    };
    let job_spec = &job["spec"]["template"]["spec"];

    // The ClusterIP: the pre-flight check gives up within seconds, naming 10.96.0.1.
    let (preflight, _d1) = pod_of(job_spec, &without_kubeconfig, None, &KUBELET_ENV);
    let (code, took, out, err) = preflight
        .run_bounded(&ns, BIN, dir.path(), Duration::from_secs(60))
        .unwrap();
    assert_eq!(code, Some(1), "exit status after {took:?}\n{err}");
    assert!(took < Duration::from_secs(40), "took {took:?}\n{err}");
    assert!(
        err.contains(
            "cannot reach the API server https://10.96.0.1 (from the in-cluster configuration"
        ),
        "{err}"
    );
    assert!(
        !out.contains("KUBE-SVC"),
        "no rules printed after the error: {out}"
    );

    // The daemon with the same files: the address, and why, in its log; never Ready.
    let (daemon, _d2) = pod_of(
        &ds["spec"]["template"]["spec"],
        &without_kubeconfig,
        None,
        &KUBELET_ENV,
    );
    let log_path = dir.path().join("daemon.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut cmd = daemon.command(&ns, BIN).unwrap();
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    let mut proxy = ChildGuard::spawn(&mut cmd, "kube-proxy-rs").unwrap();
    proxy
        .wait_for(
            || {
                let log = read(&log_path);
                log.contains("API server unreachable:")
                    && log.contains("is the `kubernetes` Service's ClusterIP")
            },
            Duration::from_secs(30),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", read(&log_path)));
    let log = read(&log_path);
    // kube-proxy-rs's own lines about the server (the source's per-kind retry lines are
    // crates/source's).
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains("API server unreachable:")
                || l.contains("API server https:")
                || l.contains("the API server address")
        })
        .collect();
    assert!(lines.len() >= 3, "{log}");
    for line in lines {
        assert!(line.contains("10.96.0.1"), "names the address: {line}");
    }
    assert_eq!(http_get(&ns, 10256, "/readyz").0, 503, "{log}");
    assert!(!nat_rules(&ns).contains("KUBE-SVC-"));
    drop(proxy);

    // The fallback of docs/deploy.md: the variables set to the control plane.
    let port = api.addr().port().to_string();
    let fallback_env = [
        ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
        ("KUBERNETES_SERVICE_PORT", port.as_str()),
        ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
    ];
    let (preflight, _d3) = pod_of(job_spec, &without_kubeconfig, None, &fallback_env);
    let (code, took, out, err) = preflight
        .run_bounded(&ns, BIN, dir.path(), Duration::from_secs(60))
        .unwrap();
    assert_eq!(code, Some(0), "after {took:?}\n{err}");
    assert!(out.contains("-A KUBE-SVC-"), "{out}");
    assert!(!err.contains("ClusterIP"), "{err}");

    // The shipped ConfigMap with its server set (the one edit docs/deploy.md asks of clusters
    // without kubeadm): the pre-flight check passes.
    let kubeconfig = shipped["data"]["kubeconfig.conf"].as_str().unwrap();
    let edited = kubeconfig.replace("https://control-plane.example:6443", &api.url());
    assert_ne!(edited, kubeconfig);
    let (preflight, _d5) = pod_of(job_spec, config, Some(&edited), &KUBELET_ENV);
    let (code, took, out, err) = preflight
        .run_bounded(&ns, BIN, dir.path(), Duration::from_secs(60))
        .unwrap();
    assert_eq!(code, Some(0), "after {took:?}\n{err}");
    assert!(out.contains("-A KUBE-SVC-"), "{out}");

    // The shipped ConfigMap as it is: its placeholder server, named.
    let (preflight, _d4) = pod_of(
        job_spec,
        config,
        shipped["data"]["kubeconfig.conf"].as_str(),
        &KUBELET_ENV,
    );
    let (code, took, _, err) = preflight
        .run_bounded(&ns, BIN, dir.path(), Duration::from_secs(60))
        .unwrap();
    assert_eq!(code, Some(1), "after {took:?}\n{err}");
    assert!(took < Duration::from_secs(40), "took {took:?}\n{err}");
    assert!(
        err.contains(
            "cannot reach the API server https://control-plane.example:6443 (from --kubeconfig /var/lib/kube-proxy/kubeconfig.conf)"
        ),
        "{err}"
    );
}

/// Issue 24: `--dry-run` against a server nothing listens on ends in seconds with a
/// non-zero status and an error naming the server (it retried until killed).
#[test]
fn dry_run_against_an_unreachable_server_ends_in_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (dir.path().join("out"), dir.path().join("err"));
    let mut cmd = Command::new(BIN);
    cmd.args([
        "--dry-run",
        "--master",
        "http://127.0.0.1:1",
        "--hostname-override=k8s-master",
    ])
    .stdin(Stdio::null())
    .stdout(std::fs::File::create(&out_path).unwrap())
    .stderr(std::fs::File::create(&err_path).unwrap());
    let started = Instant::now();
    let mut child = ChildGuard::spawn(&mut cmd, "kube-proxy-rs").unwrap();
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "still running after 60 s:\n{}",
            read(&err_path)
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = started.elapsed();
    let err = read(&err_path);
    assert_eq!(code, Some(1), "{err}");
    assert!(took < Duration::from_secs(40), "took {took:?}");
    assert!(
        err.contains("cannot reach the API server http://127.0.0.1:1 (from --master) within 10 s"),
        "{err}"
    );
    assert!(read(&out_path).is_empty(), "no rules after the error");
}

/// docs/deploy.md's removal of the dispatch tree's chains (for a node moving back to
/// kube-proxy, which neither uses nor deletes them): after it, no `KUBE-SVT-` chain is left
/// and the per-Service chains they jumped to can be deleted, as kube-proxy deletes a gone
/// Service's chains; nothing else changed.
#[test]
fn rollback_removes_the_dispatch_tree_as_documented() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("svt").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut manifest = String::new();
    for i in 0..100 {
        manifest.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: default}}\n\
             spec:\n  clusterIP: 10.96.{}.{}\n  ports: [{{port: 80, protocol: TCP}}]\n\
             ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: s{i}-1\n  \
             namespace: default\n  labels: {{kubernetes.io/service-name: s{i}}}\naddressType: IPv4\n\
             endpoints:\n- addresses: [10.0.{}.{}]\nports: [{{name: \"\", port: 80, protocol: TCP}}]\n",
            i / 200,
            i % 200 + 1,
            i / 200,
            i % 200 + 1
        ));
    }
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, manifest).unwrap();
    let out = ns
        .command(BIN)
        .args([
            "--once",
            "--iptables-dispatch=tree",
            // The backend the plain `iptables` commands below (and the node's) reach.
            "--iptables-backend=nft",
            "--hostname-override=k8s-master",
            "--cluster-cidr=10.0.0.0/16",
            "--manifests",
        ])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let nat = || ns.run("iptables-save", ["-t", "nat"]).unwrap();
    let before = nat();
    assert!(
        before.contains(":KUBE-SVT-"),
        "the tree was programmed: {before}"
    );
    let svc = before
        .lines()
        .find_map(|l| l.strip_prefix(":KUBE-SVC-"))
        .map(|rest| format!("KUBE-SVC-{}", rest.split(' ').next().unwrap()))
        .unwrap();

    // What kube-proxy's first full sync does to KUBE-SERVICES: its own rules only.
    let rewritten = ns
        .command("iptables")
        .args(["-t", "nat", "-F", "KUBE-SERVICES"])
        .status()
        .unwrap();
    assert!(rewritten.success());
    // A tree chain still jumps to the Service's chain, which kube-proxy cannot delete then.
    let busy = ns
        .command("bash")
        .arg("-c")
        .arg(format!(
            "iptables -t nat -F {svc} && iptables -t nat -X {svc}"
        ))
        .output()
        .unwrap();
    assert!(!busy.status.success(), "a KUBE-SVT chain references {svc}");

    let script = doc_block("remove-dispatch-tree");
    let out = ns
        .command("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = nat();
    assert!(!after.contains("KUBE-SVT-"), "{after}");
    let sep_chains = |text: &str| text.lines().filter(|l| l.starts_with(":KUBE-SEP-")).count();
    assert_eq!(
        sep_chains(&after),
        sep_chains(&before),
        "nothing else removed"
    );
    let deleted = ns
        .command("bash")
        .arg("-c")
        .arg(format!(
            "iptables -t nat -F {svc} && iptables -t nat -X {svc}"
        ))
        .output()
        .unwrap();
    assert!(
        deleted.status.success(),
        "{}",
        String::from_utf8_lossy(&deleted.stderr)
    );
}
