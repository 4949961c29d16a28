//! The web dashboard `/ui` in headless Chromium (issue 14 item 5) against a live cluster with
//! stand-in GPUs: the browser logs in with an operator token through the login form (a
//! server-side session in a cookie, never the token; a token in the URL is refused), and the
//! page shows the
//! agent, its four GPUs with utilization, health and the task holding each, and the tasks;
//! later loads show the changes (a task finished, a GPU turned unhealthy, then cleared with
//! `gantryctl clear-gpu` through the master); an open page (driven over the DevTools protocol on
//! `--remote-debugging-pipe`) updates itself from the event stream, without a reload, when an
//! operator changes a weight and deactivates the agent. One browser, driven over the DevTools
//! protocol, holds the login throughout; logging out revokes the session. A screenshot is saved
//! and its path printed. Needs Debian's `chromium` (scripts/setup-deps.sh installs it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gantry_tests::{driver_config, standin_lib, start_recorder, task, Cluster, Standin, TempDir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const T: Duration = Duration::from_secs(60);
/// The name of the task whose logs the task page follows.
const WRITER: &str = "<script>alert(1)</script>";

fn chromium() -> PathBuf {
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
fn browse(profile: &Path, url: &str, extra: &[&str]) -> String {
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
fn wait_dom(
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
fn base64_decode(s: &str) -> Vec<u8> {
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
async fn raw_request(addr: std::net::SocketAddr, tls_dir: &Path, request: String) -> String {
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
struct Devtools {
    child: std::process::Child,
    to: std::fs::File,
    from: std::sync::mpsc::Receiver<serde_json::Value>,
    next: u64,
}

impl Devtools {
    fn start(profile: &Path) -> Self {
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
    fn call(
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
    fn eval(&mut self, session: &str, expr: &str) -> serde_json::Value {
        let r = self.call(
            Some(session),
            "Runtime.evaluate",
            serde_json::json!({"expression": expr, "returnByValue": true}),
        );
        r["result"]["value"].clone()
    }

    /// Navigates the page to `url` and returns its DOM once loaded.
    fn dom(&mut self, session: &str, url: &str) -> String {
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
    fn wait_true(&mut self, session: &str, what: &str, expr: &str) {
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
fn table_of<'a>(dom: &'a str, id: &str) -> &'a str {
    let rest = &dom[dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no table {id} in:\n{dom}"))..];
    &rest[..rest.find("</table>").unwrap_or(rest.len())]
}

/// Saves a screenshot of the page under the test's scratch target directory and prints its path.
fn save_screenshot(dt: &mut Devtools, session: &str, name: &str) {
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
fn row<'a>(dom: &'a str, attr: &str) -> &'a str {
    let start = dom
        .find(attr)
        .unwrap_or_else(|| panic!("no row with {attr} in:\n{dom}"));
    let rest = &dom[start..];
    &rest[..rest.find("</tr>").unwrap_or(rest.len())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_shows_agents_gpus_and_tasks_live_in_chromium() {
    let scratch = TempDir::new("gantry-dash").unwrap();
    let mut standin = Standin::four_gpus(scratch.path()).unwrap();
    for g in &mut standin.config.gpus {
        g.utilization_gpu = 77;
    }
    standin.write().unwrap();
    let token = gantry_master::tokens::generate().unwrap();
    let tokens = scratch.path().join("tokens");
    std::fs::write(&tokens, gantry_master::tokens::file_entry("dash", &token)).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let lib = standin_lib();
    let cluster = Cluster::start_with(
        &[("dash-gpu1", "cpus:4;mem:4096")],
        &["--operator-tokens", tokens.to_str().unwrap()],
        &[
            "--nvml-lib",
            lib.to_str().unwrap(),
            "--isolation",
            "none",
            "--usage-interval",
            "0.5",
        ],
    )
    .unwrap();
    cluster
        .master
        .wait_state(T, "4 GPUs", |s| {
            s["agents"][0]["gpus"]
                .as_array()
                .is_some_and(|g| g.len() == 4)
        })
        .unwrap();

    let mut cfg = driver_config(
        vec![cluster.master.quic.to_string()],
        cluster.tls_dir.clone(),
        "dash-fw",
        vec!["ml".into()],
    );
    // GPU agents are offered only to frameworks that ask for GPUs.
    cfg.info.capabilities = vec![gantry_sdk::protocol::Capability::GpuResources];
    let (_updates, _handle, _driver) = start_recorder(
        cfg,
        vec![
            task("short-train", "sleep 4", "cpus:1;mem:64;gpus:1"),
            task("long-train", "sleep 120", "cpus:1;mem:64;gpus:1"),
            // A name a peer controls, shown escaped everywhere; its output is followed live.
            task(
                WRITER,
                "i=0; while [ $i -lt 40 ]; do echo line-$i; i=$((i+1)); sleep 1; done; sleep 60",
                "cpus:0.5;mem:32",
            ),
        ],
    );
    cluster
        .master
        .wait_state(T, "the three tasks running", |s| {
            gantry_tests::running_tasks(s) == 3
        })
        .unwrap();

    let profile = scratch.path().join("chromium");
    let base = format!("https://{}", cluster.master.http);
    let ui = format!("{base}/ui");

    // A token in the URL is refused (it would end up in history and logs).
    let dom = browse(
        &profile.join("url-token"),
        &format!("{base}/ui/login?token={token}"),
        &["--dump-dom"],
    );
    assert!(dom.contains("tokens in URLs are refused"), "{dom}");

    // Without a login the browser lands on the login form.
    let dom = browse(
        &profile.join("anonymous"),
        &format!("{base}/ui"),
        &["--dump-dom"],
    );
    assert!(dom.contains("name=\"token\""), "no login form:\n{dom}");
    assert!(
        !dom.contains("dash-gpu1"),
        "the dashboard leaked without a login:\n{dom}"
    );

    // Log in through the form (its CSRF token comes with it).
    let mut dt = Devtools::start(&profile);
    let target = dt.call(
        None,
        "Target.createTarget",
        serde_json::json!({"url": format!("{base}/ui/login")}),
    );
    let attached = dt.call(
        None,
        "Target.attachToTarget",
        serde_json::json!({"targetId": target["targetId"], "flatten": true}),
    );
    let session = attached["sessionId"].as_str().unwrap().to_string();
    dt.wait_true(
        &session,
        "the login form",
        "document.readyState === 'complete' && !!document.querySelector('input[name=token]')",
    );
    dt.eval(
        &session,
        &format!(
            "document.querySelector('input[name=token]').value = {}; \
             document.querySelector('form.login').submit(); true",
            serde_json::Value::from(token.as_str())
        ),
    );
    dt.wait_true(
        &session,
        "the dashboard after the login",
        "location.pathname === '/ui' && !!document.getElementById('main')",
    );
    // The session cookie is not the token.
    let cookies = dt.call(
        Some(&session),
        "Network.getCookies",
        serde_json::json!({"urls": [base]}),
    );
    let cookie = cookies["cookies"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "gantry_session"))
        .unwrap_or_else(|| panic!("no session cookie: {cookies}"))
        .clone();
    assert!(
        cookie["httpOnly"] == true && cookie["secure"] == true,
        "{cookie}"
    );
    assert_eq!(cookie["sameSite"], "Strict", "{cookie}");
    let session_id = cookie["value"].as_str().unwrap().to_string();
    assert_ne!(session_id, token);
    assert!(
        !cookies.to_string().contains(&token),
        "the token is in a cookie: {cookies}"
    );

    // Logged in: the agent, its GPUs (model, utilization, the task holding one) and the tasks.
    let dom = wait_dom(
        &mut dt,
        &session,
        &ui,
        "the GPUs in use with their utilization",
        |d| d.contains("class=\"gpu-task\"><a href=\"/ui/tasks/") && d.contains("77%"),
    );
    assert!(dom.contains("data-name=\"dash-gpu1\""), "{dom}");
    assert_eq!(dom.matches("<tr class=\"gpu\"").count(), 4, "{dom}");
    for g in &standin.config.gpus {
        let r = row(&dom, &format!("data-uuid=\"{}\"", g.uuid));
        assert!(r.contains(&g.name), "GPU model missing: {r}");
        assert!(r.contains("data-healthy=\"true\""), "{r}");
    }
    assert!(row(&dom, "data-name=\"dash-gpu1\"").contains("connected"));
    assert!(dom.contains("long-train"), "{dom}");
    assert!(dom.contains("dash-fw"), "frameworks table: {dom}");
    assert!(dom.contains("data-name=\"ml\""), "roles table: {dom}");
    assert!(dom.contains("id=\"shares\""), "share chart: {dom}");
    assert!(dom.contains("/ui/app.js"), "{dom}");

    // Pages (issue 30 item 2): from the overview to the writer's page through its link; its
    // output appears while it writes.
    dt.dom(&session, &ui);
    let js = |s: &str| serde_json::Value::from(s).to_string();
    dt.eval(
        &session,
        &format!(
            "[...document.querySelectorAll('#t-tasks tr.task a')].find(a => a.textContent === {}).click(); true",
            js(WRITER)
        ),
    );
    dt.wait_true(
        &session,
        "the task page",
        "location.pathname.startsWith('/ui/tasks/') && document.readyState === 'complete'",
    );
    let shown = |dt: &mut Devtools| -> usize {
        dt.eval(
            &session,
            "(document.getElementById('log-stdout').textContent.match(/line-/g) || []).length",
        )
        .as_u64()
        .unwrap_or(0) as usize
    };
    dt.wait_true(
        &session,
        "the first lines of its output",
        "document.getElementById('log-stdout').textContent.includes('line-1\\n')",
    );
    let first = shown(&mut dt);
    dt.wait_true(
        &session,
        "more lines while it writes",
        &format!(
            "(document.getElementById('log-stdout').textContent.match(/line-/g) || []).length > {}",
            first + 1
        ),
    );
    assert_eq!(
        dt.eval(
            &session,
            "document.getElementById('log-stdout').dataset.following"
        ),
        "true",
        "the output is still being followed"
    );
    // The name is text, never markup: one script (the dashboard's) and the name as written.
    assert_eq!(dt.eval(&session, "document.scripts.length"), 1);
    assert_eq!(
        dt.eval(
            &session,
            "document.querySelector('#task .name').textContent"
        ),
        WRITER
    );
    assert_eq!(
        dt.eval(&session, "document.querySelector('#task').dataset.state"),
        "RUNNING"
    );
    dt.wait_true(
        &session,
        "RUNNING in its state history",
        "[...document.querySelectorAll('#history tr.transition')].some(r => r.textContent.includes('RUNNING'))",
    );
    save_screenshot(&mut dt, &session, "dashboard-task.png");
    // Its agent's page (GPUs, drain state, tasks) and its framework's (roles, tasks, offers).
    dt.eval(
        &session,
        "document.querySelector('#task a[href^=\"/ui/agents/\"]').click(); true",
    );
    dt.wait_true(
        &session,
        "the agent page",
        "location.pathname.startsWith('/ui/agents/') && document.querySelectorAll('#gpus tr.gpu').length === 4 \
         && document.querySelector('#agent .name').textContent === 'dash-gpu1' \
         && [...document.querySelectorAll('#t-tasks tr.task')].some(r => r.textContent.includes('long-train'))",
    );
    assert_eq!(
        dt.eval(
            &session,
            "document.querySelector('#agent .drain').textContent"
        ),
        "-"
    );
    dt.eval(
        &session,
        "document.querySelector('#t-tasks tr.task a[href^=\"/ui/frameworks/\"]').click(); true",
    );
    dt.wait_true(
        &session,
        "the framework page",
        "location.pathname.startsWith('/ui/frameworks/') \
         && document.querySelector('#framework .name').textContent === 'dash-fw' \
         && !!document.querySelector('#t-roles tr.role[data-name=\"ml\"]') \
         && [...document.querySelectorAll('#t-tasks tr.task')].some(r => r.textContent.includes('long-train'))",
    );
    // Filter and sort, on the server (no script needed) and in the page.
    let dom = dt.dom(&session, &format!("{ui}?q=long-tr"));
    let tasks_table = table_of(&dom, "t-tasks");
    assert!(tasks_table.contains("long-train"), "{tasks_table}");
    assert!(!tasks_table.contains("short-train"), "{tasks_table}");
    let dom = dt.dom(&session, &format!("{ui}?sort=name&dir=desc"));
    let tasks_table = table_of(&dom, "t-tasks");
    let (s, l) = (
        tasks_table.find(">short-train<").unwrap(),
        tasks_table.find(">long-train<").unwrap(),
    );
    assert!(s < l, "name descending: short-train before long-train");
    dt.eval(
        &session,
        "document.querySelector('#t-tasks th[data-col=name] a').click(); true",
    );
    dt.wait_true(
        &session,
        "the address sorted by name, ascending, after a header click",
        "location.search.includes('sort=name&dir=asc')",
    );
    let asc = "(() => { const n = [...document.querySelectorAll('#t-tasks tr.task')].map(r => r.children[0].textContent); \
               return n.indexOf('long-train') >= 0 && n.indexOf('long-train') < n.indexOf('short-train'); })()";
    let deadline = Instant::now() + T;
    while dt.eval(&session, asc) != true {
        assert!(
            Instant::now() < deadline,
            "tasks not sorted by name after a header click: {}",
            dt.eval(&session, "[...document.querySelectorAll('#t-tasks tr.task')].map(r => r.children[0].textContent).join(',') + ' ' + location.search")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    dt.eval(
        &session,
        "const b = document.getElementById('filter'); b.value = 'short-tr'; b.dispatchEvent(new Event('input')); true",
    );
    dt.wait_true(
        &session,
        "rows filtered as typed",
        "[...document.querySelectorAll('#t-tasks tbody.item')].every(tb => tb.hidden === !tb.textContent.includes('short-train'))",
    );
    let bad = dt.dom(&session, &format!("{ui}?sort=colour"));
    assert!(bad.contains("no column of that name"), "{bad}");
    // The usage view renders the usage API.
    let dom = dt.dom(&session, &format!("{base}/ui/usage?by=framework&since=1h"));
    assert!(dom.contains("data-key=\"dash-fw\""), "{dom}");

    // Updates: the short task finishes, a GPU fails (XID 79).
    standin.inject_xid(0, 79).unwrap();
    let dom = wait_dom(
        &mut dt,
        &session,
        &ui,
        "a finished task and an unhealthy GPU",
        |d| d.contains("data-state=\"FINISHED\"") && d.contains("data-healthy=\"false\""),
    );
    let finished = row(&dom, "data-state=\"FINISHED\"");
    assert!(finished.contains("short-train"), "{finished}");
    assert!(dom.contains("unhealthy"), "{dom}");

    // An operator clears the GPU through the API (the master asks the agent): healthy again.
    let gpu0 = standin.config.gpus[0].uuid.clone();
    let out = cluster
        .master
        .gantryctl(&["clear-gpu", "dash-gpu1", &gpu0])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_dom(
        &mut dt,
        &session,
        &ui,
        "the cleared GPU healthy again",
        |d| d.contains(&format!("data-uuid=\"{gpu0}\" data-healthy=\"true\"")),
    );
    let again = cluster
        .master
        .gantryctl(&["clear-gpu", "dash-gpu1", &gpu0])
        .unwrap();
    assert_eq!(
        again.status.code(),
        Some(1),
        "clearing a healthy GPU is a conflict"
    );

    // What the page's script swaps in on each event: the tables, with the same cookie.
    let fragment = dt.dom(&session, &format!("{base}/ui/fragment"));
    assert!(fragment.contains("data-name=\"dash-gpu1\""), "{fragment}");
    assert!(!fragment.contains("<header>"), "{fragment}");

    // Attack: a forged cross-site write carrying the dashboard's cookie. The session stands for
    // the operator on reads only: the write is refused and the weight unchanged.
    let body = r#"{"role":"ml","weight":7}"#;
    let forged = raw_request(
        cluster.master.http,
        &cluster.tls_dir,
        format!(
            "POST /api/v1/weights HTTP/1.1\r\nHost: master\r\nCookie: gantry_session={session_id}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
    .await;
    assert!(forged.starts_with("HTTP/1.1 401"), "{forged}");
    let read = raw_request(
        cluster.master.http,
        &cluster.tls_dir,
        format!(
            "GET /api/v1/summary HTTP/1.1\r\nHost: master\r\nCookie: gantry_session={session_id}\r\nConnection: close\r\n\r\n"
        ),
    )
    .await;
    assert!(read.starts_with("HTTP/1.1 200"), "{read}");
    let bad = raw_request(
        cluster.master.http,
        &cluster.tls_dir,
        format!("GET /api/v1/summary HTTP/1.1\r\nHost: master\r\nCookie: gantry_token={token}\r\nConnection: close\r\n\r\n"),
    )
    .await;
    assert!(bad.starts_with("HTTP/1.1 401"), "{bad}");
    let weight = cluster.master.state().unwrap()["allocator"]["roles"]["ml"]["weight"].clone();
    assert_eq!(weight, 1.0);

    // Live: an open page follows the event stream and re-renders without a reload.
    dt.dom(&session, &ui);
    dt.wait_true(
        &session,
        "the event stream connected",
        "document.body && document.body.dataset.live === 'connected'",
    );
    dt.wait_true(
        &session,
        "the agent",
        "!!document.querySelector('tr.agent[data-name=\"dash-gpu1\"]')",
    );
    let ctl = |args: &[&str]| {
        let out = cluster.master.gantryctl(args).unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    ctl(&["weight", "ml", "3"]);
    dt.wait_true(
        &session,
        "the new weight",
        "(() => { const r = document.querySelector('tr.role[data-name=\"ml\"]'); \
          return !!r && r.children[2].textContent === '3.0'; })()",
    );
    ctl(&["deactivate", "dash-gpu1"]);
    dt.wait_true(
        &session,
        "the agent deactivated",
        "document.querySelector('tr.agent[data-name=\"dash-gpu1\"]').textContent.includes('deactivated')",
    );
    dt.wait_true(
        &session,
        "the changes in the event log",
        "[...document.querySelectorAll('#events li')].some(l => l.textContent.includes('deactivated'))",
    );
    ctl(&["reactivate", "dash-gpu1"]);
    dt.wait_true(
        &session,
        "the agent active again",
        "document.querySelector('tr.agent[data-name=\"dash-gpu1\"]').textContent.includes('connected')",
    );
    dt.wait_true(
        &session,
        "a share chart line",
        "document.querySelectorAll('#shares polyline').length >= 1",
    );

    // The live script and stylesheet are served.
    let js = dt.dom(&session, &format!("{base}/ui/app.js"));
    assert!(js.contains("EventSource"), "{js}");

    dt.dom(&session, &ui);
    save_screenshot(&mut dt, &session, "dashboard.png");

    // Logging out (the page's form) ends the session on the master: its cookie no longer reads.
    dt.eval(
        &session,
        "document.querySelector('form.logout').submit(); true",
    );
    dt.wait_true(
        &session,
        "the login form after logging out",
        "location.pathname === '/ui/login' && !!document.querySelector('input[name=token]')",
    );
    let after = raw_request(
        cluster.master.http,
        &cluster.tls_dir,
        format!(
            "GET /api/v1/summary HTTP/1.1\r\nHost: master\r\nCookie: gantry_session={session_id}\r\nConnection: close\r\n\r\n"
        ),
    )
    .await;
    assert!(after.starts_with("HTTP/1.1 401"), "{after}");
    drop(dt);
}
