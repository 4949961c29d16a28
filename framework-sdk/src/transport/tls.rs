//! Mutual TLS for every Gantry connection: a cluster CA signs the master's, each agent's and each
//! framework's certificate, and a peer's identity is read from its certificate.
//!
//! Identities live in the certificate's subject common name: `master`, `agent:NAME`,
//! `framework:PRINCIPAL` or `operator:NAME` (a person or tool using the master's HTTPS operator
//! API). Master certificates also carry the DNS name [`MASTER_SERVER_NAME`], which clients
//! verify; no other certificate does, so none can pose as a master. Every certificate carries
//! the clientAuth extended key usage, and [`identity_from_cert`] accepts no certificate without
//! it.
//!
//! A TLS directory holds PEM files named by convention: `ca.pem` (the CA certificate), `ca.key`
//! (the CA key; only on hosts allowed to issue), `master.pem`/`master.key`,
//! `agent-NAME.pem`/`.key`, `framework-NAME.pem`/`.key`, `operator-NAME.pem`/`.key`.
//! [`check_dir_permissions`] refuses a directory or key file others may write. In development every binary is pointed
//! at the same directory: the master creates the CA when none exists, and agents and frameworks
//! issue their own certificates from `ca.key`. In production `gantryctl certs` writes the same
//! files and each host gets only `ca.pem` plus its own pair.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The DNS name every master certificate carries and every client verifies.
pub const MASTER_SERVER_NAME: &str = "gantry-master";

/// ALPN protocol id; carries the protocol version so mismatched peers fail the handshake.
pub const ALPN: &[u8] = b"gantry/1";

/// Errors setting up TLS material.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: no PEM {what} found")]
    NoPem { path: PathBuf, what: &'static str },
    #[error("no certificate for {identity} in {dir} and no CA key there to issue one; issue it with `gantryctl certs {kind} ...` (see docs/operations.md)")]
    MissingIdentity {
        identity: String,
        dir: PathBuf,
        kind: &'static str,
    },
    #[error("no CA certificate {0} (start the master with this --tls-dir first, or run `gantryctl certs ca`)")]
    MissingCa(PathBuf),
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("TLS configuration failed: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client verifier: {0}")]
    Verifier(String),
    #[error("invalid name {0:?}: use 1-64 characters of [A-Za-z0-9_.-], not starting with a dot and without \"..\"")]
    BadName(String),
    #[error(
        "{path} is writable by {who} (mode {mode:o}); run `chmod go-w {path}` (keys: `chmod 600`)"
    )]
    Permissions {
        path: PathBuf,
        who: &'static str,
        mode: u32,
    },
}

/// Who a certificate belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PeerIdentity {
    Master,
    Agent(String),
    Framework(String),
    /// A user of the operator HTTP API (`gantryctl`).
    Operator(String),
}

impl PeerIdentity {
    /// The subject common name encoding this identity.
    pub fn common_name(&self) -> String {
        match self {
            PeerIdentity::Master => "master".to_string(),
            PeerIdentity::Agent(n) => format!("agent:{n}"),
            PeerIdentity::Framework(n) => format!("framework:{n}"),
            PeerIdentity::Operator(n) => format!("operator:{n}"),
        }
    }

    /// Parses a subject common name written by [`PeerIdentity::common_name`].
    pub fn from_common_name(cn: &str) -> Option<Self> {
        if cn == "master" {
            return Some(PeerIdentity::Master);
        }
        let (kind, name) = cn.split_once(':')?;
        if !valid_name(name) {
            return None;
        }
        match kind {
            "agent" => Some(PeerIdentity::Agent(name.to_string())),
            "framework" => Some(PeerIdentity::Framework(name.to_string())),
            "operator" => Some(PeerIdentity::Operator(name.to_string())),
            _ => None,
        }
    }

    /// File stem in a TLS directory: `master`, `agent-NAME`, `framework-NAME`,
    /// `operator-NAME`.
    pub fn file_stem(&self) -> String {
        match self {
            PeerIdentity::Master => "master".to_string(),
            PeerIdentity::Agent(n) => format!("agent-{n}"),
            PeerIdentity::Framework(n) => format!("framework-{n}"),
            PeerIdentity::Operator(n) => format!("operator-{n}"),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            PeerIdentity::Master => "master",
            PeerIdentity::Agent(_) => "agent",
            PeerIdentity::Framework(_) => "framework",
            PeerIdentity::Operator(_) => "operator",
        }
    }

    /// The name in an agent, framework or operator identity (none for the master).
    pub fn name(&self) -> Option<&str> {
        match self {
            PeerIdentity::Master => None,
            PeerIdentity::Agent(n) | PeerIdentity::Framework(n) | PeerIdentity::Operator(n) => {
                Some(n)
            }
        }
    }
}

impl std::fmt::Display for PeerIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.common_name())
    }
}

/// Names of agents, framework principals and operators: 1-64 characters of `[A-Za-z0-9_.-]`,
/// not starting with a dot and without `..` (names become file names in TLS directories).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && !name.contains("..")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

/// A certificate chain and its private key, ready for rustls.
#[derive(Debug)]
pub struct Identity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

/// Everything a peer needs to speak mutual TLS.
#[derive(Debug)]
pub struct TlsMaterial {
    /// Trust anchors: the cluster CA.
    pub roots: Arc<rustls::RootCertStore>,
    pub identity: Identity,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes `data` to `path` atomically (temp file + rename), with mode 0600 for keys.
fn write_atomic(path: &Path, data: &str, secret: bool) -> Result<(), TlsError> {
    use std::io::Write;
    let io = |source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    {
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        if secret {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts.open(&tmp).map_err(io)?;
        f.write_all(data.as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(io)
}

/// Creates `dir` (and missing parents) with mode 0700 when it does not exist yet; an existing
/// directory keeps its mode ([`check_dir_permissions`] judges it).
pub fn create_private_dir(dir: &Path) -> Result<(), TlsError> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| TlsError::Io {
            path: dir.to_path_buf(),
            source,
        })
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let data = read(path)?;
    let certs: Vec<_> = rustls_pemfile_certs(&data);
    if certs.is_empty() {
        return Err(TlsError::NoPem {
            path: path.to_path_buf(),
            what: "certificate",
        });
    }
    Ok(certs)
}

fn rustls_pemfile_certs(data: &[u8]) -> Vec<CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(data)
        .filter_map(Result::ok)
        .collect()
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    use rustls::pki_types::pem::PemObject;
    let data = read(path)?;
    PrivateKeyDer::from_pem_slice(&data).map_err(|_| TlsError::NoPem {
        path: path.to_path_buf(),
        what: "private key",
    })
}

/// The cluster certificate authority (certificate and key).
pub struct CertAuthority {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl CertAuthority {
    /// A brand-new CA.
    pub fn generate() -> Result<Self, TlsError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "Gantry cluster CA");
        dn.push(DnType::OrganizationName, "Gantry");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
        let cert = params.self_signed(&key)?;
        Ok(Self { cert, key })
    }

    /// Loads `ca.pem` and `ca.key` from `dir`.
    pub fn load(dir: &Path) -> Result<Self, TlsError> {
        let cert_pem = String::from_utf8_lossy(&read(&dir.join("ca.pem"))?).into_owned();
        let key_pem = String::from_utf8_lossy(&read(&dir.join("ca.key"))?).into_owned();
        let key = KeyPair::from_pem(&key_pem)?;
        let params = CertificateParams::from_ca_cert_pem(&cert_pem)?;
        // Re-signing the same subject with the same key yields an equivalent issuer.
        let cert = params.self_signed(&key)?;
        Ok(Self { cert, key })
    }

    /// Writes `ca.pem` and `ca.key` into `dir`.
    pub fn save(&self, dir: &Path) -> Result<(), TlsError> {
        create_private_dir(dir)?;
        write_atomic(&dir.join("ca.key"), &self.key.serialize_pem(), true)?;
        write_atomic(&dir.join("ca.pem"), &self.cert.pem(), false)
    }

    /// Issues a certificate for `identity`; `extra_sans` are added to master certificates
    /// (host names or IP addresses the master is reached by). Returns `(cert_pem, key_pem)`.
    pub fn issue(
        &self,
        identity: &PeerIdentity,
        extra_sans: &[String],
    ) -> Result<(String, String), TlsError> {
        if let Some(n) = identity.name() {
            if !valid_name(n) {
                return Err(TlsError::BadName(n.to_string()));
            }
        }
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, identity.common_name());
        dn.push(DnType::OrganizationName, "Gantry");
        params.distinguished_name = dn;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        match identity {
            PeerIdentity::Master => {
                params.extended_key_usages = vec![
                    ExtendedKeyUsagePurpose::ServerAuth,
                    ExtendedKeyUsagePurpose::ClientAuth,
                ];
                let mut sans = vec![
                    MASTER_SERVER_NAME.to_string(),
                    "localhost".to_string(),
                    "127.0.0.1".to_string(),
                    "::1".to_string(),
                ];
                sans.extend(extra_sans.iter().cloned());
                for san in sans {
                    let entry = match san.parse::<std::net::IpAddr>() {
                        Ok(ip) => SanType::IpAddress(ip),
                        Err(_) => SanType::DnsName(san.try_into()?),
                    };
                    if !params.subject_alt_names.contains(&entry) {
                        params.subject_alt_names.push(entry);
                    }
                }
            }
            _ => {
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            }
        }
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
        let cert = params.signed_by(&key, &self.cert, &self.key)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Issues a certificate for `identity` and writes it into `dir` under the naming convention.
    pub fn issue_to_dir(
        &self,
        identity: &PeerIdentity,
        extra_sans: &[String],
        dir: &Path,
    ) -> Result<(), TlsError> {
        let (cert, key) = self.issue(identity, extra_sans)?;
        let stem = identity.file_stem();
        write_atomic(&dir.join(format!("{stem}.key")), &key, true)?;
        write_atomic(&dir.join(format!("{stem}.pem")), &cert, false)
    }

    /// The CA certificate in PEM.
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }
}

/// Creates a CA in `dir` when it holds none (the master's dev convenience). Returns true if one
/// was created.
pub fn ensure_ca(dir: &Path) -> Result<bool, TlsError> {
    if dir.join("ca.pem").exists() {
        return Ok(false);
    }
    create_private_dir(dir)?;
    // Several processes may race here: take an exclusive lock file so only one CA is made.
    let lock = dir.join("ca.lock");
    let _guard = DirLock::acquire(&lock)?;
    if dir.join("ca.pem").exists() {
        return Ok(false);
    }
    CertAuthority::generate()?.save(dir)?;
    Ok(true)
}

/// Loads the TLS material for `identity` from `dir`, issuing the certificate from `ca.key`
/// first if it is missing and the CA key is present (the dev convenience).
pub fn load_or_issue(
    dir: &Path,
    identity: &PeerIdentity,
    extra_sans: &[String],
) -> Result<TlsMaterial, TlsError> {
    let ca_pem = dir.join("ca.pem");
    if !ca_pem.exists() {
        return Err(TlsError::MissingCa(ca_pem));
    }
    let stem = identity.file_stem();
    let cert_path = dir.join(format!("{stem}.pem"));
    let key_path = dir.join(format!("{stem}.key"));
    if !cert_path.exists() || !key_path.exists() {
        if !dir.join("ca.key").exists() {
            return Err(TlsError::MissingIdentity {
                identity: identity.to_string(),
                dir: dir.to_path_buf(),
                kind: identity.kind(),
            });
        }
        let _guard = DirLock::acquire(&dir.join(format!("{stem}.lock")))?;
        if !cert_path.exists() || !key_path.exists() {
            CertAuthority::load(dir)?.issue_to_dir(identity, extra_sans, dir)?;
        }
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certs(&ca_pem)? {
        roots.add(cert)?;
    }
    Ok(TlsMaterial {
        roots: Arc::new(roots),
        identity: Identity {
            chain: load_certs(&cert_path)?,
            key: load_key(&key_path)?,
        },
    })
}

/// An exclusive lock held through a file created with O_EXCL; removed on drop.
struct DirLock(PathBuf);

impl DirLock {
    fn acquire(path: &Path) -> Result<Self, TlsError> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
            {
                Ok(_) => return Ok(DirLock(path.to_path_buf())),
                Err(e)
                    if e.kind() == std::io::ErrorKind::AlreadyExists
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    // A crashed holder left it behind: take it over.
                    return Ok(DirLock(path.to_path_buf()));
                }
                Err(source) => {
                    return Err(TlsError::Io {
                        path: path.to_path_buf(),
                        source,
                    })
                }
            }
        }
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// rustls server configuration requiring a client certificate from the cluster CA.
pub fn server_config(material: &TlsMaterial) -> Result<rustls::ServerConfig, TlsError> {
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        material.roots.clone(),
        provider(),
    )
    .build()
    .map_err(|e| TlsError::Verifier(e.to_string()))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            material.identity.chain.clone(),
            material.identity.key.clone_key(),
        )?;
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    Ok(cfg)
}

/// rustls client configuration trusting only the cluster CA and presenting our certificate.
pub fn client_config(material: &TlsMaterial) -> Result<rustls::ClientConfig, TlsError> {
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(material.roots.clone())
        .with_client_auth_cert(
            material.identity.chain.clone(),
            material.identity.key.clone_key(),
        )?;
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    Ok(cfg)
}

/// Reads the peer identity from a DER certificate's subject common name. A certificate without
/// the clientAuth extended key usage identifies nobody (the TLS verifiers accept a certificate
/// with no extended key usage at all; Gantry never issues one).
pub fn identity_from_cert(der: &[u8]) -> Option<PeerIdentity> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let eku = cert.extended_key_usage().ok()??;
    if !eku.value.client_auth {
        return None;
    }
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?;
    PeerIdentity::from_common_name(cn)
}

/// Checks a TLS directory before use: an error when the directory or a key file (`*.key`) is
/// writable by group or others (anyone who can replace a key or certificate can impersonate
/// this host); the returned warnings name key files others can read.
pub fn check_dir_permissions(dir: &Path) -> Result<Vec<String>, TlsError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TlsError::Io { path, source }
    };
    let writable = |path: &Path, mode: u32| -> Result<(), TlsError> {
        let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
            (_, true) => "others",
            (true, false) => "its group",
            _ => return Ok(()),
        };
        Err(TlsError::Permissions {
            path: path.to_path_buf(),
            who,
            mode: mode & 0o7777,
        })
    };
    let meta = std::fs::metadata(dir).map_err(io(dir))?;
    writable(dir, meta.permissions().mode())?;
    let mut warnings = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("key") {
            continue;
        }
        let mode = std::fs::metadata(&path)
            .map_err(io(&path))?
            .permissions()
            .mode();
        writable(&path, mode)?;
        if mode & 0o004 != 0 {
            warnings.push(format!(
                "{} is readable by every user (mode {:o}); run `chmod 600 {}`",
                path.display(),
                mode & 0o7777,
                path.display()
            ));
        }
    }
    Ok(warnings)
}

/// rustls server configuration for the master's HTTPS operator API: the master's certificate,
/// TLS 1.2 and 1.3 (for ordinary HTTP clients), ALPN `http/1.1`, and an *optional* client
/// certificate from the cluster CA (operators may use a bearer token instead; the server reads
/// the identity with [`identity_from_cert`]).
pub fn https_server_config(material: &TlsMaterial) -> Result<rustls::ServerConfig, TlsError> {
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        material.roots.clone(),
        provider(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| TlsError::Verifier(e.to_string()))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            material.identity.chain.clone(),
            material.identity.key.clone_key(),
        )?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// The cluster CA from `DIR/ca.pem`, as trust roots for an HTTPS client.
pub fn load_roots(dir: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let ca_pem = dir.join("ca.pem");
    if !ca_pem.exists() {
        return Err(TlsError::MissingCa(ca_pem));
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certs(&ca_pem)? {
        roots.add(cert)?;
    }
    Ok(roots)
}

/// Loads an existing identity from `dir` (`STEM.pem` and `STEM.key`) without issuing anything.
pub fn load_identity(dir: &Path, identity: &PeerIdentity) -> Result<Identity, TlsError> {
    let stem = identity.file_stem();
    let cert_path = dir.join(format!("{stem}.pem"));
    let key_path = dir.join(format!("{stem}.key"));
    if !cert_path.exists() || !key_path.exists() {
        return Err(TlsError::MissingIdentity {
            identity: identity.to_string(),
            dir: dir.to_path_buf(),
            kind: identity.kind(),
        });
    }
    Ok(Identity {
        chain: load_certs(&cert_path)?,
        key: load_key(&key_path)?,
    })
}

/// rustls client configuration for HTTPS to the master (ring provider, TLS 1.2/1.3, ALPN
/// `http/1.1`), trusting `roots` and presenting `identity` when given.
pub fn https_client_config(
    roots: rustls::RootCertStore,
    identity: Option<&Identity>,
) -> Result<rustls::ClientConfig, TlsError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut cfg = match identity {
        Some(id) => builder.with_client_auth_cert(id.chain.clone(), id.key.clone_key())?,
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_dir_flow_issues_and_reads_identities() {
        let dir = std::env::temp_dir().join(format!("gantry-tls-test-{}", uuid::Uuid::new_v4()));
        assert!(ensure_ca(&dir).unwrap());
        assert!(!ensure_ca(&dir).unwrap());
        let m = load_or_issue(&dir, &PeerIdentity::Master, &[]).unwrap();
        let a = load_or_issue(&dir, &PeerIdentity::Agent("gpu-1".into()), &[]).unwrap();
        assert_eq!(
            identity_from_cert(&m.identity.chain[0]),
            Some(PeerIdentity::Master)
        );
        assert_eq!(
            identity_from_cert(&a.identity.chain[0]),
            Some(PeerIdentity::Agent("gpu-1".into()))
        );
        server_config(&m).unwrap();
        client_config(&a).unwrap();
        // Without the CA key an unknown identity is a clear error.
        std::fs::remove_file(dir.join("ca.key")).unwrap();
        let err = load_or_issue(&dir, &PeerIdentity::Framework("x".into()), &[]).unwrap_err();
        assert!(matches!(err, TlsError::MissingIdentity { .. }), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn identity_names_are_validated() {
        assert_eq!(PeerIdentity::from_common_name("agent:a b"), None);
        assert_eq!(PeerIdentity::from_common_name("root"), None);
        let ca = CertAuthority::generate().unwrap();
        assert!(matches!(
            ca.issue(&PeerIdentity::Agent("../x".into()), &[]),
            Err(TlsError::BadName(_))
        ));
    }

    #[test]
    fn names_with_dot_dot_or_a_leading_dot_are_refused() {
        for bad in ["..", "../x", "a..b", ".hidden", ".", ""] {
            assert!(!valid_name(bad), "{bad:?}");
            assert_eq!(
                PeerIdentity::from_common_name(&format!("operator:{bad}")),
                None
            );
        }
        for good in ["a.b", "gpu-node-17", "x_y.z"] {
            assert!(valid_name(good), "{good:?}");
        }
        let ca = CertAuthority::generate().unwrap();
        assert!(matches!(
            ca.issue(&PeerIdentity::Operator(".admin".into()), &[]),
            Err(TlsError::BadName(_))
        ));
    }

    #[test]
    fn operator_certificates_carry_client_auth_and_their_identity() {
        let ca = CertAuthority::generate().unwrap();
        let (pem, _) = ca
            .issue(&PeerIdentity::Operator("alice".into()), &[])
            .unwrap();
        let der = rustls_pemfile_certs(pem.as_bytes());
        assert_eq!(
            identity_from_cert(&der[0]),
            Some(PeerIdentity::Operator("alice".into()))
        );
        assert_eq!(
            PeerIdentity::Operator("alice".into()).file_stem(),
            "operator-alice"
        );
    }

    #[test]
    fn a_certificate_without_client_auth_identifies_nobody() {
        let ca = CertAuthority::generate().unwrap();
        for ekus in [vec![], vec![ExtendedKeyUsagePurpose::ServerAuth]] {
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            let mut dn = DistinguishedName::new();
            dn.push(DnType::CommonName, "operator:mallory");
            params.distinguished_name = dn;
            params.extended_key_usages = ekus;
            let key = KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
            let cert = params.signed_by(&key, &ca.cert, &ca.key).unwrap();
            assert_eq!(identity_from_cert(cert.der()), None);
        }
    }

    #[test]
    fn tls_dirs_and_keys_writable_by_others_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("gantry-tls-perm-{}", uuid::Uuid::new_v4()));
        assert!(ensure_ca(&dir).unwrap());
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700, "a created TLS directory is private");
        assert_eq!(mode(&dir.join("ca.key")), 0o600);
        assert!(check_dir_permissions(&dir).unwrap().is_empty());
        let set = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        set(&dir.join("ca.key"), 0o644);
        let warnings = check_dir_permissions(&dir).unwrap();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("ca.key"), "{warnings:?}");
        set(&dir.join("ca.key"), 0o620);
        assert!(matches!(
            check_dir_permissions(&dir),
            Err(TlsError::Permissions {
                who: "its group",
                ..
            })
        ));
        set(&dir.join("ca.key"), 0o600);
        set(&dir, 0o777);
        let err = check_dir_permissions(&dir).unwrap_err();
        assert!(
            matches!(err, TlsError::Permissions { who: "others", .. }),
            "{err}"
        );
        set(&dir, 0o755);
        assert!(check_dir_permissions(&dir).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
