//! kp-track: pure, synchronous change tracking.
//!
//! The [`Tracker`] holds the latest Service, EndpointSlice, Node and ServiceCIDR objects a source
//! delivered, remembers which Services changed since the last [`Tracker::checkout`], and
//! builds the per-family [`Snapshot`](kp_model::Snapshot) a proxier renders:
//!
//! - Services become one [`ServicePortInfo`](kp_model::ServicePortInfo) per port; ExternalName
//!   and headless Services, and Services without a cluster IP of the tracker's family, are
//!   skipped (upstream's `ShouldSkipService`).
//! - EndpointSlices are merged per Service: an endpoint (`ip:port`) present in two slices is
//!   counted once, a local copy winning; endpoints are matched to Service ports by port name
//!   and protocol, and sorted by their `ip:port` text like upstream's endpoints map.
//! - ServiceCIDRs: the snapshot carries the union of this family's `spec.cidrs` (upstream's
//!   `OnServiceCIDRsChanged`), for nftables mode's drop of traffic to unallocated ClusterIPs.
//! - [`categorize`] implements endpoint selection: traffic policies, topology hints and the
//!   terminating-endpoint fallback (upstream's `CategorizeEndpoints`).
//!
//! - [`split_by_family`] cuts a source batch into what each family's tracker of a
//!   dual-stack node keeps, so no tracker gets a copy of objects it would drop.
//!
//! Nothing here does I/O or depends on the Kubernetes API types.

mod fan_out;
mod topology;
mod tracker;

pub use fan_out::split_by_family;

pub use topology::{Categorized, categorize};
pub use tracker::{PendingChanges, Tracker};
