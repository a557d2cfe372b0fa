//! Reconciliation: rendered objects plus what the kernel holds become ONE `nft -f` payload.
//!
//! - A *full* sync (start, after a failure, on node changes, hourly) reads the table's chains
//!   and sets (`nft list chains`, `nft -t list sets`, `nft -t list maps`), creates what is
//!   missing (`add` is idempotent), re-creates base chains whose hook or priority differ,
//!   flushes every chain and every shared set and map and writes them again, and deletes
//!   whatever else is in the table: per-Service chains and affinity sets no Service uses, and
//!   objects of other layouts. Affinity sets that stay are not flushed, so clients keep their
//!   endpoint across full syncs and restarts.
//! - A *partial* sync touches only the Services that changed: it rewrites their chains,
//!   creates and deletes their affinity sets, and adds or deletes exactly the map and set
//!   elements whose effective value changed. It relies on the [`State`] the last successful
//!   sync left; its size does not depend on how many other Services exist.
//!
//! Several Services may claim the same element (every port of a Service adds its ClusterIP to
//! `cluster-ips`; two Services may list the same external IP and port): the element exists
//! while any Service claims it, and when the claims disagree on the verdict the Service that
//! sorts first wins, in full and partial syncs alike.
//!
//! Order inside a payload: declarations, flushes, deletions of elements, of sets and maps and
//! of chains (each only after everything that referenced it was flushed or deleted), then one
//! `table … { … }` block with affinity sets and chain rules, then element additions. The
//! kernel commits all of it or nothing. On this kernel (6.18) a chain whose last reference
//! goes away in a transaction can be deleted in that same transaction; upstream defers such
//! deletions by a second because kernels before 6.2 released map-element references late.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use kp_model::{IpFamily, NamespacedName};
use kp_netfilter::{TableObjects, quote};

use super::names::{
    FIREWALL_PREFIX, NODEPORT_IPS, REJECT_CHAIN, TABLE, TABLE_COMMENT, is_affinity_set,
};
use super::render::{
    AffinitySet, BASE_CHAINS, ChainRules, Container, FIXED_CHAINS, NODEPORT_IPS_COMMENT,
    REJECT_CHAIN_COMMENT, RenderConfig, Rendered, ServiceObjects, fixed_chains, ip_word,
    nodeport_ip_elements, nodeport_ips_declaration,
};

/// Elements per `add element` / `delete element` command.
const ELEMENTS_PER_COMMAND: usize = 1000;

/// The value and comment of one element.
type ElemData = (String, Option<String>);

/// What one Service put into the kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Footprint {
    chains: Vec<String>,
    sets: Vec<(String, u32)>,
    elements: Vec<(Container, String)>,
    rules: usize,
    /// Rules in its `firewall-` chains (filter hooks).
    filter_rules: usize,
    /// Its endpoints in the snapshot.
    endpoints: usize,
}

/// What the last successful sync left in the table, kept between syncs so that a partial sync
/// can work out its changes without reading the kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    services: HashMap<NamespacedName, Footprint>,
    /// Every element and the Services claiming it, sorted by Service; the first one's data is
    /// what the kernel holds.
    elements: HashMap<(Container, String), Vec<(NamespacedName, ElemData)>>,
    nodeport_ips: Vec<IpAddr>,
    fixed: String,
    fixed_rules: usize,
    fixed_filter_rules: usize,
    service_rules: usize,
    service_filter_rules: usize,
    endpoints: usize,
}

impl State {
    /// The fingerprint of the fixed objects this state was written with (see
    /// [`fixed_fingerprint`]).
    pub fn fixed(&self) -> &str {
        &self.fixed
    }

    /// Rules in the table after the sync that produced this state.
    pub fn rules(&self) -> usize {
        self.fixed_rules + self.service_rules
    }

    /// Rules in chains evaluated from filter hooks: the filter base chains, the check chains,
    /// `reject-chain` and the `firewall-` chains.
    pub fn filter_rules(&self) -> usize {
        self.fixed_filter_rules + self.service_filter_rules
    }

    /// Endpoints of every Service (the snapshot's, as of the last sync).
    pub fn endpoints(&self) -> usize {
        self.endpoints
    }

    /// Per-Service chains in the table.
    pub fn service_chains(&self) -> usize {
        self.services.values().map(|f| f.chains.len()).sum()
    }

    /// Elements in the shared sets and maps (not counting `nodeport-ips`).
    pub fn elements(&self) -> usize {
        self.elements.len()
    }
}

/// What a payload does, for the sync report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PayloadStats {
    /// Chains written (flushed or created, then filled).
    pub chains_written: usize,
    /// Rules written.
    pub rules_written: usize,
    /// Chains deleted (stale).
    pub chains_deleted: usize,
    /// Sets and maps deleted (stale affinity sets, foreign objects).
    pub sets_deleted: usize,
    /// Elements added.
    pub elements_added: usize,
    /// Elements deleted.
    pub elements_deleted: usize,
    /// Base chains re-created because their hook or priority differed.
    pub base_chains_recreated: usize,
}

/// A text that identifies the fixed objects for `family` and `cfg`: when it changes
/// (for instance the pod CIDR of `--detect-local-mode NodeCIDR`), a full sync is needed.
pub fn fixed_fingerprint(family: IpFamily, cfg: &RenderConfig) -> String {
    let mut s = String::new();
    for c in fixed_chains(family, cfg) {
        let _ = writeln!(s, "{}: {}", c.name, c.rules.join("; "));
    }
    let _ = writeln!(s, "nodeport-ips: {}", cfg.nodeport_ips.is_some());
    s
}

/// Builds the text of a payload.
struct Writer {
    out: String,
    /// `ip` or `ip6`.
    fam: &'static str,
    stats: PayloadStats,
}

impl Writer {
    fn new(family: IpFamily, capacity: usize) -> Self {
        Writer {
            out: String::with_capacity(capacity),
            fam: ip_word(family),
            stats: PayloadStats::default(),
        }
    }

    /// `VERB KIND FAMILY kube-proxy NAME[ TAIL]`.
    fn cmd(&mut self, verb: &str, kind: &str, name: &str, tail: &str) {
        let _ = write!(self.out, "{verb} {kind} {} {TABLE} {name}", self.fam);
        if !tail.is_empty() {
            self.out.push(' ');
            self.out.push_str(tail);
        }
        self.out.push('\n');
    }

    fn elements<'a>(
        &mut self,
        verb: &str,
        container: &str,
        items: impl IntoIterator<Item = &'a str>,
    ) -> usize {
        let mut count = 0;
        let mut open = 0;
        for item in items {
            if open == ELEMENTS_PER_COMMAND {
                self.out.push_str("\n}\n");
                open = 0;
            }
            if open == 0 {
                let _ = write!(
                    self.out,
                    "{verb} element {} {TABLE} {container} {{\n\t",
                    self.fam
                );
            } else {
                self.out.push_str(",\n\t");
            }
            self.out.push_str(item);
            open += 1;
            count += 1;
        }
        if open > 0 {
            self.out.push_str("\n}\n");
        }
        count
    }

    /// The `table … { … }` block with affinity sets and chain rules.
    fn block<'a>(
        &mut self,
        sets: impl IntoIterator<Item = &'a AffinitySet>,
        chains: impl IntoIterator<Item = &'a ChainRules>,
        addr_type: &str,
    ) {
        let start = self.out.len();
        let _ = writeln!(self.out, "table {} {TABLE} {{", self.fam);
        let header = self.out.len();
        for s in sets {
            let _ = writeln!(
                self.out,
                "\tset {} {{ type {addr_type} ; flags dynamic,timeout ; timeout {}s ; }}",
                s.name, s.timeout_seconds
            );
        }
        for c in chains {
            let _ = writeln!(self.out, "\tchain {} {{", c.name);
            for r in &c.rules {
                self.out.push_str("\t\t");
                self.out.push_str(r);
                self.out.push('\n');
            }
            self.out.push_str("\t}\n");
            self.stats.chains_written += 1;
            self.stats.rules_written += c.rules.len();
        }
        if self.out.len() == header {
            self.out.truncate(start);
        } else {
            self.out.push_str("}\n");
        }
    }
}

fn addr_type(family: IpFamily) -> &'static str {
    super::render::addr_type(family)
}

/// Records the claims of `owner` in `elements`, keeping each claim list sorted by owner.
fn claim(
    elements: &mut HashMap<(Container, String), Vec<(NamespacedName, ElemData)>>,
    owner: &NamespacedName,
    objs: &ServiceObjects,
) -> Vec<(Container, String)> {
    let mut keys = Vec::with_capacity(objs.elements.len());
    for e in &objs.elements {
        let key = (e.container, e.key.clone());
        let claims = elements.entry(key.clone()).or_default();
        match claims.binary_search_by(|(o, _)| o.cmp(owner)) {
            // A second claim by the same Service (two ports, one ClusterIP): the first stays.
            Ok(_) => continue,
            Err(pos) => claims.insert(pos, (owner.clone(), (e.value.clone(), e.comment.clone()))),
        }
        keys.push(key);
    }
    keys
}

fn footprint(objs: &ServiceObjects, elements: Vec<(Container, String)>) -> Footprint {
    Footprint {
        chains: objs.chains.iter().map(|c| c.name.clone()).collect(),
        sets: objs
            .sets
            .iter()
            .map(|s| (s.name.clone(), s.timeout_seconds))
            .collect(),
        elements,
        rules: objs.rule_count(),
        filter_rules: objs
            .chains
            .iter()
            .filter(|c| c.name.starts_with(FIREWALL_PREFIX))
            .map(|c| c.rules.len())
            .sum(),
        endpoints: objs.endpoints,
    }
}

/// Whether a fixed chain is evaluated from a filter hook.
fn is_filter_chain(name: &str) -> bool {
    name.starts_with("filter-") || name.ends_with("-check") || name == REJECT_CHAIN
}

/// The element text for `key` with `data`.
fn element_text(key: &str, data: &ElemData) -> String {
    let mut s = key.to_string();
    if let Some(c) = &data.1 {
        let _ = write!(s, " comment {}", quote(c));
    }
    if !data.0.is_empty() {
        let _ = write!(s, " : {}", data.0);
    }
    s
}

/// The payload of a full sync, and the state the table will be in once it is applied.
/// `kernel` is what the table holds now (an empty [`TableObjects`] for a fresh node or a dry
/// run); `rendered` must hold every Service.
pub fn full_payload(
    family: IpFamily,
    cfg: &RenderConfig,
    rendered: &Rendered,
    kernel: &TableObjects,
) -> (String, State, PayloadStats) {
    let fixed = fixed_chains(family, cfg);
    let estimate: usize = rendered
        .services
        .values()
        .map(|s| s.rule_count() * 72 + s.elements.len() * 64 + 64)
        .sum();
    let mut w = Writer::new(family, estimate + 8192);
    let _ = writeln!(
        w.out,
        "add table {} {TABLE} {{ comment {} ; }}",
        w.fam,
        quote(TABLE_COMMENT)
    );

    // Base chains: any chain that has the name of one of ours but another hook, type or
    // priority, any other base chain and any of our regular chains that is a base chain in
    // the kernel is deleted first (base chains cannot be referenced, so this always works).
    let mut deleted: HashSet<&str> = HashSet::new();
    for (name, spec) in &kernel.chains {
        let wanted = BASE_CHAINS.iter().find(|b| b.0 == name);
        let wrong = match (wanted, spec) {
            (Some((_, ty, hook, _, prio)), Some(s)) => {
                s.chain_type != *ty || s.hook != *hook || s.priority != Some(*prio)
            }
            (Some(_), None) => true,
            (None, Some(_)) => true,
            (None, None) => false,
        };
        if wrong {
            w.cmd("delete", "chain", name, "");
            deleted.insert(name.as_str());
            w.stats.base_chains_recreated += usize::from(wanted.is_some());
        }
    }
    for (name, ty, hook, prio, _) in BASE_CHAINS {
        w.cmd(
            "add",
            "chain",
            name,
            &format!("{{ type {ty} hook {hook} priority {prio} ; policy accept ; }}"),
        );
    }
    for name in FIXED_CHAINS {
        if name == REJECT_CHAIN {
            w.cmd(
                "add",
                "chain",
                name,
                &format!("{{ comment {} ; }}", quote(REJECT_CHAIN_COMMENT)),
            );
        } else {
            w.cmd("add", "chain", name, "");
        }
    }
    // Flush every chain that exists (ours, stale and foreign): afterwards no rule refers to
    // any set, map or chain, so any of them can be deleted.
    let fixed_names: BTreeSet<&str> = fixed.iter().map(|c| c.name.as_str()).collect();
    for c in &fixed {
        w.cmd("flush", "chain", &c.name, "");
    }
    for name in kernel.chains.keys() {
        if !deleted.contains(name.as_str()) && !fixed_names.contains(name.as_str()) {
            w.cmd("flush", "chain", name, "");
        }
    }

    // Desired per-Service objects.
    let mut wanted_chains: HashSet<&str> = HashSet::new();
    let mut wanted_sets: HashMap<&str, u32> = HashMap::new();
    for objs in rendered.services.values() {
        wanted_chains.extend(objs.chains.iter().map(|c| c.name.as_str()));
        wanted_sets.extend(
            objs.sets
                .iter()
                .map(|s| (s.name.as_str(), s.timeout_seconds)),
        );
    }

    // Delete the sets and maps nobody uses, ours whose type or comment differ, and affinity
    // sets whose timeout changed (those are created again below).
    let ours = |name: &str| -> Option<(String, String, &'static str)> {
        if let Some(c) = Container::ALL.iter().find(|c| c.name() == name) {
            let (ty, comment) = c.type_and_comment(family);
            return Some((c.kind().to_string(), ty, comment));
        }
        (name == NODEPORT_IPS && cfg.nodeport_ips.is_some()).then(|| {
            (
                "set".to_string(),
                addr_type(family).to_string(),
                NODEPORT_IPS_COMMENT,
            )
        })
    };
    let mut kept: HashSet<&str> = HashSet::new();
    for (kind, objects) in [("set", &kernel.sets), ("map", &kernel.maps)] {
        for (name, info) in objects {
            let keep = match ours(name) {
                Some((k, ty, comment)) => {
                    k == kind && info.key_type == ty && info.comment.as_deref() == Some(comment)
                }
                None => {
                    kind == "set"
                        && is_affinity_set(name)
                        && wanted_sets.get(name.as_str()).is_some_and(|t| {
                            info.timeout.is_none_or(|d| d.as_secs() == u64::from(*t))
                        })
                }
            };
            if keep {
                kept.insert(name.as_str());
            } else {
                w.cmd("delete", kind, name, "");
                w.stats.sets_deleted += 1;
            }
        }
    }
    // The shared sets and maps: created if missing, flushed if kept.
    for c in Container::ALL {
        w.cmd("add", c.kind(), c.name(), &c.declaration(family));
        if kept.contains(c.name()) {
            w.cmd("flush", c.kind(), c.name(), "");
        }
    }
    if cfg.nodeport_ips.is_some() {
        w.cmd(
            "add",
            "set",
            NODEPORT_IPS,
            &nodeport_ips_declaration(family),
        );
        if kept.contains(NODEPORT_IPS) {
            w.cmd("flush", "set", NODEPORT_IPS, "");
        }
    }

    // Stale chains last: everything that referred to them is gone by now.
    for name in kernel.chains.keys() {
        if deleted.contains(name.as_str())
            || fixed_names.contains(name.as_str())
            || wanted_chains.contains(name.as_str())
        {
            continue;
        }
        w.cmd("delete", "chain", name, "");
        w.stats.chains_deleted += 1;
    }

    // Rules: fixed chains first, then every Service's sets and chains.
    let mut sets: Vec<&AffinitySet> = Vec::new();
    let mut chains: Vec<&ChainRules> = fixed.iter().collect();
    for objs in rendered.services.values() {
        sets.extend(&objs.sets);
        chains.extend(&objs.chains);
    }
    w.block(sets, chains, addr_type(family));

    // Elements, and the state they leave.
    let mut state = State {
        fixed: fixed_fingerprint(family, cfg),
        fixed_rules: fixed.iter().map(|c| c.rules.len()).sum(),
        fixed_filter_rules: fixed
            .iter()
            .filter(|c| is_filter_chain(&c.name))
            .map(|c| c.rules.len())
            .sum(),
        ..State::default()
    };
    for (name, objs) in &rendered.services {
        let keys = claim(&mut state.elements, name, objs);
        let fp = footprint(objs, keys);
        state.service_rules += fp.rules;
        state.service_filter_rules += fp.filter_rules;
        state.endpoints += fp.endpoints;
        state.services.insert(name.clone(), fp);
    }
    let mut by_container: BTreeMap<Container, Vec<String>> = BTreeMap::new();
    for ((container, key), claims) in &state.elements {
        if let Some((_, data)) = claims.first() {
            by_container
                .entry(*container)
                .or_default()
                .push(element_text(key, data));
        }
    }
    for (container, mut items) in by_container {
        items.sort();
        w.stats.elements_added +=
            w.elements("add", container.name(), items.iter().map(String::as_str));
    }
    if cfg.nodeport_ips.is_some() {
        state.nodeport_ips = nodeport_ip_elements(cfg);
        let items: Vec<String> = state.nodeport_ips.iter().map(IpAddr::to_string).collect();
        w.elements("add", NODEPORT_IPS, items.iter().map(String::as_str));
    }
    (w.out, state, w.stats)
}

/// The payload of a partial sync for the Services in `changed` (their current objects are in
/// `rendered`; a changed Service missing there was deleted). Updates `state` to what the
/// table holds once the payload is applied; if applying fails, the state is wrong and the
/// caller must do a full sync next. An empty payload means nothing changed.
pub fn partial_payload(
    family: IpFamily,
    cfg: &RenderConfig,
    rendered: &Rendered,
    changed: &BTreeSet<NamespacedName>,
    state: &mut State,
) -> (String, PayloadStats) {
    let mut w = Writer::new(family, 4096);
    let mut old: Vec<(NamespacedName, Footprint)> = Vec::new();
    let mut affected: BTreeSet<(Container, String)> = BTreeSet::new();
    for name in changed {
        if let Some(fp) = state.services.remove(name) {
            affected.extend(fp.elements.iter().cloned());
            state.service_rules -= fp.rules;
            state.service_filter_rules -= fp.filter_rules;
            state.endpoints -= fp.endpoints;
            old.push((name.clone(), fp));
        }
        if let Some(objs) = rendered.services.get(name) {
            affected.extend(objs.elements.iter().map(|e| (e.container, e.key.clone())));
        }
    }
    let effective = |elements: &HashMap<(Container, String), Vec<(NamespacedName, ElemData)>>,
                     key: &(Container, String)| {
        elements
            .get(key)
            .and_then(|c| c.first())
            .map(|(_, d)| d.clone())
    };
    let before: Vec<Option<ElemData>> = affected
        .iter()
        .map(|k| effective(&state.elements, k))
        .collect();
    // Withdraw the old claims, then record the new ones.
    for (name, fp) in &old {
        for key in &fp.elements {
            if let Some(claims) = state.elements.get_mut(key) {
                claims.retain(|(o, _)| o != name);
                if claims.is_empty() {
                    state.elements.remove(key);
                }
            }
        }
    }
    for name in changed {
        if let Some(objs) = rendered.services.get(name) {
            let keys = claim(&mut state.elements, name, objs);
            let fp = footprint(objs, keys);
            state.service_rules += fp.rules;
            state.service_filter_rules += fp.filter_rules;
            state.endpoints += fp.endpoints;
            state.services.insert(name.clone(), fp);
        }
    }
    let mut deletes: BTreeMap<Container, Vec<String>> = BTreeMap::new();
    let mut adds: BTreeMap<Container, Vec<String>> = BTreeMap::new();
    for (key, was) in affected.iter().zip(before) {
        let now = effective(&state.elements, key);
        if was == now {
            continue;
        }
        if was.is_some() {
            deletes.entry(key.0).or_default().push(key.1.clone());
        }
        if let Some(data) = &now {
            adds.entry(key.0)
                .or_default()
                .push(element_text(&key.1, data));
        }
    }

    // Chains and sets of the changed Services, old and new.
    let mut new_chains: HashSet<&str> = HashSet::new();
    let mut new_sets: HashMap<&str, u32> = HashMap::new();
    for name in changed {
        if let Some(objs) = rendered.services.get(name) {
            new_chains.extend(objs.chains.iter().map(|c| c.name.as_str()));
            new_sets.extend(
                objs.sets
                    .iter()
                    .map(|s| (s.name.as_str(), s.timeout_seconds)),
            );
        }
    }
    for (_, fp) in &old {
        for chain in &fp.chains {
            w.cmd("flush", "chain", chain, "");
        }
    }
    for (container, keys) in &deletes {
        w.stats.elements_deleted +=
            w.elements("delete", container.name(), keys.iter().map(String::as_str));
    }
    for (_, fp) in &old {
        for (set, timeout) in &fp.sets {
            if new_sets.get(set.as_str()) != Some(timeout) {
                w.cmd("delete", "set", set, "");
                w.stats.sets_deleted += 1;
            }
        }
    }
    for (_, fp) in &old {
        for chain in &fp.chains {
            if !new_chains.contains(chain.as_str()) {
                w.cmd("delete", "chain", chain, "");
                w.stats.chains_deleted += 1;
            }
        }
    }
    let mut sets: Vec<&AffinitySet> = Vec::new();
    let mut chains: Vec<&ChainRules> = Vec::new();
    for name in changed {
        if let Some(objs) = rendered.services.get(name) {
            sets.extend(&objs.sets);
            chains.extend(&objs.chains);
        }
    }
    w.block(sets, chains, addr_type(family));
    for (container, mut items) in adds {
        items.sort();
        w.stats.elements_added +=
            w.elements("add", container.name(), items.iter().map(String::as_str));
    }

    // NodePort addresses may change without any event (a local address came or went).
    if cfg.nodeport_ips.is_some() {
        let now = nodeport_ip_elements(cfg);
        let gone: Vec<String> = state
            .nodeport_ips
            .iter()
            .filter(|ip| !now.contains(ip))
            .map(IpAddr::to_string)
            .collect();
        let new: Vec<String> = now
            .iter()
            .filter(|ip| !state.nodeport_ips.contains(ip))
            .map(IpAddr::to_string)
            .collect();
        w.elements("delete", NODEPORT_IPS, gone.iter().map(String::as_str));
        w.elements("add", NODEPORT_IPS, new.iter().map(String::as_str));
        state.nodeport_ips = now;
    }
    (w.out, w.stats)
}

#[cfg(test)]
mod tests;
