//! Task processes: launch in a sandbox under a supervisor, watch, kill.
//!
//! Every task runs under its own supervisor process (`gantry-agent supervise`, see
//! [`supervise`]): the supervisor starts a new session so it survives the agent, starts the
//! task's command (shell string or argv) as the leader of its own process group, as the task's
//! user ([`user`]), with stdout and stderr captured in the sandbox, waits for it, and writes
//! the exit status to `exit.json` in the task's root-owned meta directory. The agent therefore
//! learns the real outcome of a task even when the task ended while the agent itself was down.
//!
//! The sandbox (`WORK_DIR/sandboxes/TASK_ID`, mode 0750) belongs to the task's user; the meta
//! directory (`WORK_DIR/meta/TASK_ID`, mode 0700) to the agent.
//!
//! Killing sends SIGTERM to the task's whole process group, then SIGKILL after the grace period.

pub mod supervise;
pub mod user;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gantry_sdk::protocol::Program;
use serde::{Deserialize, Serialize};

use self::user::TaskUser;

/// How a task's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatus {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

/// Errors launching a task.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("creating sandbox {path}: {source}")]
    Sandbox {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("starting the task supervisor: {0}")]
    Spawn(std::io::Error),
    #[error("the supervisor did not report the task's pid: {0}")]
    NoPid(String),
}

/// What the agent needs to launch one task.
pub struct LaunchSpec<'a> {
    pub sandbox: &'a Path,
    /// Root-owned directory for the supervisor's pid and exit files.
    pub meta: &'a Path,
    pub program: &'a Program,
    /// The user to switch to (`None`: run as the agent's own user, which is not root).
    pub user: Option<&'a TaskUser>,
    pub env: &'a BTreeMap<String, String>,
    /// `cgroup.procs` (v2) / `tasks` files the task must join before exec.
    pub cgroup_procs: &'a [PathBuf],
    /// The agent binary (re-executed as `supervise`).
    pub agent_exe: &'a Path,
}

/// A launched task: the supervisor's pid and the task's process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launched {
    pub supervisor_pid: i32,
    pub task_pgid: i32,
    /// Start time of the supervisor (clock ticks since boot), to detect pid reuse.
    pub supervisor_start: u64,
}

/// Spawns the supervisor for a task and waits until it reports the task's pid.
pub async fn launch(spec: &LaunchSpec<'_>) -> Result<(Launched, tokio::process::Child), ExecError> {
    make_dirs(spec).map_err(|(path, source)| ExecError::Sandbox { path, source })?;
    let mut cmd = tokio::process::Command::new(spec.agent_exe);
    cmd.arg("supervise")
        .arg("--sandbox")
        .arg(spec.sandbox)
        .arg("--meta")
        .arg(spec.meta);
    for p in spec.cgroup_procs {
        cmd.arg("--cgroup-procs").arg(p);
    }
    if let Some(u) = spec.user {
        let groups: Vec<String> = u.groups.iter().map(u32::to_string).collect();
        cmd.arg("--uid").arg(u.uid.to_string());
        cmd.arg("--gid").arg(u.gid.to_string());
        cmd.arg("--groups").arg(groups.join(","));
    }
    match spec.program {
        Program::Shell(s) => {
            cmd.arg("--").arg(s);
        }
        Program::Argv(v) => {
            cmd.arg("--argv").arg("--").args(v);
        }
    }
    cmd.env_clear();
    for key in ["PATH", "LANG", "HOME", "TZ"] {
        if let Ok(v) = std::env::var(key) {
            cmd.env(key, v);
        }
    }
    if std::env::var_os("PATH").is_none() {
        cmd.env("PATH", "/usr/local/bin:/usr/bin:/bin");
    }
    if let Some(u) = spec.user {
        cmd.env("USER", &u.name)
            .env("LOGNAME", &u.name)
            .env("HOME", &u.home);
    }
    cmd.envs(spec.env);
    cmd.env("GANTRY_SANDBOX", spec.sandbox);
    cmd.current_dir(spec.sandbox);
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    cmd.kill_on_drop(false);
    let child = cmd.spawn().map_err(ExecError::Spawn)?;
    let supervisor_pid = child
        .id()
        .map(|p| p as i32)
        .ok_or_else(|| ExecError::NoPid("supervisor exited at once".into()))?;
    // The supervisor writes task.pid once the command is running (or exit.json if it failed).
    let pid_file = spec.meta.join(supervise::PID_FILE);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let task_pgid = loop {
        if let Ok(text) = std::fs::read_to_string(&pid_file) {
            if let Ok(pid) = text.trim().parse::<i32>() {
                break pid;
            }
        }
        if spec.meta.join(supervise::EXIT_FILE).exists() {
            break 0;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(ExecError::NoPid("timed out after 10 s".into()));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let supervisor_start = process_start_time(supervisor_pid).unwrap_or(0);
    Ok((
        Launched {
            supervisor_pid,
            task_pgid,
            supervisor_start,
        },
        child,
    ))
}

/// Creates the meta directory (0700, the agent's) and the sandbox (0750, the task user's).
fn make_dirs(spec: &LaunchSpec<'_>) -> Result<(), (PathBuf, std::io::Error)> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let err = |p: &Path| {
        let p = p.to_path_buf();
        move |e| (p, e)
    };
    for (dir, mode) in [(spec.meta, 0o700), (spec.sandbox, 0o750)] {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(dir)
            .map_err(err(dir))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).map_err(err(dir))?;
    }
    if let Some(u) = spec.user {
        std::os::unix::fs::chown(spec.sandbox, Some(u.uid), Some(u.gid))
            .map_err(err(spec.sandbox))?;
    }
    Ok(())
}

/// Claims a launch's fate ([`supervise::CLAIM_FILE`]): true for the first caller only.
pub fn claim(meta: &Path) -> bool {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(meta.join(supervise::CLAIM_FILE))
        .is_ok()
}

/// Decides the fate of a launch a previous agent started but did not record: the supervisor
/// that claimed it (its pid and start time, and the task's process group, 0 until the task has
/// started), or `None` when no supervisor did — then none ever will run it (the agent holds the
/// claim, or the launch never got as far as its meta directory).
pub fn find_launched(meta: &Path) -> Option<Launched> {
    if !meta.is_dir() || claim(meta) {
        return None;
    }
    // The supervisor writes its pid file before it claims.
    let text = std::fs::read_to_string(meta.join(supervise::SUPERVISOR_FILE)).ok()?;
    let (pid, start) = text.trim().split_once(' ')?;
    Some(Launched {
        supervisor_pid: pid.parse().ok().filter(|&p: &i32| p > 1)?,
        task_pgid: read_task_pgid(meta).unwrap_or(0),
        supervisor_start: start.parse().ok()?,
    })
}

/// The task's process group, once its supervisor has started it.
pub fn read_task_pgid(meta: &Path) -> Option<i32> {
    std::fs::read_to_string(meta.join(supervise::PID_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|&p: &i32| p > 1)
}

/// The exit status the supervisor recorded in `meta`, if it has finished.
pub fn read_exit(meta: &Path) -> Option<ExitStatus> {
    let text = std::fs::read_to_string(meta.join(supervise::EXIT_FILE)).ok()?;
    serde_json::from_str(&text).ok()
}

/// True while the supervisor of `launched` still runs (and is the same process, not a reused pid).
pub fn supervisor_alive(launched: &Launched) -> bool {
    match process_start_time(launched.supervisor_pid) {
        Some(start) => launched.supervisor_start == 0 || start == launched.supervisor_start,
        None => false,
    }
}

/// Start time of a process in clock ticks since boot (`/proc/PID/stat` field 22), or `None`
/// if there is no such (non-zombie) process.
pub fn process_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// Sends `signal` to a task's whole process group.
pub fn signal_group(pgid: i32, signal: i32) {
    if pgid > 1 {
        // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }
}

/// A human-readable message for an exit status.
pub fn describe(status: &ExitStatus) -> String {
    match (status.code, status.signal) {
        (Some(0), _) => "exited with code 0".into(),
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("terminated by signal {s} ({})", signal_name(s)),
        (None, None) => "ended with unknown status".into(),
    }
}

fn signal_name(s: i32) -> &'static str {
    match s {
        libc::SIGTERM => "SIGTERM",
        libc::SIGKILL => "SIGKILL",
        libc::SIGINT => "SIGINT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGHUP => "SIGHUP",
        _ => "signal",
    }
}

/// The processes of a process group (scans `/proc`; used to attribute GPU processes to tasks
/// when they run without cgroups).
pub fn group_pids(pgid: i32) -> Vec<u32> {
    if pgid <= 1 {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| process_group(*pid) == Some(pgid))
        .collect()
}

/// The process group of a process (`/proc/PID/stat` field 5).
fn process_group(pid: u32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_group_is_listed() {
        // SAFETY: getpgrp has no preconditions.
        let pgid = unsafe { libc::getpgrp() };
        assert!(group_pids(pgid).contains(&std::process::id()));
        assert!(group_pids(0).is_empty());
        assert!(process_start_time(std::process::id() as i32).is_some());
    }

    #[test]
    fn exit_descriptions() {
        let s = |code, signal| describe(&ExitStatus { code, signal });
        assert_eq!(s(Some(3), None), "exited with code 3");
        assert_eq!(s(None, Some(9)), "terminated by signal 9 (SIGKILL)");
    }
}
