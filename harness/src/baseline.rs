//! A gateway built from another commit, for same-run before/after rows (`bench --baseline`):
//! host CPUs differ from one machine of this kind to the next, so only figures from one run
//! compare.

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail, ensure};

use crate::procs::cargo_build_release_in;
use crate::workspace::root as workspace_root;

pub struct Baseline {
    /// As given (`92eb6fe`, `HEAD~3`, a tag).
    pub rev: String,
    pub commit: String,
    pub gateway: PathBuf,
}

/// Exports `rev`'s tree under target/baseline/ (once) and builds its gateway there, in a
/// target directory of its own so the workspace's build is left alone.
pub fn build(rev: &str) -> anyhow::Result<Baseline> {
    let root = workspace_root();
    let output = Command::new("git")
        .current_dir(&root)
        .args([
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{rev}^{{commit}}"),
        ])
        .output()
        .context("running git rev-parse")?;
    if !output.status.success() {
        bail!("--baseline {rev}: not a commit of this repository");
    }
    let commit = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let dir = root.join("target").join("baseline").join(&commit);
    let src = dir.join("src");
    if !src.join("Cargo.toml").exists() {
        export(&commit, &src)?;
    }
    eprintln!(
        "bench: building the baseline gateway at {} (its own target directory: the first build takes minutes)",
        &commit[..12]
    );
    let built = cargo_build_release_in(
        &src,
        Some(&dir.join("target")),
        &["--locked", "-p", "gateway", "--bin", "gateway"],
    )
    .with_context(|| format!("building the gateway of {rev}"))?;
    Ok(Baseline {
        rev: rev.to_owned(),
        gateway: built.find("gateway")?,
        commit,
    })
}

/// `git archive COMMIT | tar -x -C SRC`, into a fresh directory that replaces SRC only once
/// complete, so an interrupted export is never mistaken for a tree.
fn export(commit: &str, src: &std::path::Path) -> anyhow::Result<()> {
    let partial = src.with_extension("partial");
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial)?;
    let mut archive = Command::new("git")
        .current_dir(workspace_root())
        .args(["archive", "--format=tar", commit])
        .stdout(Stdio::piped())
        .spawn()
        .context("running git archive")?;
    let tar = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(&partial)
        .stdin(archive.stdout.take().context("git archive's stdout")?)
        .status()
        .context("running tar")?;
    let archived = archive.wait()?;
    ensure!(
        archived.success() && tar.success(),
        "exporting {commit} failed (git archive {archived}, tar {tar})"
    );
    fs::rename(&partial, src)?;
    Ok(())
}
