//! Set descriptions ([`SetSpec`], [`SetKind`], [`SetFamily`], [`SetState`]), the entry
//! syntax of the set types kube-proxy's IPVS mode uses ([`canonical_entry`]), and the
//! `ipset save` parser and printer ([`parse_save`], [`render_save`]).
//!
//! The canonical entry forms were measured against ipset v7.17 on Linux 6.x (see
//! `tests/ipset_kernel.rs`): `ipset save` prints protocol names (`6:80` and a bare `80`
//! come back as `tcp:80`, `17` as `udp`, `132` as `sctp`, `136` as `udplite`), IPv6
//! addresses compressed (`2001:0db8::0001` → `2001:db8::1`), networks with their host bits
//! cleared (`10.1.2.3/16` → `10.1.0.0/16`) and host networks without a prefix
//! (`10.0.0.1/32` → `10.0.0.1`, `fd00::1/128` → `fd00::1`), and bitmap ports as bare
//! numbers (`tcp:80` → `80`).

use std::collections::BTreeSet;
use std::fmt::{self, Write as _};
use std::net::IpAddr;

use crate::error::ParseError;

/// The longest set name ipset accepts (`IPSET_MAXNAMELEN` minus the NUL).
pub const MAX_SET_NAME: usize = 31;

/// The set types kube-proxy's IPVS mode creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetKind {
    /// `hash:ip`: one address per entry (`10.0.0.1`).
    HashIp,
    /// `hash:ip,port`: address, protocol and port (`10.96.0.1,tcp:443`).
    HashIpPort,
    /// `hash:ip,port,ip`: address, protocol:port, second address (`10.0.0.4,tcp:80,10.0.0.4`).
    HashIpPortIp,
    /// `hash:ip,port,net`: address, protocol:port, network (`1.2.3.4,tcp:80,10.0.0.0/8`).
    HashIpPortNet,
    /// `hash:net`: a network (`10.0.0.0/8`, or a bare address for a host network).
    HashNet,
    /// `bitmap:port`: a port number within the set's range (`30080`).
    BitmapPort,
}

impl SetKind {
    /// Every kind, in declaration order.
    pub const ALL: [SetKind; 6] = [
        SetKind::HashIp,
        SetKind::HashIpPort,
        SetKind::HashIpPortIp,
        SetKind::HashIpPortNet,
        SetKind::HashNet,
        SetKind::BitmapPort,
    ];

    /// The type name ipset uses (`hash:ip,port`).
    pub fn name(self) -> &'static str {
        match self {
            SetKind::HashIp => "hash:ip",
            SetKind::HashIpPort => "hash:ip,port",
            SetKind::HashIpPortIp => "hash:ip,port,ip",
            SetKind::HashIpPortNet => "hash:ip,port,net",
            SetKind::HashNet => "hash:net",
            SetKind::BitmapPort => "bitmap:port",
        }
    }

    /// The kind named `name` (`hash:ip,port`), if it is one of ours.
    pub fn from_name(name: &str) -> Option<SetKind> {
        SetKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether sets of this kind have an address family (every `hash:*` type; not
    /// `bitmap:port`).
    pub fn has_family(self) -> bool {
        self != SetKind::BitmapPort
    }
}

impl fmt::Display for SetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The address family of a `hash:*` set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum SetFamily {
    /// `family inet` (IPv4; ipset's default).
    #[default]
    Inet,
    /// `family inet6`.
    Inet6,
}

impl SetFamily {
    /// `"inet"` or `"inet6"`.
    pub fn name(self) -> &'static str {
        match self {
            SetFamily::Inet => "inet",
            SetFamily::Inet6 => "inet6",
        }
    }

    /// Whether `addr` is of this family.
    pub fn contains(self, addr: &IpAddr) -> bool {
        matches!(
            (self, addr),
            (SetFamily::Inet, IpAddr::V4(_)) | (SetFamily::Inet6, IpAddr::V6(_))
        )
    }

    /// The longest prefix of the family (32 or 128).
    pub fn max_prefix(self) -> u8 {
        match self {
            SetFamily::Inet => 32,
            SetFamily::Inet6 => 128,
        }
    }
}

impl fmt::Display for SetFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How one set is (to be) created: what `create NAME TYPE ...` says.
///
/// `family`, `hashsize` and `maxelem` apply to `hash:*` kinds, `range` to `bitmap:port`
/// only (it is required there); the other fields are ignored for the other kind.
/// `hashsize` is the initial bucket count: the kernel rounds it up to a power of two
/// (at least 64) and grows it as entries are added, so `ipset save` may show a larger
/// value than was asked for. `comment` is the `comment` extension (entries may carry a
/// `comment "..."`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SetSpec {
    /// The set's name, 1 to [`MAX_SET_NAME`] bytes.
    pub name: String,
    /// The set type.
    pub kind: SetKind,
    /// Address family (`hash:*` only).
    pub family: SetFamily,
    /// Initial hash size (`hash:*` only).
    pub hashsize: u32,
    /// Maximum number of entries (`hash:*` only).
    pub maxelem: u32,
    /// Inclusive port range (`bitmap:port` only; kube-proxy uses `0-65535`).
    pub range: Option<(u16, u16)>,
    /// Whether the set has the `comment` extension.
    pub comment: bool,
}

/// ipset's default `hashsize` (also kube-proxy's).
pub const DEFAULT_HASHSIZE: u32 = 1024;
/// ipset's default `maxelem` (also kube-proxy's).
pub const DEFAULT_MAXELEM: u32 = 65536;

impl SetSpec {
    /// A `hash:*` set with ipset's (and kube-proxy's) defaults: hashsize 1024, maxelem
    /// 65536, no comment extension.
    pub fn hash(name: impl Into<String>, kind: SetKind, family: SetFamily) -> SetSpec {
        SetSpec {
            name: name.into(),
            kind,
            family,
            hashsize: DEFAULT_HASHSIZE,
            maxelem: DEFAULT_MAXELEM,
            range: None,
            comment: false,
        }
    }

    /// A `bitmap:port` set over `range` (inclusive), like kube-proxy's node-port sets
    /// (`range 0-65535`).
    pub fn bitmap_port(name: impl Into<String>, range: (u16, u16)) -> SetSpec {
        SetSpec {
            name: name.into(),
            kind: SetKind::BitmapPort,
            family: SetFamily::Inet,
            hashsize: DEFAULT_HASHSIZE,
            maxelem: DEFAULT_MAXELEM,
            range: Some(range),
            comment: false,
        }
    }

    /// The `create` line (without a trailing newline), e.g.
    /// `create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536 -exist`.
    pub fn create_line(&self, exist: bool) -> String {
        let mut line = format!("create {} {}", self.name, self.kind);
        if self.kind.has_family() {
            let _ = write!(
                line,
                " family {} hashsize {} maxelem {}",
                self.family, self.hashsize, self.maxelem
            );
        } else if let Some((lo, hi)) = self.range {
            let _ = write!(line, " range {lo}-{hi}");
        }
        if self.comment {
            line.push_str(" comment");
        }
        if exist {
            line.push_str(" -exist");
        }
        line
    }

    /// Whether `create` of `self` with `-exist` succeeds on an existing set `other` of
    /// the same name, as the kernel decides it: same type, same `maxelem`, same
    /// extensions (`comment`), same `range` for bitmaps. `hashsize` is not compared, and
    /// (a kernel quirk, measured) neither is the family: `create S hash:ip family inet6
    /// -exist` succeeds on an `inet` set `S` and leaves it `inet`.
    pub fn exist_compatible(&self, other: &SetSpec) -> bool {
        self.kind == other.kind
            && self.comment == other.comment
            && if self.kind.has_family() {
                self.maxelem == other.maxelem
            } else {
                self.range == other.range
            }
    }

    /// Whether an existing set `other` already is what `self` describes: as
    /// [`SetSpec::exist_compatible`], and the same family. `hashsize` is not compared
    /// (the kernel grows it).
    pub fn same_set(&self, other: &SetSpec) -> bool {
        self.exist_compatible(other) && (!self.kind.has_family() || self.family == other.family)
    }

    /// Whether `swap` of sets `self` and `other` is allowed: same type and family
    /// (bitmaps: same type).
    pub fn swappable(&self, other: &SetSpec) -> bool {
        self.kind == other.kind && (!self.kind.has_family() || self.family == other.family)
    }

    /// [`canonical_entry`] for this set's kind and family, plus the range check of
    /// `bitmap:port` sets.
    ///
    /// # Errors
    /// A message when `text` is not a valid entry of this set.
    pub fn canonical_entry(&self, text: &str) -> Result<String, String> {
        let entry = canonical_entry(self.kind, self.family, text)?;
        self.check_range(&entry)?;
        Ok(entry)
    }

    /// For bitmap sets: whether the canonical entry is inside the range.
    pub(crate) fn check_range(&self, entry: &str) -> Result<(), String> {
        if self.kind == SetKind::BitmapPort
            && let (Some((lo, hi)), Ok(port)) = (self.range, entry.parse::<u16>())
            && !(lo..=hi).contains(&port)
        {
            return Err("Element is out of the range of the set".to_string());
        }
        Ok(())
    }
}

/// One set as `ipset save` shows it: its spec and its entries in canonical form (see
/// [`canonical_entry`]), without entry comments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetState {
    /// How the set was created (`hashsize` as the kernel reports it now).
    pub spec: SetSpec,
    /// The entries, canonical text (`10.96.0.1,tcp:443`).
    pub entries: BTreeSet<String>,
}

impl SetState {
    /// An empty set.
    pub fn new(spec: SetSpec) -> SetState {
        SetState {
            spec,
            entries: BTreeSet::new(),
        }
    }

    /// A set with `entries` (taken as they are: pass canonical text).
    pub fn with_entries<I, S>(spec: SetSpec, entries: I) -> SetState
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        SetState {
            spec,
            entries: entries.into_iter().map(Into::into).collect(),
        }
    }
}

/// An error from [`canonical_entry`] that tells a syntax problem (ipset rejects the line
/// before talking to the kernel) from a value the kernel refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EntryError {
    /// ipset's parser refuses it.
    Syntax(String),
    /// The kernel refuses it (a zero prefix, a port outside a bitmap's range).
    Kernel(String),
}

impl EntryError {
    pub(crate) fn message(self) -> String {
        match self {
            EntryError::Syntax(m) | EntryError::Kernel(m) => m,
        }
    }
}

/// How ipset prints `text` back as an entry of a `kind` set of `family`
/// (`family` is ignored for `bitmap:port`).
///
/// Accepted forms, per kind (`PROTO` is `tcp`, `udp`, `sctp`, `udplite` or their numbers
/// 6, 17, 132, 136; a missing `PROTO:` means `tcp`, as in ipset):
///
/// * `hash:ip`: `ADDR`;
/// * `hash:ip,port`: `ADDR,[PROTO:]PORT`;
/// * `hash:ip,port,ip`: `ADDR,[PROTO:]PORT,ADDR`;
/// * `hash:ip,port,net`: `ADDR,[PROTO:]PORT,NET`;
/// * `hash:net`: `NET`, where `NET` is `ADDR` or `ADDR/PREFIX` with a prefix from 1 to
///   32 (128): printed with the host bits cleared and without a full-length prefix;
/// * `bitmap:port`: `PORT` or `tcp:PORT` / `udp:PORT`, printed as the bare number (the
///   range is checked by [`SetSpec::canonical_entry`]).
///
/// Addresses must be literal and of the set's family; IPv6 is printed compressed.
///
/// # Errors
/// A message for everything else. Forms real ipset also accepts but this crate does not
/// model are refused: address ranges and CIDRs in `hash:ip` (ipset expands them into
/// many entries), port ranges, service names (`tcp:http`), ICMP types, host names,
/// bracketed IPv6.
pub fn canonical_entry(kind: SetKind, family: SetFamily, text: &str) -> Result<String, String> {
    canonical(kind, family, text).map_err(EntryError::message)
}

pub(crate) fn canonical(
    kind: SetKind,
    family: SetFamily,
    text: &str,
) -> Result<String, EntryError> {
    let parts: Vec<&str> = text.split(',').collect();
    let want = match kind {
        SetKind::HashIp | SetKind::HashNet | SetKind::BitmapPort => 1,
        SetKind::HashIpPort => 2,
        SetKind::HashIpPortIp | SetKind::HashIpPortNet => 3,
    };
    if parts.len() != want {
        return Err(EntryError::Syntax(format!(
            "Syntax error: {text:?} is not a {kind} entry (expected {want} comma-separated part(s))"
        )));
    }
    match kind {
        SetKind::HashIp => address(family, parts[0]),
        SetKind::HashNet => network(family, parts[0]),
        SetKind::HashIpPort => Ok(format!(
            "{},{}",
            address(family, parts[0])?,
            proto_port(parts[1])?
        )),
        SetKind::HashIpPortIp => Ok(format!(
            "{},{},{}",
            address(family, parts[0])?,
            proto_port(parts[1])?,
            address(family, parts[2])?
        )),
        SetKind::HashIpPortNet => Ok(format!(
            "{},{},{}",
            address(family, parts[0])?,
            proto_port(parts[1])?,
            network(family, parts[2])?
        )),
        SetKind::BitmapPort => {
            let port = match parts[0].split_once(':') {
                Some(("tcp" | "udp", p)) => p,
                Some(_) => {
                    return Err(EntryError::Syntax(format!(
                        "Syntax error: cannot parse {:?} as a port (only tcp:/udp: prefixes)",
                        parts[0]
                    )));
                }
                None => parts[0],
            };
            Ok(parse_port(port)?.to_string())
        }
    }
}

fn address(family: SetFamily, text: &str) -> Result<String, EntryError> {
    let addr: IpAddr = text.parse().map_err(|_| {
        EntryError::Syntax(format!(
            "Syntax error: cannot parse {text}: not a literal address"
        ))
    })?;
    if !family.contains(&addr) {
        return Err(EntryError::Syntax(format!(
            "Syntax error: cannot parse {text}: not an {} address",
            match family {
                SetFamily::Inet => "IPv4",
                SetFamily::Inet6 => "IPv6",
            }
        )));
    }
    Ok(addr.to_string())
}

fn network(family: SetFamily, text: &str) -> Result<String, EntryError> {
    let (addr, prefix) = match text.split_once('/') {
        None => return address(family, text),
        Some((a, p)) => (a, p),
    };
    let addr: IpAddr = address(family, addr)?
        .parse()
        .map_err(|_| EntryError::Syntax(format!("Syntax error: cannot parse {text}")))?;
    let prefix: u8 = prefix
        .parse()
        .ok()
        .filter(|p| *p <= family.max_prefix())
        .ok_or_else(|| {
            EntryError::Syntax(format!("Syntax error: cannot parse {text}: bad prefix"))
        })?;
    if prefix == 0 {
        return Err(EntryError::Kernel(
            "The value of the CIDR parameter of the IP address is invalid".to_string(),
        ));
    }
    if prefix == family.max_prefix() {
        return Ok(addr.to_string());
    }
    let masked = match addr {
        IpAddr::V4(a) => IpAddr::from((u32::from(a) & (u32::MAX << (32 - prefix))).to_be_bytes()),
        IpAddr::V6(a) => {
            IpAddr::from((u128::from(a) & (u128::MAX << (128 - prefix))).to_be_bytes())
        }
    };
    Ok(format!("{masked}/{prefix}"))
}

fn proto_port(text: &str) -> Result<String, EntryError> {
    let (proto, port) = match text.split_once(':') {
        Some((proto, port)) => (proto, port),
        None => ("tcp", text),
    };
    let proto = match proto {
        "tcp" | "6" => "tcp",
        "udp" | "17" => "udp",
        "sctp" | "132" => "sctp",
        "udplite" | "136" => "udplite",
        other => {
            return Err(EntryError::Syntax(format!(
                "Syntax error: protocol {other:?} is not modelled (tcp, udp, sctp, udplite)"
            )));
        }
    };
    Ok(format!("{proto}:{}", parse_port(port)?))
}

fn parse_port(text: &str) -> Result<u16, EntryError> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(EntryError::Syntax(format!(
            "Syntax error: cannot parse {text:?} as a port number"
        )));
    }
    text.parse::<u16>()
        .map_err(|_| EntryError::Syntax(format!("Syntax error: '{text}' is out of range 0-65535")))
}

/// Splits an ipset command line into words; `"..."` quotes a word (comments).
pub(crate) fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut chars = line.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let mut word = String::new();
        if c == '"' {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some(e) => word.push(e),
                        None => return Err("unterminated quoted string".to_string()),
                    },
                    Some(ch) => word.push(ch),
                    None => return Err("unterminated quoted string".to_string()),
                }
            }
        } else {
            while let Some(&ch) = chars.peek() {
                if ch.is_whitespace() {
                    break;
                }
                word.push(ch);
                chars.next();
            }
        }
        words.push(word);
    }
    Ok(words)
}

/// Parses the options after `create NAME TYPE` into a spec. Unknown options (`timeout`,
/// `counters`, `bucketsize`, `initval`, ...) are skipped, with their value when they take
/// one.
pub(crate) fn parse_create(name: &str, kind: SetKind, opts: &[String]) -> Result<SetSpec, String> {
    let mut spec = if kind == SetKind::BitmapPort {
        SetSpec::bitmap_port(name, (0, 0))
    } else {
        SetSpec::hash(name, kind, SetFamily::Inet)
    };
    let mut range = None;
    let mut i = 0;
    while i < opts.len() {
        let opt = opts[i].as_str();
        let value = opts.get(i + 1).map(String::as_str);
        let need = || value.ok_or_else(|| format!("option {opt} needs a value"));
        match opt {
            "family" => {
                spec.family = match need()? {
                    "inet" | "ipv4" => SetFamily::Inet,
                    "inet6" | "ipv6" => SetFamily::Inet6,
                    other => return Err(format!("unknown family {other:?}")),
                };
                i += 2;
            }
            "hashsize" | "maxelem" => {
                let v: u32 = need()?
                    .parse()
                    .map_err(|_| format!("bad {opt} {value:?}"))?;
                if opt == "hashsize" {
                    spec.hashsize = v;
                } else {
                    spec.maxelem = v;
                }
                i += 2;
            }
            "range" => {
                let v = need()?;
                let (lo, hi) = v
                    .split_once('-')
                    .and_then(|(lo, hi)| Some((lo.parse::<u16>().ok()?, hi.parse::<u16>().ok()?)))
                    .filter(|(lo, hi)| lo <= hi)
                    .ok_or_else(|| format!("bad range {v:?}"))?;
                range = Some((lo, hi));
                i += 2;
            }
            "comment" => {
                spec.comment = true;
                i += 1;
            }
            "counters" | "skbinfo" | "forceadd" => i += 1,
            _ => i += 2,
        }
    }
    if kind == SetKind::BitmapPort {
        spec.range = Some(range.ok_or("bitmap:port needs a range")?);
    }
    Ok(spec)
}

/// Parses `ipset save` (or `ipset list -o save`) output: `create NAME TYPE OPTIONS...`
/// lines, each followed by that set's `add NAME ENTRY [comment "..."]` lines.
///
/// Sets of types this crate does not model (`hash:ip,mark`, `list:set`, ...) are skipped
/// with their entries. Entry comments are dropped; entries are kept as printed
/// (`ipset save` already prints the canonical form). Blank lines are ignored.
///
/// # Errors
/// A [`ParseError`] (1-based line) for an unknown command, an `add` of a set not
/// created above it, or malformed options.
pub fn parse_save(text: &str) -> Result<Vec<SetState>, ParseError> {
    let mut sets: Vec<SetState> = Vec::new();
    let mut skipped: BTreeSet<String> = BTreeSet::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let words = split_words(line).map_err(|m| ParseError::new(n, m))?;
        match words.first().map(String::as_str) {
            None => {}
            Some("create") => {
                let (Some(name), Some(kind)) = (words.get(1), words.get(2)) else {
                    return Err(ParseError::new(n, "create needs a name and a type"));
                };
                match SetKind::from_name(kind) {
                    Some(kind) => {
                        let spec = parse_create(name, kind, &words[3..])
                            .map_err(|m| ParseError::new(n, m))?;
                        sets.push(SetState::new(spec));
                    }
                    None => {
                        skipped.insert(name.clone());
                    }
                }
            }
            Some("add") => {
                let (Some(name), Some(entry)) = (words.get(1), words.get(2)) else {
                    return Err(ParseError::new(n, "add needs a set name and an entry"));
                };
                match sets.last_mut() {
                    Some(set) if set.spec.name == *name => {
                        set.entries.insert(entry.clone());
                    }
                    _ if skipped.contains(name) => {}
                    _ => {
                        return Err(ParseError::new(
                            n,
                            format!("add to set {name} which was not created just above"),
                        ));
                    }
                }
            }
            Some(other) => {
                return Err(ParseError::new(n, format!("unexpected command {other:?}")));
            }
        }
    }
    Ok(sets)
}

/// Prints sets like `ipset save` does (without `bucketsize` / `initval`, entries in
/// sorted order): the inverse of [`parse_save`].
pub fn render_save(sets: &[SetState]) -> String {
    let mut out = String::new();
    for set in sets {
        out.push_str(&set.spec.create_line(false));
        out.push('\n');
        for e in &set.entries {
            let _ = writeln!(out, "add {} {e}", set.spec.name);
        }
    }
    out
}
