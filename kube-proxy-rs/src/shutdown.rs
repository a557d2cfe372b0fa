//! Stopping the daemon within a bound, whatever a sync is doing.
//!
//! A sync runs on a blocking thread and writes the kernel through external commands
//! (`iptables-restore`, `nft -f`, `ipset restore`); the sync loops stop between syncs
//! ([`kp_runtime::Activity`]). Upstream kube-proxy simply exits on SIGTERM, leaving a restore
//! in flight to its fate. Here, on SIGTERM or SIGINT (or another reason to stop), the daemon
//! says what is in flight: which family's sync, for how long, and the commands it is running
//! ([`in_flight`]). It waits up to [`SHUTDOWN_WAIT`] (10 s, well inside Kubernetes' default
//! 30 s termination grace period) for it to finish; a second signal ends the wait at once.
//! Then it kills those commands ([`kill`]) and exits.
//!
//! Nothing is half-applied by that: each `*table ... COMMIT` block of `iptables-restore` is
//! one atomic kernel transaction, as is an `nft -f` script and an `ipset restore`. A killed
//! command commits nothing of the transaction it was in; transactions it committed before
//! (a large nat table on nf_tables is written in several, ordered so that every state in
//! between is correct) stay. The kernel keeps the rules of the last transaction that
//! finished, and the next start's first sync rewrites everything.
//!
//! The commands are found as this process's children in `/proc` (each `/proc/PID/stat`
//! names its parent), so nothing has to register them; the runners reap them. The namespace
//! test `sigterm_during_a_restore_that_does_not_finish_is_bounded_*` (tests/netns.rs) checks
//! the whole path: the log naming the command, the bound, the kill, the kernel's rules.

use std::time::Duration;

use kp_runtime::Activity;

/// How long the daemon waits for a sync in flight before it kills its commands and exits.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);

/// A process the daemon started that is still running: its pid and command line (its
/// arguments joined with spaces, escaped for the log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Child {
    /// Its process id.
    pub pid: i32,
    /// Its command line.
    pub command: String,
}

/// This process's running children, read from `/proc` (empty if it cannot be read).
pub fn children() -> Vec<Child> {
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out: Vec<Child> = dir
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| parent_of(*pid) == Some(me))
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            // A zombie (exited, not yet reaped) has an empty command line: not running.
            if raw.is_empty() {
                return None;
            }
            let words: Vec<String> = raw
                .split(|b| *b == 0)
                .filter(|w| !w.is_empty())
                .map(|w| String::from_utf8_lossy(w).into_owned())
                .collect();
            Some(Child {
                pid,
                command: kp_model::escape(&words.join(" ")).into_owned(),
            })
        })
        .collect();
    out.sort_by_key(|c| c.pid);
    out
}

/// The parent pid of `pid` (`/proc/PID/stat`'s fourth field, after the command name in
/// parentheses, which may itself hold spaces and parentheses).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// What the daemon is busy with, one line per sync loop that is in the middle of something
/// (`the IPv4 full sync (running for 2.3 s)`), followed by the commands it runs
/// (`iptables-nft-restore --noflush --counters --wait=5 (pid 1234)`); empty when idle.
pub fn in_flight(activities: &[Activity]) -> (Vec<String>, Vec<Child>) {
    let busy: Vec<String> = activities
        .iter()
        .filter_map(Activity::current)
        .map(|b| {
            format!(
                "the {} {} (running for {:.1} s)",
                b.family,
                b.work,
                b.since.elapsed().as_secs_f64()
            )
        })
        .collect();
    (busy, children())
}

/// Logs that the daemon stops (`why`: `SIGTERM`, `the --config file changed`, ...) and what
/// it waits for, if anything.
pub fn log_stopping(why: &str, activities: &[Activity]) {
    let (busy, children) = in_flight(activities);
    if busy.is_empty() && children.is_empty() {
        tracing::debug!("{why}: stopping");
        return;
    }
    let commands = describe(&children);
    // Information, not a warning: a sync in flight is normal; not finishing it is the error.
    tracing::info!(
        "{why}: waiting up to {} s for {} to finish{}; each restore is atomic per transaction, so if it is cut short the kernel keeps the rules of the last one that finished",
        SHUTDOWN_WAIT.as_secs(),
        if busy.is_empty() {
            "the commands in flight".to_string()
        } else {
            busy.join(" and ")
        },
        if commands.is_empty() {
            String::new()
        } else {
            format!(" ({commands})")
        }
    );
}

/// `cmd (pid N), cmd (pid M)`.
fn describe(children: &[Child]) -> String {
    children
        .iter()
        .map(|c| format!("{} (pid {})", c.command, c.pid))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The wait is over (`reason`: it ran out, or a second signal came): logs what is still in
/// flight and kills its commands (SIGKILL), so that none of them commits anything later.
pub fn give_up(reason: &str, activities: &[Activity]) {
    let (busy, children) = in_flight(activities);
    if busy.is_empty() && children.is_empty() {
        return;
    }
    tracing::error!(
        "{reason}: exiting with {} unfinished{}; the kernel keeps the rules of the last transaction that finished, and the next start rewrites everything",
        if busy.is_empty() {
            "the commands in flight".to_string()
        } else {
            busy.join(" and ")
        },
        if children.is_empty() {
            String::new()
        } else {
            format!(", killing {}", describe(&children))
        }
    );
    kill(&children);
}

/// Sends SIGKILL to each of `children` that is still this process's child.
pub fn kill(children: &[Child]) {
    let me = std::process::id() as i32;
    for c in children {
        // Checked again just before: a pid that was reaped meanwhile may be someone else's.
        if parent_of(c.pid) == Some(me) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}
