//! Providers: who creates and deletes a pool's nodes (docs/autoscaling.md, "Providers").
//!
//! - [`ExecProvider`]: the exec-plugin contract, in the spirit of Slurm's power-saving
//!   programs: the autoscaler runs the plugin once per request with one JSON object on stdin
//!   and reads one JSON object from stdout (exit status 0; otherwise its stderr is the error):
//!
//!   | request (stdin)                                        | answer (stdout)                  |
//!   |--------------------------------------------------------|----------------------------------|
//!   | `{"op":"create","pool":P,"count":N,"shape":{…}}`       | `{"nodes":["id",…]}` (N ids)     |
//!   | `{"op":"delete","node":"id"}`                          | `{}`                             |
//!   | `{"op":"list"}`                                        | `{"nodes":[{"id":…,"pool":…}]}`  |
//!
//!   `shape` is the pool's agent: `cpus`, `mem`, `disk`, `gpus`, `gpu_model`, `spot`,
//!   `resources` and `attributes` (the `gantry-agent --resources/--attributes` values). Each
//!   node's agent must register with `--name <its id>`: the autoscaler matches nodes to agents
//!   by name. Answers are bounded ([`MAX_ANSWER`]) and requests time out (the pool's
//!   `timeout`). `autoscaler/examples/provider.sh` is a commented example.
//! - [`LocalProvider`]: real `gantry-agent` processes on this host, children of the
//!   autoscaler (they get SIGTERM if it dies); GPU pools get stand-in GPUs (the
//!   `gantry-nvml-standin` library and a generated GPU file per node). For demos and tests.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::PoolSpec;

/// Most bytes of a plugin's answer (and of its stderr kept for errors).
pub const MAX_ANSWER: usize = 1 << 20;

/// A provider request that failed.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The plugin could not be run.
    #[error("running {program}: {source}")]
    Spawn {
        /// The plugin.
        program: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The plugin took longer than its timeout (it was killed).
    #[error("{program} did not answer within {timeout:?}")]
    Timeout {
        /// The plugin.
        program: PathBuf,
        /// The timeout.
        timeout: Duration,
    },
    /// The plugin exited with an error.
    #[error("{program} failed ({status}): {stderr}")]
    Failed {
        /// The plugin.
        program: PathBuf,
        /// Its exit status.
        status: String,
        /// Its stderr (bounded).
        stderr: String,
    },
    /// The answer was not what the contract says.
    #[error("{program}: bad answer: {message}")]
    BadAnswer {
        /// The plugin.
        program: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The local provider could not start or stop an agent.
    #[error("local provider: {0}")]
    Local(String),
}

/// A node a provider lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedNode {
    /// The node id (its agent's name).
    pub id: String,
    /// Its pool.
    pub pool: String,
}

/// Creates, deletes and lists nodes.
pub trait Provider {
    /// Creates `count` nodes of `pool`; their ids.
    fn create(&mut self, pool: &PoolSpec, count: u32) -> Result<Vec<String>, ProviderError>;
    /// Deletes a node.
    fn delete(&mut self, node: &str) -> Result<(), ProviderError>;
    /// The nodes that exist.
    fn list(&mut self) -> Result<Vec<ListedNode>, ProviderError>;
}

/// The `shape` of a create request.
fn shape(pool: &PoolSpec) -> serde_json::Value {
    serde_json::json!({
        "cpus": pool.cpus,
        "mem": pool.mem,
        "disk": pool.disk,
        "gpus": pool.gpus,
        "gpu_model": pool.gpu_model,
        "spot": pool.spot,
        "price_per_hour": pool.price_per_hour,
        "resources": pool.agent_resources(),
        "attributes": pool.agent_attributes(),
    })
}

/// An exec plugin (see the module docs).
#[derive(Debug, Clone)]
pub struct ExecProvider {
    /// The program.
    pub program: PathBuf,
    /// How long one request may take.
    pub timeout: Duration,
}

#[derive(Deserialize)]
struct CreateAnswer {
    nodes: Vec<String>,
}

#[derive(Deserialize)]
struct ListAnswer {
    nodes: Vec<ListedNode>,
}

fn read_bounded(mut r: impl Read) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = r.by_ref().take(MAX_ANSWER as u64 + 1).read_to_end(&mut out);
    // Drain the rest so the plugin is not blocked on a full pipe.
    let _ = std::io::copy(&mut r, &mut std::io::sink());
    out
}

impl ExecProvider {
    /// Runs one request; the answer's JSON.
    pub fn call(&self, request: &serde_json::Value) -> Result<serde_json::Value, ProviderError> {
        let program = self.program.clone();
        let mut child = Command::new(&self.program)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| ProviderError::Spawn {
                program: program.clone(),
                source,
            })?;
        let input = request.to_string();
        let stdin = child.stdin.take();
        let writer = std::thread::spawn(move || {
            if let Some(mut s) = stdin {
                let _ = s.write_all(input.as_bytes());
            }
        });
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let out = std::thread::spawn(move || stdout.map(read_bounded).unwrap_or_default());
        let err = std::thread::spawn(move || stderr.map(read_bounded).unwrap_or_default());
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(ProviderError::Timeout {
                        program,
                        timeout: self.timeout,
                    });
                }
            }
        };
        let _ = writer.join();
        let out = out.join().unwrap_or_default();
        let err = err.join().unwrap_or_default();
        if !status.success() {
            return Err(ProviderError::Failed {
                program,
                status: status.to_string(),
                stderr: String::from_utf8_lossy(&err).trim().to_string(),
            });
        }
        if out.len() > MAX_ANSWER {
            return Err(ProviderError::BadAnswer {
                program,
                message: format!("more than {MAX_ANSWER} bytes"),
            });
        }
        serde_json::from_slice(&out).map_err(|e| ProviderError::BadAnswer {
            program,
            message: e.to_string(),
        })
    }

    fn bad(&self, message: String) -> ProviderError {
        ProviderError::BadAnswer {
            program: self.program.clone(),
            message,
        }
    }
}

impl Provider for ExecProvider {
    fn create(&mut self, pool: &PoolSpec, count: u32) -> Result<Vec<String>, ProviderError> {
        let v = self.call(&serde_json::json!({
            "op": "create", "pool": pool.name, "count": count, "shape": shape(pool),
        }))?;
        let a: CreateAnswer = serde_json::from_value(v).map_err(|e| self.bad(e.to_string()))?;
        if a.nodes.len() > count as usize {
            return Err(self.bad(format!("{} nodes for {count} asked", a.nodes.len())));
        }
        if let Some(id) = a.nodes.iter().find(|id| !valid_id(id)) {
            return Err(self.bad(format!("node id {id:?} is not 1-128 of [A-Za-z0-9._-]")));
        }
        Ok(a.nodes)
    }

    fn delete(&mut self, node: &str) -> Result<(), ProviderError> {
        self.call(&serde_json::json!({"op": "delete", "node": node}))
            .map(drop)
    }

    fn list(&mut self) -> Result<Vec<ListedNode>, ProviderError> {
        let v = self.call(&serde_json::json!({"op": "list"}))?;
        let a: ListAnswer = serde_json::from_value(v).map_err(|e| self.bad(e.to_string()))?;
        Ok(a.nodes.into_iter().filter(|n| valid_id(&n.id)).collect())
    }
}

/// A node id a provider may hand out (it becomes an agent name and a path component).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Where the local provider's agents go.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// The `gantry-agent` binary.
    pub agent_bin: PathBuf,
    /// The masters' QUIC addresses (`--master`).
    pub master: String,
    /// The cluster's TLS directory (`--tls-dir`).
    pub tls_dir: PathBuf,
    /// Each node's work directory is `work_dir/<id>`, its log `work_dir/<id>.log`.
    pub work_dir: PathBuf,
    /// The stand-in NVML library, for GPU pools.
    pub nvml_lib: Option<PathBuf>,
    /// More `gantry-agent` flags for every node (`{node}` is replaced by the node id).
    pub agent_args: Vec<String>,
}

/// Real `gantry-agent` processes on this host (see the module docs).
pub struct LocalProvider {
    config: LocalConfig,
    agents: BTreeMap<String, (String, Child)>,
    next: u64,
}

impl LocalProvider {
    /// A provider with no nodes yet.
    pub fn new(config: LocalConfig) -> LocalProvider {
        LocalProvider {
            config,
            agents: BTreeMap::new(),
            next: 0,
        }
    }

    /// The stand-in GPU file of node `id`: `count` GPUs of `model`, UUIDs unique to the node
    /// (a hash of its id: node ids are unique, across pools too).
    fn gpu_file(id: &str, model: &str, count: u32) -> String {
        // FNV-1a, 32 bits.
        let tag = id.bytes().fold(0x811c_9dc5_u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        });
        let mut s = String::from("driver_version = \"550.54.15\"\ncuda_version = 12040\n");
        for i in 0..count {
            s.push_str(&format!(
                "\n[[gpus]]\nuuid = \"GPU-{tag:08x}-0000-4000-8000-{i:012x}\"\nname = {model:?}\n\
                 memory_mib = 40960\nminor = {i}\npci_bus_id = \"00000000:{:02X}:00.0\"\n\
                 numa_node = {}\n",
                (0x07 + 4 * i) % 256,
                u32::from(i >= count / 2 && count > 1),
            ));
        }
        s
    }

    fn start(&mut self, pool: &PoolSpec) -> Result<String, ProviderError> {
        let local = |e: std::io::Error| ProviderError::Local(e.to_string());
        let id = loop {
            self.next += 1;
            let id = format!("{}-{}", pool.name, self.next);
            if !self.config.work_dir.join(&id).exists() {
                break id;
            }
        };
        let dir = self.config.work_dir.join(&id);
        std::fs::create_dir_all(&dir).map_err(local)?;
        let mut cmd = Command::new(&self.config.agent_bin);
        cmd.arg("--master")
            .arg(&self.config.master)
            .arg("--work-dir")
            .arg(dir.join("agent"))
            .arg("--tls-dir")
            .arg(&self.config.tls_dir)
            .arg("--name")
            .arg(&id)
            .arg("--resources")
            .arg(pool.agent_resources())
            .arg("--attributes")
            .arg(pool.agent_attributes());
        if pool.gpus > 0 {
            let lib = self.config.nvml_lib.as_ref().ok_or_else(|| {
                ProviderError::Local(format!(
                    "pool {:?} has GPUs: the local provider needs the stand-in NVML library \
                     (--local-nvml-lib)",
                    pool.name
                ))
            })?;
            let file = dir.join("gpus.toml");
            let model = pool.gpu_model.as_deref().unwrap_or("GPU");
            std::fs::write(&file, Self::gpu_file(&id, model, pool.gpus)).map_err(local)?;
            cmd.arg("--nvml-lib")
                .arg(lib)
                .env("GANTRY_NVML_STANDIN_CONFIG", &file);
        } else {
            cmd.env_remove("GANTRY_NVML_STANDIN_CONFIG");
        }
        cmd.args(
            self.config
                .agent_args
                .iter()
                .map(|a| a.replace("{node}", &id)),
        );
        let log =
            std::fs::File::create(self.config.work_dir.join(format!("{id}.log"))).map_err(local)?;
        let err = log.try_clone().map_err(local)?;
        cmd.stdin(Stdio::null()).stdout(log).stderr(err);
        // SAFETY: prctl(2) only, between fork and exec: the agent gets SIGTERM when the
        // autoscaler's thread that started it ends, so local nodes never outlive it.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| ProviderError::Local(format!("starting gantry-agent: {e}")))?;
        self.agents.insert(id.clone(), (pool.name.clone(), child));
        Ok(id)
    }
}

impl Provider for LocalProvider {
    fn create(&mut self, pool: &PoolSpec, count: u32) -> Result<Vec<String>, ProviderError> {
        let mut ids = Vec::new();
        for _ in 0..count {
            match self.start(pool) {
                Ok(id) => ids.push(id),
                Err(e) if ids.is_empty() => return Err(e),
                Err(e) => {
                    tracing::warn!(pool = %pool.name, error = %e, "created fewer nodes than asked");
                    break;
                }
            }
        }
        Ok(ids)
    }

    fn delete(&mut self, node: &str) -> Result<(), ProviderError> {
        let Some((_, mut child)) = self.agents.remove(node) else {
            return Ok(()); // already gone
        };
        let pid = child.id() as i32;
        // SAFETY: kill(2) on our own child, still unreaped (so the pid is not reused).
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        remove_cgroups(&format!("gantry/{node}"));
        let _ = std::fs::remove_dir_all(self.config.work_dir.join(node));
        Ok(())
    }

    fn list(&mut self) -> Result<Vec<ListedNode>, ProviderError> {
        let mut out = Vec::new();
        for (id, (pool, child)) in &mut self.agents {
            if matches!(child.try_wait(), Ok(None)) {
                out.push(ListedNode {
                    id: id.clone(),
                    pool: pool.clone(),
                });
            }
        }
        Ok(out)
    }
}

impl Drop for LocalProvider {
    fn drop(&mut self) {
        let nodes: Vec<String> = self.agents.keys().cloned().collect();
        for n in nodes {
            let _ = self.delete(&n);
        }
    }
}

/// Kills what is left in the cgroup `name` (task processes: an agent stopped with SIGTERM
/// leaves its tasks running) and removes it and the cgroups under it, in every hierarchy.
/// Best effort.
fn remove_cgroups(name: &str) {
    let mount = Path::new("/sys/fs/cgroup");
    let mut roots = vec![mount.join(name)];
    if let Ok(rd) = std::fs::read_dir(mount) {
        roots.extend(rd.flatten().map(|e| e.path().join(name)));
    }
    for root in &roots {
        kill_tree(root);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for root in &roots {
        while root.is_dir() && Instant::now() < deadline {
            remove_tree(root);
            if root.is_dir() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn kill_tree(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            kill_tree(&e.path());
        }
    }
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        if pid > 1 {
            // SAFETY: kill(2) on a process inside a node's own cgroup; no memory involved.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

fn remove_tree(dir: &Path) {
    if !dir.is_dir() {
        return;
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn plugin(dir: &Path, body: &str) -> ExecProvider {
        let path = dir.join("plugin.sh");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        ExecProvider {
            program: path,
            timeout: Duration::from_secs(5),
        }
    }

    fn pool() -> PoolSpec {
        crate::config::Config::parse(
            "[[pool]]\nname = \"p\"\ncpus = 2\nmem = 1024\nprice_per_hour = 1\nmax = 4\n\
             provider = { kind = \"local\" }\n",
        )
        .unwrap()
        .pools
        .remove(0)
    }

    #[test]
    fn the_shipped_example_plugin_follows_the_contract() {
        let dir = tempfile::tempdir().unwrap();
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/provider.sh");
        let mut p = ExecProvider {
            program: example,
            timeout: Duration::from_secs(10),
        };
        std::env::set_var("GANTRY_EXAMPLE_PROVIDER_STATE", dir.path());
        let ids = p.create(&pool(), 2).unwrap();
        assert_eq!(ids, ["p-1", "p-2"]);
        assert_eq!(p.list().unwrap().len(), 2);
        p.delete("p-1").unwrap();
        assert_eq!(
            p.list().unwrap(),
            [ListedNode {
                id: "p-2".into(),
                pool: "p".into()
            }]
        );
    }

    #[test]
    fn bad_plugins_get_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = plugin(dir.path(), "echo 'no quota' >&2; exit 3");
        let e = p.create(&pool(), 1).unwrap_err().to_string();
        assert!(
            e.contains("no quota") && e.contains("exit status: 3"),
            "{e}"
        );
        let mut p = plugin(dir.path(), "echo '{\"nodes\":[\"a\",\"b\"]}'");
        let e = p.create(&pool(), 1).unwrap_err().to_string();
        assert!(e.contains("2 nodes for 1 asked"), "{e}");
        let mut p = plugin(dir.path(), "echo '{\"nodes\":[\"../etc\"]}'");
        assert!(p
            .create(&pool(), 1)
            .unwrap_err()
            .to_string()
            .contains("not 1-128"));
        let mut p = plugin(dir.path(), "echo 'nodes: a'");
        assert!(matches!(
            p.list().unwrap_err(),
            ProviderError::BadAnswer { .. }
        ));
        let mut p = plugin(dir.path(), "sleep 30");
        p.timeout = Duration::from_millis(200);
        assert!(matches!(
            p.delete("x").unwrap_err(),
            ProviderError::Timeout { .. }
        ));
        // The request reaches stdin whole.
        let mut p = plugin(
            dir.path(),
            "cat > \"$(dirname \"$0\")/req.json\"; echo '{}'",
        );
        p.delete("n-1").unwrap();
        let req: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("req.json")).unwrap()).unwrap();
        assert_eq!(req, serde_json::json!({"op": "delete", "node": "n-1"}));
    }
}
