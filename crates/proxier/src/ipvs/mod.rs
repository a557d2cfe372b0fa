//! IPVS mode: upstream kube-proxy's `--proxy-mode ipvs` layout.
//!
//! Services become kernel IPVS virtual servers (a hash table: the per-packet cost does not
//! grow with the number of Services), their addresses are bound to the dummy link
//! `kube-ipvs0`, and a fixed handful of iptables rules match upstream's ipsets for
//! masquerading, hairpin, NodePorts, firewalls and filtering.
//!
//! [`render`] turns a snapshot into the desired state (pure).

pub mod names;
pub mod render;
