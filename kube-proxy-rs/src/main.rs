//! kube-proxy-rs
fn main() {}
