//! CDI (Container Device Interface) specs: the devices, mounts, environment and hooks a
//! vendor says a device needs inside a container. No maintained Rust CDI crate exists (the
//! reference implementation is Go's `tags.cncf.io/container-device-interface`), and the format
//! is small, so the JSON form is parsed here with serde (`cdiVersion`, `kind`, `devices[]` with
//! `name` and `containerEdits`, and spec-wide `containerEdits`). YAML specs are skipped with a
//! warning: generate JSON (`nvidia-ctk cdi generate --format json`).

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The CDI kind of NVIDIA GPUs (`nvidia.com/gpu=NAME`).
pub const GPU_KIND: &str = "nvidia.com/gpu";

/// One CDI spec file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CdiSpec {
    pub cdi_version: String,
    pub kind: String,
    #[serde(default)]
    pub devices: Vec<CdiDevice>,
    /// Edits every device of the spec needs.
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

/// A named device of a spec.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CdiDevice {
    pub name: String,
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

/// What a device adds to a container.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `KEY=VALUE`.
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default)]
    pub mounts: Vec<CdiMount>,
    #[serde(default)]
    pub hooks: Vec<CdiHook>,
}

/// A device node to create in the container.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Its path in the container.
    pub path: String,
    /// Its path on the host (default: `path`); read for the type and numbers not given.
    #[serde(default)]
    pub host_path: Option<String>,
    /// `c` or `b`.
    #[serde(default, rename = "type")]
    pub typ: Option<String>,
    #[serde(default)]
    pub major: Option<i64>,
    #[serde(default)]
    pub minor: Option<i64>,
    #[serde(default)]
    pub file_mode: Option<u32>,
    /// cgroup access (`rwm` by default).
    #[serde(default)]
    pub permissions: Option<String>,
}

/// A bind mount.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CdiMount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default, rename = "type")]
    pub typ: Option<String>,
    #[serde(default)]
    pub options: Vec<String>,
}

/// An OCI hook.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CdiHook {
    /// `prestart`, `createRuntime`, `createContainer`, `startContainer`, `poststart`, `poststop`.
    pub hook_name: String,
    pub path: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub timeout: Option<i64>,
}

/// A problem with the CDI specs or a device they should name.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CdiError {
    #[error("no CDI spec in {dirs} names the device {kind}={name} (run `nvidia-ctk cdi generate --device-name-strategy=uuid --format json` on this host)")]
    Unknown {
        kind: String,
        name: String,
        dirs: String,
    },
    #[error("CDI device node {path}: {reason}")]
    Node { path: String, reason: String },
}

/// Reads every `*.json` spec in `dirs` (missing directories are fine; a file that does not
/// parse is skipped with a warning, as the CDI reference implementation does).
pub fn load(dirs: &[PathBuf]) -> Vec<CdiSpec> {
    let mut specs = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files {
            match f.extension().and_then(|e| e.to_str()) {
                Some("json") => match std::fs::read(&f)
                    .map_err(|e| e.to_string())
                    .and_then(|b| serde_json::from_slice::<CdiSpec>(&b).map_err(|e| e.to_string()))
                {
                    Ok(s) => specs.push(s),
                    Err(e) => tracing::warn!(file = %f.display(), "CDI spec skipped: {e}"),
                },
                Some("yaml" | "yml") => tracing::warn!(
                    file = %f.display(),
                    "CDI spec skipped: only JSON specs are read (nvidia-ctk cdi generate --format json)"
                ),
                _ => {}
            }
        }
    }
    specs
}

/// The edits the devices `kind=NAME` need: each device's, plus its spec's own once.
pub fn edits_for(
    specs: &[CdiSpec],
    kind: &str,
    names: &[String],
    dirs: &[PathBuf],
) -> Result<Vec<ContainerEdits>, CdiError> {
    let mut out = Vec::new();
    let mut specs_used = Vec::new();
    for name in names {
        let found = specs.iter().enumerate().find_map(|(i, s)| {
            (s.kind == kind)
                .then(|| s.devices.iter().find(|d| &d.name == name).map(|d| (i, d)))
                .flatten()
        });
        let Some((i, d)) = found else {
            return Err(CdiError::Unknown {
                kind: kind.into(),
                name: name.clone(),
                dirs: dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        if !specs_used.contains(&i) {
            specs_used.push(i);
            out.push(specs[i].container_edits.clone());
        }
        out.push(d.container_edits.clone());
    }
    Ok(out)
}

/// A device node with its type and numbers (from the host node where the spec leaves them out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedNode {
    pub path: String,
    pub typ: char,
    pub major: i64,
    pub minor: i64,
    pub file_mode: Option<u32>,
    pub permissions: String,
}

/// Fills in a node's type and numbers.
pub fn resolve_node(n: &DeviceNode) -> Result<ResolvedNode, CdiError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let err = |reason: String| CdiError::Node {
        path: n.path.clone(),
        reason,
    };
    let (typ, major, minor) = match (n.typ.as_deref(), n.major, n.minor) {
        (Some(t), Some(ma), Some(mi)) => (t.to_string(), ma, mi),
        _ => {
            let host = n.host_path.as_deref().unwrap_or(&n.path);
            let md = std::fs::metadata(Path::new(host)).map_err(|e| err(format!("{host}: {e}")))?;
            let t = if md.file_type().is_char_device() {
                "c"
            } else if md.file_type().is_block_device() {
                "b"
            } else {
                return Err(err(format!("{host} is not a device node")));
            };
            let rdev = md.rdev();
            (
                t.to_string(),
                i64::from(libc::major(rdev)),
                i64::from(libc::minor(rdev)),
            )
        }
    };
    let typ = match typ.as_str() {
        "c" | "u" => 'c',
        "b" => 'b',
        other => return Err(err(format!("type {other:?} is not c or b"))),
    };
    Ok(ResolvedNode {
        path: n.path.clone(),
        typ,
        major,
        minor,
        file_mode: n.file_mode,
        permissions: n.permissions.clone().unwrap_or_else(|| "rwm".into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = r#"{
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": "GPU-a", "containerEdits": {
                "deviceNodes": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}],
                "env": ["A=1"]}},
            {"name": "GPU-b", "containerEdits": {
                "deviceNodes": [{"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1}]}}
        ],
        "containerEdits": {
            "deviceNodes": [{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}],
            "mounts": [{"hostPath": "/usr/lib/libcuda.so.1", "containerPath": "/usr/lib/libcuda.so.1", "options": ["ro", "bind"]}],
            "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-ctk", "args": ["nvidia-ctk", "hook", "update-ldcache"]}]
        }
    }"#;

    #[test]
    fn devices_are_found_by_kind_and_name_with_their_specs_edits_once() {
        let spec: CdiSpec = serde_json::from_str(SPEC).unwrap();
        let specs = vec![spec];
        let edits = edits_for(&specs, GPU_KIND, &["GPU-a".into(), "GPU-b".into()], &[]).unwrap();
        assert_eq!(edits.len(), 3, "the spec's edits once, then each device's");
        assert_eq!(edits[0].device_nodes[0].path, "/dev/nvidiactl");
        assert_eq!(edits[0].hooks[0].hook_name, "createContainer");
        assert_eq!(edits[1].env, vec!["A=1".to_string()]);
        let n = resolve_node(&edits[2].device_nodes[0]).unwrap();
        assert_eq!((n.typ, n.major, n.minor), ('c', 195, 1));
        let missing = edits_for(&specs, GPU_KIND, &["GPU-z".into()], &["/etc/cdi".into()]);
        assert!(matches!(missing, Err(CdiError::Unknown { ref name, .. }) if name == "GPU-z"));
        assert!(edits_for(&specs, "other.com/x", &["GPU-a".into()], &[]).is_err());
    }

    #[test]
    fn a_node_without_numbers_is_read_from_the_host() {
        let n = resolve_node(&DeviceNode {
            path: "/dev/null".into(),
            host_path: None,
            typ: None,
            major: None,
            minor: None,
            file_mode: None,
            permissions: None,
        })
        .unwrap();
        assert_eq!((n.typ, n.major, n.minor), ('c', 1, 3));
        let not_a_device = DeviceNode {
            path: "/etc/hostname".into(),
            host_path: Some("/etc/passwd".into()),
            typ: None,
            major: None,
            minor: None,
            file_mode: None,
            permissions: None,
        };
        assert!(resolve_node(&not_a_device).is_err());
    }
}
