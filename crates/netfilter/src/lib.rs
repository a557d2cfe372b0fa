//! kp-netfilter: host adapters for netfilter.
//!
//! The [`iptables`] module (re-exported at the crate root) holds everything the proxier
//! needs to drive `iptables-restore` / `iptables-save` and everything a test needs to
//! check what it wrote:
//!
//! * a typed rule IR ([`Ruleset`], [`Chain`], [`Rule`], [`Match`], [`Target`]) whose
//!   `Display` is byte-for-byte the canonical `iptables-save` form;
//! * parsers for `iptables-save` output ([`parse_save`]) and `iptables-restore` input
//!   ([`parse_restore`]);
//! * the [`Iptables`] runner trait, its real implementation [`ExecIptables`] (which runs
//!   the binaries through an [`Exec`] seam) and a checking fake [`FakeIptables`] that
//!   applies restore payloads with the kernel's checks.
//!
//! The [`nft`] module (also re-exported at the crate root) drives `nft`: the [`Nft`] runner
//! trait (one `nft -f -` transaction per call) with its real implementation [`ExecNft`] over
//! the same [`Exec`] seam, and a parser for nft's object listings ([`TableObjects`]).
//!
//! The [`ipset`] module drives `ipset` for the IPVS mode: the [`Ipset`] runner trait (one
//! `ipset restore` per sync, state read with `ipset save`), its real implementation
//! [`ExecIpset`] over the same [`Exec`] seam, a checking fake [`FakeIpset`], and payload
//! builders ([`RestoreBuilder`], [`ipset::diff`]). Its main items are re-exported at the
//! crate root; its `parse_save` is not (the root's is iptables').
//!
//! This crate deliberately knows nothing about Kubernetes objects: it does not depend on
//! `kp-model`.

mod error;
pub mod ipset;
pub mod iptables;
pub mod nft;

pub use error::{Error, ParseError};
pub use ipset::{
    ExecIpset, FakeIpset, Ipset, IpsetVersion, RestoreBuilder, SetFamily, SetKind, SetSpec,
    SetState,
};
pub use iptables::*;
pub use nft::{
    BaseChainSpec, ExecNft, NFT_BINARY, Nft, NftVersion, SetInfo, TableObjects, canonical_listing,
    family_name, parse_nft_duration, parse_objects, priority_value, quote,
};
