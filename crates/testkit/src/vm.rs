//! Running tests in a qemu guest with a real IPVS kernel.
//!
//! This machine's kernel (and CI's) has no IPVS, no dummy links and no module support, so
//! IPVS-mode tests run in a guest: Debian's stock kernel (prepared once by
//! `scripts/install-deps` into [`CACHE_DIR`]) booted under qemu's software emulation (TCG).
//! The guest sees the host's own root filesystem, so it runs the host's test executables
//! and tools (`ip`, `ipvsadm`, `iptables`, `ipset`, ...) unchanged:
//!
//! * qemu boots the uncompressed `vmlinux` directly (PVH) with a small initramfs built here
//!   (static busybox, the virtio/9p/overlay modules and an `/init`);
//! * the host's `/` is shared read-only over 9p and covered by a tmpfs overlay, so the
//!   guest can write anywhere and everything written is discarded at power-off; `/run` is
//!   a fresh tmpfs (private `ip netns` and xtables lock), `/proc`, `/sys`, `/dev` are the
//!   guest's own, `/lib/modules/<guest version>` comes from the prepared package;
//! * the modules kube-proxy needs ([`GUEST_MODULES`] plus every `ip_vs_*` scheduler,
//!   `ip_set_*` type and `nft_*` expression) are loaded, `lo` is up;
//! * one command runs chrooted into that view with the caller's environment and working
//!   directory; its stdout and stderr are files on a second, writable 9p share (followed
//!   from the host while the guest runs), and so is its exit status: qemu's own exit status
//!   says nothing about the guest.
//!
//! [`GuestCommand`] runs one command that way; [`run_tests`] is the `main` of a
//! `harness = false` test target whose trials need IPVS: it runs them directly where the
//! kernel has IPVS (inside the guest, or a host that has it) and otherwise boots the guest
//! once and runs the same test executable, with the same arguments, inside it.
//!
//! Guarantees: every qemu runs with a timeout, is killed when its [`GuestCommand::run`]
//! returns or unwinds, when its [`GuestCommand::interrupt_on`] flag is set (e.g. by a Ctrl-C
//! handler), and (through `setpriv --pdeathsig KILL`) when the process that started it dies.
//! qemu runs in a process group of its own, so a terminal's Ctrl-C reaches only the caller.
//! Nothing is created on the host but a temporary run directory.
//!
//! ```no_run
//! use kp_testkit::vm::GuestCommand;
//!
//! let out = GuestCommand::new("/usr/sbin/ipvsadm").arg("-Ln").run()?;
//! assert_eq!(out.code, 0);
//! println!("booted in {:?}", out.boot);
//! # Ok::<(), kp_testkit::Error>(())
//! ```
//!
//! Environment variables (all optional): [`KERNEL_DIR_ENV`] (another prepared kernel
//! directory), [`FORCE_ENV`] (boot the guest even where the host has IPVS), [`KEEP_ENV`]
//! (keep the run directory with the console log), [`APPEND_ENV`] (extra kernel arguments),
//! [`CONSOLE_ENV`] (copy the guest's console
//! to stderr while it runs), [`TIMEOUT_ENV`] (seconds, for [`run_tests`]). See docs/vm.md.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Where `scripts/install-deps` prepares guest kernels: `CACHE_DIR/<version>/` holds the
/// unpacked Debian package plus `vmlinux`, and `CACHE_DIR/current` links to the one in use.
pub const CACHE_DIR: &str = "/var/cache/kube-proxy-rs/vm";

/// Set to `1` in the guest command's environment: the process runs inside the guest.
pub const GUEST_ENV: &str = "KP_VM_GUEST";
/// A prepared kernel directory to use instead of `CACHE_DIR/current`.
pub const KERNEL_DIR_ENV: &str = "KP_VM_KERNEL_DIR";
/// `1`: [`run_tests`] boots the guest even when the host kernel has IPVS.
pub const FORCE_ENV: &str = "KP_VM_FORCE";
/// `1`: keep every run directory (console log, the guest scripts, output files).
pub const KEEP_ENV: &str = "KP_VM_KEEP";
/// `1`: copy the guest's serial console to stderr while it runs.
pub const CONSOLE_ENV: &str = "KP_VM_CONSOLE";
/// Extra kernel command-line arguments, e.g. `loglevel=7` to see the boot messages.
pub const APPEND_ENV: &str = "KP_VM_APPEND";
/// The timeout of [`run_tests`]'s guest in seconds (default 1800).
pub const TIMEOUT_ENV: &str = "KP_VM_TIMEOUT";

/// The default timeout of one guest run (boot, command, power-off).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// The default guest memory in MiB.
pub const DEFAULT_MEMORY_MIB: u32 = 2048;

/// Modules loaded in the guest by name, besides every module whose name starts with one of
/// [`GUEST_MODULE_PREFIXES`]. Their dependencies are loaded too; names the kernel has
/// built in are skipped.
pub const GUEST_MODULES: &[&str] = &[
    // libcrc32c (nf_conntrack, nf_tables, ip_vs) asks the crypto API for crc32c.
    "crc32c_generic",
    "ip_vs",
    "dummy",
    "veth",
    "bridge",
    "br_netfilter",
    "nf_conntrack",
    "nf_conntrack_netlink",
    "nf_nat",
    "nf_tables",
    "nft_compat",
    "nfnetlink_acct",
    "ip_tables",
    "iptable_nat",
    "iptable_filter",
    "iptable_mangle",
    "iptable_raw",
    "ip6_tables",
    "ip6table_nat",
    "ip6table_filter",
    "ip6table_mangle",
    "ip6table_raw",
    "ipt_REJECT",
    "ip6t_REJECT",
    "ip_set",
    "xt_set",
    "xt_statistic",
    "xt_recent",
    "xt_physdev",
    "xt_comment",
    "xt_addrtype",
    "xt_conntrack",
    "xt_state",
    "xt_mark",
    "xt_MASQUERADE",
    "xt_nat",
    "xt_REDIRECT",
    "xt_multiport",
    "xt_nfacct",
    "xt_tcpudp",
    "xt_CT",
    "xt_limit",
    "xt_NFLOG",
    "xt_LOG",
    "xt_ipvs",
];

/// Module name prefixes loaded in full: IPVS schedulers, ipset types, nftables expressions.
pub const GUEST_MODULE_PREFIXES: &[&str] = &["ip_vs_", "ip_set_", "nft_"];

/// Modules never loaded although a prefix matches (application helpers nobody needs).
const SKIPPED_MODULES: &[&str] = &["ip_vs_ftp", "ip_vs_pe_sip"];

/// Modules the initramfs loads before it can mount the shares.
const BOOT_MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p", "overlay"];

/// Mount tags of the two 9p shares.
const ROOT_TAG: &str = "kphostroot";
const CTL_TAG: &str = "kpctl";

/// Where the run directory appears inside the guest command's root.
const GUEST_CTL: &str = "/run/kp-vm";

static RUN_COUNTER: AtomicU32 = AtomicU32::new(0);

/// Returns whether this process runs inside the test guest ([`GUEST_ENV`] is `1`).
pub fn in_guest() -> bool {
    std::env::var_os(GUEST_ENV).is_some_and(|v| v == "1")
}

/// Returns whether this kernel can run IPVS tests itself: IPVS is present and dummy links
/// can be made.
///
/// Conservative: `true` only when, in a throwaway network namespace (`unshare --net`, gone
/// when the probe exits), `/proc/net/ip_vs` exists (the `ip_vs` module is loaded or built
/// in) and `ip link add ... type dummy` succeeds. Needs root; `false` otherwise. Inside the
/// guest this is `true`. The result is computed once per process.
pub fn host_has_ipvs() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        if !nix::unistd::geteuid().is_root() || !Path::new("/proc/net/ip_vs").exists() {
            return false;
        }
        Command::new("unshare")
            .args([
                "--net",
                "sh",
                "-c",
                "test -e /proc/net/ip_vs && ip link add kpprobe0 type dummy",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// A guest kernel prepared by `scripts/install-deps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestKernel {
    /// The kernel release, e.g. `6.1.0-57-amd64` (`uname -r` in the guest).
    pub version: String,
    /// The prepared directory (symlinks resolved): holds `vmlinux` and
    /// `lib/modules/<version>/` with a `modules.dep`.
    pub dir: PathBuf,
}

impl GuestKernel {
    /// Finds the prepared kernel: [`KERNEL_DIR_ENV`] if set, else `CACHE_DIR/current`.
    ///
    /// Errors with [`Error::VmUnavailable`] (telling to run `scripts/install-deps`) when the
    /// directory, its `vmlinux` or its `modules.dep` is missing.
    pub fn locate() -> Result<GuestKernel> {
        let dir = std::env::var_os(KERNEL_DIR_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(CACHE_DIR).join("current"));
        let dir = std::fs::canonicalize(&dir).map_err(|e| {
            Error::vm_unavailable(format!(
                "no prepared guest kernel at {}: {e}",
                dir.display()
            ))
        })?;
        let modules = dir.join("lib/modules");
        let version = std::fs::read_dir(&modules)
            .map_err(|e| Error::vm_unavailable(format!("reading {}: {e}", modules.display())))?
            .filter_map(|e| e.ok())
            .filter(|e| e.path().join("modules.dep").is_file())
            .filter_map(|e| e.file_name().into_string().ok())
            .max()
            .ok_or_else(|| {
                Error::vm_unavailable(format!(
                    "no lib/modules/<version>/modules.dep under {}",
                    dir.display()
                ))
            })?;
        let kernel = GuestKernel { version, dir };
        if !kernel.vmlinux().is_file() {
            return Err(Error::vm_unavailable(format!(
                "{} is missing",
                kernel.vmlinux().display()
            )));
        }
        Ok(kernel)
    }

    /// The uncompressed kernel image qemu boots.
    pub fn vmlinux(&self) -> PathBuf {
        self.dir.join("vmlinux")
    }

    /// `lib/modules/<version>` of the prepared package.
    pub fn modules_dir(&self) -> PathBuf {
        self.dir.join("lib/modules").join(&self.version)
    }
}

/// What a guest run produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestOutput {
    /// The command's exit code (128 + N when killed by signal N; 125 when the working
    /// directory did not exist in the guest, 127 when the program was not found).
    pub code: i32,
    /// Everything the command wrote to its standard output.
    pub stdout: Vec<u8>,
    /// Everything the command wrote to its standard error.
    pub stderr: Vec<u8>,
    /// From starting qemu to the command starting in the guest (boot and setup overhead).
    pub boot: Duration,
    /// From starting qemu to qemu's exit.
    pub elapsed: Duration,
}

impl GuestOutput {
    /// The standard output as text (invalid UTF-8 replaced).
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// The standard error as text (invalid UTF-8 replaced).
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// One command to run in a freshly booted guest; build it, then call [`GuestCommand::run`].
///
/// By default it gets this process's environment (plus `KP_VM_GUEST=1`) and working
/// directory, a [`DEFAULT_TIMEOUT`] and [`DEFAULT_MEMORY_MIB`] of guest memory, and its
/// output is captured, not streamed. It runs as root with stdin from `/dev/null`.
#[derive(Debug, Clone)]
pub struct GuestCommand {
    program: OsString,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    cwd: Option<PathBuf>,
    timeout: Duration,
    memory_mib: u32,
    stream: bool,
    interrupt: Option<Arc<AtomicBool>>,
}

impl GuestCommand {
    /// A command running `program` (a path, or a name looked up in the guest's `PATH`,
    /// which is this process's).
    pub fn new(program: impl AsRef<OsStr>) -> GuestCommand {
        GuestCommand {
            program: program.as_ref().to_owned(),
            args: Vec::new(),
            env: std::env::vars_os().collect(),
            cwd: None,
            timeout: DEFAULT_TIMEOUT,
            memory_mib: DEFAULT_MEMORY_MIB,
            stream: false,
            interrupt: None,
        }
    }

    /// Adds one argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    /// Adds arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Sets (or replaces) one environment variable.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        let key = key.as_ref().to_owned();
        self.env.retain(|(k, _)| *k != key);
        self.env.push((key, value.as_ref().to_owned()));
        self
    }

    /// Removes one environment variable.
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Self {
        let key = key.as_ref();
        self.env.retain(|(k, _)| k != key);
        self
    }

    /// Starts from an empty environment (`KP_VM_GUEST=1` is still set).
    pub fn env_clear(mut self) -> Self {
        self.env.clear();
        self
    }

    /// The working directory in the guest (a host path: the guest sees the host's tree);
    /// default: this process's.
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// The whole run's limit: boot, command and power-off. qemu is killed when it is
    /// exceeded and [`GuestCommand::run`] fails.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Guest memory in MiB (default [`DEFAULT_MEMORY_MIB`]; the overlay's writes live in it).
    pub fn memory_mib(mut self, mib: u32) -> Self {
        self.memory_mib = mib;
        self
    }

    /// Also copy the command's stdout and stderr to this process's while it runs
    /// (written straight to the file descriptors, not through libtest's capture).
    pub fn stream(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }

    /// Stops the run as soon as `flag` is `true` (e.g. set by a Ctrl-C handler): qemu is
    /// killed and reaped at once, everything in the guest goes with it, and
    /// [`GuestCommand::run`] returns [`Error::VmInterrupted`] (the output so far was
    /// streamed, if streaming).
    pub fn interrupt_on(mut self, flag: Arc<AtomicBool>) -> Self {
        self.interrupt = Some(flag);
        self
    }

    /// Boots the guest, runs the command, powers the guest off, and returns the command's
    /// exit code and output. Needs root (qemu's 9p export of `/` must read every file).
    ///
    /// Errors: [`Error::NotRoot`]; [`Error::VmUnavailable`] when qemu, busybox or the
    /// prepared kernel is missing (run `scripts/install-deps`); [`Error::VmFailed`] when the
    /// guest did not report an exit status in time (timeout, kernel panic, setup failure),
    /// with the end of the console log; [`Error::Io`] for the run directory.
    pub fn run(&self) -> Result<GuestOutput> {
        let euid = nix::unistd::geteuid();
        if !euid.is_root() {
            return Err(Error::NotRoot {
                euid: euid.as_raw(),
            });
        }
        let kernel = GuestKernel::locate()?;
        let qemu = find_program("qemu-system-x86_64").ok_or_else(|| {
            Error::vm_unavailable("qemu-system-x86_64 is not installed".to_owned())
        })?;
        let busybox = Path::new("/bin/busybox");
        if !busybox.is_file() {
            return Err(Error::vm_unavailable(
                "/bin/busybox (busybox-static) is not installed".to_owned(),
            ));
        }
        let cwd = match &self.cwd {
            Some(c) => c.clone(),
            None => std::env::current_dir()
                .map_err(|e| Error::io("reading the current directory", e))?,
        };
        let deps = ModulesDep::read(&kernel.modules_dir())?;
        let run = RunDir::create()?;
        let boot_modules = deps.closure(BOOT_MODULES)?;
        let initramfs = build_initramfs(
            &std::fs::read(busybox).map_err(|e| Error::io("reading /bin/busybox", e))?,
            &deps,
            &boot_modules,
        )?;
        run.write("initramfs.cpio", &initramfs)?;
        let guest_modules = deps.guest_modules();
        run.write(
            "stage.sh",
            &stage_script(&kernel, &guest_modules, self.memory_mib),
        )?;
        run.write("cmd.sh", &self.command_script(&cwd))?;
        for name in ["stdout", "stderr"] {
            run.write(name, b"")?;
        }

        let mut cmd = qemu_command(&qemu, &kernel, &run.path, self.memory_mib);
        let start = Instant::now();
        let child = cmd.spawn().map_err(|source| Error::Spawn {
            argv: crate::netns::describe(&cmd),
            source,
        })?;
        let mut qemu_guard = QemuGuard(Some(child));
        let mut stdout = Follow::new(run.path.join("stdout"), self.stream.then_some(Sink::Stdout));
        let mut stderr = Follow::new(run.path.join("stderr"), self.stream.then_some(Sink::Stderr));
        let console_sink =
            (std::env::var_os(CONSOLE_ENV).is_some_and(|v| v == "1")).then_some(Sink::Stderr);
        let mut console = Follow::new(run.path.join("console.log"), console_sink);
        let started = run.path.join("started");
        let mut boot = None;
        let interrupted = || {
            self.interrupt
                .as_ref()
                .is_some_and(|f| f.load(Ordering::SeqCst))
        };
        let exited = loop {
            if interrupted() {
                qemu_guard.kill();
                stdout.pump();
                stderr.pump();
                return Err(Error::VmInterrupted {
                    after: start.elapsed(),
                });
            }
            let status = qemu_guard.try_wait();
            if boot.is_none() && started.exists() {
                boot = Some(start.elapsed());
            }
            stdout.pump();
            stderr.pump();
            console.pump();
            if let Some(status) = status {
                // qemu also stops on a SIGINT of its own (Ctrl-C in a terminal reaches the
                // whole process group): that is the interrupt too, not a guest failure.
                if interrupted() {
                    return Err(Error::VmInterrupted {
                        after: start.elapsed(),
                    });
                }
                break Some(status);
            }
            if start.elapsed() > self.timeout {
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let elapsed = start.elapsed();
        qemu_guard.kill();
        stdout.pump();
        stderr.pump();
        console.pump();

        let status_file = run.path.join("status");
        let code = std::fs::read_to_string(&status_file)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        match (exited, code) {
            (Some(_), Some(code)) => Ok(GuestOutput {
                code,
                stdout: stdout.captured,
                stderr: stderr.captured,
                boot: boot.unwrap_or(elapsed),
                elapsed,
            }),
            (exited, _) => {
                let message = match exited {
                    None => format!("timed out after {:?}", self.timeout),
                    Some(status) => format!("the guest stopped ({status}) without an exit status"),
                };
                Err(run.failed(message))
            }
        }
    }

    /// The script run (by the host's `/bin/sh`) inside the guest's view of the host.
    fn command_script(&self, cwd: &Path) -> Vec<u8> {
        let mut s = Vec::new();
        s.extend_from_slice(b"cd ");
        s.extend(sh_quote(cwd.as_os_str().as_bytes()));
        s.extend_from_slice(b" || exit 125\n: >");
        s.extend_from_slice(GUEST_CTL.as_bytes());
        s.extend_from_slice(b"/started\nexec /usr/bin/env -i");
        let mut env: Vec<&(OsString, OsString)> =
            self.env.iter().filter(|(k, _)| k != GUEST_ENV).collect();
        env.sort();
        for (k, v) in env {
            if k.is_empty() || k.as_bytes().contains(&b'=') {
                continue;
            }
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            s.push(b' ');
            s.extend(sh_quote(&kv));
        }
        s.extend_from_slice(format!(" {GUEST_ENV}=1 ").as_bytes());
        s.extend(sh_quote(self.program.as_bytes()));
        for a in &self.args {
            s.push(b' ');
            s.extend(sh_quote(a.as_bytes()));
        }
        s.extend_from_slice(
            format!(" </dev/null >{GUEST_CTL}/stdout 2>{GUEST_CTL}/stderr\n").as_bytes(),
        );
        s
    }
}

/// The `main` of a `harness = false` test target whose trials need IPVS.
///
/// Inside the guest, or when [`host_has_ipvs`] (and [`FORCE_ENV`] is not `1`), the trials
/// run right here with libtest-mimic: filters, `--exact`, `--skip`, `--ignored`, `--list`,
/// `--test-threads` work as with libtest (inside the guest the default is one thread), and
/// the usual `test result: ok. N passed; 0 failed; ...` line is printed. Otherwise, unless
/// `--list` was asked or the filters leave no trial to run, the guest is booted once to run
/// this same executable with the same arguments; its output is streamed and its exit code
/// becomes this process's. The guest's timeout is [`TIMEOUT_ENV`] seconds (default 1800).
///
/// Never skips: without root, qemu or the prepared kernel it prints why (and that
/// `scripts/install-deps` prepares the guest) and exits with 101, like a failed test run.
///
/// ```no_run
/// use libtest_mimic::{Failed, Trial};
///
/// fn dummy_link() -> Result<(), Failed> {
///     let ns = kp_testkit::Netns::new("t-dummy")?;
///     ns.ip(["link", "add", "kube-ipvs0", "type", "dummy"])?;
///     Ok(())
/// }
///
/// fn main() {
///     kp_testkit::vm::run_tests(vec![Trial::test("dummy_link", dummy_link)]);
/// }
/// ```
pub fn run_tests(trials: Vec<libtest_mimic::Trial>) -> ! {
    let mut args = libtest_mimic::Arguments::from_args();
    let force = std::env::var_os(FORCE_ENV).is_some_and(|v| v == "1");
    let nothing_to_run = trials
        .iter()
        .all(|t| args.is_filtered_out(t) || args.is_ignored(t));
    if in_guest() || args.list || nothing_to_run || (!force && host_has_ipvs()) {
        if in_guest()
            && args.test_threads.is_none()
            && std::env::var_os("RUST_TEST_THREADS").is_none()
        {
            args.test_threads = Some(1);
        }
        libtest_mimic::run(&args, trials).exit();
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => fail_run(&format!("cannot find this test executable: {e}")),
    };
    let timeout = std::env::var(TIMEOUT_ENV)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(Duration::from_secs(1800), Duration::from_secs);
    eprintln!(
        "kp-testkit vm: this kernel has no IPVS; running {} in a qemu guest",
        exe.file_name().unwrap_or_default().to_string_lossy()
    );
    let out = GuestCommand::new(&exe)
        .args(std::env::args_os().skip(1))
        .timeout(timeout)
        .stream(true)
        .run();
    match out {
        Ok(out) => {
            eprintln!(
                "kp-testkit vm: guest exit code {}; boot {:.1} s, total {:.1} s",
                out.code,
                out.boot.as_secs_f64(),
                out.elapsed.as_secs_f64()
            );
            std::process::exit(out.code);
        }
        Err(e @ Error::VmFailed { .. }) => {
            eprintln!("error: the IPVS test guest failed: {e}");
            eprintln!(
                "error: see docs/vm.md (debugging): {KEEP_ENV}=1 keeps the run directory, \
                 {CONSOLE_ENV}=1 shows the console, {TIMEOUT_ENV} sets the timeout"
            );
            std::process::exit(101);
        }
        Err(Error::NotRoot { euid }) => fail_run(&format!(
            "the qemu guest needs root (current euid {euid}); the README's test command runs \
             as root"
        )),
        Err(e) => fail_run(&e.to_string()),
    }
}

fn fail_run(message: &str) -> ! {
    eprintln!("error: IPVS tests cannot run: {message}");
    eprintln!(
        "error: these tests are never skipped; as root, run scripts/install-deps (it installs \
         qemu and prepares the guest kernel), then run the tests as root"
    );
    std::process::exit(101);
}

/// Kills and reaps qemu on drop.
struct QemuGuard(Option<Child>);

impl QemuGuard {
    fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        let child = self.0.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => {
                self.0 = None;
                Some(status)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!("waiting for qemu: {e}");
                None
            }
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for QemuGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A temporary directory shared writable with the guest; removed on drop unless kept.
struct RunDir {
    path: PathBuf,
    keep: bool,
}

impl RunDir {
    fn create() -> Result<RunDir> {
        let n = RUN_COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("kp-vm-{}-{n}", std::process::id()));
        if path.exists() {
            let _ = std::fs::remove_dir_all(&path);
        }
        std::fs::create_dir_all(&path)
            .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
        let keep = std::env::var_os(KEEP_ENV).is_some_and(|v| v == "1");
        Ok(RunDir { path, keep })
    }

    fn write(&self, name: &str, data: &[u8]) -> Result<()> {
        let path = self.path.join(name);
        std::fs::write(&path, data).map_err(|e| Error::io(format!("writing {}", path.display()), e))
    }

    /// An [`Error::VmFailed`] with the end of the console log; the directory is kept.
    fn failed(mut self, message: String) -> Error {
        self.keep = true;
        let console = self.path.join("console.log");
        let log = std::fs::read(&console).unwrap_or_default();
        let log = String::from_utf8_lossy(&log);
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(30)..].join("\n");
        Error::VmFailed {
            message,
            console,
            tail,
        }
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("kp-testkit vm: kept run directory {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

#[derive(Clone, Copy)]
enum Sink {
    Stdout,
    Stderr,
}

/// Follows a file the guest appends to, capturing and optionally copying new bytes.
struct Follow {
    path: PathBuf,
    file: Option<File>,
    sink: Option<Sink>,
    captured: Vec<u8>,
}

impl Follow {
    fn new(path: PathBuf, sink: Option<Sink>) -> Follow {
        Follow {
            path,
            file: None,
            sink,
            captured: Vec::new(),
        }
    }

    fn pump(&mut self) {
        if self.file.is_none() {
            self.file = File::open(&self.path).ok();
        }
        let Some(file) = &mut self.file else {
            return;
        };
        let mut buf = [0u8; 64 * 1024];
        loop {
            match file.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let chunk = &buf[..n];
                    match self.sink {
                        Some(Sink::Stdout) => {
                            let mut out = std::io::stdout().lock();
                            let _ = out.write_all(chunk);
                            let _ = out.flush();
                        }
                        Some(Sink::Stderr) => {
                            let _ = std::io::stderr().lock().write_all(chunk);
                        }
                        None => {}
                    }
                    self.captured.extend_from_slice(chunk);
                }
            }
        }
    }
}

fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn qemu_command(qemu: &Path, kernel: &GuestKernel, run: &Path, memory_mib: u32) -> Command {
    // setpriv makes the kernel kill qemu when this thread's process dies, whatever kills it.
    let mut cmd = match find_program("setpriv") {
        Some(setpriv) => {
            let mut c = Command::new(setpriv);
            c.args(["--pdeathsig", "KILL", "--"]).arg(qemu);
            c
        }
        None => Command::new(qemu),
    };
    let share = |id: &str, path: &Path, readonly: bool| {
        let mut s = OsString::from(format!("local,id={id},path="));
        s.push(path.as_os_str());
        s.push(",security_model=none,multidevs=remap");
        if readonly {
            s.push(",readonly=on");
        }
        s
    };
    let mut console = OsString::from("file:");
    console.push(run.join("console.log"));
    cmd.args(["-nodefaults", "-no-user-config", "-nographic", "-no-reboot"])
        .args([
            "-machine", "pc", "-accel", "tcg", "-cpu", "max", "-smp", "1",
        ])
        .args(["-m", &memory_mib.to_string()])
        .arg("-kernel")
        .arg(kernel.vmlinux())
        .arg("-initrd")
        .arg(run.join("initramfs.cpio"))
        .arg("-append")
        .arg(kernel_cmdline())
        .arg("-serial")
        .arg(console)
        .arg("-fsdev")
        .arg(share("fsroot", Path::new("/"), true))
        .args([
            "-device",
            &format!("virtio-9p-pci,fsdev=fsroot,mount_tag={ROOT_TAG}"),
        ])
        .arg("-fsdev")
        .arg(share("fsctl", run, false))
        .args([
            "-device",
            &format!("virtio-9p-pci,fsdev=fsctl,mount_tag={CTL_TAG}"),
        ])
        .args(["-nic", "none"])
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    // Its own process group: a Ctrl-C in the terminal reaches this process, which decides
    // (the default SIGINT kills it, and qemu with it through the death signal; a handler can
    // use `interrupt_on`), not qemu behind its back.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    // qemu's own messages (warnings, errors) go to qemu.log beside the console log.
    match File::create(run.join("qemu.log")) {
        Ok(log) => cmd.stderr(log),
        Err(_) => cmd.stderr(Stdio::null()),
    };
    cmd
}

/// The guest kernel's command line (plus [`APPEND_ENV`]).
fn kernel_cmdline() -> OsString {
    let mut line = OsString::from(
        "console=ttyS0 panic=-1 oops=panic quiet loglevel=4 mitigations=off rdinit=/init",
    );
    if let Some(extra) = std::env::var_os(APPEND_ENV) {
        line.push(" ");
        line.push(extra);
    }
    line
}

/// The initramfs's `/init`: load the boot modules, mount the control share, run its stage.
fn init_script(boot_modules: &[String]) -> String {
    let mut s = String::from(
        "#!/bin/busybox sh\n\
         /bin/busybox mount -t proc proc /proc\n\
         /bin/busybox --install -s /bin\n\
         export PATH=/bin\n\
         fail() { echo \"kp-vm init: $*\"; poweroff -f; }\n\
         mount -t sysfs sysfs /sys\n\
         mount -t devtmpfs devtmpfs /dev\n\
         echo /bin/modprobe > /proc/sys/kernel/modprobe\n\
         echo \"kp-vm: init at $(cut -d' ' -f1 /proc/uptime) s\"\n",
    );
    for m in boot_modules {
        s.push_str(&format!("insmod /m/{m}.ko || fail insmod {m}\n"));
    }
    s.push_str(&format!(
        "mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 {CTL_TAG} /ctl || fail mounting the control share\n\
         exec sh /ctl/stage.sh\n"
    ));
    s
}

/// The per-run stage script (busybox sh in the initramfs): the overlay root, the modules,
/// the mounts, then the command chrooted, its status, power-off.
fn stage_script(kernel: &GuestKernel, modules: &[String], _memory_mib: u32) -> Vec<u8> {
    let ver = &kernel.version;
    let moddir = kernel.modules_dir();
    let moddir = moddir.to_string_lossy();
    let mods = modules.join(" ");
    format!(
        r#"fail() {{ echo "kp-vm stage: $*"; poweroff -f; }}
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,ro,cache=loose {ROOT_TAG} /lower || fail mounting the host root
mount -t tmpfs -o mode=755 upper /upper || fail
mkdir -p /upper/u /upper/w
mount -t overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w overlay /newroot || fail mounting the overlay
mkdir -p /lib/modules/{ver}
mount --bind /lower{moddir} /lib/modules/{ver} || fail binding the modules
echo "kp-vm: loading modules at $(cut -d' ' -f1 /proc/uptime) s"
modprobe -a {mods} || echo "kp-vm stage: some modules did not load"
ip link set lo up
echo "kp-vm: modules loaded at $(cut -d' ' -f1 /proc/uptime) s"
R=/newroot
mount -t proc proc $R/proc || fail
mount -t sysfs sysfs $R/sys || fail
mount --move /dev $R/dev || fail
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts devpts $R/dev/pts
mount -t tmpfs shm $R/dev/shm
mount -t tmpfs -o mode=755 run $R/run || fail mounting /run
mkdir -p $R/run/netns $R{GUEST_CTL} $R/lib/modules/{ver}
mount --bind /lib/modules/{ver} $R/lib/modules/{ver}
mount --move /ctl $R{GUEST_CTL} || fail moving the control share
echo "kp-vm: command starts at $(cut -d' ' -f1 /proc/uptime) s"
chroot $R /bin/sh {GUEST_CTL}/cmd.sh
code=$?
echo "kp-vm: command exited with $code at $(cut -d' ' -f1 /proc/uptime) s"
echo $code > $R{GUEST_CTL}/status
poweroff -f
"#
    )
    .into_bytes()
}

/// Single-quotes `s` for a POSIX shell.
fn sh_quote(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len() + 2);
    out.push(b'\'');
    for &b in s {
        if b == b'\'' {
            out.extend_from_slice(b"'\\''");
        } else {
            out.push(b);
        }
    }
    out.push(b'\'');
    out
}

/// The kernel's `modules.dep` and `modules.builtin`, by module name (`-` read as `_`).
struct ModulesDep {
    dir: PathBuf,
    /// name → (path relative to the modules dir, dependency names)
    modules: HashMap<String, (String, Vec<String>)>,
    builtin: HashSet<String>,
}

fn module_name(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or(path);
    base.strip_suffix(".ko").unwrap_or(base).replace('-', "_")
}

impl ModulesDep {
    fn read(dir: &Path) -> Result<ModulesDep> {
        let dep_path = dir.join("modules.dep");
        let text = std::fs::read_to_string(&dep_path)
            .map_err(|e| Error::io(format!("reading {}", dep_path.display()), e))?;
        let builtin_path = dir.join("modules.builtin");
        let builtin = std::fs::read_to_string(&builtin_path)
            .unwrap_or_default()
            .lines()
            .map(module_name)
            .collect();
        Ok(Self::parse(dir, &text, builtin))
    }

    fn parse(dir: &Path, text: &str, builtin: HashSet<String>) -> ModulesDep {
        let mut modules = HashMap::new();
        for line in text.lines() {
            let Some((path, deps)) = line.split_once(':') else {
                continue;
            };
            let deps = deps.split_whitespace().map(module_name).collect();
            modules.insert(module_name(path), (path.trim().to_owned(), deps));
        }
        ModulesDep {
            dir: dir.to_owned(),
            modules,
            builtin,
        }
    }

    /// `wanted` and their dependencies, dependencies first; built-in names are skipped.
    fn closure(&self, wanted: &[&str]) -> Result<Vec<String>> {
        fn visit(
            deps: &ModulesDep,
            name: &str,
            seen: &mut HashSet<String>,
            out: &mut Vec<String>,
        ) -> Result<()> {
            if !seen.insert(name.to_owned()) {
                return Ok(());
            }
            let Some((_, d)) = deps.modules.get(name) else {
                if deps.builtin.contains(name) {
                    return Ok(());
                }
                return Err(Error::vm_unavailable(format!(
                    "module {name} is not in {}/modules.dep",
                    deps.dir.display()
                )));
            };
            for dep in d {
                visit(deps, dep, seen, out)?;
            }
            out.push(name.to_owned());
            Ok(())
        }
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for name in wanted {
            visit(self, &name.replace('-', "_"), &mut seen, &mut out)?;
        }
        Ok(out)
    }

    /// The modules to load in the guest: [`GUEST_MODULES`] that exist as modules and every
    /// module with a [`GUEST_MODULE_PREFIXES`] prefix, sorted.
    fn guest_modules(&self) -> Vec<String> {
        let mut out: Vec<String> = GUEST_MODULES
            .iter()
            .map(|m| m.replace('-', "_"))
            .filter(|m| self.modules.contains_key(m))
            .collect();
        out.extend(
            self.modules
                .keys()
                .filter(|m| GUEST_MODULE_PREFIXES.iter().any(|p| m.starts_with(p)))
                .filter(|m| !SKIPPED_MODULES.contains(&m.as_str()))
                .cloned(),
        );
        out.sort();
        out.dedup();
        // Loaded first: the crypto API looks for it while other modules initialise.
        if let Some(i) = out.iter().position(|m| m == "crc32c_generic") {
            let m = out.remove(i);
            out.insert(0, m);
        }
        out
    }

    fn path(&self, name: &str) -> Option<PathBuf> {
        self.modules.get(name).map(|(p, _)| self.dir.join(p))
    }
}

/// The initramfs (an uncompressed `newc` cpio archive): busybox, `/dev/console`, the mount
/// points, the boot modules under `/m/` and `/init`.
fn build_initramfs(busybox: &[u8], deps: &ModulesDep, boot_modules: &[String]) -> Result<Vec<u8>> {
    let mut cpio = Cpio::default();
    for dir in [
        "bin",
        "dev",
        "proc",
        "sys",
        "lower",
        "upper",
        "newroot",
        "ctl",
        "lib",
        "lib/modules",
        "m",
        "tmp",
    ] {
        cpio.dir(dir);
    }
    cpio.char_dev("dev/console", 5, 1);
    cpio.file("bin/busybox", 0o755, busybox);
    for m in boot_modules {
        let path = deps.path(m).ok_or_else(|| {
            Error::vm_unavailable(format!("module {m} is not in the prepared kernel"))
        })?;
        let data = std::fs::read(&path)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        cpio.file(&format!("m/{m}.ko"), 0o644, &data);
    }
    cpio.file("init", 0o755, init_script(boot_modules).as_bytes());
    Ok(cpio.finish())
}

/// A `newc` cpio writer (what the kernel unpacks as an initramfs).
#[derive(Default)]
struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        self.ino += 1;
        let fields = [
            self.ino,
            mode,
            0, // uid
            0, // gid
            1, // nlink
            0, // mtime
            data.len() as u32,
            0, // devmajor
            0, // devminor
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0, // check
        ];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, (0, 0), &[]);
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100_000 | perm, (0, 0), data);
    }

    fn char_dev(&mut self, name: &str, major: u32, minor: u32) {
        self.entry(name, 0o020_600, (major, minor), &[]);
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quoting_survives_single_quotes() {
        assert_eq!(sh_quote(b"a b"), b"'a b'");
        assert_eq!(sh_quote(b"it's"), b"'it'\\''s'");
        assert_eq!(sh_quote(b""), b"''");
    }

    #[test]
    fn module_closure_puts_dependencies_first_and_skips_builtins() {
        let text = "kernel/a/ip_vs_rr.ko: kernel/a/ip_vs.ko kernel/b/nf-conntrack.ko\n\
                    kernel/a/ip_vs.ko: kernel/b/nf-conntrack.ko kernel/c/libcrc32c.ko\n\
                    kernel/b/nf-conntrack.ko: kernel/c/libcrc32c.ko\n\
                    kernel/c/libcrc32c.ko:\n";
        let builtin = ["xt_tcpudp".to_owned()].into_iter().collect();
        let deps = ModulesDep::parse(Path::new("/m"), text, builtin);
        let order = deps.closure(&["ip_vs_rr", "xt_tcpudp", "ip_vs"]).unwrap();
        assert_eq!(order, ["libcrc32c", "nf_conntrack", "ip_vs", "ip_vs_rr"]);
        assert!(deps.closure(&["nope"]).is_err());
        let guest = deps.guest_modules();
        assert!(
            guest.contains(&"ip_vs_rr".to_owned()) && guest.contains(&"nf_conntrack".to_owned())
        );
    }

    #[test]
    fn cpio_entries_are_aligned_and_terminated() {
        let mut c = Cpio::default();
        c.dir("bin");
        c.file("init", 0o755, b"#!/bin/sh\n");
        let out = c.finish();
        assert_eq!(out.len() % 4, 0);
        assert!(out.starts_with(b"070701"));
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("TRAILER!!!"));
        assert!(text.contains("init\0"));
    }

    #[test]
    fn command_script_quotes_everything() {
        let cmd = GuestCommand::new("/bin/echo")
            .env_clear()
            .env("A", "x'y")
            .arg("hello world")
            .current_dir("/tmp");
        let s = String::from_utf8(cmd.command_script(Path::new("/tmp"))).unwrap();
        assert!(s.starts_with("cd '/tmp' || exit 125\n"), "{s}");
        assert!(
            s.contains("'A=x'\\''y' KP_VM_GUEST=1 '/bin/echo' 'hello world'"),
            "{s}"
        );
    }
}
