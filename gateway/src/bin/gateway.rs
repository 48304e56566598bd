//! `gateway`: the agent action gateway (serve) and its administration commands.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use gateway::admin::{self, ServiceSpec};
use gateway::ledger::WriterOptions;
use gateway::ledger::verify::{self, Verdict};
use gateway::secrets::{MasterKey, default_key_path};

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
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// Most receipts committed in one ledger transaction.
        #[arg(long, default_value_t = 256)]
        batch_max: usize,
        /// How long the ledger writer waits to fill a batch, in µs (0: take what is queued).
        #[arg(long, default_value_t = 0)]
        batch_wait_us: u64,
        /// Run a passive WAL checkpoint after this many committed receipts.
        #[arg(long, default_value_t = 2048)]
        checkpoint_records: u64,
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
    /// Check every receipt's hash, chain link, signature and seq continuity.
    Verify {
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
        } => {
            anyhow::ensure!(workers >= 1, "--workers must be at least 1");
            anyhow::ensure!(batch_max >= 1, "--batch-max must be at least 1");
            let options = WriterOptions {
                batch_max,
                batch_wait: Duration::from_micros(batch_wait_us),
                checkpoint_records: checkpoint_records.max(1),
            };
            serve(&db, &listen, workers, options)?;
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
        Command::Verify { db } => {
            let conn = gateway::db::open(&db, false)?;
            match verify::verify(&conn)? {
                Verdict::Ok { receipts } => println!("ok: {receipts} receipts"),
                Verdict::Bad { seq, reason } => {
                    println!("bad receipt at seq {seq}: {reason}");
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
        Command::Receipts { db, from } => {
            let conn = gateway::db::open(&db, false)?;
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

fn serve(db: &DbArgs, listen: &str, workers: usize, options: WriterOptions) -> anyhow::Result<()> {
    let master = MasterKey::load(&db.key_file(), false)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    let (app, _writer) = gateway::app::App::start(&db.db, &master, options)?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        println!("listening on {}", listener.local_addr()?);
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            () = gateway::server::serve(app, listener) => {}
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        anyhow::Ok(())
    })
}
