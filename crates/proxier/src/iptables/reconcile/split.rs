//! Splitting the nat transaction of a full sync into several smaller ones, for
//! `iptables-nft-restore` ([`split_full_payload`]).
//!
//! **Why.** `iptables-nft-restore` (1.8.x) collects, per `*table ... COMMIT` block, a
//! name-sorted linked list of every chain the block's commands name (its cache request,
//! `nft_cache_level_set()`), and inserts each command's chain and jump target into it with a
//! walk from the head: a block costs about commands × chains string compares. Our full nat
//! block at 10,000 Services × 10 endpoints is 434k commands over 110k chains, which does not
//! finish in minutes. The list is rebuilt for every block, so the same rules cut into blocks
//! of about a thousand lines load in a time proportional to their number: about
//! `iptables-legacy-restore`'s (docs/benchmarks.md, "iptables-nft at scale"). The other cost,
//! in the kernel, goes the other way: every nf_tables commit that adds rules re-validates the
//! whole ruleset reachable from the base chains (`nft_table_validate()`), about 0.2 s at 10,000
//! Services once our jumps from `PREROUTING`/`OUTPUT` are in place. So blocks are small on a
//! node without our rules and larger over a loaded table ([`SplitPolicy::budget`]).
//!
//! **Order.** Each block is one atomic nf_tables transaction, committed in turn, so the order
//! keeps every state in between correct for packets:
//!
//! 1. our fixed chains that jump to no per-Service chain (`KUBE-MARK-MASQ`,
//!    `KUBE-POSTROUTING`), declared and filled;
//! 2. the per-Service chains (`KUBE-SVC-`, `KUBE-SEP-`, `KUBE-EXT-`, `KUBE-FW-`, `KUBE-SVL-`),
//!    a Service's chains always together in one block (the chains connected by jumps, found
//!    from the rules themselves), several Services per block: each chain is flushed and
//!    refilled within one transaction, and jumps only to chains of its own block or of step 1.
//!    A new Service's chains exist here unreferenced; a changed one's `KUBE-SVC` chain is
//!    replaced whole, with its new `KUBE-SEP` chains in the same block; chains only the old
//!    version used are still there for `KUBE-SERVICES` rules not yet rewritten;
//! 3. the fixed chains that jump to per-Service chains (`KUBE-SERVICES`, `KUBE-NODEPORTS`)
//!    and the missing jump rules from the built-in chains, in one block: from here on the new
//!    Services are reachable and the deleted ones are not;
//! 4. the stale per-Service chains, referenced by nothing but each other by now: flushed, then
//!    deleted (in one block if they are few, else flushes in blocks and then deletions in
//!    blocks, so no deletion meets a chain still jumping to it).
//!
//! Every line of the original block is sent unchanged, once (only `*nat`/`COMMIT` lines are
//! added), so the rules and the counters of everything else are as with one transaction; the
//! filter block and the canary blocks are untouched. A restore that fails stops at the failing
//! block with the earlier ones committed, which by the order above is a correct state; the
//! proxier reports the error and retries with a full sync, as after any failed restore.

use std::collections::HashMap;
use std::fmt;

use kp_netfilter::Table;

use super::super::names::is_service_chain;
use super::super::render::FastBuild;

/// When and how finely [`split_full_payload`] cuts the nat block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitPolicy {
    /// A nat block of at most this many lines is sent whole.
    pub min_lines: usize,
    /// Lines per block of per-Service chains on a node without our chains.
    pub lines_per_transaction: usize,
    /// One more line per block for every this many per-Service chains already in the
    /// kernel's nat table (0: no growth), because each commit then re-validates them.
    pub existing_chains_per_extra_line: usize,
}

/// The policy of the nf_tables backend, measured with iptables 1.8.9 on Linux 6.18
/// (docs/benchmarks.md, "iptables-nft at scale"): below 3,000 lines (about 70 Services × 10
/// endpoints) one block takes under 0.1 s and splitting gains nothing; blocks of 1,200 lines
/// load a fresh node fastest; over a loaded table of 110k chains (10,000 Services) blocks of
/// about 8,000 lines balance the tool's per-block cost against the kernel's per-commit
/// validation.
pub const NFT_SPLIT: SplitPolicy = SplitPolicy {
    min_lines: 3_000,
    lines_per_transaction: 1_200,
    existing_chains_per_extra_line: 16,
};

impl SplitPolicy {
    /// Lines per block of per-Service chains when the kernel's nat table already holds
    /// `existing_chains` per-Service chains (at least 1).
    pub fn budget(&self, existing_chains: usize) -> usize {
        let extra = existing_chains
            .checked_div(self.existing_chains_per_extra_line)
            .unwrap_or(0);
        (self.lines_per_transaction + extra).max(1)
    }
}

/// A payload whose nat block was split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// The whole payload: the text before the nat block, the nat blocks, the text after it.
    pub payload: String,
    /// How many `*nat ... COMMIT` blocks replaced the one.
    pub nat_transactions: usize,
}

/// Why a payload was left as one nat transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unsplit {
    /// The nat block has `lines` lines, not more than [`SplitPolicy::min_lines`].
    Small {
        /// Lines of the nat block.
        lines: usize,
    },
    /// The payload holds something the split does not order (a line it does not know, a
    /// policy on a built-in chain, a jump to a chain it deletes, no nat block, ...): it is
    /// sent as it is, one transaction, as before.
    Unsupported(String),
}

impl fmt::Display for Unsplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unsplit::Small { lines } => write!(f, "the nat block has only {lines} lines"),
            Unsplit::Unsupported(why) => write!(f, "{why}"),
        }
    }
}

/// The chain a rule line jumps or goes to (`-j NAME` / `-g NAME` outside quotes), if any.
fn jump_target(line: &str) -> Option<&str> {
    let b = line.as_bytes();
    let mut quoted = false;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' if quoted => i += 1,
            b'"' => quoted = !quoted,
            b' ' if !quoted
                && b.len() > i + 3
                && b[i + 1] == b'-'
                && matches!(b[i + 2], b'j' | b'g')
                && b[i + 3] == b' ' =>
            {
                let rest = &line[i + 4..];
                return rest.split(' ').next();
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Where the main nat block is: the index of its `*nat` line, of its first body line and of
/// its `COMMIT` line, and the index just after that line.
fn find_nat_block(payload: &str) -> Option<(usize, usize, usize, usize)> {
    let start = if payload.starts_with("*nat\n") {
        0
    } else {
        payload.find("\n*nat\n")? + 1
    };
    let body = start + "*nat\n".len();
    let commit = if payload[body..].starts_with("COMMIT\n") {
        body
    } else {
        body + payload[body..].find("\nCOMMIT\n")? + 1
    };
    Some((start, body, commit, commit + "COMMIT\n".len()))
}

/// The nat block, read line by line.
#[derive(Default)]
struct Parsed<'a> {
    /// Declared chains, in order: (name, the declaration line).
    decls: Vec<(&'a str, &'a str)>,
    /// Chain name → index in `decls`.
    ids: HashMap<&'a str, u32, FastBuild>,
    /// Rules of declared chains, in order: (chain, line).
    rules: Vec<(u32, &'a str)>,
    /// Lines on built-in chains (the missing jumps), in order.
    head: Vec<&'a str>,
    /// `-X` lines, in order: (chain, line).
    deletes: Vec<(u32, &'a str)>,
    /// Jumps between declared chains: (from, to), from rules and from `head` (from = None).
    edges: Vec<(Option<u32>, u32)>,
}

fn unsupported(why: impl Into<String>) -> Unsplit {
    Unsplit::Unsupported(why.into())
}

fn parse(body: &str) -> Result<Parsed<'_>, Unsplit> {
    let mut p = Parsed::default();
    for line in body.lines() {
        if let Some(decl) = line.strip_prefix(':') {
            let name = decl.split(' ').next().unwrap_or_default();
            if Table::Nat.is_builtin_chain(name) {
                return Err(unsupported(format!(
                    "the nat block sets the policy of {name}"
                )));
            }
            let id = p.decls.len() as u32;
            if p.ids.insert(name, id).is_some() {
                return Err(unsupported(format!("chain {name} is declared twice")));
            }
            p.decls.push((name, line));
        } else if let Some(rest) = line.strip_prefix("-X ") {
            let Some(&id) = p.ids.get(rest) else {
                return Err(unsupported(format!(
                    "chain {rest} is deleted without being declared"
                )));
            };
            p.deletes.push((id, line));
        } else if let Some(rest) = line
            .strip_prefix("-A ")
            .or_else(|| line.strip_prefix("-I "))
        {
            let chain = rest.split(' ').next().unwrap_or_default();
            let target = jump_target(line).and_then(|t| p.ids.get(t).copied());
            if let Some(&id) = p.ids.get(chain) {
                if line.starts_with("-I ") {
                    return Err(unsupported(format!(
                        "a rule is inserted into chain {chain}"
                    )));
                }
                if let Some(t) = target {
                    p.edges.push((Some(id), t));
                }
                p.rules.push((id, line));
            } else if Table::Nat.is_builtin_chain(chain) {
                if let Some(t) = target {
                    p.edges.push((None, t));
                }
                p.head.push(line);
            } else {
                return Err(unsupported(format!(
                    "a rule is written into chain {chain}, which the nat block does not declare"
                )));
            }
        } else {
            let shown: String = line.chars().take(60).collect();
            return Err(unsupported(format!("the nat block has the line {shown:?}")));
        }
    }
    Ok(p)
}

fn find(parent: &mut [u32], mut x: u32) -> u32 {
    while parent[x as usize] != x {
        let up = parent[parent[x as usize] as usize];
        parent[x as usize] = up;
        x = up;
    }
    x
}

/// Splits the main nat block of a full-sync payload (the first `*nat ... COMMIT`) into
/// several blocks in the order described in the module documentation, with `policy` and the
/// number of per-Service chains the kernel's nat table holds before the sync
/// (`existing_chains`). Everything before and after that block is copied unchanged.
///
/// # Errors
/// [`Unsplit`] when the block is small or holds something this split does not order; the
/// caller then sends `payload` as it is.
pub fn split_full_payload(
    payload: &str,
    policy: &SplitPolicy,
    existing_chains: usize,
) -> Result<Split, Unsplit> {
    let (start, body_start, commit, end) =
        find_nat_block(payload).ok_or_else(|| unsupported("the payload has no nat block"))?;
    let body = &payload[body_start..commit];
    let lines = body.lines().count();
    if lines <= policy.min_lines {
        return Err(Unsplit::Small { lines });
    }
    let p = parse(body)?;
    let n = p.decls.len();
    let budget = policy.budget(existing_chains);

    let mut stale = vec![false; n];
    for &(id, _) in &p.deletes {
        stale[id as usize] = true;
    }
    let mut rule_count = vec![0usize; n];
    for &(id, _) in &p.rules {
        rule_count[id as usize] += 1;
        if stale[id as usize] {
            return Err(unsupported(format!(
                "chain {} gets rules and is deleted",
                p.decls[id as usize].0
            )));
        }
    }
    for &(_, to) in &p.edges {
        if stale[to as usize] {
            return Err(unsupported(format!(
                "a rule jumps to chain {}, which the nat block deletes",
                p.decls[to as usize].0
            )));
        }
    }
    let service: Vec<bool> = (0..n)
        .map(|i| !stale[i] && is_service_chain(p.decls[i].0))
        .collect();

    // A Service's chains: connected by jumps between per-Service chains.
    let mut parent: Vec<u32> = (0..n as u32).collect();
    for &(from, to) in &p.edges {
        if let Some(from) = from
            && service[from as usize]
            && service[to as usize]
        {
            let (a, b) = (find(&mut parent, from), find(&mut parent, to));
            parent[a as usize] = b;
        }
    }
    // Fixed chains that reach a per-Service chain go last ("entry"), the others first.
    let mut entry = vec![false; n];
    loop {
        let mut changed = false;
        for &(from, to) in &p.edges {
            if let Some(from) = from {
                let (f, t) = (from as usize, to as usize);
                if !service[f] && !stale[f] && !entry[f] && (service[t] || entry[t]) {
                    entry[f] = true;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    // A Service's chains that jump to an entry chain go with it.
    let mut with_entry = vec![false; n];
    for &(from, to) in &p.edges {
        if let Some(from) = from
            && service[from as usize]
            && entry[to as usize]
        {
            let r = find(&mut parent, from);
            with_entry[r as usize] = true;
        }
    }
    let mut component_lines = vec![0usize; n];
    for i in 0..n {
        if service[i] {
            let r = find(&mut parent, i as u32);
            component_lines[r as usize] += 1 + rule_count[i];
        }
    }

    // Blocks: 0 = fixed leaves, 1..=groups = per-Service chains, groups + 1 = entry.
    const UNSET: u32 = u32::MAX;
    let mut block = vec![UNSET; n];
    let mut component_block = vec![UNSET; n];
    let mut group = 1u32;
    let mut group_lines = 0usize;
    for i in 0..n {
        if stale[i] {
            continue;
        }
        if !service[i] {
            block[i] = if entry[i] { UNSET - 1 } else { 0 };
            continue;
        }
        let r = find(&mut parent, i as u32) as usize;
        if with_entry[r] {
            block[i] = UNSET - 1;
            continue;
        }
        if component_block[r] == UNSET {
            if group_lines >= budget {
                group += 1;
                group_lines = 0;
            }
            component_block[r] = group;
            group_lines += component_lines[r];
        }
        block[i] = component_block[r];
    }
    let entry_block = group + 1;
    for b in &mut block {
        if *b == UNSET - 1 {
            *b = entry_block;
        }
    }
    // Every jump must go to a chain written in the same or an earlier block.
    for &(from, to) in &p.edges {
        let from_block = from.map_or(entry_block, |f| block[f as usize]);
        if block[to as usize] > from_block {
            return Err(unsupported(format!(
                "internal: chain {} would be written after a jump to it",
                p.decls[to as usize].0
            )));
        }
    }

    let blocks = entry_block as usize + 1;
    let mut decls: Vec<Vec<u32>> = vec![Vec::new(); blocks];
    for (i, &b) in block.iter().enumerate() {
        if b != UNSET {
            decls[b as usize].push(i as u32);
        }
    }
    let mut rules: Vec<Vec<u32>> = vec![Vec::new(); blocks];
    for (k, &(id, _)) in p.rules.iter().enumerate() {
        rules[block[id as usize] as usize].push(k as u32);
    }

    let mut out =
        String::with_capacity(payload.len() + 16 * (blocks + p.deletes.len() / budget + 4));
    out.push_str(&payload[..start]);
    let mut nat_transactions = 0;
    for b in 0..blocks {
        let head = b == entry_block as usize && !p.head.is_empty();
        if decls[b].is_empty() && rules[b].is_empty() && !head {
            continue;
        }
        nat_transactions += 1;
        out.push_str("*nat\n");
        for &i in &decls[b] {
            out.push_str(p.decls[i as usize].1);
            out.push('\n');
        }
        if b == entry_block as usize {
            for line in &p.head {
                out.push_str(line);
                out.push('\n');
            }
        }
        for &k in &rules[b] {
            out.push_str(p.rules[k as usize].1);
            out.push('\n');
        }
        out.push_str("COMMIT\n");
    }
    // Stale chains: flush and delete together when they are few, else every flush first.
    let together = 2 * p.deletes.len() <= budget;
    let chunk = budget;
    for part in p.deletes.chunks(chunk) {
        nat_transactions += 1;
        out.push_str("*nat\n");
        for &(id, _) in part {
            out.push_str(p.decls[id as usize].1);
            out.push('\n');
        }
        if together {
            for &(_, line) in part {
                out.push_str(line);
                out.push('\n');
            }
        }
        out.push_str("COMMIT\n");
    }
    if !together {
        for part in p.deletes.chunks(chunk) {
            nat_transactions += 1;
            out.push_str("*nat\n");
            for &(_, line) in part {
                out.push_str(line);
                out.push('\n');
            }
            out.push_str("COMMIT\n");
        }
    }
    out.push_str(&payload[end..]);
    Ok(Split {
        payload: out,
        nat_transactions,
    })
}

#[cfg(test)]
mod tests;
