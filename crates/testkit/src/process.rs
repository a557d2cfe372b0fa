//! [`ChildGuard`]: a child process that is always stopped, and [`wait_for`].

use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use crate::error::{Error, Result};
use crate::netns::describe;

/// The default time between SIGTERM and SIGKILL.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3);

/// How often [`wait_for`] evaluates its condition.
const POLL: Duration = Duration::from_millis(20);

/// Owns a child process (typically started with [`crate::Netns::command`]) and stops it on
/// drop: SIGTERM, then SIGKILL after a grace period, then `wait`.
///
/// Children started with [`ChildGuard::spawn`] run in their own process group, and the
/// signals go to the whole group, so helpers the child started are stopped too.
#[derive(Debug)]
pub struct ChildGuard {
    child: Child,
    label: String,
    grace: Duration,
    group: bool,
    done: Option<ExitStatus>,
}

impl ChildGuard {
    /// Spawns `cmd` in a new process group and guards it; `label` names it in errors and
    /// logs (e.g. `kube-proxy-rs in kp123x1-node`).
    pub fn spawn(cmd: &mut Command, label: impl Into<String>) -> Result<ChildGuard> {
        use std::os::unix::process::CommandExt as _;
        let label = label.into();
        cmd.process_group(0);
        let child = cmd.spawn().map_err(|source| Error::Spawn {
            argv: format!("{label}: {}", describe(cmd)),
            source,
        })?;
        Ok(ChildGuard {
            child,
            label,
            grace: DEFAULT_GRACE,
            group: true,
            done: None,
        })
    }

    /// Guards an already spawned child (signals go to its pid only).
    pub fn new(child: Child, label: impl Into<String>) -> ChildGuard {
        ChildGuard {
            child,
            label: label.into(),
            grace: DEFAULT_GRACE,
            group: false,
            done: None,
        }
    }

    /// Sets the time between SIGTERM and SIGKILL (default [`DEFAULT_GRACE`]).
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The child's pid.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The label given at spawn.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The guarded [`Child`] (e.g. to take its piped stdout).
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// The exit status if the child has exited (does not block).
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        if self.done.is_none() {
            self.done = self
                .child
                .try_wait()
                .map_err(|e| Error::io(format!("waiting for {}", self.label), e))?;
        }
        Ok(self.done)
    }

    /// `Ok` while the child runs; [`Error::ChildExited`] once it has exited.
    pub fn ensure_running(&mut self) -> Result<()> {
        match self.try_wait()? {
            None => Ok(()),
            Some(status) => Err(Error::ChildExited {
                what: self.label.clone(),
                pid: self.id(),
                status,
            }),
        }
    }

    /// Like [`wait_for`], but fails at once with [`Error::ChildExited`] if the child exits
    /// while waiting (e.g. the proxy crashed instead of programming its rules).
    pub fn wait_for<F: FnMut() -> bool>(
        &mut self,
        mut condition: F,
        timeout: Duration,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if condition() {
                return Ok(());
            }
            self.ensure_running()?;
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: format!("a condition while {} runs", self.label),
                    after: timeout,
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// Stops the child now (SIGTERM, SIGKILL after the grace period) and returns its exit
    /// status.
    pub fn stop(mut self) -> Result<ExitStatus> {
        self.terminate()
    }

    fn signal(&self, signal: Signal) {
        let Ok(raw) = i32::try_from(self.child.id()) else {
            return;
        };
        let result = if self.group {
            killpg(Pid::from_raw(raw), signal)
        } else {
            kill(Pid::from_raw(raw), signal)
        };
        if let Err(e) = result {
            tracing::debug!("sending {signal} to {} (pid {raw}): {e}", self.label);
        }
    }

    fn terminate(&mut self) -> Result<ExitStatus> {
        if let Some(status) = self.try_wait()? {
            return Ok(status);
        }
        self.signal(Signal::SIGTERM);
        let deadline = Instant::now() + self.grace;
        while Instant::now() < deadline {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::warn!(
            "{} (pid {}) ignored SIGTERM for {:?}; killing it",
            self.label,
            self.id(),
            self.grace
        );
        self.signal(Signal::SIGKILL);
        let status = self
            .child
            .wait()
            .map_err(|e| Error::io(format!("waiting for {}", self.label), e))?;
        self.done = Some(status);
        Ok(status)
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Err(e) = self.terminate() {
            tracing::warn!("stopping {}: {e}", self.label);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Polls `condition` every 20 ms until it returns true ([`Ok`]) or `timeout` has passed
/// ([`Error::Timeout`]). The condition is always evaluated at least once.
pub fn wait_for<F: FnMut() -> bool>(mut condition: F, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: "a condition".into(),
                after: timeout,
            });
        }
        std::thread::sleep(POLL);
    }
}
