//! The watcher: initial batch, changes within a second (edits, editor renames, a ConfigMap's
//! symlink swap, a directory deleted and re-created), the last good state kept across bad
//! edits, deletion, errors, and shutdown.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kp_model::{NamespacedName, SourceEvent};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

use super::{service_yaml, slice_yaml};
use crate::SourceError;
use crate::manifests::ManifestSet;
use crate::watch::{
    Tuning, WatchOptions, watch_manifests, watch_manifests_tuned, watch_manifests_with,
};

/// Service `default/web` (ClusterIP 10.96.0.10, port 80) and its slice with `endpoints`.
fn cluster(endpoints: &[&str]) -> String {
    let eps: String = endpoints
        .iter()
        .map(|ip| format!("- addresses: [{ip}]\n"))
        .collect();
    format!(
        "{}---\n{}",
        service_yaml("  clusterIP: 10.96.0.10\n  ports:\n  - port: 80\n"),
        slice_yaml(&format!("endpoints:\n{eps}")),
    )
}

/// A Node manifest.
fn node(name: &str) -> String {
    format!("apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n")
}

fn nn(ns: &str, name: &str) -> NamespacedName {
    NamespacedName::new(ns, name)
}

/// A running watcher, with the state its events build and the errors it reported.
struct Watched {
    rx: mpsc::Receiver<Vec<SourceEvent>>,
    live: ManifestSet,
    errors: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<Result<(), SourceError>>,
}

impl Watched {
    /// Starts watching `path` and applies the initial batch.
    async fn start(path: PathBuf) -> Watched {
        Self::start_with(path, WatchOptions::new()).await
    }

    /// [`Watched::start`] with `opts`.
    async fn start_with(path: PathBuf, opts: WatchOptions) -> Watched {
        Self::start_tuned(path, opts, None).await
    }

    /// [`Watched::start_with`], with the watcher's [`Tuning`] when given.
    async fn start_tuned(path: PathBuf, opts: WatchOptions, tuning: Option<Tuning>) -> Watched {
        let errors = Arc::new(Mutex::new(Vec::<String>::new()));
        let sink = Arc::clone(&errors);
        let (tx, rx) = mpsc::channel(16);
        let report = move |e: &crate::manifests::ManifestError| {
            sink.lock().expect("lock").push(e.to_string());
        };
        let task = match tuning {
            None => tokio::spawn(watch_manifests_with(path, opts, tx, report)),
            Some(tuning) => tokio::spawn(watch_manifests_tuned(path, opts, tuning, tx, report)),
        };
        let mut watched = Watched {
            rx,
            live: ManifestSet::default(),
            errors,
            task,
        };
        let initial = watched.next(Duration::from_secs(5)).await;
        let synced = initial
            .iter()
            .filter(|e| matches!(e, SourceEvent::Synced(_)))
            .count();
        assert_eq!(synced, 3, "{initial:#?}");
        watched
    }

    /// The next batch, applied to the live state.
    async fn next(&mut self, within: Duration) -> Vec<SourceEvent> {
        let batch = match timeout(within, self.rx.recv()).await {
            Ok(Some(batch)) => batch,
            Ok(None) => panic!("watcher stopped"),
            Err(_) => panic!("no batch within {within:?}; live state {:#?}", self.live),
        };
        for event in &batch {
            apply(&mut self.live, event);
        }
        batch
    }

    /// Applies batches until `done` holds for the live state; fails after `within`.
    async fn until(&mut self, within: Duration, done: impl Fn(&ManifestSet) -> bool) {
        let deadline = Instant::now() + within;
        while !done(&self.live) {
            let left = deadline.saturating_duration_since(Instant::now());
            self.next(left).await;
        }
    }

    /// Asserts that no batch arrives for `period`.
    async fn quiet(&mut self, period: Duration) {
        if let Ok(batch) = timeout(period, self.rx.recv()).await {
            panic!("expected no change, got {batch:#?}");
        }
    }

    /// Waits until an error containing `text` was reported; fails after `within`.
    async fn error(&self, within: Duration, text: &str) -> String {
        let deadline = Instant::now() + within;
        loop {
            let found = self
                .errors
                .lock()
                .expect("lock")
                .iter()
                .find(|e| e.contains(text))
                .cloned();
            if let Some(found) = found {
                return found;
            }
            if Instant::now() >= deadline {
                panic!(
                    "no error with {text:?} within {within:?}: {:#?}",
                    self.errors
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn count_errors(&self, text: &str) -> usize {
        let errors = self.errors.lock().expect("lock");
        errors.iter().filter(|e| e.contains(text)).count()
    }

    /// Closes the receiver; the task must end cleanly.
    async fn stop(self) {
        drop(self.rx);
        let result = timeout(Duration::from_secs(5), self.task)
            .await
            .expect("task ends")
            .expect("join");
        assert!(result.is_ok(), "{result:?}");
    }
}

fn apply(set: &mut ManifestSet, event: &SourceEvent) {
    match event {
        SourceEvent::ServiceUpsert(svc) => {
            set.services.insert(svc.name.clone(), svc.clone());
        }
        SourceEvent::ServiceDelete(name) => {
            set.services.remove(name);
        }
        SourceEvent::SliceUpsert(slice) => {
            set.slices.insert(slice.name.clone(), slice.clone());
        }
        SourceEvent::SliceDelete(name) => {
            set.slices.remove(name);
        }
        SourceEvent::NodeUpsert(node) => {
            set.nodes.insert(node.name.clone(), node.clone());
        }
        SourceEvent::NodeDelete(name) => {
            set.nodes.remove(name);
        }
        _ => {}
    }
}

/// The endpoint addresses of slice `default/web-abc`, when it is live.
fn endpoints(set: &ManifestSet) -> Option<Vec<String>> {
    set.slices.get(&nn("default", "web-abc")).map(|slice| {
        slice
            .endpoints
            .iter()
            .map(|e| e.address.to_string())
            .collect()
    })
}

fn has_web(set: &ManifestSet) -> bool {
    set.services.contains_key(&nn("default", "web"))
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write");
}

/// Writes `text` the way editors save: to a hidden temporary file, renamed over `path`.
fn editor_write(path: &Path, text: &str) {
    let name = path
        .file_name()
        .expect("file name")
        .to_string_lossy()
        .into_owned();
    let tmp = path.with_file_name(format!(".{name}.swp"));
    write(&tmp, text);
    std::fs::rename(&tmp, path).expect("rename");
}

const SECOND: Duration = Duration::from_secs(1);
/// How long to wait to be sure that nothing happens (longer than a debounced reload).
const QUIET: Duration = Duration::from_millis(700);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_file_changes_bad_edits_and_deletion() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("cluster.yaml");
    write(&file, &cluster(&["10.0.0.1", "10.0.0.2"]));
    let mut w = Watched::start(file.clone()).await;
    assert!(has_web(&w.live));
    assert_eq!(w.live.slices.len(), 1);

    // An unrelated file in the same directory changes nothing.
    write(&dir.path().join("other.txt"), "x");

    // Remove an endpoint: the changed slice arrives well within a second, alone.
    write(&file, &cluster(&["10.0.0.1"]));
    let batch = w.next(SECOND).await;
    assert_eq!(batch.len(), 1, "{batch:#?}");
    assert_eq!(endpoints(&w.live), Some(vec!["10.0.0.1".to_string()]));

    // A bad clusterIP in the programmed Service: it keeps its last valid version.
    let broken = cluster(&["10.0.0.1"]).replace("clusterIP: 10.96.0.10", "clusterIP: 10.96.0.300");
    write(&file, &broken);
    let error = w.error(SECOND, "spec.clusterIP").await;
    assert_eq!(
        error,
        format!(
            "{}:1: Service default/web: spec.clusterIP: \"10.96.0.300\" is not a valid IP \
             address; keeping the last valid version",
            file.display()
        )
    );
    w.quiet(QUIET).await;
    assert!(has_web(&w.live));

    // The watched file disappears: everything is kept, and the error says so.
    std::fs::remove_file(&file).expect("remove");
    let error = w.error(SECOND, "cannot read").await;
    assert!(
        error.ends_with("keeping every object last loaded from it"),
        "{error}"
    );
    w.quiet(QUIET).await;
    assert!(has_web(&w.live));
    assert_eq!(w.live.slices.len(), 1);

    // It comes back, fixed and with another endpoint: read normally.
    write(&file, &cluster(&["10.0.0.3"]));
    w.until(SECOND, |s| {
        endpoints(s) == Some(vec!["10.0.0.3".to_string()])
    })
    .await;
    // Each problem was reported once.
    assert_eq!(w.count_errors("10.96.0.300"), 1);
    assert_eq!(w.count_errors("cannot read"), 1);
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_directory_new_subdirectory() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(&dir.path().join("svc.yaml"), &cluster(&["10.0.0.1"]));
    let mut w = Watched::start(dir.path().to_path_buf()).await;

    std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
    write(&dir.path().join("sub/node.yaml"), &node("n1"));
    w.until(SECOND, |s| s.nodes.contains_key("n1")).await;

    // A file written into the new subdirectory later is seen too (it is watched).
    write(&dir.path().join("sub/node2.yaml"), &node("n2"));
    w.until(SECOND, |s| s.nodes.contains_key("n2")).await;
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_directory_editor_style_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("cluster.yaml");
    write(&file, &cluster(&["10.0.0.1"]));
    let mut w = Watched::start(dir.path().to_path_buf()).await;

    editor_write(&file, &cluster(&["10.0.0.1", "10.0.0.2"]));
    let batch = w.next(SECOND).await;
    assert_eq!(batch.len(), 1, "{batch:#?}");
    assert_eq!(
        endpoints(&w.live),
        Some(vec!["10.0.0.1".to_string(), "10.0.0.2".to_string()])
    );

    // A swap file alone is not a change.
    write(&dir.path().join(".cluster.yaml.swp"), "garbage: [");
    w.quiet(QUIET).await;
    assert!(w.errors.lock().expect("lock").is_empty());
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_directory_bad_files_keep_and_deleted_files_delete() {
    let dir = tempfile::tempdir().expect("tempdir");
    let svc = dir.path().join("svc.yaml");
    let nodes = dir.path().join("nodes.yaml");
    write(&svc, &cluster(&["10.0.0.1"]));
    write(&nodes, &format!("{}---\n{}", node("n1"), node("n2")));
    let mut w = Watched::start(dir.path().to_path_buf()).await;
    assert_eq!(w.live.nodes.len(), 2);

    // Garbage in place of the file: every object it defined stays.
    editor_write(&svc, "this: is: not yaml\n");
    let error = w.error(SECOND, "cannot parse YAML").await;
    assert!(
        error.ends_with("; keeping every object this file defined at its last good load"),
        "{error}"
    );
    w.quiet(QUIET).await;
    assert!(has_web(&w.live));
    assert_eq!(endpoints(&w.live), Some(vec!["10.0.0.1".to_string()]));

    // One broken document among good ones: the slice stays; the good document still applies.
    let text = format!(
        "{}---\nkind: [unclosed\n",
        service_yaml("  clusterIP: 10.96.0.10\n  ports:\n  - port: 81\n")
    );
    editor_write(&svc, &text);
    w.until(SECOND, |s| {
        s.services
            .get(&nn("default", "web"))
            .is_some_and(|svc| svc.ports[0].port == 81)
    })
    .await;
    assert_eq!(endpoints(&w.live), Some(vec!["10.0.0.1".to_string()]));

    // Fixed without the slice: now the slice is deleted.
    editor_write(
        &svc,
        &service_yaml("  clusterIP: 10.96.0.10\n  ports:\n  - port: 81\n"),
    );
    w.until(SECOND, |s| s.slices.is_empty()).await;
    assert!(has_web(&w.live));

    // Removing an object from a file that parses deletes it.
    write(&nodes, &node("n1"));
    w.until(SECOND, |s| !s.nodes.contains_key("n2")).await;

    // Deleting a file from the directory deletes its objects.
    std::fs::remove_file(&nodes).expect("remove");
    w.until(SECOND, |s| s.nodes.is_empty()).await;
    assert!(has_web(&w.live));
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_directory_deleted_and_recreated() {
    let top = tempfile::tempdir().expect("tempdir");
    let dir = top.path().join("manifests");
    std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
    write(&dir.join("svc.yaml"), &cluster(&["10.0.0.1"]));
    write(&dir.join("sub/node.yaml"), &node("n1"));
    let mut w = Watched::start(dir.clone()).await;
    assert_eq!(w.live.nodes.len(), 1);

    // rm -rf DIR: everything is kept, with one error.
    std::fs::remove_dir_all(&dir).expect("rm -rf");
    let error = w.error(SECOND, "cannot read").await;
    assert_eq!(
        error,
        format!(
            "{}: cannot read: No such file or directory (os error 2); keeping every object \
             last loaded from it",
            dir.display()
        )
    );
    w.quiet(QUIET).await;
    assert!(has_web(&w.live));
    assert_eq!(w.live.nodes.len(), 1);

    // Re-created with other content: read normally, within a second.
    std::fs::create_dir(&dir).expect("mkdir");
    write(&dir.join("svc.yaml"), &cluster(&["10.0.0.2"]));
    w.until(SECOND, |s| {
        endpoints(s) == Some(vec!["10.0.0.2".to_string()]) && s.nodes.is_empty()
    })
    .await;

    // The new directory is watched: a later change is seen within a second too.
    write(&dir.join("node.yaml"), &node("n3"));
    w.until(SECOND, |s| s.nodes.contains_key("n3")).await;
    assert_eq!(w.count_errors("cannot read"), 1);
    w.stop().await;
}

/// A ConfigMap volume as the kubelet writes it: `DIR/name -> ..data/name`,
/// `..data -> ..<timestamp>`.
#[cfg(unix)]
struct ConfigMapMount {
    dir: PathBuf,
    current: String,
    updates: usize,
}

#[cfg(unix)]
impl ConfigMapMount {
    fn new(dir: &Path, files: &[(&str, String)]) -> Self {
        let mut mount = ConfigMapMount {
            dir: dir.to_path_buf(),
            current: String::new(),
            updates: 0,
        };
        let ts = mount.write_timestamped(files);
        std::os::unix::fs::symlink(&ts, dir.join("..data")).expect("symlink ..data");
        for (name, _) in files {
            std::os::unix::fs::symlink(format!("..data/{name}"), dir.join(name)).expect("symlink");
        }
        mount.current = ts;
        mount
    }

    fn write_timestamped(&mut self, files: &[(&str, String)]) -> String {
        self.updates += 1;
        let ts = format!(
            "..2026_11_30_10_00_{:02}.{}",
            self.updates,
            100 + self.updates
        );
        std::fs::create_dir(self.dir.join(&ts)).expect("mkdir");
        for (name, text) in files {
            write(&self.dir.join(&ts).join(name), text);
        }
        ts
    }

    /// The kubelet's update: a new timestamped directory, `ln -s NEW ..data_tmp`,
    /// `mv -T ..data_tmp ..data`, then the old directory is removed.
    fn update(&mut self, files: &[(&str, String)]) {
        let ts = self.write_timestamped(files);
        std::os::unix::fs::symlink(&ts, self.dir.join("..data_tmp")).expect("symlink");
        // rename(2) replaces the old `..data` link atomically, as `mv -T` does.
        std::fs::rename(self.dir.join("..data_tmp"), self.dir.join("..data")).expect("mv -T");
        std::fs::remove_dir_all(self.dir.join(&self.current)).expect("rm old");
        self.current = ts;
    }
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_configmap_symlink_swap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut mount = ConfigMapMount::new(
        dir.path(),
        &[
            ("cluster.yaml", cluster(&["10.0.0.1"])),
            ("nodes.yaml", node("n1")),
        ],
    );
    let mut w = Watched::start(dir.path().to_path_buf()).await;
    assert_eq!(endpoints(&w.live), Some(vec!["10.0.0.1".to_string()]));

    for (round, ip) in ["10.0.0.2", "10.0.0.3", "10.0.0.4"].into_iter().enumerate() {
        mount.update(&[("cluster.yaml", cluster(&[ip])), ("nodes.yaml", node("n1"))]);
        w.until(SECOND, |s| endpoints(s) == Some(vec![ip.to_string()]))
            .await;
        assert!(w.live.nodes.contains_key("n1"), "round {round}");
    }

    // Watching one file of the mount works the same way.
    let mut one = Watched::start(dir.path().join("cluster.yaml")).await;
    mount.update(&[
        ("cluster.yaml", cluster(&["10.0.0.5"])),
        ("nodes.yaml", node("n1")),
    ]);
    one.until(SECOND, |s| {
        endpoints(s) == Some(vec!["10.0.0.5".to_string()])
    })
    .await;
    w.until(SECOND, |s| {
        endpoints(s) == Some(vec!["10.0.0.5".to_string()])
    })
    .await;
    assert!(w.errors.lock().expect("lock").is_empty());
    one.stop().await;
    w.stop().await;
}

#[tokio::test]
async fn missing_path_fails_fast() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (tx, _rx) = mpsc::channel(1);
    let result = timeout(
        Duration::from_secs(5),
        watch_manifests(dir.path().join("nope.yaml"), tx, |_| {}),
    )
    .await
    .expect("returns at once");
    assert!(
        matches!(result, Err(SourceError::Path { .. })),
        "{result:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_batch_skips_invalid_objects() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("cluster.yaml");
    let broken = cluster(&["10.0.0.1"]).replace("port: 80", "port: 70000");
    write(&file, &broken);
    let w = Watched::start(file).await;
    assert!(w.live.services.is_empty());
    assert_eq!(w.live.slices.len(), 1);
    let errors = w.errors.lock().expect("lock").clone();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].ends_with("70000 is out of range 1-65535"),
        "{errors:?}"
    );
    drop(errors);
    w.stop().await;
}

/// A file rewritten in place (`(sleep 1.5; cat good.yaml) > file`: truncated, then written
/// later) keeps its Service the whole time; one emptied for good (`: > file`) loses it after
/// the grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_rewritten_in_place_keeps_its_objects() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("cluster.yaml");
    write(&file, &cluster(&["10.0.0.1"]));
    let grace = Duration::from_secs(2);
    let mut w = Watched::start_with(
        file.clone(),
        WatchOptions {
            grace,
            state_dir: None,
        },
    )
    .await;
    write(&file, "");
    w.quiet(Duration::from_millis(1500)).await;
    assert!(has_web(&w.live));
    write(&file, &cluster(&["10.0.0.2"]));
    let batch = w.next(SECOND).await;
    assert_eq!(batch.len(), 1, "only the slice changed: {batch:#?}");
    assert_eq!(endpoints(&w.live), Some(vec!["10.0.0.2".to_string()]));

    write(&file, "");
    w.quiet(Duration::from_millis(1500)).await;
    assert!(has_web(&w.live), "kept during the grace period");
    w.until(Duration::from_secs(3), |s| !has_web(s)).await;
    assert!(w.live.slices.is_empty());
    w.stop().await;
}

/// A file still being written (its modification time keeps moving) is read once it has been
/// quiet for a moment, not half written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_being_written_is_read_when_it_is_stable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("cluster.yaml");
    write(&file, &cluster(&["10.0.0.1"]));
    let mut w = Watched::start(file.clone()).await;
    // The Service alone first (no slice yet), then, 150 ms later, the whole file: a reload in
    // between would remove the slice.
    let whole = cluster(&["10.0.0.2"]);
    let head = whole.split("---").next().unwrap().to_string();
    write(&file, &head);
    tokio::time::sleep(Duration::from_millis(150)).await;
    write(&file, &whole);
    let batch = w.next(Duration::from_secs(2)).await;
    assert_eq!(
        batch.len(),
        1,
        "one change, the slice's endpoint: {batch:#?}"
    );
    assert_eq!(endpoints(&w.live), Some(vec!["10.0.0.2".to_string()]));
    w.stop().await;
}

/// The periodic re-read parses nothing while no file changed, and still sees a change that
/// inotify cannot: a file reached through a symbolic link into a directory outside the path.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_periodic_reread_parses_only_a_changed_path() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().expect("tempdir");
    let outside = dir.path().join("outside");
    let watched = dir.path().join("m");
    std::fs::create_dir(&outside).expect("mkdir");
    std::fs::create_dir(&watched).expect("mkdir");
    let target = outside.join("cluster.yaml");
    write(&target, &cluster(&["10.0.0.1"]));
    std::os::unix::fs::symlink(&target, watched.join("cluster.yaml")).expect("symlink");
    let tuning = Tuning {
        resync: Duration::from_millis(200),
        ..Tuning::default()
    };
    let loads = Arc::clone(&tuning.loads);
    let mut w = Watched::start_tuned(watched, WatchOptions::new(), Some(tuning)).await;
    assert_eq!(endpoints(&w.live), Some(vec!["10.0.0.1".to_string()]));
    // Five periodic re-reads of an unchanged path: no load after the first (which loads
    // twice: once more after its watches were set).
    let initial = loads.load(Ordering::Relaxed);
    w.quiet(SECOND).await;
    assert_eq!(loads.load(Ordering::Relaxed), initial);

    // Not seen by inotify (the link's directory is not watched): the next re-read loads it.
    write(&target, &cluster(&["10.0.0.2"]));
    w.until(Duration::from_secs(3), |s| {
        endpoints(s) == Some(vec!["10.0.0.2".to_string()])
    })
    .await;
    let after_change = loads.load(Ordering::Relaxed);
    assert!(after_change > initial, "{after_change}");
    w.quiet(SECOND).await;
    assert_eq!(loads.load(Ordering::Relaxed), after_change);
    w.stop().await;
}
