//! `--config FILE` for every Gantry binary: a TOML file whose keys mirror the command-line
//! flags. `listen = "0.0.0.0:5050"` means `--listen 0.0.0.0:5050`; `no_gpu_filter = true` means
//! `--no-gpu-filter`; arrays repeat the flag. File flags come first, so flags given on the
//! command line override them (binaries set clap's `args_override_self`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Why a configuration file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("--config needs a file name")]
    /// `--config` without a file.
    MissingPath,
    #[error("reading config file {path}: {source}")]
    /// The file could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML: {source}")]
    /// The file is not valid TOML.
    Parse {
        /// The file.
        path: PathBuf,
        /// The error.
        source: toml::de::Error,
    },
    #[error("config file {path}: key {key:?} has a value of a kind flags can not take (tables and dates are not supported)")]
    /// A key that is not a flag of this binary (or not a scalar or list).
    Unsupported {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
    },
}

/// The process arguments with any `--config FILE` expanded into flags.
pub fn expand_args() -> Result<Vec<OsString>, ConfigFileError> {
    expand(std::env::args_os().collect())
}

/// Expands `--config FILE` / `--config=FILE` in `args` (the first element is the program).
pub fn expand(args: Vec<OsString>) -> Result<Vec<OsString>, ConfigFileError> {
    let mut rest = Vec::with_capacity(args.len());
    let mut files = Vec::new();
    let mut it = args.into_iter();
    let program = it.next();
    while let Some(a) = it.next() {
        if a == "--config" {
            files.push(PathBuf::from(
                it.next().ok_or(ConfigFileError::MissingPath)?,
            ));
        } else if let Some(p) = a.to_str().and_then(|s| s.strip_prefix("--config=")) {
            files.push(PathBuf::from(p));
        } else {
            rest.push(a);
        }
    }
    let mut out: Vec<OsString> = program.into_iter().collect();
    // Flags go right after the program name, or after a leading subcommand word.
    let subcommand = rest
        .first()
        .filter(|a| !a.to_string_lossy().starts_with('-'))
        .cloned();
    if let Some(sub) = &subcommand {
        out.push(sub.clone());
        rest.remove(0);
    }
    for f in &files {
        out.extend(file_flags(f)?);
    }
    out.extend(rest);
    Ok(out)
}

fn file_flags(path: &Path) -> Result<Vec<OsString>, ConfigFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let table: toml::Table = text.parse().map_err(|source| ConfigFileError::Parse {
        path: path.to_path_buf(),
        source,
    })?;
    let mut out = Vec::new();
    for (key, value) in table {
        let flag = format!("--{}", key.replace('_', "-"));
        let unsupported = || ConfigFileError::Unsupported {
            path: path.to_path_buf(),
            key: key.clone(),
        };
        let values = match value {
            toml::Value::Array(items) => items,
            v => vec![v],
        };
        for v in values {
            match v {
                toml::Value::Boolean(true) => out.push(OsString::from(&flag)),
                toml::Value::Boolean(false) => {}
                toml::Value::String(s) => {
                    out.push(OsString::from(&flag));
                    out.push(OsString::from(s));
                }
                toml::Value::Integer(i) => {
                    out.push(OsString::from(&flag));
                    out.push(OsString::from(i.to_string()));
                }
                toml::Value::Float(x) => {
                    out.push(OsString::from(&flag));
                    out.push(OsString::from(x.to_string()));
                }
                _ => return Err(unsupported()),
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn expands_before_command_line_flags() {
        let dir = std::env::temp_dir().join(format!("gantry-cfg-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("m.toml");
        std::fs::write(&f, "listen = \"0.0.0.0:1\"\nno_gpu_filter = true\nquiet = false\nagent_reregister_timeout = 2.5\ntls_san = [\"a\", \"b\"]\n").unwrap();
        let out = expand(os(&[
            "m",
            "--config",
            f.to_str().unwrap(),
            "--listen",
            "127.0.0.1:2",
        ]))
        .unwrap();
        let out: Vec<String> = out
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        assert_eq!(out[0], "m");
        let pos = |x: &str| out.iter().position(|a| a == x).unwrap();
        assert!(pos("0.0.0.0:1") < pos("127.0.0.1:2"), "{out:?}");
        assert!(out.contains(&"--no-gpu-filter".to_string()));
        assert!(!out.contains(&"--quiet".to_string()));
        assert!(out.contains(&"2.5".to_string()));
        assert_eq!(out.iter().filter(|a| *a == "--tls-san").count(), 2);
        // A subcommand stays first.
        let out = expand(os(&[
            "m",
            "simulate",
            &format!("--config={}", f.display()),
            "x.toml",
        ]))
        .unwrap();
        assert_eq!(out[1], "simulate");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_files_are_clear_errors() {
        assert!(matches!(
            expand(os(&["m", "--config"])),
            Err(ConfigFileError::MissingPath)
        ));
        let err = expand(os(&["m", "--config", "/nonexistent/gantry.toml"])).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/gantry.toml"),
            "{err}"
        );
        let dir = std::env::temp_dir().join(format!("gantry-cfg-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("bad.toml");
        std::fs::write(&f, "listen = [").unwrap();
        assert!(matches!(
            expand(os(&["m", "--config", f.to_str().unwrap()])),
            Err(ConfigFileError::Parse { .. })
        ));
        std::fs::write(&f, "[section]\nx = 1\n").unwrap();
        assert!(matches!(
            expand(os(&["m", "--config", f.to_str().unwrap()])),
            Err(ConfigFileError::Unsupported { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
