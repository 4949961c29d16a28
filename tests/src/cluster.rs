//! Clusters: [`MasterProc`] and [`AgentProc`] (real `gantry-master` / `gantry-agent` processes on
//! free loopback ports), [`Cluster`] (a master and agents sharing a TLS directory), and the
//! operator HTTPS endpoints tests read `/state` from.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::cgroups::CgroupRoot;
use crate::processes::{bin, free_tcp, free_udp, Proc, TempDir};

/// A running `gantry-master`.
pub struct MasterProc {
    pub proc: Proc,
    pub quic: SocketAddr,
    pub http: SocketAddr,
    pub work_dir: PathBuf,
    pub log: PathBuf,
    tls_dir: PathBuf,
    extra: Vec<String>,
}

impl MasterProc {
    /// Starts a master with `--tls-dir tls_dir` and waits until `/health` answers.
    pub fn start(dir: &Path, tls_dir: &Path, extra: &[&str]) -> anyhow::Result<Self> {
        let quic = free_udp();
        let http = free_tcp();
        let work_dir = dir.join(format!("master-{}", quic.port()));
        let log = dir.join(format!("master-{}.log", quic.port()));
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let proc = Self::spawn(quic, http, &work_dir, tls_dir, &extra, &log)?;
        let m = Self {
            proc,
            quic,
            http,
            work_dir,
            log,
            tls_dir: tls_dir.to_path_buf(),
            extra,
        };
        m.wait_up()?;
        Ok(m)
    }

    /// `kill -9` and start again on the same addresses and work dir (its log is appended to
    /// `<log>.1`); waits until `/health` answers.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.proc.kill9();
        let log = self.log.with_extension("log.1");
        self.proc = Self::spawn(
            self.quic,
            self.http,
            &self.work_dir,
            &self.tls_dir,
            &self.extra,
            &log,
        )?;
        self.log = log;
        self.wait_up()
    }

    fn spawn(
        quic: SocketAddr,
        http: SocketAddr,
        work_dir: &Path,
        tls_dir: &Path,
        extra: &[String],
        log: &Path,
    ) -> anyhow::Result<Proc> {
        let mut cmd = Command::new(bin("gantry-master")?);
        cmd.arg("--listen")
            .arg(quic.to_string())
            .arg("--http")
            .arg(http.to_string());
        cmd.arg("--work-dir")
            .arg(work_dir)
            .arg("--tls-dir")
            .arg(tls_dir);
        cmd.args(extra);
        register_http(http, tls_dir, extra.iter().any(|a| a == "--http-insecure"));
        Proc::spawn("gantry-master", cmd, log)
    }

    /// Runs `gantryctl ARGS` against this master (HTTPS, dev operator certificate `admin`).
    pub fn gantryctl(&self, args: &[&str]) -> anyhow::Result<std::process::Output> {
        Ok(Command::new(bin("gantryctl")?)
            .args(args)
            .arg("--master")
            .arg(format!("https://{}", self.http))
            .arg("--tls-dir")
            .arg(&self.tls_dir)
            .output()?)
    }

    /// The master's TLS directory.
    pub fn tls_dir(&self) -> &Path {
        &self.tls_dir
    }

    fn wait_up(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while http_get(self.http, "/health").is_err() {
            if Instant::now() > deadline {
                bail!(
                    "master did not come up; log:\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// `GET /state` as JSON.
    pub fn state(&self) -> anyhow::Result<serde_json::Value> {
        let body = http_get(self.http, "/state")?;
        serde_json::from_str(&body).context("parsing /state")
    }

    /// Polls `/state` until `pred` holds or `timeout` passes.
    pub fn wait_state(
        &self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> anyhow::Result<serde_json::Value> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(s) = self.state() {
                if pred(&s) {
                    return Ok(s);
                }
                if Instant::now() > deadline {
                    bail!("timed out waiting for {what}; last /state: {s:#}");
                }
            } else if Instant::now() > deadline {
                bail!("timed out waiting for {what}; /state unreachable");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A running `gantry-agent`.
pub struct AgentProc {
    pub proc: Proc,
    pub name: String,
    pub work_dir: PathBuf,
    pub log: PathBuf,
    args: Vec<String>,
}

impl AgentProc {
    /// Starts an agent that knows several masters (`a,b,c`) and follows the leader.
    pub fn start_multi(
        dir: &Path,
        tls_dir: &Path,
        masters: &str,
        name: &str,
        resources: &str,
    ) -> anyhow::Result<Self> {
        Self::start_any(dir, tls_dir, masters, name, resources, &[])
    }

    /// [`AgentProc::start_multi`] with extra agent flags.
    pub fn start_multi_with(
        dir: &Path,
        tls_dir: &Path,
        masters: &str,
        name: &str,
        resources: &str,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_any(dir, tls_dir, masters, name, resources, extra)
    }

    /// Starts an agent named `name` advertising `resources`.
    pub fn start(
        dir: &Path,
        tls_dir: &Path,
        master: SocketAddr,
        name: &str,
        resources: &str,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_any(dir, tls_dir, &master.to_string(), name, resources, extra)
    }

    fn start_any(
        dir: &Path,
        tls_dir: &Path,
        master: &str,
        name: &str,
        resources: &str,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let work_dir = dir.join(format!("agent-{name}"));
        let log = dir.join(format!("agent-{name}.log"));
        let mut args: Vec<String> = vec![
            "--master".into(),
            master.to_string(),
            "--work-dir".into(),
            work_dir.display().to_string(),
            "--tls-dir".into(),
            tls_dir.display().to_string(),
            "--name".into(),
            name.into(),
            "--resources".into(),
            resources.into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        // Sandbox collection shortens its delay as the disk fills (Mesos's
        // `delay × max(0, 1 − headroom − used)`: to zero at 90 % by default, and still to 216 s
        // of the hour at 94 % with no headroom); on a nearly full CI disk that collected all but
        // the newest `--gc-keep` sandboxes of tests that count them. Tests ignore the disk unless
        // they set the headroom themselves, and keep every sandbox unless they set a gc flag.
        if !extra.contains(&"--gc-disk-headroom") {
            args.extend(["--gc-disk-headroom".into(), "0".into()]);
        }
        if !["--gc-disk-headroom", "--gc-delay", "--gc-keep"]
            .iter()
            .any(|f| extra.contains(f))
        {
            args.extend(["--gc-keep".into(), "1000000".into()]);
        }
        let proc = Self::spawn_with(&args, &log, name)?;
        Ok(Self {
            proc,
            name: name.to_string(),
            work_dir,
            log,
            args,
        })
    }

    fn spawn_with(args: &[String], log: &Path, name: &str) -> anyhow::Result<Proc> {
        let mut cmd = Command::new(bin("gantry-agent")?);
        cmd.args(args);
        // Append: a restarted agent keeps its earlier log.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let err = file.try_clone()?;
        cmd.stdin(Stdio::null()).stdout(file).stderr(err);
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        let child = cmd.spawn().context("spawning gantry-agent")?;
        Ok(Proc {
            child,
            name: format!("agent {name}"),
        })
    }

    /// `kill -9` the agent process only (its tasks keep running).
    pub fn kill9(&mut self) {
        self.proc.kill9();
    }

    /// Stops the agent cleanly (SIGTERM; its tasks keep running); whether it exited in time.
    pub fn terminate(&mut self, timeout: std::time::Duration) -> bool {
        self.proc.terminate(timeout)
    }

    /// Starts the agent again with the same arguments and work dir.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.proc.kill9();
        self.proc = Self::spawn_with(&self.args, &self.log, &self.name)?;
        Ok(())
    }

    /// Kills every task process group and supervisor this agent started (cleanup).
    pub fn kill_tasks(&self) {
        let Ok(entries) = std::fs::read_dir(self.work_dir.join("meta")) else {
            return;
        };
        for e in entries.flatten() {
            // A recorded process group is never 0 or 1.
            if let Some(pid) = gantry_agent::executor::read_task_pgid(&e.path()) {
                // SAFETY: kill(2) on a process group this agent created; no memory involved.
                unsafe {
                    libc::kill(-pid, libc::SIGKILL);
                }
            }
        }
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        self.proc.kill9();
        self.kill_tasks();
        // Container tasks' root filesystems (overlay mounts) a killed agent did not clean up.
        unmount_below(&self.work_dir);
        // An agent with the default cgroup root (`gantry/NAME`) leaves it behind when killed:
        // remove it (and any task cgroup in it). Tests with their own root use `CgroupRoot`.
        if !self.args.iter().any(|a| a == "--cgroup-root") {
            drop(CgroupRoot {
                name: format!("gantry/{}", self.name),
            });
        }
    }
}

/// How the harness reaches a master's operator API: `https` with the dev operator certificate
/// from the master's TLS directory, or plain `http` (`--http-insecure`); and the client, once
/// made (kept for keep-alive connections).
#[derive(Clone)]
struct HttpEndpoint {
    tls_dir: PathBuf,
    insecure: bool,
    client: Option<gantry_master::client::BlockingClient>,
}

fn endpoints() -> &'static std::sync::Mutex<std::collections::HashMap<SocketAddr, HttpEndpoint>> {
    static ENDPOINTS: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<SocketAddr, HttpEndpoint>>,
    > = std::sync::OnceLock::new();
    ENDPOINTS.get_or_init(Default::default)
}

/// Registers a master's operator API address: [`http_get`] then speaks HTTPS to it with the
/// operator certificate `operator-admin` from `tls_dir` (or plain HTTP when `insecure`).
/// Registering an address again (a restart, or a port reused by another test) drops its client.
pub fn register_http(addr: SocketAddr, tls_dir: &Path, insecure: bool) {
    if let Ok(mut m) = endpoints().lock() {
        m.insert(
            addr,
            HttpEndpoint {
                tls_dir: tls_dir.to_path_buf(),
                insecure,
                client: None,
            },
        );
    }
}

fn endpoint(addr: SocketAddr) -> anyhow::Result<HttpEndpoint> {
    endpoints()
        .lock()
        .ok()
        .and_then(|m| m.get(&addr).cloned())
        .with_context(|| format!("no master started by the harness serves {addr}"))
}

/// The operator client configuration for a master the harness started (dev operator
/// certificate `admin`).
pub fn operator_client(addr: SocketAddr) -> anyhow::Result<gantry_master::client::ClientConfig> {
    let e = endpoint(addr)?;
    Ok(if e.insecure {
        gantry_master::client::ClientConfig {
            master: format!("http://{addr}"),
            tls_dir: None,
            credentials: gantry_master::client::Credentials::None,
            timeout: Duration::from_secs(10),
        }
    } else {
        gantry_master::client::ClientConfig::with_certificate(
            format!("https://{addr}"),
            &e.tls_dir,
            "admin",
        )
    })
}

/// How many tasks a master's `/state` shows RUNNING.
pub fn running_tasks(state: &serde_json::Value) -> usize {
    state["tasks"]
        .as_array()
        .map_or(0, |t| t.iter().filter(|t| t["state"] == "RUNNING").count())
}

/// An operator API client of the master at `addr` over HTTPS (trusting the CA in `tls_dir`)
/// presenting `credentials`, with a 20 s timeout: for tests of who may do what.
pub fn https_client(
    addr: SocketAddr,
    tls_dir: &Path,
    credentials: gantry_master::client::Credentials,
) -> gantry_master::client::OperatorClient {
    gantry_master::client::OperatorClient::new(&gantry_master::client::ClientConfig {
        master: format!("https://{addr}"),
        tls_dir: Some(tls_dir.to_path_buf()),
        credentials,
        timeout: Duration::from_secs(20),
    })
    .expect("operator client")
}

/// `GET path` from the operator API of a master the harness started (HTTPS with the dev
/// operator certificate). The client is made once the master's TLS directory holds the CA and
/// the operator certificate, then kept.
pub fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let client = match endpoint(addr)?.client {
        Some(c) => c,
        None => {
            let c = gantry_master::client::BlockingClient::new(&operator_client(addr)?)?;
            if let Ok(mut m) = endpoints().lock() {
                if let Some(e) = m.get_mut(&addr) {
                    e.client = Some(c.clone());
                }
            }
            c
        }
    };
    Ok(client.get(path)?)
}

/// A cluster: one master and some agents sharing one dev TLS directory.
pub struct Cluster {
    pub agents: Vec<AgentProc>,
    pub master: MasterProc,
    pub tls_dir: PathBuf,
    pub dir: TempDir,
}

impl Cluster {
    /// A framework's driver configuration for this cluster's master ([`crate::driver_config`]).
    pub fn driver_config(&self, principal: &str, roles: &[&str]) -> gantry_sdk::DriverConfig {
        crate::driver_config(
            vec![self.master.quic.to_string()],
            self.tls_dir.clone(),
            principal,
            roles.iter().map(|r| r.to_string()).collect(),
        )
    }

    /// Starts a master and one agent per `(name, resources)`, and waits until all registered.
    pub fn start(agents: &[(&str, &str)]) -> anyhow::Result<Self> {
        Self::start_with(agents, &[], &[])
    }

    pub fn start_with(
        agents: &[(&str, &str)],
        master_args: &[&str],
        agent_args: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_in(
            TempDir::new("gantry-test")?,
            agents,
            master_args,
            agent_args,
        )
    }

    /// Like [`Cluster::start_with`], with the master enforcing the access-control lists in
    /// `acls_toml` (written to `acls.toml` in the test directory and passed as `--acls`).
    pub fn start_with_acls(
        agents: &[(&str, &str)],
        acls_toml: &str,
        master_args: &[&str],
    ) -> anyhow::Result<Self> {
        let dir = TempDir::new("gantry-test")?;
        let acls = dir.path().join("acls.toml");
        std::fs::write(&acls, acls_toml)?;
        let acls = acls.display().to_string();
        let mut args = vec!["--acls", acls.as_str()];
        args.extend_from_slice(master_args);
        Self::start_in(dir, agents, &args, &[])
    }

    fn start_in(
        dir: TempDir,
        agents: &[(&str, &str)],
        master_args: &[&str],
        agent_args: &[&str],
    ) -> anyhow::Result<Self> {
        let tls_dir = dir.path().join("tls");
        let master = MasterProc::start(dir.path(), &tls_dir, master_args)?;
        let mut procs = Vec::new();
        for (name, res) in agents {
            procs.push(AgentProc::start(
                dir.path(),
                &tls_dir,
                master.quic,
                name,
                res,
                agent_args,
            )?);
        }
        let n = agents.len();
        master.wait_state(Duration::from_secs(30), "agents to register", |s| {
            s["agents"]
                .as_array()
                .is_some_and(|a| a.iter().filter(|a| a["connected"] == true).count() == n)
        })?;
        Ok(Self {
            agents: procs,
            master,
            tls_dir,
            dir,
        })
    }

    /// Prints the logs of every process (for failing tests).
    pub fn dump_logs(&self) {
        eprintln!(
            "---- master log ----\n{}",
            std::fs::read_to_string(&self.master.log).unwrap_or_default()
        );
        for a in &self.agents {
            eprintln!(
                "---- agent {} log ----\n{}",
                a.name,
                std::fs::read_to_string(&a.log).unwrap_or_default()
            );
        }
    }
}

impl MasterProc {
    /// `GET /health` as JSON (`role` is `leader` or `standby`).
    pub fn health(&self) -> anyhow::Result<serde_json::Value> {
        Ok(serde_json::from_str(&http_get(self.http, "/health")?)?)
    }

    /// True when this master currently says it leads.
    pub fn is_leader(&self) -> bool {
        self.health().is_ok_and(|h| h["role"] == "leader")
    }
}

/// The `/state` entry of a task.
pub fn state_task(
    state: &serde_json::Value,
    task: gantry_sdk::protocol::TaskId,
) -> serde_json::Value {
    state["tasks"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["id"] == task.to_string()).cloned())
        .unwrap_or(serde_json::Value::Null)
}

/// Task sandboxes the agents created (one per launch: a task launched twice shows as two).
pub fn sandbox_count(agents: &[AgentProc]) -> usize {
    agents
        .iter()
        .map(|a| {
            std::fs::read_dir(a.work_dir.join("sandboxes"))
                .map(|d| d.count())
                .unwrap_or(0)
        })
        .sum()
}

/// Lazily unmounts every mount at or below `dir` (deepest first).
fn unmount_below(dir: &Path) {
    let want = dir.to_string_lossy().into_owned();
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut mounts: Vec<&str> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&want))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mounts {
        if let Ok(c) = std::ffi::CString::new(m) {
            // SAFETY: a valid NUL-terminated path; MNT_DETACH has no other preconditions.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}
