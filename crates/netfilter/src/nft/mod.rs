//! The nftables host adapter: the [`Nft`] runner trait (one `nft -f -` transaction per call,
//! all or nothing), its real implementation [`ExecNft`] over the same [`Exec`](crate::Exec)
//! seam as iptables, a parser for the object listings `nft list chains`, `nft -t list sets`
//! and `nft -t list maps` print ([`TableObjects`]), a canonical form of full listings for
//! comparisons ([`canonical_listing`]), and the small pieces of nft syntax a rule generator
//! needs ([`quote`], [`family_name`], [`priority_value`]).
//!
//! Like the rest of this crate it knows nothing of Kubernetes: table names are parameters.
//!
//! ```no_run
//! use kp_netfilter::{ExecNft, IpVersion, Nft};
//!
//! let nft = ExecNft::new();
//! // runs `nft -f -` with the payload on stdin: one atomic transaction
//! nft.apply(b"add table ip demo\nadd chain ip demo c\n")?;
//! // runs `nft list chains ip`, `nft -t list sets ip`, `nft -t list maps ip`; keeps `demo`
//! let objects = nft.list_objects(IpVersion::V4, "demo")?;
//! assert!(objects.chains.contains_key("c"));
//! nft.delete_table(IpVersion::V4, "demo")?;
//! # Ok::<(), kp_netfilter::Error>(())
//! ```

mod listing;
mod runner;
mod syntax;

pub use listing::{BaseChainSpec, SetInfo, TableObjects, canonical_listing, parse_objects};
pub use runner::{ExecNft, NFT_BINARY, Nft, NftVersion};
pub use syntax::{family_name, parse_nft_duration, priority_value, quote};
