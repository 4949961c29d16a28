//! `GET /api/v1/demand`: the frameworks' declared demand (`set_demand`) that the current fleet
//! cannot place, for autoscalers (`gantry-autoscaler`) and operators. A read.
//!
//! Shaped from the `/state` view by the pure [`unplaceable`]: every framework's remaining
//! demand (`allocator.frameworks[id].demands`: task shapes with counts) is placed, in framework
//! id order, with `gantry_placement`'s best-fit [`Placer`] on what each connected, active,
//! not-draining agent has free now (total minus used: resources offered but not accepted count
//! as free, since the framework may still take them); what does not fit is unplaceable.
//! Placement looks at CPU, memory and GPUs (whole, or fractions of one GPU on the free share
//! of each healthy GPU). At most [`MAX_SIMULATED`] tasks are placed per request; copies past
//! that are counted placeable (never scaled for on a guess).
//!
//! ```json
//! {"frameworks": [{"framework_id": "…", "name": "batch", "task": {"cpus": 1, "gpus": 1},
//!                  "declared": 6, "placeable": 2, "unplaceable": 4}],
//!  "unplaceable_tasks": 4, "agents": 1}
//! ```

use axum::extract::State;
use axum::Json;
use gantry_placement::{GpuDemand, ModelSet, Models, Node, Placer, Policy, TaskShape, Workload};
use gantry_proto::{GpuAmount, Resources};
use serde_json::{json, Value};

use super::super::http::{ApiResult, App};
use super::{read, CallerExt};

/// Most tasks one request places.
pub const MAX_SIMULATED: u64 = 100_000;

/// `GET /api/v1/demand`.
pub(super) async fn demand(State(app): State<App>, caller: CallerExt) -> ApiResult {
    Ok(Json(unplaceable(&read(&app, caller).await?)))
}

fn resources(v: &Value) -> Resources {
    serde_json::from_value(v.clone()).unwrap_or_default()
}

/// The placement node of an agent in the `/state` view, if it can take work now.
fn agent_node(a: &Value, models: &mut Models) -> Option<Node> {
    if a["connected"] != true || a["active"] == false || !a["drain"].is_null() {
        return None;
    }
    let total = resources(&a["total"]);
    let used = resources(&a["used"]);
    let cpu = total.milli("cpus");
    let mem = total.milli("mem") / 1000;
    let cpu_free = cpu.saturating_sub(used.milli("cpus"));
    let mem_free = mem.saturating_sub(used.milli("mem") / 1000);
    let gpus: Vec<&Value> = a["gpus"]
        .as_array()
        .map(|g| {
            g.iter()
                .filter(|g| g["healthy"] != false && g["mig_profile"].is_null())
                .collect()
        })
        .unwrap_or_default();
    let model = models
        .intern(gpus.first().and_then(|g| g["name"].as_str()).unwrap_or(""))
        .ok()?;
    let free = a["gpu_free"].as_array();
    let gpu_free = gpus
        .iter()
        .map(|g| {
            free.and_then(|f| f.iter().find(|f| f["uuid"] == g["uuid"]))
                .and_then(|f| f["free_milli"].as_u64())
                .map_or(0, |m| m.min(1000) as u32)
        })
        .collect();
    Some(Node {
        model,
        cpu_capacity: cpu,
        memory_capacity: mem,
        cpu_free,
        memory_free: mem_free,
        gpu_free,
    })
}

/// The models a demand's `gpu_model` accepts: the fleet's models whose name contains it
/// (case-insensitive, as a task's `GpuSelector::model`); when none does, a model no agent has
/// (nothing fits). `None` when the models cannot be interned (more than the placer's limit).
fn model_set(model: Option<&str>, fleet: &[String], models: &mut Models) -> Option<ModelSet> {
    let Some(m) = model.map(str::trim).filter(|m| !m.is_empty()) else {
        return Some(ModelSet::ANY);
    };
    let m = m.to_lowercase();
    let names: Vec<&str> = fleet
        .iter()
        .filter(|n| n.to_lowercase().contains(&m))
        .map(String::as_str)
        .collect();
    if names.is_empty() {
        return models
            .set([format!("(none of the fleet's: {m})").as_str()])
            .ok();
    }
    models.set(names).ok()
}

fn shape(task: &Resources, models: Option<ModelSet>) -> Option<TaskShape> {
    let gpu = match task.gpu_amount().ok()? {
        GpuAmount::None => GpuDemand::None,
        GpuAmount::Fraction(m) => GpuDemand::Fraction(m),
        GpuAmount::Whole(k) => GpuDemand::Whole(u32::try_from(k).ok()?),
    };
    Some(TaskShape {
        cpu_milli: task.milli("cpus"),
        memory_mib: task.milli("mem") / 1000,
        gpu,
        models: models?,
    })
}

/// The demand the fleet in `state` (the `/state` view) cannot place (see the module docs).
pub fn unplaceable(state: &Value) -> Value {
    let mut models = Models::new();
    let nodes: Vec<Node> = state["agents"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|a| agent_node(a, &mut models))
                .collect()
        })
        .unwrap_or_default();
    let agents = nodes.len();
    // The fleet's GPU models (each node's, as interned above).
    let fleet: Vec<String> = state["agents"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["gpus"].as_array()?.first()?["name"].as_str())
        .map(str::to_string)
        .collect();
    let mut wants: Vec<(String, String, Resources, Option<String>, u64)> = Vec::new();
    if let Some(fws) = state["allocator"]["frameworks"].as_object() {
        for (id, f) in fws {
            let name = f["name"].as_str().unwrap_or("");
            for d in f["demands"].as_array().into_iter().flatten() {
                let count = d["count"].as_u64().unwrap_or(0);
                if count == 0 {
                    continue;
                }
                let model = d["gpu_model"].as_str().map(str::to_string);
                wants.push((
                    id.clone(),
                    name.to_string(),
                    resources(&d["task"]),
                    model,
                    count,
                ));
            }
        }
    }
    let shapes: Vec<Option<TaskShape>> = wants
        .iter()
        .map(|(_, _, t, m, _)| shape(t, model_set(m.as_deref(), &fleet, &mut models)))
        .collect();
    let workload = Workload::new(
        wants
            .iter()
            .zip(&shapes)
            .filter_map(|((_, _, _, _, n), s)| Some(((*s)?, *n))),
    );
    let mut placer = Placer::new(nodes, Policy::BestFit, workload, 0).ok();
    let mut budget = MAX_SIMULATED;
    let mut total = 0u64;
    let frameworks: Vec<Value> = wants
        .into_iter()
        .zip(shapes)
        .map(|((id, name, task, gpu_model, count), s)| {
            let mut placed = 0u64;
            // A shape placement cannot read (a bad gpus amount) fits nowhere.
            if let (Some(s), Some(p)) = (s, placer.as_mut()) {
                while placed < count && budget > 0 {
                    let Some(at) = p.choose(&s) else { break };
                    if p.commit(&at, &s).is_err() {
                        break;
                    }
                    placed += 1;
                    budget -= 1;
                }
                if budget == 0 {
                    placed = count;
                }
            }
            total += count - placed;
            json!({
                "framework_id": id,
                "name": name,
                "task": task,
                "gpu_model": gpu_model,
                "declared": count,
                "placeable": placed,
                "unplaceable": count - placed,
            })
        })
        .collect();
    json!({
        "frameworks": frameworks,
        "unplaceable_tasks": total,
        "agents": agents,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(uuid: &str, name: &str) -> Value {
        json!({"uuid": uuid, "name": name, "healthy": true, "mig_profile": null})
    }

    fn state(agents: Vec<Value>, demand: Vec<(&str, Value, u64)>) -> Value {
        let mut fws = serde_json::Map::new();
        for (id, task, count) in demand {
            fws.insert(
                id.into(),
                json!({"name": format!("fw-{id}"), "demands": [{"task": task, "count": count}]}),
            );
        }
        json!({"agents": agents, "allocator": {"frameworks": fws}})
    }

    fn agent(gpus: &[(&str, u64)], used: Value) -> Value {
        json!({
            "connected": true, "active": true,
            "total": {"cpus": 8.0, "mem": 8192.0, "gpus": gpus.len() as f64},
            "used": used,
            "gpus": gpus.iter().map(|(u, _)| gpu(u, "A100")).collect::<Vec<_>>(),
            "gpu_free": gpus.iter().map(|(u, f)| json!({"uuid": u, "free_milli": f})).collect::<Vec<_>>(),
        })
    }

    #[test]
    fn what_the_free_fleet_cannot_hold_is_unplaceable() {
        // One agent: GPU g0 busy, g1 idle. Demand: 3 one-GPU tasks → 1 placeable, 2 not.
        let s = state(
            vec![agent(
                &[("g0", 0), ("g1", 1000)],
                json!({"cpus": 1.0, "mem": 1024.0, "gpus": 1.0}),
            )],
            vec![("f1", json!({"cpus": 1.0, "mem": 512.0, "gpus": 1.0}), 3)],
        );
        let v = unplaceable(&s);
        assert_eq!(v["unplaceable_tasks"], 2, "{v:#}");
        assert_eq!(v["frameworks"][0]["placeable"], 1);
        assert_eq!(v["frameworks"][0]["name"], "fw-f1");
        assert_eq!(v["agents"], 1);
    }

    #[test]
    fn a_demand_for_a_gpu_model_fits_only_gpus_of_that_model() {
        // Two idle one-GPU agents, an A100 and an H100. Demand: 2 one-GPU tasks on H100s.
        let mut h100 = agent(&[("h0", 1000)], json!({}));
        h100["gpus"] = json!([gpu("h0", "NVIDIA H100")]);
        let mut s = state(
            vec![agent(&[("a0", 1000)], json!({})), h100],
            vec![("f1", json!({"cpus": 1.0, "mem": 512.0, "gpus": 1.0}), 2)],
        );
        s["allocator"]["frameworks"]["f1"]["demands"][0]["gpu_model"] = json!("h100");
        let v = unplaceable(&s);
        assert_eq!(v["frameworks"][0]["placeable"], 1, "{v:#}");
        assert_eq!(v["frameworks"][0]["gpu_model"], "h100");
        // A model no agent has: nothing fits; no model: both fit.
        s["allocator"]["frameworks"]["f1"]["demands"][0]["gpu_model"] = json!("B200");
        assert_eq!(unplaceable(&s)["unplaceable_tasks"], 2);
        s["allocator"]["frameworks"]["f1"]["demands"][0]["gpu_model"] = Value::Null;
        assert_eq!(unplaceable(&s)["unplaceable_tasks"], 0);
    }

    #[test]
    fn draining_disconnected_and_inactive_agents_hold_nothing() {
        let mut draining = agent(&[("g0", 1000)], json!({}));
        draining["drain"] = json!("DRAINING");
        let mut gone = agent(&[("g1", 1000)], json!({}));
        gone["connected"] = json!(false);
        let mut off = agent(&[("g2", 1000)], json!({}));
        off["active"] = json!(false);
        let s = state(
            vec![draining, gone, off],
            vec![("f1", json!({"cpus": 1.0, "mem": 1.0, "gpus": 1.0}), 1)],
        );
        let v = unplaceable(&s);
        assert_eq!(v["unplaceable_tasks"], 1, "{v:#}");
        assert_eq!(v["agents"], 0);
    }

    #[test]
    fn no_demand_no_fleet_and_cpu_only_demand() {
        assert_eq!(unplaceable(&json!({}))["unplaceable_tasks"], 0);
        // 8 CPUs free: 3 tasks of 3 CPUs → 2 fit.
        let s = state(
            vec![agent(&[], json!({}))],
            vec![("f1", json!({"cpus": 3.0, "mem": 10.0}), 3)],
        );
        assert_eq!(unplaceable(&s)["unplaceable_tasks"], 1);
        // A count of 0 is no demand.
        let s = state(vec![], vec![("f1", json!({"cpus": 1.0}), 0)]);
        assert_eq!(unplaceable(&s)["frameworks"], json!([]));
    }
}
