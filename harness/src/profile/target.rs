//! `--target`: the server a session loads and traces. The gateway (the default) runs behind
//! its demo ledger and is loaded with its API key; a proxy (Debian's nginx, haproxy or caddy,
//! traced kernel-only) runs in front of mock-upstream and is loaded with `loadgen --direct`
//! (POST /echo, a unique x-request-id each, none with `--no-request-id`; no key). Either way
//! it is pinned to the gateway's CPUs, and its pid is the one the tracer and the CPU figures
//! follow.

use std::path::Path;

use clap::builder::{PossibleValuesParser, TypedValueParser as _};
pub use session::traced::Target;
use testproc::proxy::Proxy;

use crate::flags::Placement;
use crate::procs::{self, Binaries, Listener, Served};

/// `--target`'s parser: one of [`Target::ALL`]'s names, which `--help` lists.
pub fn parser() -> impl clap::builder::TypedValueParser<Value = Target> {
    PossibleValuesParser::new(Target::ALL.map(Target::name))
        .map(|name| Target::from_name(&name).expect("a possible value names a target"))
}

/// The Debian proxy a target is, if it is one.
pub fn proxy(target: Target) -> Option<Proxy> {
    Proxy::from_name(target.name())
}

/// The command that prints the target's version (`nginx -v`); None for the gateway.
pub fn version_command(target: Target) -> Option<String> {
    proxy(target).map(|p| format!("{} {}", p.package(), p.version_args().join(" ")))
}

/// The target running, in front of mock-upstream.
pub struct Server {
    pub mock: Listener,
    pub target: Listener,
    /// loadgen's flags that reach it: the demo ledger's API key, or `--direct`.
    pub client: Vec<String>,
    /// As it reports it (`nginx -v`); None for the gateway, whose version is the commit.
    pub version: Option<String>,
}

/// Starts mock-upstream (delay `delay_ms`) on the load CPUs and `target` in front of it on the
/// gateway's CPUs; a proxy missing from the machine is installed with apt-get first.
pub fn start(
    target: Target,
    bins: &Binaries,
    placement: &Placement,
    delay_ms: u64,
    logs: &Path,
) -> anyhow::Result<Server> {
    let Some(proxy) = proxy(target) else {
        let Served { mock, key, gateway } = procs::start_served(bins, placement, delay_ms, logs)?;
        return Ok(Server {
            mock,
            target: gateway,
            client: vec!["--key".to_owned(), key],
            version: None,
        });
    };
    let binary = procs::installed_proxy(proxy)?;
    let version = procs::proxy_version(proxy, &binary)?;
    let mock = procs::start_mock_upstream(bins, Some(&placement.load_cpus), delay_ms, logs)?;
    let server = procs::start_proxy(
        proxy,
        &binary,
        Some(&placement.gateway_cpus),
        &mock.url,
        logs,
    )?;
    eprintln!(
        "xtask: {} pid {} at {} (CPUs {}; {version})",
        target.name(),
        server.proc.pid(),
        server.url,
        placement.gateway_cpus
    );
    Ok(Server {
        mock,
        target: server,
        client: vec!["--direct".to_owned()],
        version: Some(version),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_proxy_target_is_a_debian_proxy() {
        assert_eq!(proxy(Target::Gateway), None);
        assert_eq!(proxy(Target::Nginx), Some(Proxy::Nginx));
        assert_eq!(proxy(Target::Haproxy), Some(Proxy::Haproxy));
        assert_eq!(proxy(Target::Caddy), Some(Proxy::Caddy));
        assert_eq!(version_command(Target::Gateway), None);
        assert_eq!(version_command(Target::Nginx).as_deref(), Some("nginx -v"));
        assert_eq!(
            version_command(Target::Caddy).as_deref(),
            Some("caddy version")
        );
    }
}
