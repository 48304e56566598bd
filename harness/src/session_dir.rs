//! Where a session writes. Committed reference runs are only ever written on purpose: without
//! `--out` a session gets a fresh directory under the git-ignored `profiles/local/`, and an
//! `--out` that already holds files is refused unless `--overwrite` says so.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

use crate::machine::utc_now;
use crate::workspace::root as workspace_root;

/// The session's output directory, created: `out`, or `profiles/local/<name>-<UTC time>`.
pub fn prepare(out: Option<&Path>, name: &str, overwrite: bool) -> anyhow::Result<PathBuf> {
    let dir = match out {
        Some(out) => out.to_owned(),
        None => workspace_root()
            .join("profiles/local")
            .join(format!("{name}-{}", timestamp())),
    };
    check(&dir, overwrite)?;
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Creates `dir` for `tracer record --out` and takes group and other write off it: the tracer
/// refuses a directory others could plant links in, whatever the umask made it.
pub fn for_tracer(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mode = std::fs::metadata(dir)?.permissions().mode();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & 0o7755))
        .with_context(|| format!("chmod go-w {}", dir.display()))
}

/// Refuses a directory that already holds anything, unless `overwrite`.
fn check(dir: &Path, overwrite: bool) -> anyhow::Result<()> {
    let mut entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err).with_context(|| format!("reading {}", dir.display())),
    };
    if !overwrite && entries.next().is_some() {
        bail!(
            "{} already holds files (a recorded session?); pass --overwrite to replace them, or \
             leave out --out to write a new directory under profiles/local/",
            dir.display()
        );
    }
    Ok(())
}

/// `20261201T093000Z`: sorts by time and needs no quoting in a path.
fn timestamp() -> String {
    utc_now().compact()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_with_files_is_refused_unless_overwrite() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().join("session");
        assert!(check(&dir, false).is_ok(), "a missing directory is fine");
        std::fs::create_dir(&dir).unwrap();
        assert!(check(&dir, false).is_ok(), "an empty directory is fine");
        std::fs::write(dir.join("README.md"), "recorded").unwrap();
        let refused = check(&dir, false).unwrap_err().to_string();
        assert!(refused.contains("--overwrite"), "{refused}");
        assert!(check(&dir, true).is_ok());
        assert_eq!(
            std::fs::read_to_string(dir.join("README.md")).unwrap(),
            "recorded",
            "checking touches nothing"
        );
    }

    #[test]
    fn tracer_directories_are_writable_only_by_their_owner() {
        use std::os::unix::fs::PermissionsExt as _;
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().join("tracer");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        for_tracer(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        for_tracer(&temp.path().join("new")).unwrap();
        assert!(temp.path().join("new").is_dir());
    }

    #[test]
    fn default_directories_are_new_and_git_ignored() {
        let dir = prepare(None, "xtask-unit-test", false).unwrap();
        let relative = dir.strip_prefix(workspace_root()).unwrap();
        assert!(relative.starts_with("profiles/local"), "{}", dir.display());
        let name = relative.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with("xtask-unit-test-") && name.ends_with('Z'),
            "{name}"
        );
        let ignored = std::process::Command::new("git")
            .arg("-C")
            .arg(workspace_root())
            .args(["check-ignore", "-q"])
            .arg(&dir)
            .status()
            .unwrap();
        std::fs::remove_dir(&dir).unwrap();
        assert!(ignored.success(), "{} is not git-ignored", dir.display());
    }
}
