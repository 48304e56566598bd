//! What a profile session traced (`cargo xtask profile --target`): the gateway, through its
//! probe sites, or one of Debian's reverse proxies, traced kernel-only (issue 20).

use serde::{Deserialize, Serialize};

/// The server a session loaded and traced. Sessions from before `--target` traced the
/// gateway, and a gateway session's files still leave it out: it is the default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    #[default]
    Gateway,
    Nginx,
    Haproxy,
    Caddy,
}

impl Target {
    pub const ALL: [Target; 4] = [
        Target::Gateway,
        Target::Nginx,
        Target::Haproxy,
        Target::Caddy,
    ];

    /// Its name on the command line and in the files; a proxy's is its Debian package's.
    pub fn name(self) -> &'static str {
        match self {
            Target::Gateway => "gateway",
            Target::Nginx => "nginx",
            Target::Haproxy => "haproxy",
            Target::Caddy => "caddy",
        }
    }

    pub fn from_name(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == name)
    }

    /// For `skip_serializing_if`: a gateway session's files stay as they were before proxies.
    pub fn is_gateway(&self) -> bool {
        *self == Target::Gateway
    }

    /// Traced from kernel events alone (`mode: kernel-only`): every target but the gateway.
    pub fn kernel_only(self) -> bool {
        !self.is_gateway()
    }

    /// How prose names it: "the gateway", "nginx".
    pub fn the(self) -> &'static str {
        match self {
            Target::Gateway => "the gateway",
            proxy => proxy.name(),
        }
    }

    /// The probe-effect ratio of its CPU per request, as the README names it.
    pub fn cpu_per_request(self) -> &'static str {
        match self {
            Target::Gateway => "gateway CPU per request",
            Target::Nginx => "nginx CPU per request",
            Target::Haproxy => "haproxy CPU per request",
            Target::Caddy => "caddy CPU per request",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_match_the_json() {
        for target in Target::ALL {
            assert_eq!(Target::from_name(target.name()), Some(target));
            assert_eq!(
                serde_json::to_string(&target).unwrap(),
                format!("\"{}\"", target.name())
            );
            assert!(target.cpu_per_request().starts_with(target.name()));
        }
        assert_eq!(Target::from_name("apache"), None);
        assert_eq!(Target::default(), Target::Gateway);
        assert!(!Target::Gateway.kernel_only() && Target::Nginx.kernel_only());
        assert_eq!(
            (Target::Gateway.the(), Target::Caddy.the()),
            ("the gateway", "caddy")
        );
    }
}
