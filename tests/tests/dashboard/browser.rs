//! Headless Chromium driven two ways: `--dump-dom` runs, and a DevTools session over its
//! WebSocket (navigate, read the DOM, screenshots); and a raw HTTPS request for what a browser hides.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub(super) const T: Duration = Duration::from_secs(60);
/// The name of the task whose logs the task page follows.
pub(super) const WRITER: &str = "<script>alert(1)</script>";

pub(super) fn chromium() -> PathBuf {
    for c in ["chromium", "chromium-browser", "google-chrome"] {
        for dir in ["/usr/bin", "/usr/local/bin", "/snap/bin"] {
            let p = Path::new(dir).join(c);
            if p.exists() {
                return p;
            }
        }
    }
    panic!("chromium not found: run scripts/setup-deps.sh (Debian package `chromium`)");
}

/// Headless Chromium on `url` with `extra` flags (`--dump-dom`, `--screenshot=…`); its stdout.
pub(super) fn browse(profile: &Path, url: &str, extra: &[&str]) -> String {
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            // The cluster's CA is not in the browser's store.
            "--ignore-certificate-errors",
            "--window-size=1400,2000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start chromium");
    let deadline = Instant::now() + T;
    loop {
        match child.try_wait().unwrap() {
            Some(_) => break,
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("chromium did not finish within {T:?} on {url}");
            }
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Loads `url` in the logged-in page until `pred` holds on its DOM.
pub(super) fn wait_dom(
    dt: &mut Devtools,
    session: &str,
    url: &str,
    what: &str,
    pred: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + T;
    loop {
        let dom = dt.dom(session, url);
        if pred(&dom) {
            return dom;
        }
        assert!(
            Instant::now() < deadline,
            "the dashboard never showed {what}; last DOM:\n{dom}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Standard base64 (the DevTools protocol's screenshots).
pub(super) fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let bytes: Vec<u8> = s
        .bytes()
        .filter(|c| *c != b'=' && !c.is_ascii_whitespace())
        .collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, c)| acc | (val(*c) << (18 - 6 * i)));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

/// Sends one raw HTTPS request (no client certificate) and returns the status line and body.
pub(super) async fn raw_request(
    addr: std::net::SocketAddr,
    tls_dir: &Path,
    request: String,
) -> String {
    let roots = gantry_sdk::transport::tls::load_roots(tls_dir).unwrap();
    let cfg = gantry_sdk::transport::tls::https_client_config(roots, None).unwrap();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let mut s = connector.connect(name, tcp).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(T, s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// Headless Chromium driven over the DevTools protocol on `--remote-debugging-pipe` (fd 3: our
/// commands, fd 4: its answers, each a JSON message ended by NUL).
pub(super) struct Devtools {
    pub(super) child: std::process::Child,
    pub(super) to: std::fs::File,
    pub(super) from: std::sync::mpsc::Receiver<serde_json::Value>,
    pub(super) next: u64,
}

impl Devtools {
    pub(super) fn start(profile: &Path) -> Self {
        use std::os::fd::FromRawFd;
        use std::os::unix::process::CommandExt;
        let pipe = || {
            let mut fds = [0i32; 2];
            // SAFETY: `fds` has room for the two descriptors pipe2 writes.
            let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
            assert_eq!(r, 0, "pipe2: {}", std::io::Error::last_os_error());
            (fds[0], fds[1])
        };
        let (cmd_r, cmd_w) = pipe();
        let (ans_r, ans_w) = pipe();
        let mut cmd = Command::new(chromium());
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--ignore-certificate-errors",
            "--window-size=1400,2000",
            "--remote-debugging-pipe",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("about:blank")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
        // SAFETY: only async-signal-safe calls (dup2) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(cmd_r, 3) < 0 || libc::dup2(ans_w, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("start chromium");
        // SAFETY: the descriptors are ours (from pipe2) and owned by one File each from here on.
        let (to, from_file) = unsafe {
            libc::close(cmd_r);
            libc::close(ans_w);
            (
                std::fs::File::from_raw_fd(cmd_w),
                std::fs::File::from_raw_fd(ans_r),
            )
        };
        let (tx, from) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut r = std::io::BufReader::new(from_file);
            loop {
                let mut msg = Vec::new();
                match r.read_until(0, &mut msg) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        msg.pop();
                        if let Ok(v) = serde_json::from_slice(&msg) {
                            if tx.send(v).is_err() {
                                return;
                            }
                        }
                    }
                }
            }
        });
        Self {
            child,
            to,
            from,
            next: 0,
        }
    }

    /// Sends a command (to a page's `session`, or the browser) and waits for its result.
    pub(super) fn call(
        &mut self,
        session: Option<&str>,
        method: &str,
        params: serde_json::Value,
    ) -> serde_json::Value {
        use std::io::Write;
        self.next += 1;
        let id = self.next;
        let mut msg = serde_json::json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = s.into();
        }
        let mut bytes = msg.to_string().into_bytes();
        bytes.push(0);
        self.to.write_all(&bytes).expect("write to chromium");
        let deadline = Instant::now() + T;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = self
                .from
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("chromium did not answer {method}"));
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// Evaluates `expr` in the page; its value.
    pub(super) fn eval(&mut self, session: &str, expr: &str) -> serde_json::Value {
        let r = self.call(
            Some(session),
            "Runtime.evaluate",
            serde_json::json!({"expression": expr, "returnByValue": true}),
        );
        r["result"]["value"].clone()
    }

    /// Navigates the page to `url` and returns its DOM once loaded.
    pub(super) fn dom(&mut self, session: &str, url: &str) -> String {
        self.call(
            Some(session),
            "Page.navigate",
            serde_json::json!({"url": url}),
        );
        let expr = format!(
            "document.readyState === 'complete' && location.href === {}",
            serde_json::Value::from(url)
        );
        self.wait_true(session, url, &expr);
        self.eval(session, "document.documentElement.outerHTML")
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Polls `expr` in the page until it is `true`.
    pub(super) fn wait_true(&mut self, session: &str, what: &str, expr: &str) {
        let deadline = Instant::now() + T;
        while self.eval(session, expr) != true {
            assert!(
                Instant::now() < deadline,
                "the open page never showed {what} ({expr}); body: {}",
                self.eval(session, "document.body ? document.body.outerHTML : ''")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Devtools {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The table `id` of a page, up to its end.
pub(super) fn table_of<'a>(dom: &'a str, id: &str) -> &'a str {
    let rest = &dom[dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no table {id} in:\n{dom}"))..];
    &rest[..rest.find("</table>").unwrap_or(rest.len())]
}

/// Saves a screenshot of the page under the test's scratch target directory and prints its path.
pub(super) fn save_screenshot(dt: &mut Devtools, session: &str, name: &str) {
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_file(&shot);
    let png = dt.call(
        Some(session),
        "Page.captureScreenshot",
        serde_json::json!({"format": "png", "captureBeyondViewport": true}),
    );
    std::fs::write(
        &shot,
        base64_decode(png["data"].as_str().unwrap_or_default()),
    )
    .unwrap();
    let meta = std::fs::metadata(&shot).expect("chromium saved no screenshot");
    assert!(
        meta.len() > 10_000,
        "screenshot too small: {} bytes",
        meta.len()
    );
    println!("dashboard screenshot: {}", shot.display());
}

/// The `<tr …>` row that carries `attr` (e.g. `data-name="x"`), up to its end.
pub(super) fn row<'a>(dom: &'a str, attr: &str) -> &'a str {
    let start = dom
        .find(attr)
        .unwrap_or_else(|| panic!("no row with {attr} in:\n{dom}"));
    let rest = &dom[start..];
    &rest[..rest.find("</tr>").unwrap_or(rest.len())]
}
