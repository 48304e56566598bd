//! `gateway`: the agent action gateway (serve) and its administration commands.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use ed25519_dalek::VerifyingKey;
use gateway::admin::{self, ServiceSpec};
use gateway::app::KeyLimits;
use gateway::ledger::WriterOptions;
use gateway::ledger::verify::{self, Head, Published, Verdict};
use gateway::lock::LedgerLock;
use gateway::secrets::{MasterKey, default_key_path};
use gateway::server::Limits;
use rustix::process::{Resource, getrlimit};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser)]
#[command(
    about = "Agent action gateway: authenticated, rate-limited upstream calls with signed receipts"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args)]
struct DbArgs {
    /// SQLite database file.
    #[arg(long)]
    db: PathBuf,
    /// Master key file (default: the database path with `.key` appended).
    #[arg(long)]
    key_file: Option<PathBuf>,
}

impl DbArgs {
    fn key_file(&self) -> PathBuf {
        self.key_file
            .clone()
            .unwrap_or_else(|| default_key_path(&self.db))
    }

    fn open(&self) -> anyhow::Result<(rusqlite::Connection, MasterKey)> {
        let master = MasterKey::load(&self.key_file(), false)?;
        Ok((gateway::db::open(&self.db, false)?, master))
    }
}

#[derive(Subcommand)]
enum Command {
    /// Serve `POST /v1/act`, `GET /v1/receipts/pubkey` and `GET /healthz`.
    Serve {
        #[command(flatten)]
        db: DbArgs,
        /// Address to listen on (port 0 picks a free port; the bound address is printed).
        #[arg(long)]
        listen: String,
        /// Tokio worker threads.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
        workers: u16,
        /// Most receipts committed in one ledger transaction.
        #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
        batch_max: u32,
        /// How long the ledger writer waits to fill a batch, in µs (0: take what is queued).
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
        batch_wait_us: u64,
        /// Run a passive WAL checkpoint after this many committed receipts.
        #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
        checkpoint_records: u64,
        /// A connection must send a whole request head within this many ms of being accepted
        /// or of its last response (bounds slow headers and idle keep-alive connections).
        #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
        header_timeout_ms: u64,
        /// A request body must arrive whole within this many ms of its head (default: the
        /// header timeout); past it, 408 `body_timeout`.
        #[arg(long, value_parser = clap::value_parser!(u64).range(100..=600_000))]
        body_timeout_ms: Option<u64>,
        /// Connections served at once (default: half the open-file limit, at most 65536). At
        /// the cap, the connections that have waited longest for a request head are closed to
        /// make room; a new one is closed at once only when every one is serving a request.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
        max_connections: Option<u32>,
        /// On SIGTERM or Ctrl-C, how long requests in flight may take to finish before the rest
        /// are cut off, in ms. A request already at its upstream call is not cut off: it gets
        /// its receipt however long that takes (up to the service's upstream timeout).
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(0..=600_000))]
        shutdown_grace_ms: u64,
        /// Denied requests that get a receipt, per API key per second (a token bucket); past
        /// it they are answered 429 `too_many_denials` without one.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
        deny_rate: u32,
        /// The bucket of `--deny-rate`: denials receipted in a burst.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
        deny_burst: u32,
    },
    /// Create or migrate a database, its master key file and its receipt signer.
    Init {
        #[command(flatten)]
        db: DbArgs,
        /// Also create service `demo`, a token for `user-1` and an API key for everything.
        #[arg(long, requires = "upstream")]
        demo: bool,
        /// The demo service's upstream base URL, e.g. http://127.0.0.1:9000.
        #[arg(long)]
        upstream: Option<String>,
    },
    /// Manage API keys.
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
    /// Manage the service registry.
    Service {
        #[command(subcommand)]
        command: ServiceCommand,
    },
    /// Manage the vault's upstream tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Check every receipt's hash, chain link, signature and seq continuity (read-only);
    /// `--pubkey HEX` and `--expect-head SEQ:HASH` check against what was published.
    ///
    /// On its own this proves only that the database is self-consistent: whoever can write it
    /// can rewrite the keys and re-sign, or cut off the tail. Give what was published earlier
    /// (`gateway head`, `GET /v1/receipts/pubkey`) to check against it.
    Verify {
        /// SQLite database file.
        #[arg(long)]
        db: PathBuf,
        /// Every receipt must be signed by this Ed25519 public key (64 hex digits; repeat for
        /// rotated keys) instead of the keys stored in the database.
        #[arg(long, value_name = "HEX", value_parser = verify::parse_public_key)]
        pubkey: Vec<VerifyingKey>,
        /// A head published earlier (`gateway head`): the chain must still hold this seq with
        /// this entry hash.
        #[arg(long, value_name = "SEQ:HASH")]
        expect_head: Option<Head>,
    },
    /// Verify the ledger, then print its signed head (`head=SEQ:HASH` for `verify
    /// --expect-head`).
    ///
    /// The ledger is checked as `verify` with no flags checks it, and nothing is printed if it
    /// fails. Printed: the newest receipt's seq and entry hash, its signature and the signer's
    /// key id and public key.
    Head {
        /// SQLite database file.
        #[arg(long)]
        db: PathBuf,
    },
    /// Print receipts as JSON lines.
    Receipts {
        /// SQLite database file.
        #[arg(long)]
        db: PathBuf,
        /// First seq to print.
        #[arg(long, default_value_t = 1)]
        from: u64,
    },
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Create a key; prints `api_key=ak_...` (shown once).
    Create {
        #[command(flatten)]
        db: DbArgs,
        /// Services the key may call: comma-separated names, or *.
        #[arg(long, default_value = "*")]
        services: String,
        /// Users the key may act for: comma-separated, or *.
        #[arg(long, default_value = "*")]
        users: String,
    },
    /// Revoke a key by id (or by the full `ak_...` string).
    Revoke {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long)]
        id: String,
    },
}

#[derive(Subcommand)]
enum ServiceCommand {
    /// Add or replace a service.
    Add {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long)]
        name: String,
        /// Base URL, http://host:port[/base].
        #[arg(long)]
        upstream: String,
        #[arg(long, default_value = "POST")]
        method: String,
        /// Path template; `{param}` placeholders are filled from the request's params.
        #[arg(long)]
        path: String,
        /// Send the token in this header instead of `Authorization: Bearer`.
        #[arg(long)]
        credential_header: Option<String>,
        /// Requests per second per API key (omit: unlimited).
        #[arg(long)]
        rate: Option<f64>,
        /// Bucket size (default: the rate).
        #[arg(long, requires = "rate")]
        burst: Option<f64>,
        /// Upstream timeout in milliseconds.
        #[arg(long, default_value_t = 5000)]
        timeout_ms: u64,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Link (store or replace) the upstream token of a user for a service.
    Link {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long)]
        user: String,
        #[arg(long)]
        service: String,
        #[arg(long)]
        token: String,
        /// Expiry, unix seconds.
        #[arg(long, conflicts_with = "ttl_s")]
        expires_at: Option<i64>,
        /// Expiry, seconds from now (negative: already expired).
        #[arg(long, allow_hyphen_values = true)]
        ttl_s: Option<i64>,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve {
            db,
            listen,
            workers,
            batch_max,
            batch_wait_us,
            checkpoint_records,
            header_timeout_ms,
            body_timeout_ms,
            max_connections,
            shutdown_grace_ms,
            deny_rate,
            deny_burst,
        } => {
            let options = WriterOptions {
                batch_max: batch_max as usize,
                batch_wait: Duration::from_micros(batch_wait_us),
                checkpoint_records,
            };
            let limits = Limits {
                header_timeout: Duration::from_millis(header_timeout_ms),
                max_connections: max_connections.unwrap_or_else(default_max_connections),
                grace: Duration::from_millis(shutdown_grace_ms),
            };
            let key_limits = KeyLimits {
                body_timeout: Duration::from_millis(body_timeout_ms.unwrap_or(header_timeout_ms)),
                denials_per_s: f64::from(deny_rate),
                denials_burst: f64::from(deny_burst),
            };
            serve(
                &db,
                &listen,
                usize::from(workers),
                options,
                key_limits,
                limits,
            )?;
        }
        Command::Init { db, demo, upstream } => {
            let (conn, master) = admin::init(&db.db, &db.key_file())?;
            println!(
                "initialized {} (master key {})",
                db.db.display(),
                db.key_file().display()
            );
            if demo {
                let upstream = upstream.context("--demo needs --upstream URL")?;
                let key = admin::demo(&conn, &master, &upstream)?;
                println!("demo service `demo` -> POST {upstream}/echo, user `user-1`");
                println!("api_key={key}");
            }
        }
        Command::Key {
            command:
                KeyCommand::Create {
                    db,
                    services,
                    users,
                },
        } => {
            let (conn, master) = db.open()?;
            println!(
                "api_key={}",
                admin::create_key(&conn, &master, &services, &users)?
            );
        }
        Command::Key {
            command: KeyCommand::Revoke { db, id },
        } => {
            let conn = gateway::db::open(&db.db, false)?;
            admin::revoke_key(&conn, &id)?;
            println!("revoked");
        }
        Command::Service {
            command:
                ServiceCommand::Add {
                    db,
                    name,
                    upstream,
                    method,
                    path,
                    credential_header,
                    rate,
                    burst,
                    timeout_ms,
                },
        } => {
            let conn = gateway::db::open(&db.db, false)?;
            admin::add_service(
                &conn,
                &ServiceSpec {
                    name: &name,
                    upstream: &upstream,
                    method: &method,
                    path: &path,
                    credential_header: credential_header.as_deref(),
                    rate_per_s: rate,
                    burst,
                    timeout_ms,
                },
            )?;
            println!("service {name} saved");
        }
        Command::Token {
            command:
                TokenCommand::Link {
                    db,
                    user,
                    service,
                    token,
                    expires_at,
                    ttl_s,
                },
        } => {
            let (conn, master) = db.open()?;
            let expires_at = expires_at.or(ttl_s.map(|ttl| admin::now_s() + ttl));
            admin::link_token(&conn, &master, &user, &service, &token, expires_at)?;
            println!("token linked for {user} on {service}");
        }
        Command::Verify {
            db,
            pubkey,
            expect_head,
        } => {
            let conn = gateway::db::open_read_only(&db)?;
            let published = Published {
                keys: pubkey,
                head: expect_head,
            };
            match verify::verify(&conn, &published)? {
                Verdict::Ok { receipts } => println!("ok: {receipts} receipts"),
                Verdict::Bad { seq, reason } => {
                    println!("bad receipt at seq {seq}: {reason}");
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
        Command::Head { db } => {
            let mut conn = gateway::db::open_read_only(&db)?;
            // One read snapshot: the head printed is the one verified, even while a gateway
            // appends.
            let conn = conn.transaction()?;
            // A head is for publishing: one from a broken chain would vouch for it.
            if let Verdict::Bad { seq, reason } = verify::verify(&conn, &Published::default())? {
                anyhow::bail!(
                    "the ledger does not verify (bad receipt at seq {seq}: {reason}); no head printed"
                );
            }
            let Some(last) = verify::last(&conn)? else {
                anyhow::bail!("the ledger has no receipts yet");
            };
            let public_key: Vec<u8> = conn
                .query_row(
                    "SELECT public_key FROM signer_keys WHERE key_id = ?1",
                    [&last.signer_key_id],
                    |r| r.get(0),
                )
                .with_context(|| format!("signer key {}", last.signer_key_id))?;
            let head = Head {
                seq: last.seq,
                entry_hash: last
                    .entry_hash
                    .as_slice()
                    .try_into()
                    .context("entry_hash is not 32 bytes")?,
            };
            println!("head={head}");
            println!("signature={}", hex::encode(&last.signature));
            println!("signer_key_id={}", last.signer_key_id);
            println!("public_key={}", hex::encode(public_key));
        }
        Command::Receipts { db, from } => {
            let conn = gateway::db::open_read_only(&db)?;
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            verify::for_each(&conn, from, |row| {
                serde_json::to_writer(&mut out, &row)?;
                out.write_all(b"\n")?;
                Ok(())
            })?;
            out.flush()?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Queued connections the kernel holds for accept (std and tokio's `bind` ask for 128): a burst
/// of connections beyond it waits a SYN retransmission, a second or more, to get in.
const LISTEN_BACKLOG: u32 = 1024;

async fn bind(listen: &str) -> anyhow::Result<tokio::net::TcpListener> {
    let addr = tokio::net::lookup_host(listen)
        .await?
        .next()
        .context("the address resolves to nothing")?;
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket.listen(LISTEN_BACKLOG)?)
}

/// Half the soft open-file limit: the rest is left for upstream connections, the database
/// and the runtime, so the cap is reached before EMFILE.
fn default_max_connections() -> u32 {
    let soft = getrlimit(Resource::Nofile).current.unwrap_or(1024);
    (soft / 2).clamp(16, 65_536) as u32
}

fn serve(
    db: &DbArgs,
    listen: &str,
    workers: usize,
    options: WriterOptions,
    key_limits: KeyLimits,
    limits: Limits,
) -> anyhow::Result<()> {
    // Before anything else touches the database: a second server would act without receipts.
    let _lock = LedgerLock::acquire(&db.db)?;
    let master = MasterKey::load(&db.key_file(), false)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    let (app, writer) = gateway::app::App::start(&db.db, &master, options, key_limits)?;
    let served = runtime.block_on(async {
        let listener = bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        println!("listening on {}", listener.local_addr()?);
        let mut terminate = signal(SignalKind::terminate())?;
        let ledger_app = app.clone();
        let shutdown = async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
                _ = ledger_app.ledger.failed() => {}
            }
        };
        let drained = gateway::server::serve(app.clone(), listener, limits, shutdown).await;
        if !drained {
            eprintln!(
                "shutdown: requests that had not reached the upstream after {} ms are cut off",
                limits.grace.as_millis()
            );
        }
        anyhow::Ok(())
    });
    // Cancels what outlived the grace period, releasing its hold on the ledger.
    runtime.shutdown_timeout(Duration::from_secs(1));
    let failure = app.ledger.failure().map(str::to_owned);
    drop(app);
    // The writer commits what is queued, then ends once the last sender is gone.
    if writer.join().is_err() {
        anyhow::bail!("the ledger writer thread could not be joined");
    }
    served?;
    if let Some(reason) = failure {
        anyhow::bail!("the ledger writer failed: {reason}");
    }
    Ok(())
}
