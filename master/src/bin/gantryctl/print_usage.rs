//! `gantryctl usage`: the usage report as a table or CSV (`--cost`: cost, idle agents).

use super::*;

/// `gantryctl usage`: hours per key, then the total.
pub fn usage(v: &Value, cost: bool) -> String {
    let hours = |x: &Value| format!("{:.3}", x.as_f64().unwrap_or(0.0));
    let row = |r: &Value| {
        let mut row = vec![
            cell(&r["key"]),
            cell(&r["tasks"]),
            hours(&r["cpu_hours"]),
            hours(&r["mem_gib_hours"]),
            hours(&r["gpu_hours"]),
        ];
        if cost {
            row.push(money(&r["cost"]));
        }
        row
    };
    let mut rows: Vec<Vec<String>> = arr(&v["rows"]).iter().map(row).collect();
    rows.push(row(&v["total"]));
    let by = v["by"].as_str().unwrap_or("key").to_uppercase();
    let mut out = format!(
        "usage from {} to {} (history from {})\n",
        time(&v["since_ms"]),
        time(&v["until_ms"]),
        time(&v["history_from_ms"])
    );
    let mut head = vec![
        by.as_str(),
        "TASKS",
        "CPU-HOURS",
        "MEM-GIB-HOURS",
        "GPU-HOURS",
    ];
    if cost {
        head.push("COST");
    }
    out.push_str(&table(&head, &rows));
    if cost {
        if v.get("agents").is_none() {
            out.push_str("\nno agent carries a price (gantry-agent --price-per-hour)\n");
        } else {
            let agents: Vec<Vec<String>> = arr(&v["agents"])
                .iter()
                .map(|a| {
                    vec![
                        cell(&a["name"]),
                        money(&a["price_per_hour"]),
                        hours(&a["hours"]),
                        money(&a["cost"]),
                        money(&a["attributed"]),
                        money(&a["idle_cost"]),
                    ]
                })
                .collect();
            out.push_str(&format!(
                "\nagents (idle cost {}):\n",
                money(&v["idle_cost"])
            ));
            out.push_str(&table(
                &["AGENT", "PRICE/H", "HOURS", "COST", "USED", "IDLE"],
                &agents,
            ));
        }
    }
    let held = arr(&v["held_offers"]["rows"]);
    if !held.is_empty() {
        out.push_str(&format!(
            "\nheld in offers, not used (since {}):\n",
            time(&v["held_offers"]["from_ms"])
        ));
        let rows: Vec<Vec<String>> = held
            .iter()
            .map(|r| {
                vec![
                    cell(&r["framework"]),
                    cell(&r["role"]),
                    hours(&r["cpu_hours"]),
                    hours(&r["mem_gib_hours"]),
                    hours(&r["gpu_hours"]),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "FRAMEWORK",
                "ROLE",
                "CPU-HOURS",
                "MEM-GIB-HOURS",
                "GPU-HOURS",
            ],
            &rows,
        ));
    }
    out
}

fn money(v: &Value) -> String {
    v.as_f64().map_or("-".into(), |x| format!("{x:.2}"))
}

/// `gantryctl usage --csv` (`--cost`: a `cost` column; the agents' idle cost is in `--json`).
pub fn usage_csv(v: &Value, cost: bool) -> String {
    let mut out = String::from("key,tasks,cpu_hours,mem_gib_hours,gpu_hours");
    out.push_str(if cost { ",cost\n" } else { "\n" });
    for r in arr(&v["rows"]).iter().chain([&v["total"]]) {
        let key = cell(&r["key"]).replace('"', "\"\"");
        out.push_str(&format!(
            "\"{key}\",{},{},{},{}",
            cell(&r["tasks"]),
            r["cpu_hours"].as_f64().unwrap_or(0.0),
            r["mem_gib_hours"].as_f64().unwrap_or(0.0),
            r["gpu_hours"].as_f64().unwrap_or(0.0)
        ));
        if cost {
            out.push_str(&format!(",{}", r["cost"].as_f64().unwrap_or(0.0)));
        }
        out.push('\n');
    }
    out
}
