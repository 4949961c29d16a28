//! Operator commands: role names, weights and quotas.

use super::*;

#[test]
fn role_names() {
    assert!(valid_role("eng"));
    assert!(valid_role("eng/ml"));
    for bad in ["", "/eng", "eng/", "eng//ml", "..", "a b", "eng/.."] {
        assert!(!valid_role(bad), "{bad}");
    }
}

#[test]
fn operator_commands_are_validated() {
    let mut h = Harness::new();
    assert!(h
        .m
        .operator(OperatorCommand::SetWeight {
            role: "a".into(),
            weight: 2.0
        })
        .is_ok());
    assert!(h
        .m
        .operator(OperatorCommand::SetWeight {
            role: "a".into(),
            weight: 0.0
        })
        .is_err());
    assert!(h
        .m
        .operator(OperatorCommand::SetWeight {
            role: "a b".into(),
            weight: 1.0
        })
        .is_err());
    let q = |role: &str, g: &str, l: &str| OperatorCommand::SetQuota {
        role: role.into(),
        guarantee: Some(res(g)),
        limit: Some(ResourceLimits::parse(l).unwrap()),
    };
    assert!(h.m.operator(q("a", "cpus:2", "cpus:4")).is_ok());
    assert!(h.m.operator(q("a", "cpus:8", "cpus:4")).is_err());
    assert!(
        h.m.operator(q("a", "mem:1", "mem:0")).is_err(),
        "a zero limit is a limit"
    );
    assert_eq!(h.m.allocator.metrics().roles["a"].weight, 2.0);
    // Nested guarantees: the subroles' sum may not exceed the parent's, and the parent may not
    // go below it; a refused quota changes nothing.
    assert!(h.m.operator(q("a/x", "cpus:1.5", "")).is_ok());
    let err =
        h.m.operator(q("a/y", "cpus:1", ""))
            .unwrap_err()
            .to_string();
    assert!(err.contains("\"a\"") && err.contains("cpus:2.5"), "{err}");
    let err = h.m.operator(q("a", "cpus:1", "")).unwrap_err().to_string();
    assert!(err.contains("below"), "{err}");
    let roles = h.m.allocator.metrics().roles;
    assert_eq!(roles["a"].quota_guarantee, Some(res("cpus:2")));
    assert_eq!(
        roles["a"].quota_limit,
        Some(ResourceLimits::parse("cpus:4").unwrap())
    );
    assert_eq!(
        roles.get("a/y").and_then(|r| r.quota_guarantee.clone()),
        None
    );
}

#[test]
fn weights_and_quotas_outside_sane_bounds_are_refused_and_change_nothing() {
    let mut h = Harness::new();
    for weight in [
        f64::NAN,
        f64::INFINITY,
        -1.0,
        0.0,
        MIN_WEIGHT / 2.0,
        MAX_WEIGHT * 2.0,
        1e300,
    ] {
        let err =
            h.m.operator(OperatorCommand::SetWeight {
                role: "a".into(),
                weight,
            })
            .unwrap_err()
            .to_string();
        assert!(err.contains("positive"), "{weight}: {err}");
    }
    for weight in [MIN_WEIGHT, MAX_WEIGHT] {
        assert!(h
            .m
            .operator(OperatorCommand::SetWeight {
                role: "b".into(),
                weight,
            })
            .is_ok());
    }
    assert!(!h.m.allocator.metrics().roles.contains_key("a"));
    let huge = Resources::new().with("cpus", 2e12);
    for (guarantee, limit) in [
        (Some(huge.clone()), None),
        (None, Some(ResourceLimits::from(&huge))),
    ] {
        assert!(h
            .m
            .operator(OperatorCommand::SetQuota {
                role: "a".into(),
                guarantee,
                limit,
            })
            .is_err());
    }
    let many = (0..=MAX_QUOTA_KINDS).fold(Resources::new(), |r, i| r.with(&format!("r{i}"), 1.0));
    assert!(h
        .m
        .operator(OperatorCommand::SetQuota {
            role: "a".into(),
            guarantee: None,
            limit: Some(ResourceLimits::from(&many)),
        })
        .is_err());
}
