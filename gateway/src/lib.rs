//! The agent action gateway: `POST /v1/act` authenticates, checks scope, rate-limits,
//! injects a vault credential, calls the upstream tool, and answers only once a signed
//! receipt is durable in the SQLite ledger.

pub mod act;
pub mod acting;
pub mod admin;
pub mod apikey;
pub mod app;
pub mod canonical;
pub mod config;
pub mod conns;
pub mod db;
pub mod error;
pub mod ledger;
pub mod lock;
pub mod mock_upstream;
pub mod probe;
pub mod ratelimit;
pub mod repoll;
pub mod secrets;
pub mod server;
pub mod upstream;
