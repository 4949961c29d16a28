//! Task sandboxes, master -> agent (protocol v9; v10: exec on a terminal; v11: live exec,
//! [`SandboxRequest::ExecLive`] then [`SandboxInput`] frames, and the operator's
//! [`exec_frame`] codec): the master opens one more bidirectional QUIC
//! stream on an agent's connection per operator request (logs, files, exec), sends one
//! [`SandboxRequest`] frame, and reads [`SandboxReply`] frames until the agent finishes the
//! stream. The agent trusts the request because the connection is the master's (mutual TLS);
//! the master has already checked who asked (an operator with the ACL grant, or the task's own
//! framework principal). Data frames carry at most [`SANDBOX_CHUNK`] bytes.

use serde::{Deserialize, Serialize};

use super::super::ids::TaskId;
use super::volume::{VolumeReply, VolumeRequest};

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
    /// [`SandboxRequest::Exec`] with live input (protocol v11): after this frame the master
    /// sends [`SandboxInput`] frames (keystrokes, end of input, window size, signals) on the
    /// same stream while the agent answers as for `Exec`.
    ExecLive {
        /// The task.
        task_id: TaskId,
        /// The program and its arguments.
        command: Vec<String>,
        /// Who asked, for the agent's log.
        principal: String,
        /// Killed after this many seconds (0: the agent's limit).
        timeout_secs: u32,
        /// Run on a pseudo-terminal of this size; `None`: pipes.
        tty: Option<TtySize>,
    },
    /// About the agent's persistent volumes, not a task (protocol v12, [`super::volume`]):
    /// answered by one [`SandboxReply::Volume`].
    Volume(VolumeRequest),
}

/// What the master sends after [`SandboxRequest::ExecLive`] (protocol v11), each frame at most
/// [`SANDBOX_CHUNK`] bytes of data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SandboxInput {
    /// Bytes for the command's standard input (its terminal's input with a pty).
    Stdin(Vec<u8>),
    /// End of standard input (pipes: closed; a pty: the terminal's EOF character, `^D`).
    StdinClose,
    /// The terminal's new window size (`TIOCSWINSZ`; the command gets `SIGWINCH`).
    Resize(TtySize),
    /// A signal for the command's process group (one of [`ALLOWED_SIGNALS`]).
    Signal(i32),
}

/// The signals an operator may send to an exec'd command: HUP, INT, QUIT, KILL, USR1, USR2,
/// TERM, CONT, STOP, WINCH (Linux numbers).
pub const ALLOWED_SIGNALS: [i32; 10] = [1, 2, 3, 9, 10, 12, 15, 18, 19, 28];

/// The operator's side of a live exec (protocol v11): after `GET /api/v1/tasks/{id}/exec/attach`
/// is upgraded (`Upgrade: gantry-exec`, `101 Switching Protocols`), both directions carry
/// frames of one kind byte, a big-endian `u32` length and at most [`exec_frame::MAX_PAYLOAD`] bytes.
/// A frame past the bound, or of an unknown kind, ends the session with an [`exec_frame::ERROR`] frame.
pub mod exec_frame {
    /// The most bytes one frame's payload has.
    pub const MAX_PAYLOAD: usize = super::SANDBOX_CHUNK;
    /// Client -> master: standard input bytes.
    pub const STDIN: u8 = 1;
    /// Client -> master: end of standard input (no payload).
    pub const STDIN_CLOSE: u8 = 2;
    /// Client -> master: window size, rows then columns, each a big-endian `u16`.
    pub const RESIZE: u8 = 3;
    /// Client -> master: a signal number, a big-endian `i32`.
    pub const SIGNAL: u8 = 4;
    /// Master -> client: standard output bytes (everything, on a terminal).
    pub const STDOUT: u8 = 11;
    /// Master -> client: standard error bytes.
    pub const STDERR: u8 = 12;
    /// Master -> client: the command ended; JSON `{"exit_code":N|null,"signal":S|null}`; last.
    pub const EXIT: u8 = 13;
    /// Master -> client: the session failed; JSON `{"error":"..."}`; last.
    pub const ERROR: u8 = 14;

    /// One frame's bytes (the payload cut to [`MAX_PAYLOAD`] by the caller).
    pub fn encode(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(5 + payload.len());
        out.push(kind);
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    /// A frame header's kind and length, or why it is refused (a length past [`MAX_PAYLOAD`]).
    pub fn header(h: [u8; 5]) -> Result<(u8, usize), String> {
        let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
        if len > MAX_PAYLOAD {
            return Err(format!(
                "a frame of {len} bytes: frames carry at most {MAX_PAYLOAD} bytes"
            ));
        }
        Ok((h[0], len))
    }
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
    /// The task the request is about (`None`: [`SandboxRequest::Volume`]).
    pub fn task_id(&self) -> Option<&TaskId> {
        match self {
            SandboxRequest::List { task_id, .. }
            | SandboxRequest::Read { task_id, .. }
            | SandboxRequest::Exec { task_id, .. }
            | SandboxRequest::ExecLive { task_id, .. } => Some(task_id),
            SandboxRequest::Volume(_) => None,
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
    /// The answer to a [`SandboxRequest::Volume`] (protocol v12); the stream ends.
    Volume(VolumeReply),
}

#[cfg(test)]
mod tests {
    use super::exec_frame::*;

    #[test]
    fn exec_frames_round_trip_and_oversized_ones_are_refused() {
        let f = encode(STDIN, b"ls\n");
        assert_eq!(f, [STDIN, 0, 0, 0, 3, b'l', b's', b'\n']);
        assert_eq!(header([f[0], f[1], f[2], f[3], f[4]]), Ok((STDIN, 3)));
        let max = (MAX_PAYLOAD as u32).to_be_bytes();
        assert_eq!(
            header([STDOUT, max[0], max[1], max[2], max[3]]),
            Ok((STDOUT, MAX_PAYLOAD))
        );
        let over = (MAX_PAYLOAD as u32 + 1).to_be_bytes();
        let e = header([STDIN, over[0], over[1], over[2], over[3]]).unwrap_err();
        assert!(e.contains("at most 65536 bytes"), "{e}");
    }
}
