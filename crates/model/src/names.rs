//! Object names: [`NamespacedName`], [`ServicePortName`] and the validators that make names
//! safe to embed in rule text.
//!
//! Names end up inside `iptables-restore` comments, nftables chain names and element keys,
//! so only names that pass the API server's own rules are accepted: DNS-1123 labels for
//! namespaces and port names, DNS-1035 labels for Service names, DNS-1123 subdomains for
//! other object names. None of them can contain a quote, a space or a newline.

use std::fmt;

use crate::{Protocol, SharedStr};

/// Why a name was rejected; `Display` gives the rule it broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameError {
    /// The rejected text.
    pub value: String,
    /// The rule it broke, in words.
    pub reason: &'static str,
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is not valid: {}", self.value, self.reason)
    }
}

impl std::error::Error for NameError {}

fn err(value: &str, reason: &'static str) -> Result<(), NameError> {
    Err(NameError {
        value: value.to_string(),
        reason,
    })
}

fn check_label(value: &str, first_must_be_alpha: bool) -> Result<(), NameError> {
    if value.is_empty() {
        return err(value, "must not be empty");
    }
    if value.len() > 63 {
        return err(value, "must be no more than 63 characters");
    }
    let bytes = value.as_bytes();
    if !bytes
        .iter()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
    {
        return err(
            value,
            "must consist of lower case alphanumeric characters or '-'",
        );
    }
    let first = bytes[0];
    if first_must_be_alpha && !first.is_ascii_lowercase() {
        return err(
            value,
            "must start with a lower case letter (DNS-1035 label)",
        );
    }
    if first == b'-' || bytes[bytes.len() - 1] == b'-' {
        return err(value, "must start and end with an alphanumeric character");
    }
    Ok(())
}

/// Validates an RFC 1123 DNS label (namespaces, port names): at most 63 characters of
/// `[a-z0-9-]`, starting and ending with an alphanumeric character.
pub fn validate_dns_label(value: &str) -> Result<(), NameError> {
    check_label(value, false)
}

/// Validates a Service name: an RFC 1035 DNS label (like a DNS-1123 label, but it must start
/// with a letter), as the API server requires for Services.
pub fn validate_service_name(value: &str) -> Result<(), NameError> {
    check_label(value, true)
}

/// Validates an RFC 1123 DNS subdomain (EndpointSlice and Node names): at most 253
/// characters, dot-separated DNS labels.
pub fn validate_dns_subdomain(value: &str) -> Result<(), NameError> {
    if value.is_empty() {
        return err(value, "must not be empty");
    }
    if value.len() > 253 {
        return err(value, "must be no more than 253 characters");
    }
    for part in value.split('.') {
        if let Err(e) = validate_dns_label(part) {
            return Err(NameError {
                value: value.to_string(),
                reason: if part.is_empty() {
                    "must not contain empty labels between dots"
                } else {
                    e.reason
                },
            });
        }
    }
    Ok(())
}

/// Validates a Service or EndpointSlice port name: empty, or a DNS-1123 label.
pub fn validate_port_name(value: &str) -> Result<(), NameError> {
    if value.is_empty() {
        Ok(())
    } else {
        validate_dns_label(value)
    }
}

/// A namespace and a name, printed `namespace/name` like upstream's `types.NamespacedName`.
///
/// Construct it only from validated parts (see [`NamespacedName::new`]); the fields are public
/// for pattern matching and tests.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamespacedName {
    /// The namespace (a DNS-1123 label).
    pub namespace: SharedStr,
    /// The object's name.
    pub name: SharedStr,
}

impl NamespacedName {
    /// Builds a name for a Service: the namespace must be a DNS-1123 label, the name a
    /// DNS-1035 label.
    ///
    /// # Errors
    /// [`NameError`] naming the part that is invalid.
    pub fn service(namespace: &str, name: &str) -> Result<Self, NameError> {
        validate_dns_label(namespace)?;
        validate_service_name(name)?;
        Ok(Self {
            namespace: namespace.into(),
            name: name.into(),
        })
    }

    /// Builds a name without validation; for tests and for names already validated.
    pub fn new(namespace: impl Into<SharedStr>, name: impl Into<SharedStr>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for NamespacedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One port of one Service: the unit every proxy mode programs.
///
/// `Display` prints `namespace/name` or `namespace/name:portname`, exactly upstream's
/// `ServicePortName.String()`, which is the input of every chain-name hash (the protocol is
/// hashed separately, lower-cased). Ordering is by service, then port name, then protocol.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortName {
    /// The Service.
    pub service: NamespacedName,
    /// The port's name; empty for a Service's single unnamed port.
    pub port: SharedStr,
    /// The port's protocol.
    pub protocol: Protocol,
}

impl ServicePortName {
    /// Builds a ServicePortName from parts.
    pub fn new(service: NamespacedName, port: impl Into<SharedStr>, protocol: Protocol) -> Self {
        Self {
            service,
            port: port.into(),
            protocol,
        }
    }
}

impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port.is_empty() {
            write!(f, "{}", self.service)
        } else {
            write!(f, "{}:{}", self.service, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert!(validate_dns_label("default").is_ok());
        assert!(validate_dns_label("kube-system").is_ok());
        assert!(validate_dns_label("1abc").is_ok());
        assert!(validate_dns_label("").is_err());
        assert!(validate_dns_label("-a").is_err());
        assert!(validate_dns_label("a-").is_err());
        assert!(validate_dns_label("Abc").is_err());
        assert!(validate_dns_label("a\"b").is_err());
        assert!(validate_dns_label("a b").is_err());
        assert!(validate_dns_label(&"a".repeat(64)).is_err());
        assert!(validate_service_name("1abc").is_err());
        assert!(validate_service_name("nginx-svc").is_ok());
    }

    #[test]
    fn subdomains() {
        assert!(validate_dns_subdomain("nginx-svc-7xk2p").is_ok());
        assert!(validate_dns_subdomain("node1.example.com").is_ok());
        assert!(validate_dns_subdomain("a..b").is_err());
        assert!(validate_dns_subdomain("a.-b").is_err());
    }

    #[test]
    fn service_port_name_display() {
        let svc = NamespacedName::new("default", "nginx-svc");
        assert_eq!(
            ServicePortName::new(svc.clone(), "", Protocol::Tcp).to_string(),
            "default/nginx-svc"
        );
        assert_eq!(
            ServicePortName::new(svc, "http", Protocol::Tcp).to_string(),
            "default/nginx-svc:http"
        );
    }
}
