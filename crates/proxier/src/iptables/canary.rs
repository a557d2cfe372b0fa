//! The canary chains: how the iptables-based modes notice that something else flushed their
//! rules.
//!
//! Like upstream kube-proxy, every full sync of iptables, IPVS and userspace mode leaves an
//! empty user chain `KUBE-PROXY-CANARY` in the mangle, nat and filter tables of its family
//! (so `iptables-save` of a node shows `:KUBE-PROXY-CANARY - [0:0]` in those tables, as it
//! does under upstream). Nothing jumps to it and nothing is in it; a partial sync never
//! names it. An `iptables -t nat -F; iptables -t nat -X`, a firewall reload that flushes the
//! tables or a `nft flush ruleset` deletes it with our chains, and
//! [`Proxier::check_dataplane`](crate::Proxier::check_dataplane), every sync period, lists
//! just that chain in each table (`iptables -w 5 -t mangle -S KUBE-PROXY-CANARY`, see
//! [`Iptables::chain_exists`]): never a whole table, so the check costs three short commands
//! per family whatever the number of Services. When one is missing, the proxier warns and
//! its next sync, run at once, is full: it reads the tables, puts back the jump rules from
//! the built-in chains, rewrites every chain that is missing or differs and creates the
//! canaries again.
//!
//! Upstream polls the first table (mangle) only and reloads when its canary is gone; we
//! check all three, so a flush of the nat table alone is repaired too. As upstream, a
//! flush without `-X` (`iptables -t nat -F` alone) keeps the empty canary and is not
//! noticed; the hourly full sync repairs it.

use kp_model::IpFamily;
use kp_netfilter::{Iptables, Table};
use tracing::warn;

pub use super::names::KUBE_PROXY_CANARY;
use crate::ProxierError;

/// The tables that hold a canary, in the order they are checked (upstream's order).
pub const CANARY_TABLES: [Table; 3] = [Table::Mangle, Table::Nat, Table::Filter];

/// What a full sync appends to its `iptables-restore` payload, after its own tables: one
/// block per table declaring the canary (creating it, or flushing the empty chain). Written
/// last, the canaries are committed only when every block before them was.
pub const CANARY_BLOCKS: &str = "*mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n\
*nat\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n\
*filter\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n";

/// The first table of [`CANARY_TABLES`] whose canary is missing, or `None` when all three
/// exist.
///
/// # Errors
/// [`ProxierError::Netfilter`] when a check could not run.
pub fn missing<I: Iptables + ?Sized>(ipt: &I) -> Result<Option<Table>, ProxierError> {
    for table in CANARY_TABLES {
        if !ipt.chain_exists(table, KUBE_PROXY_CANARY)? {
            return Ok(Some(table));
        }
    }
    Ok(None)
}

/// The check of [`Proxier::check_dataplane`](crate::Proxier::check_dataplane) for the
/// iptables-based modes: [`missing`], with the warning when a canary is gone.
///
/// # Errors
/// As [`missing`].
pub fn check<I: Iptables + ?Sized>(ipt: &I, family: IpFamily) -> Result<bool, ProxierError> {
    match missing(ipt)? {
        Some(table) => {
            warn!(
                %family,
                table = table.name(),
                "iptables rules were flushed by something else ({KUBE_PROXY_CANARY} missing in table {}); resyncing everything",
                table.name()
            );
            Ok(true)
        }
        None => Ok(false),
    }
}

/// The part of `--cleanup` for the mangle table, where our only chain is the canary: a
/// block that flushes and deletes it, or `None` when it does not exist.
///
/// # Errors
/// As [`missing`].
pub fn mangle_cleanup<I: Iptables + ?Sized>(ipt: &I) -> Result<Option<String>, ProxierError> {
    Ok(ipt
        .chain_exists(Table::Mangle, KUBE_PROXY_CANARY)?
        .then(mangle_cleanup_block))
}

/// The restore block that flushes and deletes the mangle table's canary.
pub fn mangle_cleanup_block() -> String {
    format!("*mangle\n:{KUBE_PROXY_CANARY} - [0:0]\n-X {KUBE_PROXY_CANARY}\nCOMMIT\n")
}
