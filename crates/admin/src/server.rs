//! Running an HTTP server with upstream's restart semantics.
//!
//! Upstream runs the healthz and metrics servers under `wait.Until(fn, 5*time.Second, ...)`:
//! when listening fails or the server stops, the error is logged and the server is started
//! again 5 s later. With `--bind-address-hard-fail` the first failure is reported to the caller
//! instead, which makes kube-proxy exit. [`AdminServer::run`] does exactly that.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tracing::{error, info};

use crate::AdminError;
use crate::listen::listen;

/// Where and how a server listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeOptions {
    /// The address to listen on (port 0: an ephemeral port, for tests).
    pub addr: SocketAddr,
    /// `--bind-address-hard-fail`: return the first bind or serve error instead of retrying.
    pub hard_fail: bool,
    /// Delay before listening again after a failure (upstream: 5 s).
    pub retry_interval: Duration,
}

impl ServeOptions {
    /// Upstream's defaults for `addr`: retry every 5 s, no hard fail.
    pub fn new(addr: SocketAddr) -> Self {
        ServeOptions {
            addr,
            hard_fail: false,
            retry_interval: Duration::from_secs(5),
        }
    }
}

/// A named HTTP server (`healthz`, `metrics`) not yet listening.
#[derive(Debug, Clone)]
pub struct AdminServer {
    name: &'static str,
    opts: ServeOptions,
    router: Router,
}

impl AdminServer {
    /// A server named `name` (for logs and errors) serving `router` with `opts`.
    pub fn new(name: &'static str, opts: ServeOptions, router: Router) -> Self {
        AdminServer { name, opts, router }
    }

    /// The options.
    pub fn options(&self) -> ServeOptions {
        self.opts
    }

    /// Makes one attempt to listen. Must be called within a Tokio runtime.
    ///
    /// # Errors
    /// [`AdminError::Bind`] when the address cannot be bound.
    pub fn bind(&self) -> Result<BoundServer, AdminError> {
        let listener = listen(self.opts.addr)?;
        let local = listener.local_addr().unwrap_or(self.opts.addr);
        Ok(BoundServer {
            name: self.name,
            local,
            listener,
            router: self.router.clone(),
        })
    }

    /// Listens and serves until `shutdown` resolves, restarting after
    /// [`ServeOptions::retry_interval`] whenever listening fails or the server stops (each
    /// failure is logged), as upstream's `wait.Until` loop.
    ///
    /// # Errors
    /// With [`ServeOptions::hard_fail`], the first [`AdminError::Bind`] or
    /// [`AdminError::Serve`]; never otherwise.
    pub async fn run<F>(self, shutdown: F) -> Result<(), AdminError>
    where
        F: Future<Output = ()> + Send,
    {
        tokio::pin!(shutdown);
        loop {
            let outcome = match self.bind() {
                Ok(bound) => {
                    info!(server = self.name, address = %bound.local_addr(), "starting HTTP server");
                    tokio::select! {
                        () = &mut shutdown => return Ok(()),
                        r = bound.serve(std::future::pending()) => r,
                    }
                }
                Err(e) => Err(e),
            };
            match outcome {
                Ok(()) => error!(server = self.name, "HTTP server returned without error"),
                Err(e) if self.opts.hard_fail => return Err(e),
                Err(e) => error!(
                    server = self.name,
                    error = %e,
                    retry_in_s = self.opts.retry_interval.as_secs_f64(),
                    "HTTP server failed; retrying"
                ),
            }
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                () = tokio::time::sleep(self.opts.retry_interval) => {}
            }
        }
    }
}

/// A server whose socket is open: [`BoundServer::local_addr`] tells the port actually bound.
#[derive(Debug)]
pub struct BoundServer {
    name: &'static str,
    local: SocketAddr,
    listener: TcpListener,
    router: Router,
}

impl BoundServer {
    /// The bound address (with the real port when port 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Serves until `shutdown` resolves, then stops accepting and lets open requests finish.
    ///
    /// # Errors
    /// [`AdminError::Serve`] if the server stops with an I/O error.
    pub async fn serve<F>(self, shutdown: F) -> Result<(), AdminError>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (name, addr) = (self.name, self.local);
        axum::serve(self.listener, self.router)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(|source| AdminError::Serve {
                server: name,
                addr,
                source,
            })
    }
}
