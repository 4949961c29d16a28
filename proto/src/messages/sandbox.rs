//! Task sandboxes, master -> agent (protocol v9; v10: exec on a terminal): the master opens one more bidirectional QUIC
//! stream on an agent's connection per operator request (logs, files, exec), sends one
//! [`SandboxRequest`] frame, and reads [`SandboxReply`] frames until the agent finishes the
//! stream. The agent trusts the request because the connection is the master's (mutual TLS);
//! the master has already checked who asked (an operator with the ACL grant, or the task's own
//! framework principal). Data frames carry at most [`SANDBOX_CHUNK`] bytes.

use serde::{Deserialize, Serialize};

use super::super::ids::TaskId;

/// The most bytes one [`SandboxReply::Data`] or [`SandboxReply::Output`] frame carries.
pub const SANDBOX_CHUNK: usize = 64 * 1024;
/// The most bytes one [`SandboxRequest::Read`] returns.
pub const SANDBOX_MAX_READ: u64 = 1024 * 1024;
/// The most entries one [`SandboxRequest::List`] returns.
pub const SANDBOX_MAX_ENTRIES: u32 = 1000;
/// The most bytes an exec's standard input may have (it comes in the request).
pub const SANDBOX_MAX_STDIN: usize = 256 * 1024;

/// What the master asks of an agent about one task's sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SandboxRequest {
    /// The entries of a directory in the sandbox (`path` relative to it; empty: the sandbox),
    /// sorted by name, `offset` entries skipped, at most `limit` (capped at
    /// [`SANDBOX_MAX_ENTRIES`]). Answered by one [`SandboxReply::Entries`].
    List {
        /// The task.
        task_id: TaskId,
        /// A relative path inside the sandbox.
        path: String,
        /// Entries to skip.
        offset: u32,
        /// Entries to return at most.
        limit: u32,
    },
    /// Bytes of a file from `offset`, at most `length` (capped at [`SANDBOX_MAX_READ`]); with
    /// `follow`, keeps sending what is appended until the task has ended and everything is
    /// sent (`tail -f`). Answered by [`SandboxReply::Data`] frames, the last with `eof`.
    Read {
        /// The task.
        task_id: TaskId,
        /// A relative path inside the sandbox (`stdout`, `stderr`, ...).
        path: String,
        /// Where to start; `None`: the last `length` bytes (a tail).
        offset: Option<u64>,
        /// Bytes at most (without `follow`).
        length: u64,
        /// Keep sending what is appended.
        follow: bool,
    },
    /// Runs `command` inside the running task: its user, cgroups, working directory and
    /// environment. Answered by [`SandboxReply::Output`] frames and one [`SandboxReply::Exited`].
    Exec {
        /// The task.
        task_id: TaskId,
        /// The program and its arguments (looked up in the task's `PATH`).
        command: Vec<String>,
        /// Standard input (at most [`SANDBOX_MAX_STDIN`] bytes), then end of file.
        stdin: Vec<u8>,
        /// Who asked (`operator:NAME` / `framework:PRINCIPAL`), for the agent's log.
        principal: String,
        /// Killed after this many seconds (0: the agent's limit).
        timeout_secs: u32,
        /// Run on a pseudo-terminal of this size (protocol v10): the command's controlling
        /// terminal and its standard input, output and error; everything comes back as
        /// `stream` 1. `None`: pipes, as before.
        tty: Option<TtySize>,
    },
}

/// A terminal's window size, in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TtySize {
    /// Rows (lines).
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

impl SandboxRequest {
    /// The task the request is about.
    pub fn task_id(&self) -> &TaskId {
        match self {
            SandboxRequest::List { task_id, .. }
            | SandboxRequest::Read { task_id, .. }
            | SandboxRequest::Exec { task_id, .. } => task_id,
        }
    }
}

/// One entry of a sandbox directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxEntry {
    /// The name (lossy UTF-8).
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    /// Bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Last modification, Unix milliseconds.
    pub mtime_ms: u64,
}

/// Why an agent refused a sandbox request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SandboxErrorKind {
    /// No such task, sandbox or file (collected, never there).
    NotFound,
    /// A path outside the sandbox (`..`, absolute, through a symlink) or a file the task's user
    /// does not own.
    Forbidden,
    /// A request that makes no sense (a directory read as a file, an empty command).
    BadRequest,
    /// Exec into a task that is not running.
    NotRunning,
    /// Too many sandbox streams at once on this agent.
    Busy,
    /// Anything else (an I/O error).
    Failed,
}

/// What an agent answers on a sandbox stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SandboxReply {
    /// A directory page.
    Entries {
        /// The entries, by name.
        entries: Vec<SandboxEntry>,
        /// Entries in the directory in all.
        total: u32,
    },
    /// File bytes at `offset`.
    Data {
        /// Where `data` starts in the file.
        offset: u64,
        /// The bytes (at most [`SANDBOX_CHUNK`]).
        data: Vec<u8>,
        /// The file's size when read.
        size: u64,
        /// Nothing more will come on this stream.
        eof: bool,
    },
    /// Exec output: `stream` 1 is standard output, 2 standard error.
    Output {
        /// 1 or 2.
        stream: u8,
        /// The bytes (at most [`SANDBOX_CHUNK`]).
        data: Vec<u8>,
    },
    /// The exec'd command ended.
    Exited {
        /// Its exit code, when it exited.
        code: Option<i32>,
        /// The signal that ended it, when one did (a timeout kills with SIGKILL).
        signal: Option<i32>,
    },
    /// Refused or failed; the stream ends.
    Error {
        /// Why, by kind.
        kind: SandboxErrorKind,
        /// Why, in words.
        message: String,
    },
}
