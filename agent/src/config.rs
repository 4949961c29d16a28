//! Parsing of the agent's command-line values.

use std::collections::BTreeMap;

use gantry_proto::Attributes;
use gantry_proto::Resources;

/// Errors in the agent's configuration values.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("attribute {0:?} is not of the form KEY:VALUE")]
    Attribute(String),
    #[error("reservation {0:?} is not of the form ROLE=RESOURCES (e.g. ml=cpus:2;mem:1024)")]
    Reservation(String),
    #[error("reservation for role {role:?}: {source}")]
    ReservationResources {
        role: String,
        source: gantry_proto::ResourceParseError,
    },
}

/// Parses `"rack:r1;zone:a"`.
pub fn parse_attributes(text: &str) -> Result<Attributes, ConfigError> {
    let mut out = BTreeMap::new();
    for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (k, v) = entry
            .split_once(':')
            .ok_or_else(|| ConfigError::Attribute(entry.to_string()))?;
        let (k, v) = (k.trim(), v.trim());
        if k.is_empty() {
            return Err(ConfigError::Attribute(entry.to_string()));
        }
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

/// Parses one `ROLE=RESOURCES` static reservation.
pub fn parse_reservation(text: &str) -> Result<(String, Resources), ConfigError> {
    let (role, res) = text
        .split_once('=')
        .ok_or_else(|| ConfigError::Reservation(text.to_string()))?;
    let role = role.trim().to_string();
    if role.is_empty() {
        return Err(ConfigError::Reservation(text.to_string()));
    }
    let resources = Resources::parse(res).map_err(|source| ConfigError::ReservationResources {
        role: role.clone(),
        source,
    })?;
    Ok((role, resources))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_and_reservations() {
        let a = parse_attributes("rack:r1; zone:a").unwrap();
        assert_eq!(a["rack"], "r1");
        assert!(parse_attributes("rack").is_err());
        let (role, r) = parse_reservation("ml=cpus:2;mem:1024").unwrap();
        assert_eq!(role, "ml");
        assert_eq!(r.get("cpus"), 2.0);
        assert!(parse_reservation("cpus:2").is_err());
        assert!(parse_reservation("ml=cpus:x").is_err());
    }
}
