//! The agent's end of its supervisor process ([`super::server`]): started on the first launch
//! (and again after it died), requests written as JSON lines to its stdin by one writer task,
//! replies read from its stdout by one reader task and handed to the launch waiting for them.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::server::{Reply, Request};
use super::{ExecError, ExitStatus, Launched, Prepared, SupervisorCommand};

/// How long a launch waits for the supervisor to report the task started.
const START_TIMEOUT: Duration = Duration::from_secs(30);

type StartReply = Result<i32, String>;

struct Pending {
    started: Option<oneshot::Sender<StartReply>>,
    exited: oneshot::Sender<ExitStatus>,
}

type PendingMap = Arc<Mutex<HashMap<u64, Pending>>>;

/// One running supervisor process.
struct Conn {
    requests: mpsc::UnboundedSender<Vec<u8>>,
    pending: PendingMap,
    closed: Arc<AtomicBool>,
    pid: i32,
    start: u64,
}

/// Starts tasks through the agent's supervisor process.
pub struct SupervisorClient {
    command: SupervisorCommand,
    conn: Mutex<Option<Arc<Conn>>>,
    next_id: AtomicU64,
}

impl SupervisorClient {
    pub fn new(command: SupervisorCommand) -> Self {
        SupervisorClient {
            command,
            conn: Mutex::new(None),
            next_id: AtomicU64::new(1),
        }
    }

    /// The running supervisor, started if there is none (or it ended).
    fn conn(&self) -> Result<Arc<Conn>, ExecError> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = conn.as_ref().filter(|c| !c.closed.load(Ordering::Acquire)) {
            return Ok(c.clone());
        }
        let c = Arc::new(self.spawn()?);
        *conn = Some(c.clone());
        Ok(c)
    }

    fn spawn(&self) -> Result<Conn, ExecError> {
        let mut cmd = tokio::process::Command::new(&self.command.program);
        cmd.args(&self.command.prefix).arg("--server");
        // Each task's environment is sent whole with its request.
        cmd.env_clear();
        cmd.current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(false);
        let mut child = cmd.spawn().map_err(ExecError::Spawn)?;
        let pid = child
            .id()
            .map(|p| p as i32)
            .ok_or_else(|| ExecError::NoPid("the supervisor exited at once".into()))?;
        let start = super::process_start_time(pid).unwrap_or(0);
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(ExecError::NoPid(
                "the supervisor's pipes are missing".into(),
            ));
        };
        let closed = Arc::new(AtomicBool::new(false));
        let pending: PendingMap = Arc::default();
        let (requests, mut queue) = mpsc::unbounded_channel::<Vec<u8>>();
        {
            let closed = closed.clone();
            tokio::spawn(async move {
                while let Some(first) = queue.recv().await {
                    // A burst of launches goes out in one write.
                    let mut buf = first;
                    while let Ok(more) = queue.try_recv() {
                        buf.extend_from_slice(&more);
                    }
                    if stdin.write_all(&buf).await.is_err() {
                        closed.store(true, Ordering::Release);
                        break;
                    }
                }
            });
        }
        {
            let (closed, pending) = (closed.clone(), pending.clone());
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    match serde_json::from_str::<Reply>(&line) {
                        Ok(reply) => dispatch(&pending, reply),
                        Err(e) => tracing::warn!("the supervisor's reply {line:?}: {e}"),
                    }
                }
                closed.store(true, Ordering::Release);
                // Its launches learn it ended (their tasks' exit files are read instead).
                pending.lock().unwrap_or_else(|p| p.into_inner()).clear();
                match child.wait().await {
                    Ok(s) if s.success() => tracing::debug!(pid, "the supervisor ended"),
                    Ok(s) => tracing::warn!(pid, "the supervisor ended: {s}"),
                    Err(e) => tracing::warn!(pid, "waiting for the supervisor: {e}"),
                }
            });
        }
        tracing::debug!(pid, "started the supervisor");
        Ok(Conn {
            requests,
            pending,
            closed,
            pid,
            start,
        })
    }

    /// Starts a task (the arguments and environment from [`super::prepare`]): once it runs, its
    /// [`Launched`] record and the receiver of its exit status. The receiver fails when the
    /// supervisor died first: the task's launch record is then the only one.
    pub async fn launch(
        &self,
        task: Prepared,
        meta: &Path,
    ) -> Result<(Launched, oneshot::Receiver<ExitStatus>), ExecError> {
        let conn = self.conn()?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (started_tx, started_rx) = oneshot::channel();
        let (exited_tx, exited_rx) = oneshot::channel();
        let forget = || {
            conn.pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        };
        conn.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                id,
                Pending {
                    started: Some(started_tx),
                    exited: exited_tx,
                },
            );
        let mut line = serde_json::to_vec(&Request {
            id,
            args: task.args,
            env: task.env,
        })
        .map_err(|e| ExecError::NoPid(format!("encoding the request: {e}")))?;
        line.push(b'\n');
        if conn.closed.load(Ordering::Acquire) || conn.requests.send(line).is_err() {
            forget();
            return Err(ExecError::NoPid("the supervisor ended".into()));
        }
        let pid = match tokio::time::timeout(START_TIMEOUT, started_rx).await {
            Ok(Ok(Ok(pid))) => pid,
            Ok(Ok(Err(reason))) => return Err(ExecError::NoPid(reason)),
            // It ended before it said: the pid file is the record, if the task started.
            Ok(Err(_)) => match super::read_task_pgid(meta) {
                Some(pid) => pid,
                None => return Err(ExecError::NoPid("the supervisor ended".into())),
            },
            Err(_) => {
                forget();
                return Err(ExecError::NoPid("timed out after 30 s".into()));
            }
        };
        Ok((
            Launched {
                supervisor_pid: conn.pid,
                task_pgid: pid,
                supervisor_start: conn.start,
            },
            exited_rx,
        ))
    }
}

fn dispatch(pending: &PendingMap, reply: Reply) {
    let mut pending = pending.lock().unwrap_or_else(|p| p.into_inner());
    match reply {
        Reply::Started { id, pid } => {
            if let Some(tx) = pending.get_mut(&id).and_then(|p| p.started.take()) {
                let _ = tx.send(Ok(pid));
            }
        }
        Reply::Exited { id, status } => {
            if let Some(p) = pending.remove(&id) {
                let _ = p.exited.send(status);
            }
        }
        Reply::Refused { id, reason } => {
            if let Some(tx) = pending.remove(&id).and_then(|mut p| p.started.take()) {
                let _ = tx.send(Err(reason));
            }
        }
    }
}
