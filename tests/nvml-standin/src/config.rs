//! The stand-in's configuration file: simulated GPUs, their running processes and the events
//! (XID errors, double-bit ECC errors) to inject.
//!
//! The file is JSON when its name ends in `.json`, TOML otherwise. It is re-read on every NVML
//! call, so tests change it at run time; write it atomically (see [`write_atomic`]) so a reader
//! never sees half a file (a file that fails to parse keeps the last good contents in force).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Environment variable naming the configuration file.
pub const CONFIG_ENV: &str = "GANTRY_NVML_STANDIN_CONFIG";

/// The whole simulated machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StandinConfig {
    /// Reported by `nvmlSystemGetDriverVersion`.
    #[serde(default = "default_driver")]
    pub driver_version: String,
    /// CUDA driver version as NVML encodes it (`12040` is 12.4).
    #[serde(default = "default_cuda")]
    pub cuda_version: i32,
    /// The GPUs, in NVML index order.
    #[serde(default)]
    pub gpus: Vec<GpuSpec>,
    /// Events to deliver, each once to every event set that registered for its GPU and kind.
    #[serde(default)]
    pub events: Vec<EventSpec>,
    /// `true` (default): an event set also gets the events already listed when it was created
    /// (so a test may list XIDs before the agent starts). `false`: like real NVML, only events
    /// added after the set was created (so a restarted agent does not see old XIDs again).
    #[serde(default = "default_replay")]
    pub replay_events: bool,
}

fn default_replay() -> bool {
    true
}

fn default_driver() -> String {
    "550.54.15".to_string()
}

fn default_cuda() -> i32 {
    12040
}

/// One simulated GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    pub uuid: String,
    pub name: String,
    pub memory_mib: u64,
    /// `/dev/nvidiaN`.
    pub minor: u32,
    /// NVML form, e.g. `00000000:3B:00.0`.
    pub pci_bus_id: String,
    /// Reported through `nvmlDeviceGetMemoryAffinity` / `nvmlDeviceGetNumaNodeId`; `None` makes
    /// those calls answer NOT_SUPPORTED (the agent then falls back to sysfs).
    #[serde(default)]
    pub numa_node: Option<u32>,
    #[serde(default = "default_cc")]
    pub compute_capability: (i32, i32),
    #[serde(default)]
    pub utilization_gpu: u32,
    #[serde(default)]
    pub utilization_memory: u32,
    #[serde(default = "default_temp")]
    pub temperature_c: u32,
    #[serde(default)]
    pub power_mw: u32,
    /// Memory in use; when `None` it is the sum of the processes' memory.
    #[serde(default)]
    pub memory_used_mib: Option<u64>,
    #[serde(default)]
    pub processes: Vec<ProcessSpec>,
    /// MIG devices: when not empty the GPU is in MIG mode (`nvmlDeviceGetMigMode` reports it
    /// enabled) and these are its MIG devices, in MIG index order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_devices: Vec<MigSpec>,
}

/// One MIG device (a GPU instance with its compute instance) of a GPU in MIG mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigSpec {
    /// `MIG-...`.
    pub uuid: String,
    /// The profile, e.g. `1g.10gb`; the device's name is the GPU's name plus ` MIG <profile>`,
    /// as real NVML reports it.
    pub profile: String,
    pub memory_mib: u64,
}

/// Most MIG devices one GPU has (an A100/H100 has at most 7).
pub const MAX_MIG_DEVICES: usize = 7;

fn default_cc() -> (i32, i32) {
    (8, 0)
}

fn default_temp() -> u32 {
    40
}

/// A compute process running on a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessSpec {
    pub pid: u32,
    pub used_memory_mib: u64,
}

/// Kinds of injectable events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// `nvmlEventTypeXidCriticalError` with `xid` as event data.
    Xid,
    /// `nvmlEventTypeDoubleBitEccError`.
    DoubleBitEcc,
    /// `nvmlEventTypeSingleBitEccError`.
    SingleBitEcc,
}

/// One event to inject.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSpec {
    /// Identifies the event so it is delivered once per event set; defaults to its position.
    #[serde(default)]
    pub id: Option<u64>,
    /// Index of the GPU (NVML order).
    pub gpu: u32,
    pub kind: EventKind,
    /// The XID number for `kind = "xid"` (999 means unknown, as in NVML).
    #[serde(default)]
    pub xid: u64,
}

impl EventSpec {
    /// The key used to deliver this event once per event set.
    pub fn key(&self, position: usize) -> u64 {
        self.id.unwrap_or(position as u64 | (1 << 63))
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug)]
pub enum ConfigError {
    Io(PathBuf, std::io::Error),
    Parse(PathBuf, String),
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Io(p, e) => write!(f, "cannot read {}: {e}", p.display()),
            ConfigError::Parse(p, e) => write!(f, "cannot parse {}: {e}", p.display()),
        }
    }
}

impl std::error::Error for ConfigError {}

impl StandinConfig {
    /// Parses a configuration; JSON if `path` ends in `.json`, TOML otherwise.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let is_json = path.extension().is_some_and(|e| e == "json");
        if is_json {
            serde_json::from_str(text)
                .map_err(|e| ConfigError::Parse(path.to_path_buf(), e.to_string()))
        } else {
            toml::from_str(text).map_err(|e| ConfigError::Parse(path.to_path_buf(), e.to_string()))
        }
    }

    /// Reads and parses a configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| ConfigError::Io(path.to_path_buf(), e))?;
        Self::parse(path, &text)
    }

    /// Renders this configuration (JSON if `path` ends in `.json`, TOML otherwise).
    pub fn render(&self, path: &Path) -> String {
        if path.extension().is_some_and(|e| e == "json") {
            serde_json::to_string_pretty(self).unwrap_or_default()
        } else {
            toml::to_string(self).unwrap_or_default()
        }
    }
}

/// Writes `config` to `path` atomically (temporary file + rename), so the library never reads a
/// partial file.
pub fn write_atomic(path: &Path, config: &StandinConfig) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(config.render(path).as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

/// Where `cargo build -p gantry-nvml-standin` puts the library, found from the running test
/// binary (`target/<profile>/deps/...` or `target/<profile>/...`) or `CARGO_TARGET_DIR`.
pub fn library_path() -> Option<PathBuf> {
    const NAME: &str = "libgantry_nvml_standin.so";
    let mut candidates = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        let mut dir = exe.parent().map(Path::to_path_buf);
        while let Some(d) = dir {
            candidates.push(d.join(NAME));
            if d.file_name().is_some_and(|n| n == "target") {
                candidates.push(d.join("debug").join(NAME));
                break;
            }
            dir = d.parent().map(Path::to_path_buf);
        }
    }
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        candidates.push(PathBuf::from(t).join("debug").join(NAME));
    }
    candidates.push(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/debug")
            .join(NAME),
    );
    candidates.into_iter().find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_example_parses() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/four-gpus.toml");
        let c = StandinConfig::load(&p).unwrap();
        assert_eq!(c.gpus.len(), 4);
        let nodes: Vec<Option<u32>> = c.gpus.iter().map(|g| g.numa_node).collect();
        assert_eq!(nodes, vec![Some(0), Some(0), Some(1), Some(1)]);
        assert!(c.events.is_empty());
    }

    #[test]
    fn atomic_write_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        let c = StandinConfig {
            driver_version: "1".into(),
            cuda_version: 12000,
            gpus: vec![],
            events: vec![],
            replay_events: true,
        };
        write_atomic(&p, &c).unwrap();
        assert_eq!(StandinConfig::load(&p).unwrap(), c);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
