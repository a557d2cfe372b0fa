//! `test-cluster`'s command line (clap): [`main`] is the binary's `main`, [`main_from`] the
//! same for given arguments.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use super::SIMULATED;
use super::daemon::{UpOptions, down, up};
use super::kubelet::{JobOptions, KubeletOptions, run, run_job};

/// A kubeadm cluster with kube-proxy, simulated on this machine, to walk docs/deploy.md's
/// migration without a cluster.
///
/// `up` starts an HTTPS test API server holding what a fresh kubeadm cluster has (the
/// kube-system/kube-proxy ConfigMap, ServiceAccount, ClusterRoleBinding and DaemonSet, the
/// Nodes master, worker-1 and worker-2, the kubernetes Service and sample Services with
/// endpoints), one network namespace per node, and writes DIR/kubeconfig for kubectl.
/// `kubelet` runs a node's DaemonSet pods (kube-proxy-rs's) in its namespace; `job` runs a
/// Job's pod (the pre-flight check) once on a node; `exec` runs a command there; `down`
/// removes everything. Every command needs root (network namespaces).
#[derive(Debug, Parser)]
#[command(name = "test-cluster", version, after_long_help = SIMULATED)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start a test cluster in DIR: its API server and node namespaces, until `down` (or
    /// Ctrl-C in the foreground).
    ///
    /// Writes DIR/kubeconfig (cluster admin; `KUBECONFIG=DIR/kubeconfig kubectl get
    /// nodes`), DIR/pki/ca.crt, DIR/kubeadm.yaml (the objects it was loaded with). The API
    /// server listens on 127.0.0.1 (random port) for this machine and on 192.168.56.10:6443
    /// (master's address, kubeadm's control-plane endpoint) for the nodes.
    Up {
        /// The cluster's directory (made if missing; not on an overlay file system).
        dir: PathBuf,
        /// Workers besides master (worker-1 ... worker-N), 1 to 20.
        #[arg(long, default_value_t = 2)]
        workers: usize,
        /// The kube-proxy-rs binary that stands for the image's [default: kube-proxy-rs
        /// beside this program, else on PATH].
        #[arg(long, value_name = "PATH")]
        binary: Option<PathBuf>,
        /// Run in the background (output in DIR/test-cluster.log) and return once ready.
        #[arg(long, short = 'd')]
        detach: bool,
    },
    /// Stop the test cluster in DIR: every pod, the API server, every namespace.
    Down {
        /// The cluster's directory.
        dir: PathBuf,
    },
    /// Act as NODE's kubelet once: run the pods of the DaemonSets that select NODE, stop
    /// those that no longer do.
    ///
    /// kube-proxy-rs's pods run as processes in NODE's network namespace with their
    /// command, environment and mounted files, output in DIR/logs/NODE-DAEMONSET.log;
    /// upstream kube-proxy's are not run (its image is not here): the kubelet prints the
    /// command it would run. Run it again after a change (a label, a ConfigMap edit).
    Kubelet {
        /// The cluster's directory.
        dir: PathBuf,
        /// The node (master, worker-1, ...).
        node: String,
        /// The kube-proxy-rs binary to run from now on [default: the one `up` chose,
        /// DIR/bin/kube-proxy-rs].
        #[arg(long, value_name = "PATH")]
        binary: Option<PathBuf>,
        /// Stop every pod on NODE instead.
        #[arg(long, conflicts_with = "wait")]
        stop: bool,
        /// Then wait until each running pod passes its readiness probe (at most SECONDS).
        #[arg(
            long,
            value_name = "SECONDS",
            num_args = 0..=1,
            require_equals = true,
            default_missing_value = "60"
        )]
        wait: Option<u64>,
    },
    /// Run a Job's pod (created with `kubectl create -f`) once on NODE, to completion: the
    /// pre-flight check of deploy/preflight/job.yaml.
    ///
    /// Prints the pod's output (also in DIR/logs/NODE-job-NAME.log) and exits with its
    /// status, as `kubectl wait --for=condition=complete` and `kubectl logs` would show. The
    /// test API server has no Job controller: nothing else runs Jobs.
    Job {
        /// The cluster's directory.
        dir: PathBuf,
        /// The node to run it on.
        node: String,
        /// The Job, NAMESPACE/NAME.
        job: String,
        /// The kube-proxy-rs binary to run [default: DIR/bin/kube-proxy-rs].
        #[arg(long, value_name = "PATH")]
        binary: Option<PathBuf>,
        /// Kill the pod after SECONDS (or the Job's activeDeadlineSeconds, if shorter).
        #[arg(long, value_name = "SECONDS", default_value_t = 120)]
        timeout: u64,
    },
    /// Run a command in NODE's network namespace (a node's or a workload pod's), with
    /// DIR/bin (the kubelet's kube-proxy-rs) first on PATH.
    Exec {
        /// The cluster's directory.
        dir: PathBuf,
        /// The node (or workload pod, web-worker-1, ...).
        node: String,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
}

/// The binary's `main`: parses `std::env::args_os()` and runs the command.
pub fn main() -> ExitCode {
    main_from(std::env::args_os())
}

/// Parses `args` (the program's name first) and runs the command; errors are printed on
/// standard error (`test-cluster: ...`) with exit code 1, `exec` exits as its command did.
pub fn main_from(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> ExitCode {
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .try_init();
    if !nix::unistd::geteuid().is_root() {
        eprintln!("test-cluster: needs root (it creates network namespaces): run it with sudo");
        return ExitCode::FAILURE;
    }
    let fail = |e: crate::Error| {
        eprintln!("test-cluster: {e}");
        ExitCode::FAILURE
    };
    match cli.command {
        Command::Up {
            dir,
            workers,
            binary,
            detach,
        } => match up(&UpOptions {
            dir,
            workers,
            binary,
            detach,
        }) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        },
        Command::Down { dir } => match down(&dir) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        },
        Command::Kubelet {
            dir,
            node,
            binary,
            stop,
            wait,
        } => match run(&KubeletOptions {
            dir,
            node,
            binary,
            stop,
            wait: wait.map(Duration::from_secs),
        }) {
            Ok(report) => {
                for line in &report.lines {
                    println!("{line}");
                }
                if report.failed {
                    ExitCode::FAILURE
                } else {
                    ExitCode::SUCCESS
                }
            }
            Err(e) => fail(e),
        },
        Command::Job {
            dir,
            node,
            job,
            binary,
            timeout,
        } => match run_job(&JobOptions {
            dir,
            node,
            job,
            binary,
            timeout: Duration::from_secs(timeout),
        }) {
            Ok(outcome) => {
                print!("{}", outcome.stdout);
                eprint!("{}", outcome.stderr);
                println!("{}", outcome.summary);
                match outcome.code {
                    Some(0) => ExitCode::SUCCESS,
                    Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
                    None => ExitCode::FAILURE,
                }
            }
            Err(e) => fail(e),
        },
        Command::Exec { dir, node, command } => match super::exec(&dir, &node, &command) {
            Ok(status) => {
                use std::os::unix::process::ExitStatusExt as _;
                let code = status
                    .code()
                    .or_else(|| status.signal().map(|s| 128 + s))
                    .unwrap_or(1);
                ExitCode::from(u8::try_from(code).unwrap_or(1))
            }
            Err(e) => fail(e),
        },
    }
}
