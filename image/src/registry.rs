//! The registry side: the `oci-client` configuration (TLS roots, insecure registries, linux/amd64
//! from manifest lists), credentials from a docker `config.json`, and the mapping of the client's
//! errors onto [`ImageError`].

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use base64::Engine;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use serde::Deserialize;

use crate::{ImageError, StoreConfig};

/// Builds the client for a store's configuration.
pub(crate) fn client(cfg: &StoreConfig) -> Result<oci_client::Client, ImageError> {
    let mut roots = Vec::new();
    for path in &cfg.extra_roots {
        let data = std::fs::read(path).map_err(|e| ImageError::Roots {
            path: path.clone(),
            message: e.to_string(),
        })?;
        if !String::from_utf8_lossy(&data).contains("-----BEGIN CERTIFICATE-----") {
            return Err(ImageError::Roots {
                path: path.clone(),
                message: "no PEM certificate in it".into(),
            });
        }
        roots.push(Certificate {
            encoding: CertificateEncoding::Pem,
            data,
        });
    }
    let config = ClientConfig {
        protocol: if cfg.insecure.is_empty() {
            ClientProtocol::Https
        } else {
            ClientProtocol::HttpsExcept(cfg.insecure.clone())
        },
        extra_root_certificates: roots,
        platform_resolver: Some(Box::new(oci_client::client::linux_amd64_resolver)),
        connect_timeout: Some(Duration::from_secs(10)),
        read_timeout: Some(Duration::from_secs(60)),
        ..ClientConfig::default()
    };
    Ok(oci_client::Client::new(config))
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, DockerAuth>,
}

#[derive(Deserialize)]
struct DockerAuth {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// `host[:port]` from a `config.json` key, which may be a URL (`https://host/v1/`).
fn registry_key(key: &str) -> String {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    k.split('/').next().unwrap_or(k).to_string()
}

/// Credentials per registry (`host[:port]` → user, password) from a docker `config.json`.
pub(crate) fn load_credentials(
    path: &Path,
) -> Result<BTreeMap<String, (String, String)>, ImageError> {
    let err = |message: String| ImageError::Credentials {
        path: path.to_path_buf(),
        message,
    };
    let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    let parsed: DockerConfig = serde_json::from_slice(&bytes)
        .map_err(|e| err(format!("not a docker config.json: {e}")))?;
    let mut out = BTreeMap::new();
    for (key, entry) in parsed.auths {
        let pair = match (entry.auth, entry.username, entry.password) {
            (Some(auth), _, _) => {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(auth.trim())
                    .map_err(|e| err(format!("auths.{key}.auth is not base64: {e}")))?;
                let text = String::from_utf8(raw)
                    .map_err(|_| err(format!("auths.{key}.auth is not UTF-8")))?;
                let Some((user, pass)) = text.split_once(':') else {
                    return Err(err(format!("auths.{key}.auth is not user:password")));
                };
                (user.to_string(), pass.to_string())
            }
            (None, Some(user), Some(pass)) => (user, pass),
            _ => {
                return Err(err(format!(
                    "auths.{key} has neither auth nor username/password"
                )))
            }
        };
        out.insert(registry_key(&key), pair);
    }
    Ok(out)
}

/// The auth to present to `registry`.
pub(crate) fn auth_for(creds: &BTreeMap<String, (String, String)>, registry: &str) -> RegistryAuth {
    match creds.get(registry) {
        Some((u, p)) => RegistryAuth::Basic(u.clone(), p.clone()),
        None => RegistryAuth::Anonymous,
    }
}

/// The whole chain of an error's sources, for messages (TLS errors hide in the sources).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        let t = inner.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = inner.source();
    }
    s
}

/// Maps a client error for `reference` at `registry` onto an [`ImageError`].
pub(crate) fn map_error(e: OciDistributionError, reference: &str, registry: &str) -> ImageError {
    let auth = |message: String| ImageError::Auth {
        registry: registry.to_string(),
        message,
    };
    let not_found = |message: String| ImageError::NotFound {
        reference: reference.to_string(),
        message,
    };
    match e {
        OciDistributionError::AuthenticationFailure(m) => auth(m),
        OciDistributionError::UnauthorizedError { url } => {
            auth(format!("401 Unauthorized for {url}"))
        }
        OciDistributionError::ImageManifestNotFoundError(m) => not_found(m),
        OciDistributionError::DigestError(oci_client::errors::DigestError::VerificationError {
            expected,
            actual,
        }) => ImageError::Digest {
            expected,
            got: actual,
        },
        OciDistributionError::RegistryError { envelope, url } => {
            let message = format!("{envelope} ({url})");
            match envelope.errors.first().map(|e| &e.code) {
                Some(OciErrorCode::Unauthorized | OciErrorCode::Denied) => auth(message),
                Some(
                    OciErrorCode::ManifestUnknown
                    | OciErrorCode::NameUnknown
                    | OciErrorCode::NotFound
                    | OciErrorCode::BlobUnknown,
                ) => not_found(message),
                _ => ImageError::Registry {
                    registry: registry.to_string(),
                    status: 400,
                    message,
                },
            }
        }
        OciDistributionError::ServerError { code, url, message } => match code {
            401 | 403 => auth(format!("{code} for {url}: {message}")),
            404 => not_found(format!("404 for {url}: {message}")),
            _ => ImageError::Registry {
                registry: registry.to_string(),
                status: code,
                message: format!("{url}: {message}"),
            },
        },
        OciDistributionError::RequestError(r) => match r.status().map(|s| s.as_u16()) {
            Some(401 | 403) => auth(chain(&r)),
            Some(404) => not_found(chain(&r)),
            Some(code) => ImageError::Registry {
                registry: registry.to_string(),
                status: code,
                message: chain(&r),
            },
            None => ImageError::Transport {
                registry: registry.to_string(),
                message: chain(&r),
            },
        },
        other => ImageError::Registry {
            registry: registry.to_string(),
            status: 0,
            message: chain(&other),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_config_json_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        let auth = base64::engine::general_purpose::STANDARD.encode("alice:s3cr:et");
        std::fs::write(
            &path,
            format!(
                r#"{{"auths": {{"reg.example:5000": {{"auth": "{auth}"}},
                   "https://other.example/v1/": {{"username": "bob", "password": "pw"}}}}}}"#
            ),
        )
        .unwrap();
        let creds = load_credentials(&path).unwrap();
        assert_eq!(
            creds.get("reg.example:5000"),
            Some(&("alice".to_string(), "s3cr:et".to_string()))
        );
        assert_eq!(
            creds.get("other.example"),
            Some(&("bob".to_string(), "pw".to_string()))
        );
        assert!(matches!(
            auth_for(&creds, "nowhere:1"),
            RegistryAuth::Anonymous
        ));
    }

    #[test]
    fn bad_credentials_files_say_why() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, r#"{"auths": {"r": {"auth": "!!!"}}}"#).unwrap();
        let e = load_credentials(&path).unwrap_err();
        assert!(e.to_string().contains("not base64"), "{e}");
        std::fs::write(&path, "nope").unwrap();
        assert!(load_credentials(&path).is_err());
    }
}
