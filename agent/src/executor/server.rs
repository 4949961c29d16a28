//! The agent's supervisor process (`gantry-supervise --server`): one per agent run, it starts
//! every task the agent asks for, waits for them and records how each ended.
//!
//! ```text
//! agent --Request (JSON line on stdin)--> supervisor --clone/exec--> task (own process group,
//!   ^                                        |                       cgroups, user, sandbox)
//!   +--Reply::Started / Reply::Exited <------+  (JSON lines on stdout; META/ files as records)
//! ```
//!
//! A task used to be two process starts: a supervisor of its own, then the task. The long-lived
//! supervisor makes it one, as a bare spawner does. What each task gets is unchanged (see
//! [`super::supervise`]): the launch claimed in its record ([`super::record`]) with the
//! supervisor's pid and start time before the task starts (a restarted agent that claimed it
//! first wins: the task never runs unseen), then the task's pid and its exit status.
//!
//! The supervisor runs in its own session and ignores the terminal's signals, so it outlives the
//! agent: a restarted agent finds its tasks' outcomes in their records and starts a
//! supervisor of its own for new tasks. It exits once the agent has closed its stdin and its
//! last task has ended.
//!
//! Inside: the main thread reads requests; [`SPAWNERS`] threads start tasks ([`super::spawn`]: a vfork-style
//! clone that waits for the child's `exec`, which includes joining its cgroups); one thread reaps them all
//! (`waitpid(-1)`). A task that ends before its spawner recorded it waits in `early`.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::record;
use super::spawn::SpawnError;
use super::supervise;
use super::ExitStatus;

/// Threads starting tasks at once.
pub const SPAWNERS: usize = 4;

/// One task to start: the per-task supervisor's arguments ([`supervise::command_line`]) and the
/// task's whole environment.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Request {
    pub id: u64,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// What the supervisor tells the agent about a request.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reply {
    /// The task runs as `pid` (its process group); 0 when it could not start (an `Exited`
    /// with code 127 follows, the reason in the sandbox's `stderr`).
    Started { id: u64, pid: i32 },
    /// The task ended (its exit is in its record).
    Exited { id: u64, status: ExitStatus },
    /// Not started: a restarted agent had claimed the launch, or the request was malformed.
    Refused { id: u64, reason: String },
}

#[derive(Default)]
struct State {
    /// Started tasks by pid: the request and the meta directory.
    running: HashMap<i32, (u64, PathBuf)>,
    /// Reaped before their spawner recorded them.
    early: HashMap<i32, ExitStatus>,
    /// Requests being started.
    spawning: usize,
    /// The agent closed its end: no more requests.
    closed: bool,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    out: Mutex<Box<dyn Write + Send>>,
    /// This process's `PID START` for the records' `supervisor` line.
    me: String,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn reply(&self, reply: &Reply) {
        let Ok(mut line) = serde_json::to_vec(reply) else {
            return;
        };
        line.push(b'\n');
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        // The agent may be gone (restarting): the files are the record.
        let _ = out.write_all(&line).and_then(|_| out.flush());
    }

    /// Records a task's end and tells the agent.
    fn finish(&self, id: u64, meta: &std::path::Path, status: ExitStatus) {
        let json = serde_json::to_string(&status).unwrap_or_else(|_| "{}".into());
        if let Err(e) = record::append(meta, "exit", &json, false) {
            eprintln!(
                "gantry-supervise: recording the exit of {}: {e}",
                meta.display()
            );
        }
        self.reply(&Reply::Exited { id, status });
    }
}

/// The supervisor's main: serves requests from stdin until it closes and the last task ended.
/// Returns the process's exit code.
pub fn serve() -> i32 {
    // SAFETY: setsid and signal only change this process's session and dispositions.
    unsafe {
        libc::setsid();
        for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM, libc::SIGPIPE] {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
    let me = std::process::id() as i32;
    let start = super::process_start_time(me).unwrap_or(0);
    let shared = Arc::new(Shared {
        state: Mutex::new(State::default()),
        changed: Condvar::new(),
        out: Mutex::new(Box::new(std::io::stdout())),
        me: format!("{me} {start}"),
    });
    let reaper = {
        let shared = shared.clone();
        std::thread::spawn(move || reap(&shared))
    };
    let (jobs, queue) = mpsc::channel::<Request>();
    let queue = Arc::new(Mutex::new(queue));
    let spawners: Vec<_> = (0..SPAWNERS)
        .map(|_| {
            let (shared, queue) = (shared.clone(), queue.clone());
            std::thread::spawn(move || loop {
                let job = match queue.lock() {
                    Ok(q) => q.recv(),
                    Err(_) => return,
                };
                match job {
                    Ok(request) => start_task(&shared, request),
                    Err(_) => return,
                }
            })
        })
        .collect();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Request>(&line) {
            Ok(request) => {
                shared.state().spawning += 1;
                if jobs.send(request).is_err() {
                    break;
                }
            }
            Err(e) => eprintln!("gantry-supervise: malformed request: {e}"),
        }
    }
    drop(jobs);
    for s in spawners {
        let _ = s.join();
    }
    shared.state().closed = true;
    shared.changed.notify_all();
    let _ = reaper.join();
    0
}

/// Starts one requested task (a spawner thread).
fn start_task(shared: &Shared, request: Request) {
    let id = request.id;
    let done = |shared: &Shared| {
        let mut st = shared.state();
        st.spawning -= 1;
        drop(st);
        shared.changed.notify_all();
    };
    let spec = match supervise::parse_args(request.args.into_iter().map(Into::into)) {
        Ok(spec) => spec,
        Err(reason) => {
            done(shared);
            shared.reply(&Reply::Refused { id, reason });
            return;
        }
    };
    let refused =
        match record::claim_for_supervisor(&spec.meta, &shared.me, spec.cgroup_base.as_deref()) {
            Ok(true) => None,
            Ok(false) => Some("a restarted agent gave this launch up".to_string()),
            Err(e) => Some(format!("writing the launch record: {e}")),
        };
    if let Some(reason) = refused {
        done(shared);
        shared.reply(&Reply::Refused { id, reason });
        return;
    }
    let started = supervise::task_command(&spec, &request.env)
        .map_err(SpawnError::Clone)
        .and_then(|process| process.spawn());
    let pid = match started {
        Ok(pid) => {
            let _ = record::append(&spec.meta, "task", &pid.to_string(), false);
            shared.reply(&Reply::Started { id, pid });
            pid
        }
        // The child failed before its exec (a cgroup, the user, the program) and exited with
        // 127: reaped like any task, it reports that.
        Err(SpawnError::Child { pid, error }) => {
            supervise::report_start_failure(&spec, &error);
            shared.reply(&Reply::Started { id, pid: 0 });
            pid
        }
        // No process at all (the sandbox's outputs, or the kernel refused the clone).
        Err(SpawnError::Clone(error)) => {
            done(shared);
            supervise::report_start_failure(&spec, &error);
            shared.reply(&Reply::Started { id, pid: 0 });
            shared.finish(
                id,
                &spec.meta,
                ExitStatus {
                    code: Some(127),
                    signal: None,
                },
            );
            return;
        }
    };
    let mut st = shared.state();
    let early = st.early.remove(&pid);
    if early.is_none() {
        st.running.insert(pid, (id, spec.meta.clone()));
    }
    st.spawning -= 1;
    drop(st);
    shared.changed.notify_all();
    if let Some(status) = early {
        shared.finish(id, &spec.meta, status);
    }
}

/// Reaps every task (the reaper thread) until the agent closed its end and none is left.
fn reap(shared: &Shared) {
    loop {
        {
            let mut st = shared.state();
            while st.running.is_empty() && st.spawning == 0 {
                if st.closed {
                    return;
                }
                st = shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        }
        let mut raw = 0;
        // SAFETY: waitpid writes the status into a local integer.
        let pid = unsafe { libc::waitpid(-1, &mut raw, 0) };
        if pid < 0 {
            // ECHILD: the tasks being started are not forked yet; EINTR: again.
            let st = shared.state();
            let _ = shared.changed.wait_timeout(st, Duration::from_millis(5));
            continue;
        }
        let status = if libc::WIFEXITED(raw) {
            ExitStatus {
                code: Some(libc::WEXITSTATUS(raw)),
                signal: None,
            }
        } else if libc::WIFSIGNALED(raw) {
            ExitStatus {
                code: None,
                signal: Some(libc::WTERMSIG(raw)),
            }
        } else {
            continue;
        };
        let mut st = shared.state();
        match st.running.remove(&pid) {
            Some((id, meta)) => {
                drop(st);
                shared.finish(id, &meta, status);
            }
            None => {
                st.early.insert(pid, status);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_are_json_lines() {
        let r = Request {
            id: 7,
            args: vec!["--sandbox".into(), "s\nx".into()],
            env: vec![("A".into(), "b c".into())],
        };
        let line = serde_json::to_string(&r).unwrap();
        assert!(!line.contains('\n'));
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), r);
        let reply = Reply::Exited {
            id: 7,
            status: ExitStatus {
                code: None,
                signal: Some(9),
            },
        };
        let line = serde_json::to_string(&reply).unwrap();
        assert!(line.contains("\"kind\":\"exited\""), "{line}");
        assert_eq!(serde_json::from_str::<Reply>(&line).unwrap(), reply);
    }
}
