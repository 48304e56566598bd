//! The real proxies the kernel-only mode is tested and measured on: Debian's nginx, haproxy
//! and caddy, each started as a reverse proxy in front of one upstream, with every file it
//! writes in a directory of the caller's.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Spawn;

/// A port of 127.0.0.1 nothing listens on now (the kernel's pick, released for the proxy to
/// bind: proxies take a port, not an address to report back).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proxy {
    Nginx,
    Haproxy,
    Caddy,
}

impl Proxy {
    pub const ALL: [Proxy; 3] = [Proxy::Nginx, Proxy::Haproxy, Proxy::Caddy];

    /// The Debian package, which is also the binary's name.
    pub fn package(self) -> &'static str {
        match self {
            Proxy::Nginx => "nginx",
            Proxy::Haproxy => "haproxy",
            Proxy::Caddy => "caddy",
        }
    }

    pub fn from_name(name: &str) -> Option<Proxy> {
        Proxy::ALL.into_iter().find(|p| p.package() == name)
    }

    /// The arguments that make the binary print its version (on stdout or stderr).
    pub fn version_args(self) -> &'static [&'static str] {
        match self {
            Proxy::Nginx | Proxy::Haproxy => &["-v"],
            Proxy::Caddy => &["version"],
        }
    }

    /// The installed binary, if there is one.
    pub fn find(self) -> Option<PathBuf> {
        ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
            .iter()
            .map(|dir| Path::new(dir).join(self.package()))
            .find(|path| path.exists())
    }

    /// `binary` as a reverse proxy on 127.0.0.1:`port` in front of `upstream` (host:port),
    /// in the foreground; its configuration, pid file, logs and temporary files in `dir`.
    /// nginx runs a master and one worker, haproxy its default threads, caddy as Go runs it.
    pub fn spawn(
        self,
        binary: &Path,
        dir: &Path,
        port: u16,
        upstream: &str,
    ) -> std::io::Result<Spawn> {
        Ok(match self {
            Proxy::Nginx => {
                let conf = dir.join("nginx.conf");
                std::fs::write(
                    &conf,
                    format!(
                        "worker_processes 1;\npid {dir}/nginx.pid;\nerror_log {dir}/error.log;\n\
                         events {{ worker_connections 1024; }}\n\
                         http {{\n  access_log {dir}/access.log;\n  \
                         client_body_temp_path {dir}/body;\n  proxy_temp_path {dir}/proxy;\n  \
                         fastcgi_temp_path {dir}/fastcgi;\n  uwsgi_temp_path {dir}/uwsgi;\n  \
                         scgi_temp_path {dir}/scgi;\n  \
                         upstream up {{ server {upstream}; keepalive 32; }}\n  \
                         server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      \
                         proxy_pass http://up;\n      proxy_http_version 1.1;\n      \
                         proxy_set_header Connection \"\";\n    }}\n  }}\n}}\n",
                        dir = dir.display()
                    ),
                )?;
                Spawn::new("nginx", binary)
                    .arg("-p")
                    .arg(dir)
                    .arg("-c")
                    .arg(&conf)
                    .args(["-g", "daemon off;"])
            }
            Proxy::Haproxy => {
                let conf = dir.join("haproxy.cfg");
                std::fs::write(
                    &conf,
                    format!(
                        "defaults\n  mode http\n  timeout connect 5s\n  timeout client 30s\n  \
                         timeout server 30s\nfrontend fe\n  bind 127.0.0.1:{port}\n  \
                         default_backend be\nbackend be\n  server s1 {upstream}\n"
                    ),
                )?;
                Spawn::new("haproxy", binary)
                    .arg("-f")
                    .arg(&conf)
                    .arg("-db")
            }
            Proxy::Caddy => {
                let mut command = Command::new(binary);
                command
                    .args([
                        "reverse-proxy",
                        "--from",
                        &format!(":{port}"),
                        "--to",
                        upstream,
                    ])
                    .env("HOME", dir)
                    .env("XDG_DATA_HOME", dir.join("data"))
                    .env("XDG_CONFIG_HOME", dir.join("config"));
                Spawn::command("caddy", command)
            }
        })
    }
}
