//! The dashboard's rendering helpers.

use super::*;
use serde_json::json;

#[test]
fn pages_escape_what_peers_control() {
    let state = json!({
        "leader": true, "epoch": 1,
        "agents": [{"id": "a1", "name": "<script>x</script>", "connected": true, "active": true,
                    "hostname": "h\"", "total": {"gpus": 1.0}, "used": {}, "offered": {},
                    "gpus": [{"uuid": "GPU-1", "name": "A100", "memory_mib": 40960, "healthy": false}],
                    "gpu_samples": [{"uuid": "GPU-1", "util_percent": 87, "mem_used_bytes": 1048576,
                                     "temperature_c": 60, "power_mw": 250000}]}],
        "frameworks": [],
        "tasks": [{"id": "t1", "name": "<b>train</b>", "state": "RUNNING", "framework_id": "f1",
                   "agent_id": "a1", "gpus": ["GPU-1"], "resources": {"gpus": 1.0}, "message": "&",
                   "ports": [31000, 31001]}],
        "completed_tasks": [], "completed_frameworks": [], "offers": [],
        "allocator": {"roles": {}}
    });
    let html = render_page(&state, Some("c\"sr<f"), &View::default());
    assert!(
        html.contains("name=\"csrf\" value=\"c&quot;sr&lt;f\""),
        "logout form"
    );
    assert!(!render_page(&state, None, &View::default()).contains("/ui/logout"));
    assert!(!html.contains("<script>x</script>"));
    assert!(html.contains("&lt;script&gt;x&lt;/script&gt;"));
    assert!(!html.contains("<b>train</b>"));
    assert!(html.contains("data-uuid=\"GPU-1\" data-healthy=\"false\""));
    assert!(html.contains("87%"));
    assert!(
        html.contains("class=\"gpu-task\"><a href=\"/ui/tasks/t1\">&lt;b&gt;train&lt;/b&gt;</a>")
    );
    assert!(html.contains("<a href=\"/ui/agents/a1\">&lt;script&gt;x&lt;/script&gt;</a>"));
    assert!(html.contains("data-state=\"RUNNING\""));
    assert!(html.contains("<td>31000 31001</td>"), "the task's ports");
}
