//! Shared by the proxier's kernel tests (`nft_split.rs`, `tree_kernel.rs`): an iptables-mode
//! proxier that runs the real tools inside a test namespace and records each restore's input,
//! and a comparable dump of its filter and nat tables.

use std::sync::Arc;

use kp_model::IpFamily;
use kp_netfilter::{Backend, ExecIptables, IpVersion, Iptables, RecordingExec, SystemExec, Table};
use kp_proxier::iptables::{IptablesConfig, IptablesProxier};
use kp_proxier::{FakeHost, LocalDetector};
use kp_testkit::Netns;

/// An IPv4 iptables-mode proxier on `backend` inside `ns`, pods in `cluster_cidr`, with the
/// recorder of its restores.
pub fn recorded_proxier(
    ns: &Netns,
    backend: Backend,
    cluster_cidr: &str,
) -> (
    IptablesProxier<ExecIptables>,
    Arc<RecordingExec<SystemExec>>,
) {
    let rec = Arc::new(RecordingExec::new(SystemExec::with_prefix(
        ["ip", "netns", "exec", ns.name()]
            .into_iter()
            .map(String::from)
            .collect(),
    )));
    let ipt = ExecIptables::with_exec(IpVersion::V4, backend, rec.clone());
    let cfg = IptablesConfig {
        local_detector: LocalDetector::Cidrs(vec![cluster_cidr.parse().expect("CIDR")]),
        ..IptablesConfig::default()
    };
    let p = IptablesProxier::new(IpFamily::V4, cfg, ipt, Arc::new(FakeHost::default()))
        .expect("proxier");
    (p, rec)
}

/// filter and nat as the backend's `iptables-save` prints them, without comment lines and
/// with chain declarations reduced to their names (no counters).
pub fn tables(p: &IptablesProxier<ExecIptables>) -> String {
    let mut out = String::new();
    for t in [Table::Filter, Table::Nat] {
        for line in p.runner().save(Some(t)).expect("iptables-save").lines() {
            if line.starts_with('#') {
                continue;
            }
            match line.strip_prefix(':') {
                Some(decl) => out.push_str(decl.split(' ').next().unwrap_or(decl)),
                None => out.push_str(line),
            }
            out.push('\n');
        }
    }
    out
}
