//! Chain names of iptables mode, with upstream kube-proxy's hash scheme.
//!
//! Per-Service chains are `KUBE-SVC-`, `KUBE-SVL-`, `KUBE-EXT-`, `KUBE-FW-` followed by the
//! first 16 characters of `base32(sha256(<ServicePortName> + <protocol>))`; endpoint chains
//! are `KUBE-SEP-` followed by `base32(sha256(<ServicePortName> + <protocol> + <ip:port>))`
//! truncated the same way. The ServicePortName is printed `ns/name[:port]` and the protocol
//! lower-cased, so the names equal those upstream kube-proxy creates for the same Service.

use std::fmt::Write as _;
use std::net::IpAddr;

use kp_model::{Endpoint, ServicePortName};
use sha2::{Digest, Sha256};

/// nat: entry chain for Service VIPs, jumped to from PREROUTING and OUTPUT.
pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
/// nat and filter: NodePort entry chain.
pub const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
/// nat: masquerades marked packets, jumped to from POSTROUTING.
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
/// nat: sets the masquerade mark.
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
/// filter: rejects for external destinations without endpoints.
pub const KUBE_EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
/// filter: forwarding accepts and the INVALID drop.
pub const KUBE_FORWARD: &str = "KUBE-FORWARD";
/// filter: loadBalancerSourceRanges drops.
pub const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
/// filter: the localnet drop that guards localhost NodePorts (a copy of kubelet's chain).
pub const KUBE_FIREWALL: &str = "KUBE-FIREWALL";
/// mangle, nat and filter: an empty chain whose disappearance means someone flushed the
/// table (see [`super::canary`]).
pub const KUBE_PROXY_CANARY: &str = "KUBE-PROXY-CANARY";

/// Prefixes of per-Service and per-endpoint nat chains; a chain with one of these prefixes that
/// is not in the desired ruleset is stale and gets deleted.
pub const SERVICE_CHAIN_PREFIXES: [&str; 5] = [
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-EXT-",
    "KUBE-FW-",
    "KUBE-SEP-",
];

/// Whether `chain` is a per-Service or per-endpoint chain of ours.
pub fn is_service_chain(chain: &str) -> bool {
    SERVICE_CHAIN_PREFIXES.iter().any(|p| chain.starts_with(p))
}

/// The base32 alphabet (RFC 4648) upstream's hash scheme spells names in.
const BASE32_ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// The first 16 base32 characters of a finished SHA-256: 10 bytes are exactly 80 bits,
/// which base32 spells in 16 characters without padding.
fn base32_16(digest: &[u8]) -> [u8; 16] {
    let mut v: u128 = 0;
    for b in digest.iter().take(10) {
        v = (v << 8) | u128::from(*b);
    }
    let mut out = [b'A'; 16];
    for (i, c) in out.iter_mut().enumerate() {
        let idx = ((v >> (75 - 5 * i)) & 31) as usize;
        *c = BASE32_ALPHABET[idx];
    }
    out
}

/// The 16-character base32 SHA-256 of `text` (the dispatch tree's IPv6 chain names).
pub(crate) fn text_hash(text: &str) -> [u8; 16] {
    base32_16(&Sha256::digest(text.as_bytes()))
}

/// Prefix of the dispatch tree's chains (`--iptables-dispatch tree`; see
/// [`super::tree`]). Not a per-Service prefix: tree chains are written with
/// `KUBE-SERVICES`.
pub const TREE_CHAIN_PREFIX: &str = "KUBE-SVT-";

/// Whether `chain` is a chain of the dispatch tree.
pub fn is_tree_chain(chain: &str) -> bool {
    chain.starts_with(TREE_CHAIN_PREFIX)
}

/// Whether `chain` is a nat chain of ours whose name is made per sync: a per-Service or
/// per-endpoint chain, or a dispatch tree chain. A full sync deletes those it no longer uses,
/// and `--cleanup` deletes them all.
pub fn is_dynamic_chain(chain: &str) -> bool {
    is_service_chain(chain) || is_tree_chain(chain)
}

/// Feeds `ns/name[:port]` and the lower-case protocol into `h` (upstream hashes
/// `ServicePortName.String() + protocol`).
fn hash_service_port(h: &mut Sha256, spn: &ServicePortName) {
    h.update(spn.service.namespace.as_bytes());
    h.update(b"/");
    h.update(spn.service.name.as_bytes());
    if !spn.port.is_empty() {
        h.update(b":");
        h.update(spn.port.as_bytes());
    }
    h.update(spn.protocol.as_lower().as_bytes());
}

/// The 16-character hash of `spn` shared by its `KUBE-SVC-`, `KUBE-SVL-`, `KUBE-EXT-` and
/// `KUBE-FW-` chains.
pub fn service_hash(spn: &ServicePortName) -> [u8; 16] {
    let mut h = Sha256::new();
    hash_service_port(&mut h, spn);
    base32_16(&h.finalize())
}

/// The 16-character hash of endpoint `ip:port` of `spn` (its `KUBE-SEP-` chain).
pub fn endpoint_hash(spn: &ServicePortName, ip: IpAddr, port: u16) -> [u8; 16] {
    let mut h = Sha256::new();
    hash_service_port(&mut h, spn);
    match ip {
        IpAddr::V4(v4) => {
            let mut buf = [0u8; 21];
            let n = write_ipv4_port(&mut buf, v4.octets(), port);
            h.update(&buf[..n]);
        }
        IpAddr::V6(v6) => {
            let mut text = String::with_capacity(48);
            let _ = write!(text, "[{v6}]:{port}");
            h.update(text.as_bytes());
        }
    }
    base32_16(&h.finalize())
}

/// Writes `a.b.c.d` into `buf` (at least 15 bytes) and returns its length.
pub(crate) fn write_ipv4(buf: &mut [u8], octets: [u8; 4]) -> usize {
    let mut n = 0;
    let mut put = |b: u8| {
        if let Some(slot) = buf.get_mut(n) {
            *slot = b;
        }
        n += 1;
    };
    for (i, o) in octets.into_iter().enumerate() {
        if i > 0 {
            put(b'.');
        }
        if o >= 100 {
            put(b'0' + o / 100);
            put(b'0' + (o / 10) % 10);
        } else if o >= 10 {
            put(b'0' + o / 10);
        }
        put(b'0' + o % 10);
    }
    n
}

/// Writes `a.b.c.d:port` into `buf` (at least 21 bytes) and returns its length.
pub(crate) fn write_ipv4_port(buf: &mut [u8; 21], octets: [u8; 4], port: u16) -> usize {
    let mut n = write_ipv4(&mut buf[..], octets);
    buf[n] = b':';
    n += 1;
    n + write_u16(&mut buf[n..], port)
}

/// Writes `v` in decimal at the start of `buf` (at least 5 bytes) and returns its length.
pub(crate) fn write_u16(buf: &mut [u8], v: u16) -> usize {
    let len = match v {
        0..=9 => 1,
        10..=99 => 2,
        100..=999 => 3,
        1000..=9999 => 4,
        _ => 5,
    };
    let mut v = v;
    // Byte by byte: a variable-length slice copy would be a libc call per number.
    for i in (0..len).rev() {
        if let Some(b) = buf.get_mut(i) {
            *b = b'0' + (v % 10) as u8;
        }
        v /= 10;
    }
    len
}

/// A chain name held inline (no allocation): a prefix such as `KUBE-SEP-` and a 16-character
/// hash. Iptables limits chain names to 28 characters, which every name here fits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ChainName {
    len: u8,
    /// The name, then zeros.
    buf: [u8; 28],
}

impl std::hash::Hash for ChainName {
    /// Hashes two words: bytes 5..13 (the end of the prefix, `SVC-` or `SEP-`, and the start
    /// of the hash) and the last 8 bytes (the end of the hash). Equal names hash equally, and
    /// names of ours, random in their hash part, spread well; cheaper than all 28 bytes.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let word = |at: usize| {
            let mut w = [0u8; 8];
            if let Some(src) = self.buf.get(at..at + 8) {
                w.copy_from_slice(src);
            }
            u64::from_le_bytes(w)
        };
        let end = usize::from(self.len).clamp(8, 28);
        state.write_u64(word(5) ^ u64::from(self.len).rotate_right(8));
        state.write_u64(word(end - 8));
    }
}

impl ChainName {
    /// `prefix` followed by `hash` (truncated at 28 bytes, which no name of ours reaches).
    pub fn new(prefix: &str, hash: &[u8; 16]) -> Self {
        let mut buf = [0u8; 28];
        let p = prefix.as_bytes();
        let pl = p.len().min(28);
        buf[..pl].copy_from_slice(&p[..pl]);
        let hl = hash.len().min(28 - pl);
        buf[pl..pl + hl].copy_from_slice(&hash[..hl]);
        ChainName {
            len: (pl + hl) as u8,
            buf,
        }
    }

    /// A name given as text (cut at 28 bytes, the iptables limit, on a character boundary).
    pub fn from_text(text: &str) -> Self {
        let mut end = text.len().min(28);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let mut buf = [0u8; 28];
        buf[..end].copy_from_slice(&text.as_bytes()[..end]);
        ChainName {
            len: end as u8,
            buf,
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl std::ops::Deref for ChainName {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl std::fmt::Display for ChainName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for ChainName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// The per-Service chain names of one ServicePortName.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceChains {
    /// `KUBE-SVC-…`: Cluster-policy endpoints.
    pub svc: String,
    /// `KUBE-SVL-…`: Local-policy endpoints.
    pub svl: String,
    /// `KUBE-EXT-…`: external destinations (NodePort, externalIPs, LB IPs).
    pub ext: String,
    /// `KUBE-FW-…`: loadBalancerSourceRanges.
    pub fw: String,
}

impl ServiceChains {
    /// Names for `spn` (hashing `spn` and its lower-case protocol).
    pub fn new(spn: &ServicePortName) -> Self {
        let n = ServiceNames::from_hash(&service_hash(spn));
        ServiceChains {
            svc: n.svc.to_string(),
            svl: n.svl.to_string(),
            ext: n.ext.to_string(),
            fw: n.fw.to_string(),
        }
    }
}

/// [`ServiceChains`] held inline ([`ChainName`]s), as the renderer uses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceNames {
    /// `KUBE-SVC-…`.
    pub svc: ChainName,
    /// `KUBE-SVL-…`.
    pub svl: ChainName,
    /// `KUBE-EXT-…`.
    pub ext: ChainName,
    /// `KUBE-FW-…`.
    pub fw: ChainName,
}

impl ServiceNames {
    /// The four names sharing `hash` (see [`service_hash`]).
    pub fn from_hash(hash: &[u8; 16]) -> Self {
        ServiceNames {
            svc: ChainName::new("KUBE-SVC-", hash),
            svl: ChainName::new("KUBE-SVL-", hash),
            ext: ChainName::new("KUBE-EXT-", hash),
            fw: ChainName::new("KUBE-FW-", hash),
        }
    }
}

/// `KUBE-SEP-…` for endpoint `ep` of `spn`.
pub fn endpoint_chain(spn: &ServicePortName, ep: &Endpoint) -> String {
    ChainName::new("KUBE-SEP-", &endpoint_hash(spn, ep.ip, ep.port)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kp_model::{NamespacedName, Protocol};

    fn ep(ip: &str, port: u16) -> Endpoint {
        Endpoint {
            ip: ip.parse().unwrap(),
            port,
            is_local: false,
            ready: true,
            serving: true,
            terminating: false,
            topology: None,
        }
    }

    #[test]
    fn seed_names_match_upstream() {
        // Names printed by upstream kube-proxy for the seed cluster (seed 003).
        let spn = ServicePortName::new(
            NamespacedName::new("default", "nginx-svc"),
            "",
            Protocol::Tcp,
        );
        assert_eq!(ServiceChains::new(&spn).svc, "KUBE-SVC-HL5LMXD5JFHQZ6LN");
        assert_eq!(
            endpoint_chain(&spn, &ep("10.0.0.4", 80)),
            "KUBE-SEP-GS5MQAG4332XHLUZ"
        );
        assert_eq!(
            endpoint_chain(&spn, &ep("10.0.1.2", 80)),
            "KUBE-SEP-H5CTQI4CMO4ES5BQ"
        );
    }

    #[test]
    fn base32_matches_the_reference_encoder() {
        for seed in 0u8..64 {
            let digest: Vec<u8> = (0..32u8)
                .map(|i| i.wrapping_mul(37).wrapping_add(seed.wrapping_mul(11)))
                .collect();
            let expected = data_encoding::BASE32.encode(&digest[..10]);
            assert_eq!(std::str::from_utf8(&base32_16(&digest)).unwrap(), expected);
        }
        let spn = ServicePortName::new(NamespacedName::new("a", "b"), "p", Protocol::Udp);
        let sep = endpoint_chain(&spn, &ep("fd00::1", 53));
        let mut h = Sha256::new();
        h.update(b"a/b:pudp[fd00::1]:53");
        let expected = format!(
            "KUBE-SEP-{}",
            &data_encoding::BASE32.encode(&h.finalize()[..10])
        );
        assert_eq!(sep, expected);
    }

    #[test]
    fn names_fit_iptables_limit() {
        let spn = ServicePortName::new(NamespacedName::new("a", "b"), "http", Protocol::Sctp);
        let c = ServiceChains::new(&spn);
        for n in [&c.svc, &c.svl, &c.ext, &c.fw] {
            assert!(n.len() <= 28, "{n}");
            assert!(is_service_chain(n));
        }
        assert!(!is_service_chain(KUBE_SERVICES));
        let v6 = endpoint_chain(&spn, &ep("fd00::1", 8080));
        assert_eq!(v6.len(), 25);
    }
}
