//! TLS for the NBD export (NBD_OPT_STARTTLS): the certificate the server
//! shows and, if given, the CA whose client certificates it demands. With
//! TLS configured every client must upgrade before it may do anything but
//! abort; the option haggling then goes on inside TLS, and so does
//! transmission (`tls_pump.rs`).

use super::socket::{Socket, SocketIo};
use rustls::crypto::aws_lc_rs::sign::RsaSigningKey;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{RootCertStore, ServerConfig, ServerConnection};
use std::fmt;
use std::io;
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
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let certified = certified_key(cert, key, &provider)?;
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
        let config = builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
        Ok(Tls { config: Arc::new(config), verifies_clients: client_ca.is_some() })
    }

    /// Whether clients must show a certificate from the configured CA.
    pub fn verifies_clients(&self) -> bool {
        self.verifies_clients
    }

    /// Run the server side of the TLS handshake on `socket`, right after the
    /// STARTTLS acknowledgement. Blocking, within the socket's timeouts.
    pub(crate) fn accept<S: Socket>(&self, socket: &S) -> io::Result<ServerConnection> {
        let mut conn = ServerConnection::new(Arc::clone(&self.config)).map_err(io::Error::other)?;
        let mut io = SocketIo(socket);
        // Each pass moves at least one record or fails; a handshake is a
        // handful of records, and the socket timeouts bound a stalled peer.
        while conn.is_handshaking() {
            conn.complete_io(&mut io)?;
        }
        Ok(conn)
    }
}

/// The certificate chain and its key, each error naming the file at fault
/// and the crypto library's own reason (rustls would say only that the key
/// could not be parsed).
fn certified_key(cert: &Path, key: &Path, provider: &CryptoProvider) -> io::Result<CertifiedKey> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| invalid("certificate", cert, e))?;
    if chain.is_empty() {
        return Err(invalid("certificate", cert, "no certificate in the file"));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| match e {
        pem::Error::NoItemsFound => invalid("key", key, "no PEM private key in the file"),
        e => invalid("key", key, e),
    })?;
    let signing = match provider.key_provider.load_private_key(key_der.clone_key()) {
        Ok(signing) => signing,
        Err(_) => return Err(invalid("key", key, why_unusable(&key_der))),
    };
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|e| {
        let why = format!("nbd tls: certificate {} and key {}: {e}", cert.display(), key.display());
        io::Error::new(io::ErrorKind::InvalidInput, why)
    })?;
    Ok(certified)
}

/// Why a key rustls would not load is unusable. rustls says only that it
/// is none of the kinds it takes; for an RSA key the crypto library's own
/// reason (too small, too large, bad encoding) is the useful part.
fn why_unusable(der: &PrivateKeyDer<'_>) -> String {
    const KINDS: &str = "RSA of 2048 to 8192 bits, ECDSA P-256, P-384 or P-521, or Ed25519";
    let rsa = match der {
        PrivateKeyDer::Pkcs1(_) => true,
        PrivateKeyDer::Pkcs8(k) => is_rsa_pkcs8(k.secret_pkcs8_der()),
        _ => false,
    };
    match RsaSigningKey::new(der) {
        Err(rustls::Error::General(why)) if rsa => format!("{why} (usable keys: {KINDS})"),
        _ => format!("not a key TLS here can use (usable keys: {KINDS})"),
    }
}

/// Whether a PKCS#8 key's algorithm is rsaEncryption: its OID comes
/// within the first bytes (after the version), well inside this bound.
fn is_rsa_pkcs8(der: &[u8]) -> bool {
    const RSA_ENCRYPTION_OID: [u8; 11] =
        [0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
    const HEADER_BYTES_MAX: usize = 32;
    der[..der.len().min(HEADER_BYTES_MAX)]
        .windows(RSA_ENCRYPTION_OID.len())
        .any(|w| w == RSA_ENCRYPTION_OID)
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
