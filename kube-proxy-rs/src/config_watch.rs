//! The daemon exits when its `--config` file changes, so the restarted process reads it: a
//! ConfigMap edit rolls out by itself (the DaemonSet's pods restart one by one as the kubelet
//! updates each node's copy).
//!
//! Upstream kube-proxy watches the file with fsnotify and returns the error "content of the
//! proxy server's configuration file was updated" on a Write or Rename event
//! (`cmd/kube-proxy/app/options.go`). Its watch is on the file itself, which follows the
//! ConfigMap volume's symbolic links to the current timestamped copy; the kubelet's update
//! (a new `..2026_...` directory, then `..data` swapped to it with a rename) only removes
//! that copy, which upstream sees as Chmod and Remove and does not act on (kubernetes#132877,
//! open). Here the intent is kept and the layout handled:
//!
//! - The directory holding the path is watched (not recursively), and the directory of the
//!   file the path resolves to, so the rename of `..data`, an editor's rename over the file,
//!   a write in place and the file being re-created are all seen. A timer re-checks every
//!   [`POLL`] as well, for changes inotify cannot see.
//! - On any event the file is read again (through its links) and compared with the bytes
//!   read at start: only a change of content exits (a `touch`, a `chmod` or a rewrite with
//!   the same bytes does not). The exit is an error, so the status is 1 and the log says why,
//!   with whether the new file loads.
//! - A file that disappears (deleted, or renamed away) is a warning and the proxy keeps
//!   running with the configuration it read: a restart could not start without the file.
//!   Upstream also keeps running on a Remove (it exits on a Rename of the file, to a restart
//!   that fails). When the file comes back with other content, the proxy exits then.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kp_model::Escaped;
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::config::{KubeProxyConfiguration, Loaded};

/// How often the file is read again without an event.
pub const POLL: Duration = Duration::from_secs(5);

/// How long a burst of events may go on before the file is read (a ConfigMap swap is a few
/// renames and deletions in a row).
const SETTLE: Duration = Duration::from_millis(50);

/// The parent directory of `path` (`.` for a bare name).
fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Resolves when the content of the `--config` file differs from `loaded.content`, with
/// the error the daemon exits with; never resolves for `None` (no `--config`, or not a
/// daemon). Watch set-up failures are warnings (the timer still checks).
pub async fn changed(loaded: Option<Loaded>) -> anyhow::Error {
    let Some(loaded) = loaded else {
        return std::future::pending().await;
    };
    let path = std::path::absolute(&loaded.path).unwrap_or_else(|_| loaded.path.clone());
    let shown = path.display().to_string();
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if let Err(e) = &res {
            warn!(error = %Escaped(&e.to_string()), "--config watch error; checking the file");
        }
        // A full channel already holds a pending check, which will see this change too.
        let _ = tx.try_send(());
    });
    let mut watcher = match watcher {
        Ok(w) => Some(w),
        Err(e) => {
            warn!(config = %Escaped(&shown), error = %Escaped(&e.to_string()), "cannot watch the configuration file; checking it every {}s instead", POLL.as_secs());
            None
        }
    };
    let mut watched: HashSet<PathBuf> = HashSet::new();
    let mut watch_dirs = |watcher: &mut Option<notify::RecommendedWatcher>| {
        let Some(w) = watcher.as_mut() else {
            return;
        };
        let mut dirs = vec![parent(&path)];
        if let Ok(target) = std::fs::canonicalize(&path) {
            dirs.push(parent(&target));
        }
        for dir in dirs {
            if watched.contains(&dir) {
                continue;
            }
            match w.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    watched.insert(dir);
                }
                Err(e) => warn!(
                    dir = %Escaped(&dir.display().to_string()),
                    error = %Escaped(&e.to_string()),
                    "cannot watch the configuration file's directory; checking it every {}s",
                    POLL.as_secs()
                ),
            }
        }
    };
    watch_dirs(&mut watcher);
    let mut poll = tokio::time::interval(POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    poll.tick().await; // The first tick is immediate.
    let mut missing = false;
    loop {
        tokio::select! {
            Some(()) = rx.recv() => {
                tokio::time::sleep(SETTLE).await;
                while rx.try_recv().is_ok() {}
            }
            _ = poll.tick() => {}
        }
        match std::fs::read(&path) {
            Ok(bytes) if bytes == loaded.content => {
                if missing {
                    info!(config = %Escaped(&shown), "the configuration file is back, unchanged");
                    missing = false;
                }
            }
            Ok(bytes) => return exit_error(&shown, &bytes),
            Err(e) => {
                if !missing {
                    warn!(
                        config = %Escaped(&shown),
                        error = %e,
                        "the configuration file cannot be read: running on with the configuration read at start; the proxy exits to restart when the file is back with other content"
                    );
                    missing = true;
                }
            }
        }
        // A ConfigMap swap moves the file's target to a new directory: watch that one too.
        watch_dirs(&mut watcher);
    }
}

/// The error the daemon exits with when the file now holds `bytes`.
fn exit_error(shown: &str, bytes: &[u8]) -> anyhow::Error {
    let verdict = match KubeProxyConfiguration::parse(&String::from_utf8_lossy(bytes)) {
        Ok(_) => "the restarted proxy reads the new file".to_string(),
        Err(e) => format!(
            "the new file does not load, so the restart will fail until it is fixed: {}",
            Escaped(&format!("{e:#}"))
        ),
    };
    anyhow::anyhow!(
        "--config {}: content of the configuration file was updated; exiting so that it is read again, as kube-proxy does ({verdict})",
        Escaped(shown)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loaded(path: &Path) -> Loaded {
        Loaded {
            path: path.to_path_buf(),
            content: std::fs::read(path).unwrap(),
            notes: Vec::new(),
        }
    }

    async fn fires_within(loaded: Loaded, limit: Duration) -> Option<String> {
        tokio::time::timeout(limit, changed(Some(loaded)))
            .await
            .ok()
            .map(|e| e.to_string())
    }

    /// A ConfigMap volume: `config.conf -> ..data/config.conf`, `..data -> ..<timestamp>`.
    /// The kubelet's update writes a new timestamped directory and renames a new `..data`
    /// link over the old one.
    #[tokio::test]
    async fn a_configmap_swap_is_seen_at_once_and_a_touch_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let base = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";
        std::fs::create_dir(d.join("..2026_01_01")).unwrap();
        std::fs::write(d.join("..2026_01_01/config.conf"), base).unwrap();
        std::os::unix::fs::symlink("..2026_01_01", d.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/config.conf", d.join("config.conf")).unwrap();
        let l = loaded(&d.join("config.conf"));

        // Touched, rewritten with the same bytes: no exit.
        let (d2, l2) = (d.to_path_buf(), l.clone());
        let quiet = tokio::spawn(async move { fires_within(l2, Duration::from_secs(2)).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::fs::write(d2.join("..2026_01_01/config.conf"), base).unwrap();
        assert_eq!(quiet.await.unwrap(), None);

        let watch = tokio::spawn(async move { fires_within(l, Duration::from_secs(3)).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::fs::create_dir(d.join("..2026_01_02")).unwrap();
        std::fs::write(
            d.join("..2026_01_02/config.conf"),
            format!("{base}mode: nftables\n"),
        )
        .unwrap();
        std::os::unix::fs::symlink("..2026_01_02", d.join("..data_tmp")).unwrap();
        std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
        std::fs::remove_dir_all(d.join("..2026_01_01")).unwrap();
        let e = watch
            .await
            .unwrap()
            .expect("no exit within 3 s (the poll is 5 s)");
        assert!(
            e.contains("content of the configuration file was updated")
                && e.contains("the restarted proxy reads the new file"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_removed_file_keeps_running_until_it_is_back_with_other_content() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.conf");
        std::fs::write(&p, "kind: KubeProxyConfiguration\n").unwrap();
        let l = loaded(&p);
        let p2 = p.clone();
        let watch = tokio::spawn(async move { fires_within(l, Duration::from_secs(4)).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::fs::remove_file(&p2).unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!watch.is_finished(), "exited on a removal");
        std::fs::write(&p2, "kind: Something\n").unwrap();
        let e = watch
            .await
            .unwrap()
            .expect("no exit when the file came back");
        assert!(e.contains("the new file does not load"), "{e}");
        assert!(e.contains("kind"), "{e}");
    }
}
