use gantry_sdk::protocol::*;
use gantry_sdk::{Driver, DriverConfig, DriverHandle, Scheduler};

struct Once {
    launched: bool,
}

impl Scheduler for Once {
    async fn offers(&mut self, driver: &DriverHandle, offers: Vec<Offer>) {
        for offer in offers {
            let resources: Resources = "cpus:0.5;mem:64".parse().unwrap();
            let task = TaskInfo::new("hello", "echo hello from $GANTRY_TASK_ID", resources);
            if !self.launched && offer.total().contains(&task.resources) {
                self.launched = true;
                driver.launch(offer.id, vec![task]);
            } else {
                driver.decline(vec![offer.id], Some(30.0));
            }
        }
    }

    async fn status_update(&mut self, driver: &DriverHandle, update: &StatusUpdate) {
        println!("{} is {}: {}", update.task_id, update.state, update.message);
        if update.state.is_terminal() {
            driver.stop();
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // hello [MASTER [TLS_DIR]]
    let mut args = std::env::args().skip(1);
    let master = args.next().unwrap_or_else(|| "127.0.0.1:5050".into());
    let tls_dir = args.next().unwrap_or_else(|| "/tmp/gantry-tls".into());
    let config = DriverConfig::builder("hello") // principal = certificate name
        .master(master) // one call per master
        .tls_dir(tls_dir)
        .role("default")
        .build();
    Driver::new(config).run(Once { launched: false }).await?;
    Ok(())
}
