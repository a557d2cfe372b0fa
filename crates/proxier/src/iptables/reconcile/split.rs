//! Splitting the nat transaction of a full sync into several smaller ones, for
//! `iptables-nft-restore`: when and how finely ([`SplitPolicy`]), and in which order (the
//! blocks are written by [`super::full`], a Service at a time as the render goes).
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
//!    a Service's chains always together in one block (the render hands them over a Service
//!    at a time), several Services per block: each chain is flushed and refilled within one
//!    transaction, and jumps only to chains of its own block, of step 1, or that the kernel
//!    already holds as they are (a chain left out because it is unchanged; its own jumps are
//!    the render's, so its targets exist throughout). A new Service's chains exist here
//!    unreferenced; a changed one's `KUBE-SVC` chain is replaced whole, with its new
//!    `KUBE-SEP` chains in the same block; chains only the old version used are still there
//!    for `KUBE-SERVICES` rules not yet rewritten;
//! 3. the fixed chains that jump to per-Service chains (`KUBE-SERVICES`, `KUBE-NODEPORTS`)
//!    and the missing jump rules from the built-in chains, in one block: from here on the new
//!    Services are reachable and the deleted ones are not;
//! 4. the stale per-Service chains, referenced by nothing but each other by now: flushed, then
//!    deleted (in one block if they are few, else flushes in blocks and then deletions in
//!    blocks, so no deletion meets a chain still jumping to it).
//!
//! Every line of the one-transaction payload is sent unchanged, once (only `*nat`/`COMMIT`
//! lines are added), so the rules and the counters of everything else are as with one
//! transaction; the filter block and the canary blocks are the same. The split checks, in the
//! first render pass, that every jump of a per-Service chain stays within its Service or goes
//! to a fixed chain of step 1, and sends one transaction when something does not (the render
//! never writes such a rule). A restore that fails stops at the failing block with the earlier
//! ones committed, which by the order above is a correct state; the proxier reports the error
//! and retries with a full sync, as after any failed restore.

/// When and how finely a full sync cuts its nat table into transactions.
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

/// The chain a rule line jumps or goes to (`-j NAME` / `-g NAME` outside quotes), if any.
pub(crate) fn jump_target(line: &str) -> Option<&str> {
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

#[cfg(test)]
mod tests;
