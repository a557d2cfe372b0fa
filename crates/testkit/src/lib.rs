//! kp-testkit: the network-namespace harness for integration tests and the sandbox.
//!
//! * [`netns`]: [`Netns`] (a named network namespace deleted on drop, threads and
//!   commands inside it), veth [`link`]s, addresses and routes, and [`Topology`], the
//!   standard layout of a `node` namespace (where the proxy runs), `client` namespaces on
//!   the node network and `be<i>` backend ("pod") namespaces behind the node.
//! * [`backend`]: [`HttpBackend`] and [`UdpEchoBackend`], which answer with their name
//!   and record the peer address of every connection.
//! * [`client`]: [`http_get`], [`http_get_many`], [`http_get_while`], [`udp_request`] and
//!   [`UdpClient`], with outcomes classified by [`ClientError`] (refused / timeout /
//!   unreachable).
//! * [`process`]: [`ChildGuard`] (a child process stopped on drop) and [`wait_for`].
//! * [`conformance`]: the packet-flow table every proxy mode must pass.
//! * [`apiserver`]: [`apiserver::TestApiServer`], an in-process Kubernetes API server
//!   (list/watch of Services, EndpointSlices, Nodes and ServiceCIDRs over loopback HTTP or
//!   HTTPS, and enough of the rest of the API for `kubectl apply` of a deployment) for
//!   testing the API-server source and `deploy/`; it needs no root.
//! * [`pod`]: [`pod::PodFiles`], files at a pod's fixed paths (a ConfigMap volume, the
//!   service-account token) for one process in a namespace, through overlays in its own
//!   mount namespace; the machine's file system is not changed.
//! * [`kubelet`]: what a kubelet does for a DaemonSet's pod without a container runtime:
//!   whether it goes on a node ([`kubelet::schedules`]) and its process with its command,
//!   environment and files ([`kubelet::Pod`]); [`kubeadm`]: kubeadm's kube-proxy objects.
//! * `cluster` (feature `cluster`, on by default, off where other crates depend on this
//!   one): the `test-cluster` tool, a kubeadm cluster simulated in network namespaces for
//!   walking docs/deploy.md's migration (`cargo run -p kp-testkit --bin test-cluster --
//!   --help`).
//! * [`vm`]: a qemu guest with Debian's kernel for what this kernel lacks (IPVS, dummy
//!   links): [`vm::GuestCommand`] runs one command in it, [`vm::run_tests`] is the `main` of
//!   a `harness = false` test target that runs its trials there (docs/vm.md).
//! * [`rss`]: the `kube-proxy-rs` daemon's own peak and steady memory (`VmHWM`, `VmRSS`)
//!   after its first sync, run in a namespace on a synthetic cluster from manifests or the
//!   test API server ([`rss::measure`]).
//! * [`builders`]: Services, EndpointSlices and snapshots for unit tests; [`golden`]: the
//!   bundled seed example and the in-order line check used by the golden tests.
//!
//! Everything created lives in namespaces this crate creates; the root network namespace
//! is never changed. All of it needs root: tests call [`require_root`] first.
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use std::time::Duration;
//! use kp_model::IpFamily;
//! use kp_testkit::{Topology, http_get, require_root};
//!
//! if !require_root() {
//!     return Ok(());
//! }
//! let topology = Topology::builder().backends(2).build()?;
//! let _servers = topology.start_http(8080)?;
//! let pod = topology.backend(1).ip(IpFamily::V4).unwrap();
//! let reply = http_get(topology.client(), SocketAddr::new(pod, 8080), Duration::from_secs(2))?;
//! assert_eq!(reply.name(), "be1");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod apiserver;
pub mod backend;
pub mod builders;
pub mod client;
#[cfg(feature = "cluster")]
pub mod cluster;
pub mod conformance;
pub mod error;
pub mod golden;
pub mod kubeadm;
pub mod kubelet;
pub mod netns;
pub mod pod;
pub mod process;
pub mod rss;
pub mod vm;

pub use backend::{HttpBackend, UdpEchoBackend};
pub use client::{
    ClientError, HttpReply, UdpClient, UdpReply, http_get, http_get_many, http_get_while,
    udp_request,
};
pub use error::{Error, Result};
pub use netns::{
    BackendPod, ClientHost, FamilyPlan, Netns, Topology, TopologyBuilder, add_address, add_route,
    add_route_dev, cleanup_stale, delete_namespace, link, list_namespaces, require_root, veth,
};
pub use process::{ChildGuard, wait_for};
