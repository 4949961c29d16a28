//! The master's core cost per task launch, without I/O: the pure state machine driven through
//! the load harness's workload (`gantry-load`'s defaults: agents with 8 GPUs, 200 frameworks
//! over 10 roles, tasks of one GPU running 1 s (± 10 %), each framework launching up to 8 tasks per offer
//! and declining the rest for 1 s) in simulated time, every message encoded as the shell would
//! write it. Prints the core's and the encoder's CPU time per launch (the thread's CPU clock:
//! other processes on the machine do not count).
//!
//! ```sh
//! cargo bench -p gantry-master --bench core_launch -- [AGENTS] [SIMULATED_SECONDS]
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use gantry_master::state::{ConnId, Input, Master, MasterConfig, Output};
use gantry_proto::codec::encode_frame_into;
use gantry_proto::*;

/// The master's allocator (`gantry-master` runs on mimalloc).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const FRAMEWORKS: u64 = 200;
const ROLES: u64 = 10;
const TASK_MS: u64 = 1000;
const STEP_MS: u64 = 2;

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec for the kernel to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn gpu(agent: u64, i: u32) -> GpuInfo {
    GpuInfo {
        uuid: format!("GPU-load-{agent}-{i}"),
        name: "NVIDIA A100-SXM4-80GB".into(),
        memory_mib: 81_920,
        compute_capability: (8, 0),
        minor: i,
        pci_bus_id: format!("00000000:{i:02x}:00.0"),
        numa_node: Some(0),
        pci_root: None,
        healthy: true,
        mig_profile: None,
        parent_uuid: None,
    }
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let agents = args.first().copied().unwrap_or(1000);
    let seconds = args.get(1).copied().unwrap_or(20);
    let config = MasterConfig::default();
    let mut m = Master::new(config, 7);
    let mut now = 0;
    let mut out = Vec::new();
    m.handle_into(Input::LeaseUntil { until: None }, now, &mut out);
    let task_res: Resources = "cpus:1;mem:1024;gpus:1".parse().expect("task");
    // Conns: agents 1..=agents, frameworks after them.
    let fw_conn = |i: u64| agents + 1 + i;
    for a in 0..agents {
        let conn = 1 + a;
        m.handle_into(
            Input::AgentConnected {
                conn,
                name: format!("load-{a}"),
                address: "127.0.0.1:1".into(),
            },
            now,
            &mut out,
        );
        m.handle_into(
            Input::Agent {
                conn,
                msg: AgentToMaster::Register {
                    agent_id: None,
                    hostname: format!("load-{a}"),
                    resources: "cpus:64;mem:524288;gpus:8".parse().expect("resources"),
                    reserved: Default::default(),
                    attributes: Default::default(),
                    gpus: (0..8).map(|i| gpu(a, i)).collect(),
                    running_tasks: vec![],
                    pending_updates: vec![],
                    task_user: "nobody".into(),
                },
            },
            now,
            &mut out,
        );
    }
    for f in 0..FRAMEWORKS {
        let conn = fw_conn(f);
        m.handle_into(
            Input::FrameworkConnected {
                conn,
                principal: format!("load-fw-{f}"),
            },
            now,
            &mut out,
        );
        m.handle_into(
            Input::Framework {
                conn,
                msg: FrameworkToMaster::Subscribe(FrameworkInfo {
                    framework_id: None,
                    name: format!("load-fw-{f}"),
                    roles: vec![format!("load-role-{}", f % ROLES)],
                    capabilities: vec![Capability::GpuResources],
                    failover_timeout_secs: 60.0,
                    min_allocatable: Vec::new(),
                    suppressed_roles: Vec::new(),
                }),
            },
            now,
            &mut out,
        );
    }
    out.clear();
    // Inputs due at a time (agents' FINISHED updates), and inputs for the next step.
    let mut later: BTreeMap<u64, Vec<Input>> = BTreeMap::new();
    let mut next: VecDeque<Input> = VecDeque::new();
    let (mut launched, mut finished, mut offers, mut messages) = (0u64, 0u64, 0u64, 0u64);
    let mut next_task = 1u128;
    let mut buf = Vec::new();
    let (mut core, mut encode) = (Duration::ZERO, Duration::ZERO);
    let end = seconds * 1000;
    while now < end {
        now += STEP_MS;
        while let Some((&t, _)) = later.first_key_value() {
            if t > now {
                break;
            }
            if let Some((_, v)) = later.pop_first() {
                next.extend(v);
            }
        }
        let started = thread_cpu();
        for input in next.drain(..) {
            m.handle_into(input, now, &mut out);
        }
        m.handle_into(Input::Tick, now, &mut out);
        if m.allocation_due(now) {
            m.allocate(now, &mut out);
        }
        let handled = thread_cpu();
        core += handled - started;
        // What the shell would write.
        buf.clear();
        for o in &out {
            let _ = match o {
                Output::ToAgent(_, msg) => encode_frame_into(&mut buf, msg),
                Output::ToFramework(_, msg) => encode_frame_into(&mut buf, msg),
                _ => Ok(()),
            };
            if buf.len() > 1 << 20 {
                buf.clear();
            }
        }
        encode += thread_cpu() - handled;
        messages += out.len() as u64;
        // The peers' answers, for the next step.
        for o in out.drain(..) {
            match o {
                Output::ToFramework(conn, MasterToFramework::Offers(list)) => {
                    for offer in list {
                        offers += 1;
                        let fits = (offer.resources.milli("gpus") / 1000)
                            .min(offer.resources.milli("cpus") / 1000)
                            .min(8);
                        let tasks: Vec<TaskInfo> = (0..fits)
                            .map(|_| {
                                next_task += 1;
                                TaskInfo {
                                    task_id: TaskId::from_u128(next_task),
                                    name: "load".into(),
                                    command: "true".into(),
                                    resources: task_res.clone(),
                                    env: Default::default(),
                                    kill_grace_secs: None,
                                    gpu_selector: None,
                                    container: None,
                                }
                            })
                            .collect();
                        let operations = if tasks.is_empty() {
                            vec![]
                        } else {
                            vec![Operation::Launch { tasks }]
                        };
                        next.push_back(Input::Framework {
                            conn,
                            msg: FrameworkToMaster::Accept {
                                offer_ids: vec![offer.id],
                                operations,
                                refuse_seconds: Some(1.0),
                            },
                        });
                    }
                }
                Output::ToFramework(conn, MasterToFramework::Update(u)) => {
                    if u.state == TaskState::Finished {
                        finished += 1;
                    }
                    next.push_back(Input::Framework {
                        conn,
                        msg: FrameworkToMaster::Acknowledge {
                            task_id: u.task_id,
                            update_id: u.update_id,
                        },
                    });
                }
                Output::ToAgent(
                    conn,
                    MasterToAgent::RunTask {
                        framework_id, task, ..
                    },
                ) => {
                    launched += 1;
                    let update = |state| Input::Agent {
                        conn,
                        msg: AgentToMaster::StatusUpdate(StatusUpdate::new(
                            task.task_id,
                            framework_id,
                            state,
                        )),
                    };
                    next.push_back(update(TaskState::Starting));
                    next.push_back(update(TaskState::Running));
                    // 1 s give or take 10 %: agents' GPUs free one at a time, as in the harness.
                    let jitter = (launched * 7919) % 200;
                    later
                        .entry(now + TASK_MS - 100 + jitter)
                        .or_default()
                        .push(update(TaskState::Finished));
                }
                _ => {}
            }
        }
        // Heartbeats: every agent every 5 s, spread over the steps.
        let per_step = agents * STEP_MS / 5000;
        let first = (now / STEP_MS * per_step) % agents.max(1);
        for i in 0..per_step {
            let conn: ConnId = 1 + (first + i) % agents;
            next.push_back(Input::Agent {
                conn,
                msg: AgentToMaster::Heartbeat,
            });
        }
    }
    let per = |d: Duration| d.as_secs_f64() * 1e6 / launched.max(1) as f64;
    println!(
        "{agents} agents, {seconds} s simulated: {launched} launched, {finished} finished, {offers} offers, {messages} messages out"
    );
    println!(
        "core {:.2} s ({:.1} us/launch), encoding {:.2} s ({:.1} us/launch), {:.2} offers/launch",
        core.as_secs_f64(),
        per(core),
        encode.as_secs_f64(),
        per(encode),
        offers as f64 / launched.max(1) as f64
    );
}
