//! The watcher: initial batch, a change within a second, deletion, errors, and shutdown.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kp_model::{NamespacedName, ObjectKind, SourceEvent};
use tokio::sync::mpsc;
use tokio::time::timeout;

use super::{service_yaml, slice_yaml};
use crate::SourceError;
use crate::watch::watch_manifests;

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

async fn next(rx: &mut mpsc::Receiver<Vec<SourceEvent>>, within: Duration) -> Vec<SourceEvent> {
    match timeout(within, rx.recv()).await {
        Ok(Some(batch)) => batch,
        Ok(None) => panic!("watcher stopped"),
        Err(_) => panic!("no batch within {within:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_file_changes_and_deletion() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("cluster.yaml");
    std::fs::write(&file, cluster(&["10.0.0.1", "10.0.0.2"])).expect("write");

    let reported = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = Arc::clone(&reported);
    let (tx, mut rx) = mpsc::channel(16);
    let task = tokio::spawn(watch_manifests(file.clone(), tx, move |e| {
        sink.lock().expect("lock").push(e.to_string());
    }));

    let initial = next(&mut rx, Duration::from_secs(5)).await;
    assert_eq!(initial.len(), 5, "{initial:#?}");
    assert_eq!(initial[4], SourceEvent::Synced(ObjectKind::Node));

    // An unrelated file in the same directory changes nothing.
    std::fs::write(dir.path().join("other.txt"), "x").expect("write");

    // Remove an endpoint: the changed slice arrives well within a second.
    std::fs::write(&file, cluster(&["10.0.0.1"])).expect("write");
    let batch = next(&mut rx, Duration::from_secs(1)).await;
    assert_eq!(batch.len(), 1, "{batch:#?}");
    match &batch[0] {
        SourceEvent::SliceUpsert(slice) => {
            assert_eq!(slice.endpoints.len(), 1);
            assert_eq!(slice.endpoints[0].address.to_string(), "10.0.0.1");
        }
        other => panic!("expected a slice upsert, got {other:?}"),
    }

    // An editor-style replace (write a temporary file, rename over) with a broken object.
    let tmp = dir.path().join(".cluster.yaml.swp");
    let broken = cluster(&["10.0.0.1"]).replace("port: 80", "port: 70000");
    std::fs::write(&tmp, broken).expect("write");
    std::fs::rename(&tmp, &file).expect("rename");
    let batch = next(&mut rx, Duration::from_secs(1)).await;
    assert_eq!(
        batch,
        [SourceEvent::ServiceDelete(NamespacedName::new(
            "default", "web"
        ))]
    );
    assert!(
        reported
            .lock()
            .expect("lock")
            .iter()
            .any(|e| e.contains("spec.ports[0].port: 70000")),
        "{reported:?}"
    );

    // Delete the file: everything is deleted, and the error is reported.
    std::fs::remove_file(&file).expect("remove");
    let batch = next(&mut rx, Duration::from_secs(1)).await;
    assert_eq!(
        batch,
        [SourceEvent::SliceDelete(NamespacedName::new(
            "default", "web-abc"
        ))]
    );
    let errors = reported.lock().expect("lock").clone();
    assert!(
        errors.last().is_some_and(|e| e.contains("cannot read")),
        "{errors:?}"
    );
    // The stale port error was reported once only.
    assert_eq!(
        errors.iter().filter(|e| e.contains("70000")).count(),
        1,
        "{errors:?}"
    );

    // Closing the receiver ends the task.
    drop(rx);
    let result = timeout(Duration::from_secs(5), task)
        .await
        .expect("task ends")
        .expect("join");
    assert!(result.is_ok(), "{result:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("svc.yaml"), cluster(&["10.0.0.1"])).expect("write");
    let (tx, mut rx) = mpsc::channel(16);
    let task = tokio::spawn(watch_manifests(dir.path().to_path_buf(), tx, |_| {}));
    let initial = next(&mut rx, Duration::from_secs(5)).await;
    assert_eq!(initial.len(), 5, "{initial:#?}");

    std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
    std::fs::write(
        dir.path().join("sub/node.yaml"),
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n",
    )
    .expect("write");
    let batch = next(&mut rx, Duration::from_secs(1)).await;
    assert!(
        matches!(&batch[..], [SourceEvent::NodeUpsert(n)] if n.name == "n1"),
        "{batch:#?}"
    );
    drop(rx);
    let result = timeout(Duration::from_secs(5), task)
        .await
        .expect("task ends")
        .expect("join");
    assert!(result.is_ok(), "{result:?}");
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
