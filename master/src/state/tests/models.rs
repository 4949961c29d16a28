//! GPU models in declared demand through the state machine (`allocator::models`): idle offers
//! of the model are reclaimed for a framework whose demand names it, and two frameworks
//! holding offers on one agent never count the same GPU share (the earmarks of demand-split
//! offers are kept out of the others' offers and accepts).

use super::*;

const F2: ConnId = 3;

fn h100(i: u32) -> GpuInfo {
    GpuInfo {
        name: "NVIDIA H100 80GB HBM3".into(),
        ..gpu_info(i)
    }
}

fn gpu_framework(h: &mut Harness, conn: ConnId, name: &str) -> Vec<Output> {
    let mut info = info(name, name, None);
    info.capabilities = vec![Capability::GpuResources];
    h.subscribe(conn, name, info)
}

fn accept(h: &mut Harness, conn: ConnId, offer: OfferId, t: TaskInfo) -> Vec<Output> {
    h.input(Input::Framework {
        conn,
        msg: FrameworkToMaster::Accept {
            offer_ids: vec![offer],
            operations: vec![Operation::Launch { tasks: vec![t] }],
            refuse_seconds: Some(0.0),
        },
    })
}

fn ran_on(out: &[Output]) -> Option<Vec<String>> {
    out.iter().find_map(|o| match o {
        Output::ToAgent(_, MasterToAgent::RunTask { gpus, .. }) => Some(gpus.clone()),
        _ => None,
    })
}

#[test]
fn a_model_demand_reclaims_idle_offers_and_the_gpu_shares_are_never_counted_twice() {
    let mut h = Harness::new();
    h.register(
        A,
        "h100-host",
        register_with_gpus("cpus:8;mem:8192;gpus:2", vec![h100(0), h100(1)]),
    );
    // f1 holds the whole agent.
    let out = gpu_framework(&mut h, F, "f1");
    let held = offers(&out, F);
    assert_eq!(held.len(), 1);
    // f2 wants a half of an H100: nothing is free, so f1's idle offer is rescinded and f2 is
    // offered a task's worth first, f1 the rest.
    gpu_framework(&mut h, F2, "f2");
    let out = h.input(Input::Framework {
        conn: F2,
        msg: FrameworkToMaster::SetDemand {
            demands: vec![Demand::new(res("cpus:1;mem:512;gpus:0.5"), 1).with_gpu_model("h100")],
        },
    });
    assert!(out.iter().any(|o| matches!(
        o,
        Output::ToFramework(c, MasterToFramework::Rescind { offer_id }) if *c == F && *offer_id == held[0].id
    )));
    let mine = offers(&out, F2);
    assert_eq!(mine.len(), 1, "{out:?}");
    assert_eq!(mine[0].resources, res("cpus:1;mem:512;gpus:0.5"));
    // Its offer lists only the GPU its half was earmarked on...
    assert_eq!(mine[0].gpu_free.len(), 1);
    let marked = mine[0].gpu_free[0].uuid.clone();
    assert_eq!(mine[0].gpu_free[0].free_milli, 500);
    // ...and f1's offer of the rest shows that GPU half taken.
    let rest = offers(&out, F);
    assert_eq!(rest.len(), 1);
    let shown = |uuid: &str| {
        rest[0]
            .gpu_free
            .iter()
            .find(|g| g.uuid == uuid)
            .map(|g| g.free_milli)
    };
    assert_eq!(shown(&marked), Some(500));
    // f1's whole GPU is steered to the other GPU.
    let out = accept(&mut h, F, rest[0].id, task("cpus:1;mem:512;gpus:1"));
    let whole = ran_on(&out).expect("the whole GPU runs");
    assert_eq!(whole.len(), 1);
    assert_ne!(whole[0], marked);
    // f2's half runs where its offer said.
    let out = accept(&mut h, F2, mine[0].id, task("cpus:1;mem:512;gpus:0.5"));
    assert_eq!(ran_on(&out), Some(vec![marked]));
}
