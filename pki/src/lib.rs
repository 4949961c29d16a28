//! # gantry-pki
//!
//! The cluster certificate authority: creating the CA, issuing certificates for the master,
//! agents, frameworks and operators, and the development `--tls-dir` convenience of issuing a
//! missing certificate from `ca.key`. Used by `gantry-master` (dev CA, its own certificate),
//! `gantryctl certs`, `gantry-agent` (dev mode), the `batch` example's dev mode and the tests —
//! never by `gantry-sdk`, so framework authors do not compile rcgen. Loading existing material
//! and the rustls configurations live in `gantry_transport::tls`; the directory layout is
//! documented there.
//!
//! - [`CertAuthority`]: generate, load, save, issue (to PEM strings or into a directory).
//! - [`ensure_ca`]: the master's dev convenience (a CA when the directory holds none).
//! - [`load_or_issue`]: [`gantry_transport::tls::load`], issuing the certificate first when it
//!   is missing and `ca.key` is present.
//! - [`create_private_dir`]: a 0700 directory for keys.

#![warn(missing_docs)]

use std::path::{Path, PathBuf};

use gantry_transport::tls::{
    self, read, valid_name, PeerIdentity, TlsError, TlsMaterial, MASTER_SERVER_NAME,
};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// The key type of the CA and of every certificate Gantry issues: ECDSA P-256 with SHA-256.
/// Browsers (the `/ui` dashboard) support it; they do not support Ed25519 in TLS or in
/// certificate signatures. Existing Ed25519 material keeps working for QUIC and `gantryctl`.
const KEY_ALG: &rcgen::SignatureAlgorithm = &rcgen::PKCS_ECDSA_P256_SHA256;

/// rcgen failures as [`TlsError::Generate`] (the error type every TLS-directory function shares).
trait Generated<T> {
    fn generated(self) -> Result<T, TlsError>;
}

impl<T> Generated<T> for Result<T, rcgen::Error> {
    fn generated(self) -> Result<T, TlsError> {
        self.map_err(|e| TlsError::Generate(Box::new(e)))
    }
}

/// The cluster certificate authority (certificate and key).
pub struct CertAuthority {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl CertAuthority {
    /// A brand-new CA.
    pub fn generate() -> Result<Self, TlsError> {
        let mut params = CertificateParams::new(Vec::<String>::new()).generated()?;
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
        let key = KeyPair::generate_for(KEY_ALG).generated()?;
        let cert = params.self_signed(&key).generated()?;
        Ok(Self { cert, key })
    }

    /// Loads `ca.pem` and `ca.key` from `dir`.
    pub fn load(dir: &Path) -> Result<Self, TlsError> {
        let cert_pem = String::from_utf8_lossy(&read(&dir.join("ca.pem"))?).into_owned();
        let key_pem = String::from_utf8_lossy(&read(&dir.join("ca.key"))?).into_owned();
        let key = KeyPair::from_pem(&key_pem).generated()?;
        let params = CertificateParams::from_ca_cert_pem(&cert_pem).generated()?;
        // Re-signing the same subject with the same key yields an equivalent issuer.
        let cert = params.self_signed(&key).generated()?;
        Ok(Self { cert, key })
    }

    /// Writes `ca.pem` and `ca.key` into `dir`.
    pub fn save(&self, dir: &Path) -> Result<(), TlsError> {
        create_private_dir(dir)?;
        write_atomic(&dir.join("ca.key"), &self.key.serialize_pem(), true)?;
        write_atomic(&dir.join("ca.pem"), &self.cert.pem(), false)
    }

    /// Issues a certificate for `identity`; `extra_sans` are added to master certificates
    /// (host names or IP addresses the master is reached by) and are a service certificate's
    /// names (at least one; never the master's DNS name). Returns `(cert_pem, key_pem)`.
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
        let mut params = CertificateParams::new(Vec::<String>::new()).generated()?;
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
                        Err(_) => SanType::DnsName(san.try_into().generated()?),
                    };
                    if !params.subject_alt_names.contains(&entry) {
                        params.subject_alt_names.push(entry);
                    }
                }
            }
            PeerIdentity::Service(_) => {
                // Server authentication only: identity_from_cert reads no client from it, so
                // it can never speak as anyone to the master, an agent or a service.
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
                if extra_sans.is_empty() {
                    return Err(TlsError::BadServiceSan(
                        "no host: give the names or addresses clients reach it by (--san)".into(),
                    ));
                }
                for san in extra_sans {
                    // Agents and frameworks know the master by this name alone (and the CA).
                    if san
                        .trim_end_matches('.')
                        .eq_ignore_ascii_case(MASTER_SERVER_NAME)
                    {
                        return Err(TlsError::BadServiceSan(format!(
                            "{san:?}, the master's name: a service may not be reached as the master"
                        )));
                    }
                    let entry = match san.parse::<std::net::IpAddr>() {
                        Ok(ip) => SanType::IpAddress(ip),
                        Err(_) => SanType::DnsName(san.clone().try_into().generated()?),
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
        let key = KeyPair::generate_for(KEY_ALG).generated()?;
        let cert = params.signed_by(&key, &self.cert, &self.key).generated()?;
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

/// Loads the TLS material for `identity` from `dir`, issuing the certificate from `ca.key`
/// first if it is missing and the CA key is present (the dev convenience). Without the CA key
/// a missing certificate is [`TlsError::MissingIdentity`], as with [`tls::load`].
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
    let missing = || !cert_path.exists() || !key_path.exists();
    if missing() && dir.join("ca.key").exists() {
        let _guard = DirLock::acquire(&dir.join(format!("{stem}.lock")))?;
        if missing() {
            CertAuthority::load(dir)?.issue_to_dir(identity, extra_sans, dir)?;
        }
    }
    tls::load(dir, identity)
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
/// directory keeps its mode ([`check_dir_permissions`](tls::check_dir_permissions) judges it).
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

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_transport::tls::{
        check_dir_permissions, client_config, identity_from_cert, server_config,
    };

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
        let der = gantry_transport::tls::pem_certs(pem.as_bytes());
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
    fn user_certificates_name_a_user_and_service_certificates_no_client() {
        let ca = CertAuthority::generate().unwrap();
        let (pem, _) = ca.issue(&PeerIdentity::User("alice".into()), &[]).unwrap();
        let der = gantry_transport::tls::pem_certs(pem.as_bytes());
        assert_eq!(
            identity_from_cert(&der[0]),
            Some(PeerIdentity::User("alice".into()))
        );
        assert_eq!(PeerIdentity::User("alice".into()).file_stem(), "user-alice");
        // A service's server certificate: its names, server authentication only, so a
        // service cannot present it as a client anywhere.
        let (pem, _) = ca
            .issue(
                &PeerIdentity::Service("queue".into()),
                &["queue.example.com".into(), "10.0.0.7".into()],
            )
            .unwrap();
        let der = gantry_transport::tls::pem_certs(pem.as_bytes());
        assert_eq!(identity_from_cert(&der[0]), None);
        let (_, cert) = x509_parser::parse_x509_certificate(&der[0]).unwrap();
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && !eku.client_auth);
        let sans = format!(
            "{:?}",
            cert.subject_alternative_name().unwrap().unwrap().value
        );
        assert!(sans.contains("queue.example.com"), "{sans}");
    }

    #[test]
    fn a_service_certificate_never_carries_the_masters_name() {
        // Agents and frameworks check the master by the CA and the DNS name gantry-master
        // alone: a service certificate with that name would let its host pose as the master.
        let ca = CertAuthority::generate().unwrap();
        for bad in [MASTER_SERVER_NAME, "GANTRY-MASTER", "gantry-master."] {
            let err = ca
                .issue(
                    &PeerIdentity::Service("queue".into()),
                    &["queue.example.com".into(), bad.into()],
                )
                .unwrap_err();
            assert!(matches!(err, TlsError::BadServiceSan(_)), "{bad}: {err}");
        }
        assert!(matches!(
            ca.issue(&PeerIdentity::Service("queue".into()), &[]),
            Err(TlsError::BadServiceSan(_))
        ));
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
