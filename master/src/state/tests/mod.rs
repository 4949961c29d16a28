//! Unit tests of the pure state machine: inputs and time in, messages out. One file per
//! operation (openraft's engine tests): this file holds the harness and the helpers they share.

use super::*;

mod accept;
mod agents;
mod dispatch;
mod frameworks;
mod gpus;
mod groups;
mod inventory;
mod maintenance;
mod metrics;
mod models;
mod operator;
mod operator_commands;
mod pacing;
mod partitions;
mod recovery;
mod tasks;
mod timers;
mod updates;

const A: ConnId = 1;

const F: ConnId = 2;

fn res(s: &str) -> Resources {
    s.parse().unwrap()
}

struct Harness {
    m: Master,
    now: Millis,
}

impl Harness {
    fn new() -> Self {
        Self {
            m: Master::new(
                MasterConfig {
                    allocation_min_gap_ms: 0,
                    ..MasterConfig::default()
                },
                7,
            ),
            now: 0,
        }
    }

    fn input(&mut self, i: Input) -> Vec<Output> {
        let mut out = self.m.handle(i, self.now);
        if self.m.allocation_due(self.now) {
            self.m.allocate(self.now, &mut out);
        }
        out
    }

    fn agent(&mut self, conn: ConnId, name: &str, resources: &str) -> AgentId {
        self.input(Input::AgentConnected {
            conn,
            name: name.into(),
            address: "127.0.0.1:1".into(),
        });
        let out = self.input(Input::Agent {
            conn,
            msg: register(None, resources),
        });
        out.iter()
            .find_map(|o| match o {
                Output::ToAgent(c, MasterToAgent::Registered { agent_id, .. }) if *c == conn => {
                    Some(*agent_id)
                }
                _ => None,
            })
            .expect("registered")
    }

    fn framework(
        &mut self,
        conn: ConnId,
        principal: &str,
        role: &str,
    ) -> (FrameworkId, Vec<Offer>) {
        self.input(Input::FrameworkConnected {
            conn,
            principal: principal.into(),
        });
        let out = self.input(Input::Framework {
            conn,
            msg: FrameworkToMaster::Subscribe(info(principal, role, None)),
        });
        let id = out
            .iter()
            .find_map(|o| match o {
                Output::ToFramework(c, MasterToFramework::Subscribed { framework_id, .. })
                    if *c == conn =>
                {
                    Some(*framework_id)
                }
                _ => None,
            })
            .expect("subscribed");
        (id, offers(&out, conn))
    }
}

fn register(agent_id: Option<AgentId>, resources: &str) -> AgentToMaster {
    AgentToMaster::Register {
        agent_id,
        hostname: "h".into(),
        resources: res(resources),
        reserved: Default::default(),
        attributes: Default::default(),
        gpus: vec![],
        running_tasks: vec![],
        pending_updates: vec![],
        task_user: "nobody".into(),
    }
}

/// [`register`] with these GPU records.
fn register_with_gpus(resources: &str, gpus: Vec<GpuInfo>) -> AgentToMaster {
    let mut msg = register(None, resources);
    if let AgentToMaster::Register { gpus: g, .. } = &mut msg {
        *g = gpus;
    }
    msg
}

/// An A100-like GPU `GPU-{i}`: 40 GiB, healthy, not a MIG device.
fn gpu_info(i: u32) -> GpuInfo {
    GpuInfo {
        uuid: format!("GPU-{i}"),
        name: "NVIDIA A100".into(),
        memory_mib: 40_960,
        compute_capability: (8, 0),
        minor: i,
        pci_bus_id: format!("00000000:0{i}:00.0"),
        numa_node: Some(0),
        pci_root: None,
        healthy: true,
        mig_profile: None,
        parent_uuid: None,
    }
}

fn info(name: &str, role: &str, id: Option<FrameworkId>) -> FrameworkInfo {
    FrameworkInfo {
        framework_id: id,
        name: name.into(),
        roles: vec![role.into()],
        capabilities: vec![],
        failover_timeout_secs: 10.0,
        min_allocatable: Vec::new(),
        suppressed_roles: Vec::new(),
    }
}

/// The framework id a `Subscribed` in `out` gives.
fn subscribed(out: &[Output]) -> Option<FrameworkId> {
    out.iter().find_map(|o| match o {
        Output::ToFramework(_, MasterToFramework::Subscribed { framework_id, .. }) => {
            Some(*framework_id)
        }
        _ => None,
    })
}

fn offers(out: &[Output], conn: ConnId) -> Vec<Offer> {
    out.iter()
        .filter_map(|o| match o {
            Output::ToFramework(c, MasterToFramework::Offers(v)) if *c == conn => Some(v.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn errors(out: &[Output]) -> Vec<ErrorKind> {
    out.iter()
        .filter_map(|o| match o {
            Output::ToFramework(_, MasterToFramework::Error { kind, .. }) => Some(*kind),
            _ => None,
        })
        .collect()
}

fn task(r: &str) -> TaskInfo {
    TaskInfo {
        task_id: TaskId::random(),
        name: "t".into(),
        command: "true".into(),
        resources: res(r),
        env: Default::default(),
        kill_grace_secs: None,
        gpu_selector: None,
        container: None,
    }
}

fn launch(offer: OfferId, tasks: Vec<TaskInfo>) -> FrameworkToMaster {
    FrameworkToMaster::Accept {
        offer_ids: vec![offer],
        operations: vec![Operation::Launch { tasks }],
        refuse_seconds: Some(0.0),
    }
}

fn agent_update(task: &TaskInfo, fw: FrameworkId, state: TaskState) -> StatusUpdate {
    StatusUpdate::new(task.task_id, fw, state)
}

/// Launches `tasks` with the framework on `F` and returns what the agent was asked to run.
fn run_tasks(
    h: &mut Harness,
    offer: OfferId,
    tasks: Vec<TaskInfo>,
) -> (Vec<TaskInfo>, Vec<Output>) {
    let out = h.input(Input::Framework {
        conn: F,
        msg: launch(offer, tasks),
    });
    let sent = out
        .iter()
        .filter_map(|o| match o {
            Output::ToAgent(_, MasterToAgent::RunTask { task, .. }) => Some(task.clone()),
            _ => None,
        })
        .collect();
    (sent, out)
}

fn offers_of(out: &[Output]) -> Vec<Offer> {
    offers(out, F)
}

// Security between tenants (docs/security.md): identities, ACLs, limits.

/// The subscription refusal on `conn`, if any: the error text, and whether it closes.
fn refusal(out: &[Output], conn: ConnId) -> Option<String> {
    let message = out.iter().find_map(|o| match o {
        Output::ToFramework(c, MasterToFramework::Error { message, .. }) if *c == conn => {
            Some(message.clone())
        }
        _ => None,
    })?;
    assert!(
        out.iter()
            .any(|o| matches!(o, Output::Close { conn: c, .. } if *c == conn)),
        "refused but not closed: {out:?}"
    );
    assert!(
        !out.iter().any(|o| matches!(
            o,
            Output::ToFramework(c, MasterToFramework::Subscribed { .. }) if *c == conn
        )),
        "refused and subscribed: {out:?}"
    );
    Some(message)
}

/// The agent refusal on `conn`, if any.
fn agent_refusal(out: &[Output], conn: ConnId) -> Option<String> {
    let message = out.iter().find_map(|o| match o {
        Output::ToAgent(c, MasterToAgent::Error { message }) if *c == conn => Some(message.clone()),
        _ => None,
    })?;
    assert!(
        out.iter()
            .any(|o| matches!(o, Output::Close { conn: c, .. } if *c == conn)),
        "refused but not closed: {out:?}"
    );
    assert!(
        !out.iter().any(|o| matches!(
            o,
            Output::ToAgent(c, MasterToAgent::Registered { .. }) if *c == conn
        )),
        "refused and registered: {out:?}"
    );
    Some(message)
}

impl Harness {
    fn with_config(config: MasterConfig) -> Self {
        Self {
            m: Master::new(
                MasterConfig {
                    allocation_min_gap_ms: 0,
                    ..config
                },
                7,
            ),
            now: 0,
        }
    }

    /// Acknowledges every update in `out` sent to framework connection `conn`.
    fn ack_all(&mut self, out: &[Output], conn: ConnId) {
        for o in out {
            if let Output::ToFramework(c, MasterToFramework::Update(u)) = o {
                if *c == conn && !u.reconciliation {
                    self.input(Input::Framework {
                        conn,
                        msg: FrameworkToMaster::Acknowledge {
                            task_id: u.task_id,
                            update_id: u.update_id,
                        },
                    });
                }
            }
        }
    }

    /// A raw subscribe by `principal` on a new connection `conn`.
    fn subscribe(&mut self, conn: ConnId, principal: &str, info: FrameworkInfo) -> Vec<Output> {
        self.input(Input::FrameworkConnected {
            conn,
            principal: principal.into(),
        });
        self.input(Input::Framework {
            conn,
            msg: FrameworkToMaster::Subscribe(info),
        })
    }

    /// A raw registration by agent `name` on a new connection `conn`.
    fn register(&mut self, conn: ConnId, name: &str, msg: AgentToMaster) -> Vec<Output> {
        self.input(Input::AgentConnected {
            conn,
            name: name.into(),
            address: format!("10.0.0.{conn}:5051"),
        });
        self.input(Input::Agent { conn, msg })
    }
}
