//! The end-to-end benchmark's parts: load generation free of coordinated
//! omission ([`load`]), callers for each system under test ([`systems`],
//! [`http`]), the machine's floors ([`floors`]), the scenarios
//! ([`scenario`]) and the report ([`report`]). The command is `bench-e2e`
//! (`src/main.rs`).

pub mod beside;
pub mod floors;
pub mod http;
pub mod load;
pub mod redis_stack;
pub mod report;
pub mod scenario;
pub mod systems;
