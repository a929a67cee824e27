//! TLS for the NBD export (NBD_OPT_STARTTLS): the certificate the server
//! shows and, if given, the CA whose client certificates it demands. With
//! TLS configured every client must upgrade before it may do anything but
//! abort; the option haggling then goes on inside TLS, and so does
//! transmission (`tls_pump.rs`).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};
use std::fmt;
use std::io;
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;

/// A loaded TLS configuration, cheap to clone.
#[derive(Clone)]
pub struct Tls {
    config: Arc<ServerConfig>,
    verifies_clients: bool,
}

fn invalid(what: &str, path: &Path, e: impl fmt::Display) -> io::Error {
    let why = format!("nbd tls: {what} {}: {e}", path.display());
    io::Error::new(io::ErrorKind::InvalidInput, why)
}

impl Tls {
    /// The server's certificate chain and key (PEM), and optionally the CA
    /// certificates (PEM) that client certificates must chain to. A client
    /// without such a certificate is refused in the TLS handshake.
    pub fn from_pem_files(cert: &Path, key: &Path, client_ca: Option<&Path>) -> io::Result<Tls> {
        let chain = CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| invalid("certificate", cert, e))?;
        if chain.is_empty() {
            return Err(invalid("certificate", cert, "no certificate in the file"));
        }
        let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| invalid("key", key, e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(io::Error::other)?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for c in CertificateDer::pem_file_iter(ca).map_err(|e| invalid("CA", ca, e))? {
                    let c = c.map_err(|e| invalid("CA", ca, e))?;
                    roots.add(c).map_err(|e| invalid("CA", ca, e))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|e| invalid("CA", ca, e))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder
            .with_single_cert(chain, key_der)
            .map_err(|e| invalid("certificate and key", cert, e))?;
        Ok(Tls { config: Arc::new(config), verifies_clients: client_ca.is_some() })
    }

    /// Whether clients must show a certificate from the configured CA.
    pub fn verifies_clients(&self) -> bool {
        self.verifies_clients
    }

    /// Run the server side of the TLS handshake on `tcp`, right after the
    /// STARTTLS acknowledgement. Blocking, within the socket's timeouts.
    pub(crate) fn accept(&self, tcp: &TcpStream) -> io::Result<ServerConnection> {
        let mut conn = ServerConnection::new(Arc::clone(&self.config)).map_err(io::Error::other)?;
        let mut io = tcp;
        // Each pass moves at least one record or fails; a handshake is a
        // handful of records, and the socket timeouts bound a stalled peer.
        while conn.is_handshaking() {
            conn.complete_io(&mut io)?;
        }
        Ok(conn)
    }
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls").field("verifies_clients", &self.verifies_clients).finish()
    }
}

/// Two configurations are equal when they are the same loaded one.
impl PartialEq for Tls {
    fn eq(&self, other: &Tls) -> bool {
        Arc::ptr_eq(&self.config, &other.config)
    }
}

impl Eq for Tls {}
