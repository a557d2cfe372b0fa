//! [`FakeIptables`]: an in-memory [`Iptables`] that applies restore payloads with the
//! kernel's checks, for tests of code that writes rules.
//!
//! Semantics mirror `iptables-restore --noflush --counters` as measured against the real
//! binaries (nft and legacy backends, see `tests/kernel.rs`):
//!
//! * input is processed line by line; each `*table` ... `COMMIT` block is a transaction
//!   applied at its `COMMIT`. An error discards the current block and stops; blocks
//!   committed *earlier in the same payload stay applied* (the real tool behaves this
//!   way on both backends). A payload with one table is therefore all-or-nothing.
//! * `:CHAIN - [p:b]` creates a user chain or flushes it if it exists; on a builtin
//!   chain it sets the policy (and counters), and `-` leaves it alone. A policy on a
//!   user chain fails (legacy behaviour; nft silently ignores it).
//! * checks: unknown table; missing `COMMIT`; `-A/-I/-R/-D/-F/-Z/-P/-X` on a missing
//!   chain; `-N` of an existing (or builtin) chain or an invalid name (> 28 chars,
//!   starting with `-`, clashing with a target name); `-X` of a builtin, non-empty or
//!   still-referenced chain; `-D` of a missing rule / index; `-I`/`-R` index too big;
//!   `-j`/`-g` to a chain that does not exist in the table (or to a builtin chain);
//!   `DROP` in nat; DNAT/SNAT/MASQUERADE outside nat; REJECT outside filter; `-m tcp`,
//!   `-m udp`, `-m sctp` without the matching `-p`; `-m multiport` and NAT port ranges
//!   without a port protocol; addresses of the wrong family; REJECT types of the wrong
//!   family.
//! * not modelled: hook restrictions of targets/matches (e.g. SNAT only reachable from
//!   POSTROUTING/INPUT, `--limit-iface-out` in PREROUTING), loops, ipset / nfacct object
//!   existence, per-rule counters (accepted and dropped: `save` has no `-c`).
//!
//! Failures return [`Error::Command`] with `command` =
//! `iptables-restore --noflush --counters`, status 1 and stderr
//! `iptables-restore: line N failed: REASON` (status 2 and `... line N: REASON` for
//! syntax errors), like the real tool.
//!
//! Storage is a map of chain name → shared chain plus a per-chain reference count, so
//! a restore costs O(chains + lines touched), not a scan of every rule per line: fine
//! for rulesets of hundreds of thousands of rules.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::ir::*;
use super::parse::{DeleteTarget, RestoreOp, RestoreParser};
use super::runner::{Iptables, IptablesVersion, NetfilterBackend};
use super::spec::is_target_name;
use crate::error::Error;

const RESTORE_COMMAND: &str = "iptables-restore --noflush --counters";
const MAX_CHAIN_NAME: usize = 28;

/// The checking fake; see the module documentation for the exact semantics.
pub struct FakeIptables {
    ip_version: IpVersion,
    version: IptablesVersion,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    tables: BTreeMap<Table, FakeTable>,
    restores: usize,
    saves: usize,
    chain_checks: usize,
    last_payload: Option<Vec<u8>>,
    fail_next: Option<String>,
}

#[derive(Clone)]
struct FakeTable {
    chains: BTreeMap<String, Arc<Chain>>,
    /// Number of rules (in this table) jumping or going to each chain.
    refs: HashMap<String, usize>,
}

impl FakeTable {
    fn new(table: Table) -> Self {
        FakeTable {
            chains: table
                .builtin_chains()
                .iter()
                .map(|c| (c.to_string(), Arc::new(Chain::builtin("ACCEPT"))))
                .collect(),
            refs: HashMap::new(),
        }
    }

    fn add_ref(&mut self, rule: &Rule) {
        if let Some(c) = rule.jump_chain() {
            *self.refs.entry(c.to_string()).or_default() += 1;
        }
    }

    fn drop_ref(&mut self, rule: &Rule) {
        if let Some(c) = rule.jump_chain()
            && let Some(n) = self.refs.get_mut(c)
        {
            *n -= 1;
            if *n == 0 {
                self.refs.remove(c);
            }
        }
    }

    fn refs(&self, chain: &str) -> usize {
        self.refs.get(chain).copied().unwrap_or(0)
    }

    fn flush(&mut self, name: &str) {
        let Some(chain) = self.chains.get_mut(name) else {
            return;
        };
        let old = std::mem::replace(
            chain,
            Arc::new(Chain {
                policy: chain.policy.clone(),
                counters: chain.counters,
                rules: Vec::new(),
            }),
        );
        for r in &old.rules {
            self.drop_ref(r);
        }
    }

    fn chain_mut(&mut self, name: &str) -> Result<&mut Chain, String> {
        self.chains
            .get_mut(name)
            .map(Arc::make_mut)
            .ok_or_else(|| no_chain(name))
    }

    fn to_rules(&self) -> TableRules {
        TableRules {
            chains: self
                .chains
                .iter()
                .map(|(n, c)| (n.clone(), Chain::clone(c)))
                .collect(),
        }
    }

    fn write_save(&self, table: Table, out: &mut String) {
        let _ = writeln!(out, "*{table}");
        let builtins = table.builtin_chains();
        let order: Vec<(&str, &Chain)> = builtins
            .iter()
            .filter_map(|b| self.chains.get(*b).map(|c| (*b, &**c)))
            .chain(
                self.chains
                    .iter()
                    .filter(|(n, _)| !builtins.contains(&n.as_str()))
                    .map(|(n, c)| (n.as_str(), &**c)),
            )
            .collect();
        for (name, c) in &order {
            let policy = c.policy.as_deref().unwrap_or("-");
            let _ = writeln!(out, ":{name} {policy} {}", c.counters);
        }
        for (_, c) in &order {
            for r in &c.rules {
                let _ = writeln!(out, "{r}");
            }
        }
        out.push_str("COMMIT\n");
    }
}

fn no_chain(name: &str) -> String {
    format!("No chain/target/match by that name. (chain `{name}')")
}

fn check_policy(table: Table, policy: &str) -> Result<(), String> {
    match policy {
        "ACCEPT" => Ok(()),
        "DROP" if table == Table::Nat => Err(
            "The \"nat\" table is not intended for filtering, the use of DROP is therefore inhibited."
                .to_string(),
        ),
        "DROP" => Ok(()),
        other => Err(format!("Bad policy name `{other}'")),
    }
}

fn check_new_chain_name(name: &str) -> Result<(), String> {
    if name.len() > MAX_CHAIN_NAME {
        return Err(format!(
            "chain name `{name}' too long (must be under {} chars)",
            MAX_CHAIN_NAME + 1
        ));
    }
    if name.is_empty() || name.starts_with('-') || name == "!" {
        return Err(format!("chain name `{name}' not allowed"));
    }
    if is_target_name(name) {
        return Err("chain name may not clash with target name".to_string());
    }
    Ok(())
}

fn family_ok(version: IpVersion, addr: IpAddr, what: &str) -> Result<(), String> {
    if IpVersion::of(addr) == version {
        Ok(())
    } else {
        Err(format!("{what} `{addr}' is not an {version:?} address"))
    }
}

/// The kernel-side checks of one rule going into `table`.
fn check_rule(t: &FakeTable, table: Table, version: IpVersion, rule: &Rule) -> Result<(), String> {
    let proto = rule.matches.iter().find_map(|m| match m {
        Match::Protocol { proto, negated } => Some((*proto, *negated)),
        _ => None,
    });
    let plain_proto = match proto {
        Some((p, false)) => Some(p),
        _ => None,
    };
    const PORT_PROTOS: [u8; 5] = [6, 17, 132, 33, 136];
    for m in &rule.matches {
        match m {
            Match::Source { net, .. } | Match::Destination { net, .. } => {
                family_ok(version, net.addr(), "address")?
            }
            Match::Recent(Recent { mask: Some(a), .. }) => family_ok(version, *a, "--mask")?,
            Match::Multiport(_) if !plain_proto.is_some_and(|p| PORT_PROTOS.contains(&p.0)) => {
                return Err(
                    "multiport needs `-p tcp', `-p udp', `-p udplite', `-p sctp' or `-p dccp'"
                        .into(),
                );
            }
            _ => {}
        }
        let needs = match m.module() {
            Some("tcp") => Some(Protocol::TCP),
            Some("udp") => Some(Protocol::UDP),
            Some("sctp") => Some(Protocol::SCTP),
            _ => None,
        };
        if let Some(p) = needs
            && plain_proto != Some(p)
        {
            return Err(format!(
                "{} match requires '-p {p}'",
                p.to_string().to_uppercase()
            ));
        }
    }
    let nat_ports = |ports: bool| {
        if ports && !plain_proto.is_some_and(|p| [6, 17, 132, 33].contains(&p.0)) {
            Err("Need TCP, UDP, SCTP or DCCP with port specification".to_string())
        } else {
            Ok(())
        }
    };
    match &rule.target {
        None
        | Some(Target::Accept | Target::Return | Target::Mark { .. } | Target::Unknown { .. }) => {}
        Some(Target::Drop) => {
            if table == Table::Nat {
                return Err("The \"nat\" table is not intended for filtering, the use of DROP is therefore inhibited.".into());
            }
        }
        Some(Target::Jump(c) | Target::Goto(c)) => {
            if table.is_builtin_chain(c) || !t.chains.contains_key(c) {
                return Err(format!("Chain '{c}' does not exist"));
            }
        }
        Some(Target::Reject { with }) => {
            if table != Table::Filter {
                return Err(format!(
                    "REJECT target: only valid in filter table, not {table}"
                ));
            }
            if let Some(w) = with
                && canonical_reject(version, w).is_none()
            {
                return Err(format!("REJECT: unknown reject type `{w}' for {version:?}"));
            }
        }
        Some(Target::Dnat(n) | Target::Snat(n)) => {
            if table != Table::Nat {
                return Err(format!(
                    "{} target: only valid in nat table, not {table}",
                    rule.target.as_ref().map_or("", Target::name)
                ));
            }
            if let Some((a, b)) = n.to.addrs {
                family_ok(version, a, "NAT address")?;
                family_ok(version, b, "NAT address")?;
            }
            nat_ports(n.to.ports.is_some())?;
        }
        Some(Target::Masquerade { to_ports, .. }) => {
            if table != Table::Nat {
                return Err(format!(
                    "MASQUERADE target: only valid in nat table, not {table}"
                ));
            }
            nat_ports(to_ports.is_some())?;
        }
    }
    Ok(())
}

impl FakeTable {
    fn apply(&mut self, table: Table, version: IpVersion, op: RestoreOp) -> Result<(), String> {
        match op {
            RestoreOp::Table(_) | RestoreOp::Commit => Ok(()),
            RestoreOp::DeclareChain {
                name,
                policy,
                counters,
            } => {
                if table.is_builtin_chain(&name) {
                    if let Some(p) = policy {
                        check_policy(table, &p)?;
                        let c = self.chain_mut(&name)?;
                        c.policy = Some(p);
                        if let Some(cnt) = counters {
                            c.counters = cnt;
                        }
                    }
                    return Ok(());
                }
                if let Some(p) = policy {
                    return Err(format!(
                        "Can't set policy `{p}' on `{name}': Bad built-in chain name"
                    ));
                }
                if self.chains.contains_key(&name) {
                    self.flush(&name);
                } else {
                    check_new_chain_name(&name)?;
                    self.chains
                        .entry(name)
                        .or_insert_with(|| Arc::new(Chain::user()));
                }
                Ok(())
            }
            RestoreOp::NewChain(name) => {
                if self.chains.contains_key(&name) || table.is_builtin_chain(&name) {
                    return Err("Chain already exists.".to_string());
                }
                check_new_chain_name(&name)?;
                self.chains.insert(name, Arc::new(Chain::user()));
                Ok(())
            }
            RestoreOp::DeleteChain(Some(name)) => {
                if table.is_builtin_chain(&name) || !self.chains.contains_key(&name) {
                    return Err(no_chain(&name));
                }
                self.delete_chain(&name)
            }
            RestoreOp::DeleteChain(None) => {
                let users: Vec<String> = self
                    .chains
                    .keys()
                    .filter(|n| !table.is_builtin_chain(n))
                    .cloned()
                    .collect();
                for n in &users {
                    self.delete_chain(n)?;
                }
                Ok(())
            }
            RestoreOp::Flush(Some(name)) => {
                if !self.chains.contains_key(&name) {
                    return Err(no_chain(&name));
                }
                self.flush(&name);
                Ok(())
            }
            RestoreOp::Flush(None) => {
                let all: Vec<String> = self.chains.keys().cloned().collect();
                for n in &all {
                    self.flush(n);
                }
                Ok(())
            }
            RestoreOp::Zero(chain) => {
                let names: Vec<String> = match chain {
                    Some(n) if self.chains.contains_key(&n) => vec![n],
                    Some(n) => return Err(no_chain(&n)),
                    None => self.chains.keys().cloned().collect(),
                };
                for n in names {
                    let c = self.chain_mut(&n)?;
                    c.counters = Counters::default();
                }
                Ok(())
            }
            RestoreOp::Policy { chain, policy } => {
                if !table.is_builtin_chain(&chain) {
                    return Err(format!(
                        "Can't set policy `{policy}' on `{chain}': Bad built-in chain name"
                    ));
                }
                check_policy(table, &policy)?;
                self.chain_mut(&chain)?.policy = Some(policy);
                Ok(())
            }
            RestoreOp::Append(rule) => {
                let rule = self.prepare(table, version, rule)?;
                self.add_ref(&rule);
                let chain = rule.chain.clone();
                self.chain_mut(&chain)?.rules.push(rule);
                Ok(())
            }
            RestoreOp::Insert { rule, position } => {
                let len = self.len(&rule.chain)?;
                if position > len + 1 {
                    return Err("Index of insertion too big.".to_string());
                }
                let rule = self.prepare(table, version, rule)?;
                self.add_ref(&rule);
                let chain = rule.chain.clone();
                self.chain_mut(&chain)?.rules.insert(position - 1, rule);
                Ok(())
            }
            RestoreOp::Replace { rule, position } => {
                let len = self.len(&rule.chain)?;
                if position > len {
                    return Err("Index of replacement too big.".to_string());
                }
                let rule = self.prepare(table, version, rule)?;
                self.add_ref(&rule);
                let chain = rule.chain.clone();
                let old = std::mem::replace(&mut self.chain_mut(&chain)?.rules[position - 1], rule);
                self.drop_ref(&old);
                Ok(())
            }
            RestoreOp::Delete { chain, target } => {
                let len = self.len(&chain)?;
                let index = match target {
                    DeleteTarget::Index(n) => {
                        if n > len {
                            return Err("Index of deletion too big.".to_string());
                        }
                        n - 1
                    }
                    DeleteTarget::Rule(mut r) => {
                        r.canonicalize(version);
                        self.chains
                            .get(&chain)
                            .and_then(|c| c.rules.iter().position(|x| x.same_spec(&r)))
                            .ok_or_else(|| {
                                "Bad rule (does a matching rule exist in that chain?).".to_string()
                            })?
                    }
                };
                let old = self.chain_mut(&chain)?.rules.remove(index);
                self.drop_ref(&old);
                Ok(())
            }
        }
    }

    fn len(&self, chain: &str) -> Result<usize, String> {
        self.chains
            .get(chain)
            .map(|c| c.rules.len())
            .ok_or_else(|| no_chain(chain))
    }

    fn prepare(&self, table: Table, version: IpVersion, mut rule: Rule) -> Result<Rule, String> {
        if !self.chains.contains_key(&rule.chain) {
            return Err(no_chain(&rule.chain));
        }
        rule.canonicalize(version);
        check_rule(self, table, version, &rule)?;
        rule.counters = None;
        rule.line = 0;
        Ok(rule)
    }

    fn delete_chain(&mut self, name: &str) -> Result<(), String> {
        let chain = self.chains.get(name).ok_or_else(|| no_chain(name))?;
        if !chain.rules.is_empty() {
            return Err(format!(
                "CHAIN_DEL failed (Device or resource busy): chain {name} is not empty"
            ));
        }
        let refs = self.refs(name);
        if refs > 0 {
            return Err(format!(
                "CHAIN_DEL failed (Device or resource busy): chain {name} is referenced by {refs} rule(s)"
            ));
        }
        self.chains.remove(name);
        Ok(())
    }
}

impl FakeIptables {
    /// An empty fake for `ip_version` reporting `iptables v1.8.9 (nf_tables)`.
    pub fn new(ip_version: IpVersion) -> Self {
        FakeIptables {
            ip_version,
            version: IptablesVersion {
                major: 1,
                minor: 8,
                patch: 9,
                backend: NetfilterBackend::NfTables,
            },
            state: Mutex::new(State::default()),
        }
    }

    /// Makes `version()` report `version`.
    pub fn with_version(mut self, version: IptablesVersion) -> Self {
        self.version = version;
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current (committed) ruleset: every table a restore has touched, with its
    /// builtin chains.
    pub fn ruleset(&self) -> Ruleset {
        let st = self.lock();
        Ruleset {
            tables: st
                .tables
                .iter()
                .map(|(t, ft)| (*t, ft.to_rules()))
                .collect(),
        }
    }

    /// The current rules of `table` (builtins only if never written).
    pub fn table(&self, table: Table) -> TableRules {
        let st = self.lock();
        match st.tables.get(&table) {
            Some(ft) => ft.to_rules(),
            None => TableRules::with_builtins(table),
        }
    }

    /// Number of `restore` calls so far (including failed ones).
    pub fn restore_count(&self) -> usize {
        self.lock().restores
    }

    /// Number of `save` calls so far.
    pub fn save_count(&self) -> usize {
        self.lock().saves
    }

    /// Number of `chain_exists` calls so far.
    pub fn chain_check_count(&self) -> usize {
        self.lock().chain_checks
    }

    /// The payload of the last `restore` call.
    pub fn last_payload(&self) -> Option<Vec<u8>> {
        self.lock().last_payload.clone()
    }

    /// Makes the next `restore` fail without applying anything, with exit status 1 and
    /// `stderr`.
    pub fn fail_next_restore(&self, stderr: impl Into<String>) {
        self.lock().fail_next = Some(stderr.into());
    }

    fn restore_error(status: i32, stderr: String) -> Error {
        Error::Command {
            command: RESTORE_COMMAND.to_string(),
            status,
            stderr,
        }
    }
}

impl Iptables for FakeIptables {
    fn ip_version(&self) -> IpVersion {
        self.ip_version
    }

    /// Applies `payload` like `iptables-restore --noflush --counters` (see the module
    /// documentation).
    fn restore(&self, payload: &[u8]) -> Result<(), Error> {
        let mut st = self.lock();
        st.restores += 1;
        st.last_payload = Some(payload.to_vec());
        if let Some(msg) = st.fail_next.take() {
            return Err(Self::restore_error(1, msg));
        }
        let text = String::from_utf8_lossy(payload);
        let mut current: Option<(Table, FakeTable)> = None;
        for item in RestoreParser::new(&text) {
            let cmd = item.map_err(|e| {
                Self::restore_error(
                    2,
                    format!(
                        "iptables-restore: line {}: {}\nError occurred at line: {}",
                        e.line, e.message, e.line
                    ),
                )
            })?;
            match cmd.op {
                RestoreOp::Table(t) => {
                    let working = st
                        .tables
                        .get(&t)
                        .cloned()
                        .unwrap_or_else(|| FakeTable::new(t));
                    current = Some((t, working));
                }
                RestoreOp::Commit => {
                    if let Some((t, working)) = current.take() {
                        st.tables.insert(t, working);
                    }
                }
                op => {
                    // The parser guarantees commands only appear inside a table.
                    if let Some((t, working)) = current.as_mut() {
                        working.apply(*t, self.ip_version, op).map_err(|m| {
                            Self::restore_error(
                                1,
                                format!("iptables-restore: line {} failed: {m}", cmd.line),
                            )
                        })?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Prints the committed state like `iptables-save [-t TABLE]` (without the `#`
    /// comment lines): all touched tables in [`Table`] order, or just `table` (its
    /// builtin chains if never written).
    fn save(&self, table: Option<Table>) -> Result<String, Error> {
        let mut st = self.lock();
        st.saves += 1;
        let mut out = String::new();
        match table {
            Some(t) => match st.tables.get(&t) {
                Some(ft) => ft.write_save(t, &mut out),
                None => FakeTable::new(t).write_save(t, &mut out),
            },
            None => {
                for (t, ft) in &st.tables {
                    ft.write_save(*t, &mut out);
                }
            }
        }
        Ok(out)
    }

    fn version(&self) -> Result<IptablesVersion, Error> {
        Ok(self.version)
    }

    /// Whether `chain` exists in the committed state of `table` (a table never written has
    /// only its built-in chains), like `iptables -t TABLE -S CHAIN`.
    fn chain_exists(&self, table: Table, chain: &str) -> Result<bool, Error> {
        let mut st = self.lock();
        st.chain_checks += 1;
        Ok(match st.tables.get(&table) {
            Some(ft) => ft.chains.contains_key(chain),
            None => table.is_builtin_chain(chain),
        })
    }
}
