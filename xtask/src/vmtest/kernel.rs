//! The guest kernel: a Debian kernel package fetched with `apt-get download` and unpacked with
//! `dpkg -x` into a cache under the target directory (nothing is installed on the host).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail, ensure};

use crate::setup::run_checked;

/// `--kernel`: the guest kernels vmtest knows how to fetch.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Choice {
    /// Debian 12's cloud kernel (Linux 6.1 LTS): kprobes, fentry, BTF; virtiofs as modules.
    #[value(name = "debian-6.1")]
    Debian61,
}

impl Choice {
    /// The metapackage that depends on the current kernel, and the version it must have.
    fn spec(self) -> (&'static str, &'static str) {
        match self {
            Choice::Debian61 => ("linux-image-cloud-amd64", "linux-image-6.1."),
        }
    }
}

/// An unpacked kernel package.
pub struct Kernel {
    /// e.g. `linux-image-6.1.0-57-cloud-amd64`.
    pub package: String,
    pub vmlinuz: PathBuf,
    /// `lib/modules/<release>/kernel`.
    pub modules: PathBuf,
}

/// The kernel for `choice`, downloaded unless already in `cache`. Without the Debian archive
/// (offline, or another distribution's sources) a cached kernel of the same line is used.
pub fn fetch(choice: Choice, cache: &Path) -> anyhow::Result<Kernel> {
    let (meta, prefix) = choice.spec();
    let package = match resolve(meta) {
        Ok(package) => package,
        Err(err) => {
            let cached = newest_cached(cache, prefix);
            return match cached {
                Some(dir) => {
                    eprintln!("vmtest: {err:#}; using the cached {}", dir.display());
                    open(&dir)
                }
                None => Err(err.context(format!(
                    "no guest kernel: vmtest downloads {meta}'s kernel from the Debian archive \
                     (needs network and Debian 12 apt sources) into {}",
                    cache.display()
                ))),
            };
        }
    };
    ensure!(
        package.starts_with(prefix),
        "{meta} depends on {package}, not a {prefix}* kernel: the host's apt sources are not \
         Debian 12's"
    );
    let dir = cache.join(&package);
    if !dir.join("root/boot").is_dir() {
        download(&package, &dir)?;
    }
    open(&dir)
}

/// The kernel package `meta` depends on, per the host's package lists.
fn resolve(meta: &str) -> anyhow::Result<String> {
    let depends = || -> anyhow::Result<Option<String>> {
        let out = Command::new("apt-cache")
            .args(["depends", "--no-recommends", "--no-suggests", meta])
            .output()
            .context("running apt-cache (is this a Debian host?)")?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| line.trim().strip_prefix("Depends: "))
            .find(|dep| dep.starts_with("linux-image-"))
            .map(str::to_owned))
    };
    if let Some(package) = depends()? {
        return Ok(package);
    }
    // A fresh image often has no package lists yet.
    eprintln!("vmtest: {meta} unknown to apt; running apt-get update");
    run_checked(Command::new("apt-get").args(["update", "-qq"]))?;
    depends()?.with_context(|| format!("apt knows no {meta}"))
}

fn download(package: &str, dir: &Path) -> anyhow::Result<()> {
    let unsigned = format!("{package}-unsigned");
    eprintln!(
        "vmtest: downloading {unsigned} (~27 MB) into {}",
        dir.display()
    );
    let partial = dir.with_extension("partial");
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial).with_context(|| format!("creating {}", partial.display()))?;
    // As root apt would drop to _apt, which cannot write here; it is a download, not an install.
    let out = Command::new("apt-get")
        .args([
            "download",
            "-qq",
            "-o",
            "APT::Sandbox::User=root",
            &unsigned,
        ])
        .current_dir(&partial)
        .output()
        .context("running apt-get download")?;
    if !out.status.success() {
        bail!(
            "apt-get download {unsigned} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let deb = fs::read_dir(&partial)?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|ext| ext == "deb"))
        .context("apt-get download left no .deb")?;
    run_checked(
        Command::new("dpkg")
            .arg("-x")
            .arg(&deb)
            .arg(partial.join("root")),
    )?;
    fs::remove_file(&deb)?;
    let _ = fs::remove_dir_all(dir);
    fs::rename(&partial, dir).with_context(|| format!("moving into {}", dir.display()))?;
    Ok(())
}

fn newest_cached(cache: &Path, prefix: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(cache)
        .ok()?
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(prefix))
        .map(|entry| entry.path())
        .filter(|path| path.join("root/boot").is_dir())
        .collect();
    dirs.sort();
    dirs.pop()
}

fn open(dir: &Path) -> anyhow::Result<Kernel> {
    let package = dir
        .file_name()
        .context("kernel dir")?
        .to_string_lossy()
        .into_owned();
    let only = |parent: PathBuf, prefix: &str| -> anyhow::Result<PathBuf> {
        fs::read_dir(&parent)
            .with_context(|| format!("reading {}", parent.display()))?
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .find(|path| {
                path.file_name()
                    .is_some_and(|name| name.to_string_lossy().starts_with(prefix))
            })
            .with_context(|| format!("no {prefix}* in {}", parent.display()))
    };
    let root = dir.join("root");
    Ok(Kernel {
        package,
        vmlinuz: only(root.join("boot"), "vmlinuz-")?,
        modules: only(root.join("lib/modules"), "")?.join("kernel"),
    })
}
