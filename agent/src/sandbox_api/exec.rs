//! Exec inside a running task. The task's leader process (its process group id in the launch
//! record, checked alive with its supervisor) is the model: the command gets its real user and
//! group, its supplementary groups, its environment, its working directory and every cgroup it
//! is in (written into each hierarchy's `cgroup.procs` before `exec`), in a process group of its
//! own that is killed when the session ends (the client went away, or the time limit).
//!
//! With a terminal (`tty` in the request, protocol v10) the command runs on a pseudo-terminal
//! opened with `posix_openpt`/`grantpt`/`unlockpt`/`ptsname_r` from the `libc` crate (already
//! the agent's; the workspace's `rustix` lacks its `pty` feature, and one more feature would
//! rebuild every crate above it): the child calls `setsid` and takes the pty as its controlling
//! terminal (`TIOCSCTTY`), the window size is set with `TIOCSWINSZ`, and everything it writes
//! comes back as standard output (`stream` 1).
//!
//! [`exec_command`] builds the command from what was read ([`TaskProcess`]): the seam a
//! container runtime replaces (a task in a container gets `runc exec CONTAINER CMD...`).

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use gantry_proto::{
    SandboxErrorKind, SandboxInput, SandboxReply, TtySize, ALLOWED_SIGNALS, SANDBOX_CHUNK,
};
use gantry_transport::FrameSender;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{refuse, send_reply};
use crate::isolation::layout::CgroupLayout;

/// What a command run inside a task takes from the task's leader process.
#[derive(Debug, Clone)]
pub struct TaskProcess {
    /// The leader's pid.
    pub pid: i32,
    /// Its real user and group, and its supplementary groups.
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// Its environment.
    pub env: Vec<(OsString, OsString)>,
    /// Its working directory (the sandbox when it cannot be read).
    pub cwd: PathBuf,
    /// `cgroup.procs` of each cgroup it is in.
    pub cgroup_procs: Vec<PathBuf>,
}

impl TaskProcess {
    /// Reads the running task of `meta` (its launch record) from `/proc`; `NotRunning` when it
    /// has ended or never started.
    pub fn read(meta: &Path, sandbox: &Path) -> Result<TaskProcess, SandboxReply> {
        let not_running = || refuse(SandboxErrorKind::NotRunning, "the task is not running");
        let launched = crate::executor::find_launched(meta).ok_or_else(not_running)?;
        if !crate::executor::still_running(&launched, meta) || launched.task_pgid <= 0 {
            return Err(not_running());
        }
        let pid = launched.task_pgid;
        let status =
            std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|_| not_running())?;
        let ids = |key: &str| -> Vec<u32> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| {
                    v.split_whitespace()
                        .filter_map(|x| x.parse().ok())
                        .collect()
                })
                .unwrap_or_default()
        };
        let (uid, gid) = match (ids("Uid:").first(), ids("Gid:").first()) {
            (Some(u), Some(g)) => (*u, *g),
            _ => {
                return Err(refuse(
                    SandboxErrorKind::Failed,
                    "cannot read the task's user",
                ))
            }
        };
        let groups = ids("Groups:");
        let env = std::fs::read(format!("/proc/{pid}/environ"))
            .unwrap_or_default()
            .split(|b| *b == 0)
            .filter(|kv| !kv.is_empty())
            .filter_map(|kv| {
                let at = kv.iter().position(|b| *b == b'=')?;
                Some((
                    OsString::from_vec(kv[..at].to_vec()),
                    OsString::from_vec(kv[at + 1..].to_vec()),
                ))
            })
            .collect();
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd"))
            .unwrap_or_else(|_| sandbox.to_path_buf());
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let cgroup_procs = CgroupLayout::detect()
            .map(|layout| cgroup_procs(&layout, &cgroups))
            .unwrap_or_default();
        Ok(TaskProcess {
            pid,
            uid,
            gid,
            groups,
            env,
            cwd,
            cgroup_procs,
        })
    }
}

/// `cgroup.procs` of each hierarchy a process is in (its `/proc/PID/cgroup` text), where the
/// layout has the hierarchy mounted (hierarchies gantry does not use are left alone).
pub fn cgroup_procs(layout: &CgroupLayout, proc_cgroup: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        let mount = match layout {
            CgroupLayout::V2 { mount } if controllers.is_empty() => Some(mount),
            CgroupLayout::V1 { mounts } => controllers.split(',').find_map(|c| mounts.get(c)),
            CgroupLayout::V2 { .. } => None,
        };
        if let Some(m) = mount {
            let p = m.join(rel).join("cgroup.procs");
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

/// The command that runs `argv` inside the task `p` (its environment, working directory;
/// the user, groups and cgroups are applied by [`run`] just before `exec`). A container
/// runtime replaces this with `runc exec` of the task's container.
pub fn exec_command(p: &TaskProcess, argv: &[String]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .env_clear()
        .envs(p.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&p.cwd);
    cmd
}

/// Where an exec's standard input comes from.
pub enum Input {
    /// All of it, in the request; then end of file.
    Bytes(Vec<u8>),
    /// [`SandboxInput`] frames on the master's stream while the command runs (protocol v11).
    Live(quinn::RecvStream),
}

/// Feeds the command's input: the request's bytes, or the master's live frames (keystrokes,
/// end of input, window size through `tty` with `TIOCSWINSZ`, signals to process group
/// `pgid`). A live stream that fails (the master or its client went away) kills the group.
async fn feed<W>(input: Input, mut writer: W, tty: Option<std::fs::File>, pgid: Option<i32>)
where
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut rx = match input {
        Input::Bytes(bytes) => {
            let _ = tokio::time::timeout(super::WRITE_DEADLINE, writer.write_all(&bytes)).await;
            return;
        }
        Input::Live(rx) => rx,
    };
    let mut writer = Some(writer);
    loop {
        let frame =
            gantry_transport::framing::read_frame_max::<_, SandboxInput>(&mut rx, super::MAX_INPUT)
                .await;
        match frame {
            Ok(SandboxInput::Stdin(data)) => {
                if let Some(w) = writer.as_mut() {
                    let wrote = async {
                        w.write_all(&data).await?;
                        w.flush().await
                    };
                    if !matches!(
                        tokio::time::timeout(super::WRITE_DEADLINE, wrote).await,
                        Ok(Ok(()))
                    ) {
                        // The command stopped reading (or exited): drop what it does not take.
                        writer = None;
                    }
                }
            }
            Ok(SandboxInput::StdinClose) => match &tty {
                // A terminal stays open: its end of file is the EOF character (^D).
                Some(_) => {
                    if let Some(w) = writer.as_mut() {
                        let _ = w.write_all(&[4]).await;
                        let _ = w.flush().await;
                    }
                }
                None => writer = None,
            },
            Ok(SandboxInput::Resize(size)) => {
                if let (Some(t), true) = (&tty, size.rows > 0 && size.cols > 0) {
                    let ws = libc::winsize {
                        ws_row: size.rows,
                        ws_col: size.cols,
                        ws_xpixel: 0,
                        ws_ypixel: 0,
                    };
                    // SAFETY: TIOCSWINSZ reads one `winsize` we own; the kernel sends SIGWINCH
                    // to the terminal's foreground process group.
                    unsafe { libc::ioctl(t.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
                }
            }
            Ok(SandboxInput::Signal(sig)) => {
                if let (Some(g), true) = (pgid, ALLOWED_SIGNALS.contains(&sig)) {
                    // SAFETY: a signal to the command's own process group.
                    unsafe { libc::kill(-g, sig) };
                } else {
                    tracing::warn!(sig, "exec: a signal not allowed, ignored");
                }
            }
            Err(e) => {
                tracing::info!("live exec: the master's input ended: {e}");
                if let Some(g) = pgid {
                    // SAFETY: a signal to the command's own process group.
                    unsafe { libc::kill(-g, libc::SIGKILL) };
                }
                return;
            }
        }
    }
}

/// Runs `argv` in the task of `meta` and streams its output as [`SandboxReply::Output`]
/// frames, then [`SandboxReply::Exited`]. Err when the master's stream went away (the command
/// is killed then).
pub async fn run(
    meta: &Path,
    sandbox: &Path,
    argv: Vec<String>,
    stdin: Input,
    timeout: Duration,
    tty: Option<TtySize>,
    tx: &mut FrameSender,
) -> Result<(), ()> {
    if argv.is_empty() || argv[0].is_empty() {
        return send_reply(
            tx,
            &refuse(SandboxErrorKind::BadRequest, "an empty command"),
        )
        .await;
    }
    let p = {
        let (meta, sandbox) = (meta.to_path_buf(), sandbox.to_path_buf());
        match tokio::task::spawn_blocking(move || TaskProcess::read(&meta, &sandbox)).await {
            Ok(Ok(p)) => p,
            Ok(Err(reply)) => return send_reply(tx, &reply).await,
            Err(e) => {
                return send_reply(tx, &refuse(SandboxErrorKind::Failed, e.to_string())).await
            }
        }
    };
    // Opened here (as root), written in the child before exec: joining the task's cgroups.
    let mut procs: Vec<OwnedFd> = Vec::new();
    for path in &p.cgroup_procs {
        match std::fs::OpenOptions::new().write(true).open(path) {
            Ok(f) => procs.push(f.into()),
            Err(e) => {
                return send_reply(
                    tx,
                    &refuse(
                        SandboxErrorKind::Failed,
                        format!("cannot join the task's cgroup {}: {e}", path.display()),
                    ),
                )
                .await
            }
        }
    }
    let fds: Vec<i32> = procs.iter().map(|f| f.as_raw_fd()).collect();
    let (uid, gid) = (p.uid, p.gid);
    let groups: Vec<libc::gid_t> = p.groups.clone();
    let mut cmd = exec_command(&p, &argv);
    if let Some(size) = tty {
        let r = run_tty(
            cmd,
            procs,
            fds,
            (uid, gid, groups),
            &argv,
            stdin,
            size,
            timeout,
            tx,
        );
        return r.await;
    }
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: `enter_task` is async-signal-safe on memory allocated before the fork.
    unsafe {
        cmd.pre_exec(move || enter_task(&fds, &groups, gid, uid));
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return send_reply(tx, &not_started(&argv[0], &e)).await,
    };
    drop(procs);
    let kill_group = group_killer(&child);
    if started(&stdin, tx).await.is_err() {
        kill_group();
        return Err(());
    }
    let pgid = child.id().map(|id| id as i32);
    let feeder = child
        .stdin
        .take()
        .map(|input| AbortOnDrop(tokio::spawn(feed(stdin, input, None, pgid))));
    let (Some(mut out), Some(mut err)) = (child.stdout.take(), child.stderr.take()) else {
        kill_group();
        return send_reply(tx, &refuse(SandboxErrorKind::Failed, "no output pipes")).await;
    };
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let (mut ob, mut eb) = (vec![0u8; SANDBOX_CHUNK], vec![0u8; SANDBOX_CHUNK]);
    let (mut out_open, mut err_open) = (true, true);
    let mut timed_out = false;
    while out_open || err_open {
        let (stream, n) = tokio::select! {
            r = out.read(&mut ob), if out_open => (1u8, r.unwrap_or(0)),
            r = err.read(&mut eb), if err_open => (2u8, r.unwrap_or(0)),
            _ = &mut deadline, if !timed_out => {
                timed_out = true;
                kill_group();
                continue;
            }
        };
        if n == 0 {
            if stream == 1 {
                out_open = false;
            } else {
                err_open = false;
            }
            continue;
        }
        let data = if stream == 1 { &ob[..n] } else { &eb[..n] };
        let frame = SandboxReply::Output {
            stream,
            data: data.to_vec(),
        };
        if send_reply(tx, &frame).await.is_err() {
            kill_group();
            return Err(());
        }
    }
    let r = exited(&mut child, deadline, timed_out, kill_group, tx).await;
    drop(feeder);
    r
}

/// A live exec's first answer once the command runs: an empty `Output` (the master has the
/// agent's answer before any output, so its client can start typing).
async fn started(input: &Input, tx: &mut FrameSender) -> Result<(), ()> {
    match input {
        Input::Live(_) => {
            let frame = SandboxReply::Output {
                stream: 1,
                data: Vec::new(),
            };
            send_reply(tx, &frame).await
        }
        Input::Bytes(_) => Ok(()),
    }
}

/// Aborts the input task when the session ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// In the child between fork and exec: joins the task's cgroups (writes to the `cgroup.procs`
/// files opened as `fds`) and becomes the task's user. Async-signal-safe: no allocation.
fn enter_task(fds: &[i32], groups: &[libc::gid_t], gid: u32, uid: u32) -> std::io::Result<()> {
    // SAFETY: plain system calls on descriptors and memory owned by the caller.
    unsafe {
        for fd in fds {
            if libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
        }
        if libc::setgroups(groups.len(), groups.as_ptr()) != 0
            || libc::setgid(gid) != 0
            || libc::setuid(uid) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The refusal of a command that could not be started.
fn not_started(program: &str, e: &std::io::Error) -> SandboxReply {
    let kind = if e.kind() == std::io::ErrorKind::NotFound {
        SandboxErrorKind::NotFound
    } else {
        SandboxErrorKind::Failed
    };
    refuse(kind, format!("{program}: {e}"))
}

/// SIGKILL to the command's process group (its own group, or its session's).
fn group_killer(child: &tokio::process::Child) -> impl Fn() {
    let pgid = child.id().map(|id| id as i32);
    move || {
        if let Some(g) = pgid {
            // SAFETY: a signal to the command's own process group.
            unsafe { libc::kill(-g, libc::SIGKILL) };
        }
    }
}

/// Waits for the command (killed at the deadline unless it was already), kills what it left in
/// its group and sends [`SandboxReply::Exited`].
async fn exited(
    child: &mut tokio::process::Child,
    mut deadline: std::pin::Pin<&mut tokio::time::Sleep>,
    timed_out: bool,
    kill_group: impl Fn(),
    tx: &mut FrameSender,
) -> Result<(), ()> {
    let status = tokio::select! {
        s = child.wait() => s,
        _ = &mut deadline, if !timed_out => {
            kill_group();
            child.wait().await
        }
    };
    kill_group();
    let reply = match status {
        Ok(s) => {
            use std::os::unix::process::ExitStatusExt;
            SandboxReply::Exited {
                code: s.code(),
                signal: s.signal(),
            }
        }
        Err(e) => refuse(SandboxErrorKind::Failed, e.to_string()),
    };
    send_reply(tx, &reply).await
}

/// Opens a pseudo-terminal of `size`: (the master side, the path of the terminal side).
fn open_pty(size: TtySize) -> std::io::Result<(std::fs::File, PathBuf)> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain libc calls on a descriptor this function owns; the name buffer outlives
    // `ptsname_r`, which NUL-terminates what it writes.
    unsafe {
        let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let master = std::fs::File::from_raw_fd(fd);
        if libc::grantpt(fd) != 0 || libc::unlockpt(fd) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut name = [0 as libc::c_char; 128];
        let rc = libc::ptsname_r(fd, name.as_mut_ptr(), name.len());
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        let ws = libc::winsize {
            ws_row: size.rows,
            ws_col: size.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        if libc::ioctl(fd, libc::TIOCSWINSZ, &ws) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let path = std::ffi::CStr::from_ptr(name.as_ptr());
        Ok((
            master,
            PathBuf::from(std::ffi::OsStr::from_bytes(path.to_bytes())),
        ))
    }
}

/// [`run`] on a pseudo-terminal: the command in a session of its own with the pty as its
/// controlling terminal; its output (standard output and error together) as `stream` 1.
#[allow(clippy::too_many_arguments)]
async fn run_tty(
    mut cmd: tokio::process::Command,
    procs: Vec<OwnedFd>,
    fds: Vec<i32>,
    (uid, gid, groups): (u32, u32, Vec<libc::gid_t>),
    argv: &[String],
    stdin: Input,
    size: TtySize,
    timeout: Duration,
    tx: &mut FrameSender,
) -> Result<(), ()> {
    let failed =
        |what: &str, e: std::io::Error| refuse(SandboxErrorKind::Failed, format!("{what}: {e}"));
    let (master, slave_path) = match open_pty(size) {
        Ok(p) => p,
        Err(e) => return send_reply(tx, &failed("cannot open a terminal", e)).await,
    };
    let slave = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(&slave_path)
    {
        Ok(f) => f,
        Err(e) => return send_reply(tx, &failed("cannot open the terminal", e)).await,
    };
    let ends = (
        slave.try_clone(),
        slave.try_clone(),
        master.try_clone(),
        master.try_clone(),
    );
    let (Ok(out_end), Ok(err_end), Ok(writer), Ok(resizer)) = ends else {
        return send_reply(
            tx,
            &refuse(SandboxErrorKind::Failed, "cannot dup the terminal"),
        )
        .await;
    };
    cmd.stdin(Stdio::from(slave))
        .stdout(Stdio::from(out_end))
        .stderr(Stdio::from(err_end))
        .kill_on_drop(true);
    // SAFETY: only async-signal-safe calls (setsid, ioctl, write, setgroups, setgid, setuid)
    // on memory allocated before the fork. No process_group: setsid makes the child the
    // leader of a new session and process group (and fails in a group leader).
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            enter_task(&fds, &groups, gid, uid)
        });
    }
    let spawned = cmd.spawn();
    // The parent's copies of the terminal side go with `cmd`: the master reads EIO once the
    // command and whatever it left on the terminal are gone.
    drop(cmd);
    drop(procs);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => return send_reply(tx, &not_started(&argv[0], &e)).await,
    };
    let kill_group = group_killer(&child);
    if started(&stdin, tx).await.is_err() {
        kill_group();
        return Err(());
    }
    let pgid = child.id().map(|id| id as i32);
    let writer = tokio::fs::File::from_std(writer);
    let feeder = AbortOnDrop(tokio::spawn(feed(stdin, writer, Some(resizer), pgid)));
    let mut reader = tokio::fs::File::from_std(master);
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut buf = vec![0u8; SANDBOX_CHUNK];
    let mut timed_out = false;
    loop {
        let n = tokio::select! {
            // EIO: the terminal side is closed everywhere.
            r = reader.read(&mut buf) => r.unwrap_or(0),
            _ = &mut deadline, if !timed_out => {
                timed_out = true;
                kill_group();
                continue;
            }
        };
        if n == 0 {
            break;
        }
        let frame = SandboxReply::Output {
            stream: 1,
            data: buf[..n].to_vec(),
        };
        if send_reply(tx, &frame).await.is_err() {
            kill_group();
            return Err(());
        }
    }
    let r = exited(&mut child, deadline, timed_out, kill_group, tx).await;
    drop(feeder);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_hierarchy_of_the_task_is_joined_once() {
        let layout = CgroupLayout::V1 {
            mounts: [
                ("cpu", "/sys/fs/cgroup/cpu,cpuacct"),
                ("cpuacct", "/sys/fs/cgroup/cpu,cpuacct"),
                ("memory", "/sys/fs/cgroup/memory"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), PathBuf::from(v)))
            .collect(),
        };
        let text =
            "12:memory:/gantry/slot-3\n4:cpu,cpuacct:/gantry/slot-3\n1:name=systemd:/user.slice\n";
        assert_eq!(
            cgroup_procs(&layout, text),
            vec![
                PathBuf::from("/sys/fs/cgroup/memory/gantry/slot-3/cgroup.procs"),
                PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/gantry/slot-3/cgroup.procs"),
            ]
        );
        let v2 = CgroupLayout::V2 {
            mount: PathBuf::from("/sys/fs/cgroup"),
        };
        assert_eq!(
            cgroup_procs(&v2, "0::/gantry/t1\n"),
            vec![PathBuf::from("/sys/fs/cgroup/gantry/t1/cgroup.procs")]
        );
    }
}
