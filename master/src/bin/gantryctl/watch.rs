//! Reading the cluster as a whole: `state` (the raw `/state`, summarized) and `events` (the
//! operator event stream, followed across reconnections).

use super::*;

pub(super) fn print_state(body: String, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{body}");
        return Ok(());
    }
    let s: serde_json::Value = serde_json::from_str(&body).context("parsing /state")?;
    let empty = Vec::new();
    let res = |v: &serde_json::Value| -> String {
        v.as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}:{v}"))
                    .collect::<Vec<_>>()
                    .join(";")
            })
            .unwrap_or_default()
    };
    println!("agents:");
    for a in s["agents"].as_array().unwrap_or(&empty) {
        println!(
            "  {:<16} total {:<40} used {}",
            a["name"].as_str().unwrap_or("?"),
            res(&a["total"]),
            res(&a["used"])
        );
    }
    println!("frameworks:");
    for f in s["frameworks"].as_array().unwrap_or(&empty) {
        println!(
            "  {:<16} roles {:<20} share {:.3}  tasks {:<4} allocated {}",
            f["name"].as_str().unwrap_or("?"),
            f["roles"]
                .as_array()
                .map(|r| r
                    .iter()
                    .filter_map(|x| x.as_str())
                    .collect::<Vec<_>>()
                    .join(","))
                .unwrap_or_default(),
            f["dominant_share"].as_f64().unwrap_or(0.0),
            f["active_tasks"],
            res(&f["allocated"])
        );
    }
    let mut by_state = std::collections::BTreeMap::<String, usize>::new();
    for t in s["tasks"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .chain(s["completed_tasks"].as_array().unwrap_or(&empty))
    {
        *by_state
            .entry(t["state"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
    }
    println!(
        "tasks: {by_state:?}   outstanding offers: {}",
        s["offers"].as_array().map_or(0, Vec::len)
    );
    // Why the latest unsuccessful tasks ended (the full records are in `--json`).
    let failed: Vec<&serde_json::Value> = s["completed_tasks"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .filter(|t| t["state"] != "FINISHED")
        .collect();
    if !failed.is_empty() {
        println!("latest unsuccessful tasks:");
        for t in failed.iter().rev().take(5) {
            println!(
                "  {:<24} {:<8} {:<18} {}",
                t["name"].as_str().unwrap_or("?"),
                t["state"].as_str().unwrap_or("?"),
                t["reason"].as_str().unwrap_or("-"),
                t["message"].as_str().unwrap_or("")
            );
        }
    }
    Ok(())
}

/// `gantryctl events`: follows the stream, reconnecting (1 s, doubling to 10 s between tries)
/// when it ends or breaks, until stdout is closed. Authentication and ACL refusals end it.
pub(super) async fn events(
    c: &OperatorClient,
    json: bool,
    no_reconnect: bool,
    mut since: Option<String>,
) -> anyhow::Result<()> {
    use std::io::Write;
    let mut names = print::EventNames::default();
    let mut backoff = std::time::Duration::from_secs(1);
    loop {
        let mut closed = false;
        let mut got_any = false;
        let path = match &since {
            Some(s) => {
                let mut q = form_urlencoded::Serializer::new(String::new());
                q.append_pair("since", s);
                format!("/api/v1/events?{}", q.finish())
            }
            None => "/api/v1/events".to_string(),
        };
        let result = c
            .events(&path, |data| {
                got_any = true;
                let line = if json {
                    data.to_string()
                } else {
                    match serde_json::from_str::<serde_json::Value>(data) {
                        // History events carry when they happened; live ones are printed
                        // with the time they arrive.
                        Ok(v) => format!(
                            "{}  {}",
                            print::time(
                                &v.get("at_ms")
                                    .cloned()
                                    .unwrap_or_else(|| serde_json::json!(unix_ms()))
                            ),
                            names.event(&v)
                        ),
                        Err(_) => data.to_string(),
                    }
                };
                // Stop when whoever reads us has gone (a closed pipe).
                let mut out = std::io::stdout().lock();
                closed = writeln!(out, "{line}").and_then(|_| out.flush()).is_err();
                !closed
            })
            .await;
        if closed {
            return Ok(());
        }
        let why = match result {
            Ok(()) => "the master ended the stream".to_string(),
            Err(e) if matches!(e.status(), Some(400..=499)) => return Err(e.into()),
            Err(e) => format!("{e:#}"),
        };
        if no_reconnect {
            anyhow::bail!("event stream: {why}");
        }
        // Reconnected, the history since the stream was lost comes first: nothing is missed.
        since = Some(unix_ms().saturating_sub(1000).to_string());
        if got_any {
            backoff = std::time::Duration::from_secs(1);
        }
        eprintln!(
            "{}  event stream lost ({why}); reconnecting in {}s",
            print::time(&serde_json::json!(unix_ms())),
            backoff.as_secs()
        );
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(std::time::Duration::from_secs(10));
    }
}
