//! Reconciliation: turns a [`Rendered`] ruleset plus what the kernel holds into ONE
//! `iptables-restore --noflush` payload (on the nf_tables backend, [`split`] cuts a large
//! full sync's nat table into several transactions within that payload).
//!
//! - A *full* sync reads the kernel's tables (`iptables-save`, as a stream), declares (and so
//!   flushes) and writes every chain we own whose kernel contents differ from the render
//!   (compared by [`digest`]; an unchanged chain is left alone, its counters with it), adds
//!   the jump rules from the built-in chains that are missing, and deletes stale per-Service
//!   chains. Its payload is written into the tool's stdin while the render goes ([`full`]).
//!   [`full_payload`] is upstream's payload in one buffer, every chain rewritten (dry runs,
//!   benchmarks, and the tests' reference).
//! - A *partial* sync declares only the fixed chains and the per-Service chains of Services
//!   that changed; other Services' chains are left untouched in the kernel; chains that the
//!   previous sync wrote and this one no longer uses are deleted.
//! - A full sync ends with [`CANARY_BLOCKS`], which create the empty `KUBE-PROXY-CANARY`
//!   chains in mangle, nat and filter; a partial sync never names them, so a canary deleted
//!   by someone else stays missing until the check notices it.
//! - *Cleanup* (`--cleanup`) removes our jump rules and chains and nothing else.
//!
//! Jump rules ([`KUBE_PROXY_JUMPS`]) are inserted at the top of the built-in chains (`-I CHAIN
//! 1`, in an order that yields upstream kube-proxy's layout: the jumps to `KUBE-FIREWALL`
//! first, in both families); a jump to `KUBE-FIREWALL` that the kernel holds below one of
//! our jumps is moved to the top (see [`missing_jumps`]); within one restore everything is
//! applied or nothing is.

use std::collections::{BTreeSet, HashSet};
use std::fmt::Write as _;
use std::hash::BuildHasher;

use super::canary::CANARY_BLOCKS;
use super::names::{
    KUBE_EXTERNAL_SERVICES, KUBE_FIREWALL, KUBE_FORWARD, KUBE_MARK_MASQ, KUBE_NODEPORTS,
    KUBE_POSTROUTING, KUBE_PROXY_CANARY, KUBE_PROXY_FIREWALL, KUBE_SERVICES, is_dynamic_chain,
};
use super::render::{ChainSet, Rendered, TableRules};
use kp_netfilter::{KUBE_PROXY_JUMPS, KubeProxyJump};

pub mod digest;
pub mod full;
pub mod split;

/// What the kernel holds, as far as reconciliation cares: per table, the chains that exist and
/// the rules of each chain in canonical `-A CHAIN …` form.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelTables {
    /// The filter table.
    pub filter: KernelTable,
    /// The nat table.
    pub nat: KernelTable,
    /// The mangle table, read by a full sync of iptables mode only (for its canary); empty
    /// elsewhere.
    pub mangle: KernelTable,
}

/// One table of [`KernelTables`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelTable {
    /// Chains that exist (built-in and user-defined), but for those in `ours`.
    pub chains: BTreeSet<String>,
    /// Every rule, `(chain, canonical rule line, jump target if any)`, in kernel order (a
    /// full sync's reading keeps only the built-in chains' rules).
    pub rules: Vec<(String, String, Option<String>)>,
    /// Our chains (`KUBE-…`) with the digest of their rules, when read by a full sync of
    /// iptables mode ([`digest::TableReader`]; they are then not in `chains`).
    pub ours: digest::OurChains,
}

impl KernelTable {
    /// Where rule `line` (canonical) is among the rules of built-in chain `chain`, from 0.
    fn rule_position(&self, chain: &str, line: &str) -> Option<usize> {
        self.rules
            .iter()
            .filter(|(c, _, _)| c == chain)
            .position(|(_, l, _)| l == line)
    }

    /// Whether the kernel has chain `name` (read as another's or as ours).
    fn has_chain(&self, name: &str) -> bool {
        self.chains.contains(name) || self.ours.contains(name)
    }
}

fn write_decls(out: &mut String, chains: &[String]) {
    for c in chains {
        out.push(':');
        out.push_str(c);
        out.push_str(" - [0:0]\n");
    }
}

/// The jump rules missing from `kernel`, as restore lines, for `table` (`filter` or `nat`).
/// With `kernel` `None` every jump is considered missing (dry runs, fresh nodes).
///
/// Like upstream's `EnsureRule(Prepend)` for each of [`KUBE_PROXY_JUMPS`] in turn, a
/// missing jump goes to the top of its built-in chain, so those written here end up in the
/// list's order, above the jumps the kernel already has. One departure, which only ever
/// hardens a node: a jump to `KUBE-FIREWALL` that the kernel holds below one of our other
/// jumps in its chain, or below where a missing one is about to be inserted (an older
/// kube-proxy-rs appended it; a kubelet before 1.28 created it before kube-proxy's first
/// sync), is deleted and inserted at the top again. Below them, a SYN from another host to
/// `127.0.0.1:<health-check node port>` is accepted by `KUBE-NODEPORTS`, and one to a
/// NodePort without endpoints is rejected by `KUBE-EXTERNAL-SERVICES`, before the localnet
/// drop (CVE-2020-8558) sees them.
///
/// `KUBE-FIREWALL` is created (declared) here when the kernel lacks it and the render does
/// not declare it (`render_declares_firewall`: the render writes the IPv4 localnet drop
/// into it): upstream ensures the chain and its jumps in both families, empty in IPv6.
fn missing_jumps(
    table: &str,
    kernel: Option<&KernelTable>,
    render_declares_firewall: bool,
) -> String {
    let mut out = String::new();
    let in_table = |j: &&KubeProxyJump| j.table.name() == table;
    let mut chains: Vec<&str> = Vec::new();
    for j in KUBE_PROXY_JUMPS.iter().filter(in_table) {
        if !chains.contains(&j.chain) {
            chains.push(j.chain);
        }
    }
    if table == "filter"
        && !render_declares_firewall
        && !kernel.is_some_and(|k| k.has_chain(KUBE_FIREWALL))
    {
        let _ = writeln!(out, ":{KUBE_FIREWALL} - [0:0]");
    }
    for chain in chains {
        let group: Vec<&KubeProxyJump> = KUBE_PROXY_JUMPS
            .iter()
            .filter(in_table)
            .filter(|j| j.chain == chain)
            .collect();
        let position = |j: &KubeProxyJump| kernel.and_then(|k| k.rule_position(chain, j.rule));
        let firewall_misplaced = group.iter().any(|j| {
            j.target == KUBE_FIREWALL
                && position(j).is_some_and(|at| {
                    group.iter().filter(|o| o.target != KUBE_FIREWALL).any(|o| {
                        // Another of our jumps above it, or one about to be inserted.
                        position(o).is_none_or(|other| other < at)
                    })
                })
        });
        let missing: Vec<&&KubeProxyJump> = group
            .iter()
            .filter(|j| (firewall_misplaced && j.target == KUBE_FIREWALL) || position(j).is_none())
            .collect();
        if firewall_misplaced {
            let _ = writeln!(out, "-D {chain} -j {KUBE_FIREWALL}");
        }
        // Inserted at 1 in reverse, so that the final order is the group's order.
        for j in missing.iter().rev() {
            // `-A CHAIN spec` → `-I CHAIN 1 spec`.
            let _ = writeln!(out, "-I {} 1{}", j.chain, &j.rule[3 + j.chain.len()..]);
        }
    }
    out
}

/// A set of chain names a partial sync compares against: what the previous sync left.
pub trait ChainNames {
    /// Calls `f` with every name.
    fn each_name(&self, f: &mut dyn FnMut(&str));
}

impl<S: BuildHasher> ChainNames for HashSet<String, S> {
    fn each_name(&self, f: &mut dyn FnMut(&str)) {
        for n in self {
            f(n);
        }
    }
}

impl ChainNames for ChainSet {
    fn each_name(&self, f: &mut dyn FnMut(&str)) {
        for n in self.iter() {
            f(n);
        }
    }
}

/// Stale per-Service and dispatch tree chains: those in the kernel's nat table that the
/// ruleset no longer uses, sorted.
fn stale_in_kernel(kernel: Option<&KernelTables>, active: &ChainSet) -> Vec<String> {
    let Some(k) = kernel else {
        return Vec::new();
    };
    let mut stale: Vec<String> = k
        .nat
        .chains
        .iter()
        .map(String::as_str)
        .chain(k.nat.ours.names())
        .filter(|c| is_dynamic_chain(c) && !active.contains(c))
        .map(str::to_string)
        .collect();
    stale.sort_unstable();
    stale.dedup();
    stale
}

/// The payload text before the nat rules (filter table, nat declarations and jumps) and
/// after them (stale chain deletions, `COMMIT`, and the canary blocks of a full sync).
fn head_and_tail(
    filter: &TableRules,
    filter_head: &str,
    nat: &TableRules,
    nat_head: &str,
    stale: &[String],
    zero_first: bool,
    full: bool,
) -> (String, String) {
    let mut head = String::with_capacity(
        filter.rules.len()
            + filter_head.len()
            + nat_head.len()
            + 40 * (filter.chains.len() + nat.chains.len() + stale.len())
            + 64,
    );
    head.push_str("*filter\n");
    if zero_first {
        head.push_str("-Z\n");
    }
    head.push_str(filter.chains.declarations());
    head.push_str(filter_head);
    head.push_str(&filter.rules);
    head.push_str("COMMIT\n*nat\n");
    if zero_first {
        head.push_str("-Z\n");
    }
    // A stale chain must be declared (flushing it) before it can be deleted.
    head.push_str(nat.chains.declarations());
    write_decls(&mut head, stale);
    head.push_str(nat_head);
    let mut tail = String::with_capacity(stale.len() * 32 + 8 + CANARY_BLOCKS.len());
    for c in stale {
        tail.push_str("-X ");
        tail.push_str(c);
        tail.push('\n');
    }
    tail.push_str("COMMIT\n");
    if full {
        tail.push_str(CANARY_BLOCKS);
    }
    (head, tail)
}

/// Assembles a payload around owned nat rules, reusing their buffer: the head is inserted
/// in front, which moves the rules within the buffer instead of copying them into a second
/// one, so a 30 MB ruleset is held once.
fn assemble_owned(head: &str, nat_rules: String, tail: &str) -> String {
    let mut out = nat_rules;
    out.reserve(head.len() + tail.len());
    out.insert_str(0, head);
    out.push_str(tail);
    out
}

/// Assembles a payload from borrowed nat rules into one buffer of the final size.
fn assemble_copy(head: &str, nat_rules: &str, tail: &str) -> String {
    let mut out = String::with_capacity(head.len() + nat_rules.len() + tail.len());
    out.push_str(head);
    out.push_str(nat_rules);
    out.push_str(tail);
    out
}

/// Upstream's payload of a full sync, in one buffer: every chain we own declared and
/// written, whatever the kernel holds (the proxier's own full sync leaves out the unchanged
/// ones, see [`full`]). `kernel` is the state read with `iptables-save` (or `None` to assume a
/// node without any of our rules). Returns the payload and the stale chains it deletes.
pub fn full_payload(rendered: &Rendered, kernel: Option<&KernelTables>) -> (String, Vec<String>) {
    let stale = stale_in_kernel(kernel, &rendered.active_nat_chains);
    let (head, tail) = head_and_tail(
        &rendered.filter,
        &missing_jumps(
            "filter",
            kernel.map(|k| &k.filter),
            rendered.filter.chains.contains(KUBE_FIREWALL),
        ),
        &rendered.nat,
        &missing_jumps("nat", kernel.map(|k| &k.nat), false),
        &stale,
        false,
        true,
    );
    (assemble_copy(&head, &rendered.nat.rules, &tail), stale)
}

/// [`full_payload`] that takes the nat rules out of `rendered` (left empty) instead of
/// copying them: the same payload, with the ruleset held in memory once.
pub fn full_payload_take(
    rendered: &mut Rendered,
    kernel: Option<&KernelTables>,
) -> (String, Vec<String>) {
    full_payload_take_with(rendered, kernel, false)
}

/// [`full_payload_take`], optionally with `-Z` (zero the counters of every chain) as the
/// first command of each table. A command without a chain makes `iptables-nft-restore`
/// (1.8.x) skip building its sorted list of every chain the restore names, which costs
/// commands × chains string compares (10–30× faster loads from 1,000 Services on; see
/// `docs/benchmarks.md`). The rules written are unchanged; the packet and byte counters of
/// every rule in the filter and nat tables, ours and others', are reset.
pub fn full_payload_take_with(
    rendered: &mut Rendered,
    kernel: Option<&KernelTables>,
    zero_counters_first: bool,
) -> (String, Vec<String>) {
    let stale = stale_in_kernel(kernel, &rendered.active_nat_chains);
    let (head, tail) = head_and_tail(
        &rendered.filter,
        &missing_jumps(
            "filter",
            kernel.map(|k| &k.filter),
            rendered.filter.chains.contains(KUBE_FIREWALL),
        ),
        &rendered.nat,
        &missing_jumps("nat", kernel.map(|k| &k.nat), false),
        &stale,
        zero_counters_first,
        true,
    );
    let rules = std::mem::take(&mut rendered.nat.rules);
    (assemble_owned(&head, rules, &tail), stale)
}

/// The payload of a partial sync: `previous` is the set of per-Service chains the last
/// successful sync left in the kernel. Returns the payload and the stale chains it deletes.
pub fn partial_payload<P: ChainNames + ?Sized>(
    rendered: &Rendered,
    previous: &P,
) -> (String, Vec<String>) {
    let mut stale: Vec<String> = Vec::new();
    previous.each_name(&mut |c| {
        if !rendered.active_nat_chains.contains(c) {
            stale.push(c.to_string());
        }
    });
    stale.sort();
    let (head, tail) = head_and_tail(
        &rendered.filter,
        "",
        &rendered.nat,
        "",
        &stale,
        false,
        false,
    );
    (assemble_copy(&head, &rendered.nat.rules, &tail), stale)
}

/// The fixed chains that `--cleanup` removes, per table.
/// Our filter chains, of iptables mode and of IPVS mode (so `--cleanup` and a switch to
/// nftables mode remove both), and the canary of every mode but nftables.
pub(crate) const CLEANUP_FILTER: [&str; 11] = [
    KUBE_PROXY_CANARY,
    KUBE_SERVICES,
    KUBE_EXTERNAL_SERVICES,
    KUBE_FORWARD,
    KUBE_NODEPORTS,
    KUBE_PROXY_FIREWALL,
    crate::ipvs::names::KUBE_NODE_PORT,
    crate::ipvs::names::KUBE_SOURCE_RANGES_FIREWALL,
    crate::ipvs::names::KUBE_IPVS_FILTER,
    crate::ipvs::names::KUBE_IPVS_OUT_FILTER,
    crate::userspace::render::KUBE_NODEPORT_NON_LOCAL,
];
/// Our nat chains, of iptables mode, IPVS mode and userspace mode, and the canary.
pub(crate) const CLEANUP_NAT: [&str; 11] = [
    KUBE_PROXY_CANARY,
    KUBE_SERVICES,
    KUBE_NODEPORTS,
    KUBE_POSTROUTING,
    KUBE_MARK_MASQ,
    crate::ipvs::names::KUBE_NODE_PORT,
    crate::ipvs::names::KUBE_LOAD_BALANCER,
    crate::userspace::render::KUBE_PORTALS_CONTAINER,
    crate::userspace::render::KUBE_PORTALS_HOST,
    crate::userspace::render::KUBE_NODEPORT_CONTAINER,
    crate::userspace::render::KUBE_NODEPORT_HOST,
];

/// The localnet drop we write into `KUBE-FIREWALL`, canonical.
pub const KUBE_FIREWALL_RULE: &str = "-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP";

/// What [`cleanup_payload`] decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanupPlan {
    /// The restore payload; `None` when there is nothing of ours to remove.
    pub payload: Option<String>,
    /// Chains removed, as `table/chain`.
    pub removed: Vec<String>,
    /// Chains kept although they look like ours, with the reason.
    pub kept: Vec<(String, String)>,
}

/// What a cleanup removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CleanupScope {
    /// `--cleanup` and a switch of mode: everything of ours, `KUBE-FIREWALL` included when
    /// it holds nothing but our localnet drop.
    Everything,
    /// The backend the node does not use: as `Everything`, but `KUBE-FIREWALL` always stays.
    /// Older kubelets (before 1.28) write the same localnet drop into their own
    /// `KUBE-FIREWALL`, so its content does not tell whose it is; in a backend we do not use
    /// it can only be a duplicate of the rule we write in the other.
    OtherBackend,
    /// IPVS mode's leftovers once iptables mode has written its own rules over them (a node
    /// switched from IPVS mode): the chains only IPVS mode has ([`IPVS_ONLY_FILTER`],
    /// [`IPVS_ONLY_NAT`]) and IPVS mode's jumps from the built-in chains that iptables mode
    /// does not write (those into these chains, and `kube-proxy firewall rules` →
    /// `KUBE-PROXY-FIREWALL`). The chains the two modes share, now iptables mode's, stay.
    IpvsOnly,
}

/// The filter chains of IPVS mode that iptables mode does not have.
pub(crate) const IPVS_ONLY_FILTER: [&str; 4] = [
    crate::ipvs::names::KUBE_NODE_PORT,
    crate::ipvs::names::KUBE_SOURCE_RANGES_FIREWALL,
    crate::ipvs::names::KUBE_IPVS_FILTER,
    crate::ipvs::names::KUBE_IPVS_OUT_FILTER,
];

/// The nat chains of IPVS mode that iptables mode does not have.
pub(crate) const IPVS_ONLY_NAT: [&str; 2] = [
    crate::ipvs::names::KUBE_NODE_PORT,
    crate::ipvs::names::KUBE_LOAD_BALANCER,
];

/// Whether `line` (canonical `-A CHAIN ...`) is one of IPVS mode's jumps from the built-in
/// chains of `table` that iptables mode does not write.
fn ipvs_only_jump(table: &str, line: &str) -> bool {
    let ipvs = crate::ipvs::JUMPS
        .iter()
        .any(|(t, chain, comment, target)| {
            *t == table
                && line == format!("-A {chain} -m comment --comment \"{comment}\" -j {target}")
        });
    ipvs && !KUBE_PROXY_JUMPS.iter().any(|j| j.rule == line)
}

/// Plans `--cleanup`: delete our jump rules from the built-in chains, then flush and delete
/// our chains. A chain still referenced by a rule we do not remove is kept (and reported);
/// `KUBE-FIREWALL` is removed only when it holds nothing but our localnet drop (kubelet may
/// own a copy of it with other rules).
pub fn cleanup_payload(kernel: &KernelTables) -> CleanupPlan {
    cleanup_payload_in(kernel, CleanupScope::Everything)
}

/// [`cleanup_payload`] for a [`CleanupScope`].
pub fn cleanup_payload_in(kernel: &KernelTables, scope: CleanupScope) -> CleanupPlan {
    let mut plan = CleanupPlan::default();
    let mut out = String::new();
    let ipvs_only = scope == CleanupScope::IpvsOnly;
    for (name, table, fixed) in [
        (
            "filter",
            &kernel.filter,
            if ipvs_only {
                &IPVS_ONLY_FILTER[..]
            } else {
                &CLEANUP_FILTER[..]
            },
        ),
        (
            "nat",
            &kernel.nat,
            if ipvs_only {
                &IPVS_ONLY_NAT[..]
            } else {
                &CLEANUP_NAT[..]
            },
        ),
    ] {
        let mut ours: BTreeSet<String> = table
            .chains
            .iter()
            .filter(|c| {
                fixed.contains(&c.as_str()) || (name == "nat" && !ipvs_only && is_dynamic_chain(c))
            })
            .cloned()
            .collect();
        if ipvs_only {
            // KUBE-FIREWALL is iptables mode's now.
        } else if name == "filter"
            && table.chains.contains(KUBE_FIREWALL)
            && scope == CleanupScope::OtherBackend
        {
            plan.kept.push((
                format!("filter/{KUBE_FIREWALL}"),
                "kubelet may own it; left in the backend this node does not use".into(),
            ));
        } else if name == "filter" && table.chains.contains(KUBE_FIREWALL) {
            let foreign = table
                .rules
                .iter()
                .any(|(c, line, _)| c == KUBE_FIREWALL && line != KUBE_FIREWALL_RULE);
            if foreign {
                plan.kept.push((
                    format!("filter/{KUBE_FIREWALL}"),
                    "it holds rules kube-proxy-rs did not write".into(),
                ));
            } else {
                ours.insert(KUBE_FIREWALL.to_string());
            }
        }
        // Chains referenced from a chain we keep (other than the built-in jumps we remove)
        // cannot be deleted; keep them and everything they depend on stays valid.
        loop {
            let blocked: Vec<(String, String)> = ours
                .iter()
                .filter_map(|c| {
                    table
                        .rules
                        .iter()
                        .find(|(from, _, target)| {
                            target.as_deref() == Some(c.as_str())
                                && !ours.contains(from)
                                && !is_builtin_jump(name, from, c)
                        })
                        .map(|(from, _, _)| (c.clone(), from.clone()))
                })
                .collect();
            if blocked.is_empty() {
                break;
            }
            for (c, from) in blocked {
                ours.remove(&c);
                plan.kept.push((
                    format!("{name}/{c}"),
                    format!("still referenced from chain {from}"),
                ));
            }
        }
        let deletes: Vec<&String> = table
            .rules
            .iter()
            .filter(|(from, line, target)| {
                let builtin = is_builtin_jump(name, from, target.as_deref().unwrap_or(""));
                (target.as_ref().is_some_and(|t| ours.contains(t)) && builtin)
                    || (ipvs_only && builtin && ipvs_only_jump(name, line))
            })
            .map(|(_, line, _)| line)
            .collect();
        if ours.is_empty() && deletes.is_empty() {
            continue;
        }
        let _ = writeln!(out, "*{name}");
        for c in &ours {
            let _ = writeln!(out, ":{c} - [0:0]");
        }
        for line in deletes {
            // `-A CHAIN spec` → `-D CHAIN spec`.
            let _ = writeln!(out, "-D{}", &line[2..]);
        }
        for c in &ours {
            let _ = writeln!(out, "-X {c}");
            plan.removed.push(format!("{name}/{c}"));
        }
        out.push_str("COMMIT\n");
    }
    if !out.is_empty() {
        plan.payload = Some(out);
    }
    plan
}

fn is_builtin_jump(table: &str, from: &str, _target: &str) -> bool {
    match table {
        "filter" => matches!(from, "INPUT" | "FORWARD" | "OUTPUT"),
        "nat" => matches!(from, "PREROUTING" | "INPUT" | "OUTPUT" | "POSTROUTING"),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
