//! TLS on the worker's front ends (rustls, the ring provider): with
//! `tls_cert` and `tls_key` set, the gRPC port (ALPN `h2`) and the HTTP
//! port (ALPN `http/1.1`) speak TLS only; with `tls_client_ca` as well,
//! each client must present a certificate that CA signed (mutual TLS), and
//! a connection without one is closed in the handshake. The handshake must
//! end within `http_read_timeout_s`, as a plaintext request head must.
//!
//! Kubernetes' probes cannot present a client certificate, and a `grpc`
//! probe cannot speak TLS at all: `health_addr` serves `/healthz`,
//! `/readyz` and `/metrics` in plaintext on a port of its own for them and
//! for Prometheus (docs/security.md, docs/deployment.md).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

use crate::config::WorkerConfig;

/// The ALPN protocol a port speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    /// gRPC: HTTP/2.
    H2,
    /// The HTTP/JSON port: HTTP/1.1.
    Http11,
}

/// The TLS acceptor of a port, or `None` when TLS is off.
pub fn acceptor(config: &WorkerConfig, alpn: Alpn) -> anyhow::Result<Option<TlsAcceptor>> {
    let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) else {
        return Ok(None);
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match &config.tls_client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(ca, "tls_client_ca")? {
                roots.add(cert).with_context(|| {
                    format!(
                        "tls_client_ca {}: a certificate rustls cannot use as a root",
                        ca.display()
                    )
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .with_context(|| format!("tls_client_ca {}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        anyhow::anyhow!(
            "tls_key {}: no PEM private key read ({e}): give the key of tls_cert, PEM-encoded",
            key.display()
        )
    })?;
    let mut server = builder
        .with_single_cert(certificates(cert, "tls_cert")?, key)
        .context(
            "tls_cert and tls_key do not make a usable pair: the key must be the certificate's",
        )?;
    server.alpn_protocols = match alpn {
        Alpn::H2 => vec![b"h2".to_vec()],
        Alpn::Http11 => vec![b"http/1.1".to_vec()],
    };
    Ok(Some(TlsAcceptor::from(Arc::new(server))))
}

/// Every certificate of a PEM file; at least one.
fn certificates(path: &Path, key: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let read = |e: rustls::pki_types::pem::Error| {
        anyhow::anyhow!(
            "{key} {}: {e}: give a PEM file of certificates",
            path.display()
        )
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(read)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)?;
    anyhow::ensure!(
        !certs.is_empty(),
        "{key} {}: no certificate in it: give a PEM file of certificates",
        path.display()
    );
    Ok(certs)
}
