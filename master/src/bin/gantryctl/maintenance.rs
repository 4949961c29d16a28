//! `gantryctl drain | undrain | maintenance`: agent maintenance over
//! `/api/v1/agents/{id}/…` and `GET /api/v1/maintenance/drains` (`mark-gone` is the API
//! helper's command).

use std::time::Duration;

use anyhow::Context;
use gantry_master::client::OperatorClient;

/// Maintenance subcommands (flattened into gantryctl's commands).
#[derive(clap::Subcommand, Debug)]
pub enum MaintenanceCmd {
    /// Drain an agent (id or name): stop offering it, tell the frameworks with tasks there,
    /// and kill what is left at the deadline (never without --deadline).
    Drain {
        agent: String,
        /// Time until the tasks left are killed (`90s`, `5m`, `1h`).
        #[arg(long, value_parser = humantime::parse_duration)]
        deadline: Option<Duration>,
        /// Follow the drain until the agent is DRAINED, printing its progress.
        #[arg(long)]
        wait: bool,
        /// Give up waiting after this long (`--wait`).
        #[arg(long, value_parser = humantime::parse_duration, default_value = "1h")]
        wait_timeout: Duration,
    },
    /// Offer a drained (or draining) agent again.
    Undrain { agent: String },
    /// Show the agents under maintenance and the agents marked gone.
    Maintenance {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
}

fn path(agent: &str, action: &str) -> String {
    // Ids and names are [A-Za-z0-9_.-]; anything else is percent-encoded.
    let mut enc = String::new();
    for b in agent.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.".contains(&b) {
            enc.push(b as char);
        } else {
            enc.push_str(&format!("%{b:02X}"));
        }
    }
    format!("/api/v1/agents/{enc}/{action}")
}

/// The maintenance entry of `agent` (id or name) in a view.
fn entry<'a>(view: &'a serde_json::Value, agent: &str) -> Option<&'a serde_json::Value> {
    view["agents"]
        .as_array()?
        .iter()
        .find(|a| a["agent_id"] == agent || a["name"] == agent)
}

fn line(a: &serde_json::Value) -> String {
    let deadline = match a["deadline_in_ms"].as_u64() {
        Some(ms) if a["killing"] == true => format!("deadline passed ({ms} ms), killing"),
        Some(ms) => format!("kill in {:.0} s", ms as f64 / 1000.0),
        None => "no deadline".into(),
    };
    format!(
        "{:<20} {:<9} tasks left {:<4} frameworks notified {:<3} {:<28} {}{}",
        a["name"].as_str().unwrap_or("?"),
        a["state"].as_str().unwrap_or("?"),
        a["tasks_remaining"],
        a["frameworks_notified"].as_array().map_or(0, Vec::len),
        deadline,
        a["reason"].as_str().unwrap_or(""),
        if a["connected"] == true {
            ""
        } else {
            "  (disconnected)"
        },
    )
}

fn print_view(view: &serde_json::Value) {
    let empty = Vec::new();
    let agents = view["agents"].as_array().unwrap_or(&empty);
    if agents.is_empty() {
        println!("no agent under maintenance");
    }
    for a in agents {
        println!("{}", line(a));
    }
    for g in view["gone"].as_array().unwrap_or(&empty) {
        println!(
            "{:<20} GONE      {}",
            g["name"].as_str().unwrap_or("?"),
            g["agent_id"].as_str().unwrap_or("?")
        );
    }
}

fn parse(body: &str) -> anyhow::Result<serde_json::Value> {
    serde_json::from_str(body).context("parsing the master's answer")
}

/// Runs one maintenance command against the master.
pub async fn run(c: &OperatorClient, cmd: MaintenanceCmd) -> anyhow::Result<()> {
    match cmd {
        MaintenanceCmd::Drain {
            agent,
            deadline,
            wait,
            wait_timeout,
        } => {
            let body = serde_json::json!({"deadline_secs": deadline.map(|d| d.as_secs())});
            let view = parse(&c.post_json(&path(&agent, "drain"), &body).await?)?;
            let Some(mut last) = entry(&view, &agent).map(line) else {
                println!("drain of {agent} requested");
                return Ok(());
            };
            println!("{last}");
            if !wait {
                return Ok(());
            }
            let until = tokio::time::Instant::now() + wait_timeout;
            loop {
                let view = parse(&c.get("/api/v1/maintenance/drains").await?)?;
                let Some(a) = entry(&view, &agent) else {
                    anyhow::bail!("{agent} left maintenance (undrained or removed)");
                };
                let now = line(a);
                // The deadline countdown changes every second; print state changes.
                if now.split("kill in").next() != last.split("kill in").next() {
                    println!("{now}");
                }
                last = now;
                if a["state"] == "DRAINED" {
                    println!("{agent} is drained: it holds no task and is not offered");
                    return Ok(());
                }
                anyhow::ensure!(
                    tokio::time::Instant::now() < until,
                    "{agent} is still draining after {wait_timeout:?}"
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        MaintenanceCmd::Undrain { agent } => {
            c.post_json(&path(&agent, "undrain"), &serde_json::json!({}))
                .await?;
            println!("{agent} undrained: offered again");
            Ok(())
        }
        MaintenanceCmd::Maintenance { json } => {
            let body = c.get("/api/v1/maintenance/drains").await?;
            if json {
                println!("{body}");
            } else {
                print_view(&parse(&body)?);
            }
            Ok(())
        }
    }
}
