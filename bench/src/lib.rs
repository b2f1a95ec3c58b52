//! The end-to-end benchmark's parts: load generation free of coordinated
//! omission ([`load`]), callers for each system under test ([`systems`],
//! [`http`]) and the machine's floors ([`floors`]).

pub mod floors;
pub mod http;
pub mod load;
pub mod systems;
