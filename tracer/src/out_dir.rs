//! The session's output directory, written as root without trusting its contents: opened once
//! (never through a symlink), refused unless it is ours and only we can write it, and every
//! file in it created relative to that fd with O_CREAT|O_EXCL|O_NOFOLLOW. A symlink planted at
//! `requests.csv` therefore fails the session instead of redirecting a root write. A missing
//! directory is made only in one that passes the same checks. Under sudo every output is
//! handed to the invoking user. A dump outside the directory (`--raw-events`,
//! `--raw-data`) has the same rules, its parent directory standing in for the output directory.

use std::{
    ffi::OsStr,
    fs::File,
    io::{self, Read as _, Write as _},
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context as _, Result, anyhow, bail};
use rustix::{
    fs::{
        AtFlags, CWD, Dir, FileType, Mode, OFlags, ResolveFlags, fchmod, fchown, fstat, mkdirat,
        openat, openat2, statat, unlinkat,
    },
    io::Errno,
    process::{Gid, Uid, geteuid},
};

/// Who should own the outputs when it is not the tracer's own (effective) user.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub uid: Uid,
    pub gid: Gid,
}

impl Owner {
    /// `SUDO_UID`:`SUDO_GID` when running as root under sudo; `None` otherwise.
    pub fn from_sudo() -> Result<Option<Owner>> {
        if !geteuid().is_root() {
            return Ok(None);
        }
        Self::from_sudo_vars(
            std::env::var_os("SUDO_UID").as_deref(),
            std::env::var_os("SUDO_GID").as_deref(),
        )
    }

    fn from_sudo_vars(uid: Option<&OsStr>, gid: Option<&OsStr>) -> Result<Option<Owner>> {
        let Some(uid) = uid else {
            return Ok(None);
        };
        let id = |name: &str, value: Option<&OsStr>| -> Result<u32> {
            let value = value.with_context(|| format!("SUDO_UID is set but {name} is not"))?;
            value
                .to_str()
                .and_then(|text| text.parse().ok())
                // -1 means "leave unchanged" to chown: not an id.
                .filter(|&id| id != u32::MAX)
                .with_context(|| format!("{name}={value:?} is not a numeric id"))
        };
        let uid = Uid::from_raw(id("SUDO_UID", Some(uid))?);
        let gid = Gid::from_raw(id("SUDO_GID", gid)?);
        Ok(Some(Owner { uid, gid }))
    }

    /// The uid whose directories and files a session may use: `owner`'s (sudo's user), else
    /// the tracer's own.
    fn uid_of(owner: Option<Owner>) -> Uid {
        owner.map_or_else(geteuid, |owner| owner.uid)
    }
}

/// An open output directory; clones share the one fd.
#[derive(Clone, Debug)]
pub struct OutDir {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    fd: OwnedFd,
    /// Replace the files it writes (unlink first) instead of failing on them.
    overwrite: bool,
    owner: Option<Owner>,
}

impl OutDir {
    /// Opens `path` (creating it, 0755, if missing) for a session's outputs: refuses a path
    /// through a symlink, a directory someone else owns, one others can write, and, without
    /// `overwrite`, one that already holds anything. A missing one is made only in a directory
    /// that passes the same checks. Outputs go to `SUDO_UID` under sudo.
    pub fn open(path: &Path, overwrite: bool) -> Result<OutDir> {
        Self::open_for(path, overwrite, Owner::from_sudo()?)
    }

    /// [`Self::open`] with the outputs handed to `owner` (if any) instead of sudo's user.
    pub fn open_for(path: &Path, overwrite: bool, owner: Option<Owner>) -> Result<OutDir> {
        let shown = path.display();
        let (fd, created) =
            open_or_create(path, owner).with_context(|| format!("output directory {shown}"))?;
        if created {
            // Exactly 0755 whatever the umask: the check below refuses group-writable.
            fchmod(&fd, Mode::from_raw_mode(0o755))
                .with_context(|| format!("chmod 0755 {shown}"))?;
            if let Some(owner) = owner {
                fchown(&fd, Some(owner.uid), Some(owner.gid))
                    .with_context(|| format!("handing {shown} to uid {}", owner.uid.as_raw()))?;
            }
        }
        check_dir(&fd, &format!("output directory {shown}"), owner)?;
        if !created && !overwrite {
            let mut entries = Dir::read_from(&fd).with_context(|| format!("listing {shown}"))?;
            for entry in &mut entries {
                let entry = entry.with_context(|| format!("listing {shown}"))?;
                let name = entry.file_name().to_bytes();
                if name != b"." && name != b".." {
                    bail!(
                        "output directory {shown} is not empty (it holds {}); pass --overwrite \
                         to replace the session's files in it, or choose a new directory",
                        String::from_utf8_lossy(name)
                    );
                }
            }
        }
        Ok(OutDir {
            inner: Arc::new(Inner {
                path: path.to_owned(),
                fd,
                overwrite,
                owner,
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Creates `name` in the directory for writing (0644): never through a symlink, never an
    /// existing file unless `--overwrite`, which unlinks it first (a link, not its target).
    pub fn create_file(&self, name: &str) -> Result<File> {
        let inner = &self.inner;
        create_at(&inner.fd, name, inner.overwrite, inner.owner)
            .with_context(|| format!("creating {}", inner.path.join(name).display()))
    }

    /// Creates `name` and writes `contents` to it.
    pub fn write(&self, name: &str, contents: &[u8]) -> Result<()> {
        self.create_file(name)?
            .write_all(contents)
            .with_context(|| format!("writing {}", self.inner.path.join(name).display()))
    }

    /// Opens `name`, which this session wrote, for reading (never through a symlink).
    pub fn open_file(&self, name: &str) -> Result<File> {
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        openat(&self.inner.fd, name, flags, Mode::empty())
            .map(File::from)
            .map_err(io::Error::from)
            .with_context(|| format!("opening {}", self.inner.path.join(name).display()))
    }

    /// Removes `name` (the link itself if it is one).
    pub fn remove(&self, name: &str) -> io::Result<()> {
        Ok(unlinkat(&self.inner.fd, name, AtFlags::empty())?)
    }
}

/// Refuses a directory (`what` names it) that is not the session's user's (`owner`, else
/// ours: under sudo a root-owned one is refused too) or that others can write.
fn check_dir(dir: impl AsFd, what: &str, owner: Option<Owner>) -> Result<()> {
    let stat = fstat(dir).with_context(|| format!("stat {what}"))?;
    let uid = Owner::uid_of(owner).as_raw();
    if stat.st_uid != uid {
        bail!(
            "refusing {what}: it is owned by uid {}, not by uid {uid}{}; choose a directory of \
             your own",
            stat.st_uid,
            if owner.is_some() { " (SUDO_UID)" } else { "" },
        );
    }
    if stat.st_mode & 0o022 != 0 {
        bail!(
            "refusing {what}: it is group- or other-writable (mode {:o}), so another user could \
             plant links in it; use a directory only you can write",
            stat.st_mode & 0o7777
        );
    }
    Ok(())
}

/// The output directory `path`, opened with no symlink on the way, and whether this call made
/// it. A missing one is made only in a directory [`check_dir`] accepts, so that root makes no
/// directory where the session's user could not (under sudo, a drop-in directory in /etc).
fn open_or_create(path: &Path, owner: Option<Owner>) -> Result<(OwnedFd, bool)> {
    let Some(parent) = Parent::open(path)? else {
        // `/`, `.` or `..`: nothing to create.
        return Ok((open_dir_without_symlinks(path)?, false));
    };
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let open = || openat(&parent.dir, parent.name, flags, Mode::empty());
    let refused = |e| match e {
        Errno::LOOP | Errno::NOTDIR => {
            anyhow!("it is a symlink or not a directory; give the real directory's path")
        }
        e => anyhow::Error::from(io::Error::from(e)),
    };
    let created = match open() {
        Ok(fd) => return Ok((fd, false)),
        Err(Errno::NOENT) => {
            let creating = "it does not exist, and is made only in a directory of yours that \
                            only you can write (or make it yourself)";
            parent.check(owner).context(creating)?;
            match mkdirat(&parent.dir, parent.name, Mode::from_raw_mode(0o755)) {
                Ok(()) => true,
                // Made meanwhile: opened and checked as any existing one.
                Err(Errno::EXIST) => false,
                Err(e) => return Err(io::Error::from(e)).context("creating it"),
            }
        }
        Err(e) => return Err(refused(e)),
    };
    Ok((open().map_err(refused)?, created))
}

/// Where a session creates `path`: its parent directory, opened with no symlink on the way,
/// and the name `path` has in it.
struct Parent<'a> {
    dir: OwnedFd,
    path: &'a Path,
    name: &'a OsStr,
}

impl<'a> Parent<'a> {
    /// `None` when `path` names no entry (`/`, `.`, `..`).
    fn open(path: &'a Path) -> Result<Option<Parent<'a>>> {
        let Some(name) = path.file_name() else {
            return Ok(None);
        };
        let parent = path
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        Ok(Some(Parent {
            dir: open_dir_without_symlinks(parent)?,
            path: parent,
            name,
        }))
    }

    /// Refuses a directory that is not the session's user's or that others can write (see
    /// [`check_dir`]): root creates nothing there.
    fn check(&self, owner: Option<Owner>) -> Result<()> {
        check_dir(
            &self.dir,
            &format!("directory {}", self.path.display()),
            owner,
        )
    }
}

/// Creates a dump outside any [`OutDir`] (`--raw-events FILE`, `--raw-data FILE`) by the same
/// rules, its parent directory standing in for the output directory, and writes `header`, the
/// line every such dump starts with. See [`create_file_at_for`].
pub fn create_file_at(path: &Path, overwrite: bool, header: &[u8]) -> Result<File> {
    create_file_at_for(path, overwrite, header, Owner::from_sudo()?)
}

/// [`create_file_at`] for `owner`: the parent directory, reached without any symlink, must be
/// theirs and not writable by others; the file is created O_EXCL|O_NOFOLLOW and handed to them.
/// `overwrite` replaces only what a session wrote: a regular file of theirs that starts with
/// `header`.
fn create_file_at_for(
    path: &Path,
    overwrite: bool,
    header: &[u8],
    owner: Option<Owner>,
) -> Result<File> {
    let shown = path.display();
    let parent = Parent::open(path)
        .with_context(|| format!("creating {shown}"))?
        .with_context(|| format!("{shown} names no file; give a file's path"))?;
    parent
        .check(owner)
        .with_context(|| format!("creating {shown}"))?;
    let Parent { dir, name, .. } = parent;
    if overwrite {
        check_replaceable(dir.as_fd(), name, header, owner)
            .with_context(|| format!("replacing {shown}"))?;
    }
    let mut file =
        create_at(&dir, name, overwrite, owner).with_context(|| format!("creating {shown}"))?;
    file.write_all(header)
        .with_context(|| format!("writing {shown}"))?;
    Ok(file)
}

/// Opens the directory at `path` without following a symlink anywhere on the way.
fn open_dir_without_symlinks(path: &Path) -> Result<OwnedFd> {
    let shown = path.display();
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    openat2(CWD, path, flags, Mode::empty(), ResolveFlags::NO_SYMLINKS).map_err(|e| match e {
        Errno::LOOP => anyhow!(
            "refusing directory {shown}: its path goes through a symlink; give the real path \
             (`realpath` prints it)"
        ),
        Errno::NOTDIR => anyhow!("{shown} is not a directory"),
        Errno::NOENT => anyhow!("directory {shown} does not exist; create it first"),
        e => anyhow::Error::from(io::Error::from(e)).context(format!("opening directory {shown}")),
    })
}

/// What `--overwrite` may remove at `name` in `dir`: nothing, or a file a session wrote, i.e.
/// a regular file of `owner`'s (else ours) that starts with `header`. Anything else is refused.
fn check_replaceable(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    header: &[u8],
    owner: Option<Owner>,
) -> Result<()> {
    let refuse = |what: String| {
        anyhow!(
            "refusing to remove it: {what}, so no tracer session wrote it (--overwrite replaces \
             only an earlier dump); remove it yourself or choose another path"
        )
    };
    let stat = match statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(io::Error::from(e).into()),
    };
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => {}
        FileType::Symlink => return Err(refuse("it is a symlink".into())),
        FileType::Directory => return Err(refuse("it is a directory".into())),
        _ => return Err(refuse("it is not a regular file".into())),
    }
    let uid = Owner::uid_of(owner).as_raw();
    if stat.st_uid != uid {
        return Err(refuse(format!(
            "it is owned by uid {}, not by uid {uid}",
            stat.st_uid
        )));
    }
    // O_NONBLOCK: a FIFO swapped in after the stat must not hang the open.
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = openat(dir, name, flags, Mode::empty()).map_err(io::Error::from)?;
    let opened = fstat(&fd)?;
    if (opened.st_dev, opened.st_ino) != (stat.st_dev, stat.st_ino) {
        return Err(refuse("it changed while it was checked".into()));
    }
    let mut start = vec![0; header.len()];
    let whole = match File::from(fd).read_exact(&mut start) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => false,
        Err(e) => return Err(e.into()),
    };
    if !whole || start != header {
        return Err(refuse(format!(
            "it does not start with {:?}",
            String::from_utf8_lossy(header)
        )));
    }
    Ok(())
}

fn create_at(
    dir: impl AsFd,
    name: impl AsRef<OsStr>,
    overwrite: bool,
    owner: Option<Owner>,
) -> Result<File> {
    let name = Path::new(name.as_ref());
    let dir = dir.as_fd();
    if overwrite {
        match unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(io::Error::from(e)).context("removing the old file"),
        }
    }
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = openat(dir, name, flags, Mode::from_raw_mode(0o644)).map_err(|e| match e {
        Errno::EXIST => {
            anyhow::anyhow!("it already exists (or is a link); pass --overwrite to replace it")
        }
        e => io::Error::from(e).into(),
    })?;
    if let Some(owner) = owner {
        fchown(&fd, Some(owner.uid), Some(owner.gid))
            .with_context(|| format!("handing it to uid {}", owner.uid.as_raw()))?;
    }
    Ok(File::from(fd))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _, symlink};

    use super::*;

    const NOBODY: u32 = 65534;

    /// A fresh directory `session` under a private temporary one, and a victim file beside it.
    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let temp = tempfile::tempdir().unwrap();
        let victim = temp.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let dir = temp.path().join("session");
        (temp, dir, victim)
    }

    /// A new directory at `path`, mode 0755 whatever the umask.
    fn dir_0755(path: &Path) {
        std::fs::create_dir(path).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn open(dir: &Path, overwrite: bool) -> Result<OutDir> {
        OutDir::open_for(dir, overwrite, None)
    }

    fn message(result: Result<impl std::fmt::Debug>) -> String {
        format!("{:#}", result.unwrap_err())
    }

    fn skip_unless_root(test: &str) -> bool {
        if geteuid().is_root() {
            return false;
        }
        eprintln!("SKIPPED {test}: needs root (chown)");
        true
    }

    #[test]
    fn a_missing_directory_is_created_0755_and_written() {
        let (_temp, dir, _) = setup();
        let out = open(&dir, false).unwrap();
        out.write("breakdown.json", b"{}").unwrap();
        let meta = std::fs::metadata(&dir).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o755);
        assert_eq!(std::fs::read(dir.join("breakdown.json")).unwrap(), b"{}");
    }

    #[test]
    fn a_missing_parent_is_not_created() {
        let (_temp, dir, _) = setup();
        let refused = message(open(&dir.join("runs").join("a"), false));
        assert!(
            refused.contains(&format!("directory {}/runs does not exist", dir.display())),
            "{refused}"
        );
        assert!(!dir.exists());
    }

    #[test]
    fn a_symlink_in_the_middle_of_out_is_refused() {
        let (temp, dir, _) = setup();
        std::fs::create_dir_all(dir.join("existing")).unwrap();
        let link = temp.path().join("link");
        symlink(&dir, &link).unwrap();
        for name in ["existing", "missing"] {
            let refused = message(open(&link.join(name), false));
            assert!(
                refused.contains(&format!("output directory {}/{name}", link.display()))
                    && refused.contains("goes through a symlink"),
                "{name}: {refused}"
            );
        }
        assert!(!dir.join("missing").exists());
        // The real path is taken.
        open(&dir.join("existing"), false).unwrap();
    }

    /// `sudo tracer record --out /etc/systemd/system/ssh.service.d` made a directory the user
    /// could write where systemd reads drop-ins as root. A root-owned directory stands for
    /// /etc/systemd/system, nobody for the user who ran sudo.
    #[test]
    fn a_missing_out_under_a_root_owned_parent_is_refused_under_sudo() {
        let test = "a_missing_out_under_a_root_owned_parent_is_refused_under_sudo";
        let Some((_temp, system)) = root_directory(test, "system") else {
            return;
        };
        let drop_in = system.join("ssh.service.d");
        refused_in_a_root_directory(&drop_in, |overwrite| {
            OutDir::open_for(&drop_in, overwrite, Some(nobody()))
        });
    }

    /// A root-owned directory `name` (0755) in a new temporary one, standing for a system
    /// directory; `None` unless root.
    fn root_directory(test: &str, name: &str) -> Option<(tempfile::TempDir, PathBuf)> {
        if skip_unless_root(test) {
            return None;
        }
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().join(name);
        dir_0755(&dir);
        Some((temp, dir))
    }

    /// Making `path` in its root-owned directory for nobody (sudo's user) by `make(overwrite)`
    /// is refused, naming the directory and its owner, and makes nothing.
    fn refused_in_a_root_directory<T: std::fmt::Debug>(
        path: &Path,
        make: impl Fn(bool) -> Result<T>,
    ) {
        let dir = path.parent().unwrap();
        for overwrite in [false, true] {
            let refused = message(make(overwrite));
            assert!(
                refused.contains(&format!("refusing directory {}", dir.display()))
                    && refused.contains("owned by uid 0, not by uid 65534 (SUDO_UID)"),
                "{refused}"
            );
            assert!(!path.exists(), "nothing was created");
        }
    }

    #[test]
    fn a_missing_out_in_the_users_own_private_dir_is_created_theirs() {
        if skip_unless_root("a_missing_out_in_the_users_own_private_dir_is_created_theirs") {
            return;
        }
        let temp = tempfile::tempdir().unwrap();
        std::os::unix::fs::chown(temp.path(), Some(NOBODY), Some(NOBODY)).unwrap();
        let dir = temp.path().join("session");
        OutDir::open_for(&dir, false, Some(nobody())).unwrap();
        let meta = std::fs::metadata(&dir).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid(), meta.permissions().mode() & 0o7777),
            (NOBODY, NOBODY, 0o755)
        );
    }

    /// Sticky or not (/tmp is 1777): the user makes the directory there, then it is taken.
    #[test]
    fn a_missing_out_in_a_directory_others_can_write_is_refused() {
        let (temp, dir, _) = setup();
        for mode in [0o775, 0o757, 0o1777] {
            std::fs::set_permissions(temp.path(), std::fs::Permissions::from_mode(mode)).unwrap();
            let refused = message(open(&dir, false));
            assert!(
                refused.contains("it does not exist")
                    && refused.contains("group- or other-writable"),
                "{mode:o}: {refused}"
            );
            assert!(!dir.exists(), "{mode:o}");
        }
        dir_0755(&dir);
        open(&dir, false).unwrap();
    }

    #[test]
    fn item1_a_symlink_planted_at_an_output_is_not_followed() {
        let (_temp, dir, victim) = setup();
        // Planted before the session: the directory is not empty.
        std::fs::create_dir(&dir).unwrap();
        symlink(&victim, dir.join("requests.csv")).unwrap();
        let refused = message(open(&dir, false));
        assert!(
            refused.contains("not empty") && refused.contains("requests.csv"),
            "{refused}"
        );
        // Planted after the directory was opened: creating the file fails, naming it.
        std::fs::remove_file(dir.join("requests.csv")).unwrap();
        let out = open(&dir, false).unwrap();
        symlink(&victim, dir.join("requests.csv")).unwrap();
        let refused = message(out.create_file("requests.csv"));
        assert!(
            refused.contains("requests.csv") && refused.contains("already exists"),
            "{refused}"
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(dir.join("requests.csv").is_symlink());
    }

    #[test]
    fn item1_overwrite_replaces_a_planted_symlink_without_following_it() {
        let (_temp, dir, victim) = setup();
        std::fs::create_dir(&dir).unwrap();
        symlink(&victim, dir.join("requests.csv")).unwrap();
        std::fs::write(dir.join("notes.txt"), "mine").unwrap();
        let out = open(&dir, true).unwrap();
        out.write("requests.csv", b"request_id\n").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        let written = dir.join("requests.csv");
        assert!(!written.is_symlink());
        assert_eq!(std::fs::read_to_string(&written).unwrap(), "request_id\n");
        assert_eq!(
            std::fs::read_to_string(dir.join("notes.txt")).unwrap(),
            "mine",
            "--overwrite replaces only what the session writes"
        );
    }

    #[test]
    fn item1_a_non_empty_directory_needs_overwrite() {
        let (_temp, dir, _) = setup();
        std::fs::create_dir(&dir).unwrap();
        assert!(open(&dir, false).is_ok(), "an empty directory is fine");
        std::fs::write(dir.join("breakdown.json"), "old session").unwrap();
        let refused = message(open(&dir, false));
        assert!(
            refused.contains("--overwrite") && refused.contains("breakdown.json"),
            "{refused}"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("breakdown.json")).unwrap(),
            "old session"
        );
        open(&dir, true)
            .unwrap()
            .write("breakdown.json", b"new")
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("breakdown.json")).unwrap(),
            "new"
        );
    }

    #[test]
    fn item1_a_directory_others_can_write_is_refused() {
        let (_temp, dir, _) = setup();
        std::fs::create_dir(&dir).unwrap();
        for mode in [0o775, 0o757, 0o1777] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
            let refused = message(open(&dir, false));
            assert!(
                refused.contains("group- or other-writable"),
                "{mode:o}: {refused}"
            );
            assert!(refused.contains(&dir.display().to_string()), "{refused}");
        }
    }

    #[test]
    fn a_symlinked_directory_is_refused() {
        let (temp, dir, _) = setup();
        std::fs::create_dir(&dir).unwrap();
        let link = temp.path().join("link");
        symlink(&dir, &link).unwrap();
        let refused = message(open(&link, false));
        assert!(refused.contains("is a symlink"), "{refused}");
    }

    #[test]
    fn item1_a_directory_owned_by_another_user_is_refused() {
        if skip_unless_root("item1_a_directory_owned_by_another_user_is_refused") {
            return;
        }
        let (_temp, dir, _) = setup();
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
        let refused = message(open(&dir, true));
        assert!(refused.contains("owned by uid 65534"), "{refused}");
        // Unless it is the sudo user's.
        let owner = Owner {
            uid: Uid::from_raw(NOBODY),
            gid: Gid::from_raw(NOBODY),
        };
        assert!(OutDir::open_for(&dir, true, Some(owner)).is_ok());
    }

    #[test]
    fn item1_under_sudo_outputs_go_to_the_sudo_user() {
        if skip_unless_root("item1_under_sudo_outputs_go_to_the_sudo_user") {
            return;
        }
        let (temp, dir, _) = setup();
        std::os::unix::fs::chown(temp.path(), Some(NOBODY), Some(NOBODY)).unwrap();
        let owner = Owner::from_sudo_vars(Some(OsStr::new("65534")), Some(OsStr::new("65534")))
            .unwrap()
            .unwrap();
        let out = OutDir::open_for(&dir, false, Some(owner)).unwrap();
        out.write("breakdown.json", b"{}").unwrap();
        for path in [dir.clone(), dir.join("breakdown.json")] {
            let meta = std::fs::symlink_metadata(&path).unwrap();
            assert_eq!(
                (meta.uid(), meta.gid()),
                (NOBODY, NOBODY),
                "{}",
                path.display()
            );
        }
    }

    #[test]
    fn sudo_ids_are_checked() {
        let ids = |uid: Option<&str>, gid: Option<&str>| {
            Owner::from_sudo_vars(uid.map(OsStr::new), gid.map(OsStr::new))
        };
        assert_eq!(ids(None, None).unwrap(), None);
        let owner = ids(Some("1000"), Some("100")).unwrap().unwrap();
        assert_eq!((owner.uid.as_raw(), owner.gid.as_raw()), (1000, 100));
        for (uid, gid) in [
            (Some("x"), Some("1")),
            (Some("1"), None),
            (Some("4294967295"), Some("1")),
        ] {
            assert!(ids(uid, gid).is_err(), "{uid:?}:{gid:?}");
        }
    }

    const EVENTS: &[u8] = session::analysis::crosscheck::DUMP_HEADER;

    fn nobody() -> Owner {
        Owner {
            uid: Uid::from_raw(NOBODY),
            gid: Gid::from_raw(NOBODY),
        }
    }

    fn dump_at(path: &Path, overwrite: bool, owner: Option<Owner>) -> Result<File> {
        create_file_at_for(path, overwrite, EVENTS, owner)
    }

    #[test]
    fn under_sudo_a_root_owned_output_directory_is_refused() {
        let test = "under_sudo_a_root_owned_output_directory_is_refused";
        let Some((_temp, dir)) = root_directory(test, "session") else {
            return;
        };
        let refused = message(OutDir::open_for(&dir, true, Some(nobody())));
        assert!(
            refused.contains("owned by uid 0, not by uid 65534 (SUDO_UID)"),
            "{refused}"
        );
    }

    /// `sudo tracer record --raw-events /etc/ld.so.preload`: a root-owned directory (with a
    /// root file in it) stands for /etc, nobody for the user who ran sudo.
    #[test]
    fn raw_outputs_do_not_create_any_path_as_root() {
        let Some((temp, etc)) = root_directory("raw_outputs_do_not_create_any_path_as_root", "etc")
        else {
            return;
        };
        let preload = etc.join("ld.so.preload");
        refused_in_a_root_directory(&preload, |overwrite| {
            dump_at(&preload, overwrite, Some(nobody()))
        });
        std::fs::write(&preload, EVENTS).unwrap();
        let refused = message(dump_at(&preload, true, Some(nobody())));
        assert!(refused.contains("owned by uid 0"), "{refused}");
        let meta = std::fs::metadata(&preload).unwrap();
        assert_eq!(
            (meta.uid(), std::fs::read(&preload).unwrap()),
            (0, EVENTS.to_vec())
        );

        // In a directory of sudo's user the dump is made, and handed to them.
        let home = temp.path().join("home");
        dir_0755(&home);
        std::os::unix::fs::chown(&home, Some(NOBODY), Some(NOBODY)).unwrap();
        let raw = home.join("raw.events");
        dump_at(&raw, false, Some(nobody())).unwrap();
        let meta = std::fs::metadata(&raw).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (NOBODY, NOBODY));
        assert_eq!(std::fs::read(&raw).unwrap(), EVENTS);
        // A dump of another owner (root's, in the user's directory) is not replaced.
        std::os::unix::fs::chown(&raw, Some(0), Some(0)).unwrap();
        let refused = message(dump_at(&raw, true, Some(nobody())));
        assert!(
            refused.contains("owned by uid 0, not by uid 65534")
                && refused.contains("refusing to remove it"),
            "{refused}"
        );
        assert_eq!(std::fs::metadata(&raw).unwrap().uid(), 0);
    }

    #[test]
    fn a_raw_output_through_a_symlink_is_refused() {
        let temp = tempfile::tempdir().unwrap();
        let real = temp.path().join("real");
        std::fs::create_dir_all(real.join("sub")).unwrap();
        let link = temp.path().join("link");
        symlink(&real, &link).unwrap();
        // The link as an intermediate component, and as the directory itself.
        for path in [link.join("sub").join("raw.events"), link.join("raw.events")] {
            let refused = message(dump_at(&path, true, None));
            assert!(
                refused.contains("goes through a symlink") && refused.contains("realpath"),
                "{refused}"
            );
        }
        assert!(!real.join("raw.events").exists() && !real.join("sub/raw.events").exists());
        dump_at(&real.join("sub").join("raw.events"), false, None).unwrap();
        let refused = message(dump_at(
            &temp.path().join("missing/raw.events"),
            false,
            None,
        ));
        assert!(refused.contains("does not exist"), "{refused}");
        let refused = message(dump_at(&real.join(".."), false, None));
        assert!(refused.contains("names no file"), "{refused}");
    }

    #[test]
    fn a_raw_output_in_a_directory_others_can_write_is_refused() {
        let temp = tempfile::tempdir().unwrap();
        let raw = temp.path().join("raw.events");
        for mode in [0o775, 0o757, 0o1777] {
            std::fs::set_permissions(temp.path(), std::fs::Permissions::from_mode(mode)).unwrap();
            let refused = message(dump_at(&raw, false, None));
            assert!(
                refused.contains("group- or other-writable")
                    && refused.contains(&temp.path().display().to_string()),
                "{mode:o}: {refused}"
            );
            assert!(!raw.exists());
        }
    }

    #[test]
    fn overwrite_replaces_an_earlier_dump_and_nothing_else() {
        let (temp, _, victim) = setup();
        let raw = temp.path().join("raw.events");
        // Not replaced: a file no session wrote (a dump of the other kind included), a
        // symlink, a directory. Each is left as it was.
        let data_dump = [crate::events::data::DUMP_HEADER, b"records"].concat();
        for planted in [&b"precious"[..], &EVENTS[..EVENTS.len() - 1], &data_dump] {
            std::fs::write(&raw, planted).unwrap();
            let refused = message(dump_at(&raw, true, None));
            assert!(
                refused.contains("does not start with")
                    && refused.contains(&raw.display().to_string()),
                "{refused}"
            );
            assert_eq!(std::fs::read(&raw).unwrap(), planted);
        }
        std::fs::remove_file(&raw).unwrap();
        symlink(&victim, &raw).unwrap();
        let refused = message(dump_at(&raw, true, None));
        assert!(refused.contains("it is a symlink"), "{refused}");
        assert!(raw.is_symlink());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        std::fs::remove_file(&raw).unwrap();
        std::fs::create_dir(&raw).unwrap();
        let refused = message(dump_at(&raw, true, None));
        assert!(refused.contains("it is a directory"), "{refused}");
        std::fs::remove_dir(&raw).unwrap();

        // An earlier dump: kept without --overwrite, replaced with it.
        dump_at(&raw, false, None)
            .unwrap()
            .write_all(b"old records")
            .unwrap();
        let refused = message(dump_at(&raw, false, None));
        assert!(refused.contains("already exists"), "{refused}");
        dump_at(&raw, true, None)
            .unwrap()
            .write_all(b"new")
            .unwrap();
        assert_eq!(std::fs::read(&raw).unwrap(), [EVENTS, b"new"].concat());
    }
}
