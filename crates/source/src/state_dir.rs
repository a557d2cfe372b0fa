//! [`StateDir`]: each manifest file's last good version, kept on disk so a restart with a
//! broken file still serves what that file last defined.
//!
//! While the daemon runs, a file that stops parsing keeps every object it defined
//! ([`crate::last_good`]). That memory is gone at the next restart. So every file that loads
//! without a single error is copied to `<dir>/manifests/<id>.yaml`, where `<id>` is the
//! first 16 hex digits of the SHA-256 of the file's absolute path. The copy's first line
//! names the file. It is written atomically (a temporary file renamed over the old copy), and
//! only when the file's text changed. The file is hashed, and copied, in pieces of 64 KiB:
//! a `kind: List` of 10,000 Services (37 MB) is never held in memory for its copy. At start-up, a file that is not understood whole
//! (unreadable, not YAML, an object that cannot be identified) is completed from its copy:
//! each object the copy defines and the file's readable part does not is served from the
//! copy. The file's error says so, naming the copy and the Services it serves.
//!
//! Deleting a file still deletes its objects: a file that no longer exists is not completed.
//! The copy stays on disk, which is harmless. The API-server source does not use this: the
//! API server is the authority.

use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};
use tracing::warn;

use crate::manifests::{Loaded, ManifestSet, ObjectKey, load_path};

/// The default state directory (`--state-dir`).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/kube-proxy-rs";

/// The state directory of the manifest source.
#[derive(Debug)]
pub struct StateDir {
    dir: PathBuf,
    /// The text last written per file, so an unchanged file is not written again.
    written: Mutex<HashMap<PathBuf, [u8; 32]>>,
    /// Whether a write failure was already reported (once is enough).
    warned: Mutex<bool>,
}

fn keys(set: &ManifestSet) -> BTreeSet<ObjectKey> {
    set.services
        .keys()
        .cloned()
        .map(ObjectKey::Service)
        .chain(set.slices.keys().cloned().map(ObjectKey::EndpointSlice))
        .chain(set.nodes.keys().cloned().map(ObjectKey::Node))
        .collect()
}

impl StateDir {
    /// The state kept under `dir` (created when first written).
    pub fn new(dir: impl Into<PathBuf>) -> StateDir {
        StateDir {
            dir: dir.into(),
            written: Mutex::new(HashMap::new()),
            warned: Mutex::new(false),
        }
    }

    /// Where the last good copy of `file` lives.
    pub fn copy_path(&self, file: &Path) -> PathBuf {
        let absolute = std::path::absolute(file).unwrap_or_else(|_| file.to_path_buf());
        let digest = Sha256::digest(absolute.as_os_str().as_encoded_bytes());
        let id: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        self.dir.join("manifests").join(format!("{id}.yaml"))
    }

    /// Copies every file of `loaded` that loaded without an error (complete, nothing
    /// rejected, no error naming it) to the state directory. A failure is logged once, as a
    /// warning: the proxy works without its state directory.
    pub fn save_good(&self, loaded: &Loaded) {
        for (file, load) in &loaded.files {
            if load.incomplete.is_some()
                || !load.rejected.is_empty()
                || loaded.errors.iter().any(|e| e.file == *file)
            {
                continue;
            }
            let Ok(Some(digest)) = copy_text(file, &mut std::io::sink()) else {
                continue;
            };
            let mut written = match self.written.lock() {
                Ok(w) => w,
                Err(p) => p.into_inner(),
            };
            if written.get(file) == Some(&digest) {
                continue;
            }
            match self.write_copy(file) {
                // The file was no longer UTF-8 text when copied: it is left alone.
                Ok(None) => {}
                Ok(Some(digest)) => {
                    written.insert(file.clone(), digest);
                }
                Err(e) => {
                    let mut warned = match self.warned.lock() {
                        Ok(w) => w,
                        Err(p) => p.into_inner(),
                    };
                    if !*warned {
                        *warned = true;
                        warn!(
                            state_dir = %self.dir.display(),
                            error = %e,
                            "cannot keep the manifests' last good copies (--state-dir); a restart with a broken file will not serve its last good objects"
                        );
                    }
                }
            }
        }
    }

    /// Copies `file` (streamed, never held whole) below a header naming it, atomically;
    /// returns the digest of the text copied, or `None` (and nothing written) when the file
    /// is not UTF-8 text.
    fn write_copy(&self, file: &Path) -> std::io::Result<Option<[u8; 32]>> {
        let path = self.copy_path(file);
        let parent = path.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(parent)?;
        let tmp = path.with_extension("yaml.tmp");
        let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        writeln!(
            out,
            "# kube-proxy-rs: the last good version of {:?}",
            file.display().to_string()
        )?;
        let digest = copy_text(file, &mut out)?;
        out.flush()?;
        drop(out);
        if digest.is_none() {
            std::fs::remove_file(&tmp)?;
            return Ok(None);
        }
        std::fs::rename(&tmp, &path)?;
        Ok(digest)
    }

    /// At start-up: completes every file of `loaded` that was not understood whole from its
    /// last good copy, and says so at the end of the file's error. Returns how many objects
    /// were restored.
    pub fn restore(&self, loaded: &mut Loaded) -> usize {
        let mut restored = 0;
        let incomplete: Vec<(PathBuf, usize)> = loaded
            .files
            .iter()
            .filter_map(|(f, l)| l.incomplete.map(|p| (f.clone(), p)))
            .collect();
        for (file, position) in incomplete {
            if !file.exists() {
                continue;
            }
            let copy = self.copy_path(&file);
            // Read as any manifest is: a large copy is not held whole. A copy that is missing
            // or cannot be read restores nothing.
            let (saved, _) = load_path(&copy);
            let mut services = Vec::new();
            let mut count = 0;
            for key in keys(&saved) {
                if loaded.set.contains(&key) || !loaded.set.copy_from(&saved, &key) {
                    continue;
                }
                if let ObjectKey::Service(name) = &key {
                    services.push(name.to_string());
                }
                if let Some(f) = loaded.files.get_mut(&file) {
                    f.objects.insert(key);
                }
                count += 1;
            }
            if count == 0 {
                continue;
            }
            restored += count;
            if let Some(e) = loaded.errors.get_mut(position) {
                let services = if services.is_empty() {
                    String::new()
                } else {
                    format!(" (Services: {})", services.join(", "))
                };
                e.message = format!(
                    "{}; serving {count} object(s) from its last good copy {}{services}",
                    e.message,
                    copy.display()
                );
            }
        }
        restored
    }
}

/// Copies the text of `file` to `out` in pieces (a manifest can be large: it is never held
/// whole); returns the SHA-256 of the text, or `None` when it is not UTF-8 (what was copied
/// until then stays in `out`).
fn copy_text(file: &Path, out: &mut impl Write) -> std::io::Result<Option<[u8; 32]>> {
    const PIECE: usize = 64 * 1024;
    let mut input = std::fs::File::open(file)?;
    let mut hasher = Sha256::new();
    // The piece read, after the (at most 3) bytes of a character the last piece cut.
    let mut buf = vec![0; PIECE + 4];
    let mut carried = 0;
    loop {
        let n = match input.read(&mut buf[carried..]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok((carried == 0).then(|| hasher.finalize().into()));
        }
        let filled = carried + n;
        let whole = match std::str::from_utf8(&buf[..filled]) {
            Ok(_) => filled,
            // A character cut at the end of the piece: it is completed by the next one.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => return Ok(None),
        };
        hasher.update(&buf[..whole]);
        out.write_all(&buf[..whole])?;
        buf.copy_within(whole..filled, 0);
        carried = filled - whole;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifests::load_path_detailed;

    const GOOD: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{port: 80}]\n";

    #[test]
    fn a_broken_file_at_start_is_served_from_its_last_good_copy() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path().join("state"));
        let m = dir.path().join("m");
        std::fs::create_dir(&m).unwrap();
        let file = m.join("web.yaml");
        std::fs::write(&file, GOOD).unwrap();
        state.save_good(&load_path_detailed(&m));
        let copy = state.copy_path(&file);
        assert!(std::fs::read_to_string(&copy).unwrap().ends_with(GOOD));

        // Broken while the daemon was down: the restart serves the copy, and says so.
        std::fs::write(&file, "kind: Service\nthis: is: not: yaml\n").unwrap();
        let mut loaded = load_path_detailed(&m);
        assert!(loaded.set.services.is_empty());
        state.save_good(&loaded);
        assert!(
            std::fs::read_to_string(&copy).unwrap().ends_with(GOOD),
            "a broken file is not saved"
        );
        assert_eq!(state.restore(&mut loaded), 1);
        assert_eq!(loaded.set.services.len(), 1);
        let error = loaded.errors[0].to_string();
        assert!(error.contains("web.yaml"), "{error}");
        assert!(
            error.ends_with(&format!(
                "serving 1 object(s) from its last good copy {} (Services: default/web)",
                copy.display()
            )),
            "{error}"
        );
        assert!(loaded.files[&file].objects.contains(&ObjectKey::Service(
            kp_model::NamespacedName::new("default", "web")
        )));

        // A deleted file is not brought back.
        std::fs::remove_file(&file).unwrap();
        let mut loaded = load_path_detailed(&m);
        assert_eq!(state.restore(&mut loaded), 0);
        assert!(loaded.set.services.is_empty());
    }

    #[test]
    fn a_copy_is_the_text_exactly_in_pieces_and_only_utf8() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path().join("state"));
        // Over 200 KiB with two- and three-byte characters at every offset, so that pieces of
        // the copy cut characters.
        let mut text = String::from(GOOD);
        let mut i = 0;
        while text.len() < 200 * 1024 {
            text.push_str(&format!("# é{i} ✓ {}\n", "x".repeat(i % 7)));
            i += 1;
        }
        let file = dir.path().join("big.yaml");
        std::fs::write(&file, &text).unwrap();
        state.save_good(&load_path_detailed(&file));
        let copy = state.copy_path(&file);
        let header = format!(
            "# kube-proxy-rs: the last good version of {:?}\n",
            file.display().to_string()
        );
        assert_eq!(
            std::fs::read_to_string(&copy).unwrap(),
            format!("{header}{text}")
        );
        let digest: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        assert_eq!(state.written.lock().unwrap()[&file], digest);

        // Unchanged: not written again.
        std::fs::write(&copy, "stale").unwrap();
        state.save_good(&load_path_detailed(&file));
        assert_eq!(std::fs::read_to_string(&copy).unwrap(), "stale");

        // Not UTF-8 (in a comment, after the first piece): not copied.
        let mut bytes = text.into_bytes();
        bytes.extend_from_slice(b"# \xff\n");
        let mut out = Vec::new();
        std::fs::write(&file, &bytes).unwrap();
        assert_eq!(copy_text(&file, &mut out).unwrap(), None);
        // A character cut by the end of the file is not UTF-8 either.
        bytes.truncate(bytes.len() - 3);
        bytes.extend_from_slice("é".as_bytes().split_at(1).0);
        std::fs::write(&file, &bytes).unwrap();
        assert_eq!(copy_text(&file, &mut Vec::new()).unwrap(), None);
    }

    #[test]
    fn an_unwritable_state_dir_is_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "x").unwrap();
        let state = StateDir::new(blocker.join("state"));
        let m = dir.path().join("web.yaml");
        std::fs::write(&m, GOOD).unwrap();
        state.save_good(&load_path_detailed(&m));
        assert!(*state.warned.lock().unwrap());
    }
}
