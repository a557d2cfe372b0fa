//! TLS for the test API server: certificates made with the `openssl` command
//! ([`TestCerts::generate`]; scripts/install-deps installs it) and the accept loop that
//! serves the router over rustls (ring, as kube-rs in this workspace).
//!
//! The certificates are a CA and a server certificate it signed for `127.0.0.1`, `::1` and
//! `localhost` (and any further addresses and names, [`TestCerts::generate_for`]), the way a
//! kubeadm control plane's `apiserver.crt` is signed by its
//! `ca.crt`: a client trusting the CA (kube-rs through a kubeconfig's
//! `certificate-authority`, or the in-cluster `ca.crt`; kubectl likewise) verifies the
//! server by its IP address, as it verifies `https://<control-plane IP>:6443`.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{self, pki_types::pem::PemObject};

use super::ApiServerError;

/// A CA and a server certificate for the loopback addresses, as PEM files in one directory.
#[derive(Debug, Clone)]
pub struct TestCerts {
    /// The CA certificate (what a client trusts): `DIR/ca.crt`.
    pub ca_cert: PathBuf,
    /// The server's certificate, signed by the CA: `DIR/server.crt`.
    pub server_cert: PathBuf,
    /// The server's private key (PKCS#8): `DIR/server.key`.
    pub server_key: PathBuf,
}

impl TestCerts {
    /// Makes a new CA (EC P-256, ten years) and a server certificate it signs, for
    /// `IP:127.0.0.1`, `IP:::1` and `DNS:localhost`, in `dir` (which must exist).
    ///
    /// # Errors
    /// [`ApiServerError::Tls`] when `openssl` is missing or fails (with its output).
    pub fn generate(dir: &Path) -> Result<TestCerts, ApiServerError> {
        TestCerts::generate_for(dir, &[], &[])
    }

    /// Like [`TestCerts::generate`], with the server certificate also valid for `ips` and
    /// the DNS `names` (a control-plane address on a node network, the `kubernetes`
    /// Service's ClusterIP and names, as kubeadm's `apiserver.crt` lists them).
    ///
    /// # Errors
    /// [`ApiServerError::Tls`] when `openssl` is missing or fails (with its output), or a
    /// name holds a character other than letters, digits, `-` and `.`.
    pub fn generate_for(
        dir: &Path,
        ips: &[IpAddr],
        names: &[&str],
    ) -> Result<TestCerts, ApiServerError> {
        let mut san = String::from("IP:127.0.0.1,IP:::1,DNS:localhost");
        for ip in ips {
            san.push_str(&format!(",IP:{ip}"));
        }
        for name in names {
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            {
                return Err(ApiServerError::Tls(format!(
                    "{name:?} is not a DNS name for a certificate"
                )));
            }
            san.push_str(&format!(",DNS:{name}"));
        }
        let ext = dir.join("server.ext");
        std::fs::write(
            &ext,
            format!(
                "subjectAltName={san}\nbasicConstraints=CA:FALSE\n\
                 keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
            ),
        )?;
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let steps: [Vec<&str>; 3] = [
            [
                &["req", "-x509"][..],
                &ec,
                &[
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.crt",
                    "-days",
                    "3650",
                    "-subj",
                    "/CN=kp-testkit-ca",
                    "-addext",
                    "basicConstraints=critical,CA:TRUE",
                    "-addext",
                    "keyUsage=critical,keyCertSign,cRLSign",
                ],
            ]
            .concat(),
            [
                &["req"][..],
                &ec,
                &[
                    "-keyout",
                    "server.key",
                    "-out",
                    "server.csr",
                    "-subj",
                    "/CN=kube-apiserver",
                ],
            ]
            .concat(),
            vec![
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.crt",
                "-days",
                "3650",
                "-extfile",
                "server.ext",
            ],
        ];
        for args in steps {
            let out = Command::new("openssl")
                .args(&args)
                .current_dir(dir)
                .output()
                .map_err(|e| ApiServerError::Tls(format!("cannot run openssl: {e}")))?;
            if !out.status.success() {
                return Err(ApiServerError::Tls(format!(
                    "openssl {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
        }
        Ok(TestCerts {
            ca_cert: dir.join("ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
        })
    }

    /// The rustls acceptor serving the server certificate.
    pub(super) fn acceptor(&self) -> Result<TlsAcceptor, ApiServerError> {
        let bad = |what: &Path, e: &dyn std::fmt::Display| {
            ApiServerError::Tls(format!("{}: {e}", what.display()))
        };
        let certs = rustls::pki_types::CertificateDer::pem_file_iter(&self.server_cert)
            .map_err(|e| bad(&self.server_cert, &e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(&self.server_cert, &e))?;
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&self.server_key)
            .map_err(|e| bad(&self.server_key, &e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ApiServerError::Tls(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| ApiServerError::Tls(e.to_string()))?;
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

/// Accepts TLS connections on `listener` and serves `app` on each (HTTP/1.1: no ALPN is
/// offered, so clients do not try HTTP/2), until the task is aborted.
pub(super) async fn serve(listener: tokio::net::TcpListener, acceptor: TlsAcceptor, app: Router) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = TowerToHyperService::new(app);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}
