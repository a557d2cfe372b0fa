//! [`SourceEvent`]: what a source (API watch or manifest directory) tells the tracker.

use crate::{EndpointSlice, NamespacedName, Node, Service, ServiceCidr};

/// The kinds of object a source delivers. Services and EndpointSlices must report their
/// initial list ([`SourceEvent::Synced`]) before the first sync; Nodes report it too, and
/// ServiceCIDRs never hold the first sync back (as upstream, whose proxier does not wait for
/// its ServiceCIDR informer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    /// `v1.Service`.
    Service,
    /// `discovery.k8s.io/v1.EndpointSlice`.
    EndpointSlice,
    /// `v1.Node` (only this node's own object is of interest).
    Node,
    /// `networking.k8s.io/v1.ServiceCIDR`.
    ServiceCidr,
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
    /// A ServiceCIDR was added or changed.
    ServiceCidrUpsert(ServiceCidr),
    /// A ServiceCIDR was deleted (or became invalid); its name.
    ServiceCidrDelete(String),
    /// The source has delivered its complete initial list of this kind.
    Synced(ObjectKind),
}
