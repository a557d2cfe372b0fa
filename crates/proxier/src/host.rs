//! The host seam: what a proxier asks of the node besides netfilter (local addresses,
//! sysctls). [`RealHost`] reads the kernel; tests use [`FakeHost`].

use std::collections::BTreeMap;
use std::io;
use std::net::IpAddr;
use std::sync::Mutex;

/// Node facilities a proxier needs.
pub trait Host: Send + Sync {
    /// Every address configured on a local interface (`ip addr`), in this network namespace.
    ///
    /// # Errors
    /// The OS error of `getifaddrs(3)`.
    fn local_addresses(&self) -> io::Result<Vec<IpAddr>>;

    /// Writes a sysctl, e.g. `net/ipv4/conf/all/route_localnet` = `1`, under `/proc/sys`.
    ///
    /// # Errors
    /// The OS error of the write.
    fn set_sysctl(&self, key: &str, value: &str) -> io::Result<()>;

    /// Reads a sysctl; `None` when it does not exist.
    fn get_sysctl(&self, key: &str) -> Option<String>;
}

/// The real node: `getifaddrs(3)` and `/proc/sys` of the current network namespace.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealHost;

impl Host for RealHost {
    fn local_addresses(&self) -> io::Result<Vec<IpAddr>> {
        let addrs = nix::ifaddrs::getifaddrs().map_err(io::Error::from)?;
        let mut out = Vec::new();
        for a in addrs {
            let Some(sa) = a.address else { continue };
            if let Some(v4) = sa.as_sockaddr_in() {
                out.push(IpAddr::V4(v4.ip()));
            } else if let Some(v6) = sa.as_sockaddr_in6() {
                out.push(IpAddr::V6(v6.ip()));
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    fn set_sysctl(&self, key: &str, value: &str) -> io::Result<()> {
        std::fs::write(format!("/proc/sys/{key}"), value)
    }

    fn get_sysctl(&self, key: &str) -> Option<String> {
        std::fs::read_to_string(format!("/proc/sys/{key}"))
            .ok()
            .map(|s| s.trim().to_string())
    }
}

/// A scripted node for tests: fixed local addresses and an in-memory sysctl table.
#[derive(Debug, Default)]
pub struct FakeHost {
    /// Addresses returned by `local_addresses`.
    pub addresses: Vec<IpAddr>,
    /// Sysctls written (and readable).
    pub sysctls: Mutex<BTreeMap<String, String>>,
}

impl FakeHost {
    /// A host with these local addresses.
    pub fn with_addresses(addresses: Vec<IpAddr>) -> Self {
        FakeHost {
            addresses,
            sysctls: Mutex::default(),
        }
    }
}

impl Host for FakeHost {
    fn local_addresses(&self) -> io::Result<Vec<IpAddr>> {
        Ok(self.addresses.clone())
    }

    fn set_sysctl(&self, key: &str, value: &str) -> io::Result<()> {
        self.sysctls
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?
            .insert(key.to_string(), value.to_string());
        Ok(())
    }

    fn get_sysctl(&self, key: &str) -> Option<String> {
        self.sysctls.lock().ok()?.get(key).cloned()
    }
}
