//! [`PodFiles`]: the files a pod sees at fixed paths (a ConfigMap mounted at
//! `/var/lib/kube-proxy`, the service-account token at
//! `/var/run/secrets/kubernetes.io/serviceaccount`), given to one process in a network
//! namespace without touching the machine's own file system.
//!
//! [`PodFiles::command`] runs the program through `ip netns exec` (which gives the child a
//! mount namespace of its own, whose mounts do not propagate back) and a shell that first
//! mounts an overlay on the nearest existing directory above each file (for example
//! `/var/lib`, or `/run` for `/var/run/...` where `/var/run` links to it): the directory's
//! contents stay visible, and the files appear beside them, as the kubelet's volumes appear
//! in a container. The overlays' upper layers live in a directory the test owns.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use crate::{Error, Netns, Result};

/// Files at absolute paths, for one process; see the module documentation.
#[derive(Debug)]
pub struct PodFiles {
    dir: PathBuf,
    /// Per overlay: the directory it covers, and its upper and work directories.
    layers: BTreeMap<PathBuf, (PathBuf, PathBuf)>,
}

impl PodFiles {
    /// Files kept under `dir` (which must exist and should be the test's temporary
    /// directory; not on an overlay file system).
    pub fn new(dir: &Path) -> PodFiles {
        PodFiles {
            dir: dir.to_path_buf(),
            layers: BTreeMap::new(),
        }
    }

    /// Adds `contents` at the absolute `path`, readable by everyone (a ConfigMap's or a
    /// service-account file's mode).
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be written; [`Error::Invalid`] for a relative path,
    /// or one under which no directory exists but `/`.
    pub fn file(&mut self, path: &str, contents: &str) -> Result<&mut PodFiles> {
        let path = Path::new(path);
        if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
            return Err(Error::Invalid {
                what: "pod file path",
                message: format!("{}: not an absolute path", path.display()),
            });
        }
        // The nearest existing directory above the file, resolved (`/var/run` -> `/run`).
        let mut existing = path.parent().unwrap_or(Path::new("/"));
        while !existing.exists() {
            existing = existing.parent().unwrap_or(Path::new("/"));
        }
        let rest = path.strip_prefix(existing).unwrap_or(path).to_path_buf();
        let io = |context: String| move |source| Error::Io { context, source };
        let base = existing
            .canonicalize()
            .map_err(io(format!("resolving {}", existing.display())))?;
        if base == Path::new("/") {
            return Err(Error::Invalid {
                what: "pod file path",
                message: format!("{}: no directory to lay it over but /", path.display()),
            });
        }
        let n = self.layers.len();
        let (upper, _) = self.layers.entry(base).or_insert_with(|| {
            (
                self.dir.join(format!("pod-layer-{n}/upper")),
                self.dir.join(format!("pod-layer-{n}/work")),
            )
        });
        let target = upper.join(rest);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .map_err(io(format!("creating {}", parent.display())))?;
        }
        std::fs::write(&target, contents).map_err(io(format!("writing {}", target.display())))?;
        Ok(self)
    }

    /// `program` (then the caller's `.args(...)`) in `ns`, seeing the files: `ip netns exec
    /// NS sh -c 'mount -t overlay ...; exec "$0" "$@"' program`. The child's pid is the
    /// program's (both `ip netns exec` and the shell exec it).
    ///
    /// # Errors
    /// [`Error::Io`] when a layer's directories cannot be made.
    pub fn command(&self, ns: &Netns, program: impl AsRef<OsStr>) -> Result<Command> {
        let mut script = String::from("set -e\n");
        for (base, (upper, work)) in &self.layers {
            for d in [upper, work] {
                std::fs::create_dir_all(d).map_err(|source| Error::Io {
                    context: format!("creating {}", d.display()),
                    source,
                })?;
            }
            script.push_str(&format!(
                "mount -t overlay kp-pod -o lowerdir={},upperdir={},workdir={} {}\n",
                quote(base),
                quote(upper),
                quote(work),
                quote(base)
            ));
        }
        script.push_str("exec \"$0\" \"$@\"\n");
        let mut cmd = ns.command("sh");
        cmd.arg("-c").arg(script).arg(program);
        Ok(cmd)
    }
}

/// `path` quoted for `sh` (and for the overlay's option list, which splits on commas).
fn quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', "'\\''"))
}
