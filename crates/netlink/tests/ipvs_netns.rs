//! IPVS over generic netlink against the host kernel, inside a fresh network namespace
//! (root; CI runs them).
//!
//! The host kernel has no IPVS, so what can be checked here is that [`Ipvs::new`]
//! reaches the generic netlink controller and reports the missing family as the
//! distinct [`Error::IpvsUnavailable`]. When the kernel does have IPVS (a guest kernel,
//! or a host with `ip_vs`), the scripted round trip runs instead and must agree with
//! [`FakeIpvs`]. The real-kernel checks live in `kernel_vm.rs`, which runs them in the
//! qemu guest of `kp_testkit::vm` on this host.

use kp_netlink::ipvs::scripted_round_trip;
use kp_netlink::{Error, FakeIpvs, Ipvs, IpvsOps};
use kp_testkit::{Netns, require_root};

#[test]
fn ipvs_is_reported_missing_or_agrees_with_the_fake() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("ipvs").expect("namespace");
    let opened = ns.in_ns(Ipvs::new).expect("enter namespace");
    match opened {
        Err(e @ Error::IpvsUnavailable { .. }) => {
            eprintln!("as expected on this kernel: {e}");
            assert!(e.to_string().contains("IPVS is not available"), "{e}");
            assert_eq!(e.code(), Some(nix::errno::Errno::ENOENT as i32));
        }
        Err(other) => panic!("expected IpvsUnavailable, got {other:?}"),
        Ok(mut ipvs) => {
            // A kernel with IPVS: the namespace's table starts empty and behaves like
            // the fake, step by step.
            let info = ipvs.info().expect("IPVS_CMD_GET_INFO");
            assert_eq!(info.version.0, 1);
            ipvs.set_capture(true);
            let kernel = scripted_round_trip(&mut ipvs).expect("round trip");
            let fake = scripted_round_trip(&mut FakeIpvs::new()).expect("fake round trip");
            assert_eq!(kernel, fake);
            assert!(!ipvs.take_captured().is_empty());
        }
    }
}
