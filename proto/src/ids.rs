//! Identifier newtypes over UUIDs. Ids are never bare strings, so an agent id can not be passed
//! where a framework id is expected.

use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

macro_rules! uuid_id {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            /// A fresh random id.
            pub fn random() -> Self {
                Self(Uuid::new_v4())
            }
            /// The id whose 128 bits are `n` (deterministic ids for simulations and tests).
            pub fn from_u128(n: u128) -> Self {
                Self(Uuid::from_u128(n))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = uuid::Error;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map(Self)
            }
        }
    };
}

uuid_id!(
    /// A framework, assigned by the master when it first subscribes.
    FrameworkId
);
uuid_id!(
    /// An agent, assigned by the master when it first registers.
    AgentId
);
uuid_id!(
    /// An offer, assigned by the master.
    OfferId
);
uuid_id!(
    /// A task, chosen by the framework (use [`TaskId::random`]).
    TaskId
);
uuid_id!(
    /// One status update, so acknowledgements name exactly the update they acknowledge.
    UpdateId
);
