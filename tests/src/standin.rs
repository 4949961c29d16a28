//! The stand-in NVML library (`gantry-nvml-standin`): GPUs described by a JSON file an agent
//! loads instead of the vendor library, so GPU tests run without GPUs, and errors (XIDs) can be
//! injected; plus the agent-side sandbox helpers the GPU tests read.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::cluster::AgentProc;

/// The stand-in NVML library (`libgantry_nvml_standin.so`, built as a dependency of this crate).
pub fn standin_lib() -> PathBuf {
    gantry_nvml_standin::config::library_path().expect(
        "libgantry_nvml_standin.so not found: run `cargo build --workspace --bins` / cargo test",
    )
}

/// A stand-in NVML configuration file the tests rewrite while the agent runs.
pub struct Standin {
    pub path: PathBuf,
    pub config: gantry_nvml_standin::config::StandinConfig,
}

impl Standin {
    /// Writes a CDI spec (`dir/gantry-standin.json`, kind `nvidia.com/gpu`) naming each
    /// stand-in GPU by UUID, as `nvidia-ctk cdi generate --device-name-strategy=uuid` does for
    /// real GPUs: its `/dev/nvidiaN` node (195:N) and `GANTRY_CDI_GPU_N=UUID`, plus the spec-wide
    /// `nvidiactl` node (195:255) and `GANTRY_CDI=standin`. Returns the directory, for the
    /// agent's `--cdi-dir`.
    pub fn write_cdi(&self, dir: &Path) -> anyhow::Result<PathBuf> {
        let cdi = dir.join("cdi");
        std::fs::create_dir_all(&cdi)?;
        let devices: Vec<serde_json::Value> = self
            .config
            .gpus
            .iter()
            .map(|g| {
                serde_json::json!({
                    "name": g.uuid,
                    "containerEdits": {
                        "deviceNodes": [{
                            "path": format!("/dev/nvidia{}", g.minor),
                            "type": "c", "major": 195, "minor": g.minor,
                        }],
                        "env": [format!("GANTRY_CDI_GPU_{}={}", g.minor, g.uuid)],
                    },
                })
            })
            .collect();
        let spec = serde_json::json!({
            "cdiVersion": "0.5.0",
            "kind": "nvidia.com/gpu",
            "devices": devices,
            "containerEdits": {
                "deviceNodes": [{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}],
                "env": ["GANTRY_CDI=standin"],
            },
        });
        std::fs::write(
            cdi.join("gantry-standin.json"),
            serde_json::to_vec_pretty(&spec)?,
        )?;
        Ok(cdi)
    }

    /// The shipped example (4 GPUs, two models, two NUMA nodes), written to `dir/gpus.toml`.
    /// Sets `GANTRY_NVML_STANDIN_CONFIG` for agents started afterwards by this process: use
    /// one stand-in per test binary (the variable is process-wide).
    pub fn four_gpus(dir: &Path) -> anyhow::Result<Self> {
        use gantry_nvml_standin::config;
        let example =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("nvml-standin/examples/four-gpus.toml");
        let cfg = config::StandinConfig::load(&example)
            .map_err(|e| anyhow::anyhow!("loading {}: {e:?}", example.display()))?;
        let s = Self {
            path: dir.join("gpus.toml"),
            config: cfg,
        };
        s.write()?;
        std::env::set_var(config::CONFIG_ENV, &s.path);
        Ok(s)
    }

    /// `config`, written to `dir/gpus.toml`; sets `GANTRY_NVML_STANDIN_CONFIG` like
    /// [`Standin::four_gpus`].
    pub fn with_config(
        dir: &Path,
        config: gantry_nvml_standin::config::StandinConfig,
    ) -> anyhow::Result<Self> {
        let s = Self {
            path: dir.join("gpus.toml"),
            config,
        };
        s.write()?;
        std::env::set_var(gantry_nvml_standin::config::CONFIG_ENV, &s.path);
        Ok(s)
    }

    /// `count` stand-in GPUs for one agent, written to `dir/gpus-TAG.toml`: the first half
    /// `NVIDIA A100-SXM4-40GB` on NUMA node 0, the second half `NVIDIA H100 80GB HBM3` on NUMA
    /// node 1, with UUIDs unique to `tag`. Sets `GANTRY_NVML_STANDIN_CONFIG` for agents started
    /// afterwards by this process: start each agent right after its own call.
    pub fn gpus_for(dir: &Path, tag: u32, count: u32) -> anyhow::Result<Self> {
        use gantry_nvml_standin::config;
        let example =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("nvml-standin/examples/four-gpus.toml");
        let mut cfg = config::StandinConfig::load(&example)
            .map_err(|e| anyhow::anyhow!("loading {}: {e:?}", example.display()))?;
        let a100 = cfg.gpus[0].clone();
        let h100 = cfg.gpus[2].clone();
        cfg.gpus = (0..count)
            .map(|i| {
                let mut g = if i < count / 2 {
                    a100.clone()
                } else {
                    h100.clone()
                };
                g.uuid = format!("GPU-{tag:08x}-0000-4000-8000-{i:012x}");
                g.minor = i;
                g.pci_bus_id = format!("00000000:{:02X}:00.0", 0x07 + 4 * i);
                g.numa_node = Some(u32::from(i >= count / 2));
                g
            })
            .collect();
        let s = Self {
            path: dir.join(format!("gpus-{tag}.toml")),
            config: cfg,
        };
        s.write()?;
        std::env::set_var(config::CONFIG_ENV, &s.path);
        Ok(s)
    }

    /// Writes the current configuration atomically (the library re-reads it on every call).
    pub fn write(&self) -> anyhow::Result<()> {
        gantry_nvml_standin::config::write_atomic(&self.path, &self.config)
            .with_context(|| format!("writing {}", self.path.display()))
    }

    /// Appends an XID event for GPU `gpu` (NVML index) and writes the file.
    pub fn inject_xid(&mut self, gpu: u32, xid: u64) -> anyhow::Result<()> {
        use gantry_nvml_standin::config::{EventKind, EventSpec};
        let id = self.config.events.len() as u64 + 1;
        self.config.events.push(EventSpec {
            id: Some(id),
            gpu,
            kind: EventKind::Xid,
            xid,
        });
        self.write()
    }
}

impl AgentProc {
    /// A file in a task's sandbox.
    pub fn sandbox_file(&self, task: gantry_sdk::protocol::TaskId, name: &str) -> PathBuf {
        self.work_dir
            .join("sandboxes")
            .join(task.to_string())
            .join(name)
    }

    /// A task's meta directory (root-owned; its launch record).
    pub fn meta_dir(&self, task: gantry_sdk::protocol::TaskId) -> PathBuf {
        self.work_dir.join("meta").join(task.to_string())
    }

    /// What a task's launch record says (`None`: no supervisor or agent claimed it yet).
    pub fn launch_record(
        &self,
        task: gantry_sdk::protocol::TaskId,
    ) -> Option<gantry_agent::executor::record::Record> {
        gantry_agent::executor::record::read(&self.meta_dir(task))
    }

    /// Waits until a task's supervisor has recorded the task's pid (its process group).
    pub fn wait_task_pid(
        &self,
        task: gantry_sdk::protocol::TaskId,
        timeout: Duration,
    ) -> anyhow::Result<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(pid) = self.launch_record(task).and_then(|r| r.task_pgid) {
                return Ok(pid);
            }
            if Instant::now() > deadline {
                bail!("task {task} recorded no pid within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until a task's sandbox file exists and is non-empty; returns its contents.
    pub fn wait_sandbox_file(
        &self,
        task: gantry_sdk::protocol::TaskId,
        name: &str,
        timeout: Duration,
    ) -> anyhow::Result<String> {
        wait_file(&self.sandbox_file(task, name), timeout)
    }
}

/// Waits until `path` exists and is non-empty; returns its contents.
fn wait_file(path: &Path, timeout: Duration) -> anyhow::Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if !text.is_empty() {
                return Ok(text);
            }
        }
        if Instant::now() > deadline {
            bail!("{} did not appear within {timeout:?}", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
