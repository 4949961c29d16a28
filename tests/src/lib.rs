//! Harness for cluster tests over real sockets: starts real `gantry-master` and `gantry-agent`
//! processes on free loopback ports in a temporary directory, reads the master's `/state`, and
//! cleans up every process (including task supervisors and task process groups) on drop.
//!
//! The binaries are taken from the cargo target directory next to the test executable; build
//! them first with `cargo build --workspace --bins` (the README's test command does).

pub mod emu;
pub mod etcd;
pub mod load;
pub mod proxy;

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// A temporary directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> anyhow::Result<Self> {
        let p = std::env::temp_dir().join(format!("{prefix}-{}", uuid_like()));
        std::fs::create_dir_all(&p)?;
        Ok(Self(p))
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn uuid_like() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}-{:x}", std::process::id(), t)
}

/// The directory holding the workspace's binaries (target/debug).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/debug/deps/test-xxxx -> target/debug
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .expect("target dir")
}

/// Path of a workspace binary, with a clear error when it has not been built. A binary next to
/// the running executable (e.g. `target/release/gantry-load`) is preferred.
pub fn bin(name: &str) -> anyhow::Result<PathBuf> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join(name)));
    if let Some(p) = beside.filter(|p| p.is_file()) {
        return Ok(p);
    }
    let p = bin_dir().join(name);
    if !p.exists() {
        bail!(
            "{} is missing: run `cargo build --workspace --bins` before the cluster tests",
            p.display()
        );
    }
    Ok(p)
}

/// A free loopback UDP port (for QUIC).
pub fn free_udp() -> SocketAddr {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("bind udp")
}

/// A free loopback TCP port.
pub fn free_tcp() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("bind tcp")
}

/// A child process killed (SIGKILL) and reaped on drop.
pub struct Proc {
    pub child: Child,
    pub name: String,
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> anyhow::Result<Self> {
        let out = std::fs::File::create(log)?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        let child = cmd.spawn().with_context(|| format!("spawning {name}"))?;
        Ok(Self {
            child,
            name: name.to_string(),
        })
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

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
            if let Ok(pid) = std::fs::read_to_string(e.path().join("task.pid")) {
                if let Ok(pid) = pid.trim().parse::<i32>() {
                    if pid > 1 {
                        // SAFETY: kill(2) on a process group this agent created; no memory involved.
                        unsafe {
                            libc::kill(-pid, libc::SIGKILL);
                        }
                    }
                }
            }
        }
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        self.proc.kill9();
        self.kill_tasks();
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

/// Runs the example batch framework in-process against `master` until it is done.
pub async fn run_batch(
    master: SocketAddr,
    tls_dir: &Path,
    name: &str,
    role: &str,
    count: u32,
    task: &str,
    command: &str,
) -> anyhow::Result<gantry_examples::batch::BatchProgress> {
    run_batch_ha(
        vec![master.to_string()],
        tls_dir,
        name,
        role,
        count,
        task,
        command,
    )
    .await
}

/// A framework run by a [`Recorder`] that launches `tasks` (errors are dropped): its status
/// updates, a handle, and the running driver. Call inside a tokio runtime.
pub fn start_recorder(
    config: gantry_sdk::DriverConfig,
    tasks: Vec<gantry_sdk::protocol::TaskInfo>,
) -> (
    Updates,
    gantry_sdk::DriverHandle,
    tokio::task::JoinHandle<Result<(), gantry_sdk::scheduler::DriverError>>,
) {
    let (updates, up_rx) = tokio::sync::mpsc::unbounded_channel();
    let (errors, _) = tokio::sync::mpsc::unbounded_channel();
    let driver = gantry_sdk::Driver::new(config);
    let handle = driver.handle();
    let rec = Recorder {
        to_launch: tasks,
        updates,
        errors,
    };
    (Updates::new(up_rx), handle, tokio::spawn(driver.run(rec)))
}

/// A scheduler for tests: launches the given tasks as offers allow (declining the rest) and
/// forwards every status update and error into channels.
pub struct Recorder {
    pub to_launch: Vec<gantry_sdk::protocol::TaskInfo>,
    pub updates: tokio::sync::mpsc::UnboundedSender<gantry_sdk::protocol::StatusUpdate>,
    pub errors: tokio::sync::mpsc::UnboundedSender<String>,
}

impl gantry_sdk::Scheduler for Recorder {
    async fn offers(
        &mut self,
        driver: &gantry_sdk::DriverHandle,
        offers: Vec<gantry_sdk::protocol::Offer>,
    ) {
        for offer in offers {
            let mut avail = offer.total();
            let mut launch = Vec::new();
            self.to_launch.retain(|t| {
                if avail.contains(&t.resources) {
                    let _ = avail.checked_sub_assign(&t.resources);
                    launch.push(t.clone());
                    false
                } else {
                    true
                }
            });
            if launch.is_empty() {
                driver.decline(vec![offer.id], Some(1.0));
            } else {
                driver.launch(offer.id, launch);
            }
        }
    }

    async fn status_update(
        &mut self,
        _driver: &gantry_sdk::DriverHandle,
        update: &gantry_sdk::protocol::StatusUpdate,
    ) {
        let _ = self.updates.send(update.clone());
    }

    async fn error(
        &mut self,
        _driver: &gantry_sdk::DriverHandle,
        kind: gantry_sdk::protocol::ErrorKind,
        message: &str,
    ) {
        let _ = self.errors.send(format!("{kind:?}: {message}"));
    }
}

/// A task running the shell command `command` with `resources` (as the agent's default user).
pub fn task(name: &str, command: &str, resources: &str) -> gantry_sdk::protocol::TaskInfo {
    gantry_sdk::protocol::TaskInfo {
        task_id: gantry_sdk::protocol::TaskId::random(),
        name: name.to_string(),
        command: gantry_sdk::protocol::CommandInfo::shell(command),
        resources: resources.parse().expect("valid resources"),
        env: Default::default(),
        kill_grace_secs: None,
        gpu_selector: None,
    }
}

/// Status updates received by a [`Recorder`], kept so they can be awaited in any order.
pub struct Updates {
    rx: tokio::sync::mpsc::UnboundedReceiver<gantry_sdk::protocol::StatusUpdate>,
    pub seen: Vec<gantry_sdk::protocol::StatusUpdate>,
}

impl Updates {
    pub fn new(
        rx: tokio::sync::mpsc::UnboundedReceiver<gantry_sdk::protocol::StatusUpdate>,
    ) -> Self {
        Self {
            rx,
            seen: Vec::new(),
        }
    }

    /// Waits until an update matching `pred` has arrived (or had arrived) and returns it.
    pub async fn wait_for(
        &mut self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&gantry_sdk::protocol::StatusUpdate) -> bool,
    ) -> anyhow::Result<gantry_sdk::protocol::StatusUpdate> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut checked = 0;
        loop {
            if let Some(u) = self.seen[checked..].iter().find(|u| pred(u)) {
                return Ok(u.clone());
            }
            checked = self.seen.len();
            let u = tokio::time::timeout_at(deadline, self.rx.recv())
                .await
                .with_context(|| format!("timed out waiting for {what}; seen: {:#?}", self.seen))?
                .context("scheduler stopped")?;
            self.seen.push(u);
        }
    }

    /// Waits for `task` to reach `state`; fails early if it ends in another terminal state.
    pub async fn wait(
        &mut self,
        task: gantry_sdk::protocol::TaskId,
        state: gantry_sdk::protocol::TaskState,
        timeout: Duration,
    ) -> anyhow::Result<gantry_sdk::protocol::StatusUpdate> {
        let u = self
            .wait_for(&format!("task {task} to be {state}"), timeout, |u| {
                u.task_id == task && (u.state == state || u.state.is_terminal())
            })
            .await?;
        if u.state != state {
            bail!(
                "task {task} ended {} ({}) instead of {state}",
                u.state,
                u.message
            );
        }
        Ok(u)
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

/// Runs the batch framework against several masters (it follows the leader).
pub async fn run_batch_ha(
    masters: Vec<String>,
    tls_dir: &Path,
    name: &str,
    role: &str,
    count: u32,
    task: &str,
    command: &str,
) -> anyhow::Result<gantry_examples::batch::BatchProgress> {
    use gantry_examples::batch::{Batch, BatchSpec};
    let spec = BatchSpec {
        name: name.to_string(),
        command: gantry_sdk::protocol::CommandInfo::shell(command),
        count,
        task: task.parse()?,
        env: Default::default(),
        verbose: false,
        gpu_selector: None,
    };
    let (batch, progress) = Batch::new(spec);
    let config =
        gantry_sdk::DriverConfig::new(masters, tls_dir.to_path_buf(), name, vec![role.to_string()]);
    gantry_sdk::Driver::new(config).run(batch).await?;
    let p = progress.borrow().clone();
    Ok(p)
}

// ---------------------------------------------------------------------------------------------
// GPU agent tests: real cgroups and the stand-in NVML.

/// Set to `1` to skip (explicitly) the tests that need real cgroups; CI never sets it.
pub const SKIP_CGROUP_TESTS: &str = "GANTRY_SKIP_CGROUP_TESTS";

/// Where cgroup hierarchies are mounted.
pub const CGROUP_MOUNT: &str = "/sys/fs/cgroup";

/// Whether this test can use real cgroups. Returns `false` (after saying so) only when
/// [`SKIP_CGROUP_TESTS`]`=1`; otherwise panics with a clear message when cgroups are unusable
/// (not root, nothing mounted, read-only hierarchy).
pub fn cgroups_available(test: &str) -> bool {
    let why = cgroup_probe(test).err();
    match why {
        None => true,
        Some(why) if std::env::var(SKIP_CGROUP_TESTS).as_deref() == Ok("1") => {
            eprintln!("SKIPPED ({SKIP_CGROUP_TESTS}=1): {test}: cgroups are unavailable: {why}");
            false
        }
        Some(why) => panic!(
            "{test}: cgroups are unavailable: {why}. This test needs root and mounted cgroups \
             (v1 or v2); set {SKIP_CGROUP_TESTS}=1 to skip it explicitly."
        ),
    }
}

fn cgroup_probe(test: &str) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("not running as root");
    }
    let mount = Path::new(CGROUP_MOUNT);
    let hierarchy = if mount.join("memory/cgroup.procs").exists() {
        mount.join("memory")
    } else if mount.join("cgroup.controllers").exists() {
        mount.to_path_buf()
    } else {
        bail!("no cgroup v1 memory hierarchy or cgroup v2 mount under {CGROUP_MOUNT}");
    };
    let probe = hierarchy.join(format!("gantry-probe-{}-{test}", std::process::id()));
    std::fs::create_dir(&probe)
        .with_context(|| format!("cannot create a cgroup ({})", probe.display()))?;
    std::fs::remove_dir(&probe).with_context(|| format!("removing {}", probe.display()))?;
    Ok(())
}

/// A per-test `--cgroup-root` (relative, e.g. `gantry-test-123-restart`). Dropping it kills
/// whatever is left in its task cgroups and removes them and the root from every hierarchy.
pub struct CgroupRoot {
    pub name: String,
}

impl CgroupRoot {
    pub fn new(test: &str) -> Self {
        Self {
            name: format!("gantry-test-{}-{test}", std::process::id()),
        }
    }

    /// The root's directory in every mounted hierarchy that has it.
    pub fn dirs(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let v2 = Path::new(CGROUP_MOUNT).join(&self.name);
        if v2.is_dir() {
            out.push(v2);
        }
        if let Ok(entries) = std::fs::read_dir(CGROUP_MOUNT) {
            for e in entries.flatten() {
                let d = e.path().join(&self.name);
                if d.is_dir() {
                    out.push(d);
                }
            }
        }
        out
    }

    /// Task cgroups still present under the root (in any hierarchy).
    pub fn task_cgroups(&self) -> Vec<PathBuf> {
        self.dirs()
            .iter()
            .filter_map(|d| std::fs::read_dir(d).ok())
            .flat_map(|rd| rd.flatten())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect()
    }

    /// A task's cgroup directory in a v1 controller's hierarchy (or the v2 directory when
    /// `controller` is `""`).
    pub fn task_dir(&self, controller: &str, task: gantry_sdk::protocol::TaskId) -> PathBuf {
        Path::new(CGROUP_MOUNT)
            .join(controller)
            .join(&self.name)
            .join(task.to_string())
    }

    fn kill_and_remove(&self) {
        let tasks = self.task_cgroups();
        for dir in &tasks {
            for pid in std::fs::read_to_string(dir.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse::<i32>().ok())
            {
                // SAFETY: kill(2) on a process inside this test's own cgroup.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for dir in tasks.iter().chain(self.dirs().iter()) {
            while std::fs::remove_dir(dir).is_err() && dir.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for CgroupRoot {
    fn drop(&mut self) {
        self.kill_and_remove();
    }
}

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

    /// A file in a task's meta directory (the supervisor's `task.pid`, `exit.json`).
    pub fn meta_file(&self, task: gantry_sdk::protocol::TaskId, name: &str) -> PathBuf {
        self.work_dir.join("meta").join(task.to_string()).join(name)
    }

    /// Waits until a task's meta file (`task.pid`, `exit.json`) exists and is non-empty;
    /// returns its contents.
    pub fn wait_meta_file(
        &self,
        task: gantry_sdk::protocol::TaskId,
        name: &str,
        timeout: Duration,
    ) -> anyhow::Result<String> {
        wait_file(&self.meta_file(task, name), timeout)
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

/// True while a process exists and is not a zombie.
pub fn process_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Asserts that a batch framework ran `count` tasks and saw exactly one terminal update,
/// FINISHED, for each (`what` names it in failure messages).
pub fn assert_finished_once(what: &str, p: &gantry_examples::batch::BatchProgress, count: u32) {
    assert_eq!((p.finished, p.failed), (count, 0), "{what}: {:?}", p.errors);
    assert_eq!(p.terminal_updates.len(), count as usize, "{what}");
    for (task, states) in &p.terminal_updates {
        assert_eq!(
            states,
            &vec![gantry_sdk::protocol::TaskState::Finished],
            "{what}: task {task}"
        );
    }
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
