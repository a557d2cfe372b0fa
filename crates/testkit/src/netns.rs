//! Network namespaces and the links between them.
//!
//! [`Netns`] owns one named network namespace (`/var/run/netns/NAME`, as `ip netns add`
//! creates it) and deletes it on drop. Names are `kp<pid>x<counter>-<role>`, so they are
//! unique per process and per test, and [`cleanup_stale`] can recognise namespaces left
//! behind by a process that was killed (its pid is no longer alive) and delete them; the
//! first [`Netns::new`] of a process does that once.
//!
//! Everything is done either with `ip -n NAME ...` (which enters the namespace itself) or
//! from a thread that entered the namespace with `setns(2)` ([`Netns::in_ns`],
//! [`Netns::spawn_in`]). Nothing here ever touches the root network namespace: veth pairs
//! are created inside one of our namespaces with their peer placed directly in another
//! ([`veth`]), so no interface ever appears in the root namespace, and sysctls are
//! written from a thread inside the namespace.
//!
//! In every namespace created here `lo` is up and IPv6 duplicate address detection is
//! off (`net.ipv6.conf.{all,default}.accept_dad=0`), so IPv6 addresses are usable at once.
//!
//! The standard node/client/backends layout is [`Topology`]; [`topology`] documents its
//! addressing plan.

pub mod topology;

pub use topology::{
    BackendPod, ClientHost, FamilyPlan, GATEWAY_V4, GATEWAY_V6, LAN_BRIDGE, NODE_IF, Topology,
    TopologyBuilder,
};

use std::ffi::OsStr;
use std::fs::File;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, Once, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use ipnet::IpNet;
use nix::errno::Errno;
use nix::sched::{CloneFlags, setns};
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, geteuid};

use crate::error::{Error, Result};

/// The prefix of every namespace name this crate creates (`kp<pid>x<counter>-<role>`).
pub const NAME_PREFIX: &str = "kp";

/// Where `ip netns` keeps its named namespaces.
pub const NETNS_DIR: &str = "/var/run/netns";

/// The variable that lets non-root runs skip network-namespace tests explicitly.
pub const SKIP_ENV: &str = "KP_SKIP_NETNS_TESTS";

static NS_COUNTER: AtomicU32 = AtomicU32::new(0);
static LINK_COUNTER: AtomicU32 = AtomicU32::new(0);
static STARTUP_CLEANUP: Once = Once::new();
/// `ip netns add` is serialised inside the process: concurrent first-time adds race on
/// making `/var/run/netns` a shared mount.
static ADD_LOCK: Mutex<()> = Mutex::new(());

/// Returns whether network-namespace tests can run; call it first in every such test.
///
/// Returns `true` when running as root. Otherwise panics with an explanation, unless
/// `KP_SKIP_NETNS_TESTS=1` is set, in which case it returns `false` and the test should
/// return early:
///
/// ```no_run
/// if !kp_testkit::require_root() {
///     return;
/// }
/// ```
pub fn require_root() -> bool {
    if geteuid().is_root() {
        return true;
    }
    if std::env::var(SKIP_ENV).as_deref() == Ok("1") {
        eprintln!("skipping network-namespace test: not root and {SKIP_ENV}=1");
        return false;
    }
    panic!(
        "network-namespace tests need root (CI runs them as root); set {SKIP_ENV}=1 to skip \
         them explicitly"
    );
}

/// One named network namespace, deleted on drop.
///
/// Dropping it first kills (SIGKILL) any process still running inside it (a safety net:
/// processes should be owned by a [`crate::ChildGuard`] and stopped before), then runs
/// `ip netns del`. Failures are logged with `tracing`, never panicked on. (A handle made by
/// [`Netns::attach`] deletes nothing.)
#[derive(Debug)]
pub struct Netns {
    name: String,
    role: String,
    /// Whether dropping it deletes the namespace (false for [`Netns::attach`]).
    owned: bool,
}

impl Netns {
    /// Creates the namespace `kp<pid>x<counter>-<role>` and brings `lo` up.
    ///
    /// `role` is a short label (`node`, `client`, `be0`): 1 to 20 characters out of
    /// `a-z`, `0-9` and `-`. The first call in a process deletes stale namespaces of dead
    /// processes (see [`cleanup_stale`]).
    pub fn new(role: &str) -> Result<Netns> {
        validate_role(role)?;
        let euid = geteuid();
        if !euid.is_root() {
            return Err(Error::NotRoot {
                euid: euid.as_raw(),
            });
        }
        STARTUP_CLEANUP.call_once(|| match cleanup(NAME_PREFIX, true) {
            Ok(removed) if !removed.is_empty() => {
                tracing::info!(?removed, "deleted stale network namespaces");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("cleaning up stale network namespaces: {e}"),
        });

        let n = NS_COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{NAME_PREFIX}{}x{n}-{role}", std::process::id());
        {
            let _guard = ADD_LOCK.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(first) = run_checked(Command::new("ip").args(["netns", "add", &name])) {
                // One retry: a concurrent first-time `ip netns add` in another process can
                // make the mount of /var/run/netns fail transiently.
                tracing::debug!("retrying `ip netns add {name}` after: {first}");
                std::thread::sleep(Duration::from_millis(50));
                run_checked(Command::new("ip").args(["netns", "add", &name]))?;
            }
        }
        let ns = Netns {
            name,
            role: role.to_owned(),
            owned: true,
        };
        ns.ip(["link", "set", "lo", "up"])?;
        if std::path::Path::new("/proc/sys/net/ipv6").exists() {
            ns.sysctl("net.ipv6.conf.all.accept_dad", "0")?;
            ns.sysctl("net.ipv6.conf.default.accept_dad", "0")?;
        }
        Ok(ns)
    }

    /// A handle on the existing namespace `name` that another [`Netns`] (usually in
    /// another process, such as the `test-cluster` daemon) owns: everything works as on
    /// that one, but dropping this handle changes nothing.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a name [`Netns::new`] would not have made, or one that does not
    /// exist.
    pub fn attach(name: &str) -> Result<Netns> {
        let Some((_, role)) = parse_owner_pid(NAME_PREFIX, name).and_then(|_| name.split_once('-'))
        else {
            return Err(Error::invalid(
                "namespace name",
                format!("{name:?} was not made by kp-testkit (kp<pid>x<counter>-<role>)"),
            ));
        };
        if !std::path::Path::new(NETNS_DIR).join(name).exists() {
            return Err(Error::invalid(
                "namespace name",
                format!("no network namespace {name}"),
            ));
        }
        Ok(Netns {
            name: name.to_owned(),
            role: role.to_owned(),
            owned: false,
        })
    }

    /// The namespace's name as `ip netns list` shows it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The role given to [`Netns::new`].
    pub fn role(&self) -> &str {
        &self.role
    }

    /// The namespace's bind-mount file, `/var/run/netns/NAME`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(NETNS_DIR).join(&self.name)
    }

    /// A [`Command`] running `program` inside the namespace (`ip netns exec NAME program`).
    ///
    /// `ip netns exec` execs `program` in place, so the child's pid is the program's.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// Runs `program args...` inside the namespace and returns its standard output.
    ///
    /// A non-zero exit is an [`Error::Command`] with the command line, the status and the
    /// standard error.
    pub fn run<I, S>(&self, program: &str, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        run_checked(self.command(program).args(args))
    }

    /// Runs `ip -n NAME args...` (faster than `run("ip", ...)`) and returns its stdout.
    pub fn ip<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        run_checked(Command::new("ip").args(["-n", &self.name]).args(args))
    }

    /// Sets a sysctl inside the namespace, like `sysctl -w key=value`.
    ///
    /// `key` is dotted (`net.ipv4.ip_forward`) or, if it contains `/`, a path below
    /// `/proc/sys` (for interface names with dots). The value is written to `/proc/sys`
    /// from a thread inside the namespace, so only the namespace's own copy changes.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        let path = sysctl_path(key)?;
        let value = format!("{value}\n");
        let ns = self.name.clone();
        self.in_ns(move || {
            std::fs::write(&path, value.as_bytes()).map_err(|e| {
                Error::io(
                    format!("setting sysctl {key} (writing {}) in {ns}", path.display()),
                    e,
                )
            })
        })?
    }

    /// Reads a sysctl inside the namespace (see [`Netns::sysctl`] for `key`), trimmed.
    pub fn read_sysctl(&self, key: &str) -> Result<String> {
        let path = sysctl_path(key)?;
        let ns = self.name.clone();
        self.in_ns(move || {
            std::fs::read_to_string(&path)
                .map(|s| s.trim().to_owned())
                .map_err(|e| Error::io(format!("reading sysctl {key} in {ns}"), e))
        })?
    }

    /// Runs `f` on a fresh thread that first entered this namespace, and returns its result.
    ///
    /// Sockets created by `f` belong to the namespace (and keep working from any thread
    /// afterwards). The calling thread's namespace never changes. `f` may borrow from the
    /// caller (the thread is scoped). A panic in `f` is resumed on the calling thread.
    pub fn in_ns<F, T>(&self, f: F) -> Result<T>
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        let file = self.open()?;
        let ns = &self.name;
        std::thread::scope(|scope| {
            let handle = std::thread::Builder::new()
                .name(thread_name(ns))
                .spawn_scoped(scope, move || {
                    setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| Error::Setns {
                        ns: ns.clone(),
                        source,
                    })?;
                    drop(file);
                    Ok(f())
                })
                .map_err(|e| Error::io(format!("spawning a thread for namespace {ns}"), e))?;
            match handle.join() {
                Ok(result) => result,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Spawns a long-running thread that runs `f` inside this namespace.
    ///
    /// Returns once the thread has entered the namespace (or failed to: then the error is
    /// returned and `f` is never run).
    pub fn spawn_in<F, T>(&self, f: F) -> Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let file = self.open()?;
        let ns = self.name.clone();
        let (tx, rx) = mpsc::sync_channel::<std::result::Result<(), nix::Error>>(1);
        let handle = std::thread::Builder::new()
            .name(thread_name(&ns))
            .spawn(move || {
                let entered = setns(&file, CloneFlags::CLONE_NEWNET);
                drop(file);
                let failed = entered.is_err();
                let _ = tx.send(entered);
                if failed {
                    // Unwind without running `f` (and without the panic hook's message).
                    std::panic::resume_unwind(Box::new("setns failed"));
                }
                f()
            })
            .map_err(|e| Error::io(format!("spawning a thread for namespace {ns}"), e))?;
        match rx.recv() {
            Ok(Ok(())) => Ok(handle),
            Ok(Err(source)) => {
                let _ = handle.join();
                Err(Error::Setns { ns, source })
            }
            Err(_) => {
                let _ = handle.join();
                Err(Error::Setns {
                    ns,
                    source: Errno::EINVAL,
                })
            }
        }
    }

    fn open(&self) -> Result<File> {
        let path = self.path();
        File::open(&path)
            .map_err(|e| Error::io(format!("opening network namespace {}", path.display()), e))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        kill_processes_in(&self.name);
        let mut last = None;
        for attempt in 0..3 {
            match run_checked(Command::new("ip").args(["netns", "del", &self.name])) {
                Ok(_) => return,
                Err(e) => last = Some(e),
            }
            std::thread::sleep(Duration::from_millis(20 * (attempt + 1)));
        }
        if let Some(e) = last {
            tracing::warn!("deleting network namespace {}: {e}", self.name);
        }
    }
}

/// Deletes namespaces named `<prefix><pid>x<counter>-<role>` whose `pid` is not alive.
///
/// This removes what a killed test run or sandbox left behind. Namespaces of live
/// processes (including this one) are kept. Processes still running inside a stale
/// namespace are killed first. Returns the names deleted.
pub fn cleanup_stale(prefix: &str) -> Result<Vec<String>> {
    cleanup(prefix, false)
}

fn cleanup(prefix: &str, include_own: bool) -> Result<Vec<String>> {
    let entries = match std::fs::read_dir(NETNS_DIR) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("listing {NETNS_DIR}"), e)),
    };
    let own = std::process::id();
    let mut removed = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("listing {NETNS_DIR}"), e))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let Some(pid) = parse_owner_pid(prefix, &name) else {
            continue;
        };
        // Our own pid: at process start (include_own) such a namespace can only be left
        // over from an earlier process that had the same pid.
        let stale = if pid == own {
            include_own
        } else {
            !pid_alive(pid)
        };
        if !stale {
            continue;
        }
        kill_processes_in(&name);
        match run_checked(Command::new("ip").args(["netns", "del", &name])) {
            Ok(_) => removed.push(name),
            Err(e) => tracing::warn!("deleting stale network namespace {name}: {e}"),
        }
    }
    removed.sort();
    Ok(removed)
}

/// Deletes the namespace `name` created by [`Netns::new`] in another process (one that
/// exited without dropping it, e.g. killed): kills (SIGKILL) every process still inside it,
/// then `ip netns del`. A namespace that does not exist is not an error.
///
/// # Errors
/// [`Error::Invalid`] for a name [`Netns::new`] would not have made (anything not shaped
/// `kp<pid>x<counter>-<role>`: this never deletes a namespace this crate did not create);
/// [`Error::Command`] when `ip netns del` fails.
pub fn delete_namespace(name: &str) -> Result<()> {
    if parse_owner_pid(NAME_PREFIX, name).is_none() {
        return Err(Error::invalid(
            "namespace name",
            format!("{name:?} was not made by kp-testkit (kp<pid>x<counter>-<role>)"),
        ));
    }
    if !std::path::Path::new(NETNS_DIR).join(name).exists() {
        return Ok(());
    }
    kill_processes_in(name);
    run_checked(Command::new("ip").args(["netns", "del", name])).map(drop)
}

/// The pid in a name `<prefix><pid>x<counter>-<role>`, if the name has that shape.
fn parse_owner_pid(prefix: &str, name: &str) -> Option<u32> {
    let rest = name.strip_prefix(prefix)?;
    let (pid, rest) = rest.split_once('x')?;
    let (counter, role) = rest.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(pid) || !digits(counter) || role.is_empty() {
        return None;
    }
    pid.parse().ok().filter(|&p| p > 0)
}

fn pid_alive(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    match kill(Pid::from_raw(raw), None) {
        Ok(()) => true,
        Err(Errno::ESRCH) => false,
        Err(_) => true, // EPERM: exists, owned by someone else
    }
}

/// SIGKILLs every process `ip netns pids` reports inside `name` (never this process).
fn kill_processes_in(name: &str) {
    let Ok(out) = run_checked(Command::new("ip").args(["netns", "pids", name])) else {
        return;
    };
    let own = std::process::id();
    for pid in out.split_whitespace().filter_map(|p| p.parse::<u32>().ok()) {
        if pid == own {
            continue;
        }
        let Ok(raw) = i32::try_from(pid) else {
            continue;
        };
        tracing::warn!("killing process {pid} left running in network namespace {name}");
        let _ = kill(Pid::from_raw(raw), Signal::SIGKILL);
    }
}

fn validate_role(role: &str) -> Result<()> {
    let ok = !role.is_empty()
        && role.len() <= 20
        && role
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            "namespace role",
            format!("{role:?}: use 1-20 characters out of a-z, 0-9 and '-'"),
        ))
    }
}

fn sysctl_path(key: &str) -> Result<PathBuf> {
    let ok = !key.is_empty()
        && !key.contains("..")
        && !key.starts_with(['/', '.'])
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b));
    if !ok {
        return Err(Error::invalid("sysctl key", format!("{key:?}")));
    }
    let rel = if key.contains('/') {
        key.to_owned()
    } else {
        key.replace('.', "/")
    };
    Ok(PathBuf::from("/proc/sys").join(rel))
}

fn thread_name(ns: &str) -> String {
    format!("netns-{ns}")
}

/// Runs `cmd`, returning its stdout, or an error with argv, status and stderr.
pub(crate) fn run_checked(cmd: &mut Command) -> Result<String> {
    let argv = describe(cmd);
    let out = cmd.output().map_err(|source| Error::Spawn {
        argv: argv.clone(),
        source,
    })?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let mut stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    if stderr.is_empty() {
        stderr = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    }
    Err(Error::Command {
        argv,
        status: out.status,
        stderr,
    })
}

/// A command line for messages.
pub(crate) fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Creates a veth pair `a_if` (in `a`) ↔ `b_if` (in `b`) and brings both ends up.
///
/// The pair is created inside `a` with its peer placed directly in `b`
/// (`ip -n A link add A_IF type veth peer name B_IF netns B`), so it never exists in the
/// root namespace. Interface names must be at most 15 bytes and unique inside their
/// namespace.
pub fn veth(a: &Netns, a_if: &str, b: &Netns, b_if: &str) -> Result<()> {
    for name in [a_if, b_if] {
        if name.is_empty() || name.len() > 15 || name.contains(['/', ' ']) {
            return Err(Error::invalid(
                "interface name",
                format!("{name:?}: use 1-15 characters, no '/' or spaces"),
            ));
        }
    }
    if a.name() == b.name() {
        return Err(Error::invalid(
            "veth pair",
            format!("both ends in the same namespace {}", a.name()),
        ));
    }
    a.ip([
        "link",
        "add",
        a_if,
        "type",
        "veth",
        "peer",
        "name",
        b_if,
        "netns",
        b.name(),
    ])?;
    a.ip(["link", "set", a_if, "up"])?;
    b.ip(["link", "set", b_if, "up"])?;
    Ok(())
}

/// Links two namespaces with a new veth pair, assigns `a_addr`/`b_addr` and brings both
/// ends up; returns the interface names `(in a, in b)`, `kp<n>a` and `kp<n>b`.
///
/// Works for IPv4 and IPv6 (IPv6 addresses are added with `nodad`).
pub fn link(a: &Netns, a_addr: IpNet, b: &Netns, b_addr: IpNet) -> Result<(String, String)> {
    let n = LINK_COUNTER.fetch_add(1, Ordering::Relaxed);
    let (a_if, b_if) = (format!("kp{n}a"), format!("kp{n}b"));
    veth(a, &a_if, b, &b_if)?;
    add_address(a, &a_if, a_addr)?;
    add_address(b, &b_if, b_addr)?;
    Ok((a_if, b_if))
}

/// Adds `addr` (with its prefix length) to `dev` in `ns`; IPv6 addresses get `nodad`.
pub fn add_address(ns: &Netns, dev: &str, addr: IpNet) -> Result<()> {
    let addr = addr.to_string();
    let mut args = vec!["addr", "add", addr.as_str(), "dev", dev];
    if addr.contains(':') {
        args.push("nodad");
    }
    ns.ip(args).map(drop)
}

/// Adds a route to `dest` via the gateway `via` in `ns` (`ip route add DEST via VIA`).
///
/// `dest` is truncated to its network (`10.96.0.1/12` means `10.96.0.0/12`).
pub fn add_route(ns: &Netns, dest: IpNet, via: IpAddr) -> Result<()> {
    ns.ip([
        "route",
        "add",
        &dest.trunc().to_string(),
        "via",
        &via.to_string(),
    ])
    .map(drop)
}

/// Adds a directly connected route to `dest` over `dev` in `ns`
/// (`ip route add DEST dev DEV [src SRC]`).
pub fn add_route_dev(ns: &Netns, dest: IpNet, dev: &str, src: Option<IpAddr>) -> Result<()> {
    let dest = dest.trunc().to_string();
    let src = src.map(|s| s.to_string());
    let mut args = vec!["route", "add", dest.as_str(), "dev", dev];
    if let Some(src) = &src {
        args.extend(["src", src.as_str()]);
    }
    ns.ip(args).map(drop)
}

/// The names of all namespaces `ip netns list` shows (without the `(id: N)` suffix).
pub fn list_namespaces() -> Result<Vec<String>> {
    let out = run_checked(Command::new("ip").args(["netns", "list"]))?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_is_parsed_only_from_our_names() {
        assert_eq!(parse_owner_pid("kp", "kp1234x0-node"), Some(1234));
        assert_eq!(parse_owner_pid("kp", "kp1234x17-be-0"), Some(1234));
        assert_eq!(parse_owner_pid("kp", "kpnf-explore-1"), None);
        assert_eq!(parse_owner_pid("kp", "kp1234x-node"), None);
        assert_eq!(parse_owner_pid("kp", "kp1234x3-"), None);
        assert_eq!(parse_owner_pid("kp", "kpx3-node"), None);
        assert_eq!(parse_owner_pid("kp", "kp0x3-node"), None);
        assert_eq!(parse_owner_pid("kp", "other1x1-node"), None);
        assert_eq!(parse_owner_pid("kp", "kp12a4x1-node"), None);
    }

    #[test]
    fn roles_and_sysctl_keys_are_validated() {
        assert!(validate_role("be0").is_ok());
        assert!(validate_role("").is_err());
        assert!(validate_role("Node").is_err());
        assert!(validate_role("a/b").is_err());
        assert!(validate_role(&"x".repeat(21)).is_err());
        assert_eq!(
            sysctl_path("net.ipv4.ip_forward").unwrap(),
            PathBuf::from("/proc/sys/net/ipv4/ip_forward")
        );
        assert_eq!(
            sysctl_path("net/ipv4/conf/eth0.5/rp_filter").unwrap(),
            PathBuf::from("/proc/sys/net/ipv4/conf/eth0.5/rp_filter")
        );
        assert!(sysctl_path("../etc/passwd").is_err());
        assert!(sysctl_path("/etc/passwd").is_err());
        assert!(sysctl_path("net.ipv4 x").is_err());
    }
}
