//! `test-cluster kubelet DIR NODE`: one pass of NODE's kubelet over the DaemonSets.
//!
//! It reads the Node and every DaemonSet from the API server (as the admin of
//! `DIR/kubeconfig`), decides which DaemonSets put a pod on the node
//! ([`crate::kubelet::why_not_scheduled`]), and for each:
//!
//! - a pod whose program is `kube-proxy-rs` runs as a process in the node's namespace: the
//!   binary `DIR/bin/kube-proxy-rs` (or `--binary`) with the pod's arguments, environment and
//!   files ([`crate::kubelet::Pod`]), in its own process group, detached from this command,
//!   its output in `DIR/logs/NODE-DAEMONSET.log` (the previous run's in
//!   `NODE-DAEMONSET.previous.log`). A pod already running with the same template,
//!   ConfigMaps and binary is left alone; one whose inputs changed is restarted; one that
//!   exited is started again;
//! - any other pod (upstream kube-proxy's, whose image is not on this machine) is not run:
//!   the kubelet says so and prints the command it would run;
//! - a running pod whose DaemonSet no longer selects the node (or is gone) is stopped
//!   (SIGTERM to its process group, SIGKILL after 10 s), as the DaemonSet controller deletes
//!   it.
//!
//! `--wait` then probes each running pod's readiness probe (`httpGet`, on the node's
//! address, as the kubelet probes a host-network pod) until it passes. `--stop` stops every
//! pod on the node. Each started pod is recorded in `DIR/pods/NODE/NAMESPACE_DAEMONSET.json`
//! with its pid and the process's start time, so a later pass (or `test-cluster down`) stops
//! exactly that process, never a process that reused its pid.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, PodSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::daemon::link_binary;
use super::net::KUBERNETES_SERVICE_IP;
use super::state::{NodeState, State, process_start_time, write_atomic};
use crate::kubelet::{Pod, PodContext, ServiceAccountFiles, kubernetes_service_env, shell_quote};
use crate::{Error, Netns, Result};

/// How long a stopped pod gets between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_secs(10);

/// What `test-cluster kubelet` was given.
#[derive(Debug, Clone)]
pub struct KubeletOptions {
    /// The cluster's directory.
    pub dir: PathBuf,
    /// The node to act for.
    pub node: String,
    /// The kube-proxy-rs binary to run (default `DIR/bin/kube-proxy-rs`, set by `up`); given,
    /// it becomes the default for later passes and `exec`.
    pub binary: Option<PathBuf>,
    /// Stop every pod on the node instead.
    pub stop: bool,
    /// Wait this long for every running pod to pass its readiness probe.
    pub wait: Option<Duration>,
}

/// What one pass did, line by line, and whether anything failed (a DaemonSet that could
/// not be run, a pod not Ready in time).
#[derive(Debug, Default)]
pub struct Report {
    /// One line per DaemonSet and action.
    pub lines: Vec<String>,
    /// Whether a line reports a failure.
    pub failed: bool,
}

impl Report {
    fn say(&mut self, line: String) {
        self.lines.push(line);
    }

    fn fail(&mut self, line: String) {
        self.failed = true;
        self.lines.push(line);
    }
}

/// A pod the kubelet started; `DIR/pods/NODE/NAMESPACE_DAEMONSET.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PodRecord {
    /// The DaemonSet's namespace.
    pub namespace: String,
    /// The DaemonSet's name.
    pub daemonset: String,
    /// The node.
    pub node: String,
    /// The process (its process group has the same id).
    pub pid: u32,
    /// The process's start time ([`process_start_time`]), which tells it from a later
    /// process with the same pid.
    pub start_time: u64,
    /// What the pod was made from (template, ConfigMaps' data, binary): a pass with other
    /// inputs restarts it.
    pub inputs: Value,
    /// The directory of its files.
    pub files: PathBuf,
    /// Its log.
    pub log: PathBuf,
}

impl PodRecord {
    fn alive(&self) -> bool {
        process_start_time(self.pid) == Some(self.start_time)
    }

    fn path(dir: &Path, node: &str, namespace: &str, daemonset: &str) -> PathBuf {
        dir.join("pods")
            .join(node)
            .join(format!("{namespace}_{daemonset}.json"))
    }

    fn label(&self) -> String {
        format!("{}/{} on {}", self.namespace, self.daemonset, self.node)
    }

    /// Stops the process group (if it is still this record's process) and removes the
    /// record and the pod's files.
    fn stop(&self, dir: &Path) -> String {
        let what = if self.alive() {
            let group = Pid::from_raw(self.pid as i32);
            let _ = killpg(group, Signal::SIGTERM);
            let started = Instant::now();
            while self.alive() && started.elapsed() < GRACE {
                std::thread::sleep(Duration::from_millis(50));
            }
            if self.alive() {
                let _ = killpg(group, Signal::SIGKILL);
                format!(
                    "killed (pid {}; it ignored SIGTERM for {GRACE:?})",
                    self.pid
                )
            } else {
                format!("stopped (pid {})", self.pid)
            }
        } else {
            "had already exited".to_string()
        };
        let _ = std::fs::remove_file(PodRecord::path(
            dir,
            &self.node,
            &self.namespace,
            &self.daemonset,
        ));
        let _ = std::fs::remove_dir_all(&self.files);
        format!("{}: {what}", self.label())
    }
}

/// The records of the pods started on `node` (every node when `None`).
fn records(dir: &Path, node: Option<&str>) -> Vec<PodRecord> {
    let pods = dir.join("pods");
    let nodes: Vec<PathBuf> = match node {
        Some(n) => vec![pods.join(n)],
        None => std::fs::read_dir(&pods)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect(),
    };
    let mut out: Vec<PodRecord> = nodes
        .iter()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path()).ok()?;
            serde_json::from_str(&text).ok()
        })
        .collect();
    out.sort_by(|a, b| {
        (&a.node, &a.namespace, &a.daemonset).cmp(&(&b.node, &b.namespace, &b.daemonset))
    });
    out
}

/// Stops every pod the kubelet started on any node of the cluster in `dir`; one line per
/// pod (for `down` and the daemon's exit).
pub fn stop_all(dir: &Path) -> Vec<String> {
    records(dir, None).iter().map(|r| r.stop(dir)).collect()
}

/// The kube-proxy-rs binary to run: `given` (which becomes the cluster's, for later passes
/// and `exec`), else the cluster's `DIR/bin/kube-proxy-rs`.
fn resolve_binary(dir: &Path, given: Option<&Path>) -> Result<PathBuf> {
    match given {
        Some(b) => link_binary(dir, b),
        None => dir.join("bin/kube-proxy-rs").canonicalize().map_err(|_| {
            Error::invalid(
                "--binary",
                format!(
                    "no kube-proxy-rs binary is set for the cluster in {} (build one with `cargo \
                     build --bin kube-proxy-rs`, or give --binary PATH)",
                    dir.display()
                ),
            )
        }),
    }
}

/// One pass of the kubelet; see the module documentation.
///
/// # Errors
/// [`Error::Invalid`] when no cluster runs in `dir`, it has no such node, or no binary is
/// known; the API server's errors. A DaemonSet that cannot be run is a failed line of the
/// [`Report`], and the others are still handled.
pub fn run(opts: &KubeletOptions) -> Result<Report> {
    let state = State::load_running(&opts.dir)?;
    let dir = state.dir.clone();
    let node = state.node(&opts.node)?.clone();
    let mut report = Report::default();
    let mut running: BTreeMap<(String, String), PodRecord> = records(&dir, Some(&node.name))
        .into_iter()
        .map(|r| ((r.namespace.clone(), r.daemonset.clone()), r))
        .collect();
    if opts.stop {
        for r in running.values() {
            report.say(r.stop(&dir));
        }
        if running.is_empty() {
            report.say(format!("no pod runs on {}", node.name));
        }
        return Ok(report);
    }
    let binary = resolve_binary(&dir, opts.binary.as_deref())?;
    let ns = Netns::attach(&node.namespace)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the runtime", e))?;
    let (node_obj, daemonsets, config_maps) = rt.block_on(read_cluster(&dir, &node.name))?;
    let sa = ServiceAccountFiles {
        token: read_token(&dir)?,
        ca_pem: std::fs::read_to_string(dir.join("pki/ca.crt"))
            .map_err(|e| Error::io("reading the cluster's CA", e))?,
    };
    let kubelet_env = kubernetes_service_env(IpAddr::V4(KUBERNETES_SERVICE_IP), 443);
    let mut ready_checks = Vec::new();

    for ds in &daemonsets {
        let namespace = ds.metadata.namespace.clone().unwrap_or_default();
        let name = ds.metadata.name.clone().unwrap_or_default();
        let label = format!("{namespace}/{name}");
        let key = (namespace.clone(), name.clone());
        let Some(template) = ds.spec.as_ref().and_then(|s| s.template.spec.as_ref()) else {
            report.fail(format!("{label}: skipped: spec.template.spec is missing"));
            continue;
        };
        match crate::kubelet::why_not_scheduled(template, &node_obj) {
            Err(e) => {
                report.fail(format!("{label}: skipped: {e}"));
                continue;
            }
            Ok(Some(reason)) => {
                match running.remove(&key) {
                    Some(r) => report.say(format!(
                        "{} (not on {} any more: {reason})",
                        r.stop(&dir),
                        node.name
                    )),
                    None => report.say(format!("{label}: not on {}: {reason}", node.name)),
                }
                continue;
            }
            Ok(None) => {}
        }
        let cms = config_maps.get(&namespace).cloned().unwrap_or_default();
        let inputs = json!({
            "template": template,
            "configMaps": Pod::config_map_names(template)
                .iter()
                .map(|n| (n.clone(), cms.get(n).and_then(|c| c.data.clone())))
                .collect::<BTreeMap<_, _>>(),
            "binary": binary,
        });
        let pod_name = format!("{name}-{}", node.name);
        let ctx = PodContext {
            namespace: &namespace,
            pod_name: &pod_name,
            node_name: &node.name,
            node_ip: Some(IpAddr::V4(node.ip)),
            config_maps: &cms,
            service_account: &sa,
            kubelet_env: &kubelet_env,
        };
        // Built in a scratch directory first: whether it can run, and its command.
        let scratch = tempfile::tempdir_in(dir.join("pods"))
            .map_err(|e| Error::io("making a scratch directory", e))?;
        let pod = match Pod::new(template, &ctx, scratch.path()) {
            Ok(p) => p,
            Err(e) => {
                report.fail(format!("{label}: skipped: {e}"));
                continue;
            }
        };
        let is_ours = Path::new(&pod.program)
            .file_name()
            .is_some_and(|f| f == "kube-proxy-rs");
        if !is_ours {
            if let Some(r) = running.remove(&key) {
                report.say(r.stop(&dir));
            }
            report.say(format!(
                "{label}: on {} but not run: its image {} is not on this machine (test-cluster \
                 runs only kube-proxy-rs); its pod would run: {}",
                node.name,
                pod.image,
                pod.command_line()
            ));
            continue;
        }
        if let Some(r) = running.remove(&key) {
            if r.alive() && r.inputs == inputs {
                report.say(format!(
                    "{label}: running on {} (pid {}), log {}",
                    node.name,
                    r.pid,
                    r.log.display()
                ));
                ready_checks.push((label, template.clone(), r));
                continue;
            }
            let why = if r.alive() {
                "its DaemonSet, ConfigMaps or binary changed"
            } else {
                "it had exited (see its log)"
            };
            report.say(format!("{} ({why}; starting it again)", r.stop(&dir)));
        }
        drop(pod);
        match start(&dir, &node, &ns, template, &ctx, &binary, &label, inputs) {
            Ok((record, line)) => {
                report.say(line);
                ready_checks.push((label, template.clone(), record));
            }
            Err(e) => report.fail(format!("{label}: cannot start on {}: {e}", node.name)),
        }
    }
    for r in running.values() {
        report.say(format!("{} (its DaemonSet is gone)", r.stop(&dir)));
    }
    if let Some(limit) = opts.wait {
        for (label, template, record) in &ready_checks {
            match wait_ready(&ns, &node, template, record, limit) {
                Ok(line) => report.say(format!("{label} on {}: {line}", node.name)),
                Err(line) => report.fail(format!("{label} on {}: {line}", node.name)),
            }
        }
    }
    Ok(report)
}

/// A client of the cluster's API server as the admin of `DIR/kubeconfig`.
async fn client(dir: &Path) -> Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(dir.join("kubeconfig"))
        .map_err(|e| Error::invalid("kubeconfig", e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(|e| Error::invalid("kubeconfig", e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| api_error("client", e))
}

fn api_error(what: &str, e: kube::Error) -> Error {
    Error::invalid("API server", format!("{what}: {e}"))
}

/// The ConfigMaps of namespace `ns`, by name.
async fn config_maps(client: &kube::Client, ns: &str) -> Result<BTreeMap<String, ConfigMap>> {
    let list = kube::Api::<ConfigMap>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .map_err(|e| api_error(&format!("listing ConfigMaps in {ns}"), e))?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|c| Some((c.metadata.name.clone()?, c)))
        .collect())
}

/// The Node, every DaemonSet, and the ConfigMaps of the DaemonSets' namespaces (by
/// namespace, then name).
async fn read_cluster(
    dir: &Path,
    node: &str,
) -> Result<(
    Node,
    Vec<DaemonSet>,
    BTreeMap<String, BTreeMap<String, ConfigMap>>,
)> {
    let client = client(dir).await?;
    let node_obj = kube::Api::<Node>::all(client.clone())
        .get(node)
        .await
        .map_err(|e| api_error(&format!("getting Node {node}"), e))?;
    let mut daemonsets = kube::Api::<DaemonSet>::all(client.clone())
        .list(&Default::default())
        .await
        .map_err(|e| api_error("listing DaemonSets", e))?
        .items;
    daemonsets.sort_by_key(|d| (d.metadata.namespace.clone(), d.metadata.name.clone()));
    let mut by_namespace = BTreeMap::new();
    for ns in daemonsets
        .iter()
        .filter_map(|d| d.metadata.namespace.clone())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let cms = config_maps(&client, &ns).await?;
        by_namespace.insert(ns, cms);
    }
    Ok((node_obj, daemonsets, by_namespace))
}

/// The token the API server accepts (`DIR/pki/token`, also the admin kubeconfig's): the
/// service accounts' tokens are all this one.
fn read_token(dir: &Path) -> Result<String> {
    let path = dir.join(super::daemon::TOKEN_FILE);
    std::fs::read_to_string(&path)
        .map(|t| t.trim().to_string())
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))
}

/// Starts the pod's process; its record and the line for the report.
#[allow(clippy::too_many_arguments)]
fn start(
    dir: &Path,
    node: &NodeState,
    ns: &Netns,
    template: &PodSpec,
    ctx: &PodContext<'_>,
    binary: &Path,
    label: &str,
    inputs: Value,
) -> Result<(PodRecord, String)> {
    let (namespace, daemonset) = label.split_once('/').unwrap_or(("", label));
    let node_dir = dir.join("pods").join(&node.name);
    std::fs::create_dir_all(&node_dir)
        .map_err(|e| Error::io(format!("creating {}", node_dir.display()), e))?;
    let files = tempfile::Builder::new()
        .prefix(&format!("{namespace}_{daemonset}-"))
        .tempdir_in(&node_dir)
        .map_err(|e| Error::io("making the pod's directory", e))?
        .keep();
    let pod = Pod::new(template, ctx, &files)?;
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).map_err(|e| Error::io("creating the log directory", e))?;
    let log = logs.join(format!("{}-{daemonset}.log", node.name));
    if log.exists() {
        let _ = std::fs::rename(
            &log,
            logs.join(format!("{}-{daemonset}.previous.log", node.name)),
        );
    }
    let out = std::fs::File::create(&log)
        .map_err(|e| Error::io(format!("creating {}", log.display()), e))?;
    let err = out
        .try_clone()
        .map_err(|e| Error::io(format!("opening {}", log.display()), e))?;
    let mut cmd = pod.command(ns, binary)?;
    {
        use std::os::unix::process::CommandExt as _;
        cmd.process_group(0);
    }
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    let child = cmd.spawn().map_err(|source| Error::Spawn {
        argv: crate::netns::describe(&cmd),
        source,
    })?;
    let pid = child.id();
    // Not waited for: the pod outlives this command (`test-cluster down` or a later pass
    // stops it).
    drop(child);
    let start_time = process_start_time(pid).ok_or_else(|| {
        Error::invalid(
            "pod",
            format!(
                "{label} exited at once; {}:\n{}",
                log.display(),
                std::fs::read_to_string(&log).unwrap_or_default()
            ),
        )
    })?;
    let record = PodRecord {
        namespace: namespace.to_string(),
        daemonset: daemonset.to_string(),
        node: node.name.clone(),
        pid,
        start_time,
        inputs,
        files,
        log: log.clone(),
    };
    let path = PodRecord::path(dir, &node.name, namespace, daemonset);
    let text = serde_json::to_string_pretty(&record)
        .map_err(|e| Error::invalid("pod record", e.to_string()))?;
    write_atomic(&path, &text)?;
    let command = std::iter::once(binary.display().to_string())
        .chain(pod.args.iter().cloned())
        .map(|a| shell_quote(&a))
        .collect::<Vec<_>>()
        .join(" ");
    Ok((
        record,
        format!(
            "{label}: started on {} (pid {pid}): {command}\n  log: {}",
            node.name,
            log.display()
        ),
    ))
}

/// Probes the pod's readiness probe until it passes (`Ok` with what it answered), the
/// process exits, or `limit` passes (`Err` with why, and the log's end).
fn wait_ready(
    ns: &Netns,
    node: &NodeState,
    template: &PodSpec,
    record: &PodRecord,
    limit: Duration,
) -> std::result::Result<String, String> {
    let container = &template.containers[0];
    let Some(get) = container
        .readiness_probe
        .as_ref()
        .and_then(|p| p.http_get.as_ref())
    else {
        return Ok("no httpGet readiness probe: Ready once running".into());
    };
    let port = match &get.port {
        IntOrString::Int(p) => u16::try_from(*p).ok(),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    };
    let Some(port) = port else {
        return Err(format!(
            "readinessProbe.httpGet.port {:?} names no port",
            get.port
        ));
    };
    let path = get.path.clone().unwrap_or_else(|| "/".into());
    let addr = SocketAddr::new(IpAddr::V4(node.ip), port);
    let started = Instant::now();
    let tail = || {
        let log = std::fs::read_to_string(&record.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    };
    loop {
        if !record.alive() {
            return Err(format!(
                "exited before it was Ready; the end of {}:\n{}",
                record.log.display(),
                tail()
            ));
        }
        let last = match ns.in_ns(|| http_get(addr, &path)) {
            Ok(Ok((code, body))) if (200..400).contains(&code) => {
                return Ok(format!(
                    "Ready after {:.1} s (GET http://{addr}{path}: {code} {})",
                    started.elapsed().as_secs_f64(),
                    body.trim()
                ));
            }
            Ok(Ok((code, body))) => format!("{code} {}", body.trim()),
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        if started.elapsed() > limit {
            return Err(format!(
                "not Ready after {limit:?} (GET http://{addr}{path}: {last}); the end of {}:\n{}",
                record.log.display(),
                tail()
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `GET path` on `addr` (HTTP/1.0): the status code and the body.
fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Ok((code, body))
}

/// What `test-cluster job` was given.
#[derive(Debug, Clone)]
pub struct JobOptions {
    /// The cluster's directory.
    pub dir: PathBuf,
    /// The node to run the Job's pod on.
    pub node: String,
    /// The Job, `NAMESPACE/NAME`.
    pub job: String,
    /// The kube-proxy-rs binary (as for the kubelet).
    pub binary: Option<PathBuf>,
    /// How long the pod may run before it is killed (the Job's `activeDeadlineSeconds`
    /// when shorter).
    pub timeout: Duration,
}

/// How a Job's pod ended.
#[derive(Debug)]
pub struct JobOutcome {
    /// What happened, for the user.
    pub summary: String,
    /// Its exit code (`None`: killed at the deadline).
    pub code: Option<i32>,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

/// `test-cluster job`: runs the pod of the Job `opts.job` (created with `kubectl create`)
/// once on `opts.node`, to completion, in the foreground, as a Job controller, the scheduler
/// and the kubelet together would; its output is also kept in `DIR/logs/NODE-job-NAME.log`.
/// Only kube-proxy-rs's pods run (the pre-flight check, `deploy/preflight/job.yaml`).
///
/// # Errors
/// [`Error::Invalid`] when no cluster runs in `dir`, there is no such node or Job, the pod
/// would not be scheduled on the node (naming why) or cannot be run here (naming the field
/// or the image); the process's errors.
pub fn run_job(opts: &JobOptions) -> Result<JobOutcome> {
    let state = State::load_running(&opts.dir)?;
    let dir = state.dir.clone();
    let node = state.node(&opts.node)?.clone();
    let Some((namespace, name)) = opts.job.split_once('/') else {
        return Err(Error::invalid(
            "job",
            format!(
                "{:?}: give NAMESPACE/NAME (kube-system/kube-proxy-rs-preflight)",
                opts.job
            ),
        ));
    };
    let binary = resolve_binary(&dir, opts.binary.as_deref())?;
    let ns = Netns::attach(&node.namespace)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the runtime", e))?;
    let (node_obj, job, cms) = rt.block_on(async {
        let client = client(&dir).await?;
        let node_obj = kube::Api::<Node>::all(client.clone())
            .get(&node.name)
            .await
            .map_err(|e| api_error(&format!("getting Node {}", node.name), e))?;
        let job =
            kube::Api::<k8s_openapi::api::batch::v1::Job>::namespaced(client.clone(), namespace)
                .get(name)
                .await
                .map_err(|e| api_error(&format!("getting Job {namespace}/{name}"), e))?;
        let cms = config_maps(&client, namespace).await?;
        Ok::<_, Error>((node_obj, job, cms))
    })?;
    let spec = job.spec.as_ref();
    let Some(template) = spec.and_then(|s| s.template.spec.as_ref()) else {
        return Err(Error::invalid(
            "job",
            format!("{namespace}/{name}: spec.template.spec is missing"),
        ));
    };
    if let Some(reason) = crate::kubelet::why_not_scheduled(template, &node_obj)? {
        return Err(Error::invalid(
            "job",
            format!(
                "{namespace}/{name} would not run on {}: {reason}",
                node.name
            ),
        ));
    }
    let deadline = spec
        .and_then(|s| s.active_deadline_seconds)
        .and_then(|s| u64::try_from(s).ok())
        .map_or(opts.timeout, |s| opts.timeout.min(Duration::from_secs(s)));
    let sa = ServiceAccountFiles {
        token: read_token(&dir)?,
        ca_pem: std::fs::read_to_string(dir.join("pki/ca.crt"))
            .map_err(|e| Error::io("reading the cluster's CA", e))?,
    };
    let kubelet_env = kubernetes_service_env(IpAddr::V4(KUBERNETES_SERVICE_IP), 443);
    let pod_name = format!("{name}-{}", node.name);
    let ctx = PodContext {
        namespace,
        pod_name: &pod_name,
        node_name: &node.name,
        node_ip: Some(IpAddr::V4(node.ip)),
        config_maps: &cms,
        service_account: &sa,
        kubelet_env: &kubelet_env,
    };
    let node_dir = dir.join("pods").join(&node.name);
    std::fs::create_dir_all(&node_dir)
        .map_err(|e| Error::io(format!("creating {}", node_dir.display()), e))?;
    let files = tempfile::Builder::new()
        .prefix(&format!("job_{name}-"))
        .tempdir_in(&node_dir)
        .map_err(|e| Error::io("making the pod's directory", e))?;
    let pod = Pod::new(template, &ctx, files.path())?;
    if Path::new(&pod.program)
        .file_name()
        .is_none_or(|f| f != "kube-proxy-rs")
    {
        return Err(Error::invalid(
            "job",
            format!(
                "{namespace}/{name}: its image {} is not on this machine (test-cluster runs only \
                 kube-proxy-rs); its pod would run: {}",
                pod.image,
                pod.command_line()
            ),
        ));
    }
    let (code, took, stdout, stderr) = pod.run_bounded(&ns, &binary, files.path(), deadline)?;
    let log = dir
        .join("logs")
        .join(format!("{}-job-{name}.log", node.name));
    let _ = std::fs::create_dir_all(dir.join("logs"));
    std::fs::write(&log, format!("{stdout}{stderr}"))
        .map_err(|e| Error::io(format!("writing {}", log.display()), e))?;
    let how = match code {
        Some(0) => "Complete (exit 0)".to_string(),
        Some(c) => format!("Failed (exit {c})"),
        None => format!("Failed (killed at its deadline, {deadline:?})"),
    };
    Ok(JobOutcome {
        summary: format!(
            "Job {namespace}/{name} on {}: {how} after {:.1} s; output in {}",
            node.name,
            took.as_secs_f64(),
            log.display()
        ),
        code,
        stdout,
        stderr,
    })
}
