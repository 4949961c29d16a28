//! A task's sandbox for operators (protocol v9): the master opens a bidirectional QUIC stream
//! on this agent's connection per request ([`gantry_proto::SandboxRequest`]) and this module
//! answers it. Nothing here listens on a port: the only peer that can ask is the master the
//! agent connected to (mutual TLS), which has already checked who the operator or framework
//! is and that it may see the task.
//!
//! - [`paths`]: a relative path opened strictly inside the sandbox (`openat2` with
//!   `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`: no `..`, no absolute path, no symlink on the way,
//!   checked by the kernel at open, so a task swapping a directory for a symlink cannot race
//!   it), and only files the sandbox's owner (the task's user) owns, so a hard link to a file
//!   of root's is not served either.
//! - `serve`/`handle` (here): list a directory (paged), read a file (bounded), follow a file
//!   (`tail -f`: polls what is appended until the task has ended and all is sent), every frame
//!   under a write deadline, so a reader that stops reading lets go of the agent.
//! - [`exec`]: a command inside a running task: the task leader's user, groups, cgroups,
//!   working directory and environment, read from `/proc` (the launch record names the
//!   leader). [`exec::exec_command`] is the seam a container runtime replaces (`runc exec`).
//!   A live exec (protocol v11, [`SandboxRequest::ExecLive`]) reads [`SandboxInput`] frames
//!   (each at most [`MAX_INPUT`] bytes) from the same stream while the command runs.
//!
//! Sandboxes of ended tasks stay readable until the agent's garbage collection removes them
//! (`--gc-delay`); exec needs a running task. Streams are bounded per agent
//! ([`MAX_STREAMS`]; QUIC flow control bounds what one stream has in flight).

pub mod exec;
pub mod paths;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gantry_proto::*;
use gantry_transport::framing::read_frame_max;
use gantry_transport::FrameSender;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::Semaphore;

/// Sandbox streams served at once by one agent; past it a request is answered `Busy`.
pub const MAX_STREAMS: usize = 32;
/// Exec sessions at once on one agent (the master also limits them per principal).
pub const MAX_EXECS: usize = 8;
/// A frame the reader has not taken within this long ends the stream.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(30);
/// How long the request frame may take to arrive.
const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
/// The largest request frame (an exec with its standard input).
const MAX_REQUEST: usize = SANDBOX_MAX_STDIN + 64 * 1024;
/// The largest [`SandboxInput`] frame of a live exec.
pub const MAX_INPUT: usize = SANDBOX_CHUNK + 64;
/// How often a follow looks for appended bytes.
const FOLLOW_POLL: Duration = Duration::from_millis(200);
/// An exec's time limit when the request names none (and the most it may name).
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(3600);

/// What the handlers need: where sandboxes and meta directories are, and the bounds.
pub struct SandboxApi {
    work_dir: PathBuf,
    /// The agent's container settings: persistent volumes (protocol v12,
    /// [`SandboxRequest::Volume`], answered by `crate::container::volumes::answer`).
    containers: Option<Arc<crate::container::ContainerConfig>>,
    streams: Arc<Semaphore>,
    execs: Arc<Semaphore>,
}

impl SandboxApi {
    /// Sandboxes under `WORK_DIR/sandboxes/TASK_ID`, launch records under `WORK_DIR/meta`.
    pub fn new(work_dir: PathBuf) -> Self {
        Self {
            work_dir,
            containers: None,
            streams: Arc::new(Semaphore::new(MAX_STREAMS)),
            execs: Arc::new(Semaphore::new(MAX_EXECS)),
        }
    }

    /// Persistent volumes are those of `containers` (its volume lock shared with launches).
    pub fn with_containers(mut self, containers: Arc<crate::container::ContainerConfig>) -> Self {
        self.containers = Some(containers);
        self
    }

    fn sandbox(&self, task: &TaskId) -> PathBuf {
        self.work_dir.join("sandboxes").join(task.to_string())
    }

    fn meta(&self, task: &TaskId) -> PathBuf {
        self.work_dir.join("meta").join(task.to_string())
    }

    /// True once the task has ended (or was never launched here): a follow stops at the end
    /// of the file then.
    fn ended(&self, task: &TaskId) -> bool {
        let meta = self.meta(task);
        match crate::executor::find_launched(&meta) {
            Some(l) => !crate::executor::still_running(&l, &meta),
            None => true,
        }
    }
}

/// A refusal as the reply that ends a stream.
pub(crate) fn refuse(kind: SandboxErrorKind, message: impl Into<String>) -> SandboxReply {
    SandboxReply::Error {
        kind,
        message: message.into(),
    }
}

/// Accepts the master's sandbox streams on `conn` until it closes (the session's hook: one
/// per connection to the leading master).
pub async fn serve(conn: quinn::Connection, api: Arc<SandboxApi>) {
    loop {
        let Ok((send, recv)) = conn.accept_bi().await else {
            return;
        };
        let api = api.clone();
        tokio::spawn(async move {
            let mut tx = FrameSender(send);
            let Ok(permit) = api.streams.clone().try_acquire_owned() else {
                let _ = send_reply(
                    &mut tx,
                    &refuse(
                        SandboxErrorKind::Busy,
                        format!("{MAX_STREAMS} sandbox streams are open on this agent"),
                    ),
                )
                .await;
                let _ = tx.0.finish();
                return;
            };
            handle(&api, tx, recv).await;
            drop(permit);
        });
    }
}

/// Sends one reply under the write deadline.
pub(crate) async fn send_reply(tx: &mut FrameSender, reply: &SandboxReply) -> Result<(), ()> {
    match tokio::time::timeout(WRITE_DEADLINE, tx.send(reply)).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(()),
    }
}

/// A slot for one more exec session on this agent; `None` when [`MAX_EXECS`] run already (the
/// refusal is sent and the stream finished).
async fn exec_slot(
    api: &SandboxApi,
    tx: &mut FrameSender,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    if let Ok(permit) = api.execs.clone().try_acquire_owned() {
        return Some(permit);
    }
    let busy = format!("{MAX_EXECS} exec sessions are running on this agent");
    let _ = send_reply(tx, &refuse(SandboxErrorKind::Busy, busy)).await;
    let _ = tx.0.finish();
    None
}

/// An exec's time limit: what it asks for (`0`: none), at most [`EXEC_TIMEOUT`].
fn exec_timeout(secs: u32) -> Duration {
    match secs {
        0 => EXEC_TIMEOUT,
        s => Duration::from_secs(u64::from(s)).min(EXEC_TIMEOUT),
    }
}

async fn handle(api: &SandboxApi, mut tx: FrameSender, mut rx: quinn::RecvStream) {
    let req = match tokio::time::timeout(
        REQUEST_DEADLINE,
        read_frame_max::<_, SandboxRequest>(&mut rx, MAX_REQUEST),
    )
    .await
    {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tracing::warn!("sandbox stream: bad request: {e}");
            let _ = send_reply(
                &mut tx,
                &refuse(SandboxErrorKind::BadRequest, e.to_string()),
            )
            .await;
            let _ = tx.0.finish();
            return;
        }
        Err(_) => return,
    };
    let req = match req {
        SandboxRequest::Volume(vreq) => {
            let reply = match api.containers.clone() {
                Some(cfg) => {
                    let meta = api.work_dir.join("meta");
                    tokio::task::spawn_blocking(move || {
                        SandboxReply::Volume(crate::container::volumes::answer(&cfg, &meta, vreq))
                    })
                    .await
                    .unwrap_or_else(|e| refuse(SandboxErrorKind::Failed, e.to_string()))
                }
                None => refuse(
                    SandboxErrorKind::Failed,
                    "this agent serves no persistent volumes",
                ),
            };
            if send_reply(&mut tx, &reply).await.is_ok() {
                let _ = tx.0.finish();
                let _ = tokio::time::timeout(WRITE_DEADLINE, tx.0.stopped()).await;
            }
            return;
        }
        r => r,
    };
    let Some(&task) = req.task_id() else {
        return;
    };
    let sandbox = api.sandbox(&task);
    let result = match req {
        SandboxRequest::List {
            path,
            offset,
            limit,
            ..
        } => {
            let reply = tokio::task::spawn_blocking(move || {
                paths::list(&sandbox, &path, offset, limit.min(SANDBOX_MAX_ENTRIES))
            })
            .await
            .unwrap_or_else(|e| Err(refuse(SandboxErrorKind::Failed, e.to_string())));
            send_reply(&mut tx, &reply.unwrap_or_else(|e| e)).await
        }
        SandboxRequest::Read {
            path,
            offset,
            length,
            follow,
            ..
        } => read(api, &task, &sandbox, &path, offset, length, follow, &mut tx).await,
        SandboxRequest::Exec {
            command,
            stdin,
            principal,
            timeout_secs,
            tty,
            ..
        } => {
            let Some(_permit) = exec_slot(api, &mut tx).await else {
                return;
            };
            let timeout = exec_timeout(timeout_secs);
            tracing::info!(%task, %principal, ?command, ?tty, "exec in a task");
            let meta = api.meta(&task);
            let input = exec::Input::Bytes(stdin);
            exec::run(&meta, &sandbox, command, input, timeout, tty, &mut tx).await
        }
        SandboxRequest::ExecLive {
            command,
            principal,
            timeout_secs,
            tty,
            ..
        } => {
            let Some(_permit) = exec_slot(api, &mut tx).await else {
                return;
            };
            let timeout = exec_timeout(timeout_secs);
            tracing::info!(%task, %principal, ?command, ?tty, "live exec in a task");
            let meta = api.meta(&task);
            let input = exec::Input::Live(rx);
            exec::run(&meta, &sandbox, command, input, timeout, tty, &mut tx).await
        }
        // Answered above.
        SandboxRequest::Volume(_) => return,
    };
    if result.is_ok() {
        let _ = tx.0.finish();
        // Let the last frames reach the master before the stream is dropped.
        let _ = tokio::time::timeout(WRITE_DEADLINE, tx.0.stopped()).await;
    }
}

/// A read or a follow of one file.
#[allow(clippy::too_many_arguments)]
async fn read(
    api: &SandboxApi,
    task: &TaskId,
    sandbox: &std::path::Path,
    path: &str,
    offset: Option<u64>,
    length: u64,
    follow: bool,
    tx: &mut FrameSender,
) -> Result<(), ()> {
    let file = {
        let (sandbox, path) = (sandbox.to_path_buf(), path.to_string());
        tokio::task::spawn_blocking(move || paths::open_file(&sandbox, &path))
            .await
            .unwrap_or_else(|e| Err(refuse(SandboxErrorKind::Failed, e.to_string())))
    };
    let file = match file {
        Ok(f) => f,
        Err(reply) => return send_reply(tx, &reply).await,
    };
    let mut file = tokio::fs::File::from_std(file);
    let size = match file.metadata().await {
        Ok(m) => m.len(),
        Err(e) => return send_reply(tx, &refuse(SandboxErrorKind::Failed, e.to_string())).await,
    };
    let length = length.min(SANDBOX_MAX_READ);
    let mut pos = match offset {
        Some(o) => o.min(size),
        None => size.saturating_sub(length),
    };
    // Without follow: at most `length` bytes from `pos`.
    let end = if follow {
        u64::MAX
    } else {
        pos.saturating_add(length).min(size)
    };
    let mut buf = vec![0u8; SANDBOX_CHUNK];
    loop {
        let size = file.metadata().await.map(|m| m.len()).unwrap_or(pos);
        if size < pos {
            // Truncated: follow from its new end.
            pos = size;
        }
        let want = (end.min(size).saturating_sub(pos)).min(SANDBOX_CHUNK as u64) as usize;
        if want > 0 {
            if file.seek(std::io::SeekFrom::Start(pos)).await.is_err() {
                return send_reply(tx, &refuse(SandboxErrorKind::Failed, "seek failed")).await;
            }
            let n = match file.read(&mut buf[..want]).await {
                Ok(n) => n,
                Err(e) => {
                    return send_reply(tx, &refuse(SandboxErrorKind::Failed, e.to_string())).await
                }
            };
            if n > 0 {
                let at = pos;
                pos += n as u64;
                let done = !follow && pos >= end.min(size);
                send_reply(
                    tx,
                    &SandboxReply::Data {
                        offset: at,
                        data: buf[..n].to_vec(),
                        size,
                        eof: done,
                    },
                )
                .await?;
                if done {
                    return Ok(());
                }
                continue;
            }
        }
        if !follow {
            return send_reply(
                tx,
                &SandboxReply::Data {
                    offset: pos,
                    data: Vec::new(),
                    size,
                    eof: true,
                },
            )
            .await;
        }
        // Caught up. A task that has ended writes nothing more: one last look, then done.
        if api.ended(task) {
            let size = file.metadata().await.map(|m| m.len()).unwrap_or(pos);
            if size > pos {
                continue;
            }
            return send_reply(
                tx,
                &SandboxReply::Data {
                    offset: pos,
                    data: Vec::new(),
                    size,
                    eof: true,
                },
            )
            .await;
        }
        // The master gave up on the stream (its reader went away): stop polling.
        tokio::select! {
            _ = tokio::time::sleep(FOLLOW_POLL) => {}
            _ = tx.0.stopped() => return Err(()),
        }
    }
}
