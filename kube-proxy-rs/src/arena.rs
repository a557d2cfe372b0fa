//! One glibc malloc arena for the daemon: [`one_arena`] re-executes the process once with
//! `MALLOC_ARENA_MAX=1` unless the variable is already set.
//!
//! glibc gives a thread that finds the arena in use an arena of its own (up to eight per CPU),
//! and memory freed into an arena stays with it. The daemon's source, tracker, sync loops and
//! tokio's worker and blocking threads allocate at once while the first sync is built, so at
//! 10,000 Services × 10 endpoints its peak RSS was 16–27 MiB more with glibc's default than
//! with one arena (docs/benchmarks.md, "Daemon memory"), for no measurable change in the
//! first sync's time (the work is one sync at a time). jemalloc and mimalloc were measured
//! too and peaked higher. The variable can only be set before the process starts (glibc reads
//! it at its first allocation, and this crate has no `unsafe` for `mallopt`), hence the
//! re-exec, done before any thread exists; the process keeps its PID, arguments and
//! environment. An operator who sets `MALLOC_ARENA_MAX` (any value) keeps it, and glibc
//! tunables (`GLIBC_TUNABLES` naming `arena_max`) are left alone too.

use std::ffi::OsString;

/// The glibc variable this sets.
pub const ARENA_MAX: &str = "MALLOC_ARENA_MAX";

/// Whether the process should re-execute itself: `MALLOC_ARENA_MAX` is unset and
/// `GLIBC_TUNABLES` does not set `glibc.malloc.arena_max` (given the two variables' values).
pub fn wanted(arena_max: Option<&OsString>, tunables: Option<&OsString>) -> bool {
    arena_max.is_none()
        && !tunables.is_some_and(|t| t.to_string_lossy().contains("malloc.arena_max"))
}

/// Re-executes `/proc/self/exe` with the same arguments and environment plus
/// `MALLOC_ARENA_MAX=1`, when [`wanted`] (on glibc targets only). Returns only when it did not
/// re-execute, with the reason if the `exec` failed (for instance `/proc` is not mounted); the
/// caller logs it and goes on with glibc's default arenas. Must run before any thread starts.
pub fn one_arena() -> Option<std::io::Error> {
    if !cfg!(all(target_os = "linux", target_env = "gnu"))
        || !wanted(
            std::env::var_os(ARENA_MAX).as_ref(),
            std::env::var_os("GLIBC_TUNABLES").as_ref(),
        )
    {
        return None;
    }
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    let mut cmd = std::process::Command::new("/proc/self/exe");
    if let Some(arg0) = args.next() {
        cmd.arg0(arg0);
    }
    // `exec` returns only on failure.
    Some(cmd.args(args).env(ARENA_MAX, "1").exec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operators_setting_is_kept() {
        let v = |s: &str| Some(OsString::from(s));
        assert!(wanted(None, None));
        assert!(wanted(None, v("glibc.malloc.tcache_count=0").as_ref()));
        assert!(!wanted(v("8").as_ref(), None));
        assert!(!wanted(v("").as_ref(), None));
        assert!(!wanted(None, v("glibc.malloc.arena_max=4").as_ref()));
    }
}
