//! The iptables host adapter: rule IR, parsers, the [`Iptables`] runner trait with its
//! real ([`ExecIptables`]) and fake ([`FakeIptables`]) implementations.
//!
//! Typical use by a proxier:
//!
//! ```no_run
//! use kp_netfilter::{Backend, ExecIptables, Iptables, IpVersion, Table, parse_save};
//!
//! let ipt = ExecIptables::new(IpVersion::V4, Backend::Default);
//! // runs `iptables-restore --noflush --counters --wait=5` with the payload on stdin
//! ipt.restore(b"*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n")?;
//! // runs `iptables-save -t nat`
//! let nat = parse_save(&ipt.save(Some(Table::Nat))?)?;
//! assert!(nat.chain(Table::Nat, "KUBE-SERVICES").is_some());
//! # Ok::<(), kp_netfilter::Error>(())
//! ```

mod complete;
mod detect;
mod fake;
mod ir;
mod parse;
mod runner;
mod spec;
mod tokenize;

pub use complete::{
    HEADLESS_NAT_NOTE, KUBE_PROXY_JUMPS, KubeProxyJump, assume_headless_nat,
    complete_kube_proxy_jumps, complete_partial_save,
};
pub use detect::{
    BackendChoice, DetectReason, KUBELET_HINT_CHAINS, detect_backend, detect_backend_with,
};
pub use fake::FakeIptables;
pub use ir::{
    AddrKind, AddrType, Chain, Cidr, ConnState, Conntrack, Counters, CtStatus, HOOK_ORDER,
    IpVersion, MarkMatch, Match, Multiport, MultiportKind, NatRange, NatTarget, Negatable, Physdev,
    PortMatch, PortRange, Probability, Protocol, Recent, RecentCommand, RecentSide, Rule, Ruleset,
    SetFlag, SetMatch, StateMatch, Statistic, StatisticMode, Table, TableRules, Target,
    canonical_reject, save_string,
};
pub use parse::{
    DeleteTarget, RestoreCommand, RestoreOp, RestoreParser, parse_restore, parse_save, save_tables,
};
pub use runner::{
    Backend, Exec, ExecCall, ExecIptables, ExecOutput, Iptables, IptablesVersion, NetfilterBackend,
    OutputReader, PayloadWriter, RESTORE_WAIT_SECONDS, RecordingExec, ScriptedExec, SystemExec,
    Tool,
};
pub use spec::is_target_name;
pub use tokenize::tokenize;
