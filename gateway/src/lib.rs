//! The agent action gateway: `POST /v1/act` authenticates, checks scope, rate-limits,
//! injects a vault credential, calls the upstream tool, and answers only once a signed
//! receipt is durable in the SQLite ledger.

pub mod mock_upstream;
pub mod probe;
