//! Task processes: launch in a sandbox under the agent's supervisor, watch, kill.
//!
//! - [`server`]: the supervisor process (`gantry-supervise --server`, or `gantry-agent
//!   supervise --server` without the small binary), one per agent run: it starts each task as
//!   the leader of its own process group, as the task's user ([`user`]), in its cgroups, with
//!   stdout and stderr captured in the sandbox ([`supervise`]), waits for it, and records its
//!   claim, the task's pid and its exit status in the launch [`record`] in the task's
//!   root-owned meta directory. It runs in its own
//!   session and outlives the agent, so the agent learns the real outcome of a task even when
//!   the task ended while the agent itself was down.
//! - [`client`]: the agent's end (requests and replies over the supervisor's stdin and stdout).
//! - [`spawn`]: how the supervisor starts a task process (a vfork-style clone: no copy of the
//!   supervisor's memory per task).
//! - [`prepare`]: a task's directories, arguments and environment.
//!
//! The sandbox (`WORK_DIR/sandboxes/TASK_ID`, mode 0750) belongs to the task's user; the meta
//! directory (`WORK_DIR/meta/TASK_ID`, mode 0700) to the agent.
//!
//! Killing sends SIGTERM to the task's whole process group, then SIGKILL after the grace period.

pub mod client;
pub mod record;
pub mod server;
pub mod spawn;
pub mod supervise;
pub mod user;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use gantry_proto::Program;

use self::user::TaskUser;
pub use crate::core::types::{ExitStatus, Launched};

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
    #[error("a task path or argument is not valid UTF-8: {0:?}")]
    NotUtf8(String),
    #[error("the supervisor did not report the task's pid: {0}")]
    NoPid(String),
}

/// The program started as the agent's supervisor: the small `gantry-supervise` binary
/// installed next to the agent, or else the agent binary itself (`gantry-agent supervise`).
#[derive(Debug, Clone)]
pub struct SupervisorCommand {
    pub program: PathBuf,
    /// Arguments before the supervisor's own (`supervise` for the agent binary).
    pub prefix: Vec<OsString>,
}

/// The small supervisor binary's name.
pub const SUPERVISOR_BIN: &str = "gantry-supervise";

impl SupervisorCommand {
    /// `gantry-supervise` beside `agent_exe` if it is there, else `agent_exe supervise`.
    pub fn beside(agent_exe: &Path) -> Self {
        let small = agent_exe.with_file_name(SUPERVISOR_BIN);
        if small.is_file() {
            Self {
                program: small,
                prefix: Vec::new(),
            }
        } else {
            Self {
                program: agent_exe.to_path_buf(),
                prefix: vec!["supervise".into()],
            }
        }
    }
}

/// What the agent needs to launch one task.
pub struct LaunchSpec<'a> {
    pub sandbox: &'a Path,
    /// Root-owned directory for the task's launch record ([`record`]).
    pub meta: &'a Path,
    pub program: &'a Program,
    /// The user to switch to (`None`: run as the agent's own user, which is not root).
    pub user: Option<&'a TaskUser>,
    pub env: &'a BTreeMap<String, String>,
    /// `cgroup.procs` (v2) / `tasks` files the task must join before exec.
    pub cgroup_procs: &'a [PathBuf],
    /// The baseline of the task's reused cgroup (JSON), recorded with the supervisor's claim.
    pub cgroup_base: Option<String>,
}

/// A task ready for the supervisor ([`prepare`]).
#[derive(Debug, Clone)]
pub struct Prepared {
    /// [`supervise::command_line`].
    pub args: Vec<String>,
    /// The task's whole environment.
    pub env: Vec<(String, String)>,
}

/// Creates the task's directories and builds what the supervisor gets for it: the task's
/// arguments ([`supervise::command_line`]) and its whole environment (blocking: the agent calls
/// it on a blocking thread).
pub fn prepare(spec: &LaunchSpec<'_>) -> Result<Prepared, ExecError> {
    make_dirs(spec).map_err(|(path, source)| ExecError::Sandbox { path, source })?;
    let args = supervise::command_line(&supervise::Supervised {
        sandbox: spec.sandbox.to_path_buf(),
        meta: spec.meta.to_path_buf(),
        cgroup_procs: spec.cgroup_procs.to_vec(),
        cgroup_base: spec.cgroup_base.clone(),
        program: spec.program.clone(),
        identity: spec.user.map(|u| supervise::Identity {
            uid: u.uid,
            gid: u.gid,
            groups: u.groups.clone(),
        }),
    })
    .into_iter()
    .map(|a| {
        a.into_string()
            .map_err(|a| ExecError::NotUtf8(a.to_string_lossy().into_owned()))
    })
    .collect::<Result<Vec<_>, _>>()?;
    // Later entries win: the task's own variables over the agent's defaults.
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for key in ["PATH", "LANG", "HOME", "TZ"] {
        if let Ok(v) = std::env::var(key) {
            env.insert(key.into(), v);
        }
    }
    env.entry("PATH".into())
        .or_insert_with(|| "/usr/local/bin:/usr/bin:/bin".into());
    if let Some(u) = spec.user {
        env.insert("USER".into(), u.name.clone());
        env.insert("LOGNAME".into(), u.name.clone());
        env.insert("HOME".into(), u.home.to_string_lossy().into_owned());
    }
    env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.insert(
        "GANTRY_SANDBOX".into(),
        spec.sandbox.to_string_lossy().into_owned(),
    );
    Ok(Prepared {
        args,
        env: env.into_iter().collect(),
    })
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

/// Claims a launch's fate for a restarted agent ([`record::claim_for_agent`]): true when no
/// supervisor had claimed it (and none will run it now).
pub fn claim(meta: &Path) -> bool {
    record::claim_for_agent(meta)
}

/// Decides the fate of a launch a previous agent started but did not record: the supervisor
/// that claimed it (its pid and start time, and the task's process group, 0 until the task has
/// started), or `None` when no supervisor did — then none ever will run it (the agent holds the
/// claim, or the launch never got as far as its meta directory).
pub fn find_launched(meta: &Path) -> Option<Launched> {
    if !meta.is_dir() || claim(meta) {
        return None;
    }
    let r = record::read(meta)?;
    let (supervisor_pid, supervisor_start) = r.supervisor?;
    Some(Launched {
        supervisor_pid,
        task_pgid: r.task_pgid.unwrap_or(0),
        supervisor_start,
    })
}

/// The task's process group, once its supervisor has started it.
pub fn read_task_pgid(meta: &Path) -> Option<i32> {
    record::read(meta)?.task_pgid
}

/// The exit status the supervisor recorded in `meta`, if it has finished.
pub fn read_exit(meta: &Path) -> Option<ExitStatus> {
    record::read(meta)?.exit
}

/// True while the supervisor of `launched` still runs (and is the same process, not a reused pid).
pub fn supervisor_alive(launched: &Launched) -> bool {
    match process_start_time(launched.supervisor_pid) {
        Some(start) => launched.supervisor_start == 0 || start == launched.supervisor_start,
        None => false,
    }
}

/// True while a launched task may still run: its supervisor runs and has not recorded the
/// task's exit (one supervisor serves every task of an agent run: it outlives most of them).
pub fn still_running(launched: &Launched, meta: &Path) -> bool {
    supervisor_alive(launched) && read_exit(meta).is_none()
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
        (None, None) => {
            "ended with an unknown status: its supervisor died without recording it".into()
        }
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
    fn a_launch_is_claimed_once_by_the_supervisor_or_the_restarted_agent() {
        let dir = tempfile::tempdir().unwrap();
        // The launch never got as far as its meta directory: nothing to find, nothing claimed.
        let meta = dir.path().join("meta");
        assert_eq!(find_launched(&meta), None);
        assert!(!meta.exists());
        // A supervisor started and claimed the launch; the task runs as 4242.
        std::fs::create_dir_all(&meta).unwrap();
        let me = std::process::id() as i32;
        let start = process_start_time(me).unwrap();
        assert!(record::claim_for_supervisor(&meta, &format!("{me} {start}"), None).unwrap());
        assert!(!claim(&meta));
        record::append(&meta, "task", "4242", false).unwrap();
        let found = find_launched(&meta).unwrap();
        assert_eq!(
            found,
            Launched {
                supervisor_pid: me,
                task_pgid: 4242,
                supervisor_start: start,
            }
        );
        assert!(supervisor_alive(&found));
        // No supervisor claimed it yet: the agent does, and a late supervisor backs off.
        let late = dir.path().join("late");
        std::fs::create_dir_all(&late).unwrap();
        assert_eq!(find_launched(&late), None);
        assert!(!claim(&late), "the agent holds the claim");
    }

    #[test]
    fn exit_descriptions() {
        let s = |code, signal| describe(&ExitStatus { code, signal });
        assert_eq!(s(Some(3), None), "exited with code 3");
        assert_eq!(s(None, Some(9)), "terminated by signal 9 (SIGKILL)");
    }
}
