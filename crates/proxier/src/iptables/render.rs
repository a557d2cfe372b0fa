//! Rendering: a [`Snapshot`] becomes the `filter` and `nat` rules of upstream kube-proxy's
//! iptables mode. Pure: no I/O, no clock.
//!
//! Rules are written as `iptables-restore` lines in the canonical order `iptables-save` prints
//! them (`-s`, `-d`, `-i`, `-p`, then matches, then the target), so what we send is what the
//! kernel gives back, modulo the probability of `-m statistic`, which is written with 10
//! decimals like upstream and printed back by `iptables-save` with 11.
//!
//! Layout (upstream's):
//! - nat `KUBE-SERVICES`: per ServicePortName a ClusterIP rule (to `KUBE-SVC-` or `KUBE-SVL-`),
//!   external IP and load-balancer IP rules (to `KUBE-EXT-` or `KUBE-FW-`), and last the jump
//!   to `KUBE-NODEPORTS` for local destinations.
//! - `KUBE-SVC-`/`KUBE-SVL-`: masquerade rule for off-cluster sources (or all sources with
//!   `--masquerade-all`), affinity checks, then one `-m statistic --probability 1/(n-i)` rule
//!   per endpoint, the last unconditional.
//! - `KUBE-SEP-`: hairpin masquerade (`-s <endpoint>`), affinity `--set`, DNAT.
//! - filter `KUBE-SERVICES`/`KUBE-EXTERNAL-SERVICES`: REJECT (no endpoints) or DROP (no local
//!   endpoints for a Local policy); `KUBE-FORWARD`: INVALID drop and mark/established accepts;
//!   `KUBE-FIREWALL`: the localnet drop guarding localhost NodePorts.
//!
//! nfacct (upstream's two counters, when the proxier could create them; see
//! [`RenderConfig::nfacct_invalid_drop`]): the INVALID drop becomes
//! `-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name
//! ct_state_invalid_dropped_pkts -j DROP`, and with localhost NodePorts each NodePort of a
//! Service with endpoints gets, before its rule, the same rule limited to `-d 127.0.0.0/8`
//! with `-m nfacct --nfacct-name localhost_nps_accepted_pkts` after `--dport`. Without them
//! the rules are upstream's on a node without nfacct (the seed's).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::{self, Write as _};
use std::hash::{BuildHasherDefault, Hasher};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::OnceLock;

use kp_model::{
    Endpoint, IpFamily, NamespacedName, ServicePortInfo, ServicePortName, SessionAffinity, Snapshot,
};
use kp_track::categorize;

#[cfg(test)]
use super::names::ServiceChains;
use super::names::{
    ChainName, KUBE_EXTERNAL_SERVICES, KUBE_FIREWALL, KUBE_FORWARD, KUBE_MARK_MASQ, KUBE_NODEPORTS,
    KUBE_POSTROUTING, KUBE_PROXY_FIREWALL, KUBE_SERVICES, ServiceNames, endpoint_hash,
    service_hash,
};
use super::tree::{self, Dispatch};
use crate::local::LocalMatch;

/// The nfacct counter of the `KUBE-FORWARD` INVALID drop (upstream
/// `metrics.IPTablesCTStateInvalidDroppedNFAcctCounter`), read for
/// `kubeproxy_iptables_ct_state_invalid_dropped_packets_total`.
pub const NFACCT_CT_STATE_INVALID_DROPPED: &str = "ct_state_invalid_dropped_pkts";
/// The nfacct counter of the localhost NodePort rules (upstream
/// `metrics.LocalhostNodePortAcceptedNFAcctCounter`), read for
/// `kubeproxy_iptables_localhost_nodeports_accepted_packets_total`.
pub const NFACCT_LOCALHOST_NODEPORTS_ACCEPTED: &str = "localhost_nps_accepted_pkts";

/// Above this many endpoints in total, per-endpoint comments are left out to shrink the
/// ruleset (upstream's "large cluster mode", same threshold).
pub const LARGE_CLUSTER_ENDPOINTS: usize = 1000;

/// The filter chains we own, in declaration order.
pub const FILTER_CHAINS: [&str; 5] = [
    KUBE_SERVICES,
    KUBE_EXTERNAL_SERVICES,
    KUBE_FORWARD,
    KUBE_NODEPORTS,
    KUBE_PROXY_FIREWALL,
];
/// The fixed nat chains we own, in declaration order.
pub const NAT_CHAINS: [&str; 4] = [
    KUBE_SERVICES,
    KUBE_NODEPORTS,
    KUBE_POSTROUTING,
    KUBE_MARK_MASQ,
];

/// Mode-wide settings of one render, already resolved for the snapshot's family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderConfig {
    /// `--masquerade-all`: masquerade every packet to a ClusterIP.
    pub masquerade_all: bool,
    /// The masquerade mark, `1 << --iptables-masquerade-bit` (default `0x4000`).
    pub masquerade_mark: u32,
    /// How pod traffic is recognised in this family, if at all.
    pub local: Option<LocalMatch>,
    /// Append `--random-fully` to MASQUERADE (iptables >= 1.6.2).
    pub random_fully: bool,
    /// Localhost NodePorts are served (IPv4, `--iptables-localhost-nodeports`, loopback
    /// within `--nodeport-addresses`): no `! -d 127.0.0.0/8` exclusion, and the
    /// `KUBE-FIREWALL` localnet drop is written.
    pub localhost_nodeports: bool,
    /// `None`: NodePorts on every local address (`-m addrtype --dst-type LOCAL`);
    /// `Some(ips)`: only on these addresses (`-d <ip>` each).
    pub nodeport_ips: Option<Vec<IpAddr>>,
    /// Write the `KUBE-FORWARD` INVALID drop (off when `nf_conntrack_tcp_be_liberal` is set).
    pub drop_invalid: bool,
    /// This is the IPv4 ruleset: with `localhost_nodeports`, the render declares
    /// `KUBE-FIREWALL` and writes the localnet drop into it, as upstream does in IPv4 only.
    /// Otherwise it leaves the chain to `reconcile`, which creates it empty where missing
    /// (upstream's `EnsureChain` in both families) without flushing what it holds.
    pub kube_firewall: bool,
    /// The nfacct counter [`NFACCT_CT_STATE_INVALID_DROPPED`] exists: the INVALID drop
    /// counts into it (`-m nfacct --nfacct-name ct_state_invalid_dropped_pkts` before
    /// `-j DROP`). Upstream sets it when creating the counter succeeded.
    pub nfacct_invalid_drop: bool,
    /// The nfacct counter [`NFACCT_LOCALHOST_NODEPORTS_ACCEPTED`] exists: with
    /// `localhost_nodeports`, every NodePort of a Service with endpoints also gets a
    /// `-d 127.0.0.0/8` rule that counts into it, just before its own rule.
    pub nfacct_localhost_nodeports: bool,
    /// How nat `KUBE-SERVICES` dispatches (`--iptables-dispatch`): upstream's list, or the
    /// tree of [`super::tree`].
    pub dispatch: Dispatch,
}

impl Default for RenderConfig {
    fn default() -> Self {
        RenderConfig {
            masquerade_all: false,
            masquerade_mark: 1 << 14,
            local: None,
            random_fully: true,
            localhost_nodeports: true,
            nodeport_ips: None,
            drop_invalid: true,
            kube_firewall: true,
            nfacct_invalid_drop: false,
            nfacct_localhost_nodeports: false,
            dispatch: Dispatch::Upstream,
        }
    }
}

/// The rules of one table: chains to declare (which flushes them under `--noflush`) and the
/// `-A` lines to write into them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableRules {
    /// Chain names, in declaration order (held as their declaration lines).
    pub chains: ChainList,
    /// `-A …` lines, each ending in `\n`.
    pub rules: String,
    /// Number of lines in `rules`.
    pub rule_count: usize,
}

/// The suffix of a chain declaration line, after `:NAME`.
const DECL_SUFFIX: &str = " - [0:0]\n";

/// Chains to declare, in order, held as the `iptables-restore` declaration lines themselves
/// (`:NAME - [0:0]\n` each): a full sync declares 110k chains at 10,000 Services, and
/// writing them straight into one buffer costs no allocation per name.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ChainList {
    text: String,
    len: usize,
}

impl ChainList {
    /// Appends `name`.
    pub fn push(&mut self, name: &str) {
        self.text.push(':');
        self.text.push_str(name);
        self.text.push_str(DECL_SUFFIX);
        self.len += 1;
    }

    /// Reserves room for `n` more names of up to 28 bytes.
    pub fn reserve(&mut self, n: usize) {
        self.text.reserve(n * (1 + 28 + DECL_SUFFIX.len()));
    }

    /// Number of names.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Removes every name, keeping the buffer.
    pub fn clear(&mut self) {
        self.text.clear();
        self.len = 0;
    }

    /// Removes the names pushed since [`declarations`](Self::declarations) was `len` bytes
    /// long.
    pub fn truncate(&mut self, len: usize) {
        if let Some(removed) = self.text.get(len..) {
            self.len -= removed.matches('\n').count();
            self.text.truncate(len);
        }
    }

    /// The names, in order.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.text.lines().map(|l| {
            l.strip_prefix(':')
                .and_then(|l| l.strip_suffix(DECL_SUFFIX.trim_end_matches('\n')))
                .unwrap_or(l)
        })
    }

    /// Whether `name` is in the list (a linear scan).
    pub fn contains(&self, name: &str) -> bool {
        self.iter().any(|c| c == name)
    }

    /// The declaration lines, `:NAME - [0:0]\n` per name, in order.
    pub fn declarations(&self) -> &str {
        &self.text
    }

    /// Appends the names of `other` after its first `skip`.
    pub fn extend_from(&mut self, other: &ChainList, skip: usize) {
        for line in other.text.split_inclusive('\n').skip(skip) {
            self.text.push_str(line);
            self.len += 1;
        }
    }
}

impl fmt::Debug for ChainList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<S: AsRef<str>> FromIterator<S> for ChainList {
    fn from_iter<T: IntoIterator<Item = S>>(iter: T) -> Self {
        let mut list = ChainList::default();
        for name in iter {
            list.push(name.as_ref());
        }
        list
    }
}

/// A fast, non-cryptographic hasher for sets of chain names and cache keys (the FxHash
/// mixing step: chain names are our own hashes, so flooding is not a concern, and SipHash
/// showed up in profiles of 100k-chain renders).
#[derive(Debug, Clone, Copy, Default)]
pub struct FastHasher(u64);

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
        }
        for b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(*b)).wrapping_mul(K);
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The build-hasher of [`FastHasher`].
pub type FastBuild = BuildHasherDefault<FastHasher>;

/// A set of chain names, held inline ([`ChainName`]: no allocation per name).
///
/// Names are appended to a list; the hash set that answers [`contains`](Self::contains) is
/// built on the first look-up. A cold full sync on a node without our chains never looks
/// anything up, so it never pays for hashing 110k names.
#[derive(Clone, Default)]
pub struct ChainSet {
    /// Names in insertion order (duplicates possible; the look-up set removes them).
    names: Vec<ChainName>,
    /// The same names as a set, built on first use and kept up to date after.
    lookup: OnceLock<HashSet<ChainName, FastBuild>>,
    /// Inserts are ignored (the second pass of a streamed render).
    off: bool,
}

impl ChainSet {
    /// Adds a name.
    pub fn insert_name(&mut self, name: ChainName) {
        if self.off {
            return;
        }
        if let Some(set) = self.lookup.get_mut()
            && !set.insert(name)
        {
            return;
        }
        self.names.push(name);
    }

    /// Adds a name given as text (at most 28 bytes, the iptables limit; longer text is cut).
    pub fn insert(&mut self, name: &str) {
        self.insert_name(ChainName::from_text(name));
    }

    /// The names as a hash set (built on the first call).
    fn lookup(&self) -> &HashSet<ChainName, FastBuild> {
        self.lookup.get_or_init(|| {
            let mut set = HashSet::with_capacity_and_hasher(self.names.len(), FastBuild::default());
            set.extend(self.names.iter().copied());
            set
        })
    }

    /// Whether `name` is in the set.
    pub fn contains(&self, name: &str) -> bool {
        name.len() <= 28 && self.lookup().contains(&ChainName::from_text(name))
    }

    /// Names in the set.
    pub fn len(&self) -> usize {
        self.lookup().len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Reserves room for `n` more names.
    pub fn reserve(&mut self, n: usize) {
        self.names.reserve(n);
    }

    /// The names, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.lookup().iter().map(ChainName::as_str)
    }
}

impl PartialEq for ChainSet {
    fn eq(&self, other: &Self) -> bool {
        self.lookup() == other.lookup()
    }
}

impl Eq for ChainSet {}

impl fmt::Debug for ChainSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<&str> = self.iter().collect();
        names.sort_unstable();
        f.debug_set().entries(names).finish()
    }
}

impl<S: AsRef<str>> FromIterator<S> for ChainSet {
    fn from_iter<T: IntoIterator<Item = S>>(iter: T) -> Self {
        let mut set = ChainSet::default();
        for name in iter {
            set.insert(name.as_ref());
        }
        set
    }
}

/// A rendered ruleset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rendered {
    /// The filter table.
    pub filter: TableRules,
    /// The nat table: fixed chains plus the per-Service chains that were written.
    pub nat: TableRules,
    /// Every per-Service and per-endpoint nat chain the ruleset uses, whether written in this
    /// render or skipped as unchanged; anything else with a service-chain prefix is stale.
    pub active_nat_chains: ChainSet,
    /// nat rules that would exist in the kernel after applying (written + skipped).
    pub nat_rules_total: usize,
    /// Services rendered (ServicePortNames).
    pub service_ports: usize,
    /// Endpoints in the snapshot.
    pub endpoints: usize,
    /// Whether per-endpoint comments were left out (large cluster mode).
    pub large_cluster: bool,
}

/// What a proxier keeps between renders so that unchanged Services cost little: the chain
/// hashes of every ServicePortName and endpoint (SHA-256 per name is most of a cold render),
/// and, per ServicePortName, which chains its last render used and how many nat rules they
/// hold, so a partial render can skip unchanged Services without categorizing or hashing
/// them again.
///
/// Names are a pure function of the ServicePortName and the endpoint, so they never go
/// stale; the per-Service results are dropped when the render settings or the node's
/// topology (labels, addresses) change.
#[derive(Debug, Default)]
pub struct RenderCache {
    services: HashMap<ServicePortName, CachedService, FastBuild>,
    key: Option<CacheKey>,
    /// Tree layout: the digest of every dispatch chain's rules (`KUBE-SERVICES`,
    /// `KUBE-NODEPORTS` and the `KUBE-SVT-` chains) at the last render, so that a partial
    /// render rewrites only those that changed.
    dispatch: HashMap<String, [u8; 16], FastBuild>,
}

impl RenderCache {
    /// An empty cache (a cold render).
    pub fn new() -> Self {
        Self::default()
    }

    /// ServicePortNames held.
    pub fn len(&self) -> usize {
        self.services.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }
}

/// What the per-Service results depend on besides the Service itself.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CacheKey {
    cfg: RenderConfig,
    family: IpFamily,
    node_name: String,
    node_labels: BTreeMap<String, String>,
    node_ips: Vec<IpAddr>,
}

#[derive(Debug, Default)]
struct CachedService {
    hash: [u8; 16],
    /// Endpoint hashes, in the order of the last render's reachable endpoints.
    seps: Vec<(IpAddr, u16, [u8; 16])>,
    /// Chains of the last render: bit 0 SVC, 1 SVL, 2 EXT, 3 FW; bit 7: `nat_rules` and the
    /// bits are valid (every endpoint in `seps` has a chain).
    flags: u8,
    /// nat rules in this Service's own chains at the last render.
    nat_rules: usize,
}

const USES_SVC: u8 = 1;
const USES_SVL: u8 = 2;
const USES_EXT: u8 = 4;
const USES_FW: u8 = 8;
const VALID: u8 = 0x80;

impl CachedService {
    fn fresh(spn: &ServicePortName) -> Self {
        CachedService {
            hash: service_hash(spn),
            ..CachedService::default()
        }
    }

    /// The endpoint hash of `ep`, from the last render when it had it.
    fn sep_hash(&self, spn: &ServicePortName, ep: &Endpoint, hint: usize) -> [u8; 16] {
        if let Some((ip, port, h)) = self.seps.get(hint)
            && *ip == ep.ip
            && *port == ep.port
        {
            return *h;
        }
        if self.seps.len() <= 32
            && let Some((_, _, h)) = self
                .seps
                .iter()
                .find(|(ip, port, _)| *ip == ep.ip && *port == ep.port)
        {
            return *h;
        }
        endpoint_hash(spn, ep.ip, ep.port)
    }
}

/// Appends `n` in decimal.
fn push_u32(out: &mut String, mut n: u32) {
    let mut buf = [0u8; 10];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for b in &buf[i..] {
        out.push(char::from(*b));
    }
}

fn push_ipv4(out: &mut String, ip: Ipv4Addr) {
    out.reserve(15);
    for (i, o) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        if o >= 100 {
            out.push(char::from(b'0' + o / 100));
            out.push(char::from(b'0' + (o / 10) % 10));
        } else if o >= 10 {
            out.push(char::from(b'0' + o / 10));
        }
        out.push(char::from(b'0' + o % 10));
    }
}

/// Appends `ip` as iptables-save prints an address (`10.0.0.1`, `fd00::1`).
fn push_ip(out: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => push_ipv4(out, v4),
        IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

/// Appends `ip/32` or `ip/128`.
fn push_host(out: &mut String, ip: IpAddr) {
    push_ip(out, ip);
    out.push_str(if ip.is_ipv4() { "/32" } else { "/128" });
}

/// Appends `ip:port` (`[ip]:port` for IPv6), as `Endpoint` prints.
fn push_endpoint(out: &mut String, ep: &Endpoint) {
    match ep.ip {
        IpAddr::V4(v4) => {
            push_ipv4(out, v4);
            out.push(':');
            push_u32(out, u32::from(ep.port));
        }
        IpAddr::V6(_) => {
            out.push('[');
            push_ip(out, ep.ip);
            out.push(']');
            out.push(':');
            push_u32(out, u32::from(ep.port));
        }
    }
}

/// Appends `ns/name[:port]`, as `ServicePortName` prints.
fn push_spn(out: &mut String, spn: &ServicePortName) {
    out.push_str(&spn.service.namespace);
    out.push('/');
    out.push_str(&spn.service.name);
    if !spn.port.is_empty() {
        out.push(':');
        out.push_str(&spn.port);
    }
}

/// A line under construction; writing arguments in canonical order is the caller's job.
struct Line<'a> {
    out: &'a mut TableRules,
}

impl<'a> Line<'a> {
    fn new(out: &'a mut TableRules, chain: &str) -> Self {
        out.rules.push_str("-A ");
        out.rules.push_str(chain);
        Line { out }
    }

    /// ` s` (a literal argument).
    fn s(self, s: &str) -> Self {
        self.out.rules.push(' ');
        self.out.rules.push_str(s);
        self
    }

    fn arg(self, s: impl fmt::Display) -> Self {
        let _ = write!(self.out.rules, " {s}");
        self
    }

    /// ` -d IP/32 -p PROTO` (or without `-d` when `ip` is `None`).
    fn dst_proto(self, ip: Option<IpAddr>, proto: &str) -> Self {
        let r = &mut self.out.rules;
        if let Some(ip) = ip {
            r.push_str(" -d ");
            push_host(r, ip);
        }
        r.push_str(" -p ");
        r.push_str(proto);
        self
    }

    /// ` -m PROTO --dport PORT`.
    fn dport(self, proto: &str, port: u16) -> Self {
        let r = &mut self.out.rules;
        r.push_str(" -m ");
        r.push_str(proto);
        r.push_str(" --dport ");
        push_u32(r, u32::from(port));
        self
    }

    fn comment(self, c: impl fmt::Display) -> Self {
        let _ = write!(self.out.rules, " -m comment --comment \"{c}\"");
        self
    }

    /// ` -m comment --comment "TEXT"` for a plain string.
    fn comment_str(self, c: &str) -> Self {
        let r = &mut self.out.rules;
        r.push_str(" -m comment --comment \"");
        r.push_str(c);
        r.push('"');
        self
    }

    /// ` -m comment --comment "<spn><suffix>"` (`spn` already printed).
    fn comment_spn(self, spn: &str, suffix: &str) -> Self {
        let r = &mut self.out.rules;
        r.push_str(" -m comment --comment \"");
        r.push_str(spn);
        r.push_str(suffix);
        r.push('"');
        self
    }

    /// The per-endpoint comment `"<spn> -> <ep>"`, when comments are on.
    fn ep_comment(self, on: bool, spn: &str, ep: &Endpoint) -> Self {
        if on {
            let r = &mut self.out.rules;
            r.push_str(" -m comment --comment \"");
            r.push_str(spn);
            r.push_str(" -> ");
            push_endpoint(r, ep);
            r.push('"');
        }
        self
    }

    fn end(self, target: impl fmt::Display) {
        let _ = writeln!(self.out.rules, " -j {target}");
        self.out.rule_count += 1;
    }

    /// ` -j TARGET` for a plain string, and the newline.
    fn end_str(self, target: &str) {
        let r = &mut self.out.rules;
        r.push_str(" -j ");
        r.push_str(target);
        r.push('\n');
        self.out.rule_count += 1;
    }
}

/// An address with its host prefix length, as iptables-save prints it.
struct Host(IpAddr);

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(ip) => write!(f, "{ip}/32"),
            IpAddr::V6(ip) => write!(f, "{ip}/128"),
        }
    }
}

/// `-m statistic` probability for picking endpoint `i` of `n` when the earlier ones were not
/// picked: `1/(n-i)`, printed with 10 decimals like upstream.
pub fn probability(n: usize, i: usize) -> String {
    format!("{:.10}", 1.0 / (n - i) as f64)
}

struct Ctx<'a> {
    cfg: &'a RenderConfig,
    family: IpFamily,
    mark: String,
    reject: &'static str,
    loopback: &'static str,
    comments: bool,
    /// Write the counting localhost rule before each NodePort rule (IPv4, localhost
    /// NodePorts, the nfacct counter exists).
    localhost_nfacct: bool,
    /// ` ! -s CIDR` (or empty) and ` ! -i IF` (or empty) of the SVC masquerade rule.
    masq_src: String,
    masq_iface: String,
}

impl Ctx<'_> {
    /// `! -s CIDR` / `-s CIDR` part of a local match (goes before `-d`).
    fn src_part(&self, negate: bool) -> String {
        match &self.cfg.local {
            Some(LocalMatch::Source(net)) => {
                if negate {
                    format!(" ! -s {net}")
                } else {
                    format!(" -s {net}")
                }
            }
            _ => String::new(),
        }
    }

    /// `! -i IF` / `-i IF` part of a local match (goes after `-d`).
    fn iface_part(&self, negate: bool) -> String {
        match &self.cfg.local {
            Some(LocalMatch::Interface(name)) => {
                if negate {
                    format!(" ! -i {name}")
                } else {
                    format!(" -i {name}")
                }
            }
            _ => String::new(),
        }
    }
}

/// Scratch space reused across Services within one render.
#[derive(Default)]
struct Scratch {
    /// `ns/name[:port]` of the Service being written.
    spn: String,
    /// `-m statistic` probabilities per endpoint count (`probs[n][i]`).
    probs: HashMap<usize, Vec<String>, FastBuild>,
    /// Per-endpoint chain names of the Service being written (its reachable endpoints).
    seps: Vec<ChainName>,
    /// The same names as text (buffers reused from Service to Service).
    sep_text: Vec<String>,
    /// Rules of skipped Services rendered only to learn their chains (cold cache).
    discard: TableRules,
}

impl Scratch {
    fn probabilities(&mut self, n: usize) -> &[String] {
        self.probs.entry(n).or_insert_with(|| {
            (0..n.saturating_sub(1))
                .map(|i| probability(n, i))
                .collect()
        })
    }
}

/// Every Service of `snap` with its endpoints, walking the two maps (same key order) side by
/// side instead of looking each Service up in the endpoint map.
fn with_endpoints(
    snap: &Snapshot,
) -> impl Iterator<Item = (&ServicePortName, &ServicePortInfo, &[Endpoint])> {
    let mut eps = snap.endpoints.iter().peekable();
    snap.services.iter().map(move |(spn, svc)| {
        while eps.next_if(|(k, _)| *k < spn).is_some() {}
        let endpoints: &[Endpoint] = match eps.peek() {
            Some((k, e)) if *k == spn => e,
            _ => &[],
        };
        (spn, svc.as_ref(), endpoints)
    })
}

/// Renders `snap`. Per-Service nat chains are written for every Service when `only` is
/// `None` (a full sync), else only for the Services in `only` (a partial sync); the fixed
/// chains and the filter table are always written in full.
pub fn render(
    snap: &Snapshot,
    cfg: &RenderConfig,
    only: Option<&BTreeSet<NamespacedName>>,
) -> Rendered {
    render_cached(snap, cfg, only, &mut RenderCache::new())
}

/// [`render`] with a [`RenderCache`] kept across renders: the output is the same, but chain
/// names come from the cache and, in a partial render, unchanged Services (those not in
/// `only`, which the caller guarantees are as they were at the previous render with this
/// cache) are not categorized or hashed again.
pub fn render_cached(
    snap: &Snapshot,
    cfg: &RenderConfig,
    only: Option<&BTreeSet<NamespacedName>>,
    cache: &mut RenderCache,
) -> Rendered {
    render_impl(snap, cfg, only, cache, None)
}

/// One Service's own nat chains (`KUBE-SVC-`, `KUBE-SVL-`, `KUBE-EXT-`, `KUBE-FW-`,
/// `KUBE-SEP-`), as a streamed render hands them over: a Service's chains are contiguous in
/// the render, and jump only to each other and to `KUBE-MARK-MASQ`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceRules<'a> {
    /// Their declaration lines (`:NAME - [0:0]\n` each), in the render's order.
    pub chains: &'a str,
    /// Their rules (`-A …\n` lines), in payload order.
    pub rules: &'a str,
}

/// What a streamed render does with the per-Service nat chains: hands each Service's to a
/// sink, in payload order, instead of keeping them.
pub enum Stream<'a> {
    /// First pass. The [`Rendered`] returned is complete but for the per-Service rules:
    /// `nat.rules` holds the fixed chains' and the entry rules (which come first in the
    /// payload); the declarations, counts and active chains are all there.
    Measure(&'a mut dyn FnMut(ServiceRules<'_>)),
    /// Second pass. The [`Rendered`] returned is only the filter table and the fixed nat
    /// chains' rules: neither the entry rules (`KUBE-SERVICES`, `KUBE-NODEPORTS`, the
    /// dispatch tree, whose cached digests it leaves alone), nor the per-Service chain lists,
    /// nor the set of active chains are kept (the first pass has them).
    Emit(&'a mut dyn FnMut(ServiceRules<'_>)),
}

/// A full render whose per-Service nat rules (most of a full sync's payload: 30 MB at
/// 10,000 Services × 10 endpoints) are never held whole: each Service's chains go to a sink
/// as soon as they are written. A full sync renders twice with the same inputs and cache:
/// [`Stream::Measure`] to learn everything the payload's head needs (the filter table, the
/// chains to declare, the stale chains, which chains the kernel already holds), then
/// [`Stream::Emit`] while the payload is written into `iptables-restore`'s stdin. Either
/// pass hands over exactly the text of [`render_cached`] with `only = None`: its
/// `nat.rules` is the returned `nat.rules` followed by every Service's `rules`, its
/// declarations the fixed chains' followed by every Service's `chains`.
pub fn render_streamed(
    snap: &Snapshot,
    cfg: &RenderConfig,
    cache: &mut RenderCache,
    stream: Stream<'_>,
) -> Rendered {
    match stream {
        Stream::Measure(sink) => render_impl(snap, cfg, None, cache, Some((sink, true))),
        Stream::Emit(sink) => render_impl(snap, cfg, None, cache, Some((sink, false))),
    }
}

/// Where a streamed render's per-Service chains go, and whether it keeps chain lists and
/// sets.
type Sink<'a> = (&'a mut dyn FnMut(ServiceRules<'_>), bool);

/// The render; with `sink`, the per-Service nat rules go to the sink in pieces instead of
/// into the result.
fn render_impl(
    snap: &Snapshot,
    cfg: &RenderConfig,
    only: Option<&BTreeSet<NamespacedName>>,
    cache: &mut RenderCache,
    mut sink: Option<Sink<'_>>,
) -> Rendered {
    let keep_chains = sink.as_ref().is_none_or(|(_, keep)| *keep);
    // The second pass of a streamed render: only the per-Service chains handed to the sink
    // matter (the caller has the rest from the first pass).
    let emit_only = !keep_chains;
    let key = CacheKey {
        cfg: cfg.clone(),
        family: snap.family,
        node_name: snap.node_name.clone(),
        node_labels: snap.node_labels.clone(),
        node_ips: snap.node_ips.clone(),
    };
    if cache.key.as_ref() != Some(&key) {
        for c in cache.services.values_mut() {
            c.flags = 0;
        }
        cache.dispatch.clear();
        cache.key = Some(key);
    }
    // One walk of the two maps, kept for the render loop below.
    let services: Vec<_> = with_endpoints(snap).collect();
    let total_endpoints: usize = services.iter().map(|(_, _, e)| e.len()).sum();
    let large_cluster = total_endpoints > LARGE_CLUSTER_ENDPOINTS;
    let (masq_src, masq_iface) = match &cfg.local {
        Some(LocalMatch::Source(net)) => (format!(" ! -s {net}"), String::new()),
        Some(LocalMatch::Interface(name)) => (String::new(), format!(" ! -i {name}")),
        None => (String::new(), String::new()),
    };
    let ctx = Ctx {
        cfg,
        family: snap.family,
        mark: format!("{:#x}", cfg.masquerade_mark),
        reject: match snap.family {
            IpFamily::V4 => "REJECT --reject-with icmp-port-unreachable",
            IpFamily::V6 => "REJECT --reject-with icmp6-port-unreachable",
        },
        loopback: match snap.family {
            IpFamily::V4 => "127.0.0.0/8",
            IpFamily::V6 => "::1/128",
        },
        comments: !large_cluster,
        localhost_nfacct: snap.family == IpFamily::V4
            && cfg.localhost_nodeports
            && cfg.nfacct_localhost_nodeports,
        masq_src,
        masq_iface,
    };
    let mut out = Rendered {
        service_ports: snap.services.len(),
        endpoints: total_endpoints,
        large_cluster,
        ..Rendered::default()
    };
    let mut filter = TableRules {
        chains: FILTER_CHAINS.into_iter().collect(),
        ..TableRules::default()
    };
    if cfg.kube_firewall && cfg.localhost_nodeports {
        filter.chains.push(KUBE_FIREWALL);
    }
    // The fixed nat chains are declared first; the per-Service ones follow in `svc_nat`.
    let mut nat = TableRules::default();
    // Size the buffers for what is written (untouched capacity costs no memory).
    let written = match only {
        None => snap.services.len(),
        Some(set) => set.len(),
    };
    // Bytes per endpoint (statistic, masquerade and DNAT lines) and per Service (entry and
    // masquerade rules), measured on typical rulesets, with some slack.
    let per_ep = if ctx.comments { 460 } else { 280 };
    let avg_eps = total_endpoints / snap.services.len().max(1) + 1;
    if !emit_only {
        nat.rules.reserve(snap.services.len() * 240 + 1024);
    }
    // At most four chains per Service (SVC, SVL, EXT, FW) and one per endpoint: room for all
    // of them, since a list that outgrows its room is copied into one twice its size (6 MB
    // instead of 3 for the set at 10,000 Services × 10; room never written costs nothing).
    let max_chains = 4 * snap.services.len() + total_endpoints;
    if keep_chains {
        out.active_nat_chains.reserve(max_chains);
    }
    // Per-Service chains go to a separate buffer so that KUBE-SERVICES lines come first,
    // then the chains in Service order (easier to read, like upstream's output).
    let mut svc_nat = TableRules {
        chains: NAT_CHAINS.into_iter().collect(),
        ..TableRules::default()
    };
    // Room for what is moved in front of these rules: the entry rules here, then the
    // payload's head (chain declarations, filter table) in `reconcile`, so that neither
    // move reallocates (a reallocation copies the 30 MB and touches fresh pages).
    let head_room = snap.services.len() * 240 + 40 * (2 * snap.services.len() + total_endpoints);
    if sink.is_some() {
        // One Service at a time.
        svc_nat.rules.reserve(64 * 1024);
    } else {
        svc_nat
            .rules
            .reserve(written.min(snap.services.len()) * (300 + per_ep * avg_eps) + head_room);
    }
    if !keep_chains {
        out.active_nat_chains.off = true;
    } else if only.is_none() {
        svc_nat.chains.reserve(max_chains);
    }
    let mut scratch = Scratch::default();

    write_fixed_nat(&ctx, &mut nat);
    let fixed_nat_len = nat.rules.len();
    if cfg.kube_firewall && cfg.localhost_nodeports {
        Line::new(&mut filter, KUBE_FIREWALL)
            .arg("! -s 127.0.0.0/8 -d 127.0.0.0/8")
            .comment("block incoming localnet connections")
            .arg("-m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT")
            .end("DROP");
    }

    let mut skipped_rules = 0;
    let cold = cache.services.is_empty();
    cache
        .services
        .reserve(snap.services.len().saturating_sub(cache.services.len()));
    for (spn, svc, endpoints) in services {
        let write = only.is_none_or(|set| set.contains(&spn.service));
        // One look-up per Service when the cache started empty (a cold render), two else.
        let entry = if !cold && cache.services.contains_key(spn) {
            let Some(entry) = cache.services.get_mut(spn) else {
                continue;
            };
            entry
        } else {
            cache
                .services
                .entry(spn.clone())
                .or_insert_with(|| CachedService::fresh(spn))
        };
        if write {
            let mark = svc_nat.chains.declarations().len();
            write_service(
                &ctx,
                snap,
                svc,
                endpoints,
                entry,
                &mut scratch,
                &mut nat,
                &mut filter,
                &mut svc_nat,
                &mut out.active_nat_chains,
            );
            if let Some((sink, keep)) = sink.as_mut() {
                sink(ServiceRules {
                    chains: svc_nat
                        .chains
                        .declarations()
                        .get(mark..)
                        .unwrap_or_default(),
                    rules: &svc_nat.rules,
                });
                svc_nat.rules.clear();
                if !*keep {
                    svc_nat.chains.truncate(mark);
                    // Nor are its entry rules kept (2.4 MB at 10,000 Services).
                    nat.rules.truncate(fixed_nat_len);
                }
            }
        } else {
            skipped_rules += skip_service(
                &ctx,
                snap,
                svc,
                endpoints,
                entry,
                &mut scratch,
                &mut nat,
                &mut filter,
                &mut out.active_nat_chains,
            );
        }
    }
    // Forget Services that are gone.
    match only {
        None => {
            if cache.services.len() > snap.services.len() {
                cache.services.retain(|k, _| snap.services.contains_key(k));
            }
        }
        Some(set) => cache
            .services
            .retain(|k, _| !set.contains(&k.service) || snap.services.contains_key(k)),
    }

    // The NodePort jump must be the last rule of KUBE-SERVICES.
    let np_comment = "kubernetes service nodeports; NOTE: this must be the last rule in this chain";
    match &cfg.nodeport_ips {
        None => {
            let mut l = Line::new(&mut nat, KUBE_SERVICES);
            if !(ctx.family == IpFamily::V4 && cfg.localhost_nodeports) {
                l = l.arg(format_args!("! -d {}", ctx.loopback));
            }
            l.comment(np_comment)
                .arg("-m addrtype --dst-type LOCAL")
                .end(KUBE_NODEPORTS);
        }
        Some(ips) => {
            for ip in ips {
                if ip.is_loopback() && !(ctx.family == IpFamily::V4 && cfg.localhost_nodeports) {
                    continue;
                }
                Line::new(&mut nat, KUBE_SERVICES)
                    .arg(format_args!("-d {}", Host(*ip)))
                    .comment(np_comment)
                    .end(KUBE_NODEPORTS);
            }
        }
    }

    if cfg.drop_invalid {
        let mut l = Line::new(&mut filter, KUBE_FORWARD).arg("-m conntrack --ctstate INVALID");
        if cfg.nfacct_invalid_drop {
            l = l
                .s("-m nfacct --nfacct-name")
                .s(NFACCT_CT_STATE_INVALID_DROPPED);
        }
        l.end("DROP");
    }
    Line::new(&mut filter, KUBE_FORWARD)
        .comment("kubernetes forwarding rules")
        .arg(format_args!("-m mark --mark {m}/{m}", m = ctx.mark))
        .end("ACCEPT");
    Line::new(&mut filter, KUBE_FORWARD)
        .comment("kubernetes forwarding conntrack rule")
        .arg("-m conntrack --ctstate RELATED,ESTABLISHED")
        .end("ACCEPT");

    let mut dispatch_skipped = 0;
    if let Dispatch::Tree { leaf_rules } = cfg.dispatch
        && !emit_only
    {
        let previous = only.map(|_| std::mem::take(&mut cache.dispatch));
        let t = tree_entry_rules(
            &nat.rules,
            leaf_rules,
            previous.as_ref(),
            &mut out.active_nat_chains,
        );
        nat.rules = t.rules;
        nat.rule_count = t.rule_count;
        let mut chains = t.chains;
        chains.extend_from(&svc_nat.chains, NAT_CHAINS.len());
        svc_nat.chains = chains;
        cache.dispatch = t.digests;
        dispatch_skipped = t.skipped_rules;
    }

    nat.chains = std::mem::take(&mut svc_nat.chains);
    // With a sink, the entry rules stay in `nat.rules` (the caller writes them before the
    // Services' chains, which it has had).
    if sink.is_none() {
        // The per-Service chains are most of the text: move the entry rules in front of
        // them within their buffer rather than copying them into a second one.
        let mut rules = std::mem::take(&mut svc_nat.rules);
        rules.insert_str(0, &nat.rules);
        nat.rules = rules;
    }
    nat.rule_count += svc_nat.rule_count;
    out.nat_rules_total = nat.rule_count + skipped_rules + dispatch_skipped;
    out.filter = filter;
    out.nat = nat;
    out
}

/// The entry rules of the tree layout.
struct TreeEntry {
    /// The rules to write: the fixed chains', then every dispatch chain that is written.
    rules: String,
    rule_count: usize,
    /// The fixed and dispatch chains to declare (those written), in order.
    chains: ChainList,
    /// Rules of dispatch chains left as they are (unchanged since the previous render).
    skipped_rules: usize,
    /// Every dispatch chain's digest.
    digests: HashMap<String, [u8; 16], FastBuild>,
}

/// Turns the upstream entry rules of a render (`entry`: `KUBE-SERVICES`, `KUBE-NODEPORTS`
/// and the fixed chains' lines) into the tree layout: the `KUBE-SERVICES` entries go to the
/// leaves of [`tree::build`]. With `previous` (a partial render) a dispatch chain whose rules
/// are those of the previous render is not written; every tree chain goes into `active`.
fn tree_entry_rules(
    entry: &str,
    leaf_rules: usize,
    previous: Option<&HashMap<String, [u8; 16], FastBuild>>,
    active: &mut ChainSet,
) -> TreeEntry {
    let lines = tree::split_entry_rules(entry);
    let built = tree::build(&lines.keys, leaf_rules);
    let mut out = TreeEntry {
        rules: String::with_capacity(entry.len() + built.chains.len() * 96),
        rule_count: 0,
        chains: ChainList::default(),
        skipped_rules: 0,
        digests: HashMap::with_capacity_and_hasher(built.chains.len() + 1, FastBuild::default()),
    };
    for l in &lines.other {
        out.rules.push_str(l);
        out.rule_count += 1;
    }
    let mut texts: Vec<(&str, String, usize)> = Vec::with_capacity(built.chains.len() + 1);
    for (i, chain) in built.chains.iter().enumerate() {
        let mut text = String::new();
        let after: &[&str] = if i == 0 { &lines.services_rest } else { &[] };
        let n = tree::write_chain(chain, &lines.tails, after, &mut text);
        texts.push((&chain.name, text, n));
        if i == 0 {
            texts.push((
                KUBE_NODEPORTS,
                lines.nodeports.concat(),
                lines.nodeports.len(),
            ));
        }
    }
    let mut written = Vec::with_capacity(texts.len());
    for (name, text, n) in &texts {
        let digest = super::names::text_hash(text);
        let write = previous.is_none_or(|p| p.get(*name) != Some(&digest));
        if super::names::is_tree_chain(name) {
            active.insert(name);
        }
        out.digests.insert((*name).to_string(), digest);
        written.push(write);
        if !write {
            out.skipped_rules += n;
        }
    }
    // Declarations: the fixed chains in upstream's order, then the tree's.
    for (i, (name, _, _)) in texts.iter().enumerate().take(2) {
        if written[i] {
            out.chains.push(name);
        }
    }
    out.chains.push(KUBE_POSTROUTING);
    out.chains.push(KUBE_MARK_MASQ);
    for (i, (name, text, n)) in texts.iter().enumerate() {
        if written[i] {
            if i >= 2 {
                out.chains.push(name);
            }
            out.rules.push_str(text);
            out.rule_count += n;
        }
    }
    out
}

fn write_fixed_nat(ctx: &Ctx<'_>, nat: &mut TableRules) {
    let m = &ctx.mark;
    Line::new(nat, KUBE_POSTROUTING)
        .arg(format_args!("-m mark ! --mark {m}/{m}"))
        .end("RETURN");
    Line::new(nat, KUBE_POSTROUTING).end(format_args!("MARK --set-xmark {m}/0x0"));
    Line::new(nat, KUBE_POSTROUTING)
        .comment("kubernetes service traffic requiring SNAT")
        .end(if ctx.cfg.random_fully {
            "MASQUERADE --random-fully"
        } else {
            "MASQUERADE"
        });
    Line::new(nat, KUBE_MARK_MASQ).end(format_args!("MARK --set-xmark {m}/{m}"));
}

/// A Service skipped by a partial render: its KUBE-SERVICES, KUBE-NODEPORTS and filter rules
/// are still written; its own chains are only counted (from the cache when it knows them,
/// else by rendering them into a discarded buffer). Returns the nat rules its chains hold.
#[allow(clippy::too_many_arguments)]
fn skip_service(
    ctx: &Ctx<'_>,
    snap: &Snapshot,
    svc: &ServicePortInfo,
    endpoints: &[Endpoint],
    entry: &mut CachedService,
    scratch: &mut Scratch,
    nat: &mut TableRules,
    filter: &mut TableRules,
    active: &mut ChainSet,
) -> usize {
    if entry.flags & VALID == 0 {
        let mut discard = std::mem::take(&mut scratch.discard);
        discard.rules.clear();
        discard.chains.clear();
        discard.rule_count = 0;
        write_service(
            ctx,
            snap,
            svc,
            endpoints,
            entry,
            scratch,
            nat,
            filter,
            &mut discard,
            active,
        );
        let n = discard.rule_count;
        scratch.discard = discard;
        return n;
    }
    // The entry-point rules depend on the endpoints only through "has any" / "has local";
    // the cached chain bits tell which chains exist, and we re-derive the rest.
    write_service_entry_rules(ctx, snap, svc, endpoints, entry, scratch, nat, filter);
    let names = ServiceNames::from_hash(&entry.hash);
    for (bit, name) in [
        (USES_EXT, names.ext),
        (USES_FW, names.fw),
        (USES_SVC, names.svc),
        (USES_SVL, names.svl),
    ] {
        if entry.flags & bit != 0 {
            active.insert_name(name);
        }
    }
    for (_, _, h) in &entry.seps {
        active.insert_name(ChainName::new("KUBE-SEP-", h));
    }
    entry.nat_rules
}

/// The rules of a Service outside its own chains (KUBE-SERVICES, KUBE-NODEPORTS, filter),
/// for a skipped Service whose chains are cached. Needs the categorization, which is cheap
/// next to hashing; `write_service` writes the same lines for a written Service.
#[allow(clippy::too_many_arguments)]
fn write_service_entry_rules(
    ctx: &Ctx<'_>,
    snap: &Snapshot,
    svc: &ServicePortInfo,
    endpoints: &[Endpoint],
    entry: &CachedService,
    scratch: &mut Scratch,
    nat: &mut TableRules,
    filter: &mut TableRules,
) {
    let eps = categorize(svc, endpoints, &snap.node_name, &snap.node_labels);
    let names = ServiceNames::from_hash(&entry.hash);
    let facts = ServiceFacts::new(svc, eps.has_any, !eps.local.is_empty());
    scratch.spn.clear();
    push_spn(&mut scratch.spn, &svc.name);
    write_entry_rules(ctx, svc, &names, &facts, &scratch.spn, nat, filter);
}

/// What decides a Service's entry rules and chains, from its categorized endpoints.
struct ServiceFacts {
    has_any: bool,
    has_internal: bool,
    has_external: bool,
    internal_svl: bool,
    external_svl: bool,
    uses_ext_chain: bool,
    uses_fw_chain: bool,
}

impl ServiceFacts {
    fn new(svc: &ServicePortInfo, has_any: bool, has_local: bool) -> Self {
        let mut has_internal = has_any;
        if svc.internal_policy_local {
            has_internal &= has_local;
        }
        let mut has_external = has_any;
        if svc.external_policy_local {
            has_external &= has_local;
        }
        ServiceFacts {
            has_any,
            has_internal,
            has_external,
            internal_svl: svc.internal_policy_local,
            external_svl: svc.external_policy_local,
            uses_ext_chain: has_any && svc.externally_accessible(),
            uses_fw_chain: has_any
                && !svc.load_balancer_vips.is_empty()
                && !svc.load_balancer_source_ranges.is_empty(),
        }
    }

    /// Where ClusterIP traffic goes: `KUBE-SVL-` with internalTrafficPolicy Local, else
    /// `KUBE-SVC-`.
    fn internal_chain<'a>(&self, names: &'a ServiceNames) -> &'a ChainName {
        if self.internal_svl {
            &names.svl
        } else {
            &names.svc
        }
    }

    /// Where `KUBE-EXT-` sends external traffic: `KUBE-SVL-` with externalTrafficPolicy
    /// Local, else `KUBE-SVC-`.
    fn external_policy_chain<'a>(&self, names: &'a ServiceNames) -> &'a ChainName {
        if self.external_svl {
            &names.svl
        } else {
            &names.svc
        }
    }
}

/// KUBE-SERVICES, KUBE-NODEPORTS and filter-table rules of one Service.
fn write_entry_rules(
    ctx: &Ctx<'_>,
    svc: &ServicePortInfo,
    names: &ServiceNames,
    f: &ServiceFacts,
    spn: &str,
    nat: &mut TableRules,
    filter: &mut TableRules,
) {
    let proto = svc.name.protocol.as_lower();
    let internal_chain = f.internal_chain(names);
    let lb_chain = if f.uses_fw_chain {
        &names.fw
    } else {
        &names.ext
    };
    // What filter rules say when traffic has nowhere to go.
    let (internal_filter, external_filter, filter_suffix) = if !f.has_any {
        (ctx.reject, ctx.reject, " has no endpoints")
    } else {
        ("DROP", "DROP", " has no local endpoints")
    };

    // ClusterIP.
    if f.has_internal {
        Line::new(nat, KUBE_SERVICES)
            .dst_proto(Some(svc.cluster_ip), proto)
            .comment_spn(spn, " cluster IP")
            .dport(proto, svc.port)
            .end_str(internal_chain);
    } else {
        Line::new(filter, KUBE_SERVICES)
            .dst_proto(Some(svc.cluster_ip), proto)
            .comment_spn(spn, filter_suffix)
            .dport(proto, svc.port)
            .end_str(internal_filter);
    }

    // External IPs.
    for ip in &svc.external_ips {
        if f.has_any {
            Line::new(nat, KUBE_SERVICES)
                .dst_proto(Some(*ip), proto)
                .comment_spn(spn, " external IP")
                .dport(proto, svc.port)
                .end_str(&names.ext);
        }
        if !f.has_external {
            Line::new(filter, KUBE_EXTERNAL_SERVICES)
                .dst_proto(Some(*ip), proto)
                .comment_spn(spn, filter_suffix)
                .dport(proto, svc.port)
                .end_str(external_filter);
        }
    }

    // Load-balancer IPs.
    for ip in &svc.load_balancer_vips {
        if f.has_any {
            Line::new(nat, KUBE_SERVICES)
                .dst_proto(Some(*ip), proto)
                .comment_spn(spn, " loadbalancer IP")
                .dport(proto, svc.port)
                .end_str(lb_chain);
        }
        if f.uses_fw_chain {
            Line::new(filter, KUBE_PROXY_FIREWALL)
                .dst_proto(Some(*ip), proto)
                .comment(format_args!("{spn} traffic not accepted by {}", names.fw))
                .dport(proto, svc.port)
                .end_str("DROP");
        }
    }
    if !f.has_external {
        for ip in &svc.load_balancer_vips {
            Line::new(filter, KUBE_EXTERNAL_SERVICES)
                .dst_proto(Some(*ip), proto)
                .comment_spn(spn, filter_suffix)
                .dport(proto, svc.port)
                .end_str(external_filter);
        }
    }

    // NodePort.
    if let Some(node_port) = svc.node_port {
        if f.has_any {
            if ctx.localhost_nfacct {
                // Counts the packets that reach the NodePort on 127.0.0.0/8 (upstream writes
                // this rule only when the counter exists; it jumps where the next one does).
                let l = Line::new(nat, KUBE_NODEPORTS);
                l.out.rules.push_str(" -d 127.0.0.0/8 -p ");
                l.out.rules.push_str(proto);
                l.comment_str(spn)
                    .dport(proto, node_port)
                    .s("-m nfacct --nfacct-name")
                    .s(NFACCT_LOCALHOST_NODEPORTS_ACCEPTED)
                    .end_str(&names.ext);
            }
            Line::new(nat, KUBE_NODEPORTS)
                .dst_proto(None, proto)
                .comment_str(spn)
                .dport(proto, node_port)
                .end_str(&names.ext);
        }
        if !f.has_external {
            Line::new(filter, KUBE_EXTERNAL_SERVICES)
                .dst_proto(None, proto)
                .comment_spn(spn, filter_suffix)
                .s("-m addrtype --dst-type LOCAL")
                .dport(proto, node_port)
                .end_str(external_filter);
        }
    }

    // Health check NodePort.
    if let Some(hc) = svc.health_check_node_port {
        Line::new(filter, KUBE_NODEPORTS)
            .s("-p tcp")
            .comment_spn(spn, " health check node port")
            .dport("tcp", hc)
            .end_str("ACCEPT");
    }
}

#[allow(clippy::too_many_arguments)]
fn write_service(
    ctx: &Ctx<'_>,
    snap: &Snapshot,
    svc: &ServicePortInfo,
    endpoints: &[Endpoint],
    entry: &mut CachedService,
    scratch: &mut Scratch,
    nat: &mut TableRules,
    filter: &mut TableRules,
    chains_out: &mut TableRules,
    active: &mut ChainSet,
) {
    let spn = &svc.name;
    let proto = spn.protocol.as_lower();
    let names = ServiceNames::from_hash(&entry.hash);
    let eps = categorize(svc, endpoints, &snap.node_name, &snap.node_labels);
    let f = ServiceFacts::new(svc, eps.has_any, !eps.local.is_empty());
    let uses_cluster_chain = !eps.cluster.is_empty() && svc.uses_cluster_endpoints();
    let uses_local_chain = !eps.local.is_empty() && svc.uses_local_endpoints();
    let internal_chain = f.internal_chain(&names);
    let external_policy_chain = f.external_policy_chain(&names);

    let mut spn_text = std::mem::take(&mut scratch.spn);
    spn_text.clear();
    push_spn(&mut spn_text, spn);
    let spn_s = spn_text.as_str();
    write_entry_rules(ctx, svc, &names, &f, spn_s, nat, filter);

    // From here on: per-Service chains (skippable in partial syncs).
    let nat = chains_out;
    let rules_before = nat.rule_count;
    let mut flags = VALID;
    if f.has_internal {
        if ctx.cfg.masquerade_all {
            Line::new(nat, internal_chain)
                .dst_proto(Some(svc.cluster_ip), proto)
                .comment_spn(spn_s, " cluster IP")
                .dport(proto, svc.port)
                .end_str(KUBE_MARK_MASQ);
        } else if ctx.cfg.local.is_some() {
            let r = &mut nat.rules;
            r.push_str("-A ");
            r.push_str(internal_chain);
            r.push_str(&ctx.masq_src);
            r.push_str(" -d ");
            push_host(r, svc.cluster_ip);
            r.push_str(&ctx.masq_iface);
            r.push_str(" -p ");
            r.push_str(proto);
            Line { out: nat }
                .comment_spn(spn_s, " cluster IP")
                .dport(proto, svc.port)
                .end_str(KUBE_MARK_MASQ);
        }
    }

    if f.uses_ext_chain {
        flags |= USES_EXT;
        nat.chains.push(&names.ext);
        active.insert_name(names.ext);
        if !svc.external_policy_local {
            Line::new(nat, &names.ext)
                .comment(format_args!(
                    "masquerade traffic for {spn_s} external destinations"
                ))
                .end_str(KUBE_MARK_MASQ);
        } else {
            if ctx.cfg.local.is_some() {
                let _ = write!(
                    nat.rules,
                    "-A {}{}{}",
                    names.ext,
                    ctx.src_part(false),
                    ctx.iface_part(false)
                );
                Line { out: nat }
                    .comment(format_args!(
                        "pod traffic for {spn_s} external destinations"
                    ))
                    .end_str(&names.svc);
            }
            Line::new(nat, &names.ext)
                .comment(format_args!(
                    "masquerade LOCAL traffic for {spn_s} external destinations"
                ))
                .s("-m addrtype --src-type LOCAL")
                .end_str(KUBE_MARK_MASQ);
            Line::new(nat, &names.ext)
                .comment(format_args!(
                    "route LOCAL traffic for {spn_s} external destinations"
                ))
                .s("-m addrtype --src-type LOCAL")
                .end_str(&names.svc);
        }
        if f.has_external {
            Line::new(nat, &names.ext).end_str(external_policy_chain);
        }
    }

    if f.uses_fw_chain {
        flags |= USES_FW;
        nat.chains.push(&names.fw);
        active.insert_name(names.fw);
        let comment = format!("{spn_s} loadbalancer IP");
        let mut allow_from_node = false;
        for range in &svc.load_balancer_source_ranges {
            Line::new(nat, &names.fw)
                .arg(format_args!("-s {range}"))
                .comment_str(&comment)
                .end_str(&names.ext);
            allow_from_node |= snap.node_ips.iter().any(|ip| range.contains(ip));
        }
        if allow_from_node {
            for ip in &svc.load_balancer_vips {
                Line::new(nat, &names.fw)
                    .arg(format_args!("-s {}", Host(*ip)))
                    .comment_str(&comment)
                    .end_str(&names.ext);
            }
        }
        // The last rule only counts: it has no target, so nothing happens and the packet
        // falls through to the KUBE-PROXY-FIREWALL drop.
        let _ = writeln!(
            nat.rules,
            "-A {} -m comment --comment \"other traffic to {spn_s} will be dropped by KUBE-PROXY-FIREWALL\"",
            names.fw
        );
        nat.rule_count += 1;
    }

    let affinity = match svc.session_affinity {
        SessionAffinity::ClientIp { timeout_seconds } => Some(timeout_seconds),
        SessionAffinity::None => None,
    };
    // Endpoint chain names, once per reachable endpoint (from the cache when it has them);
    // `cluster` and `local` are subsequences of `all_reachable` in the same order, so a
    // cursor finds each endpoint's name.
    let mut new_seps = Vec::with_capacity(eps.all_reachable.len());
    scratch.seps.clear();
    let mut texts = std::mem::take(&mut scratch.sep_text);
    if texts.len() < eps.all_reachable.len() {
        texts.resize_with(eps.all_reachable.len(), || String::with_capacity(28));
    }
    for (i, ep) in eps.all_reachable.iter().enumerate() {
        let h = entry.sep_hash(spn, ep, i);
        new_seps.push((ep.ip, ep.port, h));
        let name = ChainName::new("KUBE-SEP-", &h);
        scratch.seps.push(name);
        if let Some(t) = texts.get_mut(i) {
            t.clear();
            t.push_str(name.as_str());
        }
    }
    entry.seps = new_seps;
    let seps = std::mem::take(&mut scratch.seps);
    let missing = String::new();
    let sep_of = |cursor: &mut usize, ep: &Endpoint| -> &str {
        while let Some(e) = eps.all_reachable.get(*cursor) {
            *cursor += 1;
            if std::ptr::eq(*e, ep) {
                return texts.get(*cursor - 1).map_or("", String::as_str);
            }
        }
        missing.as_str()
    };

    for (used, bit, chain, list) in [
        (uses_cluster_chain, USES_SVC, &names.svc, &eps.cluster),
        (uses_local_chain, USES_SVL, &names.svl, &eps.local),
    ] {
        if !used {
            continue;
        }
        flags |= bit;
        active.insert_name(*chain);
        // As text once: a `ChainName` checks its bytes each time it is read as `&str`.
        let chain = chain.as_str();
        nat.chains.push(chain);
        if let Some(timeout) = affinity {
            let mut cursor = 0;
            for ep in list.iter() {
                let sep = sep_of(&mut cursor, ep);
                Line::new(nat, chain)
                    .ep_comment(ctx.comments, spn_s, ep)
                    .arg(format_args!(
                        "-m recent --rcheck --seconds {timeout} --reap --name {sep} --mask {} --rsource",
                        mask(ctx.family)
                    ))
                    .end_str(sep);
            }
        }
        let n = list.len();
        let probs = scratch.probabilities(n);
        let mut cursor = 0;
        if !ctx.comments {
            // The common large-cluster line, in as few pieces as possible.
            for (i, ep) in list.iter().enumerate() {
                let sep = sep_of(&mut cursor, ep);
                let r = &mut nat.rules;
                r.push_str("-A ");
                r.push_str(chain);
                if let Some(p) = probs.get(i) {
                    r.push_str(" -m statistic --mode random --probability ");
                    r.push_str(p);
                }
                r.push_str(" -j ");
                r.push_str(sep);
                r.push('\n');
                nat.rule_count += 1;
            }
            continue;
        }
        for (i, ep) in list.iter().enumerate() {
            let sep = sep_of(&mut cursor, ep);
            let mut l = Line::new(nat, chain).ep_comment(ctx.comments, spn_s, ep);
            if let Some(p) = probs.get(i) {
                l = l.s("-m statistic --mode random --probability").s(p);
            }
            l.end_str(sep);
        }
    }

    // `-p PROTO -m PROTO -j DNAT --to-destination ` in one piece.
    let dnat_mid = match spn.protocol {
        kp_model::Protocol::Tcp => " -p tcp -m tcp -j DNAT --to-destination ",
        kp_model::Protocol::Udp => " -p udp -m udp -j DNAT --to-destination ",
        kp_model::Protocol::Sctp => " -p sctp -m sctp -j DNAT --to-destination ",
    };
    for ((ep, name), sep) in eps.all_reachable.iter().zip(seps.iter()).zip(texts.iter()) {
        nat.chains.push(sep);
        active.insert_name(*name);
        if !ctx.comments && affinity.is_none() {
            let r = &mut nat.rules;
            r.push_str("-A ");
            r.push_str(sep);
            r.push_str(" -s ");
            push_host(r, ep.ip);
            r.push_str(" -j KUBE-MARK-MASQ\n-A ");
            r.push_str(sep);
            r.push_str(dnat_mid);
            push_endpoint(r, ep);
            r.push('\n');
            nat.rule_count += 2;
            continue;
        }
        let mut l = Line::new(nat, sep);
        l.out.rules.push_str(" -s ");
        push_host(&mut l.out.rules, ep.ip);
        if ctx.comments {
            l = l.comment_str(spn_s);
        }
        l.end_str(KUBE_MARK_MASQ);
        let mut l = Line::new(nat, sep).s("-p").s(proto);
        if ctx.comments {
            l = l.comment_str(spn_s);
        }
        if affinity.is_some() {
            l = l.arg(format_args!(
                "-m recent --set --name {sep} --mask {} --rsource",
                mask(ctx.family)
            ));
        }
        let l = l.s("-m").s(proto);
        let r = &mut l.out.rules;
        r.push_str(" -j DNAT --to-destination ");
        push_endpoint(r, ep);
        r.push('\n');
        l.out.rule_count += 1;
    }
    scratch.seps = seps;
    scratch.sep_text = texts;
    scratch.spn = spn_text;
    entry.flags = flags;
    entry.nat_rules = nat.rule_count - rules_before;
}

fn mask(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "255.255.255.255",
        IpFamily::V6 => "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    }
}

#[cfg(test)]
mod tests;
