//! [`Store`]: what the API source has delivered of one kind, and the events that bring the
//! proxy from there to what the API server says now.
//!
//! Pure and synchronous; [`super::ApiSource::run`] feeds it the reflector's events.
//!
//! The store remembers what it delivered by [`Digest`] only, not the objects: the tracker
//! holds the one copy of each object (see [`crate::digest`]).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

use kp_model::{EndpointSlice, Escaped, Node, ObjectKind, Service, ServiceCidr, SourceEvent};

use super::ApiObjectError;
use crate::SourceError;
use crate::convert::ConvertWarning;
use crate::digest::Digest;
use crate::manifests::ObjectKey;

/// A converted object type the store can deliver.
pub(crate) trait Model: Hash {
    /// The upsert event carrying the object.
    fn upsert(self) -> SourceEvent;
}

impl Model for Service {
    fn upsert(self) -> SourceEvent {
        SourceEvent::ServiceUpsert(self)
    }
}

impl Model for EndpointSlice {
    fn upsert(self) -> SourceEvent {
        SourceEvent::SliceUpsert(self)
    }
}

impl Model for Node {
    fn upsert(self) -> SourceEvent {
        SourceEvent::NodeUpsert(self)
    }
}

impl Model for ServiceCidr {
    fn upsert(self) -> SourceEvent {
        SourceEvent::ServiceCidrUpsert(self)
    }
}

/// Logs the conversion warnings of an object being delivered, one line each:
/// `Service default/web: spec.clusterIP: "172.30.0.041" has leading zeros; ...`.
fn log_warnings(key: &ObjectKey, warnings: &[ConvertWarning]) {
    for w in warnings {
        tracing::warn!("{key}: {}", Escaped(&w.to_string()));
    }
}

/// What [`crate::convert`] made of one API object.
#[derive(Debug)]
pub(crate) enum Outcome<M> {
    /// Valid: deliver it; the warnings are logged when it is delivered (not again while it
    /// stays the same).
    Valid(M, Vec<ConvertWarning>),
    /// Not for this proxy (the reason, for the debug log): never delivered.
    Ignored(String),
    /// Invalid: keep the last valid version, if any.
    Invalid(SourceError),
}

/// A listed object, while a (re)list is being collected.
#[derive(Debug)]
enum Listed<M> {
    Valid(M, Vec<ConvertWarning>),
    /// Listed but invalid: its last valid version (if any) stays.
    Invalid,
}

/// The state of one kind; see the parent module's documentation for the policy.
#[derive(Debug)]
pub(crate) struct Store<M> {
    kind: ObjectKind,
    /// What the proxy has been sent, by key: the digest of each object.
    delivered: BTreeMap<ObjectKey, Digest>,
    /// The last error text reported per object, so each is reported once.
    reported: HashMap<ObjectKey, String>,
    /// The list being collected (between the first `InitApply` and `InitDone`).
    listing: Option<BTreeMap<ObjectKey, Listed<M>>>,
    /// Whether [`SourceEvent::Synced`] was sent.
    synced: bool,
}

impl<M: Model> Store<M> {
    /// An empty store of `kind`.
    pub(crate) fn new(kind: ObjectKind) -> Self {
        Store {
            kind,
            delivered: BTreeMap::new(),
            reported: HashMap::new(),
            listing: None,
            synced: false,
        }
    }

    /// A watch event `ADDED`/`MODIFIED`: the events it causes (none, one upsert or one
    /// delete).
    pub(crate) fn apply(
        &mut self,
        key: ObjectKey,
        outcome: Outcome<M>,
        errors: &dyn Fn(&ApiObjectError),
    ) -> Vec<SourceEvent> {
        match outcome {
            Outcome::Valid(object, warnings) => {
                self.reported.remove(&key);
                let digest = Digest::of(&object);
                if self.delivered.get(&key) == Some(&digest) {
                    return Vec::new();
                }
                log_warnings(&key, &warnings);
                self.delivered.insert(key, digest);
                vec![object.upsert()]
            }
            Outcome::Ignored(why) => {
                tracing::debug!(object = %key, reason = %why, "ignoring object");
                self.reported.remove(&key);
                self.delete(&key)
            }
            Outcome::Invalid(error) => {
                self.report(&key, &error, errors);
                Vec::new()
            }
        }
    }

    /// A watch event `DELETED`: a delete when the object was delivered.
    pub(crate) fn delete(&mut self, key: &ObjectKey) -> Vec<SourceEvent> {
        self.reported.remove(key);
        match self.delivered.remove(key) {
            Some(_) => vec![key.delete_event()],
            None => Vec::new(),
        }
    }

    /// One object of a (re)list; nothing is sent until [`Store::list_done`].
    pub(crate) fn list_apply(
        &mut self,
        key: ObjectKey,
        outcome: Outcome<M>,
        errors: &dyn Fn(&ApiObjectError),
    ) {
        let listed = match outcome {
            Outcome::Valid(object, warnings) => Listed::Valid(object, warnings),
            Outcome::Ignored(why) => {
                tracing::debug!(object = %key, reason = %why, "ignoring object");
                return;
            }
            Outcome::Invalid(error) => {
                self.report(&key, &error, errors);
                Listed::Invalid
            }
        };
        self.listing.get_or_insert_default().insert(key, listed);
    }

    /// Drops a partly collected list (the watcher will list again from the start).
    pub(crate) fn abort_list(&mut self) {
        self.listing = None;
    }

    /// The end of a (re)list: the events that turn what was delivered into what was listed
    /// (upserts of new and changed objects, then deletes of vanished ones), followed by
    /// [`SourceEvent::Synced`] the first time (never for ServiceCIDRs, which hold no sync
    /// back: see [`ObjectKind`]).
    pub(crate) fn list_done(&mut self) -> Vec<SourceEvent> {
        let listed = self.listing.take().unwrap_or_default();
        let mut next: BTreeMap<ObjectKey, Digest> = BTreeMap::new();
        let mut sends = Vec::new();
        for (key, entry) in listed {
            match entry {
                Listed::Valid(object, warnings) => {
                    self.reported.remove(&key);
                    let digest = Digest::of(&object);
                    if self.delivered.get(&key) != Some(&digest) {
                        log_warnings(&key, &warnings);
                        sends.push(object);
                    }
                    next.insert(key, digest);
                }
                Listed::Invalid => {
                    if let Some(old) = self.delivered.get(&key) {
                        next.insert(key, *old);
                    }
                }
            }
        }
        // New and changed objects, in key order; moved into their events, never copied.
        let mut events: Vec<SourceEvent> = sends.into_iter().map(Model::upsert).collect();
        for key in self.delivered.keys() {
            if !next.contains_key(key) {
                events.push(key.delete_event());
            }
        }
        // Errors of objects that are gone may be reported again if they come back.
        self.reported
            .retain(|key, _| next.contains_key(key) || self.delivered.contains_key(key));
        self.delivered = next;
        if !self.synced {
            self.synced = true;
            if self.kind != ObjectKind::ServiceCidr {
                events.push(SourceEvent::Synced(self.kind));
            }
        }
        events
    }

    /// Passes an invalid object's error to `errors`, unless it was the last one reported
    /// for that object.
    fn report(&mut self, key: &ObjectKey, error: &SourceError, errors: &dyn Fn(&ApiObjectError)) {
        let (field, message) = match error {
            SourceError::Invalid { field, message } => (field.clone(), message.clone()),
            other => (String::new(), other.to_string()),
        };
        let error = ApiObjectError {
            object: key.clone(),
            field,
            message,
            kept: self.delivered.contains_key(key),
        };
        let text = error.to_string();
        if self.reported.get(key) == Some(&text) {
            return;
        }
        tracing::debug!(error = %text, "invalid object from the API server");
        errors(&error);
        self.reported.insert(key.clone(), text);
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use kp_model::NamespacedName;

    use super::*;

    /// A stand-in model: a name and a version.
    #[derive(Debug, Clone, PartialEq, Hash)]
    struct Obj(&'static str, u32);

    impl Model for Obj {
        fn upsert(self) -> SourceEvent {
            SourceEvent::NodeUpsert(Node {
                name: format!("{}-{}", self.0, self.1),
                ..Node::default()
            })
        }
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::Node(name.to_string())
    }

    fn up(name: &str, v: u32) -> SourceEvent {
        SourceEvent::NodeUpsert(Node {
            name: format!("{name}-{v}"),
            ..Node::default()
        })
    }

    fn bad() -> Outcome<Obj> {
        Outcome::Invalid(SourceError::invalid("spec.x", "bad"))
    }

    #[test]
    fn relist_sends_only_the_difference_and_synced_once() {
        let errs = RefCell::new(Vec::new());
        let report = |e: &ApiObjectError| errs.borrow_mut().push(e.to_string());
        let mut store = Store::new(ObjectKind::Node);
        store.list_apply(key("a"), Outcome::Valid(Obj("a", 1), Vec::new()), &report);
        store.list_apply(key("b"), Outcome::Valid(Obj("b", 1), Vec::new()), &report);
        store.list_apply(key("c"), Outcome::Valid(Obj("c", 1), Vec::new()), &report);
        assert_eq!(
            store.list_done(),
            vec![
                up("a", 1),
                up("b", 1),
                up("c", 1),
                SourceEvent::Synced(ObjectKind::Node)
            ]
        );
        // Relist: a unchanged, b changed, c gone, d new.
        store.list_apply(key("a"), Outcome::Valid(Obj("a", 1), Vec::new()), &report);
        store.list_apply(key("b"), Outcome::Valid(Obj("b", 2), Vec::new()), &report);
        store.list_apply(key("d"), Outcome::Valid(Obj("d", 1), Vec::new()), &report);
        assert_eq!(
            store.list_done(),
            vec![up("b", 2), up("d", 1), SourceEvent::NodeDelete("c".into())]
        );
        // An empty relist deletes everything.
        assert_eq!(
            store.list_done(),
            vec![
                SourceEvent::NodeDelete("a".into()),
                SourceEvent::NodeDelete("b".into()),
                SourceEvent::NodeDelete("d".into()),
            ]
        );
        assert!(errs.borrow().is_empty());
    }

    #[test]
    fn invalid_objects_keep_the_last_valid_version_and_are_reported_once() {
        let errs = RefCell::new(Vec::new());
        let report = |e: &ApiObjectError| errs.borrow_mut().push(e.to_string());
        let mut store = Store::new(ObjectKind::Node);
        assert_eq!(
            store.apply(key("a"), Outcome::Valid(Obj("a", 1), Vec::new()), &report),
            vec![up("a", 1)]
        );
        assert!(store.apply(key("a"), bad(), &report).is_empty());
        assert!(store.apply(key("a"), bad(), &report).is_empty());
        assert!(store.apply(key("new"), bad(), &report).is_empty());
        assert_eq!(
            *errs.borrow(),
            vec![
                "Node a: spec.x: bad; keeping the last valid version".to_string(),
                "Node new: spec.x: bad".to_string(),
            ]
        );
        // A relist with the invalid version keeps the old one: nothing to send.
        store.list_apply(key("a"), bad(), &report);
        store.list_apply(key("new"), bad(), &report);
        assert_eq!(
            store.list_done(),
            vec![SourceEvent::Synced(ObjectKind::Node)]
        );
        assert_eq!(errs.borrow().len(), 2);
        // Fixed: delivered.
        assert_eq!(
            store.apply(key("a"), Outcome::Valid(Obj("a", 2), Vec::new()), &report),
            vec![up("a", 2)]
        );
    }

    #[test]
    fn ignored_and_deleted_objects_are_deleted_once() {
        let report = |_: &ApiObjectError| {};
        let mut store = Store::new(ObjectKind::Service);
        let svc = ObjectKey::Service(NamespacedName::new("default", "web"));
        assert_eq!(
            store.apply(
                svc.clone(),
                Outcome::Valid(Obj("web", 1), Vec::new()),
                &report
            ),
            vec![up("web", 1)]
        );
        assert!(
            store
                .apply(
                    svc.clone(),
                    Outcome::Valid(Obj("web", 1), Vec::new()),
                    &report
                )
                .is_empty()
        );
        assert_eq!(
            store.apply(svc.clone(), Outcome::Ignored("label".into()), &report),
            vec![SourceEvent::ServiceDelete(NamespacedName::new(
                "default", "web"
            ))]
        );
        assert!(store.delete(&svc).is_empty());
    }

    #[test]
    fn an_aborted_list_is_forgotten() {
        let report = |_: &ApiObjectError| {};
        let mut store = Store::new(ObjectKind::Node);
        store.list_apply(key("a"), Outcome::Valid(Obj("a", 1), Vec::new()), &report);
        store.abort_list();
        assert_eq!(
            store.list_done(),
            vec![SourceEvent::Synced(ObjectKind::Node)]
        );
    }
}
