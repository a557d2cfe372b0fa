//! The payload of a full sync, written into the tool's stdin while the render goes, with only
//! the chains whose kernel contents differ from the render.
//!
//! A full sync renders twice with the same inputs ([`render_streamed`](super::super::render::render_streamed)):
//!
//! 1. [`Measure`] sees every Service's own chains (their declarations and rules) in the first
//!    pass and compares each chain's [digest](super::digest) with the kernel's, read from
//!    `iptables-save` ([`OurChains`]): an equal chain is *unchanged* and left out of the
//!    payload, so it is neither flushed nor rewritten and its counters stay. [`plan`] does the
//!    same for the fixed and dispatch chains of nat and for filter, finds the stale chains
//!    and the missing jump rules, and chooses the layout.
//! 2. [`Writer`] writes the payload during the second pass, a Service at a time; nothing but
//!    the payload's head (the filter table, the nat entry rules, one block of the split) is
//!    held.
//!
//! The kernel ends as after upstream's full sync, which flushes and rewrites every chain: a
//! chain left out holds exactly what would have been written into it, a chain that differs
//! anywhere (a changed or deleted rule, a rule someone added) is rewritten whole, a missing
//! one created, a stale one flushed and deleted, missing jumps from the built-in chains
//! inserted.
//!
//! Layouts:
//!
//! - [`Layout::One`], one transaction per table (the legacy backend, `-Z`, or a small nat
//!   block): upstream's payload minus the unchanged chains, byte for byte in its order —
//!   filter, then nat with every declaration first (changed chains, then the stale ones), the
//!   missing jumps, the rules, the stale chains' deletions — then the canary blocks. A table
//!   with nothing to write gets no block, and a canary that is there (empty) no block either:
//!   the resync of an unchanged node sends nothing and does not run the tool.
//! - [`Layout::Split`], the nf_tables backend's several nat transactions, in the order of
//!   [`super::split`]: the fixed chains that jump to no per-Service chain, then the
//!   per-Service chains, whole Services per block of about [`SplitPolicy::budget`] lines, then
//!   the entry chains (`KUBE-SERVICES`, `KUBE-NODEPORTS`, the dispatch tree) with the missing
//!   jumps, then the stale chains. A Service's chains are contiguous in the render, so the
//!   blocks are cut at Service boundaries as it goes.

use std::collections::HashMap;
use std::io::{self, Write};

use std::fmt::Write as _;

use kp_netfilter::Table;

use super::super::canary::{CANARY_TABLES, KUBE_PROXY_CANARY};
use super::super::names::{KUBE_FIREWALL, is_service_chain};
use super::super::render::{
    FastBuild, RenderCache, RenderConfig, Rendered, ServiceRules, Stream, render_streamed,
};
use super::digest::{ChainHasher, OurChains, chain_digest};
use super::split::{SplitPolicy, jump_target};
use super::{KernelTables, missing_jumps, stale_in_kernel};

/// The name declared by a `:NAME - [0:0]` line.
fn decl_name(line: &str) -> &str {
    line.strip_prefix(':')
        .unwrap_or(line)
        .split([' ', '\n'])
        .next()
        .unwrap_or_default()
}

/// The chain a `-A CHAIN …` line writes into.
fn rule_chain(line: &str) -> &str {
    line.strip_prefix("-A ")
        .unwrap_or_default()
        .split([' ', '\n'])
        .next()
        .unwrap_or_default()
}

/// One chain of the Service being measured.
struct Slot<'a> {
    name: &'a str,
    /// Digesting (the kernel has a chain of that name).
    hasher: Option<ChainHasher>,
    rules: usize,
}

/// The first pass of a full sync: compares each Service's chains with the kernel's (see the
/// module documentation). Feed it every [`ServiceRules`] of a
/// [`Stream::Measure`](super::super::render::Stream::Measure) render, then [`finish`](Self::finish).
pub struct Measure<'k> {
    ours: Option<&'k mut OurChains>,
    measured: Measured,
}

/// What [`Measure`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Measured {
    /// Lines of the per-Service chains to write: their declarations and rules.
    pub lines: usize,
    /// Per-Service chains left as they are (equal in the kernel).
    pub kept_chains: usize,
    /// Rules in those chains.
    pub kept_rules: usize,
    /// Chains outside a Service (`KUBE-…`) that its rules jump to.
    pub outside_targets: Vec<String>,
    /// Something the split does not order (a rule of a chain the Service did not declare).
    pub irregular: Option<String>,
}

impl<'k> Measure<'k> {
    /// Compares against `ours`, the kernel's nat chains (`None`: a node assumed empty).
    pub fn new(ours: Option<&'k mut OurChains>) -> Self {
        Measure {
            ours: ours.filter(|o| !o.is_empty()),
            measured: Measured::default(),
        }
    }

    /// One Service's chains.
    pub fn service(&mut self, s: ServiceRules<'_>) {
        let mut slots: Vec<Slot<'_>> = s
            .chains
            .lines()
            .map(|l| {
                let name = decl_name(l);
                Slot {
                    name,
                    hasher: self
                        .ours
                        .as_ref()
                        .is_some_and(|o| o.contains(name))
                        .then(|| ChainHasher::new(name)),
                    rules: 0,
                }
            })
            .collect();
        let m = &mut self.measured;
        let mut at = 0usize;
        for line in s.rules.lines() {
            let chain = rule_chain(line);
            let found = if slots.get(at).is_some_and(|s| s.name == chain) {
                Some(at)
            } else if slots.get(at + 1).is_some_and(|s| s.name == chain) {
                Some(at + 1)
            } else {
                slots.iter().position(|s| s.name == chain)
            };
            let Some(i) = found else {
                m.lines += 1;
                m.irregular.get_or_insert_with(|| {
                    format!("a rule of chain {chain} outside its Service's chains")
                });
                continue;
            };
            at = i;
            let slot = &mut slots[i];
            slot.rules += 1;
            if let Some(h) = slot.hasher.as_mut() {
                h.rule(line);
            }
            if let Some(t) = jump_target(line)
                && t.starts_with("KUBE-")
                && !m.outside_targets.iter().any(|o| o == t)
                && !slots.iter().any(|s| s.name == t)
            {
                m.outside_targets.push(t.to_string());
            }
        }
        for slot in slots {
            let same = match (slot.hasher, self.ours.as_mut()) {
                (Some(h), Some(ours)) => ours.mark_same(slot.name, &h.finish()),
                _ => false,
            };
            if same {
                m.kept_chains += 1;
                m.kept_rules += slot.rules;
            } else {
                m.lines += 1 + slot.rules;
            }
        }
    }

    /// What was found.
    pub fn finish(self) -> Measured {
        self.measured
    }
}

/// How a full sync's nat table is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One transaction per table.
    One,
    /// Several nat transactions (see the module documentation), per-Service blocks of
    /// `budget` lines.
    Split {
        /// Lines per block of per-Service chains.
        budget: usize,
    },
}

/// Settings of a full sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Start each table with `-Z` (never split).
    pub zero_counters: bool,
    /// Split the nat table ([`Layout::Split`]) when it is longer than the policy's threshold.
    pub split: Option<SplitPolicy>,
}

/// A fixed or dispatch chain of nat (not per-Service).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fixed {
    /// Unchanged in the kernel: not written.
    same: bool,
    /// Reaches a per-Service chain: written after them in the split.
    entry: bool,
}

/// What the first pass and the kernel decided: the layout, the stale chains, the filter
/// table, which fixed chains are written (see [`plan`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FullSync {
    /// The layout.
    pub layout: Layout,
    /// Stale chains: flushed and deleted.
    pub stale: Vec<String>,
    /// Chains left as they are (per-Service, fixed and filter chains).
    pub kept_chains: usize,
    /// Lines of the nat table in one transaction (what the split threshold compares).
    pub nat_lines: usize,
    /// Why the payload was not split although the policy asked for it, if so.
    pub unsplit: Option<String>,
    zero_counters: bool,
    /// The whole filter block (empty when it would write nothing).
    filter_block: String,
    /// The canary blocks of the tables whose canary is not there, empty, already.
    canary_blocks: String,
    /// The missing jumps from nat's built-in chains.
    nat_jumps: String,
    /// nat's fixed and dispatch chains, by name.
    fixed: HashMap<String, Fixed, FastBuild>,
    /// Some per-Service chain is unchanged (else every declaration is written as rendered).
    any_kept: bool,
}

impl FullSync {
    /// Whether the payload would be empty: no chain to write, nothing stale, no jump missing,
    /// every canary in place (an unchanged node's resync).
    pub fn is_empty(&self) -> bool {
        self.filter_block.is_empty() && self.nat_lines == 0 && self.canary_blocks.is_empty()
    }
}

/// Digests the rules of `text` per chain of `names` (chains of other lines are ignored).
fn digests_by_chain(names: &[&str], text: &str) -> Vec<([u8; 16], usize)> {
    let mut hashers: Vec<(ChainHasher, usize)> =
        names.iter().map(|n| (ChainHasher::new(n), 0)).collect();
    let index: HashMap<&str, usize, FastBuild> =
        names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    for line in text.lines() {
        if let Some(&i) = index.get(rule_chain(line)) {
            hashers[i].0.rule(line);
            hashers[i].1 += 1;
        }
    }
    hashers.into_iter().map(|(h, n)| (h.finish(), n)).collect()
}

/// Plans a full sync after the first pass: compares the fixed chains of nat and the filter
/// chains with `kernel` (marking the unchanged ones), finds the stale chains and the missing
/// jumps, and chooses the layout. `kernel` is `None` for a node assumed empty (a dry run).
pub fn plan(
    rendered: &Rendered,
    mut kernel: Option<&mut KernelTables>,
    measured: &Measured,
    opts: &Options,
) -> FullSync {
    let stale = stale_in_kernel(kernel.as_deref(), &rendered.active_nat_chains);

    // filter: all its chains are fixed.
    let filter_names: Vec<&str> = rendered.filter.chains.iter().collect();
    let mut filter_same = vec![false; filter_names.len()];
    let mut kept_chains = measured.kept_chains;
    if let Some(k) = kernel.as_mut().filter(|k| !k.filter.ours.is_empty()) {
        for (i, (d, _)) in digests_by_chain(&filter_names, &rendered.filter.rules)
            .iter()
            .enumerate()
        {
            if k.filter.ours.mark_same(filter_names[i], d) {
                filter_same[i] = true;
                kept_chains += 1;
            }
        }
    }
    let mut filter_block = String::with_capacity(rendered.filter.rules.len() + 1024);
    filter_block.push_str("*filter\n");
    if opts.zero_counters {
        filter_block.push_str("-Z\n");
    }
    for (i, line) in rendered.filter.chains.declarations().lines().enumerate() {
        if !filter_same.get(i).copied().unwrap_or(false) {
            filter_block.push_str(line);
            filter_block.push('\n');
        }
    }
    filter_block.push_str(&missing_jumps(
        "filter",
        kernel.as_deref().map(|k| &k.filter),
        rendered.filter.chains.contains(KUBE_FIREWALL),
    ));
    for line in rendered.filter.rules.lines() {
        let chain = rule_chain(line);
        let same = filter_names
            .iter()
            .position(|n| *n == chain)
            .is_some_and(|i| filter_same[i]);
        if !same {
            filter_block.push_str(line);
            filter_block.push('\n');
        }
    }
    filter_block.push_str("COMMIT\n");
    if filter_block == "*filter\nCOMMIT\n" {
        // Nothing to write: not even the (otherwise empty) transaction.
        filter_block.clear();
    }

    // nat's fixed and dispatch chains.
    let fixed_names: Vec<&str> = rendered
        .nat
        .chains
        .iter()
        .filter(|c| !is_service_chain(c))
        .collect();
    let digests = digests_by_chain(&fixed_names, &rendered.nat.rules);
    let mut fixed: HashMap<String, Fixed, FastBuild> = HashMap::default();
    let mut fixed_lines = 0;
    for (name, (digest, rules)) in fixed_names.iter().zip(&digests) {
        let same = kernel
            .as_mut()
            .is_some_and(|k| k.nat.ours.mark_same(name, digest));
        if same {
            kept_chains += 1;
        } else {
            fixed_lines += 1 + rules;
        }
        fixed.insert((*name).to_string(), Fixed { same, entry: false });
    }
    // Entry chains: those that reach a per-Service chain, directly or through another.
    let mut unsplit = measured.irregular.clone();
    loop {
        let mut changed = false;
        for line in rendered.nat.rules.lines() {
            let Some(t) = jump_target(line) else {
                continue;
            };
            let chain = rule_chain(line);
            let reaches = is_service_chain(t) || fixed.get(t).is_some_and(|f| f.entry);
            if reaches && let Some(f) = fixed.get_mut(chain).filter(|f| !f.entry) {
                f.entry = true;
                changed = true;
            }
            if !fixed.contains_key(chain) && unsplit.is_none() {
                unsplit = Some(format!(
                    "a rule of chain {chain}, which the ruleset does not declare"
                ));
            }
        }
        if !changed {
            break;
        }
    }
    for t in &measured.outside_targets {
        if fixed.get(t.as_str()).is_none_or(|f| f.entry) && unsplit.is_none() {
            unsplit = Some(format!("a per-Service chain jumps to chain {t}"));
        }
    }
    let nat_jumps = missing_jumps("nat", kernel.as_deref().map(|k| &k.nat), false);
    let nat_lines = fixed_lines
        + measured.lines
        + 2 * stale.len()
        + nat_jumps.lines().count()
        + usize::from(opts.zero_counters);
    let layout = match opts.split {
        Some(policy) if !opts.zero_counters && nat_lines > policy.min_lines => {
            if unsplit.is_some() {
                Layout::One
            } else {
                let existing = kernel.as_deref().map_or(0, |k| {
                    k.nat.ours.names().filter(|c| is_service_chain(c)).count()
                });
                Layout::Split {
                    budget: policy.budget(existing),
                }
            }
        }
        _ => {
            unsplit = None;
            Layout::One
        }
    };
    // The canaries: a block for each table where the canary is missing or not empty.
    let empty_canary = chain_digest(KUBE_PROXY_CANARY, []);
    let mut canary_blocks = String::new();
    for table in CANARY_TABLES {
        let there = kernel.as_deref().is_some_and(|k| {
            let t = match table {
                Table::Mangle => &k.mangle,
                Table::Nat => &k.nat,
                _ => &k.filter,
            };
            t.ours.digest(KUBE_PROXY_CANARY) == Some(empty_canary)
        });
        if !there {
            let _ = write!(
                canary_blocks,
                "*{}\n:{KUBE_PROXY_CANARY} - [0:0]\nCOMMIT\n",
                table.name()
            );
        }
    }
    FullSync {
        layout,
        stale,
        kept_chains,
        nat_lines,
        unsplit,
        zero_counters: opts.zero_counters,
        filter_block,
        canary_blocks,
        nat_jumps,
        fixed,
        any_kept: measured.kept_chains > 0,
    }
}

/// Counts the bytes written through it.
struct Counted<W> {
    inner: W,
    bytes: usize,
}

impl<W: Write> Counted<W> {
    fn put(&mut self, s: &str) -> io::Result<()> {
        self.bytes += s.len();
        self.inner.write_all(s.as_bytes())
    }
}

/// Writes the payload of a [`FullSync`] during the second render pass: [`start`](Self::start),
/// [`service`](Self::service) for every [`ServiceRules`] of a
/// [`Stream::Emit`](super::super::render::Stream::Emit) render, then [`finish`](Self::finish).
/// The first write error stops the writing and is returned by `finish`.
pub struct Writer<'a, W: Write> {
    plan: &'a FullSync,
    rendered: &'a Rendered,
    /// The kernel's nat chains, with the unchanged ones marked.
    ours: Option<&'a OurChains>,
    out: Counted<W>,
    error: Option<io::Error>,
    /// The split's block under construction: declarations, rules, lines.
    decls: String,
    rules: String,
    lines: usize,
    /// `*nat … COMMIT` blocks written (without the canary's).
    nat_transactions: usize,
}

impl<'a, W: Write> Writer<'a, W> {
    /// A writer of `plan`'s payload for `rendered` (the first pass) into `out`.
    pub fn new(
        plan: &'a FullSync,
        rendered: &'a Rendered,
        kernel: Option<&'a KernelTables>,
        out: W,
    ) -> Self {
        Writer {
            plan,
            rendered,
            ours: kernel.map(|k| &k.nat.ours).filter(|o| !o.is_empty()),
            out: Counted {
                inner: out,
                bytes: 0,
            },
            error: None,
            decls: String::new(),
            rules: String::new(),
            lines: 0,
            nat_transactions: 0,
        }
    }

    fn put(&mut self, s: &str) {
        if self.error.is_none()
            && let Err(e) = self.out.put(s)
        {
            self.error = Some(e);
        }
    }

    /// Whether the per-Service chain `name` is written.
    fn written(&self, name: &str) -> bool {
        !self.ours.is_some_and(|o| o.is_same(name))
    }

    /// Whether the fixed chain `name` is written, and whether it is an entry chain.
    fn fixed(&self, name: &str) -> (bool, bool) {
        self.plan
            .fixed
            .get(name)
            .map_or((true, true), |f| (!f.same, f.entry))
    }

    /// The fixed chains' declarations and rules that are written, of the entry chains or of
    /// the others (`entry`), or of all (`None`).
    fn fixed_part(&self, entry: Option<bool>) -> (String, String) {
        let mut decls = String::new();
        let mut rules = String::new();
        for line in self.rendered.nat.chains.declarations().lines() {
            let name = decl_name(line);
            if is_service_chain(name) {
                continue;
            }
            let (write, is_entry) = self.fixed(name);
            if write && entry.is_none_or(|e| e == is_entry) {
                decls.push_str(line);
                decls.push('\n');
            }
        }
        for line in self.rendered.nat.rules.lines() {
            let (write, is_entry) = self.fixed(rule_chain(line));
            if write && entry.is_none_or(|e| e == is_entry) {
                rules.push_str(line);
                rules.push('\n');
            }
        }
        (decls, rules)
    }

    /// Writes everything before the per-Service chains.
    pub fn start(&mut self) {
        let (plan, rendered) = (self.plan, self.rendered);
        self.put(&plan.filter_block);
        match plan.layout {
            Layout::One if plan.nat_lines == 0 => {}
            Layout::One => {
                self.put("*nat\n");
                if plan.zero_counters {
                    self.put("-Z\n");
                }
                self.nat_transactions += 1;
                // The declarations, in the render's order: all of them, or those not kept.
                let all = rendered.nat.chains.declarations();
                let every_fixed_written = plan.fixed.values().all(|f| !f.same);
                if !plan.any_kept && every_fixed_written {
                    self.put(all);
                } else {
                    for line in all.split_inclusive('\n') {
                        let name = decl_name(line);
                        let write = if is_service_chain(name) {
                            self.written(name)
                        } else {
                            self.fixed(name).0
                        };
                        if write {
                            self.put(line);
                        }
                    }
                }
                for c in &plan.stale {
                    self.put(":");
                    self.put(c);
                    self.put(" - [0:0]\n");
                }
                self.put(&plan.nat_jumps);
                if every_fixed_written {
                    self.put(&rendered.nat.rules);
                } else {
                    let (_, rules) = self.fixed_part(None);
                    self.put(&rules);
                }
            }
            Layout::Split { .. } => {
                let (decls, rules) = self.fixed_part(Some(false));
                if !decls.is_empty() || !rules.is_empty() {
                    self.block(&decls, "", &rules);
                }
            }
        }
    }

    /// Writes one `*nat … COMMIT` block.
    fn block(&mut self, decls: &str, jumps: &str, rules: &str) {
        self.nat_transactions += 1;
        self.put("*nat\n");
        self.put(decls);
        self.put(jumps);
        self.put(rules);
        self.put("COMMIT\n");
    }

    fn flush_block(&mut self) {
        if self.decls.is_empty() && self.rules.is_empty() {
            return;
        }
        let (decls, rules) = (
            std::mem::take(&mut self.decls),
            std::mem::take(&mut self.rules),
        );
        self.block(&decls, "", &rules);
        // Keep the buffers' room for the next block.
        self.decls = decls;
        self.rules = rules;
        self.decls.clear();
        self.rules.clear();
        self.lines = 0;
    }

    /// Writes (or, in the split, queues) one Service's chains that are not unchanged.
    pub fn service(&mut self, s: ServiceRules<'_>) {
        if self.error.is_some() {
            return;
        }
        let mut last: Option<(&str, bool)> = None;
        match self.plan.layout {
            Layout::One => {
                if self.ours.is_none() {
                    self.put(s.rules);
                    return;
                }
                for line in s.rules.split_inclusive('\n') {
                    let chain = rule_chain(line);
                    let write = match last {
                        Some((c, w)) if c == chain => w,
                        _ => {
                            let w = self.written(chain);
                            last = Some((chain, w));
                            w
                        }
                    };
                    if write {
                        self.put(line);
                    }
                }
            }
            Layout::Split { budget } => {
                for line in s.chains.split_inclusive('\n') {
                    if self.written(decl_name(line)) {
                        self.decls.push_str(line);
                        self.lines += 1;
                    }
                }
                for line in s.rules.split_inclusive('\n') {
                    let chain = rule_chain(line);
                    let write = match last {
                        Some((c, w)) if c == chain => w,
                        _ => {
                            let w = self.written(chain);
                            last = Some((chain, w));
                            w
                        }
                    };
                    if write {
                        self.rules.push_str(line);
                        self.lines += 1;
                    }
                }
                if self.lines >= budget {
                    self.flush_block();
                }
            }
        }
    }

    /// Writes everything after the per-Service chains and returns the bytes and the nat
    /// transactions written.
    ///
    /// # Errors
    /// The first write error.
    pub fn finish(mut self) -> io::Result<(usize, usize)> {
        let plan = self.plan;
        let stale = &plan.stale;
        match plan.layout {
            Layout::One if plan.nat_lines == 0 => {}
            Layout::One => {
                for c in stale {
                    self.put("-X ");
                    self.put(c);
                    self.put("\n");
                }
                self.put("COMMIT\n");
            }
            Layout::Split { budget } => {
                self.flush_block();
                let (decls, rules) = self.fixed_part(Some(true));
                let jumps = &plan.nat_jumps;
                if !decls.is_empty() || !rules.is_empty() || !jumps.is_empty() {
                    self.block(&decls, jumps, &rules);
                }
                // Stale chains: flushed and deleted together when they are few, else every
                // flush before any deletion.
                let together = 2 * stale.len() <= budget;
                for part in stale.chunks(budget.max(1)) {
                    self.nat_transactions += 1;
                    self.put("*nat\n");
                    for c in part {
                        self.put(":");
                        self.put(c);
                        self.put(" - [0:0]\n");
                    }
                    if together {
                        for c in part {
                            self.put("-X ");
                            self.put(c);
                            self.put("\n");
                        }
                    }
                    self.put("COMMIT\n");
                }
                if !together {
                    for part in stale.chunks(budget.max(1)) {
                        self.nat_transactions += 1;
                        self.put("*nat\n");
                        for c in part {
                            self.put("-X ");
                            self.put(c);
                            self.put("\n");
                        }
                        self.put("COMMIT\n");
                    }
                }
            }
        }
        self.put(&plan.canary_blocks);
        match self.error {
            Some(e) => Err(e),
            None => Ok((self.out.bytes, self.nat_transactions)),
        }
    }
}

/// A full sync's payload in one buffer: both render passes of `snap` against `kernel` (`None`:
/// a node without our rules), as [`IptablesProxier`](super::super::IptablesProxier) streams
/// it into the tool. For what is not sent to a kernel: the benchmark's payload of the tool
/// alone, and tests. Returns the payload, the plan and the nat transactions written.
pub fn payload(
    snap: &kp_model::Snapshot,
    cfg: &RenderConfig,
    cache: &mut RenderCache,
    mut kernel: Option<&mut KernelTables>,
    opts: &Options,
) -> (String, FullSync, usize) {
    let mut measure = Measure::new(kernel.as_deref_mut().map(|k| &mut k.nat.ours));
    let rendered = render_streamed(
        snap,
        cfg,
        cache,
        Stream::Measure(&mut |s| measure.service(s)),
    );
    let measured = measure.finish();
    let plan = plan(&rendered, kernel.as_deref_mut(), &measured, opts);
    let mut out = Vec::with_capacity(plan.nat_lines * 80 + 4096);
    let mut writer = Writer::new(&plan, &rendered, kernel.as_deref(), &mut out);
    writer.start();
    render_streamed(snap, cfg, cache, Stream::Emit(&mut |s| writer.service(s)));
    let (_, nat_transactions) = writer.finish().unwrap_or_default();
    let text = String::from_utf8(out)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    (text, plan, nat_transactions)
}
