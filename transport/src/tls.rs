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
//! [`check_dir_permissions`] refuses a directory or key file others may write. This module only
//! reads a directory ([`load`], [`load_roots`], [`load_identity`]); creating the CA and issuing
//! certificates is `gantry_pki`'s (not compiled into `gantry-sdk`). In development every binary
//! is pointed at the same directory: the master creates the CA when none exists, and agents
//! (and the `batch` example) issue their own certificates from `ca.key` with `gantry_pki`. In
//! production `gantryctl certs` writes the same files and each host gets only `ca.pem` plus its
//! own pair.
//!
//! The server configurations (`server_config`, `https_server_config`) are compiled with the
//! `server` feature only (the master's).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The DNS name every master certificate carries and every client verifies.
pub const MASTER_SERVER_NAME: &str = "gantry-master";

/// ALPN protocol id: the version of the framing; the message protocol's version
/// ([`gantry_proto::PROTOCOL_VERSION`]) is checked in the `Hello`, with an error that says so.
pub const ALPN: &[u8] = b"gantry/1";

/// Errors setting up TLS material.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    /// Reading or writing a file failed.
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    #[error("{path}: no PEM {what} found")]
    /// A file holds no PEM block of the expected kind.
    NoPem {
        /// The file.
        path: PathBuf,
        /// `certificate` or `private key`.
        what: &'static str,
    },
    #[error("no certificate for {identity} in {dir} and no CA key there to issue one; issue it with `gantryctl certs {kind} ...` (see docs/operations.md)")]
    /// The identity has no certificate and nothing can issue one.
    MissingIdentity {
        /// The identity (common name).
        identity: String,
        /// The TLS directory.
        dir: PathBuf,
        /// Its `gantryctl certs` kind.
        kind: &'static str,
    },
    #[error("no CA certificate {0} (start the master with this --tls-dir first, or run `gantryctl certs ca`)")]
    /// The directory has no `ca.pem`.
    MissingCa(PathBuf),
    /// Creating a key or certificate failed (`gantry_pki`, which owns certificate issuing).
    #[error("certificate generation failed: {0}")]
    Generate(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("TLS configuration failed: {0}")]
    /// rustls refused the configuration.
    Rustls(#[from] rustls::Error),
    #[error("client verifier: {0}")]
    /// The client certificate verifier could not be built.
    Verifier(String),
    #[error("invalid name {0:?}: use 1-64 characters of [A-Za-z0-9_.-], not starting with a dot and without \"..\"")]
    /// A name outside [`valid_name`].
    BadName(String),
    /// A service certificate's host names: none given, or the master's DNS name.
    #[error("service certificate names {0}")]
    BadServiceSan(String),
    #[error(
        "{path} is writable by {who} (mode {mode:o}); run `chmod go-w {path}` (keys: `chmod 600`)"
    )]
    /// A directory or key file is writable by others.
    Permissions {
        /// The file or directory.
        path: PathBuf,
        /// `its group` or `others`.
        who: &'static str,
        /// Its mode bits.
        mode: u32,
    },
}

/// Who a certificate belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PeerIdentity {
    /// The master (common name `master`).
    Master,
    /// An agent (`agent:NAME`).
    Agent(String),
    /// A framework principal (`framework:NAME`).
    Framework(String),
    /// A user of the operator HTTP API (`gantryctl`).
    Operator(String),
    /// A user of services built on Gantry, such as the job queue (`user:NAME`): a client
    /// certificate that names a person, with no rights on the master.
    User(String),
    /// A service's HTTPS server (`service:NAME`, with the host names it is reached by): server
    /// authentication only, so it identifies no client anywhere, and never carries the master's
    /// DNS name.
    Service(String),
}

impl PeerIdentity {
    /// The subject common name encoding this identity.
    pub fn common_name(&self) -> String {
        match self {
            PeerIdentity::Master => "master".to_string(),
            PeerIdentity::Agent(n) => format!("agent:{n}"),
            PeerIdentity::Framework(n) => format!("framework:{n}"),
            PeerIdentity::Operator(n) => format!("operator:{n}"),
            PeerIdentity::User(n) => format!("user:{n}"),
            PeerIdentity::Service(n) => format!("service:{n}"),
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
            "user" => Some(PeerIdentity::User(name.to_string())),
            "service" => Some(PeerIdentity::Service(name.to_string())),
            _ => None,
        }
    }

    /// File stem in a TLS directory: `master`, `agent-NAME`, `framework-NAME`,
    /// `operator-NAME`, `user-NAME`, `service-NAME`.
    pub fn file_stem(&self) -> String {
        match self {
            PeerIdentity::Master => "master".to_string(),
            PeerIdentity::Agent(n) => format!("agent-{n}"),
            PeerIdentity::Framework(n) => format!("framework-{n}"),
            PeerIdentity::Operator(n) => format!("operator-{n}"),
            PeerIdentity::User(n) => format!("user-{n}"),
            PeerIdentity::Service(n) => format!("service-{n}"),
        }
    }

    /// `master`, `agent`, `framework`, `operator`, `user` or `service`: the `gantryctl certs`
    /// kind.
    pub fn kind(&self) -> &'static str {
        match self {
            PeerIdentity::Master => "master",
            PeerIdentity::Agent(_) => "agent",
            PeerIdentity::Framework(_) => "framework",
            PeerIdentity::Operator(_) => "operator",
            PeerIdentity::User(_) => "user",
            PeerIdentity::Service(_) => "service",
        }
    }

    /// The name in any identity but the master's.
    pub fn name(&self) -> Option<&str> {
        match self {
            PeerIdentity::Master => None,
            PeerIdentity::Agent(n)
            | PeerIdentity::Framework(n)
            | PeerIdentity::Operator(n)
            | PeerIdentity::User(n)
            | PeerIdentity::Service(n) => Some(n),
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
    /// The certificate, then any intermediates.
    pub chain: Vec<CertificateDer<'static>>,
    /// Its private key.
    pub key: PrivateKeyDer<'static>,
}

/// Everything a peer needs to speak mutual TLS.
#[derive(Debug)]
pub struct TlsMaterial {
    /// Trust anchors: the cluster CA.
    pub roots: Arc<rustls::RootCertStore>,
    /// This peer's certificate and key.
    pub identity: Identity,
}

/// Reads `path`, naming it in the error.
pub fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let data = read(path)?;
    let certs: Vec<_> = pem_certs(&data);
    if certs.is_empty() {
        return Err(TlsError::NoPem {
            path: path.to_path_buf(),
            what: "certificate",
        });
    }
    Ok(certs)
}

/// Every certificate in PEM `data` (unparseable blocks skipped).
pub fn pem_certs(data: &[u8]) -> Vec<CertificateDer<'static>> {
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

/// Loads the TLS material for `identity` from `dir` (`ca.pem`, `STEM.pem`, `STEM.key`): never
/// issues anything. A missing certificate is [`TlsError::MissingIdentity`], which tells the
/// operator how to issue one (`gantryctl certs`; in development `gantry_pki::load_or_issue`
/// issues it from the CA key).
pub fn load(dir: &Path, identity: &PeerIdentity) -> Result<TlsMaterial, TlsError> {
    let roots = load_roots(dir)?;
    Ok(TlsMaterial {
        roots: Arc::new(roots),
        identity: load_identity(dir, identity)?,
    })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

#[cfg(feature = "server")]
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

#[cfg(feature = "server")]
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
