//! `test-cluster`: a kubeadm cluster with kube-proxy simulated on this machine, for walking
//! docs/deploy.md's migration without a cluster. See [`kp_testkit::cluster`] and
//! `test-cluster --help`.

fn main() -> std::process::ExitCode {
    kp_testkit::cluster::cli::main()
}
