//! Access control: who may do what (PURE; no I/O beyond [`Acls::load`]).
//!
//! Principals come from certificates (`framework:PRINCIPAL`, `operator:NAME`) or operator
//! tokens; this module only answers questions about names. The rules follow Mesos's ACLs:
//! - `register_frameworks`: which principals may subscribe a framework with which roles;
//! - `run_tasks`: which principals may launch tasks as which Unix users;
//! - `operator`: which operators may perform which write actions on the operator API.
//!
//! With no ACL file the master runs in **dev mode**: everything is allowed (the shell warns
//! once at startup). Once an ACL file is given, everything not granted is denied.
//!
//! ```toml
//! [[register_frameworks]]
//! principals = ["analytics"]        # "*" = any principal
//! roles = ["analytics", "eng/*"]    # "eng/*": every role below eng (not eng itself); "*": any
//!
//! [[run_tasks]]
//! principals = ["*"]
//! users = ["nobody", "gantry"]      # "*" = any user except root; root only when named
//!
//! [[operator]]
//! principals = ["admin"]            # operator names
//! actions = ["*"]                   # or e.g. ["set_weight", "set_quota", "drain"]
//! ```

use std::path::Path;

use serde::Deserialize;

use super::limits::{valid_role, valid_user};

/// Why an ACL file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AclError {
    #[error("reading ACL file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("ACL file is not valid: {0}")]
    Parse(#[from] toml::de::Error),
    #[error("ACL rule {section}[{index}]: {message}")]
    Invalid {
        section: &'static str,
        index: usize,
        message: String,
    },
}

/// A write action on the operator API, each authorized separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OperatorAction {
    SetWeight,
    SetQuota,
    Reserve,
    Unreserve,
    Drain,
    Undrain,
    Deactivate,
    Reactivate,
    MarkGone,
    Teardown,
    ClearGpu,
    /// Read a task's sandbox: list and read its files, follow its logs.
    ReadSandbox,
    /// Run a command inside a running task.
    Exec,
    /// Destroy a framework's persistent volume on an agent (and its data).
    DestroyVolume,
}

impl OperatorAction {
    /// Every action, in a stable order.
    pub const ALL: [OperatorAction; 14] = [
        OperatorAction::SetWeight,
        OperatorAction::SetQuota,
        OperatorAction::Reserve,
        OperatorAction::Unreserve,
        OperatorAction::Drain,
        OperatorAction::Undrain,
        OperatorAction::Deactivate,
        OperatorAction::Reactivate,
        OperatorAction::MarkGone,
        OperatorAction::Teardown,
        OperatorAction::ClearGpu,
        OperatorAction::ReadSandbox,
        OperatorAction::Exec,
        OperatorAction::DestroyVolume,
    ];

    /// The name used in ACL files and error messages.
    pub fn name(self) -> &'static str {
        match self {
            OperatorAction::SetWeight => "set_weight",
            OperatorAction::SetQuota => "set_quota",
            OperatorAction::Reserve => "reserve",
            OperatorAction::Unreserve => "unreserve",
            OperatorAction::Drain => "drain",
            OperatorAction::Undrain => "undrain",
            OperatorAction::Deactivate => "deactivate",
            OperatorAction::Reactivate => "reactivate",
            OperatorAction::MarkGone => "mark_gone",
            OperatorAction::Teardown => "teardown",
            OperatorAction::ClearGpu => "clear_gpu",
            OperatorAction::ReadSandbox => "read_sandbox",
            OperatorAction::Exec => "exec",
            OperatorAction::DestroyVolume => "destroy_volume",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == s)
    }
}

/// The access-control lists in force.
#[derive(Debug, Clone, Default)]
pub struct Acls {
    /// `None`: dev mode, everything allowed.
    rules: Option<Rules>,
}

#[derive(Debug, Clone, Default)]
struct Rules {
    register: Vec<Grant<RolePattern>>,
    run: Vec<Grant<UserPattern>>,
    operator: Vec<Grant<ActionPattern>>,
}

#[derive(Debug, Clone)]
struct Grant<T> {
    principals: Names,
    objects: Vec<T>,
}

#[derive(Debug, Clone)]
enum Names {
    Any,
    Some(Vec<String>),
}

impl Names {
    fn contains(&self, name: &str) -> bool {
        match self {
            Names::Any => true,
            Names::Some(v) => v.iter().any(|n| n == name),
        }
    }
}

#[derive(Debug, Clone)]
enum RolePattern {
    Any,
    Exact(String),
    /// `eng/*`: strict descendants of `eng`.
    Below(String),
}

#[derive(Debug, Clone)]
enum UserPattern {
    /// `*`: any user but root.
    AnyButRoot,
    Exact(String),
}

#[derive(Debug, Clone)]
enum ActionPattern {
    Any,
    One(OperatorAction),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    register_frameworks: Vec<RegisterEntry>,
    #[serde(default)]
    run_tasks: Vec<RunEntry>,
    #[serde(default)]
    operator: Vec<OperatorEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegisterEntry {
    principals: Vec<String>,
    roles: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunEntry {
    principals: Vec<String>,
    users: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OperatorEntry {
    principals: Vec<String>,
    actions: Vec<String>,
}

fn names(section: &'static str, index: usize, principals: Vec<String>) -> Result<Names, AclError> {
    if principals.is_empty() {
        return Err(AclError::Invalid {
            section,
            index,
            message: "principals is empty".into(),
        });
    }
    if principals.iter().any(|p| p == "*") {
        return Ok(Names::Any);
    }
    if let Some(p) = principals.iter().find(|p| p.is_empty()) {
        return Err(AclError::Invalid {
            section,
            index,
            message: format!("invalid principal {p:?}"),
        });
    }
    Ok(Names::Some(principals))
}

impl Acls {
    /// Dev mode: everything is allowed.
    pub fn allow_all() -> Self {
        Self { rules: None }
    }

    /// True in dev mode (no ACL file): the shell should warn once.
    pub fn is_dev_mode(&self) -> bool {
        self.rules.is_none()
    }

    /// Reads an ACL file (TOML, see the module docs).
    pub fn load(path: &Path) -> Result<Self, AclError> {
        let text = std::fs::read_to_string(path).map_err(|source| AclError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text)
    }

    /// Parses ACLs from TOML text. An empty file denies everything.
    pub fn from_toml(text: &str) -> Result<Self, AclError> {
        let file: File = toml::from_str(text)?;
        let mut rules = Rules::default();
        for (i, e) in file.register_frameworks.into_iter().enumerate() {
            let section = "register_frameworks";
            let principals = names(section, i, e.principals)?;
            let mut objects = Vec::new();
            for r in e.roles {
                objects.push(if r == "*" {
                    RolePattern::Any
                } else if let Some(parent) = r.strip_suffix("/*") {
                    if !valid_role(parent) {
                        return Err(AclError::Invalid {
                            section,
                            index: i,
                            message: format!("invalid role pattern {r:?}"),
                        });
                    }
                    RolePattern::Below(parent.to_string())
                } else if valid_role(&r) {
                    RolePattern::Exact(r)
                } else {
                    return Err(AclError::Invalid {
                        section,
                        index: i,
                        message: format!("invalid role {r:?}"),
                    });
                });
            }
            rules.register.push(Grant {
                principals,
                objects,
            });
        }
        for (i, e) in file.run_tasks.into_iter().enumerate() {
            let section = "run_tasks";
            let principals = names(section, i, e.principals)?;
            let mut objects = Vec::new();
            for u in e.users {
                objects.push(if u == "*" {
                    UserPattern::AnyButRoot
                } else if valid_user(&u) {
                    UserPattern::Exact(u)
                } else {
                    return Err(AclError::Invalid {
                        section,
                        index: i,
                        message: format!("invalid user name {u:?}"),
                    });
                });
            }
            rules.run.push(Grant {
                principals,
                objects,
            });
        }
        for (i, e) in file.operator.into_iter().enumerate() {
            let section = "operator";
            let principals = names(section, i, e.principals)?;
            let mut objects = Vec::new();
            for a in e.actions {
                objects.push(if a == "*" {
                    ActionPattern::Any
                } else if let Some(action) = OperatorAction::parse(&a) {
                    ActionPattern::One(action)
                } else {
                    let known: Vec<_> = OperatorAction::ALL.iter().map(|a| a.name()).collect();
                    return Err(AclError::Invalid {
                        section,
                        index: i,
                        message: format!("unknown action {a:?} (known: {})", known.join(", ")),
                    });
                });
            }
            rules.operator.push(Grant {
                principals,
                objects,
            });
        }
        Ok(Self { rules: Some(rules) })
    }

    /// May `principal` subscribe a framework with `role`?
    pub fn may_register(&self, principal: &str, role: &str) -> bool {
        let Some(rules) = &self.rules else {
            return true;
        };
        rules
            .register
            .iter()
            .filter(|g| g.principals.contains(principal))
            .flat_map(|g| &g.objects)
            .any(|p| match p {
                RolePattern::Any => true,
                RolePattern::Exact(r) => r == role,
                RolePattern::Below(parent) => role
                    .strip_prefix(parent.as_str())
                    .is_some_and(|rest| rest.starts_with('/')),
            })
    }

    /// May `principal` launch tasks that run as the Unix user `user`?
    pub fn may_run_as(&self, principal: &str, user: &str) -> bool {
        let Some(rules) = &self.rules else {
            return true;
        };
        rules
            .run
            .iter()
            .filter(|g| g.principals.contains(principal))
            .flat_map(|g| &g.objects)
            .any(|p| match p {
                UserPattern::AnyButRoot => user != "root",
                UserPattern::Exact(u) => u == user,
            })
    }

    /// May the operator `name` perform `action`?
    pub fn may_operate(&self, name: &str, action: OperatorAction) -> bool {
        let Some(rules) = &self.rules else {
            return true;
        };
        rules
            .operator
            .iter()
            .filter(|g| g.principals.contains(name))
            .flat_map(|g| &g.objects)
            .any(|p| match p {
                ActionPattern::Any => true,
                ActionPattern::One(a) => *a == action,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
[[register_frameworks]]
principals = ["analytics"]
roles = ["analytics", "eng/*"]

[[register_frameworks]]
principals = ["*"]
roles = ["public"]

[[run_tasks]]
principals = ["analytics"]
users = ["*"]

[[run_tasks]]
principals = ["ops"]
users = ["root"]

[[operator]]
principals = ["admin"]
actions = ["*"]

[[operator]]
principals = ["oncall"]
actions = ["drain", "undrain"]
"#;

    #[test]
    fn dev_mode_allows_everything() {
        let acls = Acls::allow_all();
        assert!(acls.is_dev_mode());
        assert!(acls.may_register("x", "any/role"));
        assert!(acls.may_run_as("x", "root"));
        assert!(acls.may_operate("x", OperatorAction::Teardown));
    }

    #[test]
    fn roles_are_granted_exactly_or_below() {
        let acls = Acls::from_toml(EXAMPLE).unwrap();
        assert!(!acls.is_dev_mode());
        assert!(acls.may_register("analytics", "analytics"));
        assert!(acls.may_register("analytics", "eng/ml"));
        assert!(acls.may_register("analytics", "eng/ml/x"));
        assert!(!acls.may_register("analytics", "eng"));
        assert!(!acls.may_register("analytics", "engine/x"));
        assert!(!acls.may_register("analytics", "analytics/sub"));
        assert!(acls.may_register("someone", "public"));
        assert!(!acls.may_register("someone", "analytics"));
    }

    #[test]
    fn root_only_when_named() {
        let acls = Acls::from_toml(EXAMPLE).unwrap();
        assert!(acls.may_run_as("analytics", "nobody"));
        assert!(!acls.may_run_as("analytics", "root"));
        assert!(acls.may_run_as("ops", "root"));
        assert!(!acls.may_run_as("ops", "nobody"));
        assert!(!acls.may_run_as("stranger", "nobody"));
    }

    #[test]
    fn operator_actions() {
        let acls = Acls::from_toml(EXAMPLE).unwrap();
        for a in OperatorAction::ALL {
            assert!(acls.may_operate("admin", a));
        }
        assert!(acls.may_operate("oncall", OperatorAction::Drain));
        assert!(!acls.may_operate("oncall", OperatorAction::SetQuota));
        assert!(!acls.may_operate("stranger", OperatorAction::Drain));
    }

    #[test]
    fn empty_file_denies_everything() {
        let acls = Acls::from_toml("").unwrap();
        assert!(!acls.may_register("a", "r"));
        assert!(!acls.may_run_as("a", "nobody"));
        assert!(!acls.may_operate("a", OperatorAction::SetWeight));
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let e = Acls::from_toml("[[operator]]\nprincipals=[\"a\"]\nactions=[\"nuke\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("nuke") && e.contains("set_weight"), "{e}");
        let e = Acls::from_toml("[[register_frameworks]]\nprincipals=[]\nroles=[\"a\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("principals is empty"), "{e}");
        let e = Acls::from_toml("[[register_frameworks]]\nprincipals=[\"a\"]\nroles=[\"../x\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid role"), "{e}");
        assert!(Acls::from_toml("[[nope]]\n").is_err());
        let e = Acls::from_toml("[[run_tasks]]\nprincipals=[\"a\"]\nusers=[\"-rf\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid user"), "{e}");
    }
}
