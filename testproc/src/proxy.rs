//! The real proxies the kernel-only mode is tested and measured on: Debian's nginx, haproxy,
//! caddy and Apache httpd, each started as a reverse proxy in front of one upstream, with every
//! file it writes in a directory of the caller's.

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
    /// Apache httpd 2.4 (the `apache2` package): its event MPM with mod_proxy_http, which
    /// writes an upstream request as a writev of many small iovecs (several per header).
    Apache,
}

impl Proxy {
    pub const ALL: [Proxy; 4] = [Proxy::Nginx, Proxy::Haproxy, Proxy::Caddy, Proxy::Apache];

    /// The Debian package, which is also the binary's name.
    pub fn package(self) -> &'static str {
        match self {
            Proxy::Nginx => "nginx",
            Proxy::Haproxy => "haproxy",
            Proxy::Caddy => "caddy",
            Proxy::Apache => "apache2",
        }
    }

    pub fn from_name(name: &str) -> Option<Proxy> {
        Proxy::ALL.into_iter().find(|p| p.package() == name)
    }

    /// The arguments that make the binary print its version (on stdout or stderr).
    pub fn version_args(self) -> &'static [&'static str] {
        match self {
            Proxy::Nginx | Proxy::Haproxy | Proxy::Apache => &["-v"],
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
    /// nginx runs a master and one worker, haproxy its default threads, caddy as Go runs it,
    /// Apache a parent and two event-MPM children (see [`apache_conf`]).
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
            Proxy::Apache => {
                let conf = dir.join("apache2.conf");
                std::fs::write(&conf, apache_conf(dir, port, upstream))?;
                // -DFOREGROUND: the parent stays in the foreground (not -X, which would serve
                // from the parent alone), and SIGTERM to it stops its children too.
                Spawn::new("apache2", binary)
                    .arg("-f")
                    .arg(&conf)
                    .arg("-DFOREGROUND")
            }
        })
    }
}

/// Debian's modules, where `apache2` loads them from.
const APACHE_MODULES: &str = "/usr/lib/apache2/modules";

/// Apache's configuration: its own ServerRoot, pid file, logs, runtime directory and mutexes
/// in `dir` (nothing of /etc/apache2, so it runs beside a system Apache), the event MPM with
/// two child processes from the start (a parent that forks and replaces children, like
/// nginx's master), and mod_proxy_http forwarding everything to `upstream`. Keep-alive to the
/// upstream: mod_proxy's default, each child keeping a pool of reused connections.
/// Children run as www-data (root's httpd refuses to serve as root), so they open nothing in
/// `dir`: the parent opens the logs, and the mutexes are pthread ones in shared memory.
/// mod_authz_core is there because a request with no authorization module loaded is refused
/// (AH00025 "couldn't check user").
fn apache_conf(dir: &Path, port: u16, upstream: &str) -> String {
    let dir = dir.display();
    let modules = APACHE_MODULES;
    format!(
        "ServerRoot {dir}\nServerName 127.0.0.1\nListen 127.0.0.1:{port}\n\
         PidFile {dir}/apache2.pid\nDefaultRuntimeDir {dir}\nMutex pthread default\n\
         ErrorLog {dir}/error.log\nLogLevel warn\nDocumentRoot {dir}\n\
         User www-data\nGroup www-data\n\
         LoadModule mpm_event_module {modules}/mod_mpm_event.so\n\
         LoadModule authz_core_module {modules}/mod_authz_core.so\n\
         LoadModule proxy_module {modules}/mod_proxy.so\n\
         LoadModule proxy_http_module {modules}/mod_proxy_http.so\n\
         StartServers 2\nServerLimit 2\nThreadsPerChild 16\nMaxRequestWorkers 32\n\
         MinSpareThreads 16\nMaxSpareThreads 32\nMaxConnectionsPerChild 0\n\
         KeepAlive On\nMaxKeepAliveRequests 0\n\
         ProxyPass / http://{upstream}/\nProxyPassReverse / http://{upstream}/\n"
    )
}
