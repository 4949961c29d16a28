//! A task's sandbox from gantryctl: `fs` (listings and files), `exec` through the pipe or a
//! terminal, and `exec --live`'s interactive terminal (raw mode, window size, the bounded
//! frames of `gantry_proto::exec_frame`).

use super::*;

/// `gantryctl fs`: a directory's listing, or a file's bytes when the path is a file.
pub(super) async fn sandbox_fs(
    c: &OperatorClient,
    json: bool,
    task: &str,
    path: String,
    offset: Option<u64>,
    length: Option<u64>,
) -> anyhow::Result<()> {
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair("path", &path);
    let listing = c
        .get(&format!("/api/v1/tasks/{}/files?{}", seg(task), q.finish()))
        .await;
    match listing {
        Ok(body) => show(json, &body, print::sandbox_listing),
        Err(ClientError::Status {
            status: 400,
            message,
            ..
        }) if message.contains("not a directory") => {
            let mut q = form_urlencoded::Serializer::new(String::new());
            q.append_pair("path", &path);
            if let Some(o) = offset {
                q.append_pair("offset", &o.to_string());
            }
            if let Some(n) = length {
                q.append_pair("length", &n.to_string());
            }
            let (_, bytes) = c
                .get_bytes(&format!(
                    "/api/v1/tasks/{}/files/read?{}",
                    seg(task),
                    q.finish()
                ))
                .await?;
            use std::io::Write;
            std::io::stdout().write_all(&bytes)?;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// The exit status of a command run by `gantryctl exec` (gantryctl exits with it).
#[derive(Debug, thiserror::Error)]
#[error("the command exited with status {0}")]
pub(super) struct ExecStatus(pub(super) u8);

/// `--tty-size ROWSxCOLS`.
pub(super) fn parse_tty_size(s: &str) -> Result<(u16, u16), String> {
    let bad = || format!("{s:?}: expected ROWSxCOLS, e.g. 24x80");
    let (r, c) = s.split_once(['x', 'X']).ok_or_else(bad)?;
    let (r, c): (u16, u16) = (
        r.trim().parse().map_err(|_| bad())?,
        c.trim().parse().map_err(|_| bad())?,
    );
    if r == 0 || c == 0 {
        return Err(bad());
    }
    Ok((r, c))
}

/// The window size of the terminal on standard output (else standard input), or 24x80.
pub(super) fn local_tty_size() -> (u16, u16) {
    for fd in [libc::STDOUT_FILENO, libc::STDIN_FILENO] {
        // SAFETY: TIOCGWINSZ writes one `winsize` into memory we own.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0
            && ws.ws_row > 0
            && ws.ws_col > 0
        {
            return (ws.ws_row, ws.ws_col);
        }
    }
    (24, 80)
}

/// This process's terminal (standard input) in raw mode until dropped.
pub(super) struct RawMode(libc::termios);

impl RawMode {
    /// `None` when standard input is not a terminal.
    fn enter() -> Option<RawMode> {
        // SAFETY: tcgetattr/tcsetattr on standard input with a `termios` we own.
        unsafe {
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(libc::STDIN_FILENO, &mut saved) != 0 {
                return None;
            }
            let mut raw = saved;
            libc::cfmakeraw(&mut raw);
            if libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &raw) != 0 {
                return None;
            }
            Some(RawMode(saved))
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: restores the settings read in `enter`.
        unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &self.0) };
    }
}

/// What a live exec's loop waits for.
pub(super) enum LiveEvent {
    /// A frame from the master: kind and payload.
    Frame(u8, Vec<u8>),
    /// The master's connection ended (with why, when a read failed).
    Closed(Option<String>),
    /// Keystrokes (standard input), `None` at its end.
    Input(Option<Vec<u8>>),
}

/// `gantryctl exec -t`: a live session on a terminal (`GET .../exec/attach`, upgraded, the
/// frames of `gantry_proto::exec_frame`). With `-i` this terminal's input goes as it is typed;
/// the local terminal is in raw mode until the session ends (restored on every way out: the
/// command's exit, an error, SIGTERM/SIGHUP/SIGINT to gantryctl); SIGWINCH sends the new
/// window size. Exits with the command's status.
pub(super) async fn exec_live(
    c: &OperatorClient,
    task: &str,
    interactive: bool,
    (rows, cols): (u16, u16),
    timeout: Option<std::time::Duration>,
    command: Vec<String>,
) -> anyhow::Result<()> {
    use gantry_proto::exec_frame;
    use std::io::Write;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::signal::unix::{signal, SignalKind};
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair("command", &serde_json::to_string(&command)?);
    q.append_pair("rows", &rows.to_string());
    q.append_pair("cols", &cols.to_string());
    if let Some(t) = timeout {
        q.append_pair("timeout_secs", &t.as_secs().max(1).to_string());
    }
    let path = format!("/api/v1/tasks/{}/exec/attach?{}", seg(task), q.finish());
    let io = c.upgrade(&path, "gantry-exec").await?;
    let (mut r, mut w) = tokio::io::split(io);
    let (events_tx, mut events) = tokio::sync::mpsc::channel::<LiveEvent>(16);
    let frames = events_tx.clone();
    let reader = tokio::spawn(async move {
        loop {
            let mut h = [0u8; 5];
            if let Err(e) = r.read_exact(&mut h).await {
                let why = (e.kind() != std::io::ErrorKind::UnexpectedEof).then(|| e.to_string());
                let _ = frames.send(LiveEvent::Closed(why)).await;
                return;
            }
            let (kind, len) = match exec_frame::header(h) {
                Ok(x) => x,
                Err(e) => {
                    let _ = frames.send(LiveEvent::Closed(Some(e))).await;
                    return;
                }
            };
            let mut payload = vec![0u8; len];
            if let Err(e) = r.read_exact(&mut payload).await {
                let _ = frames.send(LiveEvent::Closed(Some(e.to_string()))).await;
                return;
            }
            if frames.send(LiveEvent::Frame(kind, payload)).await.is_err() {
                return;
            }
        }
    });
    // The local terminal in raw mode (the remote pty does the line discipline) until `_raw`
    // drops: when this function returns, whatever the way.
    let _raw = if interactive { RawMode::enter() } else { None };
    if interactive {
        // A plain thread: a blocking read of standard input cannot be cancelled, and the
        // process exits without waiting for it.
        let input = events_tx.clone();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = vec![0u8; 16 * 1024];
            let mut stdin = std::io::stdin().lock();
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) | Err(_) => {
                        let _ = input.blocking_send(LiveEvent::Input(None));
                        return;
                    }
                    Ok(n) => {
                        if input
                            .blocking_send(LiveEvent::Input(Some(buf[..n].to_vec())))
                            .is_err()
                        {
                            return;
                        }
                    }
                }
            }
        });
    }
    drop(events_tx);
    let mut winch = signal(SignalKind::window_change()).context("SIGWINCH")?;
    let mut term = signal(SignalKind::terminate()).context("SIGTERM")?;
    let mut hup = signal(SignalKind::hangup()).context("SIGHUP")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT")?;
    let mut status: Option<u8> = None;
    let result: anyhow::Result<()> = loop {
        let ev = tokio::select! {
            ev = events.recv() => ev,
            _ = winch.recv() => {
                let (rows, cols) = local_tty_size();
                let mut p = rows.to_be_bytes().to_vec();
                p.extend_from_slice(&cols.to_be_bytes());
                if w.write_all(&exec_frame::encode(exec_frame::RESIZE, &p)).await.is_err() {
                    break Err(anyhow::anyhow!("exec: the master's connection ended"));
                }
                continue;
            }
            _ = term.recv() => break Err(anyhow::anyhow!("exec: terminated (SIGTERM)")),
            _ = hup.recv() => break Err(anyhow::anyhow!("exec: hung up (SIGHUP)")),
            _ = int.recv() => break Err(anyhow::anyhow!("exec: interrupted (SIGINT)")),
        };
        match ev {
            None | Some(LiveEvent::Closed(None)) => {
                break Err(anyhow::anyhow!(
                    "exec: the connection ended without the command's exit status"
                ))
            }
            Some(LiveEvent::Closed(Some(e))) => break Err(anyhow::anyhow!("exec: {e}")),
            Some(LiveEvent::Input(Some(data))) => {
                if w.write_all(&exec_frame::encode(exec_frame::STDIN, &data))
                    .await
                    .is_err()
                {
                    break Err(anyhow::anyhow!("exec: the master's connection ended"));
                }
            }
            Some(LiveEvent::Input(None)) => {
                let _ = w
                    .write_all(&exec_frame::encode(exec_frame::STDIN_CLOSE, &[]))
                    .await;
            }
            Some(LiveEvent::Frame(exec_frame::STDOUT, data)) => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(&data).and_then(|()| out.flush());
            }
            Some(LiveEvent::Frame(exec_frame::STDERR, data)) => {
                let _ = std::io::stderr().write_all(&data);
            }
            Some(LiveEvent::Frame(exec_frame::EXIT, data)) => {
                let v: serde_json::Value = serde_json::from_slice(&data).unwrap_or_default();
                status = Some(match (v["exit_code"].as_i64(), v["signal"].as_i64()) {
                    (Some(code), _) => (code & 0xff) as u8,
                    (None, Some(sig)) => (128 + sig).min(255) as u8,
                    _ => 1,
                });
                break Ok(());
            }
            Some(LiveEvent::Frame(exec_frame::ERROR, data)) => {
                let v: serde_json::Value = serde_json::from_slice(&data).unwrap_or_default();
                let e = v["error"]
                    .as_str()
                    .unwrap_or("the session failed")
                    .to_string();
                break Err(anyhow::anyhow!("exec: {e}"));
            }
            Some(LiveEvent::Frame(kind, _)) => {
                break Err(anyhow::anyhow!("exec: a frame of unknown kind {kind}"))
            }
        }
    };
    reader.abort();
    drop(_raw);
    result?;
    match status {
        Some(0) => Ok(()),
        Some(n) => Err(ExecStatus(n).into()),
        None => anyhow::bail!("exec: the stream ended without the command's exit status"),
    }
}

/// `gantryctl exec`: runs the command in the task, prints its output as it comes, and exits
/// with its status (128 + N for a signal).
pub(super) async fn exec(
    c: &OperatorClient,
    task: &str,
    interactive: bool,
    tty: Option<(u16, u16)>,
    timeout: Option<std::time::Duration>,
    command: Vec<String>,
) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    let mut stdin = String::new();
    if interactive {
        let mut buf = Vec::new();
        std::io::stdin()
            .take(256 * 1024 + 1)
            .read_to_end(&mut buf)
            .context("reading standard input")?;
        if buf.len() > 256 * 1024 {
            return Err(Usage("exec -i: standard input is limited to 256 KiB".into()).into());
        }
        stdin = String::from_utf8(buf)
            .map_err(|_| Usage("exec -i: standard input must be UTF-8".into()))?;
    }
    let body = serde_json::json!({
        "command": command,
        "stdin": stdin,
        "timeout_secs": timeout.map_or(0, |t| t.as_secs().max(1)),
        "tty": tty.map(|(rows, cols)| serde_json::json!({"rows": rows, "cols": cols})),
    });
    // The local terminal in raw mode while the command runs (the remote pty does the line
    // discipline); restored when `_raw` drops, on success and on error alike.
    let _raw = if tty.is_some() {
        RawMode::enter()
    } else {
        None
    };
    let mut pending = Vec::new();
    let mut status: Option<u8> = None;
    let mut failure: Option<String> = None;
    c.stream(
        &format!("/api/v1/tasks/{}/exec", seg(task)),
        Some(&body),
        |chunk| {
            pending.extend_from_slice(chunk);
            while let Some(pos) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=pos).collect();
                let Ok(v) = serde_json::from_slice::<serde_json::Value>(&line) else {
                    continue;
                };
                if let Some(data) = v["data"].as_str() {
                    let _ = if v["stream"] == "stderr" {
                        std::io::stderr().write_all(data.as_bytes())
                    } else {
                        std::io::stdout()
                            .write_all(data.as_bytes())
                            .and_then(|()| std::io::stdout().flush())
                    };
                } else if let Some(e) = v["error"].as_str() {
                    failure = Some(e.to_string());
                } else if !v["exit_code"].is_null() || !v["signal"].is_null() {
                    status = Some(match (v["exit_code"].as_i64(), v["signal"].as_i64()) {
                        (Some(code), _) => (code & 0xff) as u8,
                        (None, Some(sig)) => (128 + sig).min(255) as u8,
                        _ => 1,
                    });
                }
            }
            true
        },
    )
    .await?;
    if let Some(e) = failure {
        anyhow::bail!("exec: {e}");
    }
    match status {
        Some(0) => Ok(()),
        Some(n) => Err(ExecStatus(n).into()),
        None => anyhow::bail!("exec: the stream ended without the command's exit status"),
    }
}
