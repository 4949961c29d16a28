//! `gantryctl volume list AGENT` and `gantryctl volume destroy AGENT FRAMEWORK/NAME`: the
//! persistent volumes on an agent (`GET /api/v1/agents/{id}/volumes`) and destroying one with
//! its data (`DELETE /api/v1/agents/{id}/volumes/{framework}/{name}`; refused, 409, while a
//! container on the agent mounts it).

use anyhow::Context;
use gantry_master::client::OperatorClient;

/// Persistent volume subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum VolumeCmd {
    /// The persistent volumes on an agent (id or name), with the tasks that mount them.
    List {
        agent: String,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Destroy a framework's persistent volume on an agent and its data (refused while a
    /// container there mounts it).
    Destroy {
        agent: String,
        /// The volume, as FRAMEWORK_ID/NAME (`volume list` shows them).
        volume: String,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
}

/// One path segment, percent-encoded beyond `[A-Za-z0-9_.-]`.
fn seg(s: &str) -> String {
    let mut enc = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.".contains(&b) {
            enc.push(b as char);
        } else {
            enc.push_str(&format!("%{b:02X}"));
        }
    }
    enc
}

/// Runs one volume command against the master.
pub async fn run(c: &OperatorClient, cmd: VolumeCmd) -> anyhow::Result<()> {
    match cmd {
        VolumeCmd::List { agent, json } => {
            let body = c
                .get(&format!("/api/v1/agents/{}/volumes", seg(&agent)))
                .await?;
            if json {
                println!("{body}");
                return Ok(());
            }
            let v: serde_json::Value =
                serde_json::from_str(&body).context("parsing the master's answer")?;
            let empty = Vec::new();
            let vols = v["volumes"].as_array().unwrap_or(&empty);
            if vols.is_empty() {
                println!("no persistent volume on {agent}");
            }
            for vol in vols {
                let users: Vec<&str> = vol["used_by"]
                    .as_array()
                    .unwrap_or(&empty)
                    .iter()
                    .filter_map(|t| t.as_str())
                    .collect();
                println!(
                    "{}/{}  {}  {}",
                    vol["framework"].as_str().unwrap_or("?"),
                    vol["name"].as_str().unwrap_or("?"),
                    vol["path"].as_str().unwrap_or("?"),
                    if users.is_empty() {
                        "unused".to_string()
                    } else {
                        format!("in use by {}", users.join(", "))
                    }
                );
            }
            if v["total"].as_u64().unwrap_or(0) > vols.len() as u64 {
                println!("({} in all)", v["total"]);
            }
            Ok(())
        }
        VolumeCmd::Destroy {
            agent,
            volume,
            json,
        } => {
            let Some((framework, name)) = volume.split_once('/') else {
                return Err(crate::Usage(format!(
                    "volume {volume:?}: give FRAMEWORK_ID/NAME (see `gantryctl volume list {agent}`)"
                ))
                .into());
            };
            let body = c
                .delete(&format!(
                    "/api/v1/agents/{}/volumes/{}/{}",
                    seg(&agent),
                    seg(framework),
                    seg(name)
                ))
                .await?;
            if json {
                println!("{body}");
            } else {
                println!("persistent volume {framework}/{name} on {agent} destroyed");
            }
            Ok(())
        }
    }
}
