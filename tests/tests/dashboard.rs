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

use std::time::{Duration, Instant};

use gantry_tests::{driver_config, standin_lib, start_recorder, task, Cluster, Standin, TempDir};

#[path = "dashboard/browser.rs"]
mod browser;
use browser::*;

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
