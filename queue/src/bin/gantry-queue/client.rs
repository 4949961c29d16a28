//! The API's clients: how to reach the queue (`--server`, a token or a client certificate),
//! the request helper with gantryctl's exit codes, `bench-submit`, `logs` and the job table.

use super::*;

/// How to reach the queue's API and who the caller is.
#[derive(clap::Args, Debug, Clone)]
pub(super) struct Conn {
    /// The queue's API: https://HOST:PORT (http:// for a queue in dev mode).
    #[arg(long)]
    pub(super) server: String,
    /// The CA certificate (PEM) the queue's HTTPS certificate is checked against: the cluster's
    /// ca.pem.
    #[arg(long)]
    pub(super) ca: Option<PathBuf>,
    /// A user token (`Authorization: Bearer`); also $GANTRY_QUEUE_TOKEN.
    #[arg(long, env = "GANTRY_QUEUE_TOKEN", hide_env_values = true)]
    pub(super) token: Option<String>,
    /// A client certificate (PEM) of the cluster CA, `operator:NAME` (read as user NAME).
    #[arg(long, requires = "key")]
    pub(super) cert: Option<PathBuf>,
    /// The client certificate's key (PEM).
    #[arg(long, requires = "cert")]
    pub(super) key: Option<PathBuf>,
}

pub(super) fn client(conn: &Conn) -> anyhow::Result<reqwest::Client> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    if let Some(ca) = &conn.ca {
        for cert in CertificateDer::pem_file_iter(ca)
            .with_context(|| format!("reading {}", ca.display()))?
        {
            roots.add(cert.with_context(|| format!("reading {}", ca.display()))?)?;
        }
    }
    let identity = match (&conn.cert, &conn.key) {
        (Some(cert), Some(key)) => Some(gantry_sdk::transport::tls::Identity {
            chain: CertificateDer::pem_file_iter(cert)
                .with_context(|| format!("reading {}", cert.display()))?
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("reading {}", cert.display()))?,
            key: PrivateKeyDer::from_pem_file(key)
                .with_context(|| format!("reading {}", key.display()))?,
        }),
        _ => None,
    };
    let tls = gantry_sdk::transport::tls::https_client_config(roots, identity.as_ref())?;
    Ok(reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .timeout(Duration::from_secs(30))
        .build()?)
}

pub(super) async fn call(
    conn: &Conn,
    method: reqwest::Method,
    path: &str,
    body: Option<String>,
) -> anyhow::Result<serde_json::Value> {
    let url = format!("{}{path}", conn.server.trim_end_matches('/'));
    let mut req = client(conn)?.request(method, &url);
    if let Some(token) = &conn.token {
        req = req.bearer_auth(token);
    }
    if let Some(b) = body {
        req = req.header("content-type", "application/json").body(b);
    }
    let resp = req
        .send()
        .await
        .with_context(|| format!("reaching {url}"))?;
    let status = resp.status();
    let text = resp.text().await?;
    let value: serde_json::Value =
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    if !status.is_success() {
        let message = value["error"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| value.to_string());
        return Err(ApiError {
            status: status.as_u16(),
            message,
        }
        .into());
    }
    Ok(value)
}

/// `gantry-queue bench-submit`: `jobs` submissions of a one-CPU job (`sleep 1`, no GPU) by
/// `concurrency` clients; prints the rate and the latency percentiles.
pub(super) async fn bench_submit(
    conn: &Conn,
    jobs: u32,
    concurrency: u32,
    team: &str,
) -> anyhow::Result<()> {
    let url = format!("{}/jobs", conn.server.trim_end_matches('/'));
    let body = serde_json::json!({
        "name": "bench", "team": team, "command": ["sleep 1"], "cpus": 0.1, "mem": 16,
    })
    .to_string();
    let next = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let started = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (client, url, body, next) = (client(conn)?, url.clone(), body.clone(), next.clone());
        let token = conn.token.clone();
        clients.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < jobs {
                let t = Instant::now();
                let mut req = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone());
                if let Some(token) = &token {
                    req = req.bearer_auth(token);
                }
                let resp = req.send().await?;
                let status = resp.status();
                let text = resp.text().await?;
                if !status.is_success() {
                    bail!("{status}: {text}");
                }
                lat.push(t.elapsed());
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut lat = Vec::new();
    for c in clients {
        lat.extend(c.await??);
    }
    let secs = started.elapsed().as_secs_f64();
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    println!(
        "{} submissions in {secs:.2} s: {:.0}/s with {concurrency} clients; latency p50 {:.2} ms, \
         p99 {:.2} ms, max {:.2} ms",
        lat.len(),
        lat.len() as f64 / secs,
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    Ok(())
}

/// `gantry-queue logs`: the worker's output streamed to standard output as it comes.
pub(super) async fn logs(
    conn: &Conn,
    id: u64,
    worker: u32,
    follow: bool,
    stderr: bool,
) -> anyhow::Result<()> {
    use std::io::Write as _;
    let url = format!(
        "{}/jobs/{id}/logs?worker={worker}&follow={follow}&stderr={stderr}",
        conn.server.trim_end_matches('/')
    );
    // No overall deadline: a followed worker writes as long as it runs.
    let mut req = client(conn)?
        .get(&url)
        .timeout(Duration::from_secs(100 * 365 * 86_400));
    if let Some(token) = &conn.token {
        req = req.bearer_auth(token);
    }
    let mut resp = req
        .send()
        .await
        .with_context(|| format!("reaching {url}"))?;
    let status = resp.status();
    if !status.is_success() {
        let text = resp.text().await?;
        let message = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or(text);
        return Err(ApiError {
            status: status.as_u16(),
            message,
        }
        .into());
    }
    let mut out = std::io::stdout().lock();
    while let Some(chunk) = resp.chunk().await? {
        out.write_all(&chunk)?;
        out.flush()?;
    }
    Ok(())
}

pub(super) fn table(jobs: &[JobView]) {
    println!(
        "{:>5}  {:<20} {:<10} {:<10} {:<11} {:<9} {:>4} {:>7} {:>4} {:>7} {:>8} {:>9}  WHERE / WHY",
        "ID",
        "NAME",
        "TEAM",
        "USER",
        "PRIORITY",
        "STATE",
        "POS",
        "WORKERS",
        "GPUS",
        "PREEMPT",
        "WAITED",
        "START"
    );
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    for j in jobs {
        let workers = if j.min_workers == j.max_workers {
            format!("{}/{}", j.workers, j.max_workers)
        } else {
            format!("{}/{}..{}", j.workers, j.min_workers, j.max_workers)
        };
        let pos = j
            .position
            .map_or_else(|| "-".to_string(), |p| p.to_string());
        println!(
            "{:>5}  {:<20} {:<10} {:<10} {:<11} {:<9} {:>4} {:>7} {:>4} {:>7} {:>7.0}s {:>9}  {}",
            j.id,
            j.name,
            j.team,
            if j.user.is_empty() { "-" } else { &j.user },
            j.priority.as_str(),
            j.state.as_str(),
            pos,
            workers,
            j.gpus_per_worker,
            j.preemptions,
            j.waited_secs,
            start_in(j, now_ms),
            where_(j)
        );
    }
}

/// An array's jobs per state: `3 PENDING, 2 RUNNING, 95 FINISHED`.
pub(super) fn summary(sum: &BTreeMap<String, u32>) -> String {
    let parts: Vec<String> = sum.iter().map(|(s, n)| format!("{n} {s}")).collect();
    parts.join(", ")
}

/// A pending job's estimated start from now (`now`, `in 90s`, `in 12m`, `in 3h`, `in 2d`), or
/// `-` when unknown or not pending.
pub(super) fn start_in(j: &JobView, now_ms: u64) -> String {
    let Some(at) = j.estimated_start_unix_ms else {
        return "-".into();
    };
    let secs = at.saturating_sub(now_ms) / 1000;
    match secs {
        0 => "now".into(),
        1..120 => format!("in {secs}s"),
        120..7200 => format!("in {}m", secs / 60),
        7200..172_800 => format!("in {}h", secs / 3600),
        _ => format!("in {}d", secs / 86400),
    }
}

/// The agents a job runs on, the dependencies a pending job waits on, or why it waits.
pub(super) fn where_(j: &JobView) -> String {
    if !j.waiting_on.is_empty() {
        let ids: Vec<String> = j.waiting_on.iter().map(u64::to_string).collect();
        return format!("waits on {}", ids.join(","));
    }
    if let Some(why) = &j.pending_reason {
        return why.clone();
    }
    j.agents.join(",")
}
