//! NBD over TLS (STARTTLS) with real clients: nbdinfo and nbdcopy (libnbd,
//! GnuTLS) against certificates made here with openssl. Bytes written
//! through TLS are compared straight from the store; clients without TLS,
//! or with a certificate from another CA, get nothing.

mod nbd_common;

use memlend_server::nbd::{Export, NbdConfig, Tls};
use memlend_wire::nbd::{opt, rep};
use nbd_common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").current_dir(dir).args(args).output().unwrap();
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// An EC P-256 key, as `openssl req` options.
const P256: &[&str] = &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"];

/// `openssl req` making a fresh EC P-256 key `key` and `out` (a request,
/// or with `-x509` in `extra` a self-signed certificate) for `subj`.
fn new_key(dir: &Path, key: &str, out: &str, subj: &str, extra: &[&str]) {
    new_key_of(dir, P256, key, out, subj, extra);
}

/// `new_key` with the key type given as `openssl req` options.
fn new_key_of(dir: &Path, kind: &[&str], key: &str, out: &str, subj: &str, extra: &[&str]) {
    let files = ["-nodes", "-keyout", key, "-out", out, "-subj", subj];
    openssl(dir, &[&["req"][..], kind, &files, extra].concat());
}

/// A self-signed CA, `NAME-ca-cert.pem` and `NAME-ca-key.pem`.
fn make_ca(dir: &Path, name: &str) {
    let (key, cert) = (format!("{name}-ca-key.pem"), format!("{name}-ca-cert.pem"));
    let subj = format!("/CN=memlend test CA {name}");
    let ext = ["basicConstraints=critical,CA:TRUE", "keyUsage=critical,keyCertSign,cRLSign"];
    let x509 = ["-x509", "-days", "2", "-addext", ext[0], "-addext", ext[1]];
    new_key(dir, &key, &cert, &subj, &x509);
}

/// A certificate `NAME-cert.pem` (key `NAME-key.pem`) signed by CA
/// `CA_NAME`, for `usage` (serverAuth or clientAuth), valid for localhost
/// and 127.0.0.1.
fn sign(dir: &Path, ca_name: &str, name: &str, usage: &str) {
    sign_key_of(dir, P256, ca_name, name, usage);
}

/// `sign` with the key type given as `openssl req` options.
fn sign_key_of(dir: &Path, kind: &[&str], ca_name: &str, name: &str, usage: &str) {
    let (key, csr, cert) =
        (format!("{name}-key.pem"), format!("{name}.csr"), format!("{name}-cert.pem"));
    let ext = format!("{name}.ext");
    std::fs::write(
        dir.join(&ext),
        format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage={usage}\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n"
        ),
    )
    .unwrap();
    new_key_of(dir, kind, &key, &csr, &format!("/CN={name}"), &[]);
    let (ca_cert, ca_key) = (format!("{ca_name}-ca-cert.pem"), format!("{ca_name}-ca-key.pem"));
    let ca = ["-CA", &ca_cert, "-CAkey", &ca_key, "-CAcreateserial"];
    let x509 = ["x509", "-req", "-in", &csr, "-out", &cert, "-days", "2", "-extfile", &ext];
    openssl(dir, &[&x509[..], &ca].concat());
}

/// What libnbd's `tls-certificates=DIR` reads: the CA that signed the
/// server, and this client's certificate and key.
fn client_dir(pki: &Path, name: &str, client: &str) -> PathBuf {
    let dir = pki.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(pki.join("good-ca-cert.pem"), dir.join("ca-cert.pem")).unwrap();
    std::fs::copy(pki.join(format!("{client}-cert.pem")), dir.join("client-cert.pem")).unwrap();
    std::fs::copy(pki.join(format!("{client}-key.pem")), dir.join("client-key.pem")).unwrap();
    dir
}

struct Pki {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    /// Client certificate from the server's CA.
    good: PathBuf,
    /// Client certificate from another CA.
    stranger: PathBuf,
}

fn pki() -> Pki {
    require_tool("openssl", "openssl");
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    make_ca(&root, "good");
    make_ca(&root, "other");
    sign(&root, "good", "server", "serverAuth");
    sign(&root, "good", "client", "clientAuth");
    sign(&root, "other", "stranger", "clientAuth");
    let good = client_dir(&root, "good-client", "client");
    let stranger = client_dir(&root, "stranger-client", "stranger");
    Pki { _tmp: tmp, root, good, stranger }
}

/// A server requiring TLS, and client certificates from the good CA.
fn tls_server(pki: &Pki, pages: u64) -> TestServer {
    tls_server_of(pki, ram(pages))
}

fn tls_server_of(pki: &Pki, store: std::sync::Arc<dyn memlend_store::PageStore>) -> TestServer {
    let r = &pki.root;
    let tls = Tls::from_pem_files(
        &r.join("server-cert.pem"),
        &r.join("server-key.pem"),
        Some(&r.join("good-ca-cert.pem")),
    )
    .unwrap();
    let cfg = NbdConfig { tls: Some(tls), ..NbdConfig::default() };
    TestServer::start(vec![Export::new("mem", store)], cfg)
}

fn nbds(srv: &TestServer, certs: &Path) -> String {
    format!("nbds://localhost:{}/mem?tls-certificates={}", srv.port, certs.display())
}

/// A raw connection past the greeting and the client flags.
fn flagged(port: u16) -> std::net::TcpStream {
    use std::io::Write;
    let mut s = connect_raw(port);
    let flags = memlend_wire::nbd::ClientFlags { fixed_newstyle: true, no_zeroes: true };
    s.write_all(&flags.encode()).unwrap();
    s
}

fn output(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn must(cmd: &mut Command) -> Output {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn nbdcopy_writes_and_reads_back_through_tls_with_a_client_certificate() {
    let pki = pki();
    copy_through_tls(&pki, &tls_server(&pki, 4096));
}

/// A slow store is served by the worker pool, whose replies go through
/// the relay thread (`tls_pump.rs`), not the connection's own session.
#[test]
fn the_worker_pool_serves_through_tls_too() {
    let pki = pki();
    let store = slow_store(4096, std::time::Duration::from_millis(1));
    copy_through_tls(&pki, &tls_server_of(&pki, store));
}

/// nbdcopy writes 8 MiB of a 16 MiB export through TLS; the store holds
/// exactly those bytes, and nbdcopy reads them back.
fn copy_through_tls(pki: &Pki, srv: &TestServer) {
    require_tool("nbdcopy", "libnbd-bin");
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let src = pki.root.join("src.bin");
    std::fs::write(&src, &data).unwrap();
    must(Command::new("nbdcopy").arg(&src).arg(nbds(srv, &pki.good)));
    assert!(srv.store_bytes(0, 0, data.len()) == data, "the store holds other bytes");
    let back = pki.root.join("back.bin");
    must(Command::new("nbdcopy").arg(nbds(srv, &pki.good)).arg(&back));
    let back = std::fs::read(&back).unwrap();
    assert_eq!(back.len(), 16 << 20);
    assert!(back[..data.len()] == data[..], "bytes read back through TLS differ");
    assert!(back[data.len()..].iter().all(|&b| b == 0));
    let size = must(Command::new("nbdinfo").arg("--size").arg(nbds(srv, &pki.good)));
    assert_eq!(String::from_utf8_lossy(&size.stdout).trim(), "16777216");
}

#[test]
fn clients_without_tls_or_with_a_stranger_certificate_get_nothing() {
    require_tool("nbdinfo", "libnbd-bin");
    let pki = pki();
    let srv = tls_server(&pki, 256);
    let plain = output(Command::new("nbdinfo").arg(srv.uri("mem")));
    assert!(!plain.status.success(), "a plain client got in");
    let stranger = output(Command::new("nbdinfo").arg(nbds(&srv, &pki.stranger)));
    assert!(!stranger.status.success(), "a certificate from another CA got in");
    // The server still serves the right client after refusing those two.
    must(Command::new("nbdinfo").arg(nbds(&srv, &pki.good)));
}

/// Without a client CA any TLS client gets in, with no certificate of its
/// own; plain ones still do not.
#[test]
fn server_only_tls_takes_clients_without_certificates() {
    require_tool("nbdinfo", "libnbd-bin");
    let pki = pki();
    let r = &pki.root;
    let tls = Tls::from_pem_files(&r.join("server-cert.pem"), &r.join("server-key.pem"), None);
    let cfg = NbdConfig { tls: Some(tls.unwrap()), ..NbdConfig::default() };
    let srv = TestServer::start(vec![Export::new("mem", ram(256))], cfg);
    let anonymous = r.join("anonymous");
    std::fs::create_dir_all(&anonymous).unwrap();
    std::fs::copy(r.join("good-ca-cert.pem"), anonymous.join("ca-cert.pem")).unwrap();
    let size = must(Command::new("nbdinfo").arg("--size").arg(nbds(&srv, &anonymous)));
    assert_eq!(String::from_utf8_lossy(&size.stdout).trim(), "1048576");
    assert!(!output(Command::new("nbdinfo").arg(srv.uri("mem"))).status.success());
}

/// The option haggling before TLS, byte by byte: everything but STARTTLS
/// and ABORT is answered ERR_TLS_REQD, and EXPORT_NAME (which has no error
/// reply) closes the connection.
#[test]
fn before_starttls_every_option_is_told_tls_is_required() {
    let pki = pki();
    let srv = tls_server(&pki, 256);
    let mut s = flagged(srv.port);
    for option in [opt::GO, opt::INFO, opt::LIST, opt::STRUCTURED_REPLY] {
        let data: &[u8] = if option == opt::LIST || option == opt::STRUCTURED_REPLY {
            &[]
        } else {
            &[0, 0, 0, 3, b'm', b'e', b'm', 0, 0]
        };
        send_option(&mut s, option, data);
        let (h, _) = read_opt_reply(&mut s).unwrap();
        assert_eq!((h.option, h.reply), (option, rep::ERR_TLS_REQD));
    }
    send_option(&mut s, opt::STARTTLS, b"x");
    assert_eq!(read_opt_reply(&mut s).unwrap().0.reply, rep::ERR_INVALID);
    send_option(&mut s, opt::EXPORT_NAME, b"mem");
    assert!(closes_soon(&mut s), "EXPORT_NAME before TLS must end the connection");
}

/// Garbage where the TLS handshake should be ends that connection only.
#[test]
fn a_malformed_tls_handshake_closes_only_its_connection() {
    use std::io::Write;
    require_tool("nbdinfo", "libnbd-bin");
    let pki = pki();
    let srv = tls_server(&pki, 256);
    let mut s = flagged(srv.port);
    send_option(&mut s, opt::STARTTLS, &[]);
    assert_eq!(read_opt_reply(&mut s).unwrap().0.reply, rep::ACK);
    s.write_all(&[0x16, 0x03, 0x01, 0xff, 0xff, 0xde, 0xad, 0xbe, 0xef]).unwrap();
    s.write_all(&[0x55; 4096]).unwrap();
    assert!(closes_soon(&mut s), "a bad ClientHello must end the connection");
    must(Command::new("nbdinfo").arg(nbds(&srv, &pki.good)));
}

#[test]
fn starttls_without_tls_configured_is_refused_and_the_client_goes_on() {
    let srv = TestServer::ram(256);
    let mut s = flagged(srv.port);
    send_option(&mut s, opt::STARTTLS, &[]);
    let (h, _) = read_opt_reply(&mut s).unwrap();
    assert_eq!((h.option, h.reply), (opt::STARTTLS, rep::ERR_UNSUP));
    let (size, _) = go(&mut s, "mem").expect("GO after a refused STARTTLS");
    assert_eq!(size, 256 * 4096);
}

#[test]
fn bad_tls_files_are_refused_with_the_file_named() {
    let pki = pki();
    let r = &pki.root;
    let missing = r.join("nope.pem");
    let e = Tls::from_pem_files(&missing, &r.join("server-key.pem"), None).unwrap_err();
    assert!(e.to_string().contains("nope.pem"), "{e}");
    // A key that is not the certificate's.
    let e = Tls::from_pem_files(&r.join("server-cert.pem"), &r.join("client-key.pem"), None)
        .unwrap_err();
    assert!(e.to_string().contains("server-cert.pem"), "{e}");
}

/// Every RSA size the TLS stack takes serves a client, not only multiples
/// of 1024 bits: ring refused a 2432-bit key (its primes must be multiples
/// of 512 bits), aws-lc takes it. nbdcopy writes and reads back through
/// each; the certificates are signed by a CA the client trusts.
#[test]
fn rsa_keys_of_any_usual_size_and_ec_keys_serve_through_tls() {
    require_tool("nbdcopy", "libnbd-bin");
    let pki = pki();
    let r = &pki.root;
    let kinds: [(&str, &[&str]); 5] = [
        ("rsa2048", &["-newkey", "rsa:2048"]),
        ("rsa2432", &["-newkey", "rsa:2432"]),
        ("rsa3072", &["-newkey", "rsa:3072"]),
        ("rsa4096", &["-newkey", "rsa:4096"]),
        ("p256", P256),
    ];
    let anonymous = r.join("anonymous");
    std::fs::create_dir_all(&anonymous).unwrap();
    std::fs::copy(r.join("good-ca-cert.pem"), anonymous.join("ca-cert.pem")).unwrap();
    let data = pattern(7, 1 << 20);
    let src = r.join("src.bin");
    std::fs::write(&src, &data).unwrap();
    for (name, kind) in kinds {
        sign_key_of(r, kind, "good", name, "serverAuth");
        let (cert, key) = (r.join(format!("{name}-cert.pem")), r.join(format!("{name}-key.pem")));
        let tls = Tls::from_pem_files(&cert, &key, None).unwrap_or_else(|e| panic!("{name}: {e}"));
        let cfg = NbdConfig { tls: Some(tls), ..NbdConfig::default() };
        let srv = TestServer::start(vec![Export::new("mem", ram(512))], cfg);
        must(Command::new("nbdcopy").arg(&src).arg(nbds(&srv, &anonymous)));
        let back = r.join(format!("{name}-back.bin"));
        must(Command::new("nbdcopy").arg(nbds(&srv, &anonymous)).arg(&back));
        let back = std::fs::read(&back).unwrap();
        assert!(back[..data.len()] == data[..], "{name}: bytes read back through TLS differ");
        assert!(srv.store_bytes(0, 0, data.len()) == data, "{name}: the store holds other bytes");
    }
}

/// A key file that is not a key, or a key rustls cannot use, is refused
/// naming the key file (not the certificate) and saying why.
#[test]
fn a_bad_key_file_is_named_with_the_reason() {
    let pki = pki();
    let r = &pki.root;
    let garbage = r.join("garbage-key.pem");
    std::fs::write(&garbage, "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
        .unwrap();
    let e = Tls::from_pem_files(&r.join("server-cert.pem"), &garbage, None).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("key") && text.contains("garbage-key.pem"), "{text}");
    assert!(!text.contains("server-cert.pem"), "the certificate is not at fault: {text}");
    // A real key, too small: the crypto library's reason is passed on.
    let genrsa = ["genpkey", "-algorithm", "rsa", "-pkeyopt", "rsa_keygen_bits:1024"];
    openssl(r, &[&genrsa[..], &["-out", "rsa1024-key.pem"]].concat());
    let e = Tls::from_pem_files(&r.join("server-cert.pem"), &r.join("rsa1024-key.pem"), None);
    let text = e.unwrap_err().to_string();
    assert!(text.contains("rsa1024-key.pem") && text.contains("TooSmall"), "{text}");
    let empty = r.join("empty-key.pem");
    std::fs::write(&empty, "no PEM here\n").unwrap();
    let e = Tls::from_pem_files(&r.join("server-cert.pem"), &empty, None).unwrap_err();
    assert!(e.to_string().contains("empty-key.pem: no PEM private key"), "{e}");
}

/// TLS is required on the Unix listener too, and works there for both
/// transmission paths: nbdcopy writes and reads back a RAM export (served
/// on the connection thread) and a slow one (through the relay thread).
#[test]
fn tls_serves_the_unix_socket_too() {
    require_tool("nbdcopy", "libnbd-bin");
    let pki = pki();
    let r = &pki.root;
    let tls = Tls::from_pem_files(
        &r.join("server-cert.pem"),
        &r.join("server-key.pem"),
        Some(&r.join("good-ca-cert.pem")),
    )
    .unwrap();
    let cfg = NbdConfig { tls: Some(tls), ..NbdConfig::default() };
    let socket = r.join("nbd.sock");
    let slow = slow_store(1024, std::time::Duration::from_millis(1));
    let exports = vec![Export::new("mem", ram(1024)), Export::new("slow", slow)];
    let srv = TestServer::start_with_unix(exports, cfg, &socket);
    let uri = |name: &str| {
        let (s, c) = (socket.display(), pki.good.display());
        format!("nbds+unix:///{name}?socket={s}&tls-certificates={c}&tls-hostname=localhost")
    };
    let data = pattern(11, 2 << 20);
    let src = r.join("src.bin");
    std::fs::write(&src, &data).unwrap();
    for (i, name) in ["mem", "slow"].into_iter().enumerate() {
        must(Command::new("nbdcopy").arg(&src).arg(uri(name)));
        assert!(srv.store_bytes(i, 0, data.len()) == data, "{name}: the store holds other bytes");
        let back = r.join(format!("{name}-back.bin"));
        must(Command::new("nbdcopy").arg(uri(name)).arg(&back));
        assert!(std::fs::read(&back).unwrap()[..data.len()] == data[..], "{name}: differs");
    }
    let plain = format!("nbd+unix:///mem?socket={}", socket.display());
    assert!(!output(Command::new("nbdinfo").arg(plain)).status.success(), "plain got in");
}
