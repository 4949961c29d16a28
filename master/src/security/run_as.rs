//! The run-as policy (PURE): which Unix user a task runs as, and whether its framework's
//! principal may run tasks as that user.
//!
//! A task runs as its command's user or, when it names none, as its agent's default task user
//! (reported at registration, checked by [`check_agent_default`]). The user must be a plausible
//! Unix name ([`valid_user`]) and the `run_tasks` ACL must grant it to the framework's principal
//! ([`Acls::may_run_as`]: `"*"` is any user but root, compared by name here; the agent refuses a
//! uid-0 account under another name). [`task_user`] decides both, filling in the default.

use super::acl::Acls;
use super::limits::valid_user;

/// Why a task may not run as the user it asks for (the text follows `task ID: ` in the task's
/// `ERROR` update).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunAsRejection {
    #[error("invalid user name {0:?}")]
    InvalidUser(String),
    #[error("principal {principal:?} may not run tasks as user {user:?} (run_tasks ACL)")]
    NotAllowed { principal: String, user: String },
}

/// An agent's default task user that is not a plausible Unix name (the agent hears the text
/// and is closed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid task user {0:?}")]
pub struct InvalidAgentDefault(pub String);

/// Fills in `user` with the agent's default when the task names none, then decides whether
/// `principal` may run the task as that user.
pub fn task_user(
    acls: &Acls,
    principal: &str,
    user: &mut Option<String>,
    agent_default: &str,
) -> Result<(), RunAsRejection> {
    let user = user.get_or_insert_with(|| agent_default.to_string());
    if !valid_user(user) {
        return Err(RunAsRejection::InvalidUser(user.clone()));
    }
    if !acls.may_run_as(principal, user) {
        return Err(RunAsRejection::NotAllowed {
            principal: principal.to_string(),
            user: user.clone(),
        });
    }
    Ok(())
}

/// Whether an agent's default task user (sent at registration) is a plausible Unix name.
pub fn check_agent_default(user: &str) -> Result<(), InvalidAgentDefault> {
    if valid_user(user) {
        Ok(())
    } else {
        Err(InvalidAgentDefault(user.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_filled_in_and_checked_against_the_acls() {
        let acls = Acls::from_toml(
            r#"
[[run_tasks]]
principals = ["a"]
users = ["nobody"]
"#,
        )
        .unwrap();
        let mut user = None;
        assert_eq!(task_user(&acls, "a", &mut user, "nobody"), Ok(()));
        assert_eq!(user.as_deref(), Some("nobody"));
        let mut user = Some("root".to_string());
        assert_eq!(
            task_user(&acls, "a", &mut user, "nobody")
                .unwrap_err()
                .to_string(),
            "principal \"a\" may not run tasks as user \"root\" (run_tasks ACL)"
        );
        let mut user = Some("-x".to_string());
        assert_eq!(
            task_user(&Acls::allow_all(), "a", &mut user, "nobody"),
            Err(RunAsRejection::InvalidUser("-x".into()))
        );
        assert!(check_agent_default("nobody").is_ok());
        assert_eq!(
            check_agent_default("a b").unwrap_err().to_string(),
            "invalid task user \"a b\""
        );
    }
}
