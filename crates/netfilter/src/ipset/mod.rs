//! The ipset host adapter for kube-proxy's IPVS mode: set descriptions, the `ipset save`
//! parser, restore payload builders, the [`Ipset`] runner trait with its real
//! ([`ExecIpset`]) and checking fake ([`FakeIpset`]) implementations.
//!
//! Driven the way upstream kube-proxy's IPVS proxier (and ipset's authors) intend: state
//! read with one `ipset save`, changes written with one `ipset restore` per sync.
//!
//! ```no_run
//! use kp_netfilter::ipset::{ExecIpset, Ipset, SetFamily, SetKind, SetSpec, SetState, diff};
//!
//! let ipset = ExecIpset::new();
//! assert!(ipset.version()?.is_supported());
//! let spec = SetSpec::hash("KUBE-CLUSTER-IP", SetKind::HashIpPort, SetFamily::Inet);
//! let desired = [SetState::with_entries(spec, ["10.96.0.1,tcp:443"])];
//! let current: Vec<SetState> =
//!     ipset.save()?.into_iter().filter(|s| s.spec.name.starts_with("KUBE-")).collect();
//! let payload = diff(&desired, &current);
//! if !payload.is_empty() {
//!     ipset.restore(&payload)?;
//! }
//! # Ok::<(), kp_netfilter::Error>(())
//! ```

mod fake;
mod restore;
mod runner;
mod types;

pub use fake::FakeIpset;
pub use restore::{RestoreBuilder, TEMP_SET_NAME, diff};
pub use runner::{ExecIpset, IPSET_BINARY, Ipset, IpsetVersion, MIN_IPSET_VERSION};
pub use types::{
    DEFAULT_HASHSIZE, DEFAULT_MAXELEM, MAX_SET_NAME, SetFamily, SetKind, SetSpec, SetState,
    canonical_entry, parse_save, render_save,
};
