//! The `test-cluster` tool: a kubeadm cluster with kube-proxy, simulated on this machine, for
//! walking docs/deploy.md's migration without a cluster (`cargo run -p kp-testkit --bin
//! test-cluster -- --help`; docs/deploy.md, "Trying the migration without a cluster").
//!
//! - [`up`] starts a daemon holding the [`TestApiServer`](crate::apiserver::TestApiServer)
//!   (HTTPS with its own CA, one bearer token) loaded with what `kubeadm init` leaves
//!   ([`objects`]), and one network namespace per node on a shared LAN ([`net`]), until
//!   [`down`] (or SIGINT/SIGTERM/SIGHUP when in the foreground).
//! - [`kubelet::run`] acts as one node's kubelet once: it runs the pods of the DaemonSets
//!   that select the node (kube-proxy-rs's; upstream kube-proxy's image is not here, and it
//!   says so), as processes in the node's namespace with their mounted files, and stops those
//!   that no longer belong there.
//! - [`kubelet::run_job`] runs a Job's pod (the pre-flight check) once on a node, to
//!   completion.
//! - [`exec`] runs a command in a node's namespace.
//!
//! # Layout
//!
//! ```text
//!   root namespace: the daemon; the API server's listener on 127.0.0.1:<random> (kubectl)
//!
//!   lan:  bridge br0 (192.168.56.0/24, no address of its own)
//!   ├─ master    eth0 192.168.56.10  API server listener 192.168.56.10:6443 (the
//!   │                                control-plane endpoint in kubeadm's kubeconfig.conf)
//!   ├─ worker-1  eth0 192.168.56.11  ── vweb ══ web-worker-1 (pod 10.244.1.10, HTTP :8080)
//!   └─ worker-2  eth0 192.168.56.12  ── vweb ══ web-worker-2 (pod 10.244.2.10, HTTP :8080)
//! ```
//!
//! Node `i` (`master` is 0) has the address `192.168.56.(10+i)` and the pod CIDR
//! `10.244.i.0/24`; it forwards, routes every other node's pod CIDR to that node's address
//! (as a host-gateway CNI does), routes the service CIDR `10.96.0.0/12` out of `eth0` (a
//! node's default route stands for that) and its pod by a host route over `vweb`. The root
//! namespace is never changed: its only part is the daemon's loopback listener, so `kubectl`
//! on this machine reaches the server while the nodes reach it at the control-plane address,
//! and through the `kubernetes` Service (`10.96.0.1:443`) once a proxy on the node programs
//! it. Namespaces are kp-testkit's [`Netns`], named
//! `kp<daemon pid>x<n>-<node>`.
//!
//! # What is simulated
//!
//! See [`SIMULATED`], which `--help` prints and docs/deploy.md repeats.

pub mod cli;
pub mod daemon;
pub mod kubelet;
pub mod net;
pub mod objects;
pub mod state;

pub use daemon::{UpOptions, down, up};

use std::path::Path;
use std::process::ExitStatus;

use crate::{Error, Netns, Result};

/// What the tool simulates and what it does not: printed by `test-cluster --help`.
pub const SIMULATED: &str = "\
What is real: the API server's wire protocol for what kubectl and kube-proxy-rs use (HTTPS with \
its own CA, a bearer token, list/watch, get, create, apply, merge patch, label, delete of the \
kinds docs/deploy.md touches), kubeadm's kube-proxy ConfigMap, ServiceAccount, ClusterRoleBinding \
and DaemonSet as kubeadm writes them, the kube-proxy-rs binary with its pod's command, \
environment and files, and the kernel's netfilter in each node's network namespace, with real \
traffic to Services backed by HTTP servers in pod namespaces.

What is simulated: each node is a network namespace on this machine (sharing its kernel, file \
system and /run/xtables.lock); there is no scheduler, no controller and no container runtime: \
DaemonSets get no status and there are no Pod objects (kubectl get pods, logs, exec, rollout \
status and wait do not work; use `test-cluster kubelet`, DIR/logs/ and `test-cluster exec`); a \
pod runs only when `test-cluster kubelet DIR NODE` (a DaemonSet's) or `test-cluster job` (a Job's) is run, as a process in the node's namespace \
running the kube-proxy-rs binary on this machine instead of the image, with the ConfigMap and \
service-account files overlaid at their paths in its own mount namespace; upstream kube-proxy's \
pods are not run (its image is not here: the kubelet says what it would run); one token \
serves every client, and RBAC is not enforced; probes are not run by anyone but `kubelet --wait`.";

/// Runs `argv` in the namespace named `name` (a node's or a pod's, as [`state::State`]
/// records them), with `DIR/bin` (which holds the `kube-proxy-rs` the kubelet runs) first on
/// `PATH`, and the caller's standard input and output; returns its exit status.
///
/// # Errors
/// [`Error::Invalid`] when the namespace is gone; [`Error::Spawn`] when `ip` cannot run.
pub fn exec_in(dir: &Path, name: &str, argv: &[String]) -> Result<ExitStatus> {
    let Some((program, args)) = argv.split_first() else {
        return Err(Error::invalid("command", "no command given after --"));
    };
    let ns = Netns::attach(name)?;
    let path = match std::env::var_os("PATH") {
        Some(p) => {
            let mut all = vec![dir.join("bin")];
            all.extend(std::env::split_paths(&p));
            std::env::join_paths(all).map_err(|e| Error::invalid("PATH", e.to_string()))?
        }
        None => dir.join("bin").into_os_string(),
    };
    let mut cmd = ns.command(program);
    cmd.args(args).env("PATH", path);
    cmd.status().map_err(|source| Error::Spawn {
        argv: argv.join(" "),
        source,
    })
}

/// `test-cluster exec DIR NODE -- CMD...`: [`exec_in`] for the node (or pod) named `node` of
/// the running cluster in `dir`.
///
/// # Errors
/// [`Error::Invalid`] when no cluster runs in `dir` or it has no such node; as [`exec_in`].
pub fn exec(dir: &Path, node: &str, argv: &[String]) -> Result<ExitStatus> {
    let state = state::State::load_running(dir)?;
    let name = state.namespace_of(node)?;
    exec_in(&state.dir, name, argv)
}
