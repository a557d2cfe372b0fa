//! `test-cluster up` and `test-cluster down`: the daemon that holds the cluster (its API
//! server, namespaces and workload pods) and its removal.
//!
//! [`up`] runs the daemon in the foreground until SIGINT, SIGTERM or SIGHUP, or, with
//! `detach`, starts the same command line again as a background process (its own process
//! group, so a terminal's Ctrl-C does not reach it; output in `DIR/test-cluster.log`) and
//! returns once it is ready. Either way the daemon, when it stops, first stops every pod the
//! kubelet started ([`super::kubelet::stop_all`]), then the API server and workload pods, then
//! deletes every namespace, and removes its pid and state files. [`down`] signals it and
//! waits; if the daemon is gone (killed), it removes what the daemon left itself.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use super::net::{API_PORT, ClusterNet, KUBERNETES_SERVICE_IP, WEB_PORT, node_ip};
use super::objects::{WEB_IP, WEB_LOCAL_IP, WEB_LOCAL_NODE_PORT, WEB_NODE_PORT, cluster_objects};
use super::state::{
    PID_FILE, STATE_FILE, State, absolute, daemon_pid, process_alive, write_atomic,
};
use crate::apiserver::{ApiServerOptions, TestApiServer, TestCerts};
use crate::{Error, HttpBackend, Result, delete_namespace};

/// The cluster's one bearer token, under the cluster's directory (mode 0600).
pub const TOKEN_FILE: &str = "pki/token";

/// How long `up --detach` waits for the daemon to be ready.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long [`down`] waits for the daemon to stop before killing it.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// What `test-cluster up` was given.
#[derive(Debug, Clone)]
pub struct UpOptions {
    /// The cluster's directory (made if missing).
    pub dir: PathBuf,
    /// How many workers besides `master` (1 to [`super::net::MAX_WORKERS`]).
    pub workers: usize,
    /// The kube-proxy-rs binary the kubelet runs (default: [`find_binary`]).
    pub binary: Option<PathBuf>,
    /// Start in the background and return once ready.
    pub detach: bool,
}

/// The kube-proxy-rs binary to stand for the image's: `kube-proxy-rs` in the directory of
/// the running program (`target/debug/` beside `test-cluster`), else the first on `PATH`.
pub fn find_binary() -> Option<PathBuf> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("kube-proxy-rs")));
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("kube-proxy-rs"));
    beside
        .into_iter()
        .chain(on_path)
        .find(|p| p.is_file())
        .and_then(|p| p.canonicalize().ok())
}

/// Points `DIR/bin/kube-proxy-rs` at `binary` (which must be a file).
///
/// # Errors
/// [`Error::Invalid`] when `binary` is not a file; [`Error::Io`].
pub fn link_binary(dir: &Path, binary: &Path) -> Result<PathBuf> {
    let binary = binary
        .canonicalize()
        .map_err(|e| Error::invalid("--binary", format!("{}: {e}", binary.display())))?;
    if !binary.is_file() {
        return Err(Error::invalid(
            "--binary",
            format!("{}: not a file", binary.display()),
        ));
    }
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin)
        .map_err(|e| Error::io(format!("creating {}", bin.display()), e))?;
    let link = bin.join("kube-proxy-rs");
    let tmp = bin.join(".kube-proxy-rs.tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&binary, &tmp)
        .map_err(|e| Error::io(format!("linking {}", tmp.display()), e))?;
    std::fs::rename(&tmp, &link)
        .map_err(|e| Error::io(format!("renaming {}", link.display()), e))?;
    Ok(binary)
}

/// `test-cluster up`: see the module documentation. Returns the summary printed for the
/// user (how to reach the cluster) once the cluster is ready (with `detach`) or once it has
/// stopped again (in the foreground, where the summary is printed when ready).
///
/// # Errors
/// [`Error::Invalid`] when a cluster already runs in `dir`, `dir` cannot hold the pods'
/// overlay layers, or no kube-proxy-rs binary is given or found; whatever fails while
/// building the cluster (everything made so far is removed again).
pub fn up(opts: &UpOptions) -> Result<String> {
    let dir = absolute(&opts.dir)?;
    if !(1..=super::net::MAX_WORKERS).contains(&opts.workers) {
        return Err(Error::invalid(
            "workers",
            format!(
                "{}: between 1 and {}",
                opts.workers,
                super::net::MAX_WORKERS
            ),
        ));
    }
    if opts.detach {
        return detach(opts, &dir);
    }
    refuse_running(&dir)?;
    let stopped = serve(opts, &dir, &mut |summary| println!("{summary}"));
    let cleanup = remove_files(&dir);
    stopped?;
    cleanup?;
    Ok(format!("test cluster in {} stopped", dir.display()))
}

/// Starts the same command line without `--detach` in the background, and waits until it
/// is ready (its pid file names it) or has exited (then its log is the error).
fn detach(opts: &UpOptions, dir: &Path) -> Result<String> {
    refuse_running(dir)?;
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let log_path = dir.join("test-cluster.log");
    let log = std::fs::File::create(&log_path)
        .map_err(|e| Error::io(format!("creating {}", log_path.display()), e))?;
    let exe = std::env::current_exe().map_err(|e| Error::io("finding this program", e))?;
    let mut cmd = Command::new(exe);
    cmd.arg("up")
        .arg(dir)
        .arg("--workers")
        .arg(opts.workers.to_string());
    if let Some(b) = &opts.binary {
        cmd.arg("--binary").arg(absolute(b)?);
    }
    {
        use std::os::unix::process::CommandExt as _;
        cmd.process_group(0);
    }
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| Error::io("log file", e))?)
        .stderr(log);
    let mut child = cmd.spawn().map_err(|source| Error::Spawn {
        argv: crate::netns::describe(&cmd),
        source,
    })?;
    let started = Instant::now();
    loop {
        if daemon_pid(dir)? == Some(child.id()) {
            let state = State::load(dir)?
                .ok_or_else(|| Error::invalid("test cluster", "no state file after start"))?;
            // The child is not waited for: it outlives this process (and is reaped by
            // whoever inherits it).
            std::mem::forget(child);
            return Ok(summary(&state, true));
        }
        if let Some(status) = child
            .try_wait()
            .map_err(|e| Error::io("waiting for the daemon", e))?
        {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            return Err(Error::invalid(
                "test cluster",
                format!(
                    "the daemon exited ({status}) before it was ready; {}:\n{}",
                    log_path.display(),
                    log.trim_end()
                ),
            ));
        }
        if started.elapsed() > READY_TIMEOUT {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            return Err(Error::Timeout {
                what: format!("the test cluster in {} to be ready", dir.display()),
                after: READY_TIMEOUT,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Fails when a daemon runs in `dir`; removes what a gone one left.
fn refuse_running(dir: &Path) -> Result<()> {
    let pid = daemon_pid(dir)?.or(State::load(dir)?.map(|s| s.pid));
    if let Some(pid) = pid
        && process_alive(pid)
        && pid != std::process::id()
    {
        return Err(Error::invalid(
            "test cluster",
            format!(
                "one is already running in {} (pid {pid}): `test-cluster down {}` first",
                dir.display(),
                dir.display()
            ),
        ));
    }
    if let Some(state) = State::load(dir)? {
        let removed = remove_leftovers(dir, &state);
        if !removed.is_empty() {
            eprintln!(
                "test-cluster: removed what an earlier daemon in {} left: {}",
                dir.display(),
                removed.join(", ")
            );
        }
        remove_files(dir)?;
    }
    Ok(())
}

/// The daemon: builds the cluster, calls `ready` with the summary, serves until a signal,
/// and takes everything down again.
fn serve(opts: &UpOptions, dir: &Path, ready: &mut dyn FnMut(&str)) -> Result<()> {
    // The signal handlers first: a Ctrl-C while the cluster is being built stops it once it
    // is built (instead of killing the process and leaving its namespaces).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the runtime", e))?;
    let mut signals = rt.block_on(async { Signals::new() })?;
    for sub in ["pki", "logs", "pods", "bin"] {
        let d = dir.join(sub);
        if matches!(sub, "logs" | "pods") {
            // The previous cluster's pods and logs.
            let _ = std::fs::remove_dir_all(&d);
        }
        std::fs::create_dir_all(&d)
            .map_err(|e| Error::io(format!("creating {}", d.display()), e))?;
    }
    check_not_overlay(dir)?;
    let binary = match &opts.binary {
        Some(b) => Some(link_binary(dir, b)?),
        None => match find_binary() {
            Some(b) => Some(link_binary(dir, &b)?),
            None => {
                eprintln!(
                    "test-cluster: no kube-proxy-rs binary beside this program or on PATH; \
                     `test-cluster kubelet` will need --binary PATH"
                );
                None
            }
        },
    };
    let token = random_token()?;
    let pki = dir.join("pki");
    let control_plane = node_ip(0);
    let certs = TestCerts::generate_for(
        &pki,
        &[IpAddr::V4(control_plane), IpAddr::V4(KUBERNETES_SERVICE_IP)],
        &[
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "master",
        ],
    )
    .map_err(|e| Error::invalid("certificates", e.to_string()))?;

    let net = ClusterNet::build(opts.workers)?;
    let mut state = State {
        dir: dir.to_path_buf(),
        pid: std::process::id(),
        lan: net.lan.name().to_string(),
        nodes: net.nodes.iter().map(|(n, _)| n.clone()).collect(),
        pods: net.pods.iter().map(|(p, _)| p.clone()).collect(),
        server_local: String::new(),
        server_nodes: format!("https://{control_plane}:{API_PORT}"),
    };
    // From here on a killed daemon's namespaces are in the state file for `down`.
    state.save()?;

    let local = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| Error::io("binding the API server on 127.0.0.1", e))?;
    let master = net
        .node_ns("master")
        .ok_or_else(|| Error::invalid("cluster", "no master node"))?;
    let on_lan = master
        .in_ns(|| TcpListener::bind(SocketAddr::new(IpAddr::V4(control_plane), API_PORT)))?
        .map_err(|e| {
            Error::io(
                format!("binding the API server on {control_plane}:{API_PORT}"),
                e,
            )
        })?;
    let server = rt
        .block_on(TestApiServer::start_on(
            vec![local, on_lan],
            ApiServerOptions {
                tls: Some(certs.clone()),
                bearer_token: Some(token.clone()),
            },
        ))
        .map_err(|e| Error::invalid("API server", e.to_string()))?;
    state.server_local = server.url();

    let objects = cluster_objects(&state.nodes, &state.pods, &state.server_nodes);
    let kubeadm = dir.join("kubeadm.yaml");
    std::fs::write(&kubeadm, &objects)
        .map_err(|e| Error::io(format!("writing {}", kubeadm.display()), e))?;
    let created = crate::apiserver::rfc3339(std::time::SystemTime::now());
    for doc in objects.split("\n---\n").filter(|d| !d.trim().is_empty()) {
        let mut value: Value = serde_saphyr::from_str(doc)
            .map_err(|e| Error::invalid("cluster object", format!("{e}\n{doc}")))?;
        // Created now (kubectl's AGE).
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("creationTimestamp".into(), created.clone().into());
        }
        server
            .apply_value(value)
            .map_err(|e| Error::invalid("cluster object", e.to_string()))?;
    }
    let backends = net
        .pods
        .iter()
        .map(|(p, ns)| HttpBackend::start(ns, SocketAddr::new(IpAddr::V4(p.ip), WEB_PORT), &p.name))
        .collect::<Result<Vec<_>>>()?;

    write_private(&dir.join(TOKEN_FILE), &format!("{token}\n"))?;
    write_kubeconfig(dir, &state.server_local, &certs.ca_cert, &token)?;
    state.save()?;
    write_atomic(&dir.join(PID_FILE), &format!("{}\n", std::process::id()))?;
    let mut text = summary(&state, false);
    if let Some(b) = &binary {
        text.push_str(&format!("\nkube-proxy-rs for the kubelet: {}", b.display()));
    }
    ready(&text);

    let signal = rt.block_on(signals.wait());
    println!(
        "test-cluster: {signal}: stopping the cluster in {}",
        dir.display()
    );
    let stopped = super::kubelet::stop_all(dir);
    drop(backends);
    drop(server);
    drop(rt);
    drop(net);
    for line in stopped {
        println!("test-cluster: {line}");
    }
    Ok(())
}

/// SIGINT, SIGTERM and SIGHUP, caught from creation on.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers (inside a runtime).
    fn new() -> Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        let io = |e| Error::io("installing a signal handler", e);
        Ok(Signals {
            int: signal(SignalKind::interrupt()).map_err(io)?,
            term: signal(SignalKind::terminate()).map_err(io)?,
            hup: signal(SignalKind::hangup()).map_err(io)?,
        })
    }

    /// Waits for one of them (also one that came before); returns its name.
    async fn wait(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
            _ = self.hup.recv() => "SIGHUP",
        }
    }
}

/// The user's instructions for a cluster that is up.
pub fn summary(state: &State, detached: bool) -> String {
    let dir = state.dir.display();
    let nodes: Vec<String> = state
        .nodes
        .iter()
        .map(|n| {
            format!(
                "{} {}{}",
                n.name,
                n.ip,
                if n.control_plane {
                    " (control plane)"
                } else {
                    ""
                }
            )
        })
        .collect();
    let stop = if detached {
        format!("test-cluster down {dir}")
    } else {
        format!("Ctrl-C here, or test-cluster down {dir}")
    };
    format!(
        "test cluster up in {dir} (daemon pid {pid})\n\
         API server: {local} (kubectl on this machine), {nodes_url} (the nodes)\n\
         nodes: {nodes}\n\
         Services: default/kubernetes {KUBERNETES_SERVICE_IP}:443, default/web {WEB_IP}:80 (NodePort \
         {WEB_NODE_PORT}), default/web-local {WEB_LOCAL_IP}:80 (NodePort {WEB_LOCAL_NODE_PORT}, \
         externalTrafficPolicy Local)\n\n\
         export KUBECONFIG={dir}/kubeconfig; kubectl get nodes\n\
         run a node's DaemonSet pods: test-cluster kubelet {dir} NODE [--wait]\n\
         a command on a node:         test-cluster exec {dir} NODE -- CMD...\n\
         pod logs:                    {dir}/logs/NODE-DAEMONSET.log\n\
         stop:                        {stop}",
        pid = state.pid,
        local = state.server_local,
        nodes_url = state.server_nodes,
        nodes = nodes.join(", "),
    )
}

/// `DIR/kubeconfig`: a cluster admin of the test server (mode 0600: it holds the token).
fn write_kubeconfig(dir: &Path, server: &str, ca: &Path, token: &str) -> Result<()> {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test-cluster\n  cluster:\n    \
         server: {server}\n    certificate-authority: {}\nusers:\n- name: kubernetes-admin\n  \
         user:\n    token: {token}\ncontexts:\n- name: kubernetes-admin@test-cluster\n  context:\n    \
         cluster: test-cluster\n    user: kubernetes-admin\ncurrent-context: kubernetes-admin@test-cluster\n",
        ca.display()
    );
    write_private(&dir.join("kubeconfig"), &text)
}

/// Writes `text` to a new file `path` of mode 0600.
fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
    f.write_all(text.as_bytes())
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// 16 random bytes from the kernel, as 32 hex digits.
fn random_token() -> Result<String> {
    use std::io::Read as _;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| Error::io("reading /dev/urandom", e))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The pods' files are overlays whose upper layers live in `DIR/pods`: an overlay file
/// system cannot hold them.
fn check_not_overlay(dir: &Path) -> Result<()> {
    let fs = nix::sys::statfs::statfs(dir)
        .map_err(|e| Error::io(format!("statfs {}", dir.display()), e.into()))?;
    if fs.filesystem_type() == nix::sys::statfs::OVERLAYFS_SUPER_MAGIC {
        return Err(Error::invalid(
            "directory",
            format!(
                "{} is on an overlay file system, which cannot hold the pods' overlay layers: \
                 choose one under /tmp or /var/tmp",
                dir.display()
            ),
        ));
    }
    Ok(())
}

/// Removes the pid and state files.
fn remove_files(dir: &Path) -> Result<()> {
    for f in [PID_FILE, STATE_FILE] {
        let path = dir.join(f);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("removing {}", path.display()), e)),
        }
    }
    Ok(())
}

/// Stops the pods and deletes the namespaces a gone daemon left; what it removed.
fn remove_leftovers(dir: &Path, state: &State) -> Vec<String> {
    let mut removed = super::kubelet::stop_all(dir);
    for name in state.namespaces() {
        if Path::new(crate::netns::NETNS_DIR).join(&name).exists() {
            match delete_namespace(&name) {
                Ok(()) => removed.push(format!("namespace {name}")),
                Err(e) => eprintln!("test-cluster: {e}"),
            }
        }
    }
    removed
}

/// `test-cluster down`: stops the daemon in `dir` (SIGTERM, and waits for it to take
/// everything down; SIGKILL after a minute), then removes whatever is still left: pods the
/// kubelet started, namespaces, the pid and state files. Returns what it did, for the user.
///
/// # Errors
/// [`Error::Io`] when the files cannot be read or removed.
pub fn down(dir: &Path) -> Result<String> {
    let dir = absolute(dir)?;
    let state = State::load(&dir)?;
    let pid = daemon_pid(&dir)?.or(state.as_ref().map(|s| s.pid));
    let Some(pid) = pid else {
        return Ok(format!("no test cluster in {}", dir.display()));
    };
    let mut lines = Vec::new();
    if process_alive(pid) {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        let started = Instant::now();
        while process_alive(pid) && started.elapsed() < STOP_TIMEOUT {
            std::thread::sleep(Duration::from_millis(50));
        }
        if process_alive(pid) {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            lines.push(format!(
                "the daemon (pid {pid}) did not stop within {STOP_TIMEOUT:?}: killed it"
            ));
        } else {
            lines.push(format!("stopped the daemon (pid {pid})"));
        }
    } else {
        lines.push(format!("the daemon (pid {pid}) was gone"));
    }
    if let Some(state) = &state {
        let left = remove_leftovers(&dir, state);
        if !left.is_empty() {
            lines.push(format!("removed what it left: {}", left.join(", ")));
        }
    }
    remove_files(&dir)?;
    lines.push(format!("test cluster in {} is down", dir.display()));
    Ok(lines.join("\n"))
}
