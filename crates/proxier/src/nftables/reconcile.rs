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
//!   sync left; its size does not depend on how many other Services exist. When the Service
//!   CIDRs changed, it also rewrites `cluster-ips-check` (its drop of unallocated ClusterIPs),
//!   the one fixed chain that depends on objects rather than on the configuration.
//!
//! Several Services may claim the same element (every port of a Service adds its ClusterIP to
//! `cluster-ips`; two Services may list the same external IP and port): the element exists
//! while any Service claims it, and when the claims disagree on the verdict the Service that
//! sorts first wins, in full and partial syncs alike.
//!
//! Order inside a payload: declarations, flushes, deletions of elements, of sets and maps and
//! of chains (each only after everything that referenced it was flushed or deleted), then one
//! `table … { … }` block with affinity sets and chain rules, then element additions. The
//! kernel commits all of it or nothing.
//!
//! A full sync is planned and written in two passes over the Services ([`ServiceSet`]):
//! [`plan_full`] renders each Service and keeps only what the [`State`] needs (its chain and
//! set names, its element claims, counts); [`write_full`] then writes the payload into any
//! [`std::io::Write`] (`nft`'s stdin, see [`kp_netfilter::Nft::apply_with`]), rendering each
//! Service a second time for its rules. So neither the whole payload (8 MB at 10,000
//! Services) nor every Service's rendered rules are ever held; [`full_payload`] is the same
//! two passes into one buffer, and the bytes are identical.
//!
//! The state is compact: element keys, chain and set names are shared text (`Arc<str>`), a
//! verdict map element's `goto` target is the owning Service's chain name (the same
//! allocation), and an element claimed by one Service (nearly all) keeps a claim list of
//! exactly one entry. On this kernel (6.18) a chain whose last reference
//! goes away in a transaction can be deleted in that same transaction; upstream defers such
//! deletions by a second because kernels before 6.2 released map-element references late.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use kp_model::{IpFamily, NamespacedName};
use kp_netfilter::{TableObjects, quote};

use super::names::{
    CLUSTER_IPS_CHECK, FIREWALL_PREFIX, NODEPORT_IPS, REJECT_CHAIN, TABLE, TABLE_COMMENT,
    is_affinity_set,
};
use super::render::{
    AffinitySet, BASE_CHAINS, ChainRules, Container, FIXED_CHAINS, Hairpin, NODEPORT_IPS_COMMENT,
    REJECT_CHAIN_COMMENT, RenderConfig, Rendered, ServiceObjects, ServiceSet, Verdict,
    cluster_ips_check, fixed_chains, ip_word, nodeport_ip_elements, nodeport_ips_declaration,
    write_element,
};

/// Elements per `add element` / `delete element` command.
const ELEMENTS_PER_COMMAND: usize = 1000;

/// Shared immutable text: an element key, a chain or set name, a comment.
type Text = Arc<str>;

/// An element: the set or map it is in, and its key as nft writes it.
type ElemKey = (Container, Text);

/// The value of an element as the state keeps it: a `goto` target shares the text of the
/// owning Service's chain name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    None,
    Drop,
    Reject,
    Goto(Text),
}

impl Value {
    /// The render's verdict, sharing the chain name with `chains` (the owner's chains) when
    /// it is one of them.
    fn new(v: &Verdict, chains: &[Text]) -> Value {
        match v {
            Verdict::None => Value::None,
            Verdict::Drop => Value::Drop,
            Verdict::Reject => Value::Reject,
            Verdict::Goto(chain) => Value::Goto(
                chains
                    .iter()
                    .find(|c| ***c == **chain)
                    .cloned()
                    .unwrap_or_else(|| Text::from(chain.as_str())),
            ),
        }
    }

    /// The render's verdict for this value (for writing it).
    fn verdict(&self) -> Verdict {
        match self {
            Value::None => Verdict::None,
            Value::Drop => Verdict::Drop,
            Value::Reject => Verdict::Reject,
            Value::Goto(chain) => Verdict::Goto(chain.to_string()),
        }
    }
}

/// The value and comment of one element.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ElemData {
    value: Value,
    comment: Option<Text>,
}

/// One Service's claim on an element.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Claim {
    owner: NamespacedName,
    data: ElemData,
}

/// What one Service put into the kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Footprint {
    chains: Box<[Text]>,
    sets: Box<[(Text, u32)]>,
    elements: Box<[ElemKey]>,
    /// Its `hairpin-connections` elements, sorted, each once.
    hairpin: Box<[Hairpin]>,
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
    /// Every Service's footprint, in name order (a full sync writes the affinity sets in
    /// this order).
    services: BTreeMap<NamespacedName, Footprint>,
    /// Every element and the Services claiming it, sorted by Service; the first one's data is
    /// what the kernel holds. In the order of the payload's element commands.
    elements: BTreeMap<ElemKey, Vec<Claim>>,
    /// Every `hairpin-connections` element and how many Services claim it (a set element
    /// has no value, so the claimants need not be known).
    hairpin: BTreeMap<Hairpin, u32>,
    nodeport_ips: Vec<IpAddr>,
    /// The Service CIDRs `cluster-ips-check` drops unallocated addresses of.
    service_cidrs: Vec<IpNet>,
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

    /// The Service CIDRs whose unallocated addresses `cluster-ips-check` drops.
    pub fn service_cidrs(&self) -> &[IpNet] {
        &self.service_cidrs
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
        self.elements.len() + self.hairpin.len()
    }

    /// Records `objs` as what Service `name` puts into the table.
    fn add_service(&mut self, name: &NamespacedName, objs: &ServiceObjects) {
        let fp = footprint(&mut self.elements, name, objs);
        for h in fp.hairpin.iter() {
            *self.hairpin.entry(*h).or_insert(0) += 1;
        }
        self.service_rules += fp.rules;
        self.service_filter_rules += fp.filter_rules;
        self.endpoints += fp.endpoints;
        self.services.insert(name.clone(), fp);
    }

    /// The data the kernel holds for `key` (its first claim's), if any.
    fn effective(&self, key: &ElemKey) -> Option<&ElemData> {
        self.elements
            .get(key)
            .and_then(|c| c.first())
            .map(|c| &c.data)
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
    /// Bytes of the payload.
    pub bytes: usize,
}

/// A text that identifies the fixed objects for `family` and `cfg`: when it changes
/// (for instance the pod CIDR of `--detect-local-mode NodeCIDR`), a full sync is needed.
/// The Service CIDRs are left out: a partial sync rewrites `cluster-ips-check` when they
/// change.
pub fn fixed_fingerprint(family: IpFamily, cfg: &RenderConfig) -> String {
    let without_cidrs = RenderConfig {
        service_cidrs: Vec::new(),
        ..cfg.clone()
    };
    let mut s = String::new();
    for c in fixed_chains(family, &without_cidrs) {
        let _ = writeln!(s, "{}: {}", c.name, c.rules.join("; "));
    }
    let _ = writeln!(s, "nodeport-ips: {}", cfg.nodeport_ips.is_some());
    s
}

/// Writes the text of a payload.
struct Writer<'a> {
    out: &'a mut dyn std::fmt::Write,
    /// `ip` or `ip6`.
    fam: &'static str,
    stats: PayloadStats,
}

impl<'a> Writer<'a> {
    fn new(family: IpFamily, out: &'a mut dyn std::fmt::Write) -> Self {
        Writer {
            out,
            fam: ip_word(family),
            stats: PayloadStats::default(),
        }
    }

    /// `VERB KIND FAMILY kube-proxy NAME[ TAIL]`.
    fn cmd(&mut self, verb: &str, kind: &str, name: &str, tail: &str) {
        let _ = write!(self.out, "{verb} {kind} {} {TABLE} {name}", self.fam);
        if !tail.is_empty() {
            let _ = self.out.write_char(' ');
            let _ = self.out.write_str(tail);
        }
        let _ = self.out.write_char('\n');
    }

    /// `VERB element FAMILY kube-proxy CONTAINER { … }` commands of at most
    /// [`ELEMENTS_PER_COMMAND`] elements, each written by `item`; returns how many.
    fn elements<T>(
        &mut self,
        verb: &str,
        container: &str,
        items: impl IntoIterator<Item = T>,
        mut item: impl FnMut(&mut dyn std::fmt::Write, T),
    ) -> usize {
        let mut count = 0;
        let mut open = 0;
        for it in items {
            if open == ELEMENTS_PER_COMMAND {
                let _ = self.out.write_str("\n}\n");
                open = 0;
            }
            if open == 0 {
                let _ = write!(
                    self.out,
                    "{verb} element {} {TABLE} {container} {{\n\t",
                    self.fam
                );
            } else {
                let _ = self.out.write_str(",\n\t");
            }
            item(&mut *self.out, it);
            open += 1;
            count += 1;
        }
        if open > 0 {
            let _ = self.out.write_str("\n}\n");
        }
        count
    }

    /// `table FAMILY kube-proxy {`, opening the block of affinity sets and chain rules.
    fn open_block(&mut self) {
        let _ = writeln!(self.out, "table {} {TABLE} {{", self.fam);
    }

    fn close_block(&mut self) {
        let _ = self.out.write_str("}\n");
    }

    /// An affinity set in the block.
    fn set(&mut self, name: &str, timeout_seconds: u32, addr_type: &str) {
        let _ = writeln!(
            self.out,
            "\tset {name} {{ type {addr_type} ; flags dynamic,timeout ; timeout {timeout_seconds}s ; }}"
        );
    }

    /// A chain with its rules in the block.
    fn chain(&mut self, c: &ChainRules) {
        let _ = writeln!(self.out, "\tchain {} {{", c.name);
        for r in &c.rules {
            let _ = self.out.write_str("\t\t");
            let _ = self.out.write_str(r);
            let _ = self.out.write_char('\n');
        }
        let _ = self.out.write_str("\t}\n");
        self.stats.chains_written += 1;
        self.stats.rules_written += c.rules.len();
    }
}

fn addr_type(family: IpFamily) -> &'static str {
    super::render::addr_type(family)
}

/// Records the claims of `owner` in `elements`, keeping each claim list sorted by owner, and
/// returns its footprint.
fn footprint(
    elements: &mut BTreeMap<ElemKey, Vec<Claim>>,
    owner: &NamespacedName,
    objs: &ServiceObjects,
) -> Footprint {
    let chains: Box<[Text]> = objs
        .chains
        .iter()
        .map(|c| Text::from(c.name.as_str()))
        .collect();
    let mut keys = Vec::with_capacity(objs.elements.len());
    for e in &objs.elements {
        let data = || ElemData {
            value: Value::new(&e.value, &chains),
            comment: e.comment.as_deref().map(Text::from),
        };
        // The key text is shared by the map and the footprints of every claimant: an
        // occupied entry keeps (and hands out) the text it has.
        let entry = elements.entry((e.container, Text::from(e.key.as_str())));
        let key = entry.key().clone();
        let claims = entry.or_insert_with(|| Vec::with_capacity(1));
        match claims.binary_search_by(|c| c.owner.cmp(owner)) {
            // A second claim by the same Service (two ports, one ClusterIP): the first stays.
            Ok(_) => continue,
            Err(pos) => claims.insert(
                pos,
                Claim {
                    owner: owner.clone(),
                    data: data(),
                },
            ),
        }
        keys.push(key);
    }
    let mut hairpin = objs.hairpin.clone();
    hairpin.sort_unstable();
    hairpin.dedup();
    Footprint {
        hairpin: hairpin.into_boxed_slice(),
        sets: objs
            .sets
            .iter()
            .map(|s| (Text::from(s.name.as_str()), s.timeout_seconds))
            .collect(),
        elements: keys.into_boxed_slice(),
        rules: objs.rule_count(),
        filter_rules: objs
            .chains
            .iter()
            .filter(|c| c.name.starts_with(FIREWALL_PREFIX))
            .map(|c| c.rules.len())
            .sum(),
        endpoints: objs.endpoints,
        chains,
    }
}

/// Whether a fixed chain is evaluated from a filter hook.
fn is_filter_chain(name: &str) -> bool {
    name.starts_with("filter-") || name.ends_with("-check") || name == REJECT_CHAIN
}

/// Writes the element `key` with `data`, as it goes between the braces of `add element`.
fn write_claimed(out: &mut dyn std::fmt::Write, key: &str, data: &ElemData) {
    write_element(out, key, &data.value.verdict(), data.comment.as_deref());
}

/// The payload of a full sync, and the state the table will be in once it is applied, in one
/// buffer: [`plan_full`] then [`write_full`] into a `String`. `kernel` is what the table
/// holds now (an empty [`TableObjects`] for a fresh node or a dry run); `rendered` must hold
/// every Service.
pub fn full_payload(
    family: IpFamily,
    cfg: &RenderConfig,
    rendered: &Rendered,
    kernel: &TableObjects,
) -> (String, State, PayloadStats) {
    let state = plan_full(family, cfg, rendered);
    let mut out = Vec::new();
    // Writing into a Vec cannot fail.
    let stats = write_full(family, cfg, rendered, kernel, &state, &mut out).unwrap_or_default();
    let text = String::from_utf8(out)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    (text, state, stats)
}

/// The first pass of a full sync: the state the table will be in once the payload of
/// [`write_full`] is applied, from one visit of every Service. Only the state is kept of each
/// Service's objects.
pub fn plan_full(family: IpFamily, cfg: &RenderConfig, services: &dyn ServiceSet) -> State {
    let fixed = fixed_chains(family, cfg);
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
    services.each(&mut |name, objs| state.add_service(name, objs));
    if cfg.nodeport_ips.is_some() {
        state.nodeport_ips = nodeport_ip_elements(cfg);
    }
    state.service_cidrs.clone_from(&cfg.service_cidrs);
    state
}

/// The second pass of a full sync: writes its payload into `out` as it goes. `state` is
/// [`plan_full`]'s for the same `services`, which are visited once more for their rules;
/// `kernel` is what the table holds now (an empty [`TableObjects`] for a fresh node or a dry
/// run).
///
/// # Errors
/// The first error of `out` (writing stops there).
pub fn write_full(
    family: IpFamily,
    cfg: &RenderConfig,
    services: &dyn ServiceSet,
    kernel: &TableObjects,
    state: &State,
    out: &mut dyn std::io::Write,
) -> std::io::Result<PayloadStats> {
    let mut io = crate::IoText::new(out);
    let mut w = Writer::new(family, &mut io);
    let fixed = fixed_chains(family, cfg);
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
    for fp in state.services.values() {
        wanted_chains.extend(fp.chains.iter().map(|c| &**c));
        wanted_sets.extend(fp.sets.iter().map(|(s, t)| (&**s, *t)));
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
    drop(wanted_chains);
    drop(wanted_sets);

    // Rules: every Service's affinity sets, the fixed chains, then every Service's chains
    // (rendered again, one Service at a time).
    w.open_block();
    let addr = addr_type(family);
    for fp in state.services.values() {
        for (name, timeout) in &fp.sets {
            w.set(name, *timeout, addr);
        }
    }
    for c in &fixed {
        w.chain(c);
    }
    services.each(&mut |_, objs| {
        for c in &objs.chains {
            w.chain(c);
        }
    });
    w.close_block();

    // Elements, in the state's order (by set or map, then by key text: the order of the
    // element texts, since a key is never a prefix of another key of its container followed
    // by a character below the space that follows a key).
    for container in Container::ALL {
        if container == Container::HairpinConnections {
            w.stats.elements_added +=
                w.elements("add", container.name(), state.hairpin.keys(), |out, h| {
                    let _ = write!(out, "{h}");
                });
            continue;
        }
        let lo = (container, Text::from(""));
        let claimed = state
            .elements
            .range(lo..)
            .take_while(|((c, _), _)| *c == container)
            .filter_map(|((_, key), claims)| claims.first().map(|c| (key, &c.data)));
        w.stats.elements_added +=
            w.elements("add", container.name(), claimed, |out, (key, data)| {
                write_claimed(out, key, data);
            });
    }
    if cfg.nodeport_ips.is_some() {
        w.elements("add", NODEPORT_IPS, &state.nodeport_ips, |out, ip| {
            let _ = write!(out, "{ip}");
        });
    }
    let mut stats = w.stats;
    stats.bytes = io.finish()?;
    Ok(stats)
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
    let mut text = String::with_capacity(4096);
    let mut w = Writer::new(family, &mut text);
    let mut old: Vec<(NamespacedName, Footprint)> = Vec::new();
    let mut affected: BTreeSet<ElemKey> = BTreeSet::new();
    for name in changed {
        if let Some(fp) = state.services.remove(name) {
            affected.extend(fp.elements.iter().cloned());
            state.service_rules -= fp.rules;
            state.service_filter_rules -= fp.filter_rules;
            state.endpoints -= fp.endpoints;
            old.push((name.clone(), fp));
        }
        if let Some(objs) = rendered.services.get(name) {
            affected.extend(
                objs.elements
                    .iter()
                    .map(|e| (e.container, Text::from(e.key.as_str()))),
            );
        }
    }
    let before: Vec<Option<ElemData>> = affected
        .iter()
        .map(|k| state.effective(k).cloned())
        .collect();
    // Hairpin elements: present before, and after.
    let mut hairpin_before: BTreeMap<Hairpin, bool> = BTreeMap::new();
    for (_, fp) in &old {
        for h in fp.hairpin.iter() {
            hairpin_before.insert(*h, true);
        }
    }
    for name in changed {
        if let Some(objs) = rendered.services.get(name) {
            for h in &objs.hairpin {
                hairpin_before
                    .entry(*h)
                    .or_insert_with(|| state.hairpin.contains_key(h));
            }
        }
    }
    for (_, fp) in &old {
        for h in fp.hairpin.iter() {
            if let Some(n) = state.hairpin.get_mut(h) {
                *n -= 1;
                if *n == 0 {
                    state.hairpin.remove(h);
                }
            }
        }
    }
    // Withdraw the old claims, then record the new ones.
    for (name, fp) in &old {
        for key in &fp.elements {
            if let Some(claims) = state.elements.get_mut(key) {
                claims.retain(|c| c.owner != *name);
                if claims.is_empty() {
                    state.elements.remove(key);
                }
            }
        }
    }
    for name in changed {
        if let Some(objs) = rendered.services.get(name) {
            state.add_service(name, objs);
        }
    }
    let mut deletes: BTreeMap<Container, Vec<&str>> = BTreeMap::new();
    let mut adds: BTreeMap<Container, Vec<(&str, ElemData)>> = BTreeMap::new();
    for (key, was) in affected.iter().zip(before) {
        let now = state.effective(key);
        if was.as_ref() == now {
            continue;
        }
        if was.is_some() {
            deletes.entry(key.0).or_default().push(&key.1);
        }
        if let Some(data) = now {
            adds.entry(key.0).or_default().push((&key.1, data.clone()));
        }
    }

    // The Service CIDRs changed: `cluster-ips-check` is flushed and written again.
    let cluster_ips_check_chain = (cfg.service_cidrs != state.service_cidrs).then(|| {
        let rules = cluster_ips_check(family, cfg);
        let before = 1 + usize::from(!state.service_cidrs.is_empty());
        state.fixed_rules = state.fixed_rules + rules.len() - before;
        state.fixed_filter_rules = state.fixed_filter_rules + rules.len() - before;
        state.service_cidrs.clone_from(&cfg.service_cidrs);
        w.cmd("flush", "chain", CLUSTER_IPS_CHECK, "");
        ChainRules {
            name: CLUSTER_IPS_CHECK.to_string(),
            rules,
        }
    });

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
        w.stats.elements_deleted += w.elements("delete", container.name(), keys, |out, key| {
            let _ = out.write_str(key);
        });
    }
    // Hairpin elements whose presence changed: gone, and new.
    let hairpin_gone: Vec<&Hairpin> = hairpin_before
        .iter()
        .filter(|(h, was)| **was && !state.hairpin.contains_key(*h))
        .map(|(h, _)| h)
        .collect();
    let hairpin_new: Vec<&Hairpin> = hairpin_before
        .iter()
        .filter(|(h, was)| !**was && state.hairpin.contains_key(*h))
        .map(|(h, _)| h)
        .collect();
    w.stats.elements_deleted += w.elements(
        "delete",
        Container::HairpinConnections.name(),
        hairpin_gone,
        |out, h| {
            let _ = write!(out, "{h}");
        },
    );
    for (_, fp) in &old {
        for (set, timeout) in &fp.sets {
            if new_sets.get(&**set) != Some(timeout) {
                w.cmd("delete", "set", set, "");
                w.stats.sets_deleted += 1;
            }
        }
    }
    for (_, fp) in &old {
        for chain in &fp.chains {
            if !new_chains.contains(&**chain) {
                w.cmd("delete", "chain", chain, "");
                w.stats.chains_deleted += 1;
            }
        }
    }
    let mut sets: Vec<&AffinitySet> = Vec::new();
    let mut chains: Vec<&ChainRules> = cluster_ips_check_chain.iter().collect();
    for name in changed {
        if let Some(objs) = rendered.services.get(name) {
            sets.extend(&objs.sets);
            chains.extend(&objs.chains);
        }
    }
    if !sets.is_empty() || !chains.is_empty() {
        w.open_block();
        let addr = addr_type(family);
        for s in sets {
            w.set(&s.name, s.timeout_seconds, addr);
        }
        for c in chains {
            w.chain(c);
        }
        w.close_block();
    }
    for (container, items) in adds {
        // Sorted by key, which is the order of the element texts (see `write_full`).
        w.stats.elements_added += w.elements("add", container.name(), items, |out, (key, data)| {
            write_claimed(out, key, &data);
        });
    }
    w.stats.elements_added += w.elements(
        "add",
        Container::HairpinConnections.name(),
        hairpin_new,
        |out, h| {
            let _ = write!(out, "{h}");
        },
    );

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
        let text_item = |out: &mut dyn std::fmt::Write, s: &String| {
            let _ = out.write_str(s);
        };
        w.elements("delete", NODEPORT_IPS, &gone, text_item);
        w.elements("add", NODEPORT_IPS, &new, text_item);
        state.nodeport_ips = now;
    }
    let mut stats = w.stats;
    stats.bytes = text.len();
    (text, stats)
}

#[cfg(test)]
mod tests;
