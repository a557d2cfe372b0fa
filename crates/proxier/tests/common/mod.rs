//! Shared by the proxier's kernel tests (`nft_split.rs`, `tree_kernel.rs`, `full_resync.rs`): an iptables-mode
//! proxier that runs the real tools inside a test namespace and records each restore's input,
//! and a comparable dump of its filter and nat tables.

use std::sync::Arc;

use kp_model::IpFamily;
use kp_netfilter::{Backend, ExecIptables, IpVersion, Iptables, RecordingExec, SystemExec, Table};
use kp_proxier::iptables::{IptablesConfig, IptablesProxier};
use kp_proxier::{FakeHost, LocalDetector};
use kp_testkit::Netns;

/// An iptables-mode proxier of `family` on `backend` inside `ns`, pods in `cluster_cidrs`
/// (one per family at most), with the recorder of its restores.
pub fn recorded_proxier(
    ns: &Netns,
    backend: Backend,
    family: IpFamily,
    cluster_cidrs: &[&str],
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
    let version = match family {
        IpFamily::V4 => IpVersion::V4,
        IpFamily::V6 => IpVersion::V6,
    };
    let ipt = ExecIptables::with_exec(version, backend, rec.clone());
    let cfg = IptablesConfig {
        local_detector: LocalDetector::Cidrs(
            cluster_cidrs
                .iter()
                .map(|c| c.parse().expect("CIDR"))
                .collect(),
        ),
        ..IptablesConfig::default()
    };
    let p = IptablesProxier::new(family, cfg, ipt, Arc::new(FakeHost::default())).expect("proxier");
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
