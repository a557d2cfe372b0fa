//! [`SourceEvent`]: what a source (API watch or manifest directory) tells the tracker.

use crate::{EndpointSlice, NamespacedName, Node, Service};

/// The kinds of object a source delivers; each must report its initial list
/// ([`SourceEvent::Synced`]) before the first sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    /// `v1.Service`.
    Service,
    /// `discovery.k8s.io/v1.EndpointSlice`.
    EndpointSlice,
    /// `v1.Node` (only this node's own object is of interest).
    Node,
}

/// A change seen by a source. Upserts carry the whole new object; the tracker compares it with
/// what it holds, so a source may repeat an unchanged object without causing a sync.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceEvent {
    /// A Service was added or changed.
    ServiceUpsert(Service),
    /// A Service was deleted (or became invalid or ignored).
    ServiceDelete(NamespacedName),
    /// An EndpointSlice was added or changed.
    SliceUpsert(EndpointSlice),
    /// An EndpointSlice was deleted; the slice's own namespace/name.
    SliceDelete(NamespacedName),
    /// A Node was added or changed.
    NodeUpsert(Node),
    /// A Node was deleted; its name.
    NodeDelete(String),
    /// The source has delivered its complete initial list of this kind.
    Synced(ObjectKind),
}
