//! The last good state: what a reload keeps when an edit breaks an object, a file or the path,
//! and what it still deletes.

use std::path::Path;

use kp_model::{NamespacedName, SourceEvent};

use super::{service_yaml, slice_yaml};
use crate::last_good::LastGood;
use crate::manifests::{ManifestError, ObjectKey, load_path_detailed};

fn nn(ns: &str, name: &str) -> NamespacedName {
    NamespacedName::new(ns, name)
}

/// Service `name` with ClusterIP `ip` and port 80.
fn svc(name: &str, ip: &str) -> String {
    service_yaml(&format!("  clusterIP: {ip}\n  ports:\n  - port: 80\n"))
        .replace("name: web", &format!("name: {name}"))
}

fn slice(endpoint: &str) -> String {
    slice_yaml(&format!("endpoints:\n- addresses: [{endpoint}]\n"))
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write");
}

/// Reloads `path` into `state`; returns the events and the errors as text.
fn reload(state: &mut LastGood, path: &Path) -> (Vec<SourceEvent>, Vec<String>) {
    let (next, errors, events) = state.merge(load_path_detailed(path));
    *state = next;
    (
        events,
        errors.iter().map(ManifestError::to_string).collect(),
    )
}

fn first(path: &Path) -> (LastGood, Vec<String>) {
    let (state, errors, _) = LastGood::first(load_path_detailed(path));
    (state, errors.iter().map(ManifestError::to_string).collect())
}

#[test]
fn invalid_object_keeps_its_last_valid_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("a.yaml");
    write(
        &file,
        &format!("{}---\n{}", svc("web", "10.96.0.10"), slice("10.0.0.1")),
    );
    let (mut state, errors) = first(&file);
    assert!(errors.is_empty(), "{errors:?}");

    // A bad clusterIP, and a changed slice: the Service stays as it was, the slice changes.
    write(
        &file,
        &format!("{}---\n{}", svc("web", "10.96.0.300"), slice("10.0.0.2")),
    );
    let (events, errors) = reload(&mut state, &file);
    assert!(
        matches!(&events[..], [SourceEvent::SliceUpsert(s)] if s.endpoints[0].address.to_string() == "10.0.0.2"),
        "{events:#?}"
    );
    assert_eq!(
        errors,
        [format!(
            "{}:1: Service default/web: spec.clusterIP: \"10.96.0.300\" is not a valid IP \
             address; keeping the last valid version",
            file.display()
        )]
    );
    // Kept: still applied, and nothing was sent for it (the tracker keeps 10.96.0.10).
    assert!(state.holds(&ObjectKey::Service(nn("default", "web"))));
    assert!(state.files()[&file].contains(&ObjectKey::Service(nn("default", "web"))));

    // A field of the wrong type is the same.
    write(
        &file,
        &format!(
            "{}---\n{}",
            svc("web", "10.96.0.10").replace("port: 80", "port: eighty"),
            slice("10.0.0.2")
        ),
    );
    let (events, errors) = reload(&mut state, &file);
    assert!(events.is_empty(), "{events:#?}");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].ends_with("; keeping the last valid version"),
        "{errors:?}"
    );

    // A new object that never was valid is skipped, with the plain error.
    write(
        &file,
        &format!(
            "{}---\n{}---\n{}",
            svc("web", "10.96.0.10"),
            slice("10.0.0.2"),
            svc("new", "10.96.0.999")
        ),
    );
    let (events, errors) = reload(&mut state, &file);
    assert!(events.is_empty(), "{events:#?}");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].ends_with("is not a valid IP address"),
        "{errors:?}"
    );

    // Removing the object from the file (which parses) deletes it.
    write(&file, &slice("10.0.0.2"));
    let (events, errors) = reload(&mut state, &file);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(events, [SourceEvent::ServiceDelete(nn("default", "web"))]);
}

#[test]
fn first_load_skips_invalid_objects() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("a.yaml");
    write(
        &file,
        &format!("{}---\n{}", svc("web", "10.96.0.300"), slice("10.0.0.1")),
    );
    let (state, errors) = first(&file);
    assert!(!state.holds(&ObjectKey::Service(nn("default", "web"))));
    assert_eq!(state.len(), 1, "the slice");
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].ends_with("is not a valid IP address"),
        "{errors:?}"
    );
}

#[test]
fn broken_file_keeps_everything_it_defined() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = dir.path().join("a.yaml");
    let b = dir.path().join("b.yaml");
    write(
        &a,
        &format!("{}---\n{}", svc("web", "10.96.0.10"), slice("10.0.0.1")),
    );
    write(&b, &svc("other", "10.96.0.11"));
    let (mut state, _) = first(dir.path());

    // Garbage in place of a.yaml: both of its objects stay; b.yaml is unaffected.
    write(&a, "this: is: not yaml\n");
    let (events, errors) = reload(&mut state, dir.path());
    assert!(events.is_empty(), "{events:#?}");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("cannot parse YAML"), "{errors:?}");
    assert!(
        errors[0].ends_with("; keeping every object this file defined at its last good load"),
        "{errors:?}"
    );

    // One unparsable document (the slice's): the slice stays, the Service's change applies,
    // and a new object in a good document is added.
    write(
        &a,
        &format!(
            "{}---\nkind: [\n---\n{}",
            svc("web", "10.96.0.20"),
            svc("added", "10.96.0.21")
        ),
    );
    let (events, errors) = reload(&mut state, dir.path());
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(events.len(), 2, "{events:#?}");
    assert!(
        matches!(&events[0], SourceEvent::ServiceUpsert(s) if s.name == nn("default", "added"))
    );
    assert!(matches!(&events[1], SourceEvent::ServiceUpsert(s) if s.name == nn("default", "web")));
    assert!(state.holds(&ObjectKey::EndpointSlice(nn("default", "web-abc"))));

    // An object that cannot be identified (no name) also makes the file incomplete.
    write(&a, "apiVersion: v1\nkind: Service\nmetadata: {}\n");
    let (events, errors) = reload(&mut state, dir.path());
    assert!(events.is_empty(), "{events:#?}");
    assert!(errors[0].ends_with("at its last good load"), "{errors:?}");

    // Not UTF-8: unreadable, kept.
    std::fs::write(&a, [0xff, 0xfe, 0x00]).expect("write");
    let (events, errors) = reload(&mut state, dir.path());
    assert!(events.is_empty(), "{events:#?}");
    assert!(errors[0].contains("not UTF-8"), "{errors:?}");

    // Fixed: read normally; what it no longer defines is deleted.
    write(&a, &svc("web", "10.96.0.20"));
    let (events, errors) = reload(&mut state, dir.path());
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(
        events,
        [
            SourceEvent::ServiceDelete(nn("default", "added")),
            SourceEvent::SliceDelete(nn("default", "web-abc")),
        ]
    );

    // Deleting a file from the directory (which still exists) deletes its objects.
    std::fs::remove_file(&b).expect("remove");
    let (events, errors) = reload(&mut state, dir.path());
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(events, [SourceEvent::ServiceDelete(nn("default", "other"))]);
}

#[test]
fn missing_path_keeps_everything_until_it_returns() {
    let top = tempfile::tempdir().expect("tempdir");
    let dir = top.path().join("m");
    std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
    write(&dir.join("a.yaml"), &svc("web", "10.96.0.10"));
    write(&dir.join("sub/b.yaml"), &slice("10.0.0.1"));
    let (mut state, _) = first(&dir);

    std::fs::remove_dir_all(&dir).expect("rm -rf");
    let (events, errors) = reload(&mut state, &dir);
    assert!(events.is_empty(), "{events:#?}");
    assert_eq!(
        errors,
        [format!(
            "{}: cannot read: No such file or directory (os error 2); keeping every object last \
             loaded from it",
            dir.display()
        )]
    );
    assert_eq!(state.files().len(), 2);
    // Still missing at the next reload: the same.
    let (events, _) = reload(&mut state, &dir);
    assert!(events.is_empty(), "{events:#?}");

    // Back with only a.yaml: the slice is deleted.
    std::fs::create_dir(&dir).expect("mkdir");
    write(&dir.join("a.yaml"), &svc("web", "10.96.0.10"));
    let (events, errors) = reload(&mut state, &dir);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(events, [SourceEvent::SliceDelete(nn("default", "web-abc"))]);
}

#[test]
fn unreadable_subdirectory_keeps_its_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).expect("mkdir");
    write(&sub.join("b.yaml"), &slice("10.0.0.1"));
    write(&dir.path().join("a.yaml"), &svc("web", "10.96.0.10"));
    let (state, _) = first(dir.path());

    // What a load finds when `sub` cannot be listed (permissions; root can list anything, so
    // the load is made by hand).
    let mut loaded = load_path_detailed(dir.path());
    loaded.files.retain(|file, _| !file.starts_with(&sub));
    loaded.set.slices.clear();
    loaded.directories.retain(|d| d != &sub);
    loaded.errors.push(ManifestError {
        file: sub.clone(),
        line: None,
        object: None,
        field: None,
        message: "cannot read directory: Permission denied (os error 13)".into(),
    });
    loaded.unreadable.push((sub.clone(), 0));

    let (next, errors, events) = state.merge(loaded);
    assert!(events.is_empty(), "{events:#?}");
    assert_eq!(next.len(), state.len());
    assert_eq!(
        errors[0].to_string(),
        format!(
            "{}: cannot read directory: Permission denied (os error 13); keeping every object \
             last loaded from it",
            sub.display()
        )
    );
    assert!(next.files().contains_key(&sub.join("b.yaml")));
}

#[test]
fn object_moved_between_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = dir.path().join("a.yaml");
    let b = dir.path().join("b.yaml");
    write(&a, &svc("web", "10.96.0.10"));
    write(&b, &slice("10.0.0.1"));
    let (mut state, _) = first(dir.path());

    // Moved from a.yaml to b.yaml in one go: nothing changes for the proxy.
    write(&a, "");
    write(
        &b,
        &format!("{}---\n{}", slice("10.0.0.1"), svc("web", "10.96.0.10")),
    );
    let (events, errors) = reload(&mut state, dir.path());
    assert!(
        events.is_empty() && errors.is_empty(),
        "{events:#?} {errors:?}"
    );
    assert!(state.files()[&b].contains(&ObjectKey::Service(nn("default", "web"))));
    assert!(state.files()[&a].is_empty());
}

#[test]
fn an_emptied_file_keeps_its_objects_for_the_grace_period() {
    use crate::last_good::EmptiedNotice;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().expect("tempdir");
    let a = dir.path().join("a.yaml");
    let b = dir.path().join("b.yaml");
    write(
        &a,
        &format!("{}---\n{}", svc("web", "10.96.0.10"), slice("10.0.0.1")),
    );
    write(&b, &svc("other", "10.96.0.11"));
    let (state, _) = first(dir.path());
    let grace = Duration::from_secs(10);
    let t0 = Instant::now();

    // Truncated (a rewrite in place begins): both objects stay, one notice.
    write(&a, "");
    let (s1, errors, notices, events) = state.merge_at(load_path_detailed(dir.path()), t0, grace);
    assert!(errors.is_empty(), "{errors:?}");
    assert!(events.is_empty(), "nothing removed yet");
    assert_eq!(
        notices,
        [EmptiedNotice::Kept {
            file: a.clone(),
            objects: 2,
            grace
        }]
    );
    assert!(
        notices[0].to_string().contains("rename it over"),
        "{}",
        notices[0]
    );
    assert_eq!(s1.grace_deadline(grace), Some(t0 + grace));

    // Still empty 5 s later: still kept, no second notice.
    let (s2, _, notices, events) = s1.merge_at(
        load_path_detailed(dir.path()),
        t0 + Duration::from_secs(5),
        grace,
    );
    assert!(events.is_empty());
    assert!(notices.is_empty(), "{notices:?}");

    // The rewrite completes: the file's objects are read normally (an endpoint changed).
    write(
        &a,
        &format!("{}---\n{}", svc("web", "10.96.0.10"), slice("10.0.0.2")),
    );
    let (s3, _, notices, events) = s2.merge_at(
        load_path_detailed(dir.path()),
        t0 + Duration::from_secs(6),
        grace,
    );
    assert!(notices.is_empty());
    assert_eq!(s3.grace_deadline(grace), None);
    assert!(
        matches!(&events[..], [SourceEvent::SliceUpsert(_)]),
        "only the slice changed: {events:#?}"
    );

    // Emptied for good (`: > a.yaml`): kept for the grace period, then removed, with a notice.
    write(&a, "");
    let t1 = t0 + Duration::from_secs(20);
    let (s4, _, _, events) = s3.merge_at(load_path_detailed(dir.path()), t1, grace);
    assert!(events.is_empty());
    let (s5, _, notices, events) = s4.merge_at(load_path_detailed(dir.path()), t1 + grace, grace);
    assert_eq!(
        notices,
        [EmptiedNotice::Removed {
            file: a.clone(),
            objects: 2
        }]
    );
    assert_eq!(
        events,
        [
            SourceEvent::ServiceDelete(nn("default", "web")),
            SourceEvent::SliceDelete(nn("default", "web-abc"))
        ],
        "the Service and its slice go"
    );
    assert!(s5.holds(&ObjectKey::Service(nn("default", "other"))));

    // Deleting a file removes its objects at once, grace or not.
    std::fs::remove_file(&b).expect("remove");
    let (s6, _, notices, events) = s5.merge_at(load_path_detailed(dir.path()), t1 + grace, grace);
    assert!(notices.is_empty());
    assert!(!s6.holds(&ObjectKey::Service(nn("default", "other"))));
    assert_eq!(events, [SourceEvent::ServiceDelete(nn("default", "other"))]);
}
